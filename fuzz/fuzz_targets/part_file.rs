//! A shard's part file: whatever decodes encodes back to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    granary_packer::parsers::part(data);
});
