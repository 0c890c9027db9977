//! Snapshots of datasets in object stores, read in blocks.
//!
//! A reader of a billion-sample dataset must not fetch its snapshot whole. [`open_snapshot`]
//! fetches only its header and its block CRC table (checked against the header), and returns a
//! local *sparse* file of the snapshot's length plus a [`BlockPager`]: before the reader uses
//! any block of the mapped file, the pager fetches the blocks that are not there yet (one
//! ranged GET per run of missing blocks, several runs at once), checks each block's CRC and
//! writes it into the file.
//!
//! The sparse file lives in the snapshot cache, named by the dataset id and the content digest,
//! and is shared by the processes of a node: a block one process fetched is found by the
//! others, which check its CRC before they trust it (a block not yet written reads as zeros
//! and fails the check, unless its bytes are zeros, which is then right). Nothing marks a block as present but its CRC, so a crash cannot leave
//! a block marked and missing.
//!
//! The cache is bounded: opening a dataset evicts the least recently opened cached snapshots
//! until the others take at most `StoreConfig::snapshot_cache_max` bytes on disk. A process
//! that has an evicted file open keeps reading its blocks, and fetches into its own (now
//! unlinked) copy until it exits.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use granary_format::{
    snapshot_key, Blocks, FormatError, Pager, Snapshot, SnapshotHeader, SNAPSHOT_FILE,
};

use futures_util::stream::{self, StreamExt, TryStreamExt};

use super::ops::fetch_range;
use super::{block_on, watched, ObjectUrl, GET_PART};
use crate::config::StoreConfig;
use crate::counts::{Meter, MeterReading};
use crate::error::{RemoteKind, Result, StoreError};
use granary_format::DatasetId;

/// A snapshot opened from an object store: a local file, whole or sparse.
pub struct RemoteSnapshot {
    /// The local file: the whole snapshot, or a sparse file of its length.
    pub path: PathBuf,
    /// For a sparse file, what fetches its blocks.
    pub pager: Option<Arc<BlockPager>>,
}

/// Opens the snapshot of the dataset at `url` (its header, one ranged GET, names the cached
/// copy): a cached whole copy if there is one, else a sparse file and its pager (snapshots
/// larger than `cfg.snapshot_whole_max`), else the whole snapshot, fetched into the cache.
pub fn open_snapshot(url: &Arc<ObjectUrl>, cfg: &StoreConfig) -> Result<RemoteSnapshot> {
    let dir = &cfg.snapshot_cache;
    let budget = cfg.snapshot_cache_max;
    let snap_url = url.object_url(SNAPSHOT_FILE);
    let head = snapshot_head(url)?;
    let fmt = |e: FormatError| StoreError::format(&snap_url, e);
    let h = SnapshotHeader::decode(&head).map_err(fmt)?;
    let name = format!("{}-{}", DatasetId(h.dataset_id), DatasetId(h.digest));
    let cached = dir.join(format!("{name}.gsnap"));
    drop_other_generations(dir, &h.dataset_id, &name);
    if cached.is_file() || h.file_len() <= cfg.snapshot_whole_max {
        if !cached.is_file() {
            // Fetched whole, every section's CRC checked, the other cached snapshots kept
            // within the budget.
            evict(dir, budget, &cached);
            let bytes = url.get(SNAPSHOT_FILE)?;
            if snapshot_key(&bytes).map_err(fmt)? != (h.dataset_id, h.digest) {
                return Err(StoreError::damaged(
                    &snap_url,
                    "the snapshot was replaced while it was fetched; open the dataset again",
                ));
            }
            let snap = Snapshot::open(&bytes[..]).map_err(fmt)?;
            if let Some(e) = snap.check_blocks().into_iter().next() {
                return Err(fmt(e));
            }
            std::fs::create_dir_all(dir).map_err(|e| StoreError::io("creating", dir, e))?;
            // Not fsynced: a cached copy lost to a crash is fetched again.
            crate::write::write_atomic(&cached, crate::write::Durability::Rename, |w| {
                std::io::Write::write_all(w, &bytes)
            })
            .map_err(|e| StoreError::io("caching the snapshot in", &cached, e))?;
        }
        return Ok(RemoteSnapshot {
            path: cached,
            pager: None,
        });
    }
    let table = url.get_range(SNAPSHOT_FILE, h.crc_table())?;
    let blocks = Blocks::parse(&h, &table).map_err(fmt)?;
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io("creating", dir, e))?;
    let path = dir.join(format!("{name}.gblocks"));
    evict(dir, budget, &path);
    let file = sparse_file(&path, dir, &name, h.file_len())?;
    let pager = BlockPager {
        url: url.clone(),
        snap_url,
        path: path.clone(),
        file,
        blocks,
        meter: Meter::default(),
    };
    pager.meter.reads.fetch_add(2, Relaxed);
    pager
        .meter
        .bytes
        .fetch_add((head.len() + table.len()) as u64, Relaxed);
    // Header and CRC table are checked: every process writes them.
    pager.store(0, &head)?;
    pager.store(h.crc_table().start, &table)?;
    Ok(RemoteSnapshot {
        path,
        pager: Some(Arc::new(pager)),
    })
}

