//! The snapshot: `Snapshot::open` and every accessor a reader calls, on any bytes, as they
//! come and resealed (every CRC recomputed, so that the structural checks behind the block
//! CRCs are reached). A snapshot that opens and passes the complete check must also be
//! consistent: every file found at its own id, the namespace sorted, searches and listings
//! agreeing with it.
#![no_main]
use granary_format::Snapshot;
use libfuzzer_sys::fuzz_target;

fn exercise(data: &[u8]) {
    let Ok(s) = Snapshot::open(data) else { return };
    let _ = (s.version(), s.dataset_id(), s.lineage(), s.content_digest());
    let n = s.sample_count();
    for i in 0..s.chunk_count().min(256) {
        let _ = (s.chunk(i), s.chunk_summary(i), s.class_counts(i));
    }
    for l in 0..s.class_count().min(256) as u32 {
        let _ = s.class_name(l);
    }
    let _ = (s.class_name(u32::MAX), s.field_names(), s.field_types());
    for id in 0..n.min(2048) {
        let _ = (s.sample(id), s.attrs(id), s.position(id));
        if s.has_fields() {
            let _ = (s.fields(id), s.field_first(id));
        }
        if let Ok(p) = s.path(id) {
            let _ = (s.lookup(&p), s.lookup_stat(&p), s.prefix_range(&p));
        }
    }
    let _ = (s.sample(n), s.path(n), s.lookup(b"no/such/path"), s.prefix_range(b""));
    let _ = (s.lower_bound(b"\xff"), s.page_index(), s.dirs());
    let e = s.entry_count();
    let _ = (s.entries(0..e.min(4096)), s.entries(e.saturating_sub(3)..e + 3));
    if s.check_blocks().is_empty() && s.check_structure(1 << 16).is_empty() {
        let all = s.entries(0..e).expect("a checked snapshot lists its namespace");
        for (pos, en) in all.iter().enumerate() {
            if pos > 0 {
                assert!(all[pos - 1].path < en.path, "a checked namespace is sorted");
            }
            assert_eq!(s.lower_bound(&en.path).unwrap(), pos as u64, "found at its position");
            if let Some(id) = en.id {
                assert_eq!(s.path(id).unwrap(), en.path, "a file at its own id");
                assert_eq!(s.lookup(&en.path).unwrap(), Some(id), "a checked path is found");
                assert_eq!(s.position(id).unwrap(), pos as u64, "the id table agrees");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    exercise(data);
    let mut sealed = data.to_vec();
    if granary_format::testing::reseal_snapshot(&mut sealed) {
        exercise(&sealed);
    }
});
