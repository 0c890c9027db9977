//! Property tests of epoch plans: coverage, equal shares, determinism, resume.

use std::collections::HashMap;

use granary::{Continued, DatasetShape, EpochPlan, EpochState, PlanOptions, Shard, ShuffleMode};
use proptest::prelude::*;

/// Worker `worker` of `num_workers` on rank `rank` of `world_size`.
fn shard(rank: u32, world_size: u32, worker: u32, num_workers: u32) -> Shard {
    Shard {
        rank,
        world_size,
        worker,
        num_workers,
    }
}

fn all_shares(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    world: u32,
    workers: u32,
) -> Vec<Vec<EpochPlan>> {
    (0..world)
        .map(|r| {
            (0..workers)
                .map(|k| {
                    let s = shard(r, world, k, workers);
                    EpochPlan::build(shape, o, epoch, s, None).unwrap()
                })
                .collect()
        })
        .collect()
}

fn counts(ids: impl IntoIterator<Item = u64>) -> HashMap<u64, usize> {
    let mut m = HashMap::new();
    for i in ids {
        *m.entry(i).or_default() += 1;
    }
    m
}

fn mode() -> impl Strategy<Value = ShuffleMode> {
    prop_oneof![
        Just(ShuffleMode::Chunkwise),
        Just(ShuffleMode::Global),
        Just(ShuffleMode::Sequential)
    ]
}

fn options() -> impl Strategy<Value = PlanOptions> {
    (
        mode(),
        any::<u64>(),
        1usize..5,
        any::<bool>(),
        prop_oneof![Just(1.0), Just(0.0), 0.0f64..1.0],
    )
        .prop_map(
            |(mode, seed, window_chunks, drop_last, locality)| PlanOptions {
                mode,
                seed,
                window_chunks,
                drop_last,
                locality,
            },
        )
}

