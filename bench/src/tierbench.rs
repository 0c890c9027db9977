//! The local tier measured end to end (`granary bench cache DATASET --tier-dir DIR`): real
//! epochs streamed through a real tier on local storage, with losses from the difficulty model
//! ([`crate::cachesim::loss`]) reported by sample id into the tier's shared score table after
//! every batch, as a training loop would. Per policy it counts the samples and bytes the tier
//! served and the bytes read from the source. The measure is hits and source bytes, not time:
//! on one machine the tier and the "shared" source sit on the same disk.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use granary::{
    Dataset, EpochPlan, EpochStream, LocalTier, MeterReading, PlanOptions, Sampling, Shard,
    SharedScores, TierPolicy,
};
use serde::Serialize;

/// What to run.
#[derive(Clone, Debug)]
pub struct TierBenchOptions {
    pub dataset: PathBuf,
    /// Root of the tiers made here (one sub-directory per row, emptied first).
    pub dir: PathBuf,
    pub fractions: Vec<f64>,
    pub epochs: u64,
    pub plan: PlanOptions,
    pub alpha: f64,
    pub cache_boost: f64,
    /// Samples per training batch (losses are ranked within a batch).
    pub batch: usize,
    pub seed: u64,
}

/// One policy at one cache size; ratios over epochs 1.. (epoch 0 fills the tier and the scores).
#[derive(Clone, Debug, Serialize)]
pub struct TierRow {
    pub fraction: f64,
    pub policy: TierPolicy,
    /// "uniform" or "importance".
    pub sampling: String,
    pub sample_hit_ratio: f64,
    pub byte_hit_ratio: f64,
    /// Bytes read from the source per epoch.
    pub source_bytes_per_epoch: f64,
    /// The tier at the end: bytes, hot chunks and the samples they hold.
    pub tier_bytes: u64,
    pub hot_samples: u64,
    /// The cost of importance sampling: share of the 10 % easiest samples (lowest difficulty)
    /// delivered at least once per epoch, and the largest loss weight 1/(N·p) handed out.
    pub easiest_seen_per_epoch: f64,
    pub max_weight: f64,
    /// Mean time of one `report()` call (a batch of `batch` losses), microseconds.
    pub report_us: f64,
}

/// Runs lru, static (uniform epochs), static with importance sampling, and importance
/// (hot chunks + importance sampling) at every fraction.
pub fn run(o: &TierBenchOptions) -> granary::Result<Vec<TierRow>> {
    let ds = Arc::new(Dataset::open(&o.dataset)?);
    let total = ds.total_chunk_bytes()?;
    let rows = [
        (TierPolicy::Lru, false),
        (TierPolicy::Static, false),
        (TierPolicy::Static, true),
        (TierPolicy::Importance, true),
    ];
    let mut out = Vec::new();
    for &f in &o.fractions {
        for &(policy, importance) in &rows {
            out.push(run_row(o, &ds, f, total, policy, importance)?);
        }
    }
    Ok(out)
}

