//! Format 1.x snapshots, the input of `granary upgrade`: `read_legacy_snapshot` on any bytes
//! never panics, and whatever it accepts is either refused by the 2.0 builder or becomes a
//! snapshot that passes the complete check.
#![no_main]
use granary_format::{read_legacy_snapshot, Snapshot, SnapshotBuilder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(l) = read_legacy_snapshot(data) else { return };
    let mut b = SnapshotBuilder::new(l.dataset_id, l.classes.clone());
    b.lineage(l.lineage);
    for c in &l.chunks {
        if b.push_chunk(c).is_err() {
            return;
        }
    }
    if b.push_dirs(l.dirs.clone()).is_err() {
        return;
    }
    let Ok(new) = b.build() else { return };
    let s = Snapshot::open(&new[..]).expect("a built snapshot opens");
    assert!(s.check_blocks().is_empty(), "a built snapshot's blocks check");
    assert!(
        s.check_structure(8).is_empty(),
        "a built snapshot is consistent: {:?}",
        s.check_structure(8)
    );
});
