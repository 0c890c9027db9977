//! Trace-driven cache simulation over real epoch plans (`granary bench cache`, part 1).
//!
//! Every epoch reads each item once in a fresh order. Under such access an LRU cache holding a
//! fraction f of the items hits f + (1 - f) ln(1 - f) ≈ f²/2 of the accesses once warm, while a
//! cache filled once and never evicted ("static") hits f — the best any policy can do under
//! uniform sampling. This module replays the plans granary actually reads (sample order for
//! sample-level caching, window chunk order for chunk-level caching) through both policies.

use std::collections::{BTreeMap, HashMap, HashSet};

use granary::{DatasetShape, EpochPlan, PlanOptions, Shard};
use granary_format::SplitMix64;
use serde::Serialize;

/// Cache replacement policies simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Least recently used.
    Lru,
    /// Admit until full, never evict.
    Static,
}

granary_format::named_enum! {
    /// What the cache holds.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Level ("cache level") {
        /// Single samples (one unit each).
        Sample = "sample",
        /// Whole chunks (one unit each), as read by chunk-wise epochs.
        Chunk = "chunk",
    }
}

/// One simulated configuration.
#[derive(Clone, Debug, Serialize)]
pub struct SimRow {
    pub level: Level,
    pub fraction: f64,
    pub items: u64,
    pub capacity: u64,
    /// Hit ratio over epochs 1.. (epoch 0 fills the cache).
    pub lru: f64,
    pub lru_theory: f64,
    pub static_: f64,
}

/// LRU's steady-state hit ratio under epoch-random access: f + (1 - f) ln(1 - f).
pub fn lru_theory(f: f64) -> f64 {
    if f >= 1.0 {
        1.0
    } else {
        f + (1.0 - f) * (1.0 - f).ln()
    }
}

/// The hit ratio of a `policy` cache of `capacity` unit-size items replaying `traces` (two
/// epochs at least), over epochs 1.. (epoch 0 fills the cache).
fn hit_ratio(policy: Policy, capacity: usize, traces: &[Vec<u64>]) -> f64 {
    // The items held with their last access (a static cache's never change), and LRU's order
    // of last accesses.
    let (mut stamp, mut by_stamp) = (HashMap::new(), BTreeMap::new());
    let mut clock = 0u64;
    let mut access = |key: u64| {
        let hit = stamp.contains_key(&key);
        match policy {
            Policy::Static => {
                if !hit && stamp.len() < capacity {
                    stamp.insert(key, 0);
                }
            }
            Policy::Lru => {
                clock += 1;
                if let Some(old) = stamp.insert(key, clock) {
                    by_stamp.remove(&old);
                }
                by_stamp.insert(clock, key);
                if stamp.len() > capacity {
                    if let Some((_, victim)) = by_stamp.pop_first() {
                        stamp.remove(&victim);
                    }
                }
            }
        }
        hit
    };
    let (warm, later) = traces.split_first().expect("two epochs at least");
    for &k in warm {
        access(k);
    }
    let hits = later.iter().flatten().filter(|&&k| access(k)).count();
    hits as f64 / later.iter().map(Vec::len).sum::<usize>().max(1) as f64
}

/// Replays `epochs` epochs (the first only warms the cache) for each fraction.
pub fn simulate(
    shape: &DatasetShape,
    plan: &PlanOptions,
    epochs: u64,
    fractions: &[f64],
    level: Level,
) -> Vec<SimRow> {
    // The access trace of each epoch: sample ids in delivery order, or chunk ids in window order.
    let traces: Vec<Vec<u64>> = (0..epochs.max(2))
        .map(|e| {
            let p = EpochPlan::build(shape, plan, e, Shard::WHOLE, None)
                .expect("whole-dataset shard is valid");
            match level {
                Level::Sample => p.samples,
                Level::Chunk => p
                    .windows
                    .iter()
                    .flat_map(|w| &w.chunks)
                    .map(|&c| c as u64)
                    .collect(),
            }
        })
        .collect();
    let items = match level {
        Level::Sample => shape.samples(),
        Level::Chunk => shape.chunks() as u64,
    };
    fractions
        .iter()
        .map(|&f| {
            let capacity = ((items as f64) * f).round() as usize;
            SimRow {
                level,
                fraction: f,
                items,
                capacity: capacity as u64,
                lru: hit_ratio(Policy::Lru, capacity, &traces),
                lru_theory: lru_theory(f),
                static_: hit_ratio(Policy::Static, capacity, &traces),
            }
        })
        .collect()
}

