//! The local chunk tier: quota, policies, damage, restart, sharing.

use std::path::Path;
use std::sync::Arc;

use granary::{Dataset, LocalTier, TierPolicy};
use granary_packer::{pack, PackOptions};

/// What the tier and origin served of a stream so far, from its layers' meters.
#[derive(Clone, Copy, Debug, Default)]
struct Hits {
    samples_from_tier: u64,
    samples_from_origin: u64,
    bytes_from_tier: u64,
    bytes_from_origin: u64,
    admissions_skipped: u64,
}

fn hits_of(st: &granary::EpochStream) -> Hits {
    let layers = st.layers();
    let layer = |name| {
        let l = layers.iter().find(|l| l.0 == name);
        l.map(|l| l.1).unwrap_or_default()
    };
    let (tier, origin) = (layer("tier"), layer("origin"));
    Hits {
        samples_from_tier: tier.served_samples,
        samples_from_origin: origin.served_samples,
        bytes_from_tier: tier.served_bytes,
        bytes_from_origin: origin.served_bytes,
        admissions_skipped: tier.admissions_skipped,
    }
}

fn dataset(root: &Path, name: &str) -> Arc<Dataset> {
    let src = root.join("src");
    if !src.exists() {
        for i in 0..120u32 {
            let p = src.join(format!("c{}/f{i}", i % 3));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(
                &p,
                (0..(500 + i * 13))
                    .map(|j| (j * 7 + i) as u8)
                    .collect::<Vec<u8>>(),
            )
            .unwrap();
        }
    }
    let out = root.join(name);
    let mut o = PackOptions::new(&src, &out);
    o.output.chunk_size = 8 << 10;
    o.order = granary_packer::Order::Walk;
    pack(&o).unwrap();
    Arc::new(Dataset::open(&out).unwrap())
}

fn chunk_bytes(ds: &Dataset, c: u32) -> Vec<u8> {
    std::fs::read(ds.chunk_path(c)).unwrap()
}

#[test]
fn quota_holds_under_concurrent_admission_and_lru_evicts() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let root = tmp.path().join("cache");
    let sizes: Vec<u64> = (0..ds.chunk_count() as u32)
        .map(|c| ds.chunk(c).unwrap().file_size)
        .collect();
    let quota = sizes.iter().sum::<u64>() / 3;
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (ds, root) = (&ds, &root);
            s.spawn(move || {
                // Each thread has its own handle (its own lock file description), like a process.
                let cache = LocalTier::open(root, id, quota, TierPolicy::Lru).unwrap();
                for k in 0..3 * ds.chunk_count() as u32 {
                    let c = (k * 7 + t * 3) % ds.chunk_count() as u32;
                    let ce = ds.chunk(c).unwrap();
                    cache.admit(&ce, &chunk_bytes(ds, c), 1.0).unwrap();
                    let st = cache.stats().unwrap();
                    assert!(st.bytes <= quota, "quota exceeded: {} > {quota}", st.bytes);
                }
            });
        }
    });
    let cache = LocalTier::open(&root, id, quota, TierPolicy::Lru).unwrap();
    let st = cache.stats().unwrap();
    assert!(st.bytes <= quota && st.entries > 0, "{st:?}");
    // On disk: only complete chunk files (no temporaries left), all within the quota.
    let dir = root.join(id.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let mut on_disk = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.contains("tmp"), "temporary left behind: {name}");
        if name.ends_with(".gchunk") {
            on_disk += e.metadata().unwrap().len();
        }
    }
    assert_eq!(on_disk, st.bytes);
    // Every resident copy is served, byte-identical to the source chunk.
    for c in 0..ds.chunk_count() as u32 {
        if let Some(p) = cache.lookup(&ds.chunk(c).unwrap()).unwrap() {
            assert_eq!(std::fs::read(p).unwrap(), chunk_bytes(&ds, c));
        }
    }
}

#[test]
fn static_fills_then_declines_and_importance_keeps_the_best() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let size = |c: u32| ds.chunk(c).unwrap().file_size;
    // Room for chunks 0, 1 and 2 and half of any other.
    let quota = size(0) + size(1) + size(2) + (3..6).map(size).min().unwrap() / 2;
    let st = LocalTier::open(&tmp.path().join("s"), id, quota, TierPolicy::Static).unwrap();
    let admitted: Vec<bool> = (0..6)
        .map(|c| {
            st.admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0)
                .unwrap()
        })
        .collect();
    assert_eq!(admitted.iter().filter(|&&a| a).count(), 3, "{admitted:?}");
    assert!(
        admitted[0] && admitted[1] && admitted[2],
        "static never evicts: the first ones stay"
    );
    let imp = LocalTier::open(&tmp.path().join("i"), id, quota, TierPolicy::Importance).unwrap();
    for c in 0..3 {
        assert!(imp
            .admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0 + c as f64)
            .unwrap());
    }
    // Not better than the weakest resident by 10 %: declined. Much better: replaces it.
    assert!(!imp
        .admit(&ds.chunk(3).unwrap(), &chunk_bytes(&ds, 3), 1.05)
        .unwrap());
    assert!(imp
        .admit(&ds.chunk(4).unwrap(), &chunk_bytes(&ds, 4), 10.0)
        .unwrap());
    assert!(
        imp.lookup(&ds.chunk(0).unwrap()).unwrap().is_none(),
        "the weakest was evicted"
    );
    assert!(imp.lookup(&ds.chunk(4).unwrap()).unwrap().is_some());
    // Bytes that are not the chunk the snapshot lists are an error naming it, never a copy.
    let mut bad = chunk_bytes(&ds, 5);
    bad[100] ^= 1;
    let e = imp.admit(&ds.chunk(5).unwrap(), &bad, 100.0).unwrap_err();
    assert!(e.to_string().contains("chunk 5"), "{e}");
    assert!(imp.lookup(&ds.chunk(5).unwrap()).unwrap().is_none());
}

