//! Path escapes (`granary ls` prints them, `cat`/`extract` read them back): unescaping never
//! panics, and escaping any bytes round-trips.
#![no_main]
use granary::{escape_path, unescape_path};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(raw) = unescape_path(data) {
        assert_eq!(unescape_path(escape_path(&raw).as_bytes()), Some(raw));
    }
    assert_eq!(unescape_path(escape_path(data).as_bytes()).as_deref(), Some(data));
});
