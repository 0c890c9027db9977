use std::collections::BTreeMap;

use super::*;
use crate::plan::ShuffleMode;

impl MixPlan {
    /// The samples in delivery order: (source, sample id).
    fn sequence(&self) -> Vec<(usize, u64)> {
        let mut at = vec![0usize; self.parts.len()];
        self.order
            .clone()
            .map(|i| {
                at[i] += 1;
                (i, self.parts[i].samples[at[i] - 1])
            })
            .collect()
    }
}

/// A source of `chunks` chunks of 3 to 9 samples each, taking `take` samples per epoch.
fn source(i: usize, chunks: u32, take: u64, mode: ShuffleMode) -> PlanSource {
    let shape = DatasetShape::from_counts((0..chunks).map(|c| 3 + u64::from(c * 5 + i as u32) % 7));
    let mark = SourceMark {
        dataset: format!("ds{i}"),
        chunks: shape.chunks(),
        samples: shape.samples(),
        take,
        window: 2,
    };
    PlanSource {
        shape: shape.take(take),
        options: PlanOptions {
            mode,
            seed: source_seed(7, i),
            window_chunks: 2,
            ..Default::default()
        },
        mark,
    }
}

fn shards(world: u32, workers: u32) -> impl Iterator<Item = Shard> {
    (0..world * workers).map(move |i| Shard {
        rank: i / workers,
        world_size: world,
        worker: i % workers,
        num_workers: workers,
    })
}

/// Every (source, id) of `epoch` over all shards of (world, workers), counted.
fn epoch_multiset(
    src: &[PlanSource],
    epoch: u64,
    world: u32,
    workers: u32,
) -> BTreeMap<(usize, u64), u32> {
    let mut m = BTreeMap::new();
    for s in shards(world, workers) {
        for x in MixPlan::build(src, epoch, s, None).unwrap().sequence() {
            *m.entry(x).or_insert(0) += 1;
        }
    }
    m
}

fn mixture(mode: ShuffleMode) -> Vec<PlanSource> {
    // Sources of different sizes: one taken in part, one whole, one more than once.
    vec![
        source(0, 40, 150, mode),
        source(1, 12, 0, mode),
        source(2, 5, 70, mode),
    ]
    .into_iter()
    .map(|mut s| {
        if s.mark.take == 0 {
            s.mark.take = s.shape.samples();
            s.shape = s.shape.take(s.mark.take);
        }
        s
    })
    .collect()
}

#[test]
fn weights_apportion_the_epoch_exactly() {
    assert_eq!(
        epoch_counts(
            &[1000, 600, 400],
            &[Share::Weight(0.5), Share::Weight(0.3), Share::Weight(0.2)],
            None
        ),
        Ok(vec![1000, 600, 400])
    );
    let c = epoch_counts(&[10, 10, 10], &[Share::Weight(1.0); 3], Some(100)).unwrap();
    assert_eq!(c.iter().sum::<u64>(), 100);
    assert!(c.iter().all(|&x| x == 33 || x == 34), "{c:?}");
    assert_eq!(
        epoch_counts(&[100, 50], &[Share::Repeat(0.5), Share::Choose(120)], None),
        Ok(vec![50, 120])
    );
}

