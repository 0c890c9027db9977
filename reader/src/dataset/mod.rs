//! Opening a dataset and reading single samples.

mod view;
pub use view::View;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use granary_format::{
    decode_record, ChunkEntry, ChunkHeader, Compression, FileStat, NsEntry, SampleEntry, Snapshot,
    CHUNK_HEADER_LEN, CHUNK_TRAILER_LEN, SNAPSHOT_FILE, SNAPSHOT_HEADER_LEN,
};
use granary_store::file::Mapped;
use granary_store::object::snapcache::BlockPager;

use crate::error::{ReadError, RecordError, Result};
use crate::pathfmt::escape_path;
use crate::plan::{DatasetShape, EpochPlan, EpochState, PlanOptions, Shard};
use granary_store::buf::{BufPool, ALIGN};
pub use granary_store::file::ChunkBytes;
use granary_store::file::{map_file, read_whole};
use granary_store::local::LocalDir;
use granary_store::{Access, ChunkStore, LocalTier, Source, StoreStack};
use granary_store::{Location, MeterReading, StoreConfig};

/// Metadata of one sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleInfo {
    /// Sample id (index in the snapshot).
    pub id: u64,
    /// Where and how the record is stored.
    pub entry: SampleEntry,
    /// Its compression.
    pub compression: Compression,
}

/// An open dataset: the memory-mapped snapshot and the store of its chunks (by default the
/// snapshot's directory). Cheap to share across threads (`Sync`); reads use positional I/O.
pub struct Dataset {
    snapshot_path: PathBuf,
    snap: Snapshot<Mapped>,
    store: Arc<dyn ChunkStore>,
    /// For a snapshot read in blocks from an object store: what fetches them.
    paged: Option<Arc<BlockPager>>,
    /// Opened through a view file: the samples epochs are planned over.
    view: Option<Arc<View>>,
    /// Of a snapshot with deleted samples: the others' ids (made on first use).
    live: std::sync::OnceLock<Arc<[u64]>>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("snapshot", &self.snapshot_path)
            .field("store", &self.store)
            .finish()
    }
}

