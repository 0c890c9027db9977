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
use std::time::{Duration, Instant};

use granary::procstat::cpu_seconds;
use granary::{Dataset, ReaderOptions, Shard};
use granary_format::SplitMix64;
use serde::Serialize;

use crate::cold::{make_cold_with, ColdMethod, ColdMode};
use crate::readbench::{median, on_threads, over_files, percentile, read_whole, timed};

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
    /// Cache states to measure, in order (each runs `epochs` epochs per side).
    pub states: Vec<State>,
    /// Memory limit of each side's process in [`State::Limited`] (a memory cgroup).
    pub memory_limit: Option<u64>,
    /// The executable to run each side in a process of its own (`granary`, whose hidden
    /// `bench compare-side` runs one side's epoch): then every side reports its own peak
    /// RSS, and the limited state can put it in a memory cgroup. `None`: in this process.
    pub side_exe: Option<PathBuf>,
}

granary_format::named_enum! {
    /// The cache state an epoch starts from.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum State ("state") {
        /// Caches made cold before every epoch (as `--cold` says).
        Cold = "cold",
        /// Both trees read once before the first epoch, nothing dropped: everything resident.
        Warm = "warm",
        /// Caches dropped once, then every side's process runs in a memory cgroup of
        /// `--memory-limit` bytes (page cache included), well below the dataset.
        Limited = "limited",
    }
}

impl State {
    /// Parses a comma-separated list of `cold`, `warm`, `limited`.
    pub fn parse_list(s: &str) -> Result<Vec<State>, String> {
        s.split(',').map(|x| State::parse(x.trim())).collect()
    }
}

granary_format::named_enum! {
    /// Which side a process runs.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Side ("side") {
        Raw = "raw",
        Granary = "granary",
    }
}

/// One side of one epoch.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct SideEpoch {
    pub epoch: u64,
    /// The cache state it started from (`None`: cold, from a run without states).
    pub state: Option<State>,
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
    /// CPU seconds the side's workers spent checksumming for the digest: a CRC-32 over every
    /// byte on the raw side (a training loop reading raw files would not spend them); none on
    /// the granary side, whose reader computed each sample's CRC-32 while verifying it.
    #[serde(default)]
    pub check_s: f64,
    /// Peak resident set of the side's process (when it ran in one of its own).
    pub peak_rss_bytes: Option<u64>,
    /// Granary side: bytes of the maps of resident chunks its process kept at the end (page
    /// cache counted in that RSS as file pages, not memory of the reader's own).
    #[serde(default)]
    pub kept_map_bytes: u64,
    /// Peak memory of its cgroup, page cache included (limited state).
    pub cgroup_peak_bytes: Option<u64>,
    /// Warm state: the share of the side's files' pages the page cache held right before the
    /// epoch (`mincore`; this machine pages out what sat idle, so the files are read again
    /// when short of 1).
    #[serde(default)]
    pub resident: Option<f64>,
    /// Warm state, granary side: one CRC-32 pass over the same resident chunk files right
    /// before the epoch (MB/s), each file mapped for the pass (as a first epoch maps it) ...
    #[serde(default)]
    pub ceiling_mb_per_s: Option<f64>,
    /// ... and over maps made and filled before the pass (as later epochs find them kept).
    #[serde(default)]
    pub ceiling_kept_mb_per_s: Option<f64>,
    pub digest: String,
    /// Per-sample wait times in microseconds, sorted (for the latency plot; not in the
    /// report's JSON).
    #[serde(skip_serializing, default)]
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
    /// Warm state: the median of the granary epochs' `ceiling_mb_per_s`.
    pub crc_ceiling_mb_per_s: Option<f64>,
}