#[test]
fn bad_shares_are_refused_with_a_reason() {
    let w = |v: f64| Share::Weight(v);
    for (sizes, shares, size, want) in [
        (
            vec![10, 10],
            vec![w(-1.0), w(1.0)],
            None,
            "not a positive number",
        ),
        (
            vec![10, 10],
            vec![w(0.0), w(1.0)],
            None,
            "not a positive number",
        ),
        (
            vec![10, 10],
            vec![w(f64::NAN), w(1.0)],
            None,
            "not a positive number",
        ),
        (vec![10, 10], vec![w(1.0)], None, "1 shares for 2 sources"),
        (
            vec![10, 10],
            vec![w(1.0), Share::Repeat(1.0)],
            None,
            "every source a weight",
        ),
        (
            vec![10],
            vec![Share::Repeat(1.0)],
            Some(5),
            "epoch size goes with weights",
        ),
        (
            vec![10],
            vec![Share::Choose(0)],
            None,
            "not a positive number",
        ),
        (
            vec![0, 10],
            vec![w(1.0), w(1.0)],
            None,
            "source 0 has no samples",
        ),
        (vec![], vec![], None, "at least one source"),
        // Numbers that would size a plan past its bound, or overflow on the way there.
        (
            vec![1000, 1000, 1000],
            vec![w(1e305), w(1.0), w(1.0)],
            Some(100_000_000_000),
            "an epoch size of 100000000000",
        ),
        (
            vec![10],
            vec![Share::Repeat(1e300)],
            None,
            "source 0: repeat=1e300 of 10 samples",
        ),
        (
            vec![10],
            vec![Share::Choose(u64::MAX)],
            None,
            "at most 4294967296 samples",
        ),
        (
            vec![10, 10],
            vec![Share::Choose(1 << 31), Share::Choose((1 << 31) + 1)],
            None,
            "add up to 4294967297",
        ),
        (
            vec![10, 10, 10],
            vec![w(1.0); 3],
            Some(u64::MAX),
            "at most 4294967296",
        ),
        (
            vec![10, 10, 10],
            vec![w(1e308), w(1e308), w(1e-300)],
            None,
            "source 2: weight=1e-300 is too small",
        ),
    ] {
        let e = epoch_counts(&sizes, &shares, size).unwrap_err();
        assert!(e.contains(want), "{e} (wanted {want})");
    }
    for (s, want) in [
        ("weight=x", "not a number"),
        ("choose=1.5", "not a count"),
        ("often=2", "unknown share"),
    ] {
        let e = s.parse::<Share>().unwrap_err();
        assert!(e.contains(want), "{s}: {e}");
    }
    assert_eq!("0.25".parse::<Share>(), Ok(Share::Weight(0.25)));
    // Huge weights are relative: no sum or product of them overflows into nothing.
    let c = epoch_counts(&[1000; 3], &[w(1e305), w(1.0), w(1.0)], None).unwrap();
    assert_eq!(c, vec![3000, 0, 0]);
    let c = epoch_counts(&[1000; 3], &[w(1e308), w(1e308), w(1e307)], None).unwrap();
    assert_eq!(c, vec![1429, 1428, 143]);
    assert_eq!("repeat=2".parse::<Share>(), Ok(Share::Repeat(2.0)));
}

#[test]
fn the_interleave_keeps_every_prefix_in_its_shares() {
    let counts = [50u64, 30, 20, 1, 0];
    let total: u64 = counts.iter().sum();
    let order: Vec<usize> = Interleave::new(&counts).collect();
    assert_eq!(order.len() as u64, total);
    let mut seen = [0u64; 5];
    for (k, &i) in order.iter().enumerate() {
        seen[i] += 1;
        for (s, &c) in counts.iter().enumerate() {
            let want = (k as f64 + 1.0) * c as f64 / total as f64;
            assert!(
                (seen[s] as f64 - want).abs() <= 1.0,
                "after {k}: source {s} {} vs {want}",
                seen[s]
            );
        }
        assert_eq!(
            Interleave::counts_after(&counts, k as u64 + 1),
            seen.to_vec()
        );
    }
    assert_eq!(seen.to_vec(), counts.to_vec());
    // Resumed after k picks, it goes on as it would have.
    let k = 37;
    let rest: Vec<usize> =
        Interleave::resume(&counts, &Interleave::counts_after(&counts, k)).collect();
    assert_eq!(rest, order[k as usize..].to_vec());
}

