//! Streaming epochs from a real dataset through both I/O backends.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use granary::io::IoKind;
use granary::IoMode;
use granary::{
    shuffle_quality, Dataset, EpochPlan, PlanOptions, Shard, ShuffleMode, StreamOptions,
};
use granary_packer::{pack, Order, PackOptions};

/// A class-sorted source: 6 class directories of 80 files; even files compressible text, odd
/// files random bytes (stored raw).
fn source(root: &Path) -> HashMap<Vec<u8>, Vec<u8>> {
    let mut files = HashMap::new();
    let mut x = 0x1234_5678_u64;
    for c in 0..6 {
        for i in 0..80 {
            let data: Vec<u8> = if i % 2 == 0 {
                format!("class {c} item {i} ").repeat(20 + i).into_bytes()
            } else {
                (0..(300 + i * 53))
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            };
            let rel = format!("class{c}/{i:03}.bin");
            let p = root.join(&rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &data).unwrap();
            files.insert(rel.into_bytes(), data);
        }
    }
    files
}

fn dataset(root: &Path, order: Order) -> (Arc<Dataset>, HashMap<Vec<u8>, Vec<u8>>) {
    let src = root.join("src");
    let files = source(&src);
    let out = root.join(format!("ds-{order:?}"));
    let mut o = PackOptions::new(&src, &out);
    o.output.chunk_size = 6 << 10;
    o.order = order;
    pack(&o).unwrap();
    (Arc::new(Dataset::open(&out).unwrap()), files)
}

fn io(kind: IoKind, io_mode: IoMode) -> StreamOptions {
    StreamOptions {
        io: kind,
        io_mode,
        queue_depth: 4,
        ..StreamOptions::default()
    }
}

fn uring_available() -> bool {
    granary::io::Engine::new(IoKind::Uring, 4, 1 << 20).is_ok()
}

/// (id, bytes) of every delivered sample of every shard.
fn deliver(
    ds: &Arc<Dataset>,
    o: &PlanOptions,
    s: &StreamOptions,
    world: u32,
    workers: u32,
) -> Vec<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    for r in 0..world {
        for k in 0..workers {
            let shard = Shard {
                rank: r,
                world_size: world,
                worker: k,
                num_workers: workers,
            };
            let st = ds.stream_epoch(o, 3, shard, None, s).unwrap();
            out.push(
                st.map(|x| {
                    let x = x.unwrap();
                    assert_eq!(x.crc32(), crc32fast::hash(x.data()), "sample {}", x.id);
                    (x.id, x.data().to_vec())
                })
                .collect(),
            );
        }
    }
    out
}

#[test]
fn both_backends_deliver_identical_checked_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, files) = dataset(tmp.path(), Order::Random);
    let modes = [IoMode::Direct, IoMode::Buffered, IoMode::Auto];
    let mut kinds: Vec<(IoKind, IoMode)> = modes.iter().map(|&m| (IoKind::Pread, m)).collect();
    if uring_available() {
        kinds.extend(modes.iter().map(|&m| (IoKind::Uring, m)));
    } else {
        eprintln!("io_uring is not available here: only the pread backend is tested");
    }
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        let o = PlanOptions {
            mode,
            seed: 11,
            window_chunks: 3,
            ..PlanOptions::default()
        };
        let reference = deliver(&ds, &o, &io(kinds[0].0, kinds[0].1), 2, 2);
        let total: usize = reference.iter().map(|v| v.len()).sum();
        assert_eq!(total, 480);
        for (id, data) in reference.iter().flatten() {
            assert_eq!(Some(data), files.get(&ds.path(*id).unwrap()), "sample {id}");
        }
        // The order is the plan's order.
        let plan = EpochPlan::build(
            &ds.shape().unwrap(),
            &o,
            3,
            Shard {
                rank: 1,
                world_size: 2,
                worker: 0,
                num_workers: 2,
            },
            None,
        )
        .unwrap();
        assert_eq!(
            reference[2].iter().map(|x| x.0).collect::<Vec<_>>(),
            plan.samples
        );
        for (kind, io_mode) in &kinds[1..] {
            assert_eq!(
                deliver(&ds, &o, &io(*kind, *io_mode), 2, 2),
                reference,
                "{mode:?} {kind:?} {io_mode:?}"
            );
        }
    }
}

