//! `granary bench read`: granary's chunk-wise epoch against a direct large sequential read of
//! the same chunk files (and fio when installed), each with the page cache dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use granary::io::{Engine, IoKind, Request};
use granary::{Dataset, PlanOptions, ShuffleMode, StreamOptions};
use serde::Serialize;

use crate::cold::{make_cold, ColdMethod};
use granary::procstat::cpu_seconds;

/// What `granary bench read` measures.
#[derive(Clone, Debug)]
pub struct ReadBenchOptions {
    pub dataset: PathBuf,
    pub workers: u32,
    pub window_chunks: usize,
    pub queue_depth: usize,
    pub repeat: usize,
}

/// One measured side.
#[derive(Serialize, Clone, Debug)]
pub struct Side {
    pub name: String,
    /// MB/s of every run.
    pub runs_mb_per_s: Vec<f64>,
    pub median_mb_per_s: f64,
    pub samples_per_s: f64,
    /// CPU seconds per GB delivered (this process; not measured for fio).
    pub cpu_s_per_gb: Option<f64>,
    /// Median over the device's sequential bandwidth measured in the same run (fio's median
    /// when fio is installed, else the direct sequential read's).
    pub vs_device: f64,
}

/// The whole comparison.
#[derive(Serialize, Clone, Debug)]
pub struct ReadBenchResult {
    pub dataset: PathBuf,
    pub samples: u64,
    pub chunk_bytes: u64,
    pub cold: ColdMethod,
    pub workers: u32,
    pub window_chunks: usize,
    pub queue_depth: usize,
    pub sides: Vec<Side>,
    /// The defaults' median over the page-cache fill's: how close a first epoch that fills
    /// the page cache comes to what filling it costs.
    pub defaults_vs_page_cache: f64,
}

/// Reads every chunk file whole, in id order, O_DIRECT, `qd` reads in flight: the device's
/// sequential bandwidth through the same engine, with no plan, decode or checks.
fn sequential_baseline(files: &[(PathBuf, u64)], qd: usize) -> Result<(f64, f64), String> {
    let mut engine = Engine::new(IoKind::Uring, qd, 256 << 20).map_err(|e| e.to_string())?;
    timed(|| -> granary::Result<_> {
        let mut total = 0u64;
        // One file per batch, one batch queued ahead: the engine keeps the queue full across files.
        let mut pending = std::collections::VecDeque::new();
        let opener = granary::Opener::plain(granary::IoMode::Direct);
        for (p, len) in files {
            let req = Request {
                source: Arc::new(opener.open(p, None)?),
                offset: 0,
                len: *len as usize,
                expect: Default::default(),
            };
            pending.push_back(engine.submit(vec![req].into()));
            if pending.len() > 2 {
                for b in engine.wait(pending.pop_front().expect("non-empty"))? {
                    total += b.data().len() as u64;
                }
            }
        }
        while let Some(t) = pending.pop_front() {
            for b in engine.wait(t)? {
                total += b.data().len() as u64;
            }
        }
        Ok(total)
    })
    .map_err(|e| e.to_string())
}

/// MB/s and CPU seconds per GB of `work`, which returns the bytes it read.
pub(crate) fn timed<E>(work: impl FnOnce() -> Result<u64, E>) -> Result<(f64, f64), E> {
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let total = work()? as f64;
    let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    Ok((total / 1e6 / secs, cpu / (total / 1e9)))
}

/// Reads the file at `p` to its end in reads of `buf`'s size; the bytes read.
pub(crate) fn read_whole(p: &Path, buf: &mut [u8]) -> std::io::Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(p)?;
    let mut n = 0u64;
    loop {
        match f.read(buf)? {
            0 => return Ok(n),
            k => n += k as u64,
        }
    }
}

/// Streams of the page-cache reference ([`page_cache_fill`]).
pub const PAGE_CACHE_STREAMS: usize = 2;

/// Reads every chunk file whole through the page cache, front to back in 1 MiB `read`s,
/// [`PAGE_CACHE_STREAMS`] files at a time, with plain `std::fs` (no granary engine, no
/// checks): what filling the page cache with the dataset costs on this machine, the ceiling
/// of a first epoch that leaves the dataset resident. MB/s and CPU seconds per GB.
fn page_cache_fill(files: &[(PathBuf, u64)]) -> Result<(f64, f64), String> {
    timed(|| {
        over_files(files, PAGE_CACHE_STREAMS, |(p, _)| {
            let mut buf = vec![0u8; 1 << 20];
            read_whole(p, &mut buf).map_err(|e| format!("{}: {e}", p.display()))
        })
    })
}

/// Runs `work` over each of `shares` on a thread of its own; the results in order (`Err`: the
/// thread panicked).
pub(crate) fn on_threads<S: Send, T: Send>(
    shares: impl Iterator<Item = S>,
    work: impl Fn(S) -> T + Sync,
) -> Vec<std::thread::Result<T>> {
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> = shares.map(|x| s.spawn(move || work(x))).collect();
        handles.into_iter().map(|h| h.join()).collect()
    })
}