fn shape() -> impl Strategy<Value = DatasetShape> {
    proptest::collection::vec(0u64..25, 1..30).prop_map(DatasetShape::from_counts)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn shares_cover_the_epoch_once_with_equal_ranks(shape in shape(), o in options(), world in 1u32..6, workers in 1u32..4, epoch in 0u64..4) {
        let n = shape.samples() as usize;
        let shares = all_shares(&shape, &o, epoch, world, workers);
        let per_rank: Vec<usize> = shares.iter().map(|r| r.iter().map(|p| p.len()).sum()).collect();
        prop_assert!(per_rank.windows(2).all(|w| w[0] == w[1]), "unequal ranks {:?}", per_rank);
        let all = counts(shares.iter().flatten().flat_map(|p| p.samples.iter().copied()));
        let total: usize = per_rank.iter().sum();
        if o.drop_last {
            prop_assert_eq!(total, n / world as usize * world as usize);
            prop_assert!(all.values().all(|&c| c == 1), "a sample repeats");
        } else {
            prop_assert_eq!(total, if n == 0 { 0 } else { n.div_ceil(world as usize) * world as usize });
            prop_assert_eq!(all.len(), n, "every sample delivered");
            prop_assert!(all.values().all(|&c| c <= total.div_ceil(n.max(1))), "padding repeats too much");
        }
        prop_assert!(all.keys().all(|&id| (id as usize) < n));
        for p in shares.iter().flatten() {
            // Windows partition the plan, and list the chunks they need.
            let mut at = 0;
            for w in &p.windows {
                prop_assert_eq!(w.range.start, at);
                at = w.range.end;
                for &s in &p.samples[w.range.clone()] {
                    prop_assert!(w.chunks.contains(&shape.chunk_of(s)));
                }
                if o.mode != ShuffleMode::Global {
                    prop_assert!(w.chunks.len() <= o.window_chunks);
                }
            }
            prop_assert_eq!(at, p.len());
        }
        // Determinism.
        prop_assert_eq!(all_shares(&shape, &o, epoch, world, workers), shares);
    }

    #[test]
    fn resume_with_the_same_configuration_continues_exactly(shape in shape(), o in options(), world in 1u32..4, workers in 1u32..4, seedpos in any::<u64>()) {
        let shares = all_shares(&shape, &o, 1, world, workers);
        let consumed: Vec<u64> = shares.iter().flatten().enumerate().map(|(i, p)| (seedpos.rotate_left(i as u32 * 7)) % (p.len() as u64 + 1)).collect();
        let st = EpochState { epoch: 1, world_size: world, num_workers: workers, consumed: consumed.clone(), column: None, then: None, chunks: None };
        for (i, p) in shares.iter().flatten().enumerate() {
            let s = shard(i as u32 / workers, world, i as u32 % workers, workers);
            let r = EpochPlan::build(&shape, &o, 1, s, Some(&st)).unwrap();
            prop_assert_eq!(&r.samples[..], &p.samples[consumed[i] as usize..]);
        }
    }

    #[test]
    fn resume_with_another_configuration_neither_repeats_nor_skips(shape in shape(), o in options(), world in 1u32..4, workers in 1u32..4, world2 in 1u32..5, workers2 in 1u32..4, seedpos in any::<u64>()) {
        prop_assume!((world, workers) != (world2, workers2));
        let shares = all_shares(&shape, &o, 2, world, workers);
        let consumed: Vec<u64> = shares.iter().flatten().enumerate().map(|(i, p)| (seedpos.rotate_left(i as u32 * 5)) % (p.len() as u64 + 1)).collect();
        let st = EpochState { epoch: 2, world_size: world, num_workers: workers, consumed: consumed.clone(), column: None, then: None, chunks: None };
        let mut seen = counts(shares.iter().flatten().zip(&consumed).flat_map(|(p, &c)| p.samples[..c as usize].iter().copied()));
        let planned = counts(shares.iter().flatten().flat_map(|p| p.samples.iter().copied()));
        let mut after: Vec<usize> = Vec::new();
        for r in 0..world2 {
            let mut rank_total = 0;
            for k in 0..workers2 {
                let s = shard(r, world2, k, workers2);
                let p = EpochPlan::build(&shape, &o, 2, s, Some(&st)).unwrap();
                rank_total += p.len();
                for id in p.samples {
                    *seen.entry(id).or_default() += 1;
                }
            }
            after.push(rank_total);
        }
        prop_assert!(after.windows(2).all(|w| w[0] == w[1]), "unequal ranks after resume {:?}", after);
        let remaining: usize = planned.values().sum::<usize>() - consumed.iter().sum::<u64>() as usize;
        // Every delivery of the old plan happens exactly as often; with drop_last the new
        // equal-count cut may leave out fewer than world2 of the remaining samples, with
        // padding it may repeat fewer than world2.
        for (id, &c) in &planned {
            let got = seen.get(id).copied().unwrap_or(0);
            if o.drop_last {
                prop_assert!(got <= c, "sample {} delivered {} times, planned {}", id, got, c);
            } else {
                prop_assert!(got >= c, "sample {} delivered {} times, planned {}", id, got, c);
            }
        }
        let delivered_after: usize = after.iter().sum();
        prop_assert!(delivered_after.abs_diff(remaining) < world2 as usize, "{} after, {} remaining", delivered_after, remaining);
    }

    /// An epoch resumed under another configuration and checkpointed there goes on exactly
    /// from that checkpoint at that configuration; a third configuration is refused.
    #[test]
    fn a_resumed_epoch_checkpointed_again_goes_on_exactly(shape in shape(), o in options(), world in 1u32..4, workers in 1u32..3, world2 in 1u32..4, workers2 in 1u32..3, seedpos in any::<u64>()) {
        prop_assume!((world, workers) != (world2, workers2));
        let shares = all_shares(&shape, &o, 5, world, workers);
        let consumed: Vec<u64> = shares.iter().flatten().enumerate().map(|(i, p)| (seedpos.rotate_left(i as u32 * 3)) % (p.len() as u64 + 1)).collect();
        let first = EpochState { epoch: 5, world_size: world, num_workers: workers, consumed, column: None, then: None, chunks: None };
        let slots: Vec<Shard> = (0..world2 * workers2).map(|i| shard(i / workers2, world2, i % workers2, workers2)).collect();
        let resumed: Vec<EpochPlan> = slots.iter().map(|&s| EpochPlan::build(&shape, &o, 5, s, Some(&first)).unwrap()).collect();
        let again: Vec<u64> = resumed.iter().enumerate().map(|(i, p)| seedpos.rotate_right(i as u32 * 7) % (p.len() as u64 + 1)).collect();
        let st = EpochState { then: Some(Continued { world_size: world2, num_workers: workers2, consumed: again.clone() }), ..first.clone() };
        for ((s, p), &n) in slots.iter().zip(&resumed).zip(&again) {
            let rest = EpochPlan::build(&shape, &o, 5, *s, Some(&st)).unwrap();
            prop_assert_eq!(&rest.samples[..], &p.samples[n as usize..]);
        }
        let e = EpochPlan::build(&shape, &o, 5, shard(0, world2 + 1, 0, workers2), Some(&st)).unwrap_err();
        prop_assert!(e.contains("a third configuration"), "{}", e);
    }

    /// StatefulDataLoader's way: every worker keeps its own state (its own count, the same on
    /// every rank as ranks run in lockstep) and is restored from it, at any world size with
    /// the same worker count. Together the new workers deliver the rest of the epoch: nothing
    /// twice, and with drop_last fewer than world2 left out per worker column.
    #[test]
    fn each_workers_own_state_resumes_the_epoch_at_another_world_size(shape in shape(), o in options(), world in 1u32..4, workers in 1u32..4, world2 in 1u32..5, seedpos in any::<u64>()) {
        let shares = all_shares(&shape, &o, 3, world, workers);
        // Worker k's count, the same on every rank (lockstep: rank 0's share is as long).
        let per_worker: Vec<u64> = (0..workers as usize).map(|k| seedpos.rotate_left(k as u32 * 11) % (shares[0][k].len() as u64 + 1)).collect();
        let consumed: Vec<u64> = (0..world * workers).map(|i| per_worker[(i % workers) as usize]).collect();
        let mut seen = counts(shares.iter().flatten().zip(&consumed).flat_map(|(p, &c)| p.samples[..(c as usize).min(p.len())].iter().copied()));
        let planned = counts(shares.iter().flatten().flat_map(|p| p.samples.iter().copied()));
        let mut after: Vec<usize> = vec![0; world2 as usize];
        for k in 0..workers {
            // The state worker k saved: its own column alone is known.
            let mut own = vec![0; consumed.len()];
            for r in 0..world {
                own[(r * workers + k) as usize] = per_worker[k as usize];
            }
            let st = EpochState { epoch: 3, world_size: world, num_workers: workers, consumed: own, column: Some(k), then: None, chunks: None };
            for (r, total) in after.iter_mut().enumerate() {
                let p = EpochPlan::build(&shape, &o, 3, shard(r as u32, world2, k, workers), Some(&st)).unwrap();
                *total += p.len();
                for id in p.samples {
                    *seen.entry(id).or_default() += 1;
                }
            }
            // Another worker's index, or another worker count, is refused.
            if workers > 1 {
                prop_assert!(EpochPlan::build(&shape, &o, 3, shard(0, world2, (k + 1) % workers, workers), Some(&st)).is_err());
            }
            prop_assert!(EpochPlan::build(&shape, &o, 3, shard(0, world2, 0, workers + 1), Some(&st)).is_err());
        }
        prop_assert!(after.windows(2).all(|w| w[0] == w[1]), "unequal ranks after resume {:?}", after);
        for (id, &c) in &planned {
            let got = seen.get(id).copied().unwrap_or(0);
            if o.drop_last {
                prop_assert!(got <= c, "sample {} delivered {} times, planned {}", id, got, c);
            } else {
                prop_assert!(got >= c, "sample {} delivered {} times, planned {}", id, got, c);
            }
        }
        let remaining: usize = planned.values().sum::<usize>() - consumed.iter().zip(shares.iter().flatten()).map(|(&c, p)| (c as usize).min(p.len())).sum::<usize>();
        let delivered_after: usize = after.iter().sum();
        prop_assert!(delivered_after.abs_diff(remaining) < (world2 * workers) as usize, "{} after, {} remaining", delivered_after, remaining);
    }
}