#[test]
fn an_epoch_takes_each_sources_count_and_ranks_get_equal_shares() {
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        let src = mixture(mode);
        let m = epoch_multiset(&src, 3, 1, 1);
        for (i, s) in src.iter().enumerate() {
            let got: u32 = m.iter().filter(|(k, _)| k.0 == i).map(|(_, c)| c).sum();
            assert_eq!(u64::from(got), s.mark.take, "{mode}: source {i}");
            // Taken in part: each sample at most once; more than its size: each sample the
            // number of whole passes or one more.
            let passes = s.mark.take / s.mark.samples;
            for (_, &c) in m.iter().filter(|(k, _)| k.0 == i) {
                assert!(
                    u64::from(c) == passes || u64::from(c) == passes + 1,
                    "{mode}: {c}"
                );
            }
        }
        // Three ranks of two workers: equal counts per rank and per source, nothing twice
        // that one rank alone would read once.
        let mut per_rank = Vec::new();
        for r in 0..3 {
            let mut n = [0usize; 3];
            for k in 0..2 {
                let s = Shard {
                    rank: r,
                    world_size: 3,
                    worker: k,
                    num_workers: 2,
                };
                for (i, _) in MixPlan::build(&src, 3, s, None).unwrap().sequence() {
                    n[i] += 1;
                }
            }
            per_rank.push(n);
        }
        assert!(
            per_rank.iter().all(|n| *n == per_rank[0]),
            "{mode}: {per_rank:?}"
        );
        let m3 = epoch_multiset(&src, 3, 3, 2);
        assert!(
            m3.iter().all(|(k, c)| m.get(k).is_some_and(|x| x >= c)),
            "{mode}"
        );
        // Source 0 takes 150 of its samples: another part of them in another epoch (in
        // snapshot order, the first ones every epoch).
        let part = |m: &BTreeMap<(usize, u64), u32>| m.keys().filter(|k| k.0 == 0).count();
        let m4 = epoch_multiset(&src, 4, 1, 1);
        let both = m.keys().filter(|k| k.0 == 0 && m4.contains_key(k)).count();
        assert_eq!(both == part(&m), mode == ShuffleMode::Sequential, "{mode}");
        assert_eq!(part(&m), part(&m4));
    }
}

/// What shards of (world, workers) deliver of `epoch` when each stops after `stop(shard)`
/// samples, and what the shards of (world2, workers2) deliver resumed from that state: every
/// (source, id) of the epoch exactly once (as often as the epoch has it), in total.
fn check_resume(
    src: &[PlanSource],
    epoch: u64,
    from: (u32, u32),
    to: (u32, u32),
    stop: impl Fn(usize) -> u64,
) {
    let whole = epoch_multiset(src, epoch, from.0, from.1);
    let mut got = BTreeMap::new();
    let mut consumed = Vec::new();
    for (slot, s) in shards(from.0, from.1).enumerate() {
        let seq = MixPlan::build(src, epoch, s, None).unwrap().sequence();
        let k = (stop(slot) as usize).min(seq.len());
        for x in &seq[..k] {
            *got.entry(*x).or_insert(0) += 1;
        }
        consumed.push(k as u64);
    }
    let st = MixState {
        epoch,
        world_size: from.0,
        num_workers: from.1,
        consumed,
        sources: src.iter().map(|s| s.mark.clone()).collect(),
        column: None,
        then: None,
    };
    let mut lens = Vec::new();
    for s in shards(to.0, to.1) {
        let p = MixPlan::build(src, epoch, s, Some(&st)).unwrap();
        lens.push(p.len());
        for x in p.sequence() {
            *got.entry(x).or_insert(0) += 1;
        }
    }
    // Nothing twice; what is missing is what the equal cut per new rank drops of each
    // source's rest (drop_last): fewer samples than ranks, none when the rest divides.
    for (k, &c) in &got {
        assert!(
            whole.get(k).is_some_and(|&w| w >= c),
            "{from:?} -> {to:?}: {k:?} {c} times"
        );
    }
    for i in 0..src.len() {
        let count = |m: &BTreeMap<(usize, u64), u32>| -> u32 {
            m.iter().filter(|(k, _)| k.0 == i).map(|(_, c)| c).sum()
        };
        let missing = count(&whole) - count(&got);
        assert!(
            missing < to.0,
            "{from:?} -> {to:?}: source {i} lost {missing}"
        );
        if to.0 == 1 {
            assert_eq!(missing, 0, "{from:?} -> {to:?}: source {i}");
        }
    }
    // Equal counts per rank of a redistributed rest (the same configuration goes on where
    // each shard stopped).
    if from == to {
        return;
    }
    let per_rank: Vec<u64> = lens.chunks(to.1 as usize).map(|c| c.iter().sum()).collect();
    assert!(per_rank.iter().all(|&l| l == per_rank[0]), "{per_rank:?}");
}

