//! The granary packer: turns a directory of small files into a dataset of large chunk files
//! plus one metadata snapshot (format: `format-spec/SPEC.md`).
//!
//! Pipeline: scan (walk or file list, parallel stat) → plan (labels, seeded order, chunk
//! assignment; saved to disk) → parallel read/CRC/compress of one chunk's files (rayon) → one
//! ordered chunk writer thread → snapshot. Memory holds the index and at most three chunks of
//! data. The output is built in a hidden work directory next to OUT and renamed into place only
//! when complete; an interrupted pack continues with `resume`, keeping every verified chunk.
#![forbid(unsafe_code)]

mod encode;
mod output;
mod plan;
mod reindex;
mod scan;
mod upload;

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use granary_format::{
    chunk_file_name, parse_chunk_file_name, ChunkSummary, ChunkWriter, SnapshotBuilder, NO_LABEL,
    SNAPSHOT_FILE,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;

pub use encode::{looks_compressed, CompressMode, DEFAULT_LEVEL};
pub use granary_format::SplitMix64;
use plan::{Plan, PlanFile};
pub use reindex::{reindex, ReindexSummary};
pub use upload::Destination;

/// Default target chunk size (see README: measured on this project's reference machine).
pub const DEFAULT_CHUNK_SIZE: u64 = 32 << 20;
const PLAN_FILE: &str = "pack-plan.bin";
/// Default number of reader threads (see README: measured).
pub const DEFAULT_IO_THREADS: usize = 32;

/// Errors of the packer. Every variant says which file and what happened.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// Reading or writing a file failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A source file could not be packed (unreadable, vanished, changed while read).
    #[error("{}: {detail}", path.display())]
    Source { path: PathBuf, detail: String },
    /// The request cannot be carried out as given.
    #[error("{0}")]
    Usage(String),
    /// The destination (an object store) refused or failed a request.
    #[error("{0}")]
    Destination(String),
    /// The format layer refused what we built (for example duplicate paths).
    #[error(transparent)]
    Format(#[from] granary_format::FormatError),
}

impl PackError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        PackError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How samples get labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelMode {
    /// ImageFolder convention: the first directory under SRC names the class.
    ParentDir,
    /// No labels.
    None,
}

/// In which order samples are laid out across chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Seeded random order: mixes classes across chunks (needed for chunk-wise shuffle).
    Random,
    /// Sorted path order.
    Walk,
}

/// Everything `pack` needs to know.
#[derive(Clone, Debug)]
pub struct PackOptions {
    pub src: PathBuf,
    pub out: PathBuf,
    pub files_from: Option<PathBuf>,
    pub follow_links: bool,
    pub labels: LabelMode,
    pub order: Order,
    pub seed: u64,
    pub compress: CompressMode,
    pub chunk_size: u64,
    pub force: bool,
    pub resume: bool,
    pub skip_unreadable: bool,
    pub progress: bool,
    /// Threads that read, checksum and compress source files. Reads block on storage, so more
    /// threads than cores keep more requests in flight.
    pub io_threads: usize,
    /// Upload the dataset here instead of publishing it at `out` (which then only names it in
    /// messages); built in `staging`, which must be set too.
    pub destination: Option<std::sync::Arc<dyn Destination>>,
    /// The local build directory of a pack to a [`Destination`].
    pub staging: Option<PathBuf>,
}

impl PackOptions {
    /// Options with the documented defaults.
    pub fn new(src: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        PackOptions {
            src: src.into(),
            out: out.into(),
            files_from: None,
            follow_links: false,
            labels: LabelMode::ParentDir,
            order: Order::Random,
            seed: 0,
            compress: CompressMode::Auto,
            chunk_size: DEFAULT_CHUNK_SIZE,
            force: false,
            resume: false,
            skip_unreadable: false,
            progress: false,
            io_threads: DEFAULT_IO_THREADS,
            destination: None,
            staging: None,
        }
    }
}

/// A file that was not packed, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    #[serde(serialize_with = "ser_lossy")]
    pub path: Vec<u8>,
    pub reason: String,
}

fn ser_lossy<S: serde::Serializer>(p: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(p))
}