fn run_row(
    o: &TierBenchOptions,
    ds: &Arc<Dataset>,
    f: f64,
    total: u64,
    policy: TierPolicy,
    importance: bool,
) -> granary::Result<TierRow> {
    let quota = (total as f64 * f) as u64;
    // One tier per row: lru-uniform-10, importance-is-20, ...
    let tag = if importance { "is" } else { "uniform" };
    let root = o
        .dir
        .join(format!("{}-{tag}-{:.0}", policy.name(), f * 100.0));
    let cache = Arc::new(LocalTier::open(
        &root,
        ds.snapshot().dataset_id(),
        quota,
        policy,
    )?);
    cache.clear()?;
    let _ = std::fs::remove_file(cache.scores_path());
    let scores = SharedScores::open(&cache.scores_path(), ds.len(), 0.8, Duration::from_secs(1))?;
    let shape = ds.shape()?;
    let mut seen = vec![0u32; ds.len() as usize];
    // The tier's and origin's readings, summed over the epochs after the first.
    let (mut tier, mut origin) = (MeterReading::default(), MeterReading::default());
    let epochs = o.epochs.max(2) - 1;
    let easiest = crate::cachesim::easiest(o.seed, ds.len());
    let (mut easiest_seen, mut max_weight) = (0.0, 1.0f64);
    let (mut report_time, mut reports) = (Duration::ZERO, 0u64);
    for e in 0..=epochs {
        scores.flush()?;
        let table = scores.snapshot();
        let hot = cache.hot_map(ds.snapshot().chunks());
        let whole = cache.resident_chunks(ds.snapshot().chunks())?;
        let in_tier =
            |id: u64| hot.by_sample.contains_key(&id) || whole.contains(&shape.chunk_of(id));
        let sm = Sampling {
            scores: &table,
            alpha: o.alpha,
            cached: Some(&in_tier),
            cache_boost: o.cache_boost,
        };
        let sampling = (importance && e > 0).then_some(&sm);
        let plan = EpochPlan::build_sampled(&shape, &o.plan, e, Shard::WHOLE, None, sampling)
            .map_err(granary::ReadError::invalid)?;
        if e > 0 {
            easiest_seen += crate::cachesim::share_seen(&easiest, &plan.samples);
            max_weight = plan
                .weights
                .iter()
                .fold(max_weight, |m, &w| m.max(w as f64));
        }
        let io = granary::StreamOptions {
            tier: Some(cache.clone()),
            scores: (policy == TierPolicy::Importance).then(|| table.clone()),
            ..Default::default()
        };
        let mut st = EpochStream::new(ds.clone(), plan, o.plan.mode, &io)?;
        let mut batch = Vec::with_capacity(o.batch);
        loop {
            let s = st.next().transpose()?;
            let end = s.is_none();
            batch.extend(s.map(|s| s.id));
            if batch.len() == o.batch.max(1) || (end && !batch.is_empty()) {
                let losses = crate::cachesim::batch_losses(o.seed, &batch, &mut seen, e);
                let t = std::time::Instant::now();
                scores.report(&batch, &losses)?;
                report_time += t.elapsed();
                reports += 1;
                batch.clear();
            }
            if end {
                break;
            }
        }
        if e > 0 {
            for (name, r) in st.layers() {
                match name {
                    "tier" => tier += r,
                    "origin" => origin += r,
                    _ => {}
                }
            }
        }
    }
    let ratio = |a: u64, b: u64| a as f64 / (a + b).max(1) as f64;
    let st = cache.stats()?;
    Ok(TierRow {
        fraction: f,
        policy,
        sampling: if importance { "importance" } else { "uniform" }.into(),
        sample_hit_ratio: ratio(tier.served_samples, origin.served_samples),
        byte_hit_ratio: ratio(tier.served_bytes, origin.served_bytes),
        source_bytes_per_epoch: origin.served_bytes as f64 / epochs as f64,
        tier_bytes: st.bytes,
        hot_samples: st.hot_samples,
        easiest_seen_per_epoch: easiest_seen / epochs as f64,
        max_weight,
        report_us: report_time.as_secs_f64() * 1e6 / reports.max(1) as f64,
    })
}

/// The table.
pub fn render(rows: &[TierRow]) -> String {
    let mut s = String::from(
        "  cache  policy      sampling    sample hits  byte hits  source MB/epoch  tier MB  hot samples  vs LRU (bytes)  easiest 10% seen  max weight\n",
    );
    for r in rows {
        let lru = rows
            .iter()
            .find(|x| x.fraction == r.fraction && x.policy == TierPolicy::Lru)
            .map(|x| x.byte_hit_ratio)
            .unwrap_or(0.0);
        s += &format!(
            "  {:>4.0}%  {:<10}  {:<10}  {:>10.1}%  {:>8.1}%  {:>15.1}  {:>7.1}  {:>11}  {:>13.1}x  {:>15.1}%  {:>10.2}\n",
            r.fraction * 100.0,
            r.policy.name(),
            r.sampling,
            r.sample_hit_ratio * 100.0,
            r.byte_hit_ratio * 100.0,
            r.source_bytes_per_epoch / 1e6,
            r.tier_bytes as f64 / 1e6,
            r.hot_samples,
            r.byte_hit_ratio / lru.max(1e-9),
            r.easiest_seen_per_epoch * 100.0,
            r.max_weight,
        );
    }
    let us: Vec<f64> = rows.iter().map(|r| r.report_us).collect();
    if !us.is_empty() {
        s += &format!(
            "  report(): {:.1} us per batch on average (ranking and queueing; merged in the background)\n",
            us.iter().sum::<f64>() / us.len() as f64
        );
    }
    s
}
