//! Flip bytes and truncate files of a real dataset at many positions: every change is reported
//! by verify, and reads either fail or return exactly the original bytes; nothing panics.

use std::collections::HashMap;
use std::path::Path;

use granary::{verify, Dataset, ReadError};
use granary_packer::{pack, PackOptions};

fn make_dataset(root: &Path) -> (std::path::PathBuf, HashMap<Vec<u8>, Vec<u8>>) {
    let src = root.join("src");
    let mut files = HashMap::new();
    for i in 0..60u32 {
        let data: Vec<u8> = if i % 2 == 0 {
            format!("compressible sample {i} ").repeat(40).into_bytes()
        } else {
            (0..(i * 37 % 900)).map(|j| (j * 31 + i) as u8).collect()
        };
        let rel = format!("k{}/f{i}", i % 3).into_bytes();
        let p = src.join(String::from_utf8(rel.clone()).unwrap());
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &data).unwrap();
        files.insert(rel, data);
    }
    let ds = root.join("ds");
    let mut o = PackOptions::new(&src, &ds);
    o.output.chunk_size = 8 << 10;
    pack(&o).unwrap();
    (ds, files)
}

/// Reads every sample; each read must fail, as damaged data (a typed cause callers can tell
/// from a failing system call), or return the original bytes of its path.
fn reads_are_never_wrong(ds_path: &Path, files: &HashMap<Vec<u8>, Vec<u8>>) -> usize {
    let Ok(ds) = Dataset::open(ds_path) else {
        return 0;
    };
    let mut failures = 0;
    for id in 0..ds.len() {
        match (ds.path(id), ds.read(id)) {
            (Ok(p), Ok(data)) => {
                assert_eq!(
                    Some(&data),
                    files.get(&p),
                    "sample {id} returned wrong bytes"
                );
            }
            (_, Err(e)) => {
                assert!(
                    matches!(
                        e,
                        ReadError::Store(
                            granary::StoreError::Format { .. }
                                | granary::StoreError::Damaged { .. }
                        ) | ReadError::Record(_)
                    ),
                    "sample {id}: {e:?} is not reported as damage"
                );
                failures += 1
            }
            (Err(_), Ok(_)) => failures += 1,
        }
    }
    failures
}

#[test]
fn every_snapshot_flip_and_cut_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, _) = make_dataset(tmp.path());
    let snap = ds.join(granary_format::SNAPSHOT_FILE);
    let good = std::fs::read(&snap).unwrap();
    assert!(verify(&ds).is_clean());
    for pos in 0..good.len() {
        let mut b = good.clone();
        b[pos] ^= 1 << (pos % 8);
        std::fs::write(&snap, &b).unwrap();
        assert!(
            Dataset::open_checked(&ds).is_err(),
            "flip at {pos} accepted by open_checked"
        );
        if pos % 97 == 0 {
            assert!(!verify(&ds).is_clean(), "flip at {pos} passed verify");
        }
    }
    for cut in (0..good.len()).step_by(3) {
        std::fs::write(&snap, &good[..cut]).unwrap();
        assert!(Dataset::open(&ds).is_err(), "cut at {cut} opened");
        assert!(!verify(&ds).is_clean());
    }
    std::fs::write(&snap, &good).unwrap();
    assert!(verify(&ds).is_clean());
}

#[test]
fn chunk_flips_and_cuts_are_reported_and_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, files) = make_dataset(tmp.path());
    let chunk = ds.join(granary_format::chunk_file_name(1));
    let good = std::fs::read(&chunk).unwrap();
    let n = good.len();
    assert_eq!(reads_are_never_wrong(&ds, &files), 0);
    let positions: Vec<usize> = (0..64)
        .chain((64..n).step_by(5))
        .chain(n.saturating_sub(300)..n)
        .collect();
    let mut detected_by_read = 0;
    for &pos in &positions {
        let mut b = good.clone();
        b[pos] ^= 0x08;
        std::fs::write(&chunk, &b).unwrap();
        let r = verify(&ds);
        assert!(!r.is_clean(), "flip at {pos} passed verify");
        assert!(
            r.problems
                .iter()
                .any(|p| p.location.contains("chunk-00000001")),
            "{:?}",
            r.problems
        );
        let failed = reads_are_never_wrong(&ds, &files);
        if pos < 64 {
            assert!(failed > 0, "header flip at {pos} not caught by reads");
        }
        detected_by_read += failed.min(1);
    }
    // Footer flips do not affect reads (the footer is for recovery); record flips do.
    assert!(
        detected_by_read > positions.len() / 3,
        "{detected_by_read} of {}",
        positions.len()
    );
    for cut in (0..n).step_by(11) {
        std::fs::write(&chunk, &good[..cut]).unwrap();
        assert!(!verify(&ds).is_clean(), "cut at {cut} passed verify");
        assert!(reads_are_never_wrong(&ds, &files) > 0);
    }
    std::fs::write(&chunk, &good).unwrap();
    assert!(verify(&ds).is_clean());
}

