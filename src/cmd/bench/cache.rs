//! `granary bench cache`: cache policies, simulated and (with --tier-dir) on the real tier.

use std::path::PathBuf;
use std::process::ExitCode;

/// Cache policies: simulation over real epoch plans, and (--tier-dir) the real local tier.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary bench cache                           # a synthetic 300,000-sample dataset
  granary bench cache data/img.granary --fractions 0.1,0.2,0.5 --epochs 6
  granary bench cache data/img.granary --tier-dir /local/ssd/bench-tier --fractions 0.1,0.2

Each epoch reads every item once in the plan's order (chunk-wise by default). Epoch 0 fills the
cache; hit ratios are over the later epochs. Theory for LRU: f + (1 - f) ln(1 - f) ~ f^2/2.
Then an end-to-end run: losses come from a per-sample difficulty model (lognormal difficulty, loss
decaying with each visit), are ranked per batch into SHADE scores; the importance policy keeps the
highest-scoring samples (at most 10 % of the cache replaced per epoch) and samples epochs with
importance sampling that favours them.

With --tier-dir (and a dataset) the same loss model drives real epochs through the real tier
(one sub-directory per policy and size, emptied first): losses are reported by sample id into the
tier's shared score table after every batch of --batch samples; lru and static read uniform
epochs, static is also run with importance sampling, and importance re-packs the samples of
highest score per byte into hot chunks and samples epochs that favour them. It reports the
samples and bytes served by the tier and the bytes read from the source per epoch (epoch 0 fills
the tier and the scores and is not counted).")]
pub(super) struct CacheArgs {
    /// Dataset whose shape (chunks and their sample counts) the plans use; by default a
    /// synthetic one of 1,000 chunks of 300 samples.
    dataset: Option<PathBuf>,
    /// Cache sizes as fractions of the dataset.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,0.5")]
    fractions: Vec<f64>,
    /// Epochs replayed (the first warms the cache).
    #[arg(long, default_value_t = 5)]
    epochs: u64,
    /// Epoch order of the plans.
    #[arg(long, default_value = "chunkwise", value_parser = granary::ShuffleMode::parse)]
    shuffle: granary::ShuffleMode,
    /// Importance sampling mix for the end-to-end simulation (0 = uniform, must be < 1).
    #[arg(long, default_value_t = 0.8)]
    alpha: f64,
    /// How much the importance sampler favours samples already in the cache.
    #[arg(long, default_value_t = 4.0)]
    cache_boost: f64,
    /// Also measure the real tier: a directory on local storage for the benchmark's tiers.
    #[arg(long, value_name = "DIR", requires = "dataset")]
    tier_dir: Option<PathBuf>,
    /// Training batch size of the loss model (losses are ranked within a batch).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(c: CacheArgs) -> anyhow::Result<ExitCode> {
    use granary_bench::cachesim::{render, simulate, Level};
    if let Some(f) = c.fractions.iter().find(|f| !(0.0..=1.0).contains(*f)) {
        anyhow::bail!("cache fraction {f} is not in [0, 1]");
    }
    let shape = match &c.dataset {
        Some(p) => super::super::open_dataset(p)?.shape()?,
        None => granary::DatasetShape::from_counts(vec![300; 1000]),
    };
    let plan = granary::PlanOptions {
        mode: c.shuffle,
        ..Default::default()
    };
    let rows: Vec<_> = [Level::Sample, Level::Chunk]
        .into_iter()
        .flat_map(|level| simulate(&shape, &plan, c.epochs, &c.fractions, level))
        .collect();
    if !(0.0..1.0).contains(&c.alpha) {
        anyhow::bail!("--alpha {} is not in [0, 1)", c.alpha);
    }
    let lo = granary_bench::cachesim::LossSimOptions {
        epochs: c.epochs,
        fractions: c.fractions.clone(),
        alpha: c.alpha,
        cache_boost: c.cache_boost,
        batch: 64,
        seed: 1,
    };
    let losses = granary_bench::cachesim::simulate_losses(&shape, &plan, &lo);
    let tier = match (&c.tier_dir, &c.dataset) {
        (Some(dir), Some(ds)) => {
            let o = granary_bench::tierbench::TierBenchOptions {
                dataset: ds.clone(),
                dir: dir.clone(),
                fractions: c.fractions.clone(),
                epochs: c.epochs,
                plan: granary::PlanOptions {
                    mode: c.shuffle,
                    window_chunks: 4,
                    ..Default::default()
                },
                alpha: c.alpha,
                cache_boost: c.cache_boost,
                batch: c.batch,
                seed: 1,
            };
            Some(granary_bench::tierbench::run(&o)?)
        }
        _ => None,
    };
    let v = serde_json::json!({"uniform": &rows, "with_losses": &losses, "tier": &tier});
    crate::cmd::output(c.json, &v, |_| {
        println!(
            "cache simulation over {} epochs of {:?} plans ({} samples in {} chunks)",
            c.epochs.max(2),
            c.shuffle,
            shape.samples(),
            shape.chunks()
        );
        print!("{}", render(&rows));
        println!(
            "\nend to end with losses from the difficulty model (alpha {}, cache boost {}, batches of 64):",
            c.alpha, c.cache_boost
        );
        print!("{}", granary_bench::cachesim::render_losses(&losses));
        if let Some(t) = &tier {
            println!(
                "\nreal tier, {} epochs (alpha {}, cache boost {}, batches of {}):",
                c.epochs.max(2),
                c.alpha,
                c.cache_boost,
                c.batch
            );
            print!("{}", granary_bench::tierbench::render(t));
        }
    })
}
