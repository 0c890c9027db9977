//! `granary bench pack`: packing throughput against `tar -cf - SRC | cat >/dev/null` on the
//! same tree, caches made cold before each run; then snapshot open time and path lookup time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use granary_packer::{PackOptions, SplitMix64};
use serde::Serialize;

use crate::cold::{make_cold, ColdMethod};
use crate::readbench::{median, percentile};

/// What to measure.
#[derive(Clone, Debug)]
pub struct PackBenchOptions {
    /// Tree to pack.
    pub src: PathBuf,
    /// Where the packed dataset is written (replaced if it exists).
    pub out: PathBuf,
    /// Packer options other than src/out (compression, chunk size, ...).
    pub template: PackOptions,
    /// Number of random paths looked up.
    pub lookups: u64,
    /// Runs per side (alternating tar, granary); medians are reported.
    pub repeat: usize,
}

/// Side-by-side numbers from one run.
#[derive(Clone, Debug, Serialize)]
pub struct PackBenchResult {
    pub files: u64,
    pub bytes: u64,
    pub cold: ColdMethod,
    pub repeat: usize,
    /// Seconds of every run, in run order.
    pub tar_runs_s: Vec<f64>,
    pub granary_runs_s: Vec<f64>,
    /// Medians of the runs.
    pub tar_s: f64,
    pub tar_files_per_s: f64,
    pub granary_s: f64,
    pub granary_files_per_s: f64,
    pub granary_mb_per_s: f64,
    /// granary's speed over tar's (> 1: granary is faster).
    pub speed_ratio: f64,
    pub chunks: u64,
    pub snapshot_bytes: u64,
    pub open_cold_ms: f64,
    pub open_warm_median_us: f64,
    pub lookup_median_ns: f64,
    pub lookup_p99_ns: f64,
}

/// Runs tar then granary on `opts.src`, cold each time, then times snapshot open and lookups.
pub fn run(opts: &PackBenchOptions) -> Result<PackBenchResult, String> {
    let src =
        std::fs::canonicalize(&opts.src).map_err(|e| format!("{}: {e}", opts.src.display()))?;
    let (parent, name) = match (src.parent(), src.file_name()) {
        (Some(p), Some(n)) => (p.to_path_buf(), n.to_os_string()),
        _ => return Err(format!("{} has no parent directory", src.display())),
    };

    check_out(&src, &opts.out)?;
    let mut tar_runs_s = Vec::new();
    let mut granary_runs_s = Vec::new();
    let mut cold = ColdMethod::None;
    let mut summary = None;
    for _ in 0..opts.repeat.max(1) {
        cold = make_cold(&[&src]);
        let t = Instant::now();
        let status = Command::new("sh")
            .arg("-c")
            .arg("tar -cf - -C \"$1\" \"$2\" | cat > /dev/null")
            .arg("sh")
            .arg(&parent)
            .arg(&name)
            .status()
            .map_err(|e| format!("running tar: {e}"))?;
        tar_runs_s.push(t.elapsed().as_secs_f64());
        if !status.success() {
            return Err(format!("tar failed: {status}"));
        }

        if opts.out.exists() {
            std::fs::remove_dir_all(&opts.out)
                .map_err(|e| format!("{}: {e}", opts.out.display()))?;
        }
        let mut po = opts.template.clone();
        po.src = src.clone();
        po.output.out = opts.out.clone();
        make_cold(&[&src]);
        let t = Instant::now();
        summary = Some(granary_packer::pack(&po).map_err(|e| e.to_string())?);
        granary_runs_s.push(t.elapsed().as_secs_f64());
    }
    let s = summary.expect("at least one run");
    let tar_s = median(&tar_runs_s);
    let granary_s = median(&granary_runs_s);

    let snapshot = opts.out.join(granary_format::SNAPSHOT_FILE);
    let snapshot_bytes = std::fs::metadata(&snapshot).map(|m| m.len()).unwrap_or(0);
    make_cold(&[&opts.out]);
    let t = Instant::now();
    let ds = granary::Dataset::open(&opts.out).map_err(|e| e.to_string())?;
    let open_cold_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(ds);
    let opens: Vec<f64> = (0..200)
        .map(|_| {
            let t = Instant::now();
            let _ds = granary::Dataset::open(&opts.out);
            t.elapsed().as_secs_f64() * 1e6 // before the dataset is dropped
        })
        .collect();
    let ds = granary::Dataset::open(&opts.out).map_err(|e| e.to_string())?;
    ds.prefetch_metadata();
    let (lookup_median_ns, lookup_p99_ns) = time_lookups(&ds, opts.lookups)?;

    Ok(PackBenchResult {
        files: s.files,
        bytes: s.bytes_in,
        cold,
        repeat: tar_runs_s.len(),
        tar_runs_s,
        granary_runs_s,
        tar_s,
        tar_files_per_s: s.files as f64 / tar_s,
        granary_s,
        granary_files_per_s: s.files as f64 / granary_s,
        granary_mb_per_s: s.bytes_in as f64 / 1e6 / granary_s,
        speed_ratio: tar_s / granary_s,
        chunks: s.chunks,
        snapshot_bytes,
        open_cold_ms,
        open_warm_median_us: median(&opens),
        lookup_median_ns,
        lookup_p99_ns,
    })
}

