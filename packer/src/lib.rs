//! The granary packer: turns a directory of small files into a dataset of large chunk files
//! plus one metadata snapshot (format: `format/SPEC.md`).
//!
//! Pipeline: scan (walk or file list, parallel stat) → plan (labels, seeded order, chunk
//! assignment; saved to disk) → parallel read/CRC/compress of one chunk's files (rayon) → a
//! few chunk writer threads → snapshot. The output is built in a hidden work directory next to
//! OUT and renamed into place only when complete; an interrupted pack continues with
//! `resume`, keeping every verified chunk.
#![forbid(unsafe_code)]

/// A [`PackError::Usage`] with a formatted message.
macro_rules! usage {
    ($($arg:tt)*) => {
        $crate::PackError::Usage(format!($($arg)*))
    };
}

mod compact;
mod delete;
mod encode;
mod files;
mod options;
mod output;
mod pipeline;
mod place;
mod plan;
pub(crate) mod publish;
mod reindex;
mod run;
mod scan;
mod shard;
mod upload;
mod webdataset;
mod writer;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use granary_format::{
    chunk_file_name, parse_chunk_file_name, ChunkSummary, Snapshot, NO_LABEL, SNAPSHOT_FILE,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

pub use compact::{compact, CompactOptions, CompactSummary, DEFAULT_GRACE};
pub use delete::{delete, DeleteSummary};
pub use encode::{looks_compressed, CompressMode, DEFAULT_LEVEL};
use files::FileTable;
pub use granary_format::SplitMix64;
pub use options::{OutputOptions, DEFAULT_CHUNK_FILES, DEFAULT_CHUNK_SIZE};
pub use output::LEGACY_SNAPSHOT_FILE;
pub(crate) use pipeline::{write_chunks, Build};
use plan::Plan;
pub(crate) use publish::{spooled_builder, sync_dir, write_file_atomic, write_snapshot_pending};
pub use reindex::{reindex, upgrade, ReindexSummary, UpgradeSummary};
pub use shard::{merge, shard_of, MergeSummary, ShardSpec, PART_FILE};
pub use webdataset::{expand_braces, import_webdataset, ImportCounts};
pub use writer::{Label, Writer, WriterOptions, Written, DEFAULT_BUCKETS, DEFAULT_GATHER_MEMORY};

const PLAN_FILE: &str = "pack-plan.bin";
/// Default number of reader threads (see docs/packing.md: measured).
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
    #[error(transparent)]
    Destination(#[from] granary_store::StoreError),
    /// The upload of a pack to an object store stopped (its thread failed).
    #[error("{0}")]
    Upload(String),
    /// The format layer refused what we built (for example duplicate paths).
    #[error(transparent)]
    Format(#[from] granary_format::FormatError),
    /// A pack failed after its plan was saved: what it wrote so far is kept for `--resume`.
    #[error(
        "{cause}\nthe work so far is kept in {}: once the cause is fixed, run the same command \
         with --resume to continue (or --force to start over)",
        work.display()
    )]
    Kept {
        work: PathBuf,
        cause: Box<PackError>,
    },
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

/// Names the operation and the file of an I/O error: `.at("reading", &path)?`.
pub(crate) trait IoAt<T> {
    fn at(self, op: &'static str, path: &Path) -> Result<T, PackError>;
}

impl<T> IoAt<T> for std::io::Result<T> {
    fn at(self, op: &'static str, path: &Path) -> Result<T, PackError> {
        self.map_err(|e| PackError::io(op, path, e))
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

/// Everything `pack` needs to know: where the dataset goes and how its chunks are cut (shared
/// with the [`Writer`]), and how the source tree is read.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The dataset's destination, its chunking and mixing seed, resume and force.
    pub output: OutputOptions,
    pub src: PathBuf,
    pub files_from: Option<PathBuf>,
    pub follow_links: bool,
    pub labels: LabelMode,
    pub order: Order,
    pub skip_unreadable: bool,
    /// Threads that read, checksum and compress source files. Reads block on storage, so more
    /// threads than cores keep more requests in flight.
    pub io_threads: usize,
    /// Do not record each file's mode and mtime and the tree's empty directories: the
    /// dataset then shows pack-time values.
    pub no_metadata: bool,
}

impl PackOptions {
    /// Options with the documented defaults.
    pub fn new(src: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        PackOptions {
            output: OutputOptions::new(out),
            src: src.into(),
            files_from: None,
            follow_links: false,
            labels: LabelMode::ParentDir,
            order: Order::Random,
            skip_unreadable: false,
            io_threads: DEFAULT_IO_THREADS,
            no_metadata: false,
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
#[derive(Clone, Debug, Default, Serialize)]
pub struct PackSummary {
    pub out: PathBuf,
    pub dataset_id: String,
    /// The shard packed (`I/N`), for a sharded pack.
    pub shard: Option<String>,
    /// The snapshot's generation: 0 for a pack, +1 for each append.
    pub generation: u64,
    /// What was done: "pack", "shard" (a part for merge), "append", or "unchanged" (an append
    /// that found nothing new).
    pub action: &'static str,
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

/// Locks `m`, also after a thread panicked holding it (that thread's failure is reported on its
/// own).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hex form of a dataset id.
pub fn hex_id(id: &[u8; 16]) -> String {
    granary_format::DatasetId(*id).to_string()
}

fn work_dir(out: &Path) -> Result<PathBuf, PackError> {
    let name = out
        .file_name()
        .ok_or_else(|| usage!("{} is not a valid output path", out.display()))?;
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
        let seed = now.as_nanos() as u64
            ^ crc32fast::hash(seed_material) as u64
            ^ std::process::id() as u64;
        id = id_from(SplitMix64::new(seed));
    }
    id
}

/// A dataset id of the next two numbers `r` draws.
fn id_from(mut r: SplitMix64) -> [u8; 16] {
    (r.next_u64() as u128 | (r.next_u64() as u128) << 64).to_le_bytes()
}

fn settings_text(o: &PackOptions, src: &Path) -> String {
    format!(
        "src={}\nfiles_from={}\nfollow_links={}\nlabels={:?}\norder={:?}\nseed={}\ncompress={}\nchunk_size={}\nchunk_files={}\n{}",
        src.display(),
        o.files_from.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        o.follow_links,
        o.labels,
        o.order,
        o.output.seed,
        o.output.compress,
        o.output.chunk_size,
        o.output.chunk_files,
        if o.no_metadata {
            format!("{NO_METADATA_SETTING}\n")
        } else {
            String::new()
        }
    )
}

/// The line of a plan's settings that says the pack records no modes, mtimes and directories.
const NO_METADATA_SETTING: &str = "metadata=no";

/// A progress bar (of `len` steps, or a spinner) drawn on standard error if `show`, as
/// `template` says (a bar in it is drawn with `=> `), and cleared when dropped.
fn progress_bar(show: bool, len: Option<u64>, template: &str) -> ProgressBar {
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(len, target);
    pb.enable_steady_tick(Duration::from_millis(200));
    let style = ProgressStyle::with_template(template).expect("static template");
    pb.set_style(style.progress_chars("=> "));
    pb.with_finish(indicatif::ProgressFinish::AndClear)
}

/// Packs `opts.src` into a dataset at `opts.output.out`.
///
/// Fails with a [`PackError`] naming the file and the problem; on failure the work directory is
/// kept so that `resume` can continue. With `skip_unreadable`, files that cannot be read are
/// listed in [`PackSummary::skipped`] instead.
pub fn pack(opts: &PackOptions) -> Result<PackSummary, PackError> {
    match opts.output.shard {
        Some(s) => run::run(opts, Mode::Shard(s)),
        None => run::run(opts, Mode::Whole),
    }
}

/// What to do with files of the source whose paths the dataset already has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Refuse the append, naming them.
    Refuse,
    /// Leave them out (the dataset keeps its version).
    Skip,
}

/// Adds the files of `opts.src` to the dataset at `opts.output.out` as new chunks and publishes a new
/// snapshot (the next generation) that keeps every old chunk: readers of the old snapshot keep
/// working until they reopen. Labels follow the dataset: a class it does not have is refused
/// (every chunk carries the class table). Paths the dataset has already are refused or, with
/// [`Existing::Skip`], left out. Interrupted, it continues with `resume` like a pack.
pub fn append(opts: &PackOptions, existing: Existing) -> Result<PackSummary, PackError> {
    if opts.output.destination.is_some() || opts.output.shard.is_some() {
        return Err(usage!(
            "append works on a dataset directory (local or on a shared file system), \
             without --shard"
        ));
    }
    let snap_path = opts.output.out.join(SNAPSHOT_FILE);
    let bytes = std::fs::read(&snap_path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            usage!(
                "{} is not a granary dataset (no {SNAPSHOT_FILE}); create it with granary pack",
                opts.output.out.display()
            )
        } else {
            PackError::io("reading", &snap_path, e)
        }
    })?;
    let snap = Snapshot::open(bytes)?;
    if snap.has_fields() {
        return Err(usage!(
            "{}: its samples have named fields; append adds files, one blob each, \
             which cannot join them: write a new dataset (granary.Writer, --from webdataset)",
            opts.output.out.display()
        ));
    }
    if let Some(e) = snap.check_blocks().into_iter().next() {
        return Err(usage!(
            "{} is damaged ({e}); run granary verify and granary reindex before appending",
            snap_path.display()
        ));
    }
    run::run(
        opts,
        Mode::Append {
            snap: Box::new(snap),
            existing,
        },
    )
}

/// Which part of a dataset a run of the packer writes.
enum Mode {
    /// A whole dataset, published at OUT when complete.
    Whole,
    /// One shard's part of a dataset, for `merge`.
    Shard(ShardSpec),
    /// New chunks and the next snapshot of an existing dataset.
    Append {
        snap: Box<Snapshot<Vec<u8>>>,
        existing: Existing,
    },
}

/// Chunk ids of a run: plan chunk `c` is chunk `base + c × stride`.
#[derive(Clone, Copy, Debug)]
struct Ids {
    base: u32,
    stride: u32,
}

impl Ids {
    fn id(&self, c: usize) -> u32 {
        self.base + c as u32 * self.stride
    }