#[test]
fn a_tier_opened_with_a_smaller_quota_shrinks_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let root = tmp.path().join("cache");
    let big = LocalTier::open(&root, id, u64::MAX, TierPolicy::Static).unwrap();
    for c in 0..ds.chunk_count() as u32 {
        assert!(big
            .admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0)
            .unwrap());
    }
    let held = big.used().unwrap();
    drop(big);
    let small = LocalTier::open(&root, id, held / 3, TierPolicy::Static).unwrap();
    assert!(small.retain_current(ds.snapshot().chunks()).unwrap() >= held - held / 3);
    assert!(small.used().unwrap() <= held / 3);
    // Within its quota and every copy current: nothing to do.
    assert_eq!(small.retain_current(ds.snapshot().chunks()).unwrap(), 0);
}

#[test]
fn damaged_or_foreign_copies_are_misses_and_the_tier_survives_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let other = dataset(tmp.path(), "other");
    let id = ds.snapshot().dataset_id();
    let root = tmp.path().join("cache");
    let cache = LocalTier::open(&root, id, u64::MAX, TierPolicy::Lru).unwrap();
    for c in 0..3 {
        assert!(cache
            .admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0)
            .unwrap());
    }
    drop(cache);
    // Restart: the content list persists.
    let cache = LocalTier::open(&root, id, u64::MAX, TierPolicy::Lru).unwrap();
    assert_eq!(cache.stats().unwrap().entries, 3);
    let dir = cache.stats().unwrap().dir;
    // Truncated copy: a miss, and removed.
    let copy = |c: u32| dir.join(granary::copy_file_name(c, &ds.chunk(c).unwrap().digest));
    let p1 = copy(1);
    let b = std::fs::read(&p1).unwrap();
    std::fs::write(&p1, &b[..b.len() - 10]).unwrap();
    assert!(cache.lookup(&ds.chunk(1).unwrap()).unwrap().is_none());
    assert!(!p1.exists());
    // Another dataset's chunk of the same size under the same name: a miss.
    let p2 = copy(2);
    let foreign = chunk_bytes(&other, 2);
    assert_eq!(foreign.len() as u64, ds.chunk(2).unwrap().file_size);
    std::fs::write(&p2, &foreign).unwrap();
    assert!(cache.lookup(&ds.chunk(2).unwrap()).unwrap().is_none());
    // A damaged content list is rebuilt from the files present; a copy named by its id alone
    // (as earlier versions named them: no digest says which bytes it holds) is removed.
    let unkeyed = dir.join(granary_format::chunk_file_name(3));
    std::fs::write(&unkeyed, chunk_bytes(&ds, 3)).unwrap();
    std::fs::write(dir.join("index"), b"garbage").unwrap();
    let cache = LocalTier::open(&root, id, u64::MAX, TierPolicy::Lru).unwrap();
    assert_eq!(cache.stats().unwrap().entries, 1);
    assert!(cache.lookup(&ds.chunk(0).unwrap()).unwrap().is_some());
    assert!(!unkeyed.exists());
    // Chunk 0 of another digest (another generation's chunk 0 with other bytes): a miss,
    // whatever its size and CRC-32, and the copy of this digest stays.
    let mut later = ds.chunk(0).unwrap();
    later.digest[0] ^= 1;
    assert!(cache.lookup(&later).unwrap().is_none());
    assert!(cache.lookup(&ds.chunk(0).unwrap()).unwrap().is_some());
    cache.clear().unwrap();
    assert_eq!(cache.stats().unwrap().entries, 0);
}

