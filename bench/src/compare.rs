//! `granary bench compare`: what a training job's data loader sees, on the same data and the
//! same storage. The raw side does what PyTorch's ImageFolder + DataLoader do: list the tree
//! (start-up), then open/read/close every file in a shuffled order with K workers. The granary
//! side opens the snapshot (start-up) and streams a chunk-wise epoch with the same K. Both
//! sides checksum every sample and fold (path, CRC-32) into an order-independent digest, so the
//! report can state that they delivered the same bytes.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use granary::{Dataset, PlanOptions, Shard, StreamOptions};
use granary_format::SplitMix64;
use serde::Serialize;

use crate::cold::{make_cold_with, ColdMethod, ColdMode};
use crate::readbench::cpu_seconds;

/// What to compare.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    pub raw: PathBuf,
    pub packed: PathBuf,
    pub workers: u32,
    pub epochs: u64,
    pub cold: ColdMode,
    pub seed: u64,
    /// How the granary side reads: page cache or O_DIRECT (see [`granary::IoMode`]).
    pub io: granary::IoMode,
}

/// One side of one epoch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SideEpoch {
    pub epoch: u64,
    pub cold: Option<ColdMethod>,
    /// Listing the tree (raw) or opening the snapshot and planning (granary).
    pub startup_s: f64,
    pub samples: u64,
    pub bytes: u64,
    pub elapsed_s: f64,
    pub samples_per_s: f64,
    pub mb_per_s: f64,
    /// Time a worker waited for each sample, microseconds.
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    /// Opens and stats issued.
    pub metadata_ops: u64,
    pub cpu_s: f64,
    pub digest: String,
    /// Per-sample wait times in microseconds, sorted (for the latency plot; not in JSON).
    #[serde(skip)]
    pub latencies_us: Vec<f64>,
}

/// The comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CompareResult {
    pub raw: PathBuf,
    pub packed: PathBuf,
    pub workers: u32,
    pub raw_epochs: Vec<SideEpoch>,
    pub granary_epochs: Vec<SideEpoch>,
    /// granary samples/s over raw samples/s, per epoch.
    pub ratios: Vec<f64>,
    pub startup_ratio: f64,
    pub metadata_ratio: f64,
    pub digests_match: bool,
}

fn digest_term(path: &[u8], crc: u32) -> u64 {
    SplitMix64::keyed(&[granary_format::path_hash(path), crc as u64]).next_u64()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        0.0
    } else {
        sorted[((sorted.len() - 1) as f64 * q).round() as usize]
    }
}

/// What one worker delivered.
#[derive(Default)]
struct WorkerOut {
    samples: u64,
    bytes: u64,
    digest: u64,
    latencies_us: Vec<f64>,
}

impl WorkerOut {
    fn add(&mut self, path: &[u8], data: &[u8], waited: std::time::Duration) {
        self.samples += 1;
        self.bytes += data.len() as u64;
        self.digest = self
            .digest
            .wrapping_add(digest_term(path, crc32fast::hash(data)));
        self.latencies_us.push(waited.as_secs_f64() * 1e6);
    }
}

/// Folds the workers' results into `s` and computes rates and percentiles.
fn fold<E>(
    mut s: SideEpoch,
    workers: Vec<Result<WorkerOut, E>>,
    started: Instant,
    cpu0: f64,
) -> Result<SideEpoch, E> {
    let (mut lat, mut digest) = (Vec::new(), 0u64);
    for w in workers {
        let w = w?;
        s.samples += w.samples;
        s.bytes += w.bytes;
        digest = digest.wrapping_add(w.digest);
        lat.extend(w.latencies_us);
    }
    s.elapsed_s = started.elapsed().as_secs_f64();
    s.cpu_s = cpu_seconds() - cpu0;
    Ok(finish(s, lat, digest))
}