/// What a pack did.
#[derive(Clone, Debug, Serialize)]
pub struct PackSummary {
    pub out: PathBuf,
    pub dataset_id: String,
    pub files: u64,
    pub classes: u64,
    pub bytes_in: u64,
    pub bytes_stored: u64,
    pub bytes_out: u64,
    pub ratio: f64,
    pub chunks: u64,
    pub chunks_resumed: u64,
    pub compressed_records: u64,
    pub elapsed_s: f64,
    pub scan_s: f64,
    pub files_per_s: f64,
    pub mb_per_s: f64,
    pub skipped: Vec<Skipped>,
    pub warnings: Vec<String>,
}

/// Hex form of a dataset id.
pub fn hex_id(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn work_dir(out: &Path) -> Result<PathBuf, PackError> {
    let name = out
        .file_name()
        .ok_or_else(|| PackError::Usage(format!("{} is not a valid output path", out.display())))?;
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut w = std::ffi::OsString::from(".");
    w.push(name);
    w.push(".partial");
    Ok(parent.join(w))
}

fn new_dataset_id(seed_material: &[u8]) -> [u8; 16] {
    let mut id = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut id))
        .is_ok();
    if !filled {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut r = SplitMix64::new(
            now.as_nanos() as u64
                ^ crc32fast::hash(seed_material) as u64
                ^ std::process::id() as u64,
        );
        id[..8].copy_from_slice(&r.next_u64().to_le_bytes());
        id[8..].copy_from_slice(&r.next_u64().to_le_bytes());
    }
    id
}

fn settings_text(o: &PackOptions, src: &Path) -> String {
    format!(
        "src={}\nfiles_from={}\nfollow_links={}\nlabels={:?}\norder={:?}\nseed={}\ncompress={}\nchunk_size={}\n",
        src.display(),
        o.files_from.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        o.follow_links,
        o.labels,
        o.order,
        o.seed,
        o.compress,
        o.chunk_size
    )
}

