use super::*;

/// The rank share taken from the chunk runs equals the cut of the full sequence, for
/// shapes with empty chunks, padding and dropping, every mode that reads whole chunks, and
/// locality below 1.
#[test]
fn rank_share_equals_cutting_the_whole_sequence() {
    let mut r = SplitMix64::new(7);
    for case in 0..300 {
        let chunks = 1 + r.below(40);
        let counts: Vec<u64> = (0..chunks)
            .map(|_| if r.below(5) == 0 { 0 } else { r.below(30) })
            .collect();
        let shape = DatasetShape::from_counts(counts);
        let world = 1 + r.below(9) as u32;
        let o = PlanOptions {
            mode: if case % 3 == 0 {
                ShuffleMode::Sequential
            } else {
                ShuffleMode::Chunkwise
            },
            seed: case,
            drop_last: case % 2 == 0,
            locality: if case % 4 == 1 { 0.3 } else { 1.0 },
            ..PlanOptions::default()
        };
        for rank in 0..world {
            let seq = global_sequence(&shape, &o, 3, world);
            let want = cut_rank(&seq, world, rank, o.drop_last);
            let mut runs = chunk_runs(&shape, &o, 3, world, None);
            assert_eq!(
                runs.at(rank_positions(shape.samples(), world, rank, o.drop_last)),
                want,
                "case {case} rank {rank}/{world}"
            );
        }
    }
}

/// The keyed permutation is a bijection on 0..n for every n (cycle-walking included),
/// depends on its key, and is not close to the identity.
#[test]
fn keyed_permutation_is_a_keyed_bijection() {
    for n in (0..70).chain([255, 256, 257, 1000, 4095, 4097, 65_537]) {
        let p = KeyedPermutation::new(n, &[1, 2]);
        let mut img: Vec<u64> = (0..n).map(|i| p.at(i)).collect();
        let other: Vec<u64> = {
            let q = KeyedPermutation::new(n, &[1, 3]);
            (0..n).map(|i| q.at(i)).collect()
        };
        if n >= 16 {
            let fixed = img
                .iter()
                .enumerate()
                .filter(|(i, &v)| *i as u64 == v)
                .count();
            assert!(
                fixed < (n as usize / 4).max(4),
                "n {n}: {fixed} fixed points"
            );
            assert_ne!(img, other, "n {n}: another key, the same order");
        }
        img.sort_unstable();
        assert!(img.iter().copied().eq(0..n), "n {n}: not a bijection");
    }
    // The largest domains: in range, and distinct on a sample of positions.
    let n = u64::MAX - 5;
    let p = KeyedPermutation::new(n, &[9]);
    let mut seen: Vec<u64> = (0..1000).map(|i| p.at(n - 1 - i * 7919)).collect();
    assert!(seen.iter().all(|&v| v < n));
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 1000);
}

/// The guided `chunk_of` answers as the plain search over chunk starts, for shapes with
/// empty chunks, one chunk, skewed sizes and ids past the end.
#[test]
fn chunk_of_matches_the_plain_search() {
    let mut r = SplitMix64::new(3);
    for case in 0..300 {
        let chunks = 1 + r.below(if case % 3 == 0 { 3 } else { 60 });
        let counts: Vec<u64> = (0..chunks)
            .map(|_| match r.below(6) {
                0 => 0,
                1 => r.below(2000),
                _ => r.below(50),
            })
            .collect();
        let shape = DatasetShape::from_counts(counts);
        let n = shape.samples();
        for id in (0..n + 3).chain([u64::MAX]) {
            let want = (shape.first.partition_point(|&f| f <= id) - 1) as u32;
            assert_eq!(shape.chunk_of(id), want, "case {case} id {id} of {n}");
        }
    }
}

/// A global shard's part, evaluated position by position, equals cutting the whole
/// permuted sequence for its rank and then its worker.
#[test]
fn global_part_equals_cutting_the_whole_sequence() {
    let mut r = SplitMix64::new(11);
    for case in 0..200 {
        let counts: Vec<u64> = (0..1 + r.below(20)).map(|_| r.below(40)).collect();
        let shape = DatasetShape::from_counts(counts);
        let (world, workers) = (1 + r.below(7) as u32, 1 + r.below(4) as u32);
        let o = PlanOptions {
            mode: ShuffleMode::Global,
            seed: case,
            drop_last: case % 2 == 0,
            ..PlanOptions::default()
        };
        let seq = global_sequence(&shape, &o, 5, world);
        for rank in 0..world {
            let share = cut_rank(&seq, world, rank, o.drop_last);
            for worker in 0..workers {
                let shard = Shard {
                    rank,
                    world_size: world,
                    worker,
                    num_workers: workers,
                };
                assert_eq!(
                    global_part(&shape, &o, 5, &shard),
                    split_worker(&share, workers, worker),
                    "case {case} rank {rank}/{world} worker {worker}/{workers}"
                );
            }
        }
    }
}

#[test]
fn a_global_rest_part_equals_cutting_the_regrouped_rest() {
    let mut r = SplitMix64::new(12);
    for case in 0..300 {
        let counts: Vec<u64> = (0..1 + r.below(12)).map(|_| r.below(30)).collect();
        let shape = DatasetShape::from_counts(counts);
        let old = (1 + r.below(6) as u32, 1 + r.below(3) as u32);
        let o = PlanOptions {
            mode: ShuffleMode::Global,
            seed: case,
            drop_last: case % 2 == 0,
            ..PlanOptions::default()
        };
        let consumed = some_consumed(&mut r, &shape, old);
        let rest = regrouped_rest(&shape, &o, 3, old, &consumed, None);
        each_new_shard(&mut r, &rest, o.drop_last, |shard, want| {
            let got = global_rest_part(&shape, &o, 3, shard, old, &consumed);
            assert_eq!(got, want, "case {case} {old:?} -> {shard:?}");
        });
    }
}