fn finish(mut s: SideEpoch, lat: Vec<f64>, digest: u64) -> SideEpoch {
    let mut lat = lat;
    lat.sort_by(f64::total_cmp);
    s.samples_per_s = s.samples as f64 / s.elapsed_s.max(1e-9);
    s.mb_per_s = s.bytes as f64 / 1e6 / s.elapsed_s.max(1e-9);
    s.latency_p50_us = percentile(&lat, 0.5);
    s.latency_p99_us = percentile(&lat, 0.99);
    s.latencies_us = lat;
    s.digest = format!("{digest:016x}");
    s
}

/// Lists an ImageFolder tree as torchvision does: class directories sorted by name, files
/// below them (recursively) sorted; returns relative paths and the number of metadata
/// operations (directory opens; file types come from readdir).
fn list_tree(root: &Path) -> std::io::Result<(Vec<Vec<u8>>, u64)> {
    let mut out = Vec::new();
    let mut ops = 0u64;
    for e in walkdir::WalkDir::new(root).min_depth(1).sort_by_file_name() {
        let e = e.map_err(std::io::Error::other)?;
        if e.file_type().is_dir() {
            ops += 1;
        } else if e.file_type().is_file() && e.depth() >= 2 {
            out.push(
                e.path()
                    .strip_prefix(root)
                    .expect("below root")
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            );
        }
    }
    Ok((out, ops + 1))
}