/// Looks up `n` random existing paths in batches of 256; returns the median and 99th percentile
/// of the per-lookup time of each batch (timer overhead amortised over the batch). One untimed
/// pass first, so that page faults of the freshly opened snapshot are not counted.
fn time_lookups(ds: &granary::Dataset, n: u64) -> Result<(f64, f64), String> {
    if ds.is_empty() || n == 0 {
        return Ok((0.0, 0.0));
    }
    let mut r = SplitMix64::new(7);
    let paths: Vec<Vec<u8>> = (0..n)
        .map(|_| ds.path(r.below(ds.len())).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for p in &paths {
        ds.lookup(p).map_err(|e| e.to_string())?;
    }
    const BATCH: usize = 256;
    let mut per: Vec<f64> = Vec::new();
    let mut found = 0u64;
    for b in paths.chunks(BATCH) {
        let t = Instant::now();
        for p in b {
            found += ds.lookup(p).map_err(|e| e.to_string())?.is_some() as u64;
        }
        per.push(t.elapsed().as_secs_f64() * 1e9 / b.len() as f64);
    }
    if found != n {
        return Err(format!("only {found} of {n} lookups found their path"));
    }
    per.sort_by(f64::total_cmp);
    Ok((percentile(&per, 0.5), percentile(&per, 0.99)))
}

fn runs(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join("/")
}

/// `bench pack` removes OUT before every run, so OUT must be a new path or a granary dataset
/// (a directory holding a snapshot), and neither the source, inside it nor holding it.
fn check_out(src: &Path, out: &Path) -> Result<(), String> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let resolved = std::fs::canonicalize(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?
        .join(out.file_name().unwrap_or_default());
    if resolved.starts_with(src) || src.starts_with(&resolved) {
        return Err(format!(
            "{} is the source {}, lies inside it or holds it: bench pack replaces -o on every \
             run; choose a path outside the source",
            out.display(),
            src.display()
        ));
    }
    if out.exists() && !out.join(granary_format::SNAPSHOT_FILE).is_file() {
        return Err(format!(
            "{} exists and is not a granary dataset: bench pack replaces -o on every run, so \
             it must be a new path or a dataset",
            out.display()
        ));
    }
    Ok(())
}

/// Renders the result as the table printed by `granary bench pack`.
pub fn render(r: &PackBenchResult, src: &Path) -> String {
    format!(
        "pack benchmark on {} ({} files, {:.1} MB), caches made cold by {:?}, median of {} runs\n\
         \x20 tar -cf - | cat >/dev/null  {:>8.2} s  {:>10.0} files/s   runs {}\n\
         \x20 granary pack                {:>8.2} s  {:>10.0} files/s   runs {}  {:.1} MB/s, {} chunks\n\
         \x20 granary / tar speed ratio   {:>8.2}x\n\
         \x20 snapshot {} bytes: open cold {:.2} ms, warm median {:.1} us\n\
         \x20 path lookup (warm): median {:.0} ns, p99 {:.0} ns (per lookup, batches of 256)\n",
        src.display(),
        r.files,
        r.bytes as f64 / 1e6,
        r.cold,
        r.repeat,
        r.tar_s,
        r.tar_files_per_s,
        runs(&r.tar_runs_s),
        r.granary_s,
        r.granary_files_per_s,
        runs(&r.granary_runs_s),
        r.granary_mb_per_s,
        r.chunks,
        r.speed_ratio,
        r.snapshot_bytes,
        r.open_cold_ms,
        r.open_warm_median_us,
        r.lookup_median_ns,
        r.lookup_p99_ns
    )
}