/// One CRC-32 pass over the chunk files of `packed` (resident: read just before) with `k`
/// threads, files shared round-robin: what checking every byte of a warm epoch costs at
/// least, without a plan, a shuffle or a copy. Returns (each file mapped, populated and
/// checksummed in the pass; the files mapped and populated before, checksummed in the pass),
/// the best of three passes each (MB/s).
pub fn crc_ceiling(packed: &Path, k: u32) -> Result<(f64, f64), String> {
    let ds = Dataset::open(packed).map_err(|e| e.to_string())?;
    let files: Vec<PathBuf> = (0..ds.chunk_count() as u32)
        .map(|c| ds.chunk_path(c))
        .collect();
    let map = |p: &Path| -> Result<granary_store::file::Mapped, String> {
        let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let m = granary_store::file::map_file(&f, p).map_err(|e| e.to_string())?;
        let _ = m.advise(memmap2::Advice::PopulateRead);
        Ok(m)
    };
    let crc = |m: &[u8]| {
        std::hint::black_box(crc32fast::hash(m));
        Ok(m.len() as u64)
    };
    let maps: Vec<_> = files.iter().map(|p| map(p)).collect::<Result<_, _>>()?;
    let (mut best_made, mut best_kept): (f64, f64) = (0.0, 0.0);
    for _ in 0..3 {
        best_made = best_made.max(timed(|| over_files(&files, k as usize, |p| crc(&map(p)?)))?.0);
        best_kept = best_kept.max(timed(|| over_files(&maps, k as usize, |m| crc(m)))?.0);
    }
    Ok((best_made, best_kept))
}

fn digest_term(path: &[u8], crc: u32) -> u64 {
    SplitMix64::keyed(&[granary_format::path_hash(path), crc as u64]).next_u64()
}

/// What one worker delivered.
#[derive(Default)]
struct WorkerOut {
    samples: u64,
    bytes: u64,
    digest: u64,
    check_s: f64,
    latencies_us: Vec<f64>,
    /// Samples known by id (granary), with their CRC-32: their paths are looked up for the
    /// digest after the clock stopped (a training loop does not look them up).
    by_id: Vec<(u64, u32)>,
    /// File-system metadata calls its reads made (granary: its stream's layers' count).
    metadata_ops: u64,
}

impl WorkerOut {
    /// Counts a sample of `len` bytes delivered after `waited`.
    fn add(&mut self, len: usize, waited: Duration) {
        self.samples += 1;
        self.bytes += len as u64;
        self.latencies_us.push(waited.as_secs_f64() * 1e6);
    }
}

/// Folds the workers' results into `s` and computes rates and percentiles; the paths of
/// samples known by id come from `path` once the clock stopped.
fn fold<E>(
    mut s: SideEpoch,
    workers: Vec<std::thread::Result<Result<WorkerOut, E>>>,
    started: Instant,
    cpu0: f64,
    path: impl Fn(u64) -> Result<Vec<u8>, E>,
) -> Result<SideEpoch, E> {
    s.elapsed_s = started.elapsed().as_secs_f64();
    s.cpu_s = cpu_seconds() - cpu0;
    let (mut lat, mut digest) = (Vec::new(), 0u64);
    for w in workers {
        let w = w.expect("a worker panicked")?;
        s.samples += w.samples;
        s.bytes += w.bytes;
        digest = digest.wrapping_add(w.digest);
        for (id, crc) in w.by_id {
            digest = digest.wrapping_add(digest_term(&path(id)?, crc));
        }
        s.check_s += w.check_s;
        s.metadata_ops += w.metadata_ops;
        lat.extend(w.latencies_us);
    }
    lat.sort_by(f64::total_cmp);
    s.samples_per_s = s.samples as f64 / s.elapsed_s.max(1e-9);
    s.mb_per_s = s.bytes as f64 / 1e6 / s.elapsed_s.max(1e-9);
    s.latency_p50_us = percentile(&lat, 0.5);
    s.latency_p99_us = percentile(&lat, 0.99);
    s.latencies_us = lat;
    s.digest = format!("{digest:016x}");
    Ok(s)
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
            let rel = e.path().strip_prefix(root).expect("below root");
            out.push(rel.as_os_str().as_bytes().to_vec());
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
    let per = files.len().div_ceil(o.workers.max(1) as usize).max(1);
    let results = on_threads(files.chunks(per), |share| -> std::io::Result<_> {
        let mut out = WorkerOut::default();
        let mut buf = Vec::new();
        for rel in share {
            let t0 = Instant::now();
            let mut f = std::fs::File::open(o.raw.join(std::ffi::OsStr::from_bytes(rel)))?;
            let len = f.metadata()?.len();
            buf.clear();
            buf.reserve(len as usize);
            f.read_to_end(&mut buf)?;
            drop(f);
            let waited = t0.elapsed();
            let t1 = Instant::now();
            let crc = crc32fast::hash(&buf);
            out.check_s += t1.elapsed().as_secs_f64();
            out.digest = out.digest.wrapping_add(digest_term(rel, crc));
            out.add(buf.len(), waited);
        }
        Ok(out)
    });
    // Per file: open and fstat (as Python's open() does), on top of the listing.
    let s = SideEpoch {
        epoch,
        startup_s,
        metadata_ops: list_ops + 2 * files.len() as u64,
        ..Default::default()
    };
    fold(s, results, t, cpu0, |_| {
        Err(std::io::Error::other("raw samples have paths"))
    })
}