impl Dataset {
    /// Opens the dataset at `path` (its directory, or its snapshot file). O(1): checks the
    /// snapshot's header, block CRC table, section table and section sizes; every other
    /// block is checked before its first use (see [`Dataset::open_checked`] and
    /// `granary::verify` for all at once).
    ///
    /// `path` may also be a URL (`s3://bucket/prefix`, `gs://`, `az://`, `http(s)://`): the
    /// snapshot is fetched once into a local cache and chunks are read with ranged GETs. The
    /// store's default configuration is used; front ends resolve theirs
    /// ([`StoreConfig::from_env`] and their flags) and call [`Dataset::open_with`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &StoreConfig::default())
    }

    /// [`Dataset::open`] with the store configured by `cfg` (object store timeouts, where
    /// fetched snapshots are cached, ...).
    pub fn open_with(path: impl AsRef<Path>, cfg: &StoreConfig) -> Result<Self> {
        if view::is_view_file(path.as_ref()) {
            return view::open(path.as_ref(), cfg);
        }
        let u = match granary_store::open(path.as_ref(), cfg)? {
            Location::Object(u) => u,
            Location::Local(p) => return Self::open_in(&p, None, None),
        };
        let snap = granary_store::object::snapcache::open_snapshot(&u, cfg)?;
        let mut ds = Self::open_in(&snap.path, None, snap.pager)?;
        let sizes = ds.chunk_entries()?.iter().map(|c| c.file_size).collect();
        let revisions = ds.snap.revisions().into();
        ds.store =
            Arc::new(granary_store::object::ObjectChunks::new(u, sizes).with_revisions(revisions));
        Ok(ds)
    }

    /// Opens the snapshot at `path` (a directory or the snapshot file, as for
    /// [`Dataset::open`]) with its chunks read from `store` instead of the snapshot's
    /// directory (O(1)).
    pub fn open_with_store(path: impl AsRef<Path>, store: Arc<dyn ChunkStore>) -> Result<Self> {
        Self::open_in(path.as_ref(), Some(store), None)
    }

    /// Opens the snapshot at `path`; with `paged`, a sparse copy whose blocks the pager
    /// fetches as they are read ([`granary_store::object::snapcache`]).
    fn open_in(
        path: &Path,
        store: Option<Arc<dyn ChunkStore>>,
        paged: Option<Arc<BlockPager>>,
    ) -> Result<Self> {
        let snapshot_path = snapshot_file(path);
        // `path` named the snapshot file itself, or its directory.
        let op = match snapshot_path == path {
            true => "opening dataset",
            false => "opening snapshot",
        };
        let file = granary_store::file::open_regular(&snapshot_path, 0);
        let file = file.map_err(|e| ReadError::io(op, &snapshot_path, e))?;
        let len = file
            .metadata()
            .map_err(|e| ReadError::io("reading", &snapshot_path, e))?
            .len();
        if len < SNAPSHOT_HEADER_LEN as u64 {
            return Err(ReadError::format(
                &snapshot_path,
                granary_format::FormatError::Truncated {
                    what: "snapshot header",
                    needed: SNAPSHOT_HEADER_LEN as u64,
                    available: len,
                },
            ));
        }
        let map = map_file(&file, &snapshot_path)?;
        // Opening and looking up touch a handful of pages spread over the file: without this,
        // every cold page fault reads a whole readahead window (often megabytes) instead.
        let _ = map.advise(memmap2::Advice::Random);
        let snap = match &paged {
            None => Snapshot::open(map),
            Some(p) => Snapshot::open_paged(map, p.clone()),
        }
        .map_err(|e| ReadError::format(&snapshot_path, e))?;
        let store = store.unwrap_or_else(|| {
            let revisions = snap.revisions().into();
            Arc::new(LocalDir::with_revisions(
                parent_dir(&snapshot_path),
                revisions,
            ))
        });
        Ok(Dataset {
            snapshot_path,
            snap,
            store,
            paged,
            view: None,
            live: Default::default(),
        })
    }

    /// The view this dataset was opened through, if any: epochs deliver its samples only.
    pub fn view(&self) -> Option<&View> {
        self.view.as_deref()
    }

    /// Opens the dataset and checks every block of the snapshot (O(snapshot size)).
    ///
    /// A snapshot read in blocks from an object store is not fetched whole for this: each of
    /// its blocks is checked against its CRC before first use anyway.
    pub fn open_checked(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_checked_with(path, &StoreConfig::default())
    }

    /// [`Dataset::open_checked`] with the store configured by `cfg`.
    pub fn open_checked_with(path: impl AsRef<Path>, cfg: &StoreConfig) -> Result<Self> {
        let ds = Self::open_with(path, cfg)?;
        if ds.snap.is_paged() {
            return Ok(ds);
        }
        // A full sequential pass follows: ask for the whole file up front.
        ds.prefetch_metadata();
        match ds.snap.check_blocks().into_iter().next() {
            Some(e) => Err(ReadError::format(&ds.snapshot_path, e)),
            None => Ok(ds),
        }
    }

    /// Where the dataset is, for messages: its URL, or its directory.
    pub fn location(&self) -> String {
        self.store.location()
    }

    /// Asks the kernel to read the whole snapshot ahead, for workloads that will touch most of
    /// it (full scans, many lookups); `open` itself advises random access.
    pub fn prefetch_metadata(&self) {
        let map = self.snap.bytes_container();
        let _ = map.advise(memmap2::Advice::WillNeed);
    }

    /// For a snapshot read in blocks from an object store: the GETs issued and bytes fetched
    /// for it so far by this process, its opening included (`None` for a snapshot held whole).
    pub fn snapshot_fetched(&self) -> Option<MeterReading> {
        self.paged.as_ref().map(|p| p.fetched())
    }

    /// What reading the snapshot took so far: opening it (its metadata calls), and for a
    /// snapshot read in blocks the GETs (`reads`) and bytes fetched of it.
    pub fn snapshot_reading(&self) -> MeterReading {
        let mut r = self.snapshot_fetched().unwrap_or_default();
        // Opening it: is_dir, open, fstat, and the map's own fstat.
        r.metadata_ops += 4;
        r
    }

    /// Where the chunks are read from.
    pub fn store(&self) -> &Arc<dyn ChunkStore> {
        &self.store
    }

    /// The directory of the snapshot file (for a dataset at a URL: of its cached snapshot).
    pub fn dir(&self) -> &Path {
        parent_dir(&self.snapshot_path)
    }

    /// Path of the snapshot file.
    pub fn snapshot_path(&self) -> &Path {
        &self.snapshot_path
    }

    /// The snapshot itself, for low-level access.
    pub fn snapshot(&self) -> &Snapshot<Mapped> {
        &self.snap
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.snap.sample_count()
    }

    /// Samples selected: a view's (opened through a view file), else every sample not
    /// deleted.
    pub fn selected_len(&self) -> u64 {
        match &self.view {
            Some(v) => v.ids.len() as u64,
            None => self.snap.live_count(),
        }
    }

    /// The ids of the samples epochs deliver, rising, when that is not every id below
    /// [`Dataset::len`]: a view's selection, or the samples a deletion left (8 bytes each,
    /// made once). `None`: every sample.
    pub fn selection(&self) -> Option<&Arc<[u64]>> {
        if let Some(v) = &self.view {
            return Some(&v.ids);
        }
        let deleted = self.snap.deleted();
        if deleted.is_empty() {
            return None;
        }
        Some(self.live.get_or_init(|| {
            let mut d = deleted.iter().copied().peekable();
            (0..self.len())
                .filter(|&i| match d.peek() {
                    Some(&x) if x == i => {
                        d.next();
                        false
                    }
                    _ => true,
                })
                .collect()
        }))
    }

    /// True when the dataset holds no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> u64 {
        self.snap.chunk_count()
    }

    /// The digest of a complete epoch (every sample once, right bytes) from the snapshot's
    /// record CRCs: the sum of [`crate::digest_term`] over all samples (O(samples), no chunk
    /// is read).
    pub fn full_digest(&self) -> Result<u64> {
        let err = |e| ReadError::format(&self.snapshot_path, e);
        let live = (0..self.len()).filter(|&id| self.snap.deleted_by(id).is_none());
        live.into_iter().try_fold(0u64, |acc, id| {
            let e = self.snap.sample(id).map_err(err)?;
            Ok(acc.wrapping_add(crate::digest_term(id, e.crc32)))
        })
    }

    /// A digest of the dataset's content, independent of its layout: the sum (mod 2^64) over
    /// samples of a keyed hash of the path, the original length and CRC-32, and the class name.
    /// Two datasets holding the same files with the same labels have the same content digest
    /// however they were packed (one process or shards, any chunk size, order or seed).
    pub fn samples_digest(&self) -> Result<u64> {
        let err = |e| ReadError::format(&self.snapshot_path, e);
        let live = (0..self.len()).filter(|&id| self.snap.deleted_by(id).is_none());
        live.into_iter().try_fold(0u64, |acc, id| {
            let e = self.snap.sample(id).map_err(err)?;
            let path = granary_format::path_hash(&self.snap.path(id).map_err(err)?);
            let class = match e.label {
                granary_format::NO_LABEL => u64::MAX,
                l => granary_format::path_hash(self.snap.class_name(l).map_err(err)?),
            };
            let h = granary_format::SplitMix64::keyed(&[path, e.orig_len, e.crc32 as u64, class])
                .next_u64();
            Ok(acc.wrapping_add(h))
        })
    }

    /// Makes the record entries of `ids` present (and checked) before they are read one by
    /// one: one fetch per run of nearby ids for a snapshot read in blocks from an object
    /// store (a window of a chunk-wise epoch: one per chunk at most, never one per sample).
    pub fn prefetch_samples(&self, ids: &[u64]) -> Result<()> {
        if !self.snap.is_paged() || ids.is_empty() {
            return Ok(());
        }
        // Ids closer than this share a run (a 64 KiB block holds 4,096 entries).
        const GAP: u64 = 2048;
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted
            .chunk_by(|&a, &b| b <= a + GAP)
            .try_for_each(|run| self.snap.prefetch_records(run[0]..run[run.len() - 1] + 1))
            .map_err(|e| self.fmt_err(e))
    }

    /// Makes the whole namespace present before a full listing (`ls` of everything, a
    /// walk of the tree): for a snapshot read in blocks, large concurrent fetches instead of
    /// one block at a time.
    pub fn prefetch_namespace(&self) -> Result<()> {
        self.snap.prefetch_namespace().map_err(|e| self.fmt_err(e))
    }

    /// The namespace entries (files and directories) at `positions`, in path order; the pages
    /// of the run are fetched at once when the snapshot is read in blocks.
    pub fn entries(&self, positions: std::ops::Range<u64>) -> Result<Vec<NsEntry>> {
        self.checked(self.snap.entries(positions))
    }

    /// The namespace entry at position `pos`.
    pub fn entry(&self, pos: u64) -> Result<NsEntry> {
        self.checked(self.snap.entry(pos))
    }

    /// Number of namespace entries (files and directories).
    pub fn entry_count(&self) -> u64 {
        self.snap.entry_count()
    }

    /// The entry whose path is exactly `path` (a file or a directory) and its position.
    pub fn find(&self, path: &[u8]) -> Result<Option<(u64, NsEntry)>> {
        let v = self.snap.find(path).map_err(|e| self.fmt_err(e))?;
        self.intact(v.filter(|(_, e)| e.id.is_none_or(|id| self.selects(id))))
    }

    /// The record entries of `ids` fetched together before they are read one by one (a
    /// listing's files).
    pub fn prefetch_samples_at(&self, ids: &[u64]) -> Result<()> {
        ids.iter()
            .try_for_each(|&id| self.snap.prefetch_records(id..id + 1))
            .map_err(|e| self.fmt_err(e))
    }

    /// Positions in the namespace of every path starting with `prefix`
    /// ([`Snapshot::prefix_range`]).
    pub fn prefix_range(&self, prefix: &[u8]) -> Result<std::ops::Range<u64>> {
        self.checked(self.snap.prefix_range(prefix))
    }

    /// The first position after every path starting with `prefix` (the entry count if none
    /// follows).
    pub fn prefix_end(&self, prefix: &[u8]) -> Result<u64> {
        match granary_format::prefix_successor(prefix) {
            Some(s) => self.checked(self.snap.lower_bound(&s)),
            None => Ok(self.entry_count()),
        }
    }

    /// The chunk table's entries, in chunk order (O(chunks)).
    pub(crate) fn chunk_entries(&self) -> Result<Vec<ChunkEntry>> {
        (0..self.chunk_count() as u32)
            .map(|c| self.chunk(c))
            .collect()
    }

    /// Bytes of all chunk files (O(chunks)).
    pub fn total_chunk_bytes(&self) -> Result<u64> {
        let sizes = self.chunk_entries()?.into_iter().map(|c| c.file_size);
        Ok(sizes.fold(0, u64::saturating_add))
    }

    /// Chunks per shuffle window that keep one reader within `memory` bytes of read buffers
    /// (O(chunks)): three windows are in memory at once (being consumed, decoded, read), so
    /// W = memory / (3 × mean chunk size, rounded as read buffers are), at least 1; the rest of
    /// the budget is used for read-ahead (see [`crate::StreamOptions::memory`]).
    pub fn window_for_memory(&self, memory: u64) -> Result<usize> {
        let chunks = self.chunk_count().max(1);
        let mean = (self.total_chunk_bytes()? / chunks).max(1);
        // A chunk read takes its size in buffers, rounded as the pool rounds them.
        let charge = BufPool::charge(mean as usize + 2 * ALIGN) as u64;
        Ok((memory / (3 * charge)).max(1) as usize)
    }

    /// `plan` with its window resolved: `window_chunks` 0 means as many chunks as `memory`
    /// bytes of read buffers allow ([`Dataset::window_for_memory`]).
    pub fn resolve_window(&self, plan: &PlanOptions, memory: u64) -> Result<PlanOptions> {
        let mut o = plan.clone();
        if o.window_chunks == 0 {
            o.window_chunks = self.window_for_memory(memory)?;
        }
        Ok(o)
    }

    /// The chunk sample ranges that epoch plans are computed from (O(chunks)); through a view,
    /// each chunk's selected samples (O(chunks + selected)).
    pub fn shape(&self) -> Result<DatasetShape> {
        let counts = self.chunk_entries()?.into_iter().map(|ce| ce.sample_count);
        let shape = DatasetShape::from_counts(counts);
        Ok(match self.selection() {
            None => shape,
            Some(ids) => shape.select(ids.clone()),
        })
    }

    /// Streams `shard`'s share of `epoch` as planned by `plan` (resuming from `resume` if
    /// given): the reader library's main entry point.
    pub fn stream_epoch(
        self: &std::sync::Arc<Self>,
        plan: &PlanOptions,
        epoch: u64,
        shard: Shard,
        resume: Option<&EpochState>,
        io: &crate::StreamOptions,
    ) -> Result<crate::EpochStream> {
        let p = EpochPlan::build(&self.shape()?, plan, epoch, shard, resume);
        let p = p.map_err(ReadError::invalid)?;
        crate::EpochStream::new(self.clone(), p, plan.mode, io)
    }

    /// The store stack of a reader that reads as `access` says: `tier` (if any) over `peers`
    /// (if any, and only with a tier: peers share tiers) over the dataset's own store.
    pub fn stack(
        &self,
        access: Access,
        tier: Option<Arc<LocalTier>>,
        peers: Option<Arc<granary_store::Peers>>,
    ) -> Result<StoreStack> {
        Ok(match tier {
            None => StoreStack::plain(&self.store, access),
            Some(t) => {
                let chunks = self.chunk_entries()?;
                // Chunks keeping deleted samples' records are never copied to a tier (a
                // copy there is removed as the stack is made).
                t.forbid(&chunks, &self.dead_chunks()?);
                StoreStack::with_tier(&self.store, chunks.into(), access, t, peers)
            }
        })
    }

    /// The chunks whose files keep records of deleted samples, rising.
    pub fn dead_chunks(&self) -> Result<Vec<u32>> {
        let dead = self.snap.dead_records().map_err(|e| self.fmt_err(e))?;
        Ok(dead.into_iter().map(|d| d.0).collect())
    }

    /// Location of chunk `id`'s file in the dataset's store (a path, or a URL written as one).
    pub fn chunk_path(&self, id: u32) -> PathBuf {
        self.store.chunk_location(id)
    }

    /// Opens chunk `id` in `store` (the top of a reader's [`crate::StoreStack`], or one of
    /// its layers) and checks its length against the chunk table.
    pub fn open_chunk_in(&self, store: &dyn ChunkStore, id: u32) -> Result<Source> {
        let ce = self.chunk(id)?;
        let src = store.open_chunk(id)?;
        if src.len() != ce.file_size {
            let (c, got, want) = (ce.chunk_id, src.len(), ce.file_size);
            let m = format!("chunk {c}: file is {got} bytes, the snapshot says {want}");
            return Err(ReadError::mismatch(src.location(), m));
        }
        Ok(src)
    }

    fn fmt_err(&self, e: granary_format::FormatError) -> ReadError {
        self.cut_error()
            .unwrap_or_else(|| ReadError::format(&self.snapshot_path, e))
    }

    /// The error to give when the snapshot file was cut short under its map: pages wholly past
    /// the new end fault (the map is then marked, see `granary_store::file::Mapped`); the rest
    /// of the last page reads as zeros without a fault, so an error found in the snapshot's
    /// contents also compares the file's size with the map's (one `stat`, on errors only).
    fn cut_error(&self) -> Option<ReadError> {
        let map = self.snap.bytes_container();
        let cut = map.is_cut()
            || std::fs::metadata(&self.snapshot_path).map_or(true, |m| m.len() < map.len() as u64);
        let m = "the snapshot file was cut short while in use (truncated by another \
                 process); open the dataset again";
        cut.then(|| ReadError::mismatch(&self.snapshot_path, m))
    }

    /// `v`, read from the mapped snapshot, unless the map found the file cut short (then what
    /// was read may be zeros: an error naming the file instead). Checked after every lookup;
    /// values are copied out before the check, slices touched.
    fn intact<T>(&self, v: T) -> Result<T> {
        if self.snap.bytes_container().is_cut() {
            return Err(self.cut_error().expect("a cut map is a cut file"));
        }
        Ok(v)
    }

    /// What a lookup in the mapped snapshot gave: its error as [`Dataset::fmt_err`] says, its
    /// value checked by [`Dataset::intact`].
    fn checked<T>(&self, r: std::result::Result<T, granary_format::FormatError>) -> Result<T> {
        self.intact(r.map_err(|e| self.fmt_err(e))?)
    }

    /// A slice of the mapped snapshot, each of its pages read once (so that a page that is
    /// gone is found now, by [`Dataset::intact`], not by the caller).
    fn touched<'a>(&self, b: &'a [u8]) -> Result<&'a [u8]> {
        let page = 4096;
        let mut sum = 0u8;
        for i in (0..b.len()).step_by(page).chain(b.len().checked_sub(1)) {
            sum ^= b[i];
        }
        std::hint::black_box(sum);
        self.intact(b)
    }

    /// Metadata of sample `id`.
    pub fn sample(&self, id: u64) -> Result<SampleInfo> {
        let entry = self.snap.sample(id).map_err(|e| self.fmt_err(e))?;
        let compression = entry.compression().map_err(|e| self.fmt_err(e))?;
        self.intact(SampleInfo {
            id,
            entry,
            compression,
        })
    }

    /// Chunk table entry of chunk `id`.
    pub fn chunk(&self, id: u32) -> Result<ChunkEntry> {
        self.checked(self.snap.chunk(id as u64))
    }

    /// Path of sample `id` relative to the packed directory (raw bytes).
    pub fn path(&self, id: u64) -> Result<Vec<u8>> {
        self.checked(self.snap.path(id))
    }

    /// The sample whose path is `path` with its size (and mode and mtime when recorded); through
    /// a view, only a sample the view holds.
    pub fn lookup_stat(&self, path: &[u8]) -> Result<Option<(u64, FileStat)>> {
        let v = self.snap.lookup_stat(path).map_err(|e| self.fmt_err(e))?;
        self.intact(v.filter(|(id, _)| self.selects(*id)))
    }

    /// True if sample `id` is one of the dataset's (of the view's, through a view), not
    /// deleted.
    pub fn selects(&self, id: u64) -> bool {
        match &self.view {
            None => id < self.len() && self.snap.deleted_by(id).is_none(),
            Some(v) => v.ids.binary_search(&id).is_ok(),
        }
    }

    /// Sample `id`'s size (original length) and, when recorded, mode and mtime.
    pub fn stat(&self, id: u64) -> Result<FileStat> {
        self.checked(self.snap.stat(id))
    }

    /// Sample `id`'s file mode and mtime as packed; `None` for datasets that do not record
    /// them (packed with `--no-metadata`, or written from sources that have none).
    pub fn attrs(&self, id: u64) -> Result<Option<granary_format::FileAttrs>> {
        self.checked(self.snap.attrs(id))
    }

    /// The directories of the namespace (every ancestor of a file, and the empty ones the
    /// source recorded), sorted by path, with their modes and mtimes when recorded. Reads the
    /// whole namespace.
    pub fn dirs(&self) -> Result<Vec<NsEntry>> {
        self.checked(self.snap.dirs())
    }

    /// Sample id of `path`, if the dataset (through a view: the view) holds it.
    pub fn lookup(&self, path: &[u8]) -> Result<Option<u64>> {
        let id = self.snap.lookup(path).map_err(|e| self.fmt_err(e))?;
        self.intact(id.filter(|&id| self.selects(id)))
    }

    /// Class names, indexed by label.
    pub fn classes(&self) -> Result<Vec<&[u8]>> {
        (0..self.snap.class_count())
            .map(|i| self.snap.class_name(i as u32).map_err(|e| self.fmt_err(e)))
            .collect()
    }

    /// Name of class `label`.
    pub fn class_name(&self, label: u32) -> Result<&[u8]> {
        let name = self.snap.class_name(label).map_err(|e| self.fmt_err(e))?;
        self.touched(name)
    }

    pub(crate) fn record_error(
        &self,
        info: &SampleInfo,
        source: granary_format::FormatError,
    ) -> ReadError {
        let sample_path = self
            .path(info.id)
            .map(|p| escape_path(&p))
            .unwrap_or_else(|_| "?".into());
        ReadError::Record(Box::new(RecordError {
            path: self.chunk_path(info.entry.chunk),
            chunk: info.entry.chunk,
            offset: info.entry.offset,
            sample: info.id,
            sample_path,
            source,
        }))
    }

    /// Checks that `info`'s record lies inside its chunk as the chunk table describes it.
    pub(crate) fn check_placement(&self, info: &SampleInfo) -> Result<ChunkEntry> {
        let e = &info.entry;
        let ce = self.chunk(e.chunk)?;
        let records_end = ce.file_size.saturating_sub(CHUNK_TRAILER_LEN as u64);
        let inside = ce.samples().contains(&info.id)
            && e.offset >= CHUNK_HEADER_LEN as u64
            && e.offset
                .checked_add(e.stored_len)
                .is_some_and(|end| end <= records_end);
        if inside {
            return Ok(ce);
        }
        Err(self.cut_error().unwrap_or_else(|| {
            let detail = format!(
                "record {}+{} lies outside chunk {} ({} bytes)",
                e.offset, e.stored_len, e.chunk, ce.file_size
            );
            let what = "sample entry".into();
            self.record_error(info, granary_format::FormatError::Invalid { what, detail })
        }))
    }

    /// True if the dataset's samples have named fields.
    pub fn has_fields(&self) -> bool {
        self.snap.has_fields()
    }

    /// The field names the dataset's samples use (sorted; empty without fields).
    pub fn field_names(&self) -> Result<Vec<&[u8]>> {
        self.checked(self.snap.field_names())
    }

    /// The fields of sample `id` (name, offset in the sample's bytes, length, CRC-32); empty
    /// for a dataset without fields.
    pub fn fields(&self, id: u64) -> Result<Vec<granary_format::SampleField<'_>>> {
        self.checked(self.snap.fields(id))
    }

    /// Splits the bytes of sample `id` (as [`Dataset::read`] or a stream gives them, checked
    /// whole) into its fields: `(name, bytes)` in stored order, each checked against its own
    /// CRC-32 (the whole record's CRC does not tell which bytes are which field's). A sample
    /// without fields is one unnamed field.
    pub fn split_fields<'d>(&self, id: u64, data: &'d [u8]) -> Result<Vec<(&[u8], &'d [u8])>> {
        let fields = self.fields(id)?;
        if fields.is_empty() {
            return Ok(vec![(&b""[..], data)]);
        }
        let n = data.len();
        let short = || ReadError::invalid(format!("sample {id}: {n} bytes do not hold its fields"));
        fields
            .iter()
            .map(|f| {
                let d = data.get(f.offset as usize..(f.offset + f.len) as usize);
                let d = d.ok_or_else(short)?;
                if granary_format::crc32(d) != f.crc32 {
                    return Err(ReadError::invalid(format!(
                        "sample {id}: field {} fails its CRC-32 (the snapshot's field table \
                         does not match the record)",
                        escape_path(f.name)
                    )));
                }
                Ok((f.name, d))
            })
            .collect()
    }

    /// Reads the fields `names` of sample `id` (all of them with `None`), each with one
    /// positional read of its own bytes and checked against its own CRC-32: the rest of the
    /// sample is not read. Fields the sample lacks are left out; on a dataset without fields,
    /// an error.
    pub fn read_fields(&self, id: u64, names: Option<&[&[u8]]>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if !self.has_fields() {
            let m = format!("{}: the samples have no named fields", self.location());
            return Err(ReadError::invalid(m));
        }
        let info = self.sample(id)?;
        self.check_placement(&info)?;
        let wanted: Vec<_> = self
            .fields(id)?
            .into_iter()
            .filter(|f| names.is_none_or(|n| n.contains(&f.name)))
            .collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let f = self.open_for_reads(&*self.store, info.entry.chunk)?;
        let mut out = Vec::with_capacity(wanted.len());
        for field in wanted {
            if field.offset.saturating_add(field.len) > info.entry.stored_len {
                return Err(self.record_error(
                    &info,
                    granary_format::FormatError::Invalid {
                        what: "field".into(),
                        detail: "lies past its record".into(),
                    },
                ));
            }
            let mut data = vec![0u8; field.len as usize];
            read_exact(&f, &mut data, info.entry.offset + field.offset)?;
            let actual = granary_format::crc32(&data);
            if actual != field.crc32 {
                return Err(self.record_error(
                    &info,
                    granary_format::FormatError::ChecksumMismatch {
                        what: format!("field {}", String::from_utf8_lossy(field.name)),
                        expected: field.crc32,
                        actual,
                    },
                ));
            }
            out.push((field.name.to_vec(), data));
        }
        Ok(out)
    }

    /// The sample and field that the file name `KEY.FIELD` of a dataset with fields names
    /// (as `ls`, `extract` and the mount show them).
    pub fn lookup_field(&self, path: &[u8]) -> Result<Option<(u64, Vec<u8>)>> {
        let Some((key, name)) = granary_format::split_field_path(path) else {
            return Ok(None);
        };
        let Some(id) = self.lookup(key)? else {
            return Ok(None);
        };
        let has = self.fields(id)?.iter().any(|f| f.name == name);
        Ok(has.then(|| (id, name.to_vec())))
    }

    /// Reads sample `id` with positional reads and returns its original bytes after checking
    /// the chunk header (dataset id, chunk id), the length and the CRC-32.
    pub fn read(&self, id: u64) -> Result<Vec<u8>> {
        let info = self.sample(id)?;
        self.check_placement(&info)?;
        let f = self.open_for_reads(&*self.store, info.entry.chunk)?;
        let mut stored = vec![0u8; info.entry.stored_len as usize];
        read_exact(&f, &mut stored, info.entry.offset)?;
        match decode_record(&info.entry, &stored) {
            Ok(Cow::Borrowed(_)) => Ok(stored),
            Ok(Cow::Owned(v)) => Ok(v),
            Err(e) => Err(self.record_error(&info, e)),
        }
    }

    /// Opens chunk `chunk` in `store` for random reads and checks its size and header.
    pub(crate) fn open_for_reads(&self, store: &dyn ChunkStore, chunk: u32) -> Result<Source> {
        let f = self.open_chunk_in(store, chunk)?;
        let mut head = [0u8; CHUNK_HEADER_LEN];
        read_exact(&f, &mut head, 0)?;
        self.check_chunk_header(&head, chunk, f.location())?;
        Ok(f)
    }

    /// Checks a chunk header against this dataset.
    pub fn check_chunk_header(&self, head: &[u8], chunk: u32, path: &Path) -> Result<()> {
        let h = ChunkHeader::decode(head).map_err(|e| ReadError::format(path, e))?;
        if h.dataset_id != self.snap.dataset_id() {
            let m = "chunk belongs to another dataset (dataset id differs)";
            return Err(ReadError::mismatch(path, m));
        }
        if h.chunk_id != chunk {
            let m = format!("holds chunk id {}, expected {chunk}", h.chunk_id);
            return Err(ReadError::mismatch(path, m));
        }
        Ok(())
    }

    /// Loads a whole chunk file (read into memory, or mapped when a local file larger than
    /// 512 MiB) and checks its size and header against the snapshot.
    pub fn load_chunk(&self, chunk: u32) -> Result<ChunkBytes> {
        let f = self.open_chunk_in(&*self.store, chunk)?;
        let bytes = read_whole(&*f)?;
        self.check_chunk_header(&bytes, chunk, f.location())?;
        Ok(bytes)
    }

    /// Decodes sample `id` from its loaded chunk (see [`Dataset::load_chunk`]); raw records are
    /// borrowed from `chunk` without copying.
    pub fn decode_from<'a>(&self, chunk: &'a [u8], id: u64) -> Result<Cow<'a, [u8]>> {
        let info = self.sample(id)?;
        self.check_placement(&info)?;
        let e = &info.entry;
        let stored = chunk
            .get(e.offset as usize..(e.offset + e.stored_len) as usize)
            .ok_or_else(|| ReadError::invalid(format!("sample {id}: chunk bytes too short")))?;
        decode_record(e, stored).map_err(|err| self.record_error(&info, err))
    }
}