/// Chunk files and the snapshot cut short by another process while a stream reads them through
/// maps (they were resident, so the stream maps them): no SIGBUS. Every sample delivered is
/// right, the epoch ends with an error naming a file, and lookups in the cut snapshot are
/// errors naming it. Without the SIGBUS guard this test kills its own process.
#[test]
fn files_cut_short_under_their_maps_are_errors_not_sigbus() {
    use granary::{PlanOptions, Shard, ShuffleMode, StreamOptions};
    let tmp = tempfile::tempdir().unwrap();
    let (ds_path, files) = make_dataset(tmp.path());
    let ds = std::sync::Arc::new(Dataset::open(&ds_path).unwrap());
    for c in 0..ds.chunk_count() as u32 {
        std::fs::read(ds.chunk_path(c)).unwrap(); // resident: mapped by the stream
    }
    let plan = PlanOptions {
        mode: ShuffleMode::Sequential,
        window_chunks: 1,
        ..PlanOptions::default()
    };
    let mut st = ds
        .stream_epoch(&plan, 0, Shard::WHOLE, None, &StreamOptions::default())
        .unwrap();
    let first = st.next().unwrap().unwrap();
    assert_eq!(
        Some(&first.data().to_vec()),
        files.get(&ds.path(first.id).unwrap())
    );
    let origin = st.layers().into_iter().find(|l| l.0 == "origin").unwrap().1;
    assert!(origin.opened_resident > 0, "the stream mapped nothing");
    for c in 0..ds.chunk_count() as u32 {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(ds.chunk_path(c))
            .unwrap();
        f.set_len(100).unwrap();
    }
    // Samples are slices of the maps, checked before they are handed on and read by us after:
    // one whose file was cut meanwhile may read as zeros, is not `intact()`, and the stream's
    // next call is the error. Nothing wrong goes unreported.
    let (mut good, mut wrong, mut error) = (1, 0, None);
    for s in st {
        match s {
            Ok(s) if Some(&s.data().to_vec()) == files.get(&ds.path(s.id).unwrap()) => good += 1,
            Ok(s) => {
                assert!(
                    s.intact().is_err(),
                    "sample {} has wrong bytes and says it is intact",
                    s.id
                );
                wrong += 1;
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let error =
        error.unwrap_or_else(|| panic!("the epoch ended without error after {good} samples"));
    assert!(
        error.contains(".gchunk") && error.contains("cut short"),
        "{error}"
    );
    assert!(
        wrong <= 1,
        "{wrong} samples with wrong bytes before the error"
    );

    // The snapshot, cut under its map (a fresh dataset): every read is an error or the right
    // bytes. Pages wholly past the new end read as zeros through the SIGBUS guard, which marks
    // the map, and lookups then fail naming the snapshot; the rest of the last page reads as
    // zeros without a fault, which the placement checks refuse (a zero entry lies nowhere).
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (ds_path, files) = make_dataset(&other);
    let ds = Dataset::open(&ds_path).unwrap();
    let paths: Vec<Vec<u8>> = (0..ds.len())
        .map(|i| ds.path(i).unwrap().to_vec())
        .collect();
    let snap = ds_path.join(granary_format::SNAPSHOT_FILE);
    let f = std::fs::OpenOptions::new().write(true).open(&snap).unwrap();
    f.set_len(64).unwrap();
    let mut errors = 0;
    for id in 0..ds.len() {
        match ds.read(id) {
            Ok(d) => assert_eq!(Some(&d), files.get(&paths[id as usize]), "sample {id}"),
            Err(e) => {
                errors += 1;
                let e = e.to_string();
                assert!(e.contains("snapshot.gsnap"), "sample {id}: {e}");
            }
        }
    }
    assert_eq!(errors, ds.len(), "the cut snapshot served samples");
}