/// One granary epoch: open the snapshot, plan, stream a chunk-wise epoch with `workers`.
fn granary_epoch(o: &CompareOptions, epoch: u64) -> granary::Result<SideEpoch> {
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let ds = Arc::new(Dataset::open(&o.packed)?);
    // The reader options users get by default (`granary read`, Python).
    let options = ReaderOptions {
        seed: o.seed,
        io: o.io,
        ..ReaderOptions::default()
    };
    let setup = options.open(&ds)?.setup()?;
    let startup_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let k = o.workers.max(1);
    let results = on_threads(0..k, |w| -> granary::Result<_> {
        let shard = Shard {
            rank: 0,
            world_size: 1,
            worker: w,
            num_workers: k,
        };
        let mut st = setup.stream(ds.clone(), epoch, shard, None)?;
        let mut out = WorkerOut::default();
        let mut t0 = Instant::now();
        for sample in st.by_ref() {
            let (sample, waited) = (sample?, t0.elapsed());
            // The CRC-32 the reader verified over the delivered bytes.
            out.by_id.push((sample.id, sample.crc32()));
            out.add(sample.data().len(), waited);
            t0 = Instant::now();
        }
        out.metadata_ops = st.layers().iter().map(|l| l.1.metadata_ops).sum();
        Ok(out)
    });
    let s = SideEpoch {
        epoch,
        startup_s,
        // Opening the snapshot; the workers' reads add theirs.
        metadata_ops: ds.snapshot_reading().metadata_ops,
        ..Default::default()
    };
    let mut s = fold(s, results, t, cpu0, |id| ds.path(id))?;
    s.kept_map_bytes = granary_store::local::kept_map_bytes();
    Ok(s)
}

/// Runs one side's epoch in this process (what the hidden `bench compare-side` does in a
/// process of its own); its peak RSS is this process's.
pub fn run_side(o: &CompareOptions, side: Side, epoch: u64) -> Result<SideEpoch, String> {
    let mut s = match side {
        Side::Raw => raw_epoch(o, epoch).map_err(|e| format!("raw side, {}: {e}", o.raw.display())),
        Side::Granary => granary_epoch(o, epoch).map_err(|e| format!("granary side: {e}")),
    }?;
    s.peak_rss_bytes = granary::procstat::peak_rss_bytes();
    Ok(s)
}

/// What `bench compare-side` prints: the side's epoch with its latencies.
#[derive(Serialize, serde::Deserialize)]
pub struct SideReport {
    pub side: SideEpoch,
    pub latencies_us: Vec<f64>,
}

/// Reads every file under `root` once (to make it resident).
pub(crate) fn warm_up(root: &Path) -> Result<(), String> {
    let mut buf = vec![0u8; 1 << 20];
    let at = |e: &dyn std::fmt::Display| format!("warming {}: {e}", root.display());
    for e in walkdir::WalkDir::new(root) {
        let e = e.map_err(|e| at(&e))?;
        if e.file_type().is_file() {
            read_whole(e.path(), &mut buf).map_err(|e| at(&e))?;
        }
    }
    Ok(())
}

/// The share of the pages of the files under `root` that the page cache holds (`mincore`,
/// weighted by size; no read, no readahead).
pub fn resident_share(root: &Path) -> Result<f64, String> {
    let (mut held, mut total) = (0f64, 0f64);
    for e in walkdir::WalkDir::new(root) {
        let e = e.map_err(|e| e.to_string())?;
        if e.file_type().is_file() {
            let at = |x: std::io::Error| format!("{}: {x}", e.path().display());
            let f = std::fs::File::open(e.path()).map_err(at)?;
            let len = f.metadata().map_err(at)?.len();
            held += granary_store::local::resident_share(&f, len) * len as f64;
            total += len as f64;
        }
    }
    Ok(if total == 0.0 { 1.0 } else { held / total })
}

/// Makes the files under `root` resident for a warm epoch: reads them again while the page
/// cache holds less than all of them (this machine pages out what sat idle), at most three
/// times; returns the share held right before the epoch.
fn ensure_resident(root: &Path) -> Result<f64, String> {
    let mut share = resident_share(root)?;
    for _ in 0..3 {
        if share >= 1.0 {
            break;
        }
        warm_up(root)?;
        share = resident_share(root)?;
    }
    Ok(share)
}