#[test]
fn epochs_read_through_the_tier_and_damaged_copies_are_refetched() {
    use granary::{PlanOptions, Shard, StreamOptions};
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let total: u64 = (0..ds.chunk_count() as u32)
        .map(|c| ds.chunk(c).unwrap().file_size)
        .sum();
    let cache = Arc::new(
        LocalTier::open(&tmp.path().join("cache"), id, total / 2, TierPolicy::Static).unwrap(),
    );
    let io = StreamOptions {
        tier: Some(cache.clone()),
        ..StreamOptions::default()
    };
    let plan = PlanOptions {
        window_chunks: 2,
        ..PlanOptions::default()
    };
    let expected: Vec<Vec<u8>> = (0..ds.len()).map(|i| ds.read(i).unwrap()).collect();
    let mut hits = Vec::new();
    let resident = || cache.stats().unwrap().bytes as f64 / total as f64;
    let mut resident_before = 0.0;
    for epoch in 0..4 {
        resident_before = resident();
        let mut st = ds
            .stream_epoch(&plan, epoch, Shard::WHOLE, None, &io)
            .unwrap();
        let mut n = 0;
        for s in st.by_ref() {
            let s = s.unwrap();
            assert_eq!(
                s.data(),
                &expected[s.id as usize][..],
                "epoch {epoch} sample {}",
                s.id
            );
            n += 1;
        }
        assert_eq!(n, ds.len());
        hits.push(hits_of(&st));
    }
    assert_eq!(
        hits[0].samples_from_tier, 0,
        "the first epoch fills the tier"
    );
    let resident_after = resident();
    assert!(
        resident_after > 0.3 && resident_after <= 0.5,
        "{resident_after}"
    );
    let h = hits[3];
    let ratio = h.bytes_from_tier as f64 / (h.bytes_from_tier + h.bytes_from_origin) as f64;
    // Static caching under uniform epochs: the hit ratio is the resident fraction (admission
    // is asynchronous, so the tier may still grow during the epoch).
    assert!(
        ratio > resident_before - 0.05 && ratio < resident_after + 0.05,
        "hit ratio {ratio} vs resident {resident_before}..{resident_after}: {h:?}"
    );

    // Damage every resident copy: the epoch still delivers the right bytes, from the source.
    let dir = cache.stats().unwrap().dir;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".gchunk") {
            let mut b = std::fs::read(e.path()).unwrap();
            b[70] ^= 0xff;
            std::fs::write(e.path(), &b).unwrap();
        }
    }
    let mut st = ds.stream_epoch(&plan, 9, Shard::WHOLE, None, &io).unwrap();
    for s in st.by_ref() {
        let s = s.unwrap();
        assert_eq!(s.data(), &expected[s.id as usize][..]);
    }
    assert_eq!(
        hits_of(&st).samples_from_tier,
        0,
        "damaged copies are never served"
    );
}

/// Admission used to be a one-slot mailbox: while a chunk was being written, newer offers
/// replaced each other, so a tier in front of a fast source filled only partly in the first
/// epoch (48 % of epoch 2 from the tier in front of S3). An offer the tier has room for now
/// waits for the admission thread, so a tier that can hold the dataset holds all of it after
/// one epoch, however small the stream's budget (and so its queue of offers) is.
#[test]
fn a_tier_that_can_hold_the_dataset_holds_all_of_it_after_one_epoch() {
    use granary::{PlanOptions, Shard, StreamOptions};
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    for (policy, run) in [(TierPolicy::Static, "s"), (TierPolicy::Lru, "l")] {
        let cache = Arc::new(LocalTier::open(&tmp.path().join(run), id, u64::MAX, policy).unwrap());
        let io = StreamOptions {
            tier: Some(cache.clone()),
            // A queue of offers smaller than one chunk: every offer finds admission busy.
            memory: 16 << 10,
            ..StreamOptions::default()
        };
        let plan = PlanOptions {
            window_chunks: 1,
            ..PlanOptions::default()
        };
        let mut hits = Vec::new();
        for epoch in 0..2 {
            let mut st = ds
                .stream_epoch(&plan, epoch, Shard::WHOLE, None, &io)
                .unwrap();
            let mut n = 0u64;
            for s in st.by_ref() {
                s.unwrap();
                n += 1;
            }
            assert_eq!(n, ds.len());
            hits.push(hits_of(&st));
        }
        assert_eq!(
            cache.stats().unwrap().entries,
            ds.chunk_count() as u64,
            "{policy:?}: every chunk admitted in the first epoch ({:?})",
            hits[0]
        );
        assert_eq!(hits[0].admissions_skipped, 0, "{policy:?}: {:?}", hits[0]);
        assert_eq!(
            hits[1].samples_from_tier,
            ds.len(),
            "{policy:?}: the second epoch entirely from the tier: {:?}",
            hits[1]
        );
    }
}

/// Scores that make every fifth sample far more important than the rest.
fn skewed_scores(n: u64) -> granary::ImportanceScores {
    let mut s = granary::ImportanceScores::new(n, 0.8);
    let w: Vec<(u64, f32)> = (0..n)
        .map(|id| (id, if id % 5 == 0 { 100.0 } else { 1.0 }))
        .collect();
    s.apply(&w);
    s
}

/// Streams `plan` and checks every delivered sample against `expected`; returns the hits.
fn stream_checked(
    ds: &Arc<Dataset>,
    plan: granary::EpochPlan,
    io: &granary::StreamOptions,
    expected: &[Vec<u8>],
) -> Hits {
    let n = plan.samples.len();
    let mut st =
        granary::EpochStream::new(ds.clone(), plan, granary::ShuffleMode::Chunkwise, io).unwrap();
    let mut got = 0;
    for s in st.by_ref() {
        let s = s.unwrap();
        assert_eq!(s.data(), &expected[s.id as usize][..], "sample {}", s.id);
        got += 1;
    }
    assert_eq!(got, n);
    hits_of(&st)
}