/// The ownership of `ds`'s chunks for a job of `world` ranks on `nodes` nodes whose tiers
/// hold `capacities[node]` bytes, from `epoch`'s plan.
pub fn ownership(
    ds: &Dataset,
    plan: &PlanOptions,
    epoch: u64,
    world: u32,
    nodes: u32,
    capacities: &[u64],
) -> Result<granary_store::Ownership> {
    if nodes == 0 || world == 0 || !world.is_multiple_of(nodes) {
        return Err(ReadError::invalid(format!(
            "{world} ranks cannot be spread evenly over {nodes} nodes: the world size must \
             be a multiple of the node count"
        )));
    }
    if capacities.len() != nodes as usize {
        let m = format!("{} tier capacities for {nodes} nodes", capacities.len());
        return Err(ReadError::invalid(m));
    }
    let shape = ds.shape()?;
    let per_node = world / nodes;
    let home: Vec<u32> = crate::plan::chunk_readers(&shape, plan, epoch, world)
        .into_iter()
        .map(|r| r / per_node)
        .collect();
    let sizes: Vec<u64> = ds.chunk_entries()?.iter().map(|ce| ce.file_size).collect();
    Ok(granary_store::Ownership::assign(&home, &sizes, capacities))
}

/// The snapshot file of the dataset at `path` (its directory, or the file itself).
pub(crate) fn snapshot_file(path: &Path) -> PathBuf {
    match path.is_dir() {
        true => path.join(SNAPSHOT_FILE),
        false => path.to_path_buf(),
    }
}

/// The directory of the file at `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    dir.unwrap_or(Path::new("."))
}

/// Reads `buf.len()` bytes of `f` at `offset`, through the store's one function for single
/// reads (bytes from a copy checked and, when they fail, read below it).
pub(crate) fn read_exact(f: &Source, buf: &mut [u8], offset: u64) -> Result<()> {
    let unchecked = granary_store::verified::Expect::default();
    granary_store::verified::read_into(f, offset, buf, &unchecked)?;
    Ok(())
}
