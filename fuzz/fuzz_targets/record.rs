//! One record: a 40-byte sample entry then stored bytes (raw or zstd). Accepted bytes have the
//! entry's length and CRC; a lying length never allocates more than the format allows.
#![no_main]
use granary_format::{crc32, decode_record, SampleEntry, SAMPLE_ENTRY_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < SAMPLE_ENTRY_LEN {
        return;
    }
    let (e, stored) = data.split_at(SAMPLE_ENTRY_LEN);
    let mut e = SampleEntry::decode(e);
    e.stored_len = stored.len() as u64;
    let _ = e.check_lengths();
    if let Ok(bytes) = decode_record(&e, stored) {
        assert_eq!(bytes.len() as u64, e.orig_len);
        assert_eq!(crc32(&bytes), e.crc32);
    }
});