#[test]
fn hot_chunks_hold_the_important_samples_and_beat_whole_chunks() {
    use granary::{EpochPlan, PlanOptions, Sampling, Shard, StreamOptions};
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let n = ds.len();
    let total: u64 = (0..ds.chunk_count() as u32)
        .map(|c| ds.chunk(c).unwrap().file_size)
        .sum();
    let quota = total * 2 / 5;
    let scores = Arc::new(skewed_scores(n));
    let expected: Vec<Vec<u8>> = (0..n).map(|i| ds.read(i).unwrap()).collect();
    let plan = PlanOptions {
        window_chunks: 2,
        ..PlanOptions::default()
    };
    let shape = ds.shape().unwrap();
    let mut second_epoch = Vec::new();
    for policy in [TierPolicy::Static, TierPolicy::Importance] {
        let cache = Arc::new(
            LocalTier::open(&tmp.path().join(format!("{policy:?}")), id, quota, policy).unwrap(),
        );
        // Records here are tiny: read around hot ones however small the gap.
        let io = StreamOptions {
            tier: Some(cache.clone()),
            scores: Some(scores.clone()),
            range_gap: 0,
            ..StreamOptions::default()
        };
        // Epoch 0 (uniform) fills the tier.
        let p0 = EpochPlan::build(&shape, &plan, 0, Shard::WHOLE, None).unwrap();
        stream_checked(&ds, p0, &io, &expected);
        let st = cache.stats().unwrap();
        assert!(st.bytes <= quota, "{st:?}");
        let hot = cache.hot_map(ds.snapshot().chunks());
        if policy == TierPolicy::Importance {
            // Every important sample was re-packed, from many source chunks.
            for s in (0..n).filter(|s| s % 5 == 0) {
                let mut hs: Vec<u64> = hot.by_sample.keys().copied().collect();
                hs.sort();
                assert!(
                    hot.by_sample.contains_key(&s),
                    "sample {s} not hot: {st:?} {hs:?} {:?} {}",
                    ds.sample(s).unwrap().entry,
                    scores.score(s)
                );
            }
            assert_eq!(st.hot_samples, hot.by_sample.len() as u64);
            // Hot chunks are chunk files of the dataset's format, records verbatim.
            for h in hot.chunks.values() {
                let p = cache.hot_path(h).unwrap();
                let b = std::fs::read(&p).unwrap();
                assert_eq!(crc32fast::hash(&b), h.file_crc);
                granary_format::check_chunk(&b, &id, h.id).unwrap();
            }
        } else {
            assert!(
                hot.by_sample.is_empty(),
                "only the importance policy re-packs"
            );
        }
        // Epoch 1: importance sampling that favours what the tier holds.
        let in_tier = |s: u64| {
            hot.by_sample.contains_key(&s)
                || cache
                    .lookup(&ds.chunk(shape.chunk_of(s)).unwrap())
                    .unwrap()
                    .is_some()
        };
        let sm = Sampling {
            scores: &scores,
            alpha: 0.9,
            cached: Some(&in_tier),
            cache_boost: 4.0,
        };
        let p1 = EpochPlan::build_sampled(&shape, &plan, 1, Shard::WHOLE, None, Some(&sm)).unwrap();
        second_epoch.push(stream_checked(&ds, p1, &io, &expected));
        assert!(cache.stats().unwrap().bytes <= quota);
    }
    let ratio = |a: u64, b: u64| a as f64 / (a + b) as f64;
    let samples = |h: &Hits| ratio(h.samples_from_tier, h.samples_from_origin);
    let bytes = |h: &Hits| ratio(h.bytes_from_tier, h.bytes_from_origin);
    let (st, imp) = (&second_epoch[0], &second_epoch[1]);
    // Whole chunks carry the unimportant samples along: static reads most bytes from the
    // source even where the sampler favours its chunks.
    assert!(
        samples(imp) > 0.7 && samples(imp) > samples(st) && bytes(imp) > 1.5 * bytes(st),
        "importance {imp:?} vs static {st:?}"
    );
    assert!(
        imp.bytes_from_origin < st.bytes_from_origin,
        "hot chunks must save source reads: {imp:?} vs {st:?}"
    );
}

