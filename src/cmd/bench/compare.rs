//! `granary bench compare`: raw small-file reads vs granary, side by side (and one side's epoch in a process of its own).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use granary_bench::compare::{CompareOptions, Side, SideReport, State};

/// Raw small-file reads (as ImageFolder + DataLoader do them) vs granary, same data, same K.
#[derive(clap::Args)]
#[command(after_help = "Example:
  granary bench gen data/img --files 20000
  granary pack data/img -o data/img.granary
  granary bench compare --raw data/img --packed data/img.granary --workers 2 --epochs 2 --report out/

The raw side lists the tree (start-up), then opens, stats, reads and closes every file in a shuffled
order; granary opens the snapshot (start-up) and streams a chunk-wise epoch. Both checksum every
sample into an order-independent digest over (path, CRC-32): the report says whether they match.
Before each epoch of each side, caches are made cold: --cold auto drops the page cache where
permitted (root), else evicts every file with posix_fadvise(DONTNEED); none leaves them warm.
On a real Lustre or NFS mount, point --raw and --packed at paths on that mount (drop_caches
then also drops the client's cache).")]
pub(super) struct CompareArgs {
    /// The raw ImageFolder-style tree.
    #[arg(long)]
    raw: PathBuf,
    /// The same tree packed with `granary pack`.
    #[arg(long)]
    packed: PathBuf,
    /// Loader workers on each side.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Epochs per side.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// How caches are made cold before each epoch: auto, drop, fadvise or none.
    #[arg(long, default_value = "auto", value_parser = granary_bench::cold::ColdMode::parse)]
    cold: granary_bench::cold::ColdMode,
    /// Shuffle seed of both sides.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How the granary side reads: auto (page cache where resident or kept resident, O_DIRECT
    /// elsewhere), direct or buffered.
    #[arg(long, default_value = "auto", value_parser = granary::IoMode::parse)]
    io: granary::IoMode,
    /// Cache states to measure, each for --epochs epochs per side: cold (caches made cold
    /// before every epoch, as --cold says), warm (both trees read once first, nothing
    /// dropped), limited (every side's process in a memory cgroup of --memory-limit bytes,
    /// page cache included). Each side runs in a process of its own, so its peak RSS is its
    /// own.
    #[arg(long, default_value = "cold", value_parser = State::parse_list)]
    // Spelled out: clap's derive would read a plain `Vec<_>` as one value per occurrence.
    states: std::vec::Vec<State>,
    /// Memory limit of each side's process in the limited state (e.g. 1.6GB; well below the
    /// dataset). Needs root or a delegated cgroup (cgroup v1 or v2).
    #[arg(long, value_parser = super::super::pack::parse_size)]
    memory_limit: Option<u64>,
    /// Write a Markdown report with SVG plots into this directory.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// One side's epoch of `bench compare`, in a process of its own (run by `bench compare`).
#[derive(clap::Args)]
pub(super) struct CompareSideArgs {
    #[arg(long, value_parser = Side::parse)]
    side: Side,
    #[arg(long)]
    epoch: u64,
    #[command(flatten)]
    compare: CompareArgs,
}

/// The library's options of `c`, each side run by `side_exe` (`None`: in this process).
fn options(c: &CompareArgs, side_exe: Option<PathBuf>) -> CompareOptions {
    CompareOptions {
        raw: c.raw.clone(),
        packed: c.packed.clone(),
        workers: c.workers,
        epochs: c.epochs,
        cold: c.cold,
        seed: c.seed,
        io: c.io,
        states: c.states.clone(),
        memory_limit: c.memory_limit,
        side_exe,
    }
}

pub(super) fn run(c: CompareArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("finding granary's own executable")?;
    let opts = options(&c, Some(exe));
    if c.states.contains(&State::Limited) && c.memory_limit.is_none() {
        anyhow::bail!("--states limited needs --memory-limit BYTES");
    }
    let res = granary_bench::compare::run(&opts).map_err(anyhow::Error::msg)?;
    let table = granary_bench::compare::render(&res);
    if let Some(dir) = &c.report {
        granary_bench::report::write_report(dir, &res, &table)
            .with_context(|| format!("writing the report to {}", dir.display()))?;
    }
    if c.json {
        super::super::print_json(&res)?;
    } else {
        print!("{table}");
        if let Some(dir) = &c.report {
            println!("  report: {}", dir.join("report.md").display());
        }
    }
    if !res.digests_match {
        anyhow::bail!("the two sides delivered different bytes");
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn run_side(c: CompareSideArgs) -> anyhow::Result<ExitCode> {
    let o = CompareOptions {
        epochs: 1,
        cold: granary_bench::cold::ColdMode::None,
        states: Vec::new(),
        memory_limit: None,
        ..options(&c.compare, None)
    };
    let mut s =
        granary_bench::compare::run_side(&o, c.side, c.epoch).map_err(anyhow::Error::msg)?;
    let latencies_us = std::mem::take(&mut s.latencies_us);
    super::super::print_json(&SideReport {
        side: s,
        latencies_us,
    })?;
    Ok(ExitCode::SUCCESS)
}
