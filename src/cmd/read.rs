use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use granary::io::IoKind;
use granary::{Dataset, PlanOptions, Shard, ShuffleMode, StreamOptions};
use serde::Serialize;

/// Options shared by `read` and `plan`: which epoch order and which share of it.
#[derive(clap::Args, Clone)]
pub struct PlanArgs {
    /// Epoch order: chunkwise (permute chunks, shuffle inside windows of chunks), global
    /// (fully random, record-level reads) or sequential.
    #[arg(long, default_value = "chunkwise", value_parser = ShuffleMode::parse)]
    pub shuffle: ShuffleMode,
    /// Seed of every shuffle (the same seed gives the same epochs on every machine).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Chunks per shuffle window (memory ~ (prefetch + 2) x window x chunk size).
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// This process's distributed rank.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Number of distributed ranks.
    #[arg(long, default_value_t = 1)]
    pub world_size: u32,
    /// Loader workers per rank (threads here, DataLoader workers in Python).
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Fraction of chunks reassigned between ranks each epoch, 0..1 (1: fully random;
    /// lower keeps each rank on a home set of chunks so node-local caches stay useful).
    #[arg(long, default_value_t = 1.0)]
    pub locality: f64,
    /// Pad each rank's share by repeating samples instead of dropping the remainder.
    #[arg(long)]
    pub pad: bool,
}

impl PlanArgs {
    pub fn options(&self) -> PlanOptions {
        PlanOptions {
            mode: self.shuffle,
            seed: self.seed,
            window_chunks: self.window,
            drop_last: !self.pad,
            locality: self.locality,
        }
    }

    pub fn shard(&self, worker: u32) -> Shard {
        Shard {
            rank: self.rank,
            world_size: self.world_size,
            worker,
            num_workers: self.workers,
        }
    }
}

/// Stream epochs of a dataset (a dry run of training I/O): throughput and a digest.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary read train.granary                                # one chunkwise epoch
  granary read train.granary --epochs 3 --workers 2 --json
  granary read train.granary --rank 1 --world-size 4        # rank 1's share
  GRANARY_IO=pread granary read train.granary               # force the pread backend

The digest is order-independent (a sum over delivered sample ids): the digests of all ranks of
an epoch add up (mod 2^64) to the digest of the whole dataset when nothing is dropped.")]
pub struct Args {
    /// Dataset directory.
    pub dataset: PathBuf,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Number of epochs.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// First epoch number (plans differ per epoch).
    #[arg(long, default_value_t = 0)]
    pub first_epoch: u64,
    /// I/O backend: auto, uring or pread.
    #[arg(long, default_value = "auto", value_parser = IoKind::parse)]
    pub io: IoKind,
    /// Reads in flight per worker.
    #[arg(long, default_value_t = 8)]
    pub queue_depth: usize,
    /// Do not use O_DIRECT (reads go through the page cache).
    #[arg(long)]
    pub buffered: bool,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Order-independent digest of delivered sample ids.
pub fn id_digest(id: u64) -> u64 {
    granary_format::SplitMix64::keyed(&[id]).next_u64()
}

#[derive(Serialize, Default, Clone)]
pub struct EpochReport {
    pub epoch: u64,
    pub samples: u64,
    pub bytes: u64,
    pub bytes_read: u64,
    pub elapsed_s: f64,
    pub samples_per_s: f64,
    pub mb_per_s: f64,
    pub cpu_s: f64,
    pub digest: String,
    pub backend: String,
}

/// CPU time (user + system) of this process so far, from /proc/self/stat (USER_HZ = 100).
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// What one worker thread delivered.
struct WorkerTotals {
    samples: u64,
    bytes: u64,
    digest: u64,
    bytes_read: u64,
    backend: &'static str,
}

/// Streams one epoch with `workers` threads; returns the report.
pub fn read_epoch(
    ds: &Arc<Dataset>,
    a: &PlanArgs,
    epoch: u64,
    io: &StreamOptions,
) -> anyhow::Result<EpochReport> {
    let opts = a.options();
    let t = Instant::now();
    let cpu0 = cpu_seconds();
    let results: Vec<anyhow::Result<WorkerTotals>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..a.workers)
            .map(|w| {
                let opts = &opts;
                s.spawn(move || -> anyhow::Result<WorkerTotals> {
                    let mut st = ds.stream_epoch(opts, epoch, a.shard(w), None, io)?;
                    let (mut n, mut bytes, mut digest) = (0u64, 0u64, 0u64);
                    for sample in st.by_ref() {
                        let sample = sample?;
                        n += 1;
                        bytes += sample.data().len() as u64;
                        digest = digest.wrapping_add(id_digest(sample.id));
                    }
                    Ok(WorkerTotals {
                        samples: n,
                        bytes,
                        digest,
                        bytes_read: st.bytes_read(),
                        backend: st.backend(),
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .collect()
    });
    let mut r = EpochReport {
        epoch,
        ..Default::default()
    };
    let mut digest = 0u64;
    for res in results {
        let w = res?;
        r.samples += w.samples;
        r.bytes += w.bytes;
        r.bytes_read += w.bytes_read;
        digest = digest.wrapping_add(w.digest);
        r.backend = w.backend.to_string();
    }
    r.elapsed_s = t.elapsed().as_secs_f64();
    r.cpu_s = cpu_seconds() - cpu0;
    r.samples_per_s = r.samples as f64 / r.elapsed_s.max(1e-9);
    r.mb_per_s = r.bytes as f64 / 1e6 / r.elapsed_s.max(1e-9);
    r.digest = format!("{digest:016x}");
    Ok(r)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = Arc::new(super::open_dataset(&a.dataset)?);
    let io = StreamOptions {
        io: a.io,
        queue_depth: a.queue_depth,
        direct: !a.buffered,
        ..StreamOptions::default()
    };
    let mut reports = Vec::new();
    for epoch in a.first_epoch..a.first_epoch + a.epochs {
        let r = read_epoch(&ds, &a.plan, epoch, &io)
            .with_context(|| format!("reading epoch {epoch}"))?;
        if !a.json {
            println!(
                "epoch {:>3}: {} samples, {:.1} MB in {:.2} s: {:.0} samples/s, {:.1} MB/s, cpu {:.2} s, digest {} ({})",
                r.epoch, r.samples, r.bytes as f64 / 1e6, r.elapsed_s, r.samples_per_s, r.mb_per_s, r.cpu_s, r.digest, r.backend
            );
        }
        reports.push(r);
    }
    if a.json {
        super::print_json(&reports)?;
    }
    Ok(ExitCode::SUCCESS)
}
