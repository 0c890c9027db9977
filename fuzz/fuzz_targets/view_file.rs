//! A view file (`granary view`): decoding any bytes never panics, and whatever decodes has
//! rising ids below the dataset's sample count and encodes back to exactly the same bytes.
#![no_main]
use granary_format::ViewFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = ViewFile::decode(data) else { return };
    assert!(!v.ids.is_empty());
    assert!(v.ids.windows(2).all(|w| w[0] < w[1]));
    assert!(v.ids.iter().all(|&i| i < v.samples));
    assert_eq!(v.encode(), data, "a view decoded from bytes that are not its encoding");
});
