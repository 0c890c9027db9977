//! The tier's `hot.map`: every listed sample is found through the map it builds.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(m) = granary::decode_hot_map(data) {
        for (id, h) in &m {
            assert_eq!(*id, h.id);
        }
    }
});