#[test]
fn locality_keeps_ranks_on_their_chunks() {
    let shape = DatasetShape::from_counts(vec![10; 400]);
    let share_of_rank = |o: &PlanOptions, epoch: u64| -> Vec<u32> {
        let mut owner = vec![u32::MAX; 4000];
        for r in 0..4 {
            let s = shard(r, 4, 0, 1);
            for id in EpochPlan::build(&shape, o, epoch, s, None).unwrap().samples {
                owner[id as usize] = r;
            }
        }
        owner
    };
    let home = share_of_rank(
        &PlanOptions {
            locality: 0.0,
            ..PlanOptions::default()
        },
        5,
    );
    // Fraction of samples on the same rank in epochs 0 and 1, and on their home rank in epoch 1.
    let stay = |q: f64| {
        let o = PlanOptions {
            locality: q,
            ..PlanOptions::default()
        };
        let (a, b) = (share_of_rank(&o, 0), share_of_rank(&o, 1));
        let same =
            |x: &[u32], y: &[u32]| x.iter().zip(y).filter(|(p, q)| p == q).count() as f64 / 4000.0;
        (same(&a, &b), same(&b, &home))
    };
    assert!(stay(0.0).0 > 0.95, "{:?}", stay(0.0));
    // Q = 0.3: about 30 % of chunks move each epoch, a quarter of them back to their home rank.
    let (between, at_home) = stay(0.3);
    assert!((0.65..0.85).contains(&at_home), "Q=0.3: {at_home} at home");
    assert!(
        (0.5..0.7).contains(&between),
        "Q=0.3: {between} kept between epochs"
    );
    assert!(stay(1.0).0 < 0.4, "{:?}", stay(1.0));
}

