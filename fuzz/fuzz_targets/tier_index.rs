//! The tier's content list (`index`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = granary::decode_tier_index(data);
});