/// What each shard of configuration `old` had delivered: all of its part, none, or some.
fn some_consumed(r: &mut SplitMix64, shape: &DatasetShape, old: (u32, u32)) -> Vec<u64> {
    (0..old.0 * old.1)
        .map(|_| match r.below(4) {
            0 => 0,
            1 => u64::MAX,
            _ => r.below(2 + shape.samples() / u64::from(old.0 * old.1).max(1)),
        })
        .collect()
}

/// Calls `check` with every shard of a random new configuration and its cut of `rest`.
fn each_new_shard(
    r: &mut SplitMix64,
    rest: &[u64],
    drop_last: bool,
    mut check: impl FnMut(&Shard, &[u64]),
) {
    let (world, workers) = (1 + r.below(7) as u32, 1 + r.below(4) as u32);
    for rank in 0..world {
        let share = cut_rank(rest, world, rank, drop_last);
        for worker in 0..workers {
            let shard = Shard {
                rank,
                world_size: world,
                worker,
                num_workers: workers,
            };
            check(&shard, split_worker(&share, workers, worker));
        }
    }
}

/// Resuming an epoch read chunk by chunk (chunk-wise, sequential, importance-sampled, or
/// global with importance) at another configuration gives each new shard exactly its cut
/// of everything the old shards had left, regrouped in chunk order.
#[test]
fn a_chunk_rest_part_equals_cutting_the_regrouped_rest() {
    let mut r = SplitMix64::new(21);
    let mass = |i: u64| ((i * 7919) % 11) as f64 + 0.25;
    for case in 0..400 {
        let counts: Vec<u64> = (0..1 + r.below(14))
            .map(|_| if r.below(5) == 0 { 0 } else { r.below(30) })
            .collect();
        let shape = DatasetShape::from_counts(counts);
        let old = (1 + r.below(6) as u32, 1 + r.below(3) as u32);
        let o = PlanOptions {
            mode: match case % 4 {
                0 => ShuffleMode::Sequential,
                3 => ShuffleMode::Global,
                _ => ShuffleMode::Chunkwise,
            },
            seed: case,
            window_chunks: 1 + r.below(4) as usize,
            drop_last: r.below(2) == 0,
            locality: if case % 5 == 1 { 0.4 } else { 1.0 },
        };
        // Global epochs read chunk by chunk only when importance-sampled.
        let sampled = o.mode == ShuffleMode::Global || r.below(3) == 0;
        let key = [case, 3, TAG_IMPORTANCE];
        let imp = sampled.then(|| Importance::new(&mass, 0.7, &shape.first, &key, None));
        let consumed = some_consumed(&mut r, &shape, old);
        let rest = regrouped_rest(&shape, &o, 3, old, &consumed, imp.as_ref());
        each_new_shard(&mut r, &rest, o.drop_last, |shard, want| {
            let got = chunk_rest_part(&shape, &o, 3, shard, old, &consumed, imp.as_ref());
            assert_eq!(got, want, "case {case} {o:?} {old:?} -> {shard:?}");
        });
    }
}

/// A view's shape: plans over its positions hand out the selected ids, each once, chunk by
/// chunk; importance sampling through a view is refused (its scores are the dataset's).
#[test]
fn a_view_shape_plans_its_ids_and_refuses_importance_sampling() {
    let full = DatasetShape::from_counts(vec![5, 0, 7, 4]);
    let ids: std::sync::Arc<[u64]> = vec![0, 3, 6, 7, 11, 15].into();
    let view = full.select(ids.clone());
    assert_eq!(view.samples(), 6);
    assert_eq!(
        (0..4)
            .map(|c| view.chunk_samples(c).end - view.chunk_samples(c).start)
            .collect::<Vec<_>>(),
        vec![2, 0, 3, 1]
    );
    assert_eq!(view.chunk_of_sample(11), Some(2));
    assert_eq!(view.chunk_of_sample(12), None);
    for mode in [
        ShuffleMode::Chunkwise,
        ShuffleMode::Global,
        ShuffleMode::Sequential,
    ] {
        let o = PlanOptions {
            mode,
            window_chunks: 1,
            ..PlanOptions::default()
        };
        let p = EpochPlan::build(&view, &o, 0, Shard::WHOLE, None).unwrap();
        let mut got = p.samples.clone();
        got.sort_unstable();
        assert_eq!(got, ids.to_vec(), "{mode:?}");
        for w in &p.windows {
            let mut cs: Vec<u32> = p.samples[w.range.clone()]
                .iter()
                .map(|&s| view.chunk_of_sample(s).unwrap())
                .collect();
            cs.sort_unstable();
            cs.dedup();
            assert!(cs.iter().all(|c| w.chunks.contains(c)), "{mode:?}");
        }
    }
    let scores = crate::ImportanceScores::new(6, 0.5);
    let sm = Sampling {
        scores: &scores,
        alpha: 0.5,
        cached: None,
        cache_boost: 1.0,
    };
    let o = PlanOptions::default();
    let err = EpochPlan::build_sampled(&view, &o, 0, Shard::WHOLE, None, Some(&sm)).unwrap_err();
    assert!(err.contains("through a view"), "{err}");
}