fn progress_bar(show: bool, len: Option<u64>) -> ProgressBar {
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(len, target);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// Packs `opts.src` into a dataset at `opts.out`.
///
/// Fails with a [`PackError`] naming the file and the problem; on failure the work directory is
/// kept so that `resume` can continue. With `skip_unreadable`, files that cannot be read are
/// listed in [`PackSummary::skipped`] instead.
pub fn pack(opts: &PackOptions) -> Result<PackSummary, PackError> {
    let t0 = Instant::now();
    if opts.chunk_size == 0 {
        return Err(PackError::Usage(
            "chunk size must be at least 1 byte".into(),
        ));
    }
    let src = std::fs::canonicalize(&opts.src)
        .map_err(|e| PackError::io("opening source", &opts.src, e))?;
    if !src.is_dir() {
        return Err(PackError::Usage(format!(
            "{} is not a directory",
            opts.src.display()
        )));
    }
    let out = &opts.out;
    let dest = opts.destination.as_deref();
    let work = match (dest, &opts.staging) {
        (None, _) => work_dir(out)?,
        (Some(_), Some(s)) => s.clone(),
        (Some(d), None) => {
            return Err(PackError::Usage(format!(
                "packing to {} needs a local staging directory",
                d.location()
            )))
        }
    };
    if dest.is_some() {
        output::check_disjoint(&src, &work, &work)?;
    } else {
        output::check_disjoint(&src, out, &work)?;
    }
    let remote_found = match dest {
        Some(d) => upload::check_destination(d, opts.force, opts.resume)?,
        None => Vec::new(),
    };
    if dest.is_none() && std::fs::symlink_metadata(out).is_ok() {
        if !opts.force {
            return Err(PackError::Usage(format!(
                "{} already exists; pass --force to replace it",
                out.display()
            )));
        }
        output::check_replaceable(out, output::Kind::Dataset)?;
    }
    let settings = settings_text(opts, &src);
    let mut warnings = Vec::new();
    let mut skipped = Vec::new();

    // The build directory is ours alone from here to the rename that publishes it.
    let existed = std::fs::symlink_metadata(&work).is_ok();
    if existed {
        output::check_replaceable(&work, output::Kind::Build)?;
    } else {
        // The output's parent directories too: `-o new/dir/train.granary` just works.
        std::fs::create_dir_all(&work).map_err(|e| PackError::io("creating", &work, e))?;
    }
    let _lock = output::BuildLock::take(&work, out)?;
    let existing_plan = if existed {
        if opts.resume {
            let p = work.join(PLAN_FILE);
            match std::fs::read(&p).ok().and_then(|b| Plan::decode(&b)) {
                Some(plan) if plan.settings == settings => Some(plan),
                Some(plan) => {
                    return Err(PackError::Usage(format!(
                        "cannot resume: the interrupted pack in {} used other settings.\nrecorded:\n{}now:\n{}\
                         rerun with the recorded settings, or with --force to start over",
                        work.display(),
                        plan.settings,
                        settings
                    )))
                }
                None => {
                    warnings.push(format!(
                        "{} holds no usable plan (interrupted before the scan finished, or written by another granary version); starting over",
                        work.display()
                    ));
                    None
                }
            }
        } else if opts.force {
            output::empty_dir(&work)?;
            None
        } else {
            return Err(PackError::Usage(format!(
                "an interrupted pack exists at {}; pass --resume to continue it or --force to start over",
                work.display()
            )));
        }
    } else {
        None
    };

    let scan_start = Instant::now();
    let plan = match existing_plan {
        Some(p) => {
            // Kept chunks hold the source as it was at the first scan: resuming over a changed
            // source would mix old and new versions, so look again and refuse if it changed.
            let found = scan_source(opts, &src, "checking the source against the plan")?;
            warnings.extend(found.warnings);
            skipped.extend(found.skipped);
            let changes = plan::SourceChanges::between(&p, &found.files);
            if !changes.is_empty() {
                return Err(PackError::Usage(format!(
                    "cannot resume: the source changed since the interrupted pack scanned it ({changes}); \
                     its plan and the chunks already written describe the old source. Rerun with --force to \
                     pack the source as it is now"
                )));
            }
            p
        }
        None => {
            let found = scan_source(opts, &src, "scanning")?;
            warnings.extend(found.warnings);
            skipped.extend(found.skipped);
            if found.files.is_empty() {
                let _ = std::fs::remove_dir_all(&work);
                return Err(PackError::Usage(format!(
                    "no files to pack in {}",
                    opts.src.display()
                )));
            }
            let plan = make_plan(opts, settings.clone(), found.files, &mut warnings);
            plan.save(&work.join(PLAN_FILE))?;
            plan
        }
    };
    let scan_s = scan_start.elapsed().as_secs_f64();

    // Keep every chunk of an earlier run that is complete and verified.
    let mut done: BTreeMap<usize, ChunkSummary> = BTreeMap::new();
    let entries = std::fs::read_dir(&work).map_err(|e| PackError::io("listing", &work, e))?;
    let mut candidates = Vec::new();
    let mut sent = Vec::new();
    for e in entries {
        let e = e.map_err(|e| PackError::io("listing", &work, e))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if let Some(id) =
            parse_chunk_file_name(&name).filter(|&id| (id as usize) < plan.chunk_count())
        {
            candidates.push(id as usize);
        } else if let Some(id) = name
            .ends_with(".sent")
            .then(|| upload::parse_sent_name(&name))
            .flatten()
            .filter(|&id| dest.is_some() && (id as usize) < plan.chunk_count())
        {
            sent.push(id);
        } else if name != PLAN_FILE {
            // Only granary's own files are here (checked when the lock was taken).
            let p = e.path();
            std::fs::remove_file(&p).map_err(|e| PackError::io("removing stale", &p, e))?;
        }
    }
    let verified: Vec<(usize, Option<ChunkSummary>)> = candidates
        .par_iter()
        .map(|&c| (c, verify_existing(&work, &plan, c)))
        .collect();
    for (c, v) in verified {
        match v {
            Some(s) => {
                done.insert(c, s);
            }
            None => {
                let p = work.join(chunk_file_name(c as u32));
                warnings.push(format!(
                    "discarding incomplete or damaged chunk {}",
                    p.display()
                ));
                std::fs::remove_file(&p).map_err(|e| PackError::io("removing", &p, e))?;
            }
        }
    }
    // Chunks uploaded by the interrupted run: kept if the marker is intact and the object
    // is there with the marker's size.
    for c in sent {
        let stored = remote_found
            .iter()
            .find(|(n, _)| *n == chunk_file_name(c))
            .map(|(_, size)| *size);
        match upload::read_marker(&work, &plan, c) {
            Some(s) if stored == Some(s.file_size) && !done.contains_key(&(c as usize)) => {
                done.insert(c as usize, s);
            }
            _ => {
                let p = work.join(upload::sent_name(c));
                warnings.push(format!(
                    "chunk {c} was uploaded by the interrupted run but is not intact at {}; packing it again",
                    dest.map(|d| d.location()).unwrap_or_default()
                ));
                std::fs::remove_file(&p).map_err(|e| PackError::io("removing", &p, e))?;
            }
        }
    }
    for (c, s) in &done {
        for f in plan.chunk_files(*c) {
            if !s.paths.contains(&f.rel) {
                skipped.push(Skipped {
                    path: f.rel.clone(),
                    reason: "skipped by the interrupted run".into(),
                });
            }
        }
    }
    let chunks_resumed = done.len() as u64;

    let total_bytes: u64 = plan.files.iter().map(|f| f.size).sum();
    let done_bytes: u64 = done
        .keys()
        .flat_map(|&c| plan.chunk_files(c))
        .map(|f| f.size)
        .sum();
    let pb = progress_bar(opts.progress, Some(total_bytes));
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} packing [{bar:30}] {bytes}/{total_bytes} {msg} {bytes_per_sec} ETA {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_position(done_bytes);
    let todo: Vec<usize> = (0..plan.chunk_count())
        .filter(|c| !done.contains_key(c))
        .collect();
    let mut files_done: u64 = done.values().map(|s| s.entries.len() as u64).sum();
    // Verified local chunks of an interrupted pack to a destination still have to go up.
    let unsent: Vec<upload::Written> = match dest {
        Some(_) => done
            .values()
            .filter(|s| work.join(chunk_file_name(s.chunk_id)).is_file())
            .map(|s| (s.chunk_id, s.file_size, s.file_crc))
            .collect(),
        None => Vec::new(),
    };
    let uploaded = std::sync::atomic::AtomicU64::new(0);
    let written = std::thread::scope(|scope| {
        let Some(d) = dest else {
            return write_chunks(
                opts,
                &src,
                &work,
                &plan,
                &todo,
                &pb,
                &mut files_done,
                &mut skipped,
                None,
            );
        };
        // Two finished chunks may wait for the uploader; then the writer waits.
        let (tx, rx) = sync_channel::<upload::Written>(2);
        let (work, uploaded, pb) = (&work, &uploaded, &pb);
        let uploader = scope.spawn(move || {
            upload::upload_loop(d, work, rx, uploaded, &|n| {
                pb.set_message(format!("uploaded {}", indicatif::HumanBytes(n)))
            })
        });
        let mut result = Ok(Vec::new());
        for w in unsent {
            if tx.send(w).is_err() {
                break; // the uploader failed: its error is reported below
            }
        }
        if !uploader.is_finished() {
            result = write_chunks(
                opts,
                &src,
                work,
                &plan,
                &todo,
                pb,
                &mut files_done,
                &mut skipped,
                Some(&tx),
            );
        }
        drop(tx);
        let sent = uploader.join().unwrap_or_else(|_| {
            Err(PackError::Destination(format!(
                "the upload thread to {} panicked",
                d.location()
            )))
        });
        // The uploader's failure is the cause when both failed (the writer only saw the
        // channel close).
        sent.and(result)
    })?;
    pb.finish_and_clear();
    for s in written {
        done.insert(s.chunk_id as usize, s);
    }

    // The snapshot, then the atomic switch into place.
    let mut builder = SnapshotBuilder::new(plan.dataset_id, plan.classes.clone());
    let mut bytes_stored = 0u64;
    let mut bytes_out = 0u64;
    let mut bytes_in = 0u64;
    let mut compressed_records = 0u64;
    for s in done.values() {
        builder.push_chunk(s)?;
        bytes_out += s.file_size;
        for e in &s.entries {
            bytes_stored += e.stored_len;
            bytes_in += e.orig_len;
            compressed_records += (e.flags != 0) as u64;
        }
    }
    let files = done.values().map(|s| s.entries.len() as u64).sum();
    let snap = builder.build()?;
    bytes_out += snap.len() as u64;
    write_file_atomic(&work.join(SNAPSHOT_FILE), &snap)?;
    match dest {
        Some(d) => {
            // Chunks of an earlier dataset there that this one does not have (it was replaced
            // with --force), then the snapshot: only now is the prefix a dataset.
            for (name, _) in &remote_found {
                if parse_chunk_file_name(name).is_some_and(|c| c as usize >= plan.chunk_count()) {
                    d.remove(name).map_err(PackError::Destination)?;
                }
            }
            let snap_path = work.join(SNAPSHOT_FILE);
            d.upload(SNAPSHOT_FILE, &snap_path, &|_| {})
                .map_err(PackError::Destination)?;
            std::fs::remove_dir_all(&work).map_err(|e| PackError::io("removing", &work, e))?;
        }
        None => {
            let plan_path = work.join(PLAN_FILE);
            std::fs::remove_file(&plan_path)
                .map_err(|e| PackError::io("removing", &plan_path, e))?;
            sync_dir(&work)?;
            publish(&work, out)?;
        }
    }

    let elapsed = t0.elapsed().as_secs_f64();
    Ok(PackSummary {
        out: out.clone(),
        dataset_id: hex_id(&plan.dataset_id),
        files,
        classes: plan.classes.len() as u64,
        bytes_in,
        bytes_stored,
        bytes_out,
        ratio: if bytes_out > 0 {
            bytes_in as f64 / bytes_out as f64
        } else {
            0.0
        },
        chunks: done.len() as u64,
        chunks_resumed,
        compressed_records,
        elapsed_s: elapsed,
        scan_s,
        files_per_s: files as f64 / elapsed.max(1e-9),
        mb_per_s: bytes_in as f64 / 1e6 / elapsed.max(1e-9),
        skipped,
        warnings,
    })
}

/// Walks (or lists) and stats the source, with a spinner saying `what`.
fn scan_source(opts: &PackOptions, src: &Path, what: &str) -> Result<scan::ScanResult, PackError> {
    let pb = progress_bar(opts.progress, None);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {what}: {{pos}} files found ({{elapsed}})"
        ))
        .expect("static template"),
    );
    let found = scan::scan(
        src,
        opts.files_from.as_deref(),
        opts.follow_links,
        opts.skip_unreadable,
        &|n| pb.set_position(n),
    );
    pb.finish_and_clear();
    found
}

