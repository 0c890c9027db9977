//! The score table: whatever decodes, encodes back to the same bytes.
#![no_main]
use granary::ImportanceScores;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = ImportanceScores::decode(data) {
        assert_eq!(t.encode(), data);
        let _ = (t.mean(), t.score(0), t.score(u64::MAX));
    }
});
