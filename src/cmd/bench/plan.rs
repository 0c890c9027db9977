//! `granary bench plan`: one shard's epoch plan on a synthetic dataset shape of any size (no
//! data is read or written): the time to build it and the process's peak memory.

use std::process::ExitCode;
use std::time::Instant;

use granary::procstat::peak_rss_bytes;
use granary::{DatasetShape, EpochPlan, EpochState, PlanOptions, Sampling, Shard, ShuffleMode};
use serde_json::json;

/// Time and peak memory of one shard's epoch plan on a synthetic dataset of any size.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary bench plan --samples 1000000000 --world-size 64 --shuffle global
  granary bench plan --samples 100000000 --chunks 100000 --shuffle chunkwise --json
  granary bench plan --samples 1000000000 --shuffle global --resume-from-world-size 32

The dataset is a shape only: --chunks chunks (default: one per 1,000 samples) sharing --samples
samples equally. The plan is rank --rank's (worker --worker of --workers) for epoch --epoch.
Peak RSS is the whole process's (VmHWM), the shape included; run one plan per process to
compare plans.")]
pub struct PlanArgs {
    /// Samples in the dataset.
    #[arg(long)]
    samples: u64,
    /// Chunks in the dataset (default: samples / 1,000, at least 1).
    #[arg(long)]
    chunks: Option<u64>,
    /// Epoch order: chunkwise, global or sequential.
    #[arg(long, default_value = "chunkwise", value_parser = ShuffleMode::parse)]
    shuffle: ShuffleMode,
    /// Distributed ranks.
    #[arg(long, default_value_t = 64)]
    world_size: u32,
    /// The rank whose plan is built.
    #[arg(long, default_value_t = 0)]
    rank: u32,
    /// Loader workers per rank.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// The worker whose plan is built.
    #[arg(long, default_value_t = 0)]
    worker: u32,
    /// Epoch number.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Importance sampling (alpha 0.5) from a score table of every sample, a tenth of them
    /// reported with random losses; the table (5 bytes a sample) counts in the peak RSS.
    #[arg(long)]
    importance: bool,
    /// Build the plan as the resumption, at --world-size, of an epoch stopped when every
    /// shard of this many ranks (one worker each) had delivered half of its share: what is
    /// left is redistributed to the new ranks.
    #[arg(long, value_name = "RANKS")]
    resume_from_world_size: Option<u32>,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: PlanArgs) -> anyhow::Result<ExitCode> {
    let chunks = a.chunks.unwrap_or(a.samples / 1000).max(1);
    anyhow::ensure!(
        chunks <= u64::from(u32::MAX),
        "--chunks {chunks}: at most {} chunks",
        u32::MAX
    );
    let t0 = Instant::now();
    let (base, rem) = (a.samples / chunks, a.samples % chunks);
    let shape = DatasetShape::from_counts((0..chunks).map(|c| base + u64::from(c < rem)));
    let shape_s = t0.elapsed().as_secs_f64();
    let rss_shape = peak_rss_bytes();
    let shard = Shard {
        rank: a.rank,
        world_size: a.world_size,
        worker: a.worker,
        num_workers: a.workers,
    };
    let o = PlanOptions {
        mode: a.shuffle,
        ..PlanOptions::default()
    };
    let scores = a.importance.then(|| {
        let mut t = granary::ImportanceScores::new(a.samples, 0.8);
        let mut r = granary_format::SplitMix64::new(9);
        let w: Vec<(u64, f32)> = (0..a.samples / 10)
            .map(|_| (r.below(a.samples), (r.next_f64() * 5.0) as f32))
            .collect();
        t.apply(&w);
        t
    });
    let rss_scores = peak_rss_bytes();
    let sampling = scores.as_ref().map(|scores| Sampling {
        scores,
        alpha: 0.5,
        cached: None,
        cache_boost: 1.0,
    });
    let resume = a.resume_from_world_size.map(|w| {
        let half = a.samples.div_ceil(u64::from(w.max(1))) / 2;
        EpochState {
            epoch: a.epoch,
            world_size: w,
            num_workers: 1,
            consumed: vec![half; w as usize],
            column: None,
            then: None,
            chunks: None,
        }
    });
    let t1 = Instant::now();
    let plan = EpochPlan::build_sampled(
        &shape,
        &o,
        a.epoch,
        shard,
        resume.as_ref(),
        sampling.as_ref(),
    )
    .map_err(anyhow::Error::msg)?;
    let plan_s = t1.elapsed().as_secs_f64();
    let rss = peak_rss_bytes();
    let mb = |b: Option<u64>| b.map(|b| b as f64 / 1e6);
    let v = json!({
        "samples": a.samples, "chunks": chunks, "shuffle": a.shuffle.name(),
        "world_size": a.world_size, "workers": a.workers, "share": plan.len(),
        "windows": plan.windows.len(), "shape_seconds": shape_s, "plan_seconds": plan_s,
        "importance": a.importance, "resume_from_world_size": a.resume_from_world_size,
        "peak_rss_mb_after_shape": mb(rss_shape), "peak_rss_mb_after_scores": mb(rss_scores),
        "peak_rss_mb": mb(rss),
    });
    crate::cmd::output(a.json, &v, |_| {
        println!(
            "{} samples in {chunks} chunks, {:?} plan{} of rank {} of {} (worker {} of {}): {} \
             samples in {} windows",
            a.samples,
            a.shuffle,
            a.resume_from_world_size
                .map_or(String::new(), |w| format!(" resumed from {w} ranks")),
            a.rank,
            a.world_size,
            a.worker,
            a.workers,
            plan.len(),
            plan.windows.len()
        );
        let show =
            |b: Option<u64>| b.map_or("unknown".into(), |b| format!("{:.0} MB", b as f64 / 1e6));
        println!(
            "shape {shape_s:.2} s (peak RSS {}){}, plan {plan_s:.2} s (peak RSS {})",
            show(rss_shape),
            match a.importance {
                true => format!(", score table (peak RSS {})", show(rss_scores)),
                false => String::new(),
            },
            show(rss)
        );
    })
}