    /// The plan chunk that chunk `id` is, if it is one of this run's `count` chunks.
    fn index(&self, id: u32, count: usize) -> Option<usize> {
        let d = id.checked_sub(self.base)?;
        (d % self.stride == 0)
            .then_some((d / self.stride) as usize)
            .filter(|&c| c < count)
    }

    fn check(&self, count: usize) -> Result<(), PackError> {
        let last = self.base as u64 + (count as u64).saturating_sub(1) * self.stride as u64;
        if last > u32::MAX as u64 {
            return Err(usage!(
                "{count} chunks do not fit the format's 32-bit chunk ids here; use a larger --chunk-size"
            ));
        }
        Ok(())
    }
}

/// Where a run builds: its own directory (plan, lock, part file) and where its chunks go.
struct Place {
    work: PathBuf,
    chunks: PathBuf,
    ids: Ids,
}

impl Place {
    /// Where a whole dataset (`.OUT.partial`, or the staging directory of an upload) or a
    /// shard's part (its part directory, its chunks straight into OUT) is built.
    fn of(o: &OutputOptions) -> Result<Place, PackError> {
        let whole = |w: PathBuf| Place {
            chunks: w.clone(),
            work: w,
            ids: Ids { base: 0, stride: 1 },
        };
        // `OutputOptions::check` made sure a destination comes with its staging directory.
        Ok(match (o.shard, &o.destination, &o.staging) {
            (Some(s), _, _) => Place {
                work: o.out.join(s.dir_name()),
                chunks: o.out.clone(),
                ids: Ids {
                    base: s.index,
                    stride: s.count,
                },
            },
            (None, Some(_), Some(s)) => whole(s.clone()),
            (None, _, _) => whole(work_dir(&o.out)?),
        })
    }