fn make_plan(
    opts: &PackOptions,
    settings: String,
    found: Vec<scan::Found>,
    warnings: &mut Vec<String>,
) -> Plan {
    let (classes, class_of): (Vec<Vec<u8>>, BTreeMap<Vec<u8>, u32>) = match opts.labels {
        LabelMode::None => (Vec::new(), BTreeMap::new()),
        LabelMode::ParentDir => {
            let mut names: Vec<Vec<u8>> = found
                .iter()
                .filter_map(|f| {
                    f.rel
                        .iter()
                        .position(|&b| b == b'/')
                        .map(|i| f.rel[..i].to_vec())
                })
                .collect();
            names.sort_unstable();
            names.dedup();
            let map = names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as u32))
                .collect();
            (names, map)
        }
    };
    let mut unlabeled = 0u64;
    let mut files: Vec<PlanFile> = found
        .into_iter()
        .map(|f| {
            let label = match opts.labels {
                LabelMode::None => NO_LABEL,
                LabelMode::ParentDir => match f.rel.iter().position(|&b| b == b'/') {
                    Some(i) => class_of[&f.rel[..i]],
                    None => {
                        unlabeled += 1;
                        NO_LABEL
                    }
                },
            };
            PlanFile {
                rel: f.rel,
                size: f.size,
                label,
                ino: f.ino,
                mtime_ns: f.mtime_ns,
            }
        })
        .collect();
    if unlabeled > 0 {
        warnings.push(format!(
            "{unlabeled} files lie directly in the source directory, outside any class directory: packed without a label"
        ));
    }
    if opts.order == Order::Random {
        SplitMix64::new(opts.seed).shuffle(&mut files);
    }
    let chunk_starts = Plan::assign_chunks(&files, opts.chunk_size);
    Plan {
        dataset_id: new_dataset_id(settings.as_bytes()),
        settings,
        classes,
        files,
        chunk_starts,
    }
}