#[test]
fn raw_samples_are_not_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, _) = dataset(tmp.path(), Order::Random);
    let st = ds
        .stream_epoch(
            &PlanOptions::default(),
            0,
            Shard::WHOLE,
            None,
            &StreamOptions::default(),
        )
        .unwrap();
    let (mut shared, mut owned) = (0, 0);
    for s in st {
        let s = s.unwrap();
        let raw = ds.sample(s.id).unwrap().compression == granary::Compression::None;
        assert_eq!(s.is_zero_copy(), raw);
        if raw {
            shared += 1
        } else {
            owned += 1
        }
    }
    assert!(shared > 100 && owned > 100, "{shared} {owned}");
}

#[test]
fn damage_mid_epoch_is_an_error_naming_chunk_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, files) = dataset(tmp.path(), Order::Random);
    // Damage a raw record in chunk 5.
    let ce = ds.chunk(5).unwrap();
    let victim = ce
        .samples()
        .find(|&id| ds.sample(id).unwrap().compression == granary::Compression::None)
        .unwrap();
    let e = ds.sample(victim).unwrap().entry;
    let path = ds.chunk_path(5);
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    bad[e.offset as usize + 2] ^= 0x55;
    std::fs::write(&path, &bad).unwrap();
    // Read with O_DIRECT, and mapped from the page cache (the damaged file was just written).
    let ways = [IoKind::Pread, IoKind::Uring]
        .into_iter()
        .flat_map(|k| [(k, IoMode::Direct), (k, IoMode::Auto)]);
    for (kind, io_mode) in ways {
        if kind == IoKind::Uring && !uring_available() {
            continue;
        }
        let o = PlanOptions {
            mode: ShuffleMode::Sequential,
            window_chunks: 2,
            ..PlanOptions::default()
        };
        let mut st = ds
            .stream_epoch(&o, 0, Shard::WHOLE, None, &io(kind, io_mode))
            .unwrap();
        let mut ok = 0;
        let err = loop {
            match st.next() {
                Some(Ok(s)) => {
                    assert_eq!(Some(&s.data().to_vec()), files.get(&ds.path(s.id).unwrap()));
                    assert_ne!(s.id, victim, "damaged sample delivered");
                    ok += 1;
                }
                Some(Err(e)) => break e.to_string(),
                None => panic!("damage went unnoticed"),
            }
        };
        assert!(ok > 0, "samples before the damage are delivered");
        assert!(
            err.contains("chunk 5") && err.contains(&format!("offset {}", e.offset)),
            "{err}"
        );
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(st.next().is_none(), "the stream ends after an error");
    }
    // A truncated chunk is an error too.
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    let st = ds
        .stream_epoch(
            &PlanOptions::default(),
            0,
            Shard::WHOLE,
            None,
            &StreamOptions::default(),
        )
        .unwrap();
    let errs: Vec<String> = st.filter_map(|r| r.err()).map(|e| e.to_string()).collect();
    assert_eq!(errs.len(), 1);
    assert!(errs[0].contains("chunk-00000005"), "{}", errs[0]);
}