/// Runs `per_file` over `files` (paths, or anything standing for a file) on `k` threads
/// (thread `w` takes files `w`, `w + k`, ...): the sum of what it returns, or the first error.
pub(crate) fn over_files<P: Sync>(
    files: &[P],
    k: usize,
    per_file: impl Fn(&P) -> Result<u64, String> + Sync,
) -> Result<u64, String> {
    let k = k.max(1);
    let sums = on_threads(0..k, |w| -> Result<u64, String> {
        files.iter().skip(w).step_by(k).map(&per_file).sum()
    });
    let panicked = |_| "a reading thread panicked".to_string();
    sums.into_iter().map(|r| r.map_err(panicked)?).sum()
}

/// Queue depth of the deep fio reference: enough to reach the device's sequential bandwidth.
pub const FIO_DEPTH: usize = 32;

/// fio, sequential 4 MiB O_DIRECT reads through io_uring at depth `depth`, over the
/// chunk files one after another (as many as fio's 4096-byte file list holds); `None` when fio
/// is not installed or fails.
fn fio(dir: &Path, files: &[(PathBuf, u64)], depth: usize) -> Option<f64> {
    let mut list = String::new();
    for (p, _) in files {
        let name = p.file_name()?.to_str()?;
        if list.len() + name.len() + 1 > 4000 {
            break;
        }
        if !list.is_empty() {
            list.push(':');
        }
        list.push_str(name);
    }
    let out = Command::new("fio")
        .args([
            "--name=seq",
            "--readonly",
            "--rw=read",
            "--bs=4M",
            "--ioengine=io_uring",
            "--direct=1",
        ])
        .arg(format!("--iodepth={depth}"))
        .arg("--file_service_type=sequential")
        .arg(format!("--directory={}", dir.display()))
        .arg(format!("--filename={list}"))
        .arg("--output-format=json")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let bw = v["jobs"][0]["read"]["bw_bytes"].as_f64()?;
    Some(bw / 1e6)
}

/// The value at quantile `q` of `sorted` (the nearest rank), 0 for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        0.0
    } else {
        sorted[((sorted.len() - 1) as f64 * q).round() as usize]
    }
}

