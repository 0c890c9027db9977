//! The snapshot: `Snapshot::open` and every accessor a reader calls, on any bytes. A snapshot
//! that opens and passes the complete structural check must also be consistent: every path is
//! found at its own id, the path order is sorted, and searches and listings of the path order
//! (through the path pages of format 1.5, when present) agree with it.
#![no_main]
use granary_format::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = Snapshot::open(data) else { return };
    let _ = (s.version(), s.dataset_id(), s.lineage(), s.header_crc());
    let n = s.sample_count();
    for i in 0..s.chunk_count().min(256) {
        let _ = s.chunk(i);
        let _ = s.chunk_summary(i);
    }
    for l in 0..s.class_count().min(256) as u32 {
        let _ = s.class_name(l);
    }
    let _ = s.class_name(u32::MAX);
    for id in 0..n.min(2048) {
        let _ = s.sample(id);
        let _ = s.sorted_id(id);
        if let Ok(p) = s.path(id) {
            let _ = s.lookup(p);
            let _ = s.lookup_stat(p);
            let _ = s.prefix_range(p);
        }
    }
    let _ = s.sample(n);
    let _ = s.path(n);
    let _ = s.lookup(b"no/such/path");
    let _ = s.prefix_range(b"");
    let _ = (s.lower_bound(b"\xff"), s.prefix_end(b"a", 0), s.page_index());
    let _ = (s.sorted_paths(0..n.min(4096)), s.sorted_paths(n.saturating_sub(3)..n + 3));
    let sections_ok = s.check_sections().is_empty();
    if sections_ok && s.check_structure(1 << 16).is_empty() {
        let mut prev: Option<&[u8]> = None;
        for pos in 0..n {
            let id = s.sorted_id(pos).expect("a checked snapshot has a sorted id at every position");
            let p = s.path(id).expect("a checked snapshot has every path");
            assert_eq!(s.lookup(p).unwrap(), Some(id), "a checked snapshot finds every path");
            assert!(prev.is_none_or(|q| q < p), "a checked path order is sorted");
            assert_eq!(s.lower_bound(p).unwrap(), pos, "a checked path is found at its position");
            prev = Some(p);
        }
        let listed = s.sorted_paths(0..n).expect("a checked snapshot lists its paths");
        for (pos, e) in listed.iter().enumerate() {
            assert_eq!(s.sorted_id(pos as u64).unwrap(), e.id, "listed in the path order");
            assert_eq!(s.path(e.id).unwrap(), e.path.as_slice(), "listed with its own path");
            if let Some(st) = e.stat {
                assert_eq!(st, s.stat(e.id).unwrap(), "listed with its own size and attributes");
            }
        }
    }
});
