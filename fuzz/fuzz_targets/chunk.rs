//! A chunk file: header, trailer, footer and every record (`check_chunk`, what `granary
//! verify` and the tier run on a chunk's bytes). Whatever a checked chunk hands out as a good
//! record has the length and CRC its entry promises.
#![no_main]
use granary_format::{check_chunk, crc32, decode_record, ChunkHeader, Trailer, CHUNK_TRAILER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = data
        .len()
        .checked_sub(CHUNK_TRAILER_LEN)
        .map(|at| Trailer::decode(&data[at..], data.len() as u64));
    let Ok(h) = ChunkHeader::decode(data) else { return };
    let Ok(c) = check_chunk(data, &h.dataset_id, h.chunk_id) else { return };
    assert_eq!(c.footer.entries.len(), c.footer.paths.len());
    for (i, e) in c.footer.entries.iter().enumerate() {
        assert_eq!(e.chunk, h.chunk_id);
        let stored = &data[e.offset as usize..(e.offset + e.stored_len) as usize];
        let bad = c.bad_records.iter().any(|(j, _)| *j == i);
        match decode_record(e, stored) {
            Ok(bytes) => {
                assert!(!bad, "record {i} listed bad but decodes");
                assert_eq!(bytes.len() as u64, e.orig_len);
                assert_eq!(crc32(&bytes), e.crc32);
            }
            Err(_) => assert!(bad, "record {i} fails to decode but is not listed bad"),
        }
    }
});