/// Reads back chunk `c` of an earlier run; keeps it only if it checks completely and holds
/// (a subsequence of) exactly the files the plan puts there.
fn verify_existing(work: &Path, plan: &Plan, c: usize) -> Option<ChunkSummary> {
    let bytes = std::fs::read(work.join(chunk_file_name(c as u32))).ok()?;
    let check = granary_format::check_chunk(&bytes, &plan.dataset_id, c as u32).ok()?;
    if !check.bad_records.is_empty() || !footer_matches_plan(plan, c, &check.footer) {
        return None;
    }
    Some(ChunkSummary {
        chunk_id: c as u32,
        file_size: bytes.len() as u64,
        file_crc: check.file_crc,
        entries: check.footer.entries,
        paths: check.footer.paths,
    })
}

/// True if a chunk footer holds (a subset, in order, of) the files the plan puts in chunk `c`,
/// with the plan's sizes, labels and classes.
fn footer_matches_plan(plan: &Plan, c: usize, footer: &granary_format::ChunkFooter) -> bool {
    if footer.classes != plan.classes {
        return false;
    }
    let mut want = plan.chunk_files(c).iter();
    footer.paths.iter().zip(&footer.entries).all(|(p, e)| {
        want.by_ref()
            .find(|f| &f.rel == p)
            .is_some_and(|f| f.size == e.orig_len && f.label == e.label)
    })
}

