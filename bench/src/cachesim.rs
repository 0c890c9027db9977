//! Trace-driven cache simulation over real epoch plans (`granary bench cache`, part 1).
//!
//! Every epoch reads each item once in a fresh order. Under such access an LRU cache holding a
//! fraction f of the items hits f + (1 - f) ln(1 - f) ≈ f²/2 of the accesses once warm, while a
//! cache filled once and never evicted ("static") hits f — the best any policy can do under
//! uniform sampling. This module replays the plans granary actually reads (sample order for
//! sample-level caching, window chunk order for chunk-level caching) through both policies.

use std::collections::{BTreeMap, HashMap, HashSet};

use granary::{DatasetShape, EpochPlan, PlanOptions, Shard};
use serde::Serialize;

/// Cache replacement policies simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Least recently used.
    Lru,
    /// Admit until full, never evict.
    Static,
}

/// What the cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Single samples (one unit each).
    Sample,
    /// Whole chunks (one unit each), as read by chunk-wise epochs.
    Chunk,
}

/// A cache of `capacity` unit-size items.
struct Cache {
    policy: Policy,
    capacity: usize,
    clock: u64,
    stamp: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
    held: HashSet<u64>,
}

impl Cache {
    fn new(policy: Policy, capacity: usize) -> Self {
        Cache {
            policy,
            capacity,
            clock: 0,
            stamp: HashMap::new(),
            by_stamp: BTreeMap::new(),
            held: HashSet::new(),
        }
    }

    /// Accesses `key`; true on a hit.
    fn access(&mut self, key: u64) -> bool {
        match self.policy {
            Policy::Static => {
                if self.held.contains(&key) {
                    return true;
                }
                if self.held.len() < self.capacity {
                    self.held.insert(key);
                }
                false
            }
            Policy::Lru => {
                self.clock += 1;
                let hit = if let Some(old) = self.stamp.insert(key, self.clock) {
                    self.by_stamp.remove(&old);
                    true
                } else {
                    false
                };
                self.by_stamp.insert(self.clock, key);
                if self.stamp.len() > self.capacity {
                    if let Some((_, victim)) = self.by_stamp.pop_first() {
                        self.stamp.remove(&victim);
                    }
                }
                hit
            }
        }
    }
}

/// The access trace of one epoch: sample ids in delivery order, or chunk ids in window order.
pub fn epoch_trace(shape: &DatasetShape, plan: &PlanOptions, epoch: u64, level: Level) -> Vec<u64> {
    let p = EpochPlan::build(shape, plan, epoch, Shard::WHOLE, None)
        .expect("whole-dataset shard is valid");
    match level {
        Level::Sample => p.samples,
        Level::Chunk => p
            .windows
            .iter()
            .flat_map(|w| w.chunks.iter().map(|&c| c as u64))
            .collect(),
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

/// Replays `epochs` epochs (the first only warms the cache) for each fraction.
pub fn simulate(
    shape: &DatasetShape,
    plan: &PlanOptions,
    epochs: u64,
    fractions: &[f64],
    level: Level,
) -> Vec<SimRow> {
    let traces: Vec<Vec<u64>> = (0..epochs.max(2))
        .map(|e| epoch_trace(shape, plan, e, level))
        .collect();
    let items = match level {
        Level::Sample => shape.samples(),
        Level::Chunk => shape.chunks() as u64,
    };
    fractions
        .iter()
        .map(|&f| {
            let capacity = ((items as f64) * f).round() as usize;
            let ratio = |policy| {
                let mut c = Cache::new(policy, capacity);
                let (mut hits, mut total) = (0u64, 0u64);
                for (e, t) in traces.iter().enumerate() {
                    for &k in t {
                        let hit = c.access(k);
                        if e > 0 {
                            hits += hit as u64;
                            total += 1;
                        }
                    }
                }
                hits as f64 / total.max(1) as f64
            };
            SimRow {
                level,
                fraction: f,
                items,
                capacity: capacity as u64,
                lru: ratio(Policy::Lru),
                lru_theory: lru_theory(f),
                static_: ratio(Policy::Static),
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
            format!("{:?}", r.level).to_lowercase(),
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
    fn theory_values() {
        assert!((lru_theory(0.1) - 0.0052).abs() < 1e-3);
        assert!((lru_theory(0.2) - 0.0215).abs() < 1e-3);
        assert!((lru_theory(0.5) - 0.1534).abs() < 1e-3);
    }
}