#[test]
fn chunkwise_shuffle_of_mixed_packing_is_close_to_global() {
    let tmp = tempfile::tempdir().unwrap();
    let shape_and_labels = |ds: &Dataset| {
        let labels: Vec<u32> = (0..ds.len())
            .map(|id| ds.sample(id).unwrap().entry.label)
            .collect();
        (ds.shape().unwrap(), labels)
    };
    let quality = |ds: &Dataset, mode: ShuffleMode| {
        let (shape, labels) = shape_and_labels(ds);
        let o = PlanOptions {
            mode,
            seed: 5,
            window_chunks: 4,
            ..PlanOptions::default()
        };
        let p = EpochPlan::build(&shape, &o, 0, Shard::WHOLE, None).unwrap();
        shuffle_quality(&shape, |id| labels[id as usize], &p.samples, 32)
    };
    let (mixed, _) = dataset(tmp.path(), Order::Random);
    let (sorted, _) = dataset(tmp.path(), Order::Walk);
    let g = quality(&mixed, ShuffleMode::Global);
    let c = quality(&mixed, ShuffleMode::Chunkwise);
    let bad = quality(&sorted, ShuffleMode::Chunkwise);
    // Stated tolerance: block label TV within 0.05 of global, label runs within 15 %.
    assert!(
        c.block_label_tv <= g.block_label_tv + 0.05,
        "chunkwise {c:?} vs global {g:?}"
    );
    assert!(
        c.mean_label_run <= g.mean_label_run * 1.15,
        "chunkwise {c:?} vs global {g:?}"
    );
    // Without mixing at pack time chunk-wise shuffle is far from global: the metric can fail.
    assert!(
        bad.block_label_tv > g.block_label_tv * 1.5,
        "walk-order packing {bad:?} vs global {g:?}"
    );
}

#[test]
fn dropping_a_stream_early_stops_its_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, _) = dataset(tmp.path(), Order::Random);
    for kind in [IoKind::Pread, IoKind::Uring] {
        if kind == IoKind::Uring && !uring_available() {
            continue;
        }
        let o = PlanOptions {
            window_chunks: 1,
            ..PlanOptions::default()
        };
        let mut st = ds
            .stream_epoch(&o, 0, Shard::WHOLE, None, &io(kind, IoMode::Direct))
            .unwrap();
        for _ in 0..10 {
            st.next().unwrap().unwrap();
        }
        drop(st);
        // The dataset is shared with the stream's threads; once they have stopped, this is the
        // last reference again.
        let t = std::time::Instant::now();
        while Arc::strong_count(&ds) > 1 {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "stream threads still running"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// Drops `path` from the page cache (fsync, then `posix_fadvise(DONTNEED)`); false where the
/// file system keeps it anyway (tmpfs).
fn evict(path: &Path) -> bool {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    granary::resident_share(&f, f.metadata().unwrap().len()) == 0.0
}

/// The origin layer's meter of a stream (how it opened its files).
fn origin(st: &granary::EpochStream) -> granary::MeterReading {
    let layers = st.layers();
    layers.into_iter().find(|l| l.0 == "origin").unwrap().1
}

#[test]
fn resident_chunks_are_mapped_and_cold_ones_read_as_the_mode_says() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, files) = dataset(tmp.path(), Order::Random);
    let chunks = ds.chunk_count();
    let epoch = |opts: &StreamOptions| {
        let mut st = ds
            .stream_epoch(&PlanOptions::default(), 0, Shard::WHOLE, None, opts)
            .unwrap();
        let mut mapped = 0;
        for s in st.by_ref() {
            let s = s.unwrap();
            assert_eq!(Some(&s.data().to_vec()), files.get(&ds.path(s.id).unwrap()));
            mapped += s.is_zero_copy() as u64;
        }
        (origin(&st), mapped)
    };
    let auto = StreamOptions::default();
    let direct = io(IoKind::Auto, IoMode::Direct);
    // Resident (just read; being just written is not enough where the kernel writes back and
    // drops pages under other tests' memory pressure): auto maps every chunk and reads nothing.
    for c in 0..chunks as u32 {
        std::fs::read(ds.chunk_path(c)).unwrap();
    }
    let (c, _) = epoch(&auto);
    assert_eq!(
        (c.opened_resident, c.opened_buffered, c.opened_direct),
        (chunks, 0, 0),
        "{c:?} of {chunks}"
    );
    assert_eq!(epoch(&direct).0.opened_resident, 0);
    if !(0..chunks as u32).all(|c| evict(&ds.chunk_path(c))) {
        eprintln!("this file system keeps files in memory: the cold half is not tested");
        return;
    }
    // Cold and without a page-cache budget: O_DIRECT, so nothing becomes resident...
    let no_budget = StreamOptions {
        page_cache_bytes: Some(0),
        ..StreamOptions::default()
    };
    let (c, _) = epoch(&no_budget);
    assert_eq!((c.opened_resident, c.opened_buffered), (0, 0), "{c:?}");
    assert_eq!(
        epoch(&no_budget).0.opened_resident,
        0,
        "O_DIRECT left nothing resident"
    );
    // ...with a budget for all of it: read through the page cache once, mapped afterwards.
    let (c, _) = epoch(&auto);
    assert_eq!(
        (c.opened_resident, c.opened_buffered, c.opened_direct),
        (0, chunks, 0),
        "{c:?}"
    );
    let (c, mapped) = epoch(&auto);
    assert_eq!(c.opened_resident, chunks, "{c:?}");
    let raw = (0..ds.len())
        .filter(|&i| ds.sample(i).unwrap().compression == granary::Compression::None)
        .count() as u64;
    assert_eq!(mapped, raw, "every raw sample is a slice of the map");
}

