//! `granary bench hits`: tier-hit throughput of N reader processes on one tier.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

/// Tier-hit throughput: N reader processes on one local tier vs the same reads from the page cache.
#[derive(clap::Args)]
#[command(after_help = "Example:
  granary bench hits data/img.granary --tier-dir /local/ssd/bench-tier --processes 1,2,4,8

Every chunk is copied into a tier under --tier-dir (static policy, a quota above the dataset);
before every run, the side's files (the tier's copies, or the
dataset's chunks) are read once so that they are resident. For each process count N, N `granary read DATASET --json` processes (seeds 0..N) each
stream --epochs whole epochs at the same time, once with the tier (every chunk a hit) and once without
(the same chunks from the page cache); the sides alternate --repeat times and the medians are
reported as aggregate MB/s. Their ratio is what a tier hit costs over a page-cache read.")]
pub(super) struct HitsArgs {
    /// A packed dataset (it must fit in memory twice: source and tier copies).
    dataset: PathBuf,
    /// A directory on local storage for the benchmark's tier (its dataset sub-directory is
    /// emptied first).
    #[arg(long, value_name = "DIR")]
    tier_dir: PathBuf,
    /// Reader process counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    processes: Vec<u32>,
    /// Epochs each process reads (more epochs, less weight on process start-up).
    #[arg(long, default_value_t = 5)]
    epochs: u64,
    /// Runs per side and count (medians are reported).
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(h: HitsArgs) -> anyhow::Result<ExitCode> {
    if h.processes.is_empty() || h.processes.contains(&0) {
        anyhow::bail!("--processes needs counts of at least 1");
    }
    let o = granary_bench::hitbench::HitBenchOptions {
        dataset: h.dataset.clone(),
        dir: h.tier_dir.clone(),
        processes: h.processes.clone(),
        epochs: h.epochs.max(1),
        repeat: h.repeat,
        exe: std::env::current_exe().context("finding granary's own executable")?,
    };
    let r = granary_bench::hitbench::run(&o).map_err(anyhow::Error::msg)?;
    let text = |r: &_| print!("{}", granary_bench::hitbench::render(r));
    crate::cmd::output(h.json, &r, text)
}