#[allow(clippy::too_many_arguments)]
fn write_chunks(
    opts: &PackOptions,
    src: &Path,
    work: &Path,
    plan: &Plan,
    todo: &[usize],
    pb: &ProgressBar,
    files_done: &mut u64,
    skipped: &mut Vec<Skipped>,
    sent: Option<&std::sync::mpsc::SyncSender<upload::Written>>,
) -> Result<Vec<ChunkSummary>, PackError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.io_threads.max(1))
        .thread_name(|i| format!("granary-read-{i}"))
        .build()
        .map_err(|e| PackError::Usage(format!("cannot start reader threads: {e}")))?;
    std::thread::scope(|scope| {
        // One chunk in the channel, one being written, one being read: bounded memory.
        let (tx, rx) = sync_channel::<(usize, Vec<(usize, encode::Encoded)>)>(1);
        let writer = scope.spawn(move || -> Result<Vec<ChunkSummary>, PackError> {
            let mut out = Vec::new();
            for (c, recs) in rx {
                let s = write_chunk(work, plan, c, recs)?;
                if let Some(tx) = sent {
                    if tx.send((s.chunk_id, s.file_size, s.file_crc)).is_err() {
                        return Err(PackError::Destination(
                            "the upload stopped (its error follows)".into(),
                        ));
                    }
                }
                out.push(s);
            }
            Ok(out)
        });
        let mut failure = None;
        for &c in todo {
            let files = plan.chunk_files(c);
            // Read in inode order (close to on-disk order); keep the plan's record order.
            let mut order: Vec<usize> = (0..files.len()).collect();
            order.sort_unstable_by_key(|&i| files[i].ino);
            let mut read: Vec<(usize, Result<encode::Encoded, String>)> = pool.install(|| {
                order
                    .par_iter()
                    .map(|&i| {
                        let f = &files[i];
                        let path = src.join(std::ffi::OsStr::from_bytes(&f.rel));
                        let r = encode::read_and_encode(&path, f.size, f.mtime_ns, opts.compress);
                        pb.inc(f.size);
                        (i, r)
                    })
                    .collect()
            });
            read.sort_unstable_by_key(|(i, _)| *i);
            let mut recs = Vec::with_capacity(files.len());
            for (i, r) in read.into_iter() {
                match r {
                    Ok(e) => recs.push((i, e)),
                    Err(reason) if opts.skip_unreadable => skipped.push(Skipped {
                        path: files[i].rel.clone(),
                        reason,
                    }),
                    Err(detail) => {
                        failure = Some(PackError::Source {
                            path: src.join(std::ffi::OsStr::from_bytes(&files[i].rel)),
                            detail,
                        });
                        break;
                    }
                }
            }
            if failure.is_some() {
                break;
            }
            *files_done += recs.len() as u64;
            pb.set_message(format!("{} files", *files_done));
            if tx.send((c, recs)).is_err() {
                break; // the writer failed; its error is reported below
            }
        }
        drop(tx);
        let written = writer
            .join()
            .map_err(|_| PackError::Usage("chunk writer thread panicked".into()))?;
        match (failure, written) {
            (_, Err(e)) | (Some(e), _) => Err(e),
            (None, Ok(w)) => Ok(w),
        }
    })
}