#[test]
fn damaged_hot_chunks_are_refetched_never_served() {
    use granary::{EpochPlan, PlanOptions, Shard, StreamOptions};
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let n = ds.len();
    let cache = Arc::new(
        LocalTier::open(
            &tmp.path().join("c"),
            ds.snapshot().dataset_id(),
            1 << 20,
            TierPolicy::Importance,
        )
        .unwrap(),
    );
    let io = StreamOptions {
        tier: Some(cache.clone()),
        scores: Some(Arc::new(skewed_scores(n))),
        range_gap: 0,
        ..StreamOptions::default()
    };
    let expected: Vec<Vec<u8>> = (0..n).map(|i| ds.read(i).unwrap()).collect();
    let plan = PlanOptions {
        window_chunks: 2,
        ..PlanOptions::default()
    };
    let shape = ds.shape().unwrap();
    let p = |e| EpochPlan::build(&shape, &plan, e, Shard::WHOLE, None).unwrap();
    stream_checked(&ds, p(0), &io, &expected);
    let hot = cache.hot_map(ds.snapshot().chunks());
    assert!(!hot.chunks.is_empty());
    // A plan of important samples only, so that they are served from the hot chunks.
    let mut only_hot = p(1);
    only_hot.samples.retain(|s| hot.by_sample.contains_key(s));
    let len = only_hot.samples.len();
    only_hot.windows = vec![granary::plan::Window {
        range: 0..len,
        chunks: Vec::new(),
    }];
    let h = stream_checked(&ds, only_hot.clone(), &io, &expected);
    assert_eq!(h.samples_from_tier, len as u64, "{h:?}");
    // Flip one byte inside a record of every hot chunk: the samples come from the source,
    // with the right bytes, and the damaged hot chunks are gone.
    for hc in hot.chunks.values() {
        let path = cache.hot_path(hc).unwrap();
        let mut b = std::fs::read(&path).unwrap();
        b[hc.samples[0].1 as usize] ^= 0x55;
        std::fs::write(&path, &b).unwrap();
    }
    let h = stream_checked(&ds, only_hot.clone(), &io, &expected);
    assert!(h.samples_from_origin > 0, "{h:?}");
    for hc in hot.chunks.values() {
        assert!(
            cache.hot_path(hc).is_none(),
            "damaged hot chunk {} kept",
            hc.id
        );
    }
    // A truncated hot chunk is a miss too.
    stream_checked(&ds, p(2), &io, &expected);
    let hot = cache.hot_map(ds.snapshot().chunks());
    let hc = hot.chunks.values().next().expect("re-harvested");
    let path = cache.hot_path(hc).unwrap();
    let b = std::fs::read(&path).unwrap();
    std::fs::write(&path, &b[..b.len() / 2]).unwrap();
    stream_checked(&ds, only_hot, &io, &expected);
}