#[test]
fn a_resumed_mixture_delivers_every_sample_exactly_once() {
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        let src = mixture(mode);
        // Divisible counts so that drop_last drops nothing when the world changes.
        let src: Vec<PlanSource> = src
            .into_iter()
            .map(|mut s| {
                s.mark.take -= s.mark.take % 6;
                s.shape = s.shape.clone().take(s.mark.take);
                s
            })
            .collect();
        for (from, to) in [
            ((2, 1), (3, 1)),
            ((3, 1), (2, 1)),
            ((2, 2), (1, 3)),
            ((2, 2), (3, 2)),
            ((1, 1), (1, 1)),
            ((2, 3), (2, 3)),
        ] {
            for stop in [0u64, 1, 17, 40, 1000] {
                check_resume(&src, 5, from, to, |slot| stop + slot as u64 * 3);
            }
        }
    }
}

#[test]
fn the_same_configuration_resumes_exactly_where_it_stopped() {
    let src = mixture(ShuffleMode::Chunkwise);
    let s = Shard {
        rank: 1,
        world_size: 2,
        worker: 0,
        num_workers: 2,
    };
    let full = MixPlan::build(&src, 2, s, None).unwrap().sequence();
    let mut st = MixState {
        epoch: 2,
        world_size: 2,
        num_workers: 2,
        consumed: vec![5, 9, 0, 3],
        sources: src.iter().map(|s| s.mark.clone()).collect(),
        column: None,
        then: None,
    };
    st.consumed[2] = 23; // this shard's slot: rank 1, worker 0
    let rest = MixPlan::build(&src, 2, s, Some(&st)).unwrap().sequence();
    assert_eq!(rest, full[23..].to_vec());
}

#[test]
fn new_weights_and_new_generations_wait_for_the_next_epoch() {
    let src = mixture(ShuffleMode::Chunkwise);
    let whole = epoch_multiset(&src, 1, 2, 1);
    let st = MixState {
        epoch: 1,
        world_size: 2,
        num_workers: 1,
        consumed: vec![0, 0],
        sources: src.iter().map(|s| s.mark.clone()).collect(),
        column: None,
        then: None,
    };
    // Other weights now, and source 1 gained a generation (three more chunks).
    let mut now = src.clone();
    now[0].shape = now[0].shape.clone().take(60);
    let grown = DatasetShape::from_counts(
        (0..now[1].shape.chunks())
            .map(|c| {
                let r = now[1].shape.chunk_samples(c);
                r.end - r.start
            })
            .chain([4, 4, 4]),
    );
    now[1].shape = grown.take(200);
    now[1].mark.chunks += 3;
    let mut got = BTreeMap::new();
    for s in shards(2, 1) {
        for x in MixPlan::build(&now, 1, s, Some(&st)).unwrap().sequence() {
            *got.entry(x).or_insert(0) += 1;
        }
    }
    assert_eq!(got, whole, "the checkpointed epoch, as it was planned");
    // A state of another mixture is refused.
    let mut other = st.clone();
    other.sources[2].dataset = "elsewhere".into();
    let e = MixPlan::build(&now, 1, Shard::WHOLE, Some(&other)).unwrap_err();
    assert!(e.contains("source 2 was dataset elsewhere"), "{e}");
    let e = MixPlan::build(&now[..2], 1, Shard::WHOLE, Some(&st)).unwrap_err();
    assert!(e.contains("mixture of 3 sources, this one has 2"), "{e}");
    let mut shrunk = src.clone();
    shrunk[1].shape = DatasetShape::from_counts([5, 5]).take(3);
    let e = MixPlan::build(&shrunk, 1, Shard::WHOLE, Some(&st)).unwrap_err();
    assert!(e.contains("had 12 chunks, it has 2 now"), "{e}");
    let mut over = st.clone();
    over.consumed[0] = 10_000;
    let e = MixPlan::build(&src, 1, Shard::WHOLE, Some(&over)).unwrap_err();
    assert!(e.contains("delivered 10000 samples"), "{e}");
}