/// The middle value (the upper one of an even count), 0 for none.
pub(crate) fn median<T: std::borrow::Borrow<f64>>(v: impl IntoIterator<Item = T>) -> f64 {
    let mut v: Vec<f64> = v.into_iter().map(|x| *x.borrow()).collect();
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// What one side of `granary bench read` reads.
enum Reading {
    /// [`sequential_baseline`].
    Sequential,
    /// [`page_cache_fill`].
    PageCache,
    /// [`fio`] at this depth.
    Fio(usize),
    /// A granary epoch: its shuffle, I/O backend and I/O mode.
    Granary(ShuffleMode, IoKind, granary::IoMode),
}

/// Runs every side `repeat` times, interleaved, each after dropping the page cache.
pub fn run(o: &ReadBenchOptions) -> Result<ReadBenchResult, String> {
    let ds = Arc::new(Dataset::open(&o.dataset).map_err(|e| e.to_string())?);
    let files = (0..ds.chunk_count() as u32)
        .map(|c| Ok((ds.chunk_path(c), ds.chunk(c)?.file_size)))
        .collect::<granary::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    let chunk_bytes: u64 = files.iter().map(|f| f.1).sum();
    let dir: &Path = ds.dir();
    // The buffer budget of `window_chunks` at the reader's rule (three windows in memory).
    let mean_chunk = chunk_bytes / files.len().max(1) as u64;
    use granary::IoMode::{Auto, Direct};
    use Reading::*;
    use ShuffleMode::{Chunkwise, Global};
    let fio_name = |depth| format!("fio sequential 4 MiB O_DIRECT io_uring, depth {depth}");
    // The references first (fio at the reader's depth where that is not the deep one's).
    let sequential = "direct sequential read of the chunk files (granary engine, no plan)";
    let fill = "page-cache fill: chunk files read whole, 1 MiB reads,";
    let mut sides = vec![
        (sequential.to_string(), Sequential),
        (format!("{fill} {PAGE_CACHE_STREAMS} at a time"), PageCache),
        (fio_name(FIO_DEPTH), Fio(FIO_DEPTH)),
    ];
    if o.queue_depth != FIO_DEPTH {
        let name = fio_name(o.queue_depth) + " (granary's)";
        sides.push((name, Fio(o.queue_depth)));
    }
    // The device's side of reading: O_DIRECT, as fio reads; and what a user gets without
    // options (auto: through the page cache for a dataset that fits in memory, O_DIRECT for
    // the chunks beyond the page-cache budget), first of granary's sides.
    let defaults = sides.len();
    let names = [
        "(defaults: chunkwise, --io auto, backend auto)",
        "--shuffle chunkwise --io direct (io_uring)",
        "--shuffle chunkwise --io direct (pread)",
        "--shuffle global --io direct (io_uring)",
    ];
    let readings = [
        Granary(Chunkwise, IoKind::Auto, Auto),
        Granary(Chunkwise, IoKind::Uring, Direct),
        Granary(Chunkwise, IoKind::Pread, Direct),
        Granary(Global, IoKind::Uring, Direct),
    ];
    let names = names.map(|n| format!("granary read {n}"));
    sides.extend(names.into_iter().zip(readings));
    // Per side: MB/s, samples/s (granary's sides) and CPU seconds per GB (not fio's).
    let mut runs = vec![(Vec::new(), Vec::new(), Vec::new()); sides.len()];
    let mut cold = ColdMethod::None;
    for rep in 0..o.repeat.max(1) {
        for ((_, reading), (mb, per_s, cpu)) in sides.iter().zip(&mut runs) {
            cold = make_cold(&[dir]);
            let (m, c) = match *reading {
                Sequential => sequential_baseline(&files, o.queue_depth)?,
                PageCache => page_cache_fill(&files)?,
                Fio(depth) => {
                    mb.extend(fio(dir, &files, depth));
                    continue;
                }
                Granary(mode, io, io_mode) => {
                    let setup = granary::EpochSetup {
                        plan: PlanOptions {
                            mode,
                            seed: 1,
                            window_chunks: o.window_chunks,
                            ..PlanOptions::default()
                        },
                        sampling: None,
                        stream: StreamOptions {
                            io,
                            io_mode,
                            queue_depth: o.queue_depth,
                            memory: (3 * o.window_chunks as u64 * mean_chunk)
                                .max(granary::DEFAULT_READER_MEMORY),
                            ..StreamOptions::default()
                        },
                    };
                    let r = granary::measure_epoch(&ds, &setup, rep as u64, 0, 1, o.workers)
                        .map_err(|e| e.to_string())?;
                    per_s.push(r.samples_per_s);
                    (r.mb_per_s, r.cpu_s / (r.bytes as f64 / 1e9))
                }
            };
            mb.push(m);
            cpu.push(c);
        }
    }
    // The device's bandwidth: the faster of fio and the engine's plain sequential read. fio's
    // buffers are ordinary pages, and a direct read into scattered pages reaches the device
    // as requests of ~1 MiB (virtio-blk's 254 segments), while the engine's huge-page
    // buffers send whole 4 MiB requests. Neither side is the ceiling alone.
    let base = median(&runs[0].0).max(median(&runs[2].0));
    let defaults_vs_page_cache = median(&runs[defaults].0) / median(&runs[1].0);
    let sides = sides
        .into_iter()
        .zip(runs)
        .filter(|(_, r)| !r.0.is_empty())
        .map(|((name, _), (mb, per_s, cpu))| {
            let m = median(&mb);
            Side {
                name,
                median_mb_per_s: m,
                runs_mb_per_s: mb,
                samples_per_s: median(&per_s),
                cpu_s_per_gb: (!cpu.is_empty()).then(|| median(&cpu)),
                vs_device: m / base,
            }
        })
        .collect();
    Ok(ReadBenchResult {
        dataset: o.dataset.clone(),
        samples: ds.len(),
        chunk_bytes,
        cold,
        workers: o.workers,
        window_chunks: o.window_chunks,
        queue_depth: o.queue_depth,
        sides,
        defaults_vs_page_cache,
    })
}

/// The table printed by `granary bench read`.
pub fn render(r: &ReadBenchResult) -> String {
    let mut s = format!(
        "read benchmark on {} ({} samples, {:.2} GB of chunks), caches made cold by {:?}, {} worker(s), window {} chunks, queue depth {}\n",
        r.dataset.display(),
        r.samples,
        r.chunk_bytes as f64 / 1e9,
        r.cold,
        r.workers,
        r.window_chunks,
        r.queue_depth
    );
    s += "  (vs dev: median MB/s over the device's sequential bandwidth measured in the same run:\n   the faster of fio depth 32 and the engine's direct sequential read of the chunk files)\n";
    s += &format!(
        "  {:<72} {:>9} {:>11} {:>9} {:>8}\n",
        "side", "MB/s", "samples/s", "CPU s/GB", "vs dev"
    );
    for x in &r.sides {
        let runs: Vec<String> = x.runs_mb_per_s.iter().map(|v| format!("{v:.0}")).collect();
        s += &format!(
            "  {:<72} {:>9.0} {:>11} {:>9} {:>7.2}x   runs {}\n",
            x.name,
            x.median_mb_per_s,
            if x.samples_per_s > 0.0 {
                format!("{:.0}", x.samples_per_s)
            } else {
                "-".into()
            },
            x.cpu_s_per_gb
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "-".into()),
            x.vs_device,
            runs.join("/")
        );
    }
    s += &format!(
        "  defaults over the page-cache fill: {:.2}x (a first epoch through the page cache cannot beat filling it)\n",
        r.defaults_vs_page_cache
    );
    s
}