    /// True if `name` is a chunk file (or a temporary file of one) with one of the run's ids:
    /// a shard's `k × n + i`, an append's past the snapshot's chunks, any of a whole dataset.
    fn owns(&self, name: &str) -> bool {
        let id = parse_chunk_file_name(output::final_name(name));
        id.is_some_and(|id| self.ids.index(id, usize::MAX).is_some())
    }
}

/// What every shard of one pack must share: its settings but the source's path (machines may
/// mount it elsewhere), the file list's path and the shard index.
fn shared_key_of(settings: &str) -> String {
    settings
        .lines()
        .filter(|l| {
            !(l.starts_with("src=") || l.starts_with("files_from=") || l.starts_with("shard="))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A shard that finished before (its part file is there): reports it instead of packing again.
fn finished_shard(
    opts: &PackOptions,
    s: ShardSpec,
    work: &Path,
    t0: Instant,
) -> Result<Option<PackSummary>, PackError> {
    let p = work.join(PART_FILE);
    let Ok(bytes) = std::fs::read(&p) else {
        return Ok(None);
    };
    let part = shard::Part::decode(&bytes).map_err(|e| {
        usage!(
            "{} is unusable ({e}); pack shard {s} again with --force",
            p.display()
        )
    })?;
    let files = part.chunks.iter().map(|c| c.samples).sum();
    Ok(Some(PackSummary {
        out: opts.output.out.clone(),
        dataset_id: hex_id(&part.dataset_id),
        shard: Some(s.to_string()),
        action: "shard",
        files,
        classes: part.classes.len() as u64,
        chunks: part.chunks.len() as u64,
        chunks_resumed: part.chunks.len() as u64,
        elapsed_s: t0.elapsed().as_secs_f64(),
        warnings: vec![format!(
            "shard {s} finished already ({} exists): nothing to do; run granary merge {} when all shards are done (--force packs it again)",
            p.display(),
            opts.output.out.display()
        )],
        ..PackSummary::default()
    }))
}

/// True if the dataset has a sample at `rel` (the snapshot was checked before: a lookup error
/// cannot happen on it).
fn in_dataset(snap: &Snapshot<Vec<u8>>, rel: &[u8]) -> bool {
    matches!(snap.lookup(rel), Ok(Some(_)))
}

/// Labels, orders and chunks the scanned `files` and `dirs` into the plan of dataset
/// `dataset_id` (given for shards and appends, drawn from `settings` and chance otherwise);
/// `classes` is the class table when labelling by parent directory.
fn make_plan(
    opts: &PackOptions,
    settings: String,
    (mut files, dirs): (FileTable, FileTable),
    (classes, labels): (Vec<Vec<u8>>, LabelMode),
    dataset_id: Option<[u8; 16]>,
    warnings: &mut Vec<String>,
) -> Result<Plan, PackError> {
    let classes = match labels {
        LabelMode::None => Vec::new(),
        LabelMode::ParentDir => classes,
    };
    set_labels(&mut files, &classes, labels, warnings)?;
    if files.len() as u64 > granary_format::MAX_SAMPLES {
        return Err(usage!(
            "{} files: a dataset holds at most {} samples",
            files.len(),
            granary_format::MAX_SAMPLES
        ));
    }
    let mut order: Vec<u32> = (0..files.len() as u32).collect();
    if opts.order == Order::Random {
        SplitMix64::new(opts.output.seed).shuffle(&mut order);
    }
    let mut chunk_starts = Plan::assign_chunks(
        order.iter().map(|&i| files.meta[i as usize].size),
        opts.output.chunk_size,
        opts.output.chunk_files,
    );
    let dirs = if opts.no_metadata {
        FileTable::default()
    } else {
        dirs
    };
    // Directories without files still need a chunk to record them.
    if chunk_starts.len() == 1 && !dirs.is_empty() {
        chunk_starts.push(0);
    }
    Ok(Plan {
        dataset_id: dataset_id.unwrap_or_else(|| new_dataset_id(settings.as_bytes())),
        settings,
        classes,
        files,
        order,
        chunk_starts,
        dirs,
    })
}

/// Gives each file its label: its class directory's index in `classes` (by parent
/// directory), or none. A class directory that is not in the table is an error; files outside
/// any class directory are packed without a label, with a warning.
fn set_labels(
    files: &mut FileTable,
    classes: &[Vec<u8>],
    labels: LabelMode,
    warnings: &mut Vec<String>,
) -> Result<(), PackError> {
    let class_of: BTreeMap<&[u8], u32> = classes
        .iter()
        .enumerate()
        .map(|(i, n)| (&n[..], i as u32))
        .collect();
    let mut unknown: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut unlabeled = 0u64;
    for f in 0..files.len() {
        let rel = files.path(f);
        let label = match rel.iter().position(|&b| b == b'/') {
            _ if labels == LabelMode::None => NO_LABEL,
            None => {
                unlabeled += 1;
                NO_LABEL
            }
            Some(i) => class_of.get(&rel[..i]).copied().unwrap_or_else(|| {
                unknown.insert(rel[..i].to_vec());
                NO_LABEL
            }),
        };
        files.meta[f].label = label;
    }
    if !unknown.is_empty() {
        let shown: Vec<_> = unknown
            .iter()
            .take(5)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        return Err(usage!(
            "{} class directories are not classes of the dataset (e.g. {}); every chunk carries the class table, \
             so new classes need a new pack (or append with the files of known classes only)",
            unknown.len(),
            shown.join(", ")
        ));
    }
    if unlabeled > 0 {
        warnings.push(format!(
            "{unlabeled} files lie directly in the source directory, outside any class directory: packed without a label"
        ));
    }
    Ok(())
}

/// `s` without its records (see [`read_footer`]).
fn slimmed(s: &ChunkSummary) -> ChunkSummary {
    ChunkSummary::bare(s.chunk_id, s.file_size, s.file_crc, s.digest)
}

/// Chunk `id`'s footer from its header, trailer and footer bytes (of a file of `size` bytes).
pub(crate) fn footer_of(
    id: u32,
    size: u64,
    (head, tail, body): (&[u8], &[u8], &[u8]),
) -> Result<granary_format::ChunkFooter, String> {
    let header = granary_format::ChunkHeader::decode(head).map_err(|e| e.to_string())?;
    if header.chunk_id != id {
        return Err(format!("holds chunk id {}", header.chunk_id));
    }
    let trailer = granary_format::Trailer::decode(tail, size).map_err(|e| e.to_string())?;
    granary_format::decode_footer(body, &trailer, &header).map_err(|e| e.to_string())
}

/// A chunk file's header, trailer and footer bytes as they lie on disk, and its footer.
pub(crate) type FooterBytes = (
    [u8; granary_format::CHUNK_HEADER_LEN],
    [u8; granary_format::CHUNK_TRAILER_LEN],
    Vec<u8>,
    granary_format::ChunkFooter,
);

/// Reads back the header, trailer and footer of chunk `id`, `size` bytes, in `dir` (the file
/// granary wrote: another chunk's, or one whose footer does not fit the size or fails its CRC,
/// is "changed since it was written").
pub(crate) fn read_footer_bytes(dir: &Path, id: u32, size: u64) -> Result<FooterBytes, PackError> {
    use granary_format::{Trailer, CHUNK_HEADER_LEN, CHUNK_TRAILER_LEN};
    use granary_store::{verified, ChunkStore};
    let path = dir.join(chunk_file_name(id));
    let bad = |detail: String| PackError::Source {
        path: path.clone(),
        detail: format!("changed since it was written: {detail}"),
    };
    let src = granary_store::LocalDir::new(dir)
        .open_chunk(id)
        .map_err(|e| bad(e.to_string()))?;
    if size < (CHUNK_TRAILER_LEN + CHUNK_HEADER_LEN) as u64 || src.len() != size {
        return Err(bad(format!("{} bytes, written as {size}", src.len())));
    }
    let unchecked = verified::Expect::default();
    let read = |buf: &mut [u8], at: u64| {
        verified::read_into(&src, at, buf, &unchecked)
            .map(|_| ())
            .map_err(|e| bad(e.to_string()))
    };
    let (mut head, mut tail) = ([0u8; CHUNK_HEADER_LEN], [0u8; CHUNK_TRAILER_LEN]);
    read(&mut head, 0)?;
    read(&mut tail, size - CHUNK_TRAILER_LEN as u64)?;
    let trailer = Trailer::decode(&tail, size).map_err(|e| bad(e.to_string()))?;
    let mut body = vec![0u8; trailer.footer_len as usize];
    read(&mut body, trailer.footer_offset)?;
    let footer = footer_of(id, size, (&head, &tail, &body)).map_err(bad)?;
    Ok((head, tail, body, footer))
}

/// `s` (a chunk in `dir` with its id and size) with the entries and paths of its footer, read
/// back (the trailer says where it is; its CRC is checked).
pub(crate) fn read_footer(dir: &Path, s: ChunkSummary) -> Result<ChunkSummary, PackError> {
    let (.., footer) = read_footer_bytes(dir, s.chunk_id, s.file_size)?;
    let (id, size) = (s.chunk_id, s.file_size);
    Ok(ChunkSummary::from_footer(
        id, size, s.file_crc, s.digest, footer,
    ))
}

/// Reads back chunk `c` of an earlier run; keeps it only if it checks completely and holds
/// (a subsequence of) exactly the files the plan puts there.
fn verify_existing(place: &Place, plan: &Plan, c: usize) -> Option<ChunkSummary> {
    let id = place.ids.id(c);
    let src =
        granary_store::ChunkStore::open_chunk(&granary_store::LocalDir::new(&place.chunks), id);
    let bytes = granary_store::file::read_whole(&*src.ok()?).ok()?;
    let check = granary_format::check_chunk(&bytes, &plan.dataset_id, id).ok()?;
    if !check.bad_records.is_empty() || !footer_matches_plan(plan, c, &check.footer) {
        return None;
    }
    let size = bytes.len() as u64;
    Some(ChunkSummary::from_footer(
        id,
        size,
        check.file_crc,
        check.digest,
        check.footer,
    ))
}

/// True if a chunk footer holds (a subset, in order, of) the files the plan puts in chunk `c`,
/// with the plan's sizes, labels, classes, attributes and directories (or none of those two,
/// as the plan says).
fn footer_matches_plan(plan: &Plan, c: usize, footer: &granary_format::ChunkFooter) -> bool {
    let dirs = plan.records_attrs().then(|| plan.chunk_dirs(c));
    if footer.classes != plan.classes || footer.attrs.is_some() != dirs.is_some() {
        return false;
    }
    if dirs.is_some_and(|d| d != footer.dirs) {
        return false;
    }
    let f = &plan.files;
    let mut want = plan.chunk_files(c).iter().map(|&i| i as usize);
    footer.paths.iter().enumerate().all(|(k, p)| {
        let e = &footer.entries[k];
        want.by_ref()
            .find(|&i| f.path(i) == &p[..])
            .is_some_and(|i| {
                (f.meta[i].size, f.meta[i].label) == (e.orig_len, e.label)
                    && footer.attrs.as_ref().is_none_or(|a| a[k] == f.attrs(i))
            })
    })
}

/// The packer's parsers of node-local files (docs/internals.md), for the fuzz targets in
/// `fuzz/`: each takes untrusted bytes and returns whether they were accepted. Whatever is
/// accepted must encode back to exactly the same bytes (asserted), so damaged bytes can never
/// pass as another valid value. Not a stable API.
#[doc(hidden)]
pub mod parsers {
    /// A pack plan.
    pub fn plan(b: &[u8]) -> bool {
        let Some(p) = crate::plan::Plan::read_from(b, b.len() as u64) else {
            return false;
        };
        assert!(
            p.encode() == b,
            "a plan decoded from bytes that are not its encoding"
        );
        true
    }

    /// A shard's part file.
    pub fn part(b: &[u8]) -> bool {
        let Ok(p) = crate::shard::Part::decode(b) else {
            return false;
        };
        assert!(
            p.encode() == b,
            "a part decoded from bytes that are not its encoding"
        );
        true
    }

    /// A writer's spill log: the records it holds up to the first torn or damaged one. Every
    /// record accepted must encode back to exactly the bytes it was read from.
    pub fn spill_log(b: &[u8]) -> usize {
        crate::writer::parse_log(b)
    }

    /// An upload marker (of chunk 0..3: the id is checked against the footer's).
    pub fn upload_marker(b: &[u8]) -> bool {
        (0..3).any(|c| crate::upload::decode_marker(b, c).is_some())
    }
}
