use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use granary_bench::gen::{Content, GenOptions, Sizes};
use granary_bench::packbench::{self, PackBenchOptions};
use granary_packer::{CompressMode, PackOptions};

/// Benchmarks: generate data, compare granary with the alternatives on the same data.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand)]
enum BenchCmd {
    Gen(GenArgs),
    Pack(PackArgs),
    Read(ReadArgs),
    Compare(CompareArgs),
    #[command(hide = true)]
    CompareSide(CompareSideArgs),
    Cache(CacheArgs),
    Hits(HitsArgs),
}

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
struct CacheArgs {
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
struct HitsArgs {
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
struct CompareArgs {
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
    #[arg(long, default_value = "cold", value_parser = granary_bench::compare::State::parse_list)]
    states: std::vec::Vec<granary_bench::compare::State>,
    /// Memory limit of each side's process in the limited state (e.g. 1.6GB; well below the
    /// dataset). Needs root or a delegated cgroup (cgroup v1 or v2).
    #[arg(long, value_parser = super::pack::parse_size)]
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
struct CompareSideArgs {
    #[arg(long, value_parser = ["raw", "granary"])]
    side: String,
    #[arg(long)]
    raw: PathBuf,
    #[arg(long)]
    packed: PathBuf,
    #[arg(long)]
    workers: u32,
    #[arg(long)]
    epoch: u64,
    #[arg(long)]
    seed: u64,
    #[arg(long, value_parser = granary::IoMode::parse)]
    io: granary::IoMode,
}

/// Cold epoch throughput of granary vs a direct sequential read of the same chunk files.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  granary bench read data/img.granary --repeat 3\n\n\
Each run drops the page cache first. Sides: a direct O_DIRECT sequential read of every chunk file \
(the device's bandwidth through granary's engine), fio (when installed), granary chunk-wise epochs \
with io_uring and with pread, and a global-shuffle epoch for contrast."
)]
struct ReadArgs {
    /// Dataset directory.
    dataset: PathBuf,
    /// Loader workers (threads).
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Chunks per shuffle window (default: what the reader's default memory budget gives).
    #[arg(long)]
    window: Option<usize>,
    /// Reads in flight.
    #[arg(long, default_value_t = 8)]
    queue_depth: usize,
    /// Runs per side, interleaved; medians are reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum ContentArg {
    /// Random bytes behind a JPEG marker (incompressible, like real JPEGs).
    Random,
    /// Words from a small vocabulary (compressible).
    Text,
}

/// Generate a seeded ImageFolder-style tree (OUT/class_NNNN/NNNNNNNN.JPEG).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  granary bench gen data/imagenet --files 20000 --sizes imagenet\n  \
granary bench gen data/tiny --files 1000000 --classes 1000 --sizes tiny\n\n\
Sizes: imagenet = lognormal, mean ~110 KiB; tiny = lognormal, mean ~1 KiB; or a fixed byte count."
)]
struct GenArgs {
    /// Output directory (must not exist or be empty).
    out: PathBuf,
    /// Number of files.
    #[arg(long, default_value_t = 10_000)]
    files: u64,
    /// Number of class directories.
    #[arg(long, default_value_t = 100)]
    classes: u64,
    /// Size distribution: imagenet, tiny, or a fixed number of bytes.
    #[arg(long, default_value = "imagenet", value_parser = Sizes::parse)]
    sizes: Sizes,
    /// File contents.
    #[arg(long, value_enum, default_value = "random")]
    content: ContentArg,
    /// Seed: the same seed gives the same tree.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Packing throughput of granary vs `tar -cf - SRC | cat >/dev/null` on the same tree, cold.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  granary bench gen data/img --files 20000 && granary bench pack data/img -o data/img.granary\n\n\
Caches are dropped before each run (as root), else evicted with posix_fadvise; the report says which.\n\
Also measures snapshot open time (cold and warm) and path lookup time."
)]
struct PackArgs {
    /// Tree to pack.
    src: PathBuf,
    /// Where the packed dataset is written (replaced if it exists).
    #[arg(short, long)]
    out: PathBuf,
    /// Record compression for granary (see `granary pack --help`).
    #[arg(long, default_value = "auto", value_parser = CompressMode::parse)]
    compress: CompressMode,
    /// Target chunk size.
    #[arg(long, default_value = "32MiB", value_parser = super::pack::parse_size)]
    chunk_size: u64,
    /// Number of random path lookups to time.
    #[arg(long, default_value_t = 100_000)]
    lookups: u64,
    /// Runs per side, alternating tar and granary; medians are reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// granary reader threads (see `granary pack --help`).
    #[arg(long, default_value_t = granary_packer::DEFAULT_IO_THREADS)]
    io_threads: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let progress = std::io::stderr().is_terminal();
    match a.cmd {
        BenchCmd::Gen(g) => {
            let opts = GenOptions {
                out: g.out.clone(),
                files: g.files,
                classes: g.classes,
                sizes: g.sizes,
                content: match g.content {
                    ContentArg::Random => Content::Random,
                    ContentArg::Text => Content::Text,
                },
                seed: g.seed,
                progress,
            };
            let s = granary_bench::gen::generate(&opts)
                .with_context(|| format!("generating {}", g.out.display()))?;
            if g.json {
                super::print_json(&s)?;
            } else {
                println!(
                    "generated {} files in {} classes ({}) under {} in {:.2} s",
                    s.files,
                    s.classes,
                    super::human_bytes(s.bytes),
                    s.out.display(),
                    s.elapsed_s
                );
            }
        }
        BenchCmd::Pack(p) => {
            let mut template = PackOptions::new(&p.src, &p.out);
            template.compress = p.compress;
            template.chunk_size = p.chunk_size;
            template.progress = progress;
            template.force = true;
            template.io_threads = p.io_threads;
            let opts = PackBenchOptions {
                src: p.src.clone(),
                out: p.out.clone(),
                template,
                lookups: p.lookups,
                repeat: p.repeat,
            };
            let r = packbench::run(&opts).map_err(anyhow::Error::msg)?;
            if p.json {
                super::print_json(&r)?;
            } else {
                print!("{}", packbench::render(&r, &p.src));
            }
        }
        BenchCmd::Compare(c) => {
            let opts = granary_bench::compare::CompareOptions {
                raw: c.raw.clone(),
                packed: c.packed.clone(),
                workers: c.workers,
                epochs: c.epochs,
                cold: c.cold,
                seed: c.seed,
                io: c.io,
                states: c.states.clone(),
                memory_limit: c.memory_limit,
                side_exe: Some(
                    std::env::current_exe().context("finding granary's own executable")?,
                ),
            };
            if c.states.contains(&granary_bench::compare::State::Limited)
                && c.memory_limit.is_none()
            {
                anyhow::bail!("--states limited needs --memory-limit BYTES");
            }
            let res = granary_bench::compare::run(&opts).map_err(anyhow::Error::msg)?;
            let table = granary_bench::compare::render(&res);
            if let Some(dir) = &c.report {
                granary_bench::report::write_report(dir, &res, &table)
                    .with_context(|| format!("writing the report to {}", dir.display()))?;
            }
            if c.json {
                super::print_json(&res)?;
            } else {
                print!("{table}");
                if let Some(dir) = &c.report {
                    println!("  report: {}", dir.join("report.md").display());
                }
            }
            if !res.digests_match {
                anyhow::bail!("the two sides delivered different bytes");
            }
        }
        BenchCmd::CompareSide(c) => {
            use granary_bench::compare::{run_side, CompareOptions, Side, SideReport};
            let o = CompareOptions {
                raw: c.raw,
                packed: c.packed,
                workers: c.workers,
                epochs: 1,
                cold: granary_bench::cold::ColdMode::None,
                seed: c.seed,
                io: c.io,
                states: Vec::new(),
                memory_limit: None,
                side_exe: None,
            };
            let side = if c.side == "raw" {
                Side::Raw
            } else {
                Side::Granary
            };
            let mut s = run_side(&o, side, c.epoch).map_err(anyhow::Error::msg)?;
            let latencies_us = std::mem::take(&mut s.latencies_us);
            super::print_json(&SideReport {
                side: s,
                latencies_us,
            })?;
        }
        BenchCmd::Hits(h) => {
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
            if h.json {
                super::print_json(&r)?;
            } else {
                print!("{}", granary_bench::hitbench::render(&r));
            }
        }
        BenchCmd::Cache(c) => {
            use granary_bench::cachesim::{render, simulate, Level};
            if let Some(f) = c.fractions.iter().find(|f| !(0.0..=1.0).contains(*f)) {
                anyhow::bail!("cache fraction {f} is not in [0, 1]");
            }
            let shape = match &c.dataset {
                Some(p) => super::open_dataset(p)?.shape()?,
                None => granary::DatasetShape::from_counts(vec![300; 1000]),
            };
            let plan = granary::PlanOptions {
                mode: c.shuffle,
                ..Default::default()
            };
            let mut rows = simulate(&shape, &plan, c.epochs, &c.fractions, Level::Sample);
            rows.extend(simulate(
                &shape,
                &plan,
                c.epochs,
                &c.fractions,
                Level::Chunk,
            ));
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
            if c.json {
                super::print_json(
                    &serde_json::json!({"uniform": rows, "with_losses": losses, "tier": tier}),
                )?;
            } else {
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
            }
        }
        BenchCmd::Read(r) => {
            let opts = granary_bench::readbench::ReadBenchOptions {
                dataset: r.dataset.clone(),
                workers: r.workers,
                window_chunks: match r.window {
                    Some(w) => w,
                    None => granary::Dataset::open(&r.dataset)?
                        .window_for_memory(granary::DEFAULT_READER_MEMORY)?,
                },
                queue_depth: r.queue_depth,
                repeat: r.repeat,
            };
            let res = granary_bench::readbench::run(&opts).map_err(anyhow::Error::msg)?;
            if r.json {
                super::print_json(&res)?;
            } else {
                print!("{}", granary_bench::readbench::render(&res));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
