//! Tier-hit throughput (`granary bench hits DATASET --tier-dir DIR`): N reader processes
//! (`granary read`, the interface users call) stream an epoch each from a local tier that
//! holds every chunk, against the same N processes streaming the same chunks from the page
//! cache with no tier. Both sides read resident bytes through the same reader, so the ratio is
//! what a tier hit costs on top of a page-cache read: lookups, locks, index upkeep.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use granary::{Dataset, LocalTier, TierPolicy};

use crate::readbench::median;
use serde::Serialize;

/// What to run.
#[derive(Clone, Debug)]
pub struct HitBenchOptions {
    pub dataset: PathBuf,
    /// Root of the benchmark's tier (its dataset sub-directory is emptied first).
    pub dir: PathBuf,
    /// Process counts, e.g. 1, 2, 4, 8.
    pub processes: Vec<u32>,
    /// Epochs each process reads.
    pub epochs: u64,
    /// Runs per side and count; the median is reported.
    pub repeat: u32,
    /// The granary executable whose `read` the processes run.
    pub exe: PathBuf,
}

/// One side at one process count: medians over the repeats.
#[derive(Clone, Debug, Serialize)]
pub struct HitSide {
    /// Bytes delivered by all processes together per second, MB/s.
    pub mb_per_s: f64,
    pub samples_per_s: f64,
    /// Wall time from starting the first process to the end of the last, seconds.
    pub wall_s: f64,
    /// Share of bytes the tier served (1.0 on the tier side: every read a hit).
    pub byte_hit_ratio: Option<f64>,
}

/// One process count.
#[derive(Clone, Debug, Serialize)]
pub struct HitRow {
    pub processes: u32,
    pub tier: HitSide,
    pub page_cache: HitSide,
    /// tier MB/s / page-cache MB/s.
    pub ratio: f64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct HitBenchResult {
    pub dataset: PathBuf,
    pub dataset_bytes: u64,
    pub chunks: u64,
    pub epochs: u64,
    pub rows: Vec<HitRow>,
}

/// Runs `n` `granary read DATASET --json` processes at once (seeds 0..n, so their orders
/// differ), with `extra` arguments.
fn run_group(o: &HitBenchOptions, n: u32, extra: &[std::ffi::OsString]) -> Result<HitSide, String> {
    let start = Instant::now();
    let children = (0..n)
        .map(|i| {
            Command::new(&o.exe)
                .arg("read")
                .arg(&o.dataset)
                .args(["--json", "--seed", &i.to_string()])
                .args(["--epochs", &o.epochs.to_string()])
                .args(extra)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("starting {}: {e}", o.exe.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outs: Vec<_> = children.into_iter().map(|c| c.wait_with_output()).collect();
    let wall = start.elapsed().as_secs_f64();
    let (mut bytes, mut samples, mut hit_bytes) = (0u64, 0u64, 0f64);
    let mut all_hits = true;
    for (i, out) in outs.into_iter().enumerate() {
        let out = out.map_err(|e| format!("waiting for reader process {i}: {e}"))?;
        if !out.status.success() {
            return Err(format!("reader process {i} exited with {}", out.status));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("reader process {i}'s report: {e}"))?;
        for epoch in v.as_array().ok_or("a reader's report is not a list")? {
            let field = |k: &str| epoch.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            bytes += field("bytes");
            samples += field("samples");
            match epoch.get("cache_byte_hit_ratio").and_then(|x| x.as_f64()) {
                Some(r) => hit_bytes += r * field("bytes") as f64,
                None => all_hits = false,
            }
        }
    }
    Ok(HitSide {
        mb_per_s: bytes as f64 / wall / 1e6,
        samples_per_s: samples as f64 / wall,
        wall_s: wall,
        byte_hit_ratio: all_hits.then(|| hit_bytes / bytes.max(1) as f64),
    })
}

/// Fills the tier with every chunk, warms both copies, then measures every process count.
pub fn run(o: &HitBenchOptions) -> Result<HitBenchResult, String> {
    let ds = Dataset::open(&o.dataset).map_err(|e| e.to_string())?;
    let chunks = ds.chunk_count();
    let total = ds.total_chunk_bytes().map_err(|e| e.to_string())?;
    let quota = total + total / 10 + (64 << 20);
    let id = ds.snapshot().dataset_id();
    let tier = LocalTier::open(&o.dir, id, quota, TierPolicy::Static).map_err(|e| e.to_string())?;
    tier.clear().map_err(|e| e.to_string())?;
    let mut tier_args: Vec<std::ffi::OsString> = vec!["--cache-dir".into(), o.dir.clone().into()];
    tier_args.extend(["--cache-size", &quota.to_string(), "--policy", "static"].map(Into::into));
    // Every chunk copied in (admission during epochs is best-effort: it drops offers while
    // busy, so one epoch does not fill a tier).
    for c in 0..chunks as u32 {
        let ce = ds.chunk(c).map_err(|e| e.to_string())?;
        let path = ds.chunk_path(c);
        let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if !tier.admit(&ce, &bytes, 1.0).map_err(|e| e.to_string())? {
            return Err(format!("the tier declined chunk {c} (quota {quota} bytes)"));
        }
    }
    let mut rows = Vec::new();
    for &n in &o.processes {
        let mut sides: [Vec<HitSide>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..o.repeat.max(1) {
            // Alternating sides spreads any drift of the machine over both.
            // Each side's files are read once just before (this machine's page cache sheds
            // pages over time): both sides start resident.
            for (k, extra) in [&tier_args[..], &[]].into_iter().enumerate() {
                let dir = if k == 0 { tier.dir() } else { &o.dataset };
                crate::compare::warm_up(dir)?;
                sides[k].push(run_group(o, n, extra)?);
            }
        }
        let side = |runs: &[HitSide]| HitSide {
            mb_per_s: median(runs.iter().map(|r| r.mb_per_s)),
            samples_per_s: median(runs.iter().map(|r| r.samples_per_s)),
            wall_s: median(runs.iter().map(|r| r.wall_s)),
            byte_hit_ratio: runs
                .iter()
                .try_fold(1f64, |m, r| Some(m.min(r.byte_hit_ratio?))),
        };
        let (t, p) = (side(&sides[0]), side(&sides[1]));
        if let Some(h) = t.byte_hit_ratio.filter(|&h| h < 1.0) {
            let served = format!("{:.1} % of the bytes", h * 100.0);
            return Err(format!("with {n} processes the tier served only {served}"));
        }
        rows.push(HitRow {
            processes: n,
            ratio: t.mb_per_s / p.mb_per_s.max(1e-9),
            tier: t,
            page_cache: p,
        });
    }
    Ok(HitBenchResult {
        dataset: o.dataset.clone(),
        dataset_bytes: total,
        chunks,
        epochs: o.epochs,
        rows,
    })
}

/// A table of the rows.
pub fn render(r: &HitBenchResult) -> String {
    let mut s = format!(
        "tier hits: {} chunks, {:.1} MB, every process reads {} whole epochs (aggregate MB/s)\n\
         processes | tier MB/s | page cache MB/s | tier / page cache\n",
        r.chunks,
        r.dataset_bytes as f64 / 1e6,
        r.epochs
    );
    for row in &r.rows {
        s += &format!(
            "{:>9} | {:>9.0} | {:>15.0} | {:>6.2}x\n",
            row.processes, row.tier.mb_per_s, row.page_cache.mb_per_s, row.ratio
        );
    }
    s
}