/// Importance-sampled parts: each source draws its epoch count (not its sample count), and a
/// resume under another world size delivers the rest of the same draws.
#[test]
fn importance_sampled_parts_draw_their_counts_and_resume() {
    let src = mixture(ShuffleMode::Chunkwise);
    let tables: Vec<crate::ImportanceScores> = src
        .iter()
        .map(|s| {
            let n = s.shape.samples();
            let mut t = crate::ImportanceScores::new(n, 0.0);
            let w: Vec<(u64, f32)> = (0..n).map(|i| (i, 1.0 + (i % 5) as f32 * 10.0)).collect();
            t.apply(&w);
            t
        })
        .collect();
    let plan = |i: usize, sh: &DatasetShape, o: &PlanOptions, s: Shard, st: Option<&EpochState>| {
        let sm = crate::Sampling {
            scores: &tables[i],
            alpha: 0.7,
            cached: None,
            cache_boost: 1.0,
        };
        EpochPlan::build_sampled(sh, o, 2, s, st, Some(&sm))
    };
    let run = |world: u32, resume: Option<&MixState>| -> BTreeMap<(usize, u64), u32> {
        let mut m = BTreeMap::new();
        for s in shards(world, 1) {
            let p = MixPlan::build_with(&src, 2, s, resume, &plan).unwrap();
            assert!(p.parts.iter().all(|x| x.weights.len() == x.samples.len()));
            for x in p.sequence() {
                *m.entry(x).or_insert(0) += 1;
            }
        }
        m
    };
    let whole = run(1, None);
    for (i, s) in src.iter().enumerate() {
        let n: u32 = whole.iter().filter(|(k, _)| k.0 == i).map(|(_, c)| c).sum();
        assert_eq!(u64::from(n), s.mark.take, "source {i}");
    }
    // Nothing consumed at 1 rank, all of it read by 1 rank again: the same draws; the
    // high-score samples (i % 5 == 4) drawn more than the low ones.
    let st = MixState {
        epoch: 2,
        world_size: 1,
        num_workers: 1,
        consumed: vec![0],
        sources: src.iter().map(|s| s.mark.clone()).collect(),
        column: None,
        then: None,
    };
    assert_eq!(run(1, Some(&st)), whole);
    // 100 delivered at 1 rank, the rest at 2 ranks: nothing twice, fewer than 2 of each
    // source's draws lost to the equal cut.
    let first = MixPlan::build_with(&src, 2, Shard::WHOLE, None, &plan)
        .unwrap()
        .sequence();
    let mut got = BTreeMap::new();
    for x in &first[..100] {
        *got.entry(*x).or_insert(0) += 1;
    }
    let st = MixState {
        consumed: vec![100],
        ..st
    };
    for (k, c) in run(2, Some(&st)) {
        *got.entry(k).or_insert(0) += c;
    }
    assert!(got
        .iter()
        .all(|(k, c)| whole.get(k).is_some_and(|w| w >= c)));
    for i in 0..src.len() {
        let n = |m: &BTreeMap<(usize, u64), u32>| -> u32 {
            m.iter().filter(|(k, _)| k.0 == i).map(|(_, c)| c).sum()
        };
        assert!(n(&whole) - n(&got) < 2, "source {i}");
    }
    let hi: u32 = whole
        .iter()
        .filter(|(k, _)| k.1 % 5 == 4)
        .map(|(_, c)| c)
        .sum();
    let lo: u32 = whole
        .iter()
        .filter(|(k, _)| k.1 % 5 == 0)
        .map(|(_, c)| c)
        .sum();
    assert!(hi > 3 * lo, "{hi} vs {lo}");
}