#[test]
fn resume_at_every_position_same_and_other_configuration() {
    let shape = DatasetShape::from_counts(vec![7, 3, 0, 9, 5, 6]);
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
        let whole = EpochPlan::build(&shape, &o, 0, Shard::WHOLE, None).unwrap();
        for done in 0..=whole.len() as u64 {
            let st = EpochState {
                epoch: 0,
                world_size: 1,
                num_workers: 1,
                consumed: vec![done],
                column: None,
                then: None,
                chunks: None,
            };
            let same = EpochPlan::build(&shape, &o, 0, Shard::WHOLE, Some(&st)).unwrap();
            assert_eq!(
                same.samples,
                whole.samples[done as usize..],
                "{mode:?} at {done}"
            );
            // Continue on 2 ranks x 2 workers with padding: exactly the rest, each once or
            // (padding) at most once more.
            let o2 = PlanOptions {
                drop_last: false,
                ..o.clone()
            };
            let mut got = counts([]);
            for r in 0..2 {
                for k in 0..2 {
                    let s = shard(r, 2, k, 2);
                    let p = EpochPlan::build(&shape, &o2, 0, s, Some(&st)).unwrap();
                    for id in p.samples {
                        *got.entry(id).or_default() += 1;
                    }
                }
            }
            let rest = counts(whole.samples[done as usize..].iter().copied());
            assert_eq!(
                got.keys().collect::<std::collections::BTreeSet<_>>(),
                rest.keys().collect(),
                "{mode:?} at {done}"
            );
            assert!(got.values().sum::<usize>() - rest.values().sum::<usize>() < 2);
        }
    }
}

#[test]
fn importance_plans_are_deterministic_partitioned_resumable_and_weighted() {
    use granary::{ImportanceScores, Sampling};
    let shape = DatasetShape::from_counts(vec![50; 40]);
    let n = shape.samples();
    let mut scores = ImportanceScores::new(n, 0.5);
    // Samples 0..200 get the largest losses in every batch: the highest scores.
    for b in 0..(n / 100) {
        let ids: Vec<u64> = (0..100).map(|i| (i * (n / 100) + b) % n).collect();
        let losses: Vec<f32> = ids
            .iter()
            .map(|&id| {
                if id < 200 {
                    10.0 + id as f32
                } else {
                    (id % 7) as f32
                }
            })
            .collect();
        scores.report(&ids, &losses).unwrap();
    }
    let cached = |id: u64| id < 100;
    let sm = Sampling {
        scores: &scores,
        alpha: 0.8,
        cached: Some(&cached),
        cache_boost: 4.0,
    };
    // p_i for every sample: (1 - alpha)/N + alpha * mass_i / total mass.
    let mass: Vec<f64> = (0..n).map(|i| sm.mass(i)).collect();
    let total: f64 = mass.iter().sum();
    let probs: Vec<f64> = mass
        .iter()
        .map(|m| 0.2 / n as f64 + 0.8 * m / total)
        .collect();
    assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    let floor = 0.2 / n as f64;
    assert!(
        probs.iter().all(|&p| p >= floor * 0.999_999),
        "every sample keeps the floor"
    );
    let o = PlanOptions::default();
    let build = |s: Shard, r: Option<&EpochState>| {
        EpochPlan::build_sampled(&shape, &o, 4, s, r, Some(&sm)).unwrap()
    };
    let mut all = Vec::new();
    let mut per_rank = Vec::new();
    for r in 0..3 {
        let mut total = 0;
        for k in 0..2 {
            let s = shard(r, 3, k, 2);
            let p = build(s, None);
            assert_eq!(p, build(s, None), "deterministic");
            assert_eq!(p.weights.len(), p.samples.len());
            for (&id, &w) in p.samples.iter().zip(&p.weights) {
                assert!((w as f64 - 1.0 / (n as f64 * probs[id as usize])).abs() < 1e-3);
            }
            // Resume with the same configuration continues exactly, weights included.
            let consumed: Vec<u64> = vec![17; 6];
            let st = EpochState {
                epoch: 4,
                world_size: 3,
                num_workers: 2,
                consumed,
                column: None,
                then: None,
                chunks: None,
            };
            let rest = build(s, Some(&st));
            assert_eq!(rest.samples, p.samples[17..]);
            assert_eq!(rest.weights, p.weights[17..]);
            total += p.len();
            all.extend(p.samples);
        }
        per_rank.push(total);
    }
    assert!(per_rank.windows(2).all(|w| w[0] == w[1]), "{per_rank:?}");
    // The cached, high-score samples are drawn far more often than the rest.
    let c = counts(all.iter().copied());
    let hot: usize = (0..100).map(|i| c.get(&i).copied().unwrap_or(0)).sum();
    let cold: usize = (1000..1100).map(|i| c.get(&i).copied().unwrap_or(0)).sum();
    assert!(hot > 3 * cold, "hot {hot} vs cold {cold}");
    let bad = Sampling {
        scores: &scores,
        alpha: 1.0,
        cached: None,
        cache_boost: 1.0,
    };
    assert!(EpochPlan::build_sampled(&shape, &o, 0, Shard::WHOLE, None, Some(&bad)).is_err());
}
