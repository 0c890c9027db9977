//! Dataset URLs (`s3://bucket/prefix` and kin): parsing never panics and a parsed URL names
//! its objects under its prefix.
#![no_main]
use granary_store::object::{is_url, looks_like_url, ObjectUrl};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let _ = (is_url(s), looks_like_url(s));
    if let Ok(u) = ObjectUrl::parse(s) {
        let o = u.object_url("snapshot.gsnap");
        assert!(o.starts_with(u.url()) && o.ends_with("/snapshot.gsnap"));
        assert!(ObjectUrl::parse(u.url()).is_ok(), "a normalised URL parses again");
    }
});