/// The sparse file `path` of `len` bytes, created under a temporary name and linked into
/// place (concurrent openers all end with the same file).
fn sparse_file(path: &Path, dir: &Path, name: &str, len: u64) -> Result<File> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
    };
    let file = match open() {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tmp = dir.join(format!(".{name}.{}.gblocks.tmp", std::process::id()));
            let f = File::create(&tmp).map_err(|e| StoreError::io("creating", &tmp, e))?;
            f.set_len(len)
                .map_err(|e| StoreError::io("sizing", &tmp, e))?;
            drop(f);
            let linked = std::fs::hard_link(&tmp, path);
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StoreError::io("creating", path, e)),
            }
            open().map_err(|e| StoreError::io("opening", path, e))?
        }
        Err(e) => return Err(StoreError::io("opening", path, e)),
    };
    let have = file
        .metadata()
        .map_err(|e| StoreError::io("reading", path, e))?
        .len();
    if have != len {
        return Err(StoreError::damaged(
            path,
            format!(
                "cached snapshot blocks file is {have} bytes, the snapshot {len}: remove it \
                 (it is only a cache)"
            ),
        ));
    }
    // Marks it as recently used for eviction.
    let _ = file.set_modified(std::time::SystemTime::now());
    Ok(file)
}

/// Removes the cached snapshots of dataset `id` other than `name` (other generations: an older
/// one may list samples deleted since, which a node must not keep). A process that has one
/// open keeps reading it (an unlinked file stays until it is closed).
fn drop_other_generations(dir: &Path, id: &[u8; 16], name: &str) {
    let prefix = format!("{}-", DatasetId(*id));
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = n.ends_with(".gsnap") || n.ends_with(".gblocks");
        if ours && n.starts_with(&prefix) && !n.starts_with(name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the least recently used cached snapshots (by mtime) other than `keep` until the
/// rest take at most `budget` bytes on disk (best effort).
pub fn evict(dir: &Path, budget: u64, keep: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p != keep
                && p.extension()
                    .is_some_and(|x| x == "gsnap" || x == "gblocks")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .filter_map(|p| {
            let m = std::fs::metadata(&p).ok()?;
            Some((m.modified().ok()?, m.blocks() * 512, p))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    files.sort();
    for (_, size, p) in files {
        if total <= budget {
            break;
        }
        if std::fs::remove_file(&p).is_ok() {
            total -= size;
        }
    }
}

/// Fetches a sparse snapshot's blocks on demand (see the module docs).
pub struct BlockPager {
    url: Arc<ObjectUrl>,
    snap_url: String,
    path: PathBuf,
    file: File,
    /// The block CRCs, and which blocks this process has checked in its file.
    blocks: Blocks,
    /// GETs of the snapshot (`reads`) and the bytes they fetched.
    meter: Meter,
}

impl BlockPager {
    /// GETs issued (`reads`) and bytes fetched for the snapshot by this process (open
    /// included).
    pub fn fetched(&self) -> MeterReading {
        self.meter.reading()
    }

    fn store(&self, at: u64, b: &[u8]) -> Result<()> {
        self.file
            .write_all_at(b, at)
            .map_err(|e| StoreError::io("writing", &self.path, e))
    }

    /// The blocks of `ranges` that are not present yet, sorted (checked in place first:
    /// blocks a process of the node already wrote count as present).
    fn missing(&self, ranges: &[Range<u64>]) -> Result<Vec<u64>> {
        let mut missing = Vec::new();
        for r in ranges {
            for b in self.blocks.blocks_of(r) {
                if self.blocks.is_checked(b) {
                    continue;
                }
                // Zeros where nothing was written yet.
                let r = self.blocks.block(b);
                let mut local = vec![0u8; (r.end - r.start) as usize];
                self.file
                    .read_exact_at(&mut local, r.start)
                    .map_err(|e| StoreError::io("reading", &self.path, e))?;
                if self.blocks.check(b, &local, &String::new).is_err() {
                    missing.push(b);
                }
            }
        }
        missing.sort_unstable();
        missing.dedup();
        Ok(missing)
    }

    /// The run of consecutive missing blocks at `start` (`bytes`, fetched with one GET),
    /// checked block by block, stored.
    fn store_run(&self, run: &[u64], start: u64, bytes: &[u8]) -> Result<()> {
        self.meter.reads.fetch_add(1, Relaxed);
        self.meter.bytes.fetch_add(bytes.len() as u64, Relaxed);
        for &b in run {
            let r = self.blocks.block(b);
            let data = &bytes[(r.start - start) as usize..(r.end - start) as usize];
            self.blocks
                .check(b, data, &|| "as fetched".into())
                .map_err(|e| StoreError::format(&self.snap_url, e))?;
        }
        self.store(start, bytes)
    }

    /// Makes every block of `ranges` present and checked: one GET per run of missing blocks
    /// (at most [`GET_PART`] each), up to [`RUNS_IN_FLIGHT`] at once.
    fn ensure(&self, ranges: &[Range<u64>]) -> Result<()> {
        let missing = self.missing(ranges)?;
        if missing.is_empty() {
            return Ok(());
        }
        let bs = self.blocks.block(0).end - self.blocks.block(0).start;
        let most = (GET_PART / bs.max(1)).max(1) as usize;
        let (client, key) = (self.url.client()?, self.url.key(SNAPSHOT_FILE));
        let runs = missing
            .chunk_by(|a, b| *b == a + 1)
            .flat_map(|run| run.chunks(most));
        let fetches = stream::iter(runs).map(|run| {
            let (start, end) = (
                self.blocks.block(run[0]).start,
                self.blocks.block(run[run.len() - 1]).end,
            );
            let fetched = fetch_range(&*client, &key, &self.snap_url, start..end);
            // Each GET is watched on its own: a warning names a wait, not a long batch.
            let fetched = watched("reading", &self.snap_url, self.url.timeouts, fetched);
            async move { Ok((run, start, fetched.await?)) }
        });
        let stored = fetches
            .buffer_unordered(RUNS_IN_FLIGHT)
            .try_for_each(|(run, start, b)| std::future::ready(self.store_run(run, start, &b)));
        block_on(stored)?
    }
}

/// Runs of missing blocks fetched at once by one [`Pager::need_all`] call.
const RUNS_IN_FLIGHT: usize = 8;

impl Pager for BlockPager {
    fn need_all(&self, ranges: &[Range<u64>]) -> granary_format::Result<()> {
        self.ensure(ranges).map_err(|e| FormatError::Unavailable {
            what: self.snap_url.clone(),
            detail: e.to_string(),
        })
    }
}

/// The header (first 96 bytes) of the snapshot of the dataset at `url` (one ranged GET), or an error
/// that says what the prefix holds instead (an upload that has not finished).
fn snapshot_head(url: &ObjectUrl) -> Result<bytes::Bytes> {
    use granary_format::{SNAPSHOT_FILE, SNAPSHOT_HEADER_LEN};
    match url.get_range(SNAPSHOT_FILE, 0..SNAPSHOT_HEADER_LEN as u64) {
        Err(StoreError::Remote {
            kind: RemoteKind::NotFound,
            ..
        }) if url.list().is_ok_and(|l| {
            l.iter()
                .any(|(n, _)| granary_format::parse_chunk_file_name(n).is_some())
        }) =>
        {
            Err(StoreError::Invalid(format!(
                "{}: holds chunks but no snapshot: an upload that has not finished (or was \
                 interrupted: `granary pack ... -o {} --resume` continues it)",
                url.url(),
                url.url()
            )))
        }
        r => r,
    }
}
