//! The marker of an uploaded chunk (resume state of a pack to an object store).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    granary_packer::parsers::upload_marker(data);
});