/// Runs one side's epoch in a process of its own (`side_exe`), in a memory cgroup of `limit`
/// bytes when given.
fn side_process(
    o: &CompareOptions,
    exe: &Path,
    side: Side,
    epoch: u64,
    limit: Option<u64>,
) -> Result<SideEpoch, String> {
    let cgroup = limit.map(crate::cgroup::MemoryCgroup::create).transpose()?;
    let mut cmd = match &cgroup {
        // The shell joins the cgroup, then becomes the side's process.
        Some(cg) => {
            let mut c = std::process::Command::new("/bin/sh");
            c.arg("-c")
                .arg("echo $$ > \"$0\" && exec \"$@\"")
                .arg(cg.procs_file())
                .arg(exe);
            c
        }
        None => std::process::Command::new(exe),
    };
    let out = cmd
        .args(["bench", "compare-side", "--side", side.name(), "--raw"])
        .arg(&o.raw)
        .arg("--packed")
        .arg(&o.packed)
        .args(["--workers", &o.workers.to_string()])
        .args(["--epoch", &epoch.to_string()])
        .args(["--seed", &o.seed.to_string(), "--io", o.io.name()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    let peak = cgroup.as_ref().and_then(|c| c.peak_bytes());
    let oom = cgroup.as_ref().is_some_and(|c| c.oom_killed());
    drop(cgroup);
    if !out.status.success() {
        let why = if oom {
            format!(
                "killed by the OOM killer in a {} MB memory cgroup",
                limit.unwrap_or(0) / 1_000_000
            )
        } else {
            format!("exited with {}", out.status)
        };
        return Err(format!("{side:?} side, epoch {epoch}: {why}"));
    }
    let r: SideReport =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{side:?} side's report: {e}"))?;
    let mut s = r.side;
    s.latencies_us = r.latencies_us;
    s.cgroup_peak_bytes = peak;
    Ok(s)
}

/// Runs `epochs` epochs of each side in every state asked for, raw first.
pub fn run(o: &CompareOptions) -> Result<CompareResult, String> {
    let mut raw_epochs = Vec::new();
    let mut granary_epochs = Vec::new();
    let states = if o.states.is_empty() {
        vec![State::Cold]
    } else {
        o.states.clone()
    };
    if states.contains(&State::Limited) && (o.memory_limit.is_none() || o.side_exe.is_none()) {
        return Err(
            "the limited state needs --memory-limit (and runs each side in a process of its own)"
                .into(),
        );
    }
    for &state in &states {
        match state {
            State::Warm => {
                warm_up(&o.raw)?;
                warm_up(&o.packed)?;
            }
            State::Limited => {
                make_cold_with(o.cold, &[&o.raw, &o.packed]);
            }
            State::Cold => {}
        }
        let warm = state == State::Warm;
        for epoch in 0..o.epochs.max(1) {
            let limit = o.memory_limit.filter(|_| state == State::Limited);
            let one = |side, dir: &Path| -> Result<SideEpoch, String> {
                let cold = (state == State::Cold)
                    .then(|| make_cold_with(o.cold, &[&o.raw, &o.packed]))
                    .flatten();
                // The ceiling first: the residency check is the last thing before the epoch.
                let ceiling = (warm && side == Side::Granary)
                    .then(|| crc_ceiling(&o.packed, o.workers))
                    .transpose()?;
                let resident = warm.then(|| ensure_resident(dir)).transpose()?;
                let mut s = match &o.side_exe {
                    Some(exe) => side_process(o, exe, side, epoch, limit)?,
                    None => run_side(o, side, epoch)?,
                };
                s.cold = cold;
                s.state = Some(state);
                s.resident = resident;
                s.ceiling_mb_per_s = ceiling.map(|c| c.0);
                s.ceiling_kept_mb_per_s = ceiling.map(|c| c.1);
                Ok(s)
            };
            raw_epochs.push(one(Side::Raw, &o.raw)?);
            granary_epochs.push(one(Side::Granary, &o.packed)?);
        }
    }
    let ceilings: Vec<f64> = granary_epochs
        .iter()
        .filter_map(|g| g.ceiling_mb_per_s)
        .collect();
    let pairs = || raw_epochs.iter().zip(&granary_epochs);
    let (raw0, granary0) = (&raw_epochs[0], &granary_epochs[0]);
    Ok(CompareResult {
        raw: o.raw.clone(),
        packed: o.packed.clone(),
        workers: o.workers,
        ratios: pairs()
            .map(|(r, g)| g.samples_per_s / r.samples_per_s.max(1e-9))
            .collect(),
        startup_ratio: raw0.startup_s / granary0.startup_s.max(1e-9),
        metadata_ratio: raw0.metadata_ops as f64 / granary0.metadata_ops.max(1) as f64,
        digests_match: pairs().all(|(r, g)| r.digest == g.digest && r.samples == g.samples),
        crc_ceiling_mb_per_s: (!ceilings.is_empty()).then(|| median(&ceilings)),
        raw_epochs,
        granary_epochs,
    })
}

/// The columns of `render`'s table and their widths (the first two left-aligned).
const COLUMNS: &str = "side|state|epoch|startup s|samples/s|MB/s|p50 us|p99 us|meta ops|cpu s|\
                       check s|cpu s/GB|peak RSS|cold|ratio";
const WIDTHS: [usize; 15] = [8, 8, 5, 10, 10, 9, 9, 10, 10, 10, 8, 9, 22, 8, 9];

/// One line of `render`'s table: a cell per column.
fn table_line(cells: impl IntoIterator<Item = String>) -> String {
    let mut s = String::from(" ");
    for (i, (cell, w)) in cells.into_iter().zip(WIDTHS).enumerate() {
        s += &if i < 2 {
            format!(" {cell:<w$}")
        } else {
            format!(" {cell:>w$}")
        };
    }
    s + "\n"
}

/// The table printed by `granary bench compare`.
pub fn render(r: &CompareResult) -> String {
    let mut s = format!(
        "raw files {} vs granary {} ({} workers)\n",
        r.raw.display(),
        r.packed.display(),
        r.workers
    );
    s += &table_line(COLUMNS.split('|').map(String::from));
    for (i, (raw, g)) in r.raw_epochs.iter().zip(&r.granary_epochs).enumerate() {
        for (name, x, ratio) in [
            ("raw", raw, String::new()),
            ("granary", g, format!("{:.2}x", r.ratios[i])),
        ] {
            let rss = x
                .peak_rss_bytes
                .map(|b| format!("{:.0} MB", b as f64 / 1e6))
                .unwrap_or_else(|| "-".into());
            // Kept maps are page cache in the RSS: say how much of it.
            let rss = match x.kept_map_bytes {
                0 => rss,
                k => format!("{rss} ({:.0} maps)", k as f64 / 1e6),
            };
            s += &table_line([
                name.into(),
                x.state.unwrap_or(State::Cold).name().into(),
                x.epoch.to_string(),
                format!("{:.4}", x.startup_s),
                format!("{:.0}", x.samples_per_s),
                format!("{:.1}", x.mb_per_s),
                format!("{:.0}", x.latency_p50_us),
                format!("{:.0}", x.latency_p99_us),
                x.metadata_ops.to_string(),
                format!("{:.2}", x.cpu_s),
                format!("{:.2}", x.check_s),
                format!("{:.2}", x.cpu_s / (x.bytes as f64 / 1e9).max(1e-12)),
                rss,
                match (x.resident, x.cold) {
                    (Some(share), _) => format!("res {:.0}%", share * 100.0),
                    (None, Some(c)) => format!("{c:?}"),
                    (None, None) => "none".into(),
                },
                ratio,
            ]);
        }
    }
    let warm: Vec<(f64, f64, f64)> = r
        .granary_epochs
        .iter()
        .filter_map(|g| Some((g.ceiling_mb_per_s?, g.ceiling_kept_mb_per_s?, g.mb_per_s)))
        .collect();
    if !warm.is_empty() {
        let each = |f: &dyn Fn(&(f64, f64, f64)) -> String| -> String {
            warm.iter().map(f).collect::<Vec<_>>().join(" / ")
        };
        s += &format!(
            "  memory ceiling: one CRC-32 pass over the resident chunk files with {} threads, measured before each warm epoch: {} MB/s mapping each file in the pass ({} MB/s over maps made before); granary's warm epochs (a process each) reach {} of it ({})\n",
            r.workers,
            each(&|(c, _, _)| format!("{c:.0}")),
            each(&|(_, c, _)| format!("{c:.0}")),
            each(&|(c, _, g)| format!("{:.2}x", g / c.max(1e-9))),
            each(&|(_, c, g)| format!("{:.2}x", g / c.max(1e-9)))
        );
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