fn write_chunk(
    work: &Path,
    plan: &Plan,
    c: usize,
    recs: Vec<(usize, encode::Encoded)>,
) -> Result<ChunkSummary, PackError> {
    let files = plan.chunk_files(c);
    let final_path = work.join(chunk_file_name(c as u32));
    let tmp = final_path.with_extension("gchunk.tmp");
    let f = std::fs::File::create(&tmp).map_err(|e| PackError::io("creating", &tmp, e))?;
    let io = |e| PackError::io("writing", &tmp, e);
    let mut w = ChunkWriter::new(
        BufWriter::with_capacity(1 << 20, f),
        plan.dataset_id,
        c as u32,
    )
    .map_err(io)?;
    for (i, e) in recs {
        let pf = &files[i];
        w.append(
            &pf.rel,
            &e.stored,
            e.compression,
            e.orig_len,
            e.crc32,
            pf.label,
        )
        .map_err(io)?;
    }
    let (buf, summary) = w.finish(&plan.classes).map_err(io)?;
    let f = buf.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &final_path).map_err(|e| PackError::io("renaming", &tmp, e))?;
    Ok(summary)
}

/// Writes `data` to `path` via a temporary file, fsync and rename. On failure (a full disk,
/// say) the temporary file is removed again.
pub fn write_file_atomic(path: &Path, data: &[u8]) -> Result<(), PackError> {
    let tmp = path.with_extension("tmp");
    let written = std::fs::File::create(&tmp)
        .map_err(|e| PackError::io("creating", &tmp, e))
        .and_then(|mut f| {
            f.write_all(data)
                .and_then(|_| f.sync_all())
                .map_err(|e| PackError::io("writing", &tmp, e))
        })
        .and_then(|_| std::fs::rename(&tmp, path).map_err(|e| PackError::io("renaming", &tmp, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(parent) = path.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), PackError> {
    let d = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::fs::File::open(d)
        .and_then(|f| f.sync_all())
        .map_err(|e| PackError::io("syncing", d, e))
}

/// Moves the finished work directory to `out`, replacing an existing `out` (only reached with
/// `--force`, and only if it is a granary dataset) by first moving it aside, so that `out` is
/// never missing a complete dataset.
fn publish(work: &Path, out: &Path) -> Result<(), PackError> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if std::fs::symlink_metadata(out).is_ok() {
        // Checked at the start too; something may have appeared there since.
        output::check_replaceable(out, output::Kind::Dataset)?;
        let mut old_name = std::ffi::OsString::from(".");
        old_name.push(out.file_name().unwrap_or_default());
        old_name.push(format!(".old-{}", std::process::id()));
        let old = parent.join(old_name);
        std::fs::rename(out, &old).map_err(|e| PackError::io("moving aside", out, e))?;
        std::fs::rename(work, out).map_err(|e| PackError::io("renaming", work, e))?;
        sync_dir(parent)?;
        std::fs::remove_dir_all(&old).map_err(|e| PackError::io("removing", &old, e))?;
    } else {
        std::fs::rename(work, out).map_err(|e| PackError::io("renaming", work, e))?;
        sync_dir(parent)?;
    }
    Ok(())
}
