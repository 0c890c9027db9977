//! The storage seam: a dataset whose chunks come from a store that is not a local file (here an
//! in-memory store, read only through `ChunkSource::read_ranges`) streams, caches in the tier,
//! reads single samples and detects damage exactly as a local one does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use granary::io::IoKind;
use granary::{
    ChunkSource, ChunkStore, Dataset, LocalTier, PlanOptions, RangeRead, ReadError, SampleReader,
    Shard, ShuffleMode, Source, StoreError, StreamOptions, TierPolicy,
};
use granary_packer::{pack, PackOptions};

/// Chunk files held in memory, with counters of what was asked of them.
#[derive(Debug, Default)]
struct MemStore {
    chunks: Mutex<HashMap<u32, Arc<Vec<u8>>>>,
    opens: AtomicU64,
    calls: AtomicU64,
    ranges: AtomicU64,
    bytes: AtomicU64,
}

#[derive(Debug)]
struct MemSource {
    name: PathBuf,
    bytes: Arc<Vec<u8>>,
    store: Arc<MemStore>,
}

impl ChunkSource for MemSource {
    fn location(&self) -> &Path {
        &self.name
    }

    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> granary_store::Result<()> {
        self.store.calls.fetch_add(1, Relaxed);
        for r in reads.iter_mut() {
            let start = (r.offset as usize).min(self.bytes.len());
            let have = self.bytes.len() - start;
            if have < r.need {
                return Err(StoreError::damaged(
                    &self.name,
                    format!("ends before offset {}", r.offset + have as u64),
                ));
            }
            let n = have.min(r.buf.len());
            r.buf[..n].copy_from_slice(&self.bytes[start..start + n]);
            self.store.ranges.fetch_add(1, Relaxed);
            self.store.bytes.fetch_add(n as u64, Relaxed);
        }
        Ok(())
    }
}

/// The store as the dataset sees it (the counters stay reachable through the `Arc`).
#[derive(Debug)]
struct Mem(Arc<MemStore>);

impl ChunkStore for Mem {
    fn chunk_location(&self, id: u32) -> PathBuf {
        PathBuf::from(format!(
            "mem://test/{}",
            granary_format::chunk_file_name(id)
        ))
    }

    fn open_chunk(&self, id: u32) -> granary_store::Result<Source> {
        self.0.opens.fetch_add(1, Relaxed);
        let bytes = self.0.chunks.lock().unwrap().get(&id).cloned();
        let bytes =
            bytes.ok_or_else(|| StoreError::Invalid(format!("{} is not in the store", id)))?;
        Ok(Arc::new(MemSource {
            name: self.chunk_location(id),
            bytes,
            store: self.0.clone(),
        }))
    }
}

