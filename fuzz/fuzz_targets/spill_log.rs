//! A dataset writer's spill log (its resume state).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    granary_packer::parsers::spill_log(data);
});