/// The read-buffer budget holds in every mode — chunk-wise, global, sequential, with an LRU
/// tier and with an importance tier that re-packs hot chunks — with every sample intact; and a
/// budget smaller than one window still finishes the epoch (the next window is always read).
#[test]
fn the_memory_budget_holds_in_every_mode() {
    use granary::{LocalTier, TierPolicy};
    let tmp = tempfile::tempdir().unwrap();
    let (ds, files) = dataset(tmp.path(), Order::Random);
    let n = ds.len();
    let mut scores = granary::ImportanceScores::new(n, 0.8);
    let w: Vec<(u64, f32)> = (0..n)
        .map(|id| (id, if id % 5 == 0 { 100.0 } else { 1.0 }))
        .collect();
    scores.apply(&w);
    let scores = Arc::new(scores);
    let id = ds.snapshot().dataset_id();
    let tier = |name: &str, policy| {
        Some(Arc::new(
            LocalTier::open(&tmp.path().join(name), id, 64 << 10, policy).unwrap(),
        ))
    };
    let budget: u64 = 512 << 10;
    let cases = [
        ("chunkwise", ShuffleMode::Chunkwise, None, None),
        ("global", ShuffleMode::Global, None, None),
        ("sequential", ShuffleMode::Sequential, None, None),
        (
            "chunkwise, LRU tier",
            ShuffleMode::Chunkwise,
            tier("lru", TierPolicy::Lru),
            None,
        ),
        (
            "chunkwise, importance tier with hot chunks",
            ShuffleMode::Chunkwise,
            tier("imp", TierPolicy::Importance),
            Some(scores.clone()),
        ),
    ];
    for (what, mode, cache, scores) in cases {
        for epoch in 0..2 {
            for (memory, window) in [(budget, 1), (1, 2)] {
                let o = PlanOptions {
                    mode,
                    seed: 5,
                    window_chunks: window,
                    ..PlanOptions::default()
                };
                let s = StreamOptions {
                    io: IoKind::Pread,
                    io_mode: IoMode::Direct,
                    memory,
                    tier: cache.clone(),
                    scores: scores.clone(),
                    ..StreamOptions::default()
                };
                let shard = Shard {
                    rank: 0,
                    world_size: 1,
                    worker: 0,
                    num_workers: 1,
                };
                let mut st = ds.stream_epoch(&o, epoch, shard, None, &s).unwrap();
                let mut seen = 0;
                for x in st.by_ref() {
                    let x = x.unwrap();
                    assert_eq!(Some(&x.data().to_vec()), files.get(&ds.path(x.id).unwrap()));
                    seen += 1;
                }
                assert_eq!(seen, n, "{what}, epoch {epoch}, memory {memory}");
                let peak = st.peak_buffer_bytes();
                assert!(peak > 0, "{what}: nothing accounted");
                if memory == budget {
                    assert!(
                        peak <= budget,
                        "{what}, epoch {epoch}: peak {peak} over the budget {budget}"
                    );
                } else {
                    // One window at a time past the budget: far below the first case's.
                    assert!(peak < budget / 2, "{what}, epoch {epoch}: peak {peak}");
                }
            }
        }
    }
}