/// A packed dataset (local) and the same dataset with its chunks served from memory.
fn datasets(root: &Path) -> (Arc<Dataset>, Arc<Dataset>, Arc<MemStore>) {
    let src = root.join("src");
    let mut x = 0x9e37_79b9_u64;
    for c in 0..5 {
        for i in 0..60 {
            let len = 200 + (i * 37) % 900;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let p = src.join(format!("c{c}/{i:03}.bin"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, data).unwrap();
        }
    }
    let out = root.join("ds");
    let mut o = PackOptions::new(&src, &out);
    o.output.chunk_size = 8 << 10;
    pack(&o).unwrap();
    let local = Arc::new(Dataset::open(&out).unwrap());
    let store = Arc::new(MemStore::default());
    for c in 0..local.chunk_count() as u32 {
        let bytes = std::fs::read(local.chunk_path(c)).unwrap();
        store.chunks.lock().unwrap().insert(c, Arc::new(bytes));
    }
    let mem = Arc::new(Dataset::open_with_store(&out, Arc::new(Mem(store.clone()))).unwrap());
    (local, mem, store)
}

fn epoch(ds: &Arc<Dataset>, o: &PlanOptions, s: &StreamOptions, n: u64) -> Vec<(u64, Vec<u8>)> {
    let st = ds.stream_epoch(o, n, Shard::WHOLE, None, s).unwrap();
    st.map(|x| x.map(|x| (x.id, x.data().to_vec())).unwrap())
        .collect()
}

fn kinds() -> Vec<IoKind> {
    let mut k = vec![IoKind::Pread];
    if granary::io::Engine::new(IoKind::Uring, 4, 1 << 20).is_ok() {
        k.push(IoKind::Uring);
    } else {
        eprintln!("io_uring is not available here: only the pread backend is tested");
    }
    k
}

#[test]
fn a_store_that_is_no_local_file_serves_every_plan_through_both_backends() {
    let tmp = tempfile::tempdir().unwrap();
    let (local, mem, store) = datasets(tmp.path());
    assert!(local.chunk_count() >= 6, "{}", local.chunk_count());
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        let o = PlanOptions {
            mode,
            seed: 5,
            window_chunks: if mode == ShuffleMode::Global { 8 } else { 2 },
            ..PlanOptions::default()
        };
        for kind in kinds() {
            let s = StreamOptions {
                io: kind,
                queue_depth: 4,
                ..StreamOptions::default()
            };
            let want = epoch(&local, &o, &s, 1);
            assert_eq!(want.len() as u64, local.len());
            let (calls, ranges) = (store.calls.load(Relaxed), store.ranges.load(Relaxed));
            let got = epoch(&mem, &o, &s, 1);
            assert!(got == want, "{mode:?} {kind:?}: ids or bytes differ");
            let calls = store.calls.load(Relaxed) - calls;
            let ranges = store.ranges.load(Relaxed) - ranges;
            assert!(calls > 0, "{mode:?} {kind:?}: the store was never read");
            if mode == ShuffleMode::Global {
                // One record per range, but one call per chunk and window: batched.
                assert!(
                    calls * 2 < ranges,
                    "{mode:?} {kind:?}: {calls} calls for {ranges} ranges"
                );
            }
        }
    }
    // Random access reads through the store too.
    let reader = SampleReader::new(mem.clone());
    for id in [0, 7, mem.len() - 1] {
        let want = local.read(id).unwrap();
        assert_eq!(mem.read(id).unwrap(), want);
        let info = mem.sample(id).unwrap();
        let mut out = vec![0u8; want.len()];
        reader.read_into(&info, &mut out).unwrap();
        assert_eq!(out, want);
    }
    assert_eq!(&*mem.load_chunk(2).unwrap(), &*local.load_chunk(2).unwrap());
}

#[test]
fn the_tier_in_front_of_a_store_serves_later_epochs_without_reading_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (local, mem, store) = datasets(tmp.path());
    let cache = Arc::new(
        LocalTier::open(
            &tmp.path().join("tier"),
            mem.snapshot().dataset_id(),
            u64::MAX,
            TierPolicy::Lru,
        )
        .unwrap(),
    );
    let s = StreamOptions {
        tier: Some(cache.clone()),
        ..StreamOptions::default()
    };
    let o = PlanOptions {
        window_chunks: 2,
        ..PlanOptions::default()
    };
    let plain = StreamOptions::default();
    let sorted = |mut v: Vec<(u64, Vec<u8>)>| {
        v.sort();
        v
    };
    let want = sorted(epoch(&local, &o, &plain, 0));
    // Admission is best effort (an offer made while the tier is busy writing is dropped):
    // epochs go on until every chunk has its copy.
    let mut n = 0;
    while cache
        .resident_chunks(mem.snapshot().chunks())
        .unwrap()
        .len()
        < mem.chunk_count() as usize
    {
        assert!(n < 30, "chunks never reached the tier");
        assert!(sorted(epoch(&mem, &o, &s, n)) == want, "epoch {n}");
        n += 1;
    }
    let before = store.bytes.load(Relaxed);
    assert!(sorted(epoch(&mem, &o, &s, n)) == want);
    assert_eq!(
        store.bytes.load(Relaxed),
        before,
        "a tier holding every chunk still read the store"
    );
}