/// One raw epoch: shuffled per-file reads, `workers` threads, each file opened, stat'ed (as
/// Python's open() does), read and closed.
fn raw_epoch(o: &CompareOptions, epoch: u64) -> std::io::Result<SideEpoch> {
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let (mut files, list_ops) = list_tree(&o.raw)?;
    let startup_s = t.elapsed().as_secs_f64();
    SplitMix64::keyed(&[o.seed, epoch, 0x0072_6177]).shuffle(&mut files);
    let t = Instant::now();
    let k = o.workers.max(1) as usize;
    let per = files.len().div_ceil(k).max(1);
    let results: Vec<std::io::Result<WorkerOut>> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(per)
            .map(|share| {
                s.spawn(move || -> std::io::Result<WorkerOut> {
                    let mut out = WorkerOut::default();
                    let mut buf = Vec::new();
                    for rel in share {
                        let t0 = Instant::now();
                        let p = o.raw.join(std::ffi::OsStr::from_bytes(rel));
                        let mut f = std::fs::File::open(&p)?;
                        let len = f.metadata()?.len();
                        buf.clear();
                        buf.reserve(len as usize);
                        f.read_to_end(&mut buf)?;
                        drop(f);
                        out.add(rel, &buf, t0.elapsed());
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("raw worker"))
            .collect()
    });
    let files_read: u64 = files.len() as u64;
    // Per file: open and fstat (as Python's open() does), on top of the listing.
    let s = SideEpoch {
        epoch,
        startup_s,
        metadata_ops: list_ops + 2 * files_read,
        ..Default::default()
    };
    fold(s, results, t, cpu0)
}

/// One granary epoch: open the snapshot, plan, stream a chunk-wise epoch with `workers`.
fn granary_epoch(o: &CompareOptions, epoch: u64) -> granary::Result<SideEpoch> {
    let cpu0 = cpu_seconds();
    let ops0 = granary::io::metadata_ops();
    let t = Instant::now();
    let ds = Arc::new(Dataset::open(&o.packed)?);
    // The window a reader gets by default (`granary read`, Python), not the library's bare
    // default of 8 chunks: the benchmark measures what users run.
    let plan = PlanOptions {
        seed: o.seed,
        window_chunks: ds.window_for_memory(granary::DEFAULT_READER_MEMORY)?,
        ..PlanOptions::default()
    };
    let startup_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let k = o.workers.max(1);
    let results: Vec<granary::Result<WorkerOut>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..k)
            .map(|w| {
                let ds = &ds;
                let plan = &plan;
                s.spawn(move || -> granary::Result<WorkerOut> {
                    let shard = Shard {
                        rank: 0,
                        world_size: 1,
                        worker: w,
                        num_workers: k,
                    };
                    let io = StreamOptions {
                        io_mode: o.io,
                        ..StreamOptions::default()
                    };
                    let st = ds.stream_epoch(plan, epoch, shard, None, &io)?;
                    let mut out = WorkerOut::default();
                    let mut t0 = Instant::now();
                    for sample in st {
                        let sample = sample?;
                        out.add(ds.path(sample.id)?, sample.data(), t0.elapsed());
                        t0 = Instant::now();
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("granary worker"))
            .collect()
    });
    let s = SideEpoch {
        epoch,
        startup_s,
        ..Default::default()
    };
    let mut s = fold(s, results, t, cpu0)?;
    s.metadata_ops = granary::io::metadata_ops() - ops0;
    Ok(s)
}

/// Runs `epochs` epochs of each side, raw first, caches made cold before each as asked.
pub fn run(o: &CompareOptions) -> Result<CompareResult, String> {
    let mut raw_epochs = Vec::new();
    let mut granary_epochs = Vec::new();
    for epoch in 0..o.epochs.max(1) {
        let cold = make_cold_with(o.cold, &[&o.raw, &o.packed]);
        let mut r =
            raw_epoch(o, epoch).map_err(|e| format!("raw side, {}: {e}", o.raw.display()))?;
        r.cold = cold;
        raw_epochs.push(r);
        let cold = make_cold_with(o.cold, &[&o.raw, &o.packed]);
        let mut g = granary_epoch(o, epoch).map_err(|e| format!("granary side: {e}"))?;
        g.cold = cold;
        granary_epochs.push(g);
    }
    let ratios: Vec<f64> = raw_epochs
        .iter()
        .zip(&granary_epochs)
        .map(|(r, g)| g.samples_per_s / r.samples_per_s.max(1e-9))
        .collect();
    let digests_match = raw_epochs
        .iter()
        .zip(&granary_epochs)
        .all(|(r, g)| r.digest == g.digest && r.samples == g.samples);
    let startup_ratio = raw_epochs[0].startup_s / granary_epochs[0].startup_s.max(1e-9);
    let metadata_ratio =
        raw_epochs[0].metadata_ops as f64 / granary_epochs[0].metadata_ops.max(1) as f64;
    Ok(CompareResult {
        raw: o.raw.clone(),
        packed: o.packed.clone(),
        workers: o.workers,
        raw_epochs,
        granary_epochs,
        ratios,
        startup_ratio,
        metadata_ratio,
        digests_match,
    })
}

/// The table printed by `granary bench compare`.
pub fn render(r: &CompareResult) -> String {
    let mut s = format!(
        "raw files {} vs granary {} ({} workers)\n",
        r.raw.display(),
        r.packed.display(),
        r.workers
    );
    s += &format!(
        "  {:<8} {:>5} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>9}\n",
        "side",
        "epoch",
        "startup s",
        "samples/s",
        "MB/s",
        "p50 us",
        "p99 us",
        "meta ops",
        "cpu s",
        "cold",
        "ratio"
    );
    for (i, (raw, g)) in r.raw_epochs.iter().zip(&r.granary_epochs).enumerate() {
        for (name, x, ratio) in [
            ("raw", raw, String::new()),
            ("granary", g, format!("{:.2}x", r.ratios[i])),
        ] {
            s += &format!(
                "  {:<8} {:>5} {:>10.4} {:>10.0} {:>9.1} {:>9.0} {:>10.0} {:>10} {:>10.2} {:>8} {:>9}\n",
                name,
                x.epoch,
                x.startup_s,
                x.samples_per_s,
                x.mb_per_s,
                x.latency_p50_us,
                x.latency_p99_us,
                x.metadata_ops,
                x.cpu_s,
                x.cold.map(|c| format!("{c:?}")).unwrap_or_else(|| "warm".into()),
                ratio
            );
        }
    }
    s += &format!(
        "  start-up {:.1}x faster, {:.0}x fewer metadata operations; digests {}\n",
        r.startup_ratio,
        r.metadata_ratio,
        if r.digests_match {
            "match: both sides delivered the same bytes"
        } else {
            "DIFFER"
        }
    );
    s
}