#[test]
fn shared_scores_add_up_across_handles_and_persist() {
    use granary::SharedScores;
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tier/scores");
    let long = Duration::from_secs(3600);
    // Two handles, as two processes on the node: each reports its own samples.
    let a = SharedScores::open(&path, 10, 0.5, long).unwrap();
    let b = SharedScores::open(&path, 10, 0.5, long).unwrap();
    a.report(&[1, 2], &[5.0, 1.0]).unwrap();
    b.report(&[7, 8], &[0.5, 9.0]).unwrap();
    assert!(a.report(&[10], &[1.0]).is_err(), "id out of range");
    assert!(a.report(&[1], &[f32::INFINITY]).is_err());
    assert!(a.report(&[1, 2], &[1.0]).is_err());
    a.flush().unwrap();
    b.flush().unwrap();
    a.flush().unwrap();
    let t = a.snapshot();
    assert!((t.score(1) - 12f64.ln()).abs() < 1e-6);
    assert!((t.score(2) - 11f64.ln()).abs() < 1e-6);
    assert!(
        (t.score(8) - 12f64.ln()).abs() < 1e-6,
        "b's reports reach a"
    );
    drop((a, b));
    // Restart: the table persists; the background merge runs on its own.
    let c = SharedScores::open(&path, 10, 0.5, Duration::from_millis(20)).unwrap();
    assert!((c.snapshot().score(7) - 11f64.ln()).abs() < 1e-6);
    c.report(&[3], &[1.0]).unwrap();
    let t0 = std::time::Instant::now();
    while c.snapshot().score(3) != 11f64.ln() as f32 as f64 {
        assert!(t0.elapsed() < Duration::from_secs(20), "never merged");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(c);
    // A damaged table is replaced by a fresh one.
    std::fs::write(&path, b"garbage").unwrap();
    let d = SharedScores::open(&path, 10, 0.5, long).unwrap();
    assert_eq!(d.snapshot().score(7), d.snapshot().mean());
    d.report(&[4], &[1.0]).unwrap();
    d.flush().unwrap();
    assert!(granary::ImportanceScores::load(&path).is_ok());
}

/// Streams a whole epoch of `ds` through `cache` on another thread; fails instead of hanging
/// if it does not finish within a minute.
fn epoch_within_a_minute(
    ds: &Arc<Dataset>,
    cache: Option<Arc<LocalTier>>,
) -> Result<Vec<(u64, Vec<u8>)>, String> {
    use granary::{PlanOptions, Shard, StreamOptions};
    let (tx, rx) = std::sync::mpsc::channel();
    let ds = ds.clone();
    std::thread::spawn(move || {
        let io = StreamOptions {
            tier: cache,
            ..StreamOptions::default()
        };
        let r: Result<Vec<(u64, Vec<u8>)>, String> = ds
            .stream_epoch(&PlanOptions::default(), 0, Shard::WHOLE, None, &io)
            .map_err(|e| e.to_string())
            .and_then(|st| {
                st.map(|s| {
                    s.map(|s| (s.id, s.data().to_vec()))
                        .map_err(|e| e.to_string())
                })
                .collect()
            });
        let _ = tx.send(r);
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .map_err(|_| "the epoch hung".to_string())?
}

fn mkfifo(p: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(p)
        .status()
        .unwrap();
    assert!(ok.success(), "mkfifo {}", p.display());
}

#[test]
fn a_fifo_or_directory_under_a_chunk_name_in_the_tier_is_a_miss_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let cache = Arc::new(
        LocalTier::open(&tmp.path().join("cache"), id, u64::MAX, TierPolicy::Lru).unwrap(),
    );
    let dir = cache.dir().to_path_buf();
    mkfifo(&dir.join(granary_format::chunk_file_name(0)));
    std::fs::create_dir_all(dir.join(granary_format::chunk_file_name(1)).join("inside")).unwrap();
    mkfifo(&dir.join(granary::hot_file_name(0)));
    let expected: Vec<(u64, Vec<u8>)> = (0..ds.len()).map(|i| (i, ds.read(i).unwrap())).collect();
    for _ in 0..2 {
        let mut got = epoch_within_a_minute(&ds, Some(cache.clone())).unwrap();
        got.sort();
        assert_eq!(got, expected);
    }
    // The impostors are gone; the tier holds real copies now.
    for name in [
        granary_format::chunk_file_name(0),
        granary_format::chunk_file_name(1),
    ] {
        let m = std::fs::symlink_metadata(dir.join(&name));
        assert!(m.is_err() || m.unwrap().is_file(), "{name}");
    }
    assert!(!dir.join(granary::hot_file_name(0)).exists());

    // In the dataset itself a FIFO instead of a chunk is an error naming it, not a hang.
    let c2 = ds.chunk_path(2);
    std::fs::remove_file(&c2).unwrap();
    mkfifo(&c2);
    let err = epoch_within_a_minute(&ds, None).unwrap_err();
    assert!(
        err.contains("not a regular file") && err.contains("chunk-00000002"),
        "{err}"
    );
    let err = ds
        .read(ds.chunk(2).unwrap().first_sample)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn temp_files_of_killed_writers_are_removed_by_the_next_lock_and_by_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let root = tmp.path().join("cache");
    let quota = 3 * ds.chunk(0).unwrap().file_size;
    let cache = LocalTier::open(&root, id, quota, TierPolicy::Lru).unwrap();
    for c in 0..3 {
        assert!(cache
            .admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0)
            .unwrap());
    }
    let dir = cache.dir().to_path_buf();
    let du = |d: &Path| -> u64 {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    // What `kill -9` leaves behind mid-write: a chunk copy, the index, the hot map, the scores.
    let leftovers = [
        "chunk-00000007.tmp999999",
        "hot-00000003.tmp999998",
        "index.tmp999997",
        "hot.tmp999996",
        "scores.tmp999995",
    ];
    for name in leftovers {
        std::fs::write(dir.join(name), vec![7u8; 2 * quota as usize]).unwrap();
    }
    // A look at the tier (any process taking its lock) removes them...
    let s = cache.stats().unwrap();
    for name in leftovers {
        assert!(!dir.join(name).exists(), "{name} survived");
    }
    assert!(
        du(&dir) <= s.bytes + (64 << 10),
        "{} bytes on disk",
        du(&dir)
    );
    // ...but not a score table's temporary file while its writer holds the score lock.
    let live = dir.join("scores.tmp424242");
    std::fs::write(&live, b"being written").unwrap();
    let held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.scores_path().with_extension("lock"))
        .unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
    cache.stats().unwrap();
    assert!(live.exists());
    drop(held);
    // clear leaves no data behind.
    for name in leftovers {
        std::fs::write(dir.join(name), b"stale").unwrap();
    }
    cache.clear().unwrap();
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !["index", "hot.map", "lock", "scores.lock"].contains(&n.as_str()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn hits_take_no_lock_write_nothing_and_uses_reach_the_lru_order_in_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let root = tmp.path().join("cache");
    let n = ds.chunk_count() as u32;
    assert!(n >= 4, "{n} chunks");
    let sizes: Vec<u64> = (0..n).map(|c| ds.chunk(c).unwrap().file_size).collect();
    // Room for every chunk but one of the largest.
    let quota = sizes.iter().sum::<u64>() - 1;
    let writer = LocalTier::open(&root, id, quota, TierPolicy::Lru).unwrap();
    for c in 0..n - 1 {
        assert!(writer
            .admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0)
            .unwrap());
    }
    let dir = writer.dir().to_path_buf();
    let index = || std::fs::read(dir.join("index")).unwrap();
    let before = index();
    // Another process holds the tier's lock (as while it writes a chunk): hits still answer.
    let holder = std::fs::File::open(dir.join("lock")).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let reader = Arc::new(LocalTier::open(&root, id, quota, TierPolicy::Lru).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let (r2, ds2) = (reader.clone(), ds.clone());
    let t = std::thread::spawn(move || {
        // Chunk 0 is used most recently; fewer uses than a batch.
        let hits = (1..n - 1)
            .chain([0])
            .filter(|&c| r2.lookup(&ds2.chunk(c).unwrap()).unwrap().is_some())
            .count();
        let _ = tx.send(hits);
    });
    let hits = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("a hit waited for the tier's lock");
    assert_eq!(hits, n as usize - 1);
    t.join().unwrap();
    assert!(reader
        .resident_chunks(ds.snapshot().chunks())
        .unwrap()
        .contains(&0));
    drop(holder);
    assert_eq!(index(), before, "a hit rewrote the content list");
    // Dropping the handle writes its uses: chunk 0, used last, survives the eviction that
    // the last chunk's admission needs (chunk 1, used first, goes).
    drop(reader);
    assert_ne!(index(), before, "the uses were never written");
    assert!(writer
        .admit(&ds.chunk(n - 1).unwrap(), &chunk_bytes(&ds, n - 1), 1.0)
        .unwrap());
    let held = writer.resident_chunks(ds.snapshot().chunks()).unwrap();
    assert!(held.contains(&0), "{held:?}");
    assert!(!held.contains(&1), "{held:?}");
    // A full batch of uses is written without dropping the handle.
    let reader = LocalTier::open(&root, id, quota, TierPolicy::Lru).unwrap();
    let before = index();
    for _ in 0..64 {
        reader.lookup(&ds.chunk(0).unwrap()).unwrap().unwrap();
    }
    assert_ne!(index(), before, "a full batch of uses stayed in memory");
}

/// The warnings the library logs (kept for the tests that look for them).
static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Collect;

impl log::Log for Collect {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        LOGGED.lock().unwrap().push(r.args().to_string());
    }
    fn flush(&self) {}
}

fn collect_logs() {
    static C: Collect = Collect;
    if log::set_logger(&C).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// Tier files removed, cut short or damaged by someone else while epochs (chunk-wise with
/// whole-chunk reads, global with record reads, random access) read through the tier: every
/// epoch delivers every sample once with the right bytes, the failed copies read from the
/// store below the tier; each drop is logged with the copy's path; nothing hangs.
#[test]
fn tier_files_removed_cut_short_or_damaged_while_read_fall_back_to_the_source() {
    use granary::{IoMode, PlanOptions, SampleReader, Shard, ShuffleMode, StreamOptions};
    use std::sync::atomic::{AtomicBool, Ordering};
    collect_logs();
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let id = ds.snapshot().dataset_id();
    let cache = Arc::new(
        LocalTier::open(&tmp.path().join("cache"), id, u64::MAX, TierPolicy::Lru).unwrap(),
    );
    let dir = cache.dir().to_path_buf();
    let expected: Vec<Vec<u8>> = (0..ds.len()).map(|i| ds.read(i).unwrap()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // The vandal: refills the tier and cuts, damages or removes its copies, over and over.
    let vandal = {
        let (ds, cache, dir, stop) = (ds.clone(), cache.clone(), dir.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt;
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for c in 0..ds.chunk_count() as u32 {
                    let _ = cache.admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0);
                }
                for e in std::fs::read_dir(&dir).unwrap().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if !name.ends_with(".gchunk") {
                        continue;
                    }
                    k += 1;
                    let f = std::fs::OpenOptions::new().write(true).open(e.path());
                    let _ = match (k % 4, f) {
                        (0, _) => std::fs::remove_file(e.path()),
                        (1, Ok(f)) => f.set_len(k % 300),
                        (2, Ok(f)) => f.write_at(&[0x5a; 16], 200 + k % 2000).map(|_| ()),
                        _ => Ok(()),
                    };
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let mut served = 0u64;
    for epoch in 0..60u64 {
        let mut seen = vec![false; ds.len() as usize];
        if epoch % 4 == 3 {
            // Random access through the stack (what the mount and map-style loaders use).
            let stack = ds
                .stack(granary::Access::positional(), Some(cache.clone()), None)
                .unwrap();
            let r = SampleReader::with_stack(ds.clone(), stack);
            for i in 0..ds.len() {
                let info = ds.sample(i).unwrap();
                let mut out = vec![0u8; info.entry.orig_len as usize];
                r.read_into(&info, &mut out)
                    .unwrap_or_else(|e| panic!("epoch {epoch}, sample {i}: {e}"));
                assert_eq!(out, expected[i as usize], "epoch {epoch}");
                seen[i as usize] = true;
            }
        } else {
            let plan = PlanOptions {
                window_chunks: 2,
                mode: if epoch % 4 == 2 {
                    ShuffleMode::Global
                } else {
                    ShuffleMode::Chunkwise
                },
                ..PlanOptions::default()
            };
            let io = StreamOptions {
                tier: Some(cache.clone()),
                io_mode: if epoch % 4 == 0 {
                    IoMode::Auto
                } else {
                    IoMode::Buffered
                },
                ..StreamOptions::default()
            };
            let st = ds
                .stream_epoch(&plan, epoch, Shard::WHOLE, None, &io)
                .unwrap();
            for s in st {
                let s = s.unwrap_or_else(|e| panic!("epoch {epoch} stopped: {e}"));
                assert_eq!(s.data(), &expected[s.id as usize][..], "epoch {epoch}");
                assert!(!std::mem::replace(&mut seen[s.id as usize], true));
            }
        }
        assert!(seen.iter().all(|&x| x), "epoch {epoch} was short");
        served += seen.len() as u64;
    }
    stop.store(true, Ordering::Relaxed);
    vandal.join().unwrap();
    let logged: Vec<String> = LOGGED
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&*dir.to_string_lossy()))
        .cloned()
        .collect();
    eprintln!(
        "{served} samples served intact; {} tier copies dropped with a warning",
        logged.len()
    );
    assert!(
        logged
            .iter()
            .any(|l| l.contains("tier copy") && l.contains(".gchunk")),
        "no drop of a tier copy was logged with its path"
    );
}

/// A chunk replaced by one of the same size, whole-file CRC-32 and record CRC-32s (a CRC-32
/// collision, made on purpose here): the snapshot rebuilt over it differs only in the chunk's
/// digest. The tier's copy of the old chunk is keyed by the old digest, so it is never served
/// for the new one: the epoch delivers the new bytes. (Keyed by id, size and CRC-32, the old
/// copy passed every check and its bytes were delivered.)
#[test]
fn a_copy_of_other_bytes_with_the_same_crcs_is_never_served() {
    use granary::{PlanOptions, Shard, StreamOptions};
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for i in 0..40u32 {
        let mut rng = granary_format::SplitMix64::new(u64::from(i));
        let bytes: Vec<u8> = (0..3000).map(|_| rng.next_u64() as u8).collect();
        std::fs::create_dir_all(src.join("c")).unwrap();
        std::fs::write(src.join(format!("c/f{i:02}")), bytes).unwrap();
    }
    let out = tmp.path().join("ds");
    let mut o = PackOptions::new(&src, &out);
    o.output.chunk_size = 16 << 10;
    o.output.compress = granary_packer::CompressMode::None;
    pack(&o).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let id = ds.snapshot().dataset_id();
    let cache =
        Arc::new(LocalTier::open(&tmp.path().join("tier"), id, u64::MAX, TierPolicy::Lru).unwrap());
    for c in 0..ds.chunk_count() as u32 {
        assert!(cache
            .admit(&ds.chunk(c).unwrap(), &chunk_bytes(&ds, c), 1.0)
            .unwrap());
    }
    // Sample 0's record, changed in its first byte and made to keep its CRC-32 by four more.
    let s0 = ds.sample(0).unwrap().entry;
    let (c, at, len) = (s0.chunk, s0.offset as usize, s0.stored_len as usize);
    let old_entry = ds.chunk(c).unwrap();
    let mut forged = chunk_bytes(&ds, c);
    let fix = granary_format::testing::crc_preserving_fix(len, 0, 8);
    forged[at] ^= 1;
    for (k, b) in fix.iter().enumerate() {
        forged[at + 8 + k] ^= b;
    }
    assert_eq!(crc32fast::hash(&forged), old_entry.file_crc);
    assert_eq!(crc32fast::hash(&forged[at..at + len]), s0.crc32);
    std::fs::write(ds.chunk_path(c), &forged).unwrap();
    drop(ds);
    granary_packer::reindex(&out, true, &Default::default()).unwrap();
    let ds = Arc::new(Dataset::open(&out).unwrap());
    let new_entry = ds.chunk(c).unwrap();
    assert_eq!(
        (
            new_entry.file_size,
            new_entry.file_crc,
            ds.snapshot().dataset_id()
        ),
        (old_entry.file_size, old_entry.file_crc, id)
    );
    assert_ne!(new_entry.digest, old_entry.digest);
    assert!(
        cache.lookup(&new_entry).unwrap().is_none(),
        "the old bytes' copy was taken"
    );
    assert!(!cache
        .resident_chunks(ds.snapshot().chunks())
        .unwrap()
        .contains(&c));
    let old_copy = cache
        .dir()
        .join(granary::copy_file_name(c, &old_entry.digest));
    assert!(old_copy.is_file());
    let io = StreamOptions {
        tier: Some(cache.clone()),
        ..StreamOptions::default()
    };
    let mut st = ds
        .stream_epoch(&PlanOptions::default(), 0, Shard::WHOLE, None, &io)
        .unwrap();
    let mut n = 0;
    for s in st.by_ref() {
        let s = s.unwrap();
        let want = match s.id {
            0 => forged[at..at + len].to_vec(),
            _ => ds.read(s.id).unwrap(),
        };
        assert_eq!(s.data(), &want[..], "sample {}", s.id);
        n += 1;
    }
    assert_eq!(n, ds.len());
    assert!(
        hits_of(&st).samples_from_tier > 0,
        "the other chunks' copies still serve"
    );
    // The reader removed the copy no reader of this dataset can use.
    assert!(!old_copy.exists(), "a stale copy kept");
}

/// A reader that tolerates a tier score table of another size (Python's loaders: training
/// writes it as it reports) still refuses a score file the user named that does not fit.
#[test]
fn a_named_score_file_must_fit_even_for_a_lenient_reader() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), "ds");
    let file = tmp.path().join("other.scores");
    granary::ImportanceScores::new(ds.len() + 5, 0.8)
        .save(&file)
        .unwrap();
    let options = granary::ReaderOptions {
        scores: Some(file),
        lenient_scores: true,
        sampling: granary::SamplingKind::Importance,
        ..Default::default()
    };
    let setup = options.open(&ds).unwrap().setup().unwrap();
    let e = setup.check(&ds).unwrap_err().to_string();
    assert!(e.contains("the score table has"), "{e}");
}