/// The table printed by `granary bench cache`.
pub fn render(rows: &[SimRow]) -> String {
    let mut s = String::from("  level    cache   items  capacity   LRU hits  LRU theory  static hits  static/f  LRU/(f^2/2)\n");
    for r in rows {
        s += &format!(
            "  {:<7} {:>5.0}% {:>7} {:>9} {:>9.2}% {:>10.2}% {:>11.2}% {:>9.3} {:>11.2}\n",
            r.level.name(),
            r.fraction * 100.0,
            r.items,
            r.capacity,
            r.lru * 100.0,
            r.lru_theory * 100.0,
            r.static_ * 100.0,
            r.static_ / r.fraction,
            r.lru / (r.fraction * r.fraction / 2.0)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_collapses_and_static_reaches_f_on_real_plans() {
        let shape = DatasetShape::from_counts(vec![100; 200]);
        let plan = PlanOptions::default();
        let rows = simulate(&shape, &plan, 5, &[0.1, 0.2, 0.5], Level::Sample);
        for r in &rows {
            assert!((r.lru - r.lru_theory).abs() < 0.02, "{r:?}");
            assert!(
                r.static_ >= 0.95 * r.fraction && r.static_ <= 1.05 * r.fraction,
                "{r:?}"
            );
        }
        let chunks = simulate(&shape, &plan, 8, &[0.2, 0.5], Level::Chunk);
        for r in &chunks {
            assert!((r.lru - r.lru_theory).abs() < 0.06, "{r:?}");
            assert!(r.static_ >= 0.9 * r.fraction, "{r:?}");
        }
    }

    #[test]
    fn importance_beats_lru_and_static_in_the_loss_model() {
        let shape = DatasetShape::from_counts(vec![100; 200]);
        let o = LossSimOptions {
            epochs: 5,
            fractions: vec![0.1, 0.2],
            alpha: 0.8,
            cache_boost: 4.0,
            batch: 64,
            seed: 3,
        };
        for r in simulate_losses(&shape, &PlanOptions::default(), &o) {
            assert!(r.importance_over_lru >= 4.5, "{r:?}");
            assert!(r.importance_over_static >= 1.5, "{r:?}");
            assert!(
                r.easiest_seen_per_epoch > 0.2,
                "the floor keeps easy samples in play: {r:?}"
            );
            assert!(r.max_weight > 1.0 && r.max_weight < 5.0, "{r:?}");
        }
        // alpha 0: importance sampling is uniform sampling with replacement; its cache holds
        // the highest scores but gains nothing over f.
        let o = LossSimOptions {
            alpha: 0.0,
            cache_boost: 1.0,
            fractions: vec![0.2],
            ..o
        };
        let r = &simulate_losses(&shape, &PlanOptions::default(), &o)[0];
        assert!((r.importance - 0.2).abs() < 0.03, "{r:?}");
    }

    #[test]
    fn theory_values() {
        assert!((lru_theory(0.1) - 0.0052).abs() < 1e-3);
        assert!((lru_theory(0.2) - 0.0215).abs() < 1e-3);
        assert!((lru_theory(0.5) - 0.1534).abs() < 1e-3);
    }
}

/// Options of the end-to-end simulation with losses (part 2 of `granary bench cache`).
#[derive(Clone, Debug)]
pub struct LossSimOptions {
    pub epochs: u64,
    pub fractions: Vec<f64>,
    /// Importance sampling mix (see [`granary::Sampling`]).
    pub alpha: f64,
    /// How much the sampler favours samples already in the cache.
    pub cache_boost: f64,
    /// Samples per training batch (losses are ranked within a batch).
    pub batch: usize,
    pub seed: u64,
}

/// One fraction of the end-to-end simulation.
#[derive(Clone, Debug, Serialize)]
pub struct LossSimRow {
    pub fraction: f64,
    /// Hit ratios over epochs 1.. (epoch 0 warms the cache and the scores).
    pub lru: f64,
    pub static_: f64,
    pub importance: f64,
    pub importance_over_lru: f64,
    pub importance_over_static: f64,
    /// Samples read from the source per epoch (misses), per policy.
    pub source_reads_lru: f64,
    pub source_reads_static: f64,
    pub source_reads_importance: f64,
    /// Cost of importance sampling: share of the 10 % easiest samples (lowest difficulty) seen
    /// at least once per epoch, and the largest loss weight 1/(N·p) handed out.
    pub easiest_seen_per_epoch: f64,
    pub max_weight: f64,
}

/// The per-sample difficulty model: difficulty d_i is lognormal (mu 0, sigma 1, seeded by the
/// sample id); the k-th time a sample is trained on, its loss is d_i · exp(−0.3 k) · (1 + u/10)
/// with u uniform in [−1, 1]: hard samples keep a high loss for longer, as in real training.
pub fn difficulty(seed: u64, id: u64) -> f64 {
    let mut r = SplitMix64::keyed(&[seed, id, 0x6469_6666]);
    let (u1, u2) = (r.next_f64().max(1e-12), r.next_f64());
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()).exp()
}

/// The loss of sample `id` the `times_seen`-th time it is trained on, in `epoch` (see [`difficulty`]).
pub fn loss(seed: u64, id: u64, times_seen: u32, epoch: u64) -> f32 {
    let u = SplitMix64::keyed(&[seed, id, epoch, 0x6c6f_7373]).next_f64() * 2.0 - 1.0;
    (difficulty(seed, id) * (-0.3 * times_seen as f64).exp() * (1.0 + u / 10.0)) as f32
}

/// The losses of `batch` in `epoch`, each sample trained on once more (`seen` counts the times).
pub(crate) fn batch_losses(seed: u64, batch: &[u64], seen: &mut [u32], epoch: u64) -> Vec<f32> {
    batch
        .iter()
        .map(|&id| {
            seen[id as usize] += 1;
            loss(seed, id, seen[id as usize], epoch)
        })
        .collect()
}

/// The 10 % easiest of `n` samples (lowest [`difficulty`]; one at least).
pub(crate) fn easiest(seed: u64, n: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    v.sort_by(|&a, &b| difficulty(seed, a).total_cmp(&difficulty(seed, b)));
    v.truncate((n / 10).max(1) as usize);
    v
}

/// The share of `easiest` that `samples` holds.
pub(crate) fn share_seen(easiest: &[u64], samples: &[u64]) -> f64 {
    let drawn: HashSet<u64> = samples.iter().copied().collect();
    easiest.iter().filter(|id| drawn.contains(id)).count() as f64 / easiest.len() as f64
}

/// Simulates training with losses from the difficulty model: uniform chunk-wise epochs through
/// LRU and static caches, and importance-sampled epochs (SHADE scores from the reported losses,
/// the cache holding the highest-scoring samples, re-chosen each epoch with at most 10 % of the
/// cache replaced) through the importance-aware cache.
pub fn simulate_losses(
    shape: &DatasetShape,
    plan: &PlanOptions,
    o: &LossSimOptions,
) -> Vec<LossSimRow> {
    use granary::{ImportanceScores, Sampling};
    let n = shape.samples();
    let epochs = o.epochs.max(2);
    let easiest = easiest(o.seed, n);
    // Uniform epochs through LRU and static.
    simulate(shape, plan, epochs, &o.fractions, Level::Sample)
        .into_iter()
        .map(|u| {
            let (f, capacity, lru, static_) = (u.fraction, u.capacity as usize, u.lru, u.static_);
            // Importance: scores from losses, cache = top scores, sampler favours the cache.
            let mut scores = ImportanceScores::new(n, 0.8);
            let mut seen = vec![0u32; n as usize];
            let mut cached: HashSet<u64> = HashSet::new();
            let (mut hits, mut total, mut easiest_seen, mut max_weight) = (0u64, 0u64, 0.0, 0.0f64);
            for e in 0..epochs {
                let snapshot = scores.clone();
                let in_cache = |id: u64| cached.contains(&id);
                let sm = Sampling {
                    scores: &snapshot,
                    alpha: o.alpha,
                    cached: Some(&in_cache),
                    cache_boost: o.cache_boost,
                };
                let sampling = (e > 0).then_some(&sm);
                let p = EpochPlan::build_sampled(shape, plan, e, Shard::WHOLE, None, sampling)
                    .expect("valid plan");
                if e > 0 {
                    for &id in &p.samples {
                        hits += cached.contains(&id) as u64;
                        total += 1;
                    }
                    easiest_seen += share_seen(&easiest, &p.samples);
                    max_weight = p.weights.iter().fold(max_weight, |m, &w| m.max(w as f64));
                }
                for batch in p.samples.chunks(o.batch.max(1)) {
                    let losses = batch_losses(o.seed, batch, &mut seen, e);
                    scores.report(batch, &losses).expect("ids in range");
                }
                // Placement for the next epoch: the highest scores, replacing at most 10 % of
                // the capacity per epoch (hysteresis against churn).
                let mut ranked: Vec<u64> = (0..n).collect();
                ranked.sort_by(|&a, &b| scores.score(b).total_cmp(&scores.score(a)));
                let top = &ranked[..capacity.min(ranked.len())];
                let want: HashSet<u64> = top.iter().copied().collect();
                let budget = if cached.is_empty() {
                    capacity
                } else {
                    (capacity / 10).max(1)
                };
                let new = top.iter().filter(|id| !cached.contains(id));
                let incoming: Vec<u64> = new.take(budget).copied().collect();
                let need_evict = incoming.len().saturating_sub(capacity - cached.len());
                let mut outgoing: Vec<u64> = cached
                    .iter()
                    .filter(|id| !want.contains(id))
                    .copied()
                    .collect();
                outgoing.sort_by(|&a, &b| scores.score(a).total_cmp(&scores.score(b)));
                for id in outgoing.into_iter().take(need_evict) {
                    cached.remove(&id);
                }
                for id in incoming {
                    if cached.len() < capacity {
                        cached.insert(id);
                    }
                }
            }
            let importance = hits as f64 / total.max(1) as f64;
            LossSimRow {
                fraction: f,
                lru,
                static_,
                importance,
                importance_over_lru: importance / lru.max(1e-12),
                importance_over_static: importance / static_.max(1e-12),
                source_reads_lru: (1.0 - lru) * n as f64,
                source_reads_static: (1.0 - static_) * n as f64,
                source_reads_importance: (1.0 - importance) * n as f64,
                easiest_seen_per_epoch: easiest_seen / (epochs - 1) as f64,
                max_weight,
            }
        })
        .collect()
}

/// The table of the end-to-end simulation.
pub fn render_losses(rows: &[LossSimRow]) -> String {
    let mut s = String::from(
        "  cache      LRU   static  importance  imp/LRU  imp/static  source reads/epoch (lru, static, imp)  easiest 10% seen  max weight\n",
    );
    for r in rows {
        s += &format!(
            "  {:>4.0}%  {:>6.2}%  {:>6.2}%  {:>9.2}%  {:>7.1}x  {:>9.2}x  {:>10.0} {:>10.0} {:>10.0}  {:>15.1}%  {:>10.2}\n",
            r.fraction * 100.0,
            r.lru * 100.0,
            r.static_ * 100.0,
            r.importance * 100.0,
            r.importance_over_lru,
            r.importance_over_static,
            r.source_reads_lru,
            r.source_reads_static,
            r.source_reads_importance,
            r.easiest_seen_per_epoch * 100.0,
            r.max_weight
        );
    }
    s
}