#[test]
fn damage_in_a_store_is_an_error_naming_the_chunk_never_wrong_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (_local, mem, store) = datasets(tmp.path());
    let o = PlanOptions {
        window_chunks: 2,
        ..PlanOptions::default()
    };
    let s = StreamOptions::default();
    let original = store.chunks.lock().unwrap()[&3].clone();

    // A flipped byte inside a record: a CRC error naming the chunk's location.
    let e = mem.chunk(3).unwrap();
    let first = e.samples().start;
    let rec = mem.sample(first).unwrap().entry;
    let mut bad = (*original).clone();
    bad[(rec.offset + rec.stored_len / 2) as usize] ^= 0x40;
    store.chunks.lock().unwrap().insert(3, Arc::new(bad));
    let err = mem
        .stream_epoch(&o, 0, Shard::WHOLE, None, &s)
        .unwrap()
        .find_map(|x| x.err())
        .expect("a damaged record was delivered");
    assert!(
        err.to_string().contains("mem://test/") && matches!(err, ReadError::Record(_)),
        "{err}"
    );

    // A chunk shorter than the snapshot says: refused when opened.
    let short = original[..original.len() - 100].to_vec();
    store.chunks.lock().unwrap().insert(3, Arc::new(short));
    let err = mem
        .stream_epoch(&o, 0, Shard::WHOLE, None, &s)
        .unwrap()
        .find_map(|x| x.err())
        .expect("a truncated chunk was served");
    assert!(
        matches!(err, ReadError::Store(granary::StoreError::Damaged { .. })),
        "{err}"
    );
    assert!(mem.read(first).is_err());

    // A chunk missing from the store.
    store.chunks.lock().unwrap().remove(&3);
    let n = mem
        .stream_epoch(&o, 0, Shard::WHOLE, None, &s)
        .unwrap()
        .filter(|x| x.is_err())
        .count();
    assert_eq!(n, 1, "one error, then the stream ends");
}

#[test]
fn a_layer_over_local_files_keeps_the_engines_fast_path_and_the_meter_counts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (local, _, _) = datasets(tmp.path());
    let (wrapped, observed) = granary_store::testing::FastOnly::over(Arc::new(
        granary::LocalDir::new(tmp.path().join("ds")),
    ));
    let ds = Arc::new(Dataset::open_with_store(tmp.path().join("ds"), Arc::new(wrapped)).unwrap());
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        let o = PlanOptions {
            mode,
            seed: 3,
            window_chunks: 2,
            ..PlanOptions::default()
        };
        for kind in kinds() {
            let s = StreamOptions {
                io: kind,
                queue_depth: 4,
                ..StreamOptions::default()
            };
            let want = epoch(&local, &o, &s, 2);
            let before = observed.load(Relaxed);
            let mut st = ds.stream_epoch(&o, 2, Shard::WHOLE, None, &s).unwrap();
            let got: Vec<(u64, Vec<u8>)> = st
                .by_ref()
                .map(|x| x.map(|x| (x.id, x.data().to_vec())).unwrap())
                .collect();
            assert!(got == want, "{mode:?} {kind:?}: ids or bytes differ");
            let delivered: u64 = got.iter().map(|(_, d)| d.len() as u64).sum();
            let seen = observed.load(Relaxed) - before;
            assert!(seen >= delivered, "{mode:?} {kind:?}: {seen} < {delivered}");
            // The stack's meter over origin saw the same reads.
            let layers = st.layers();
            assert_eq!(layers.len(), 1, "{layers:?}");
            let (name, origin) = layers[0];
            assert_eq!(name, "origin");
            assert_eq!(origin.bytes, seen, "{mode:?} {kind:?}: {origin:?}");
            assert!(origin.reads > 0 && origin.opens > 0, "{origin:?}");
            assert_eq!(origin.errors, 0, "{origin:?}");
        }
    }
}
