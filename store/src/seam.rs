//! The storage seam: a [`ChunkStore`] opens a dataset's chunk files; each open file is a
//! [`ChunkSource`] with a length, batched ranged reads, and where its bytes come from
//! ([`BytesFrom`]). Streams, random access and the mount see only these two traits. Layers
//! (the tier, the peers) wrap the next store down to origin ([`crate::StoreStack`]). The I/O
//! engine reads a local file, or a layer over one, its own way ([`ChunkSource::local`]), every
//! other source through [`ChunkSource::read_ranges`].

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use granary_format::ChunkEntry;

use crate::counts::Meter;
use crate::error::{Result, StoreError};
use crate::guard::Mapped;

/// Where the bytes of a source come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BytesFrom {
    /// A copy in this node's local tier.
    Tier,
    /// A copy in another node's tier (shared tiers).
    Peer,
    /// The dataset's own storage.
    Origin,
}

impl BytesFrom {
    /// True for bytes from a copy (this node's tier, another node's), which the store checks
    /// before use and gives up when they fail ([`ChunkSource::fall_back`]).
    pub fn is_copy(self) -> bool {
        self != BytesFrom::Origin
    }
}

/// One range to read: `buf` receives the bytes at `offset`; the first `need` bytes must exist
/// (the rest of `buf` may lie past the end of the source and is left as it is).
pub struct RangeRead<'a> {
    pub offset: u64,
    pub buf: &'a mut [u8],
    pub need: usize,
}

/// What the I/O engine read of a source on its local file ([`ChunkSource::local`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalRead {
    pub ranges: u64,
    /// Bytes read (or served from the file's map).
    pub bytes: u64,
    /// These ranges' share, by bytes, of the time their batch took (nothing from a map).
    pub waited: Duration,
    pub failed: bool,
}

/// A local file as the I/O engine reads it itself ([`ChunkSource::local`]): with positional
/// reads or io_uring on its descriptor, or as slices of its map.
pub trait LocalFile: Send + Sync + Debug {
    fn file(&self) -> &std::fs::File;
    /// Its path, for errors.
    fn path(&self) -> &Path;
    /// Opened with `O_DIRECT`: reads must be aligned.
    fn direct(&self) -> bool;
    /// The file mapped, when it is resident in the page cache: its reads are slices of the map.
    fn map(&self) -> Option<&Mapped>;
    /// True when the map no longer shows the file as it was mapped (cut short since).
    fn map_cut(&self) -> bool;
}

/// An open chunk file.
pub trait ChunkSource: Send + Sync + Debug {
    /// Where the bytes are (a path, or a URL written as one), for errors.
    fn location(&self) -> &Path;

    /// Length in bytes, as seen when the source was opened.
    fn len(&self) -> u64;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads every range (in any order, concurrently if the store can). Errors name the
    /// location and offset; a source that ends before a range's `need` bytes is an
    /// `UnexpectedEof` error, never a short buffer.
    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()>;

    /// Where its bytes come from: for a source that may fall back to the next layer, those of
    /// its latest read (before any read, where it will try first).
    fn bytes_from(&self) -> BytesFrom {
        BytesFrom::Origin
    }

    /// The local file whose bytes this source serves as they are, which the I/O engine may
    /// read itself instead of calling [`ChunkSource::read_ranges`]. A layer that does not
    /// change the bytes forwards it (and learns of the reads through
    /// [`ChunkSource::observe_local`]).
    fn local(&self) -> Option<&dyn LocalFile> {
        None
    }

    /// True when this source is best read whole: a copy (checked by its whole-file CRC), or a
    /// peer's chunk (peers serve whole chunks only).
    fn whole_reads(&self) -> bool {
        self.bytes_from().is_copy()
    }

    /// True when this source's reads are slices of a map (counted in the reader's RSS).
    fn mapped(&self) -> bool {
        self.local().is_some_and(|l| l.map().is_some())
    }

    /// Told by the engine what it read through [`ChunkSource::local`]. Layers forward it to
    /// the source they wrap.
    fn observe_local(&self, read: LocalRead) {
        let _ = read;
    }

    /// Gives up what this source served from `served` after those bytes failed (`why`), so
    /// that its later reads come from the layer below. True when the source now reads
    /// elsewhere (also when another reader's failure moved it already); false (the default)
    /// when nothing lies below: the failure is the dataset's own. Called by verified reads only.
    fn fall_back(&self, why: &str, served: BytesFrom) -> Result<bool> {
        let _ = (why, served);
        Ok(false)
    }
}

/// A shared open chunk file.
pub type Source = Arc<dyn ChunkSource>;

/// Chunk `ce` opened in `store`, its size checked against the snapshot's: a layer reading
/// below a copy (a copy's size was checked when it was made).
pub(crate) fn open_sized(store: &dyn ChunkStore, ce: &ChunkEntry) -> Result<Source> {
    let src = store.open_chunk(ce.chunk_id)?;
    if src.len() == ce.file_size {
        return Ok(src);
    }
    let detail = format!(
        "chunk {}: file is {} bytes, the snapshot says {} (truncated or replaced)",
        ce.chunk_id,
        src.len(),
        ce.file_size
    );
    Err(StoreError::damaged(src.location(), detail))
}

/// Where a dataset's chunk files are.
pub trait ChunkStore: Send + Sync + Debug {
    /// Location of chunk `id`'s file (a path, or a URL written as one), for errors.
    fn chunk_location(&self, id: u32) -> PathBuf;

    /// Where the chunks are (a directory, or a URL prefix), for messages.
    fn location(&self) -> String {
        let first = self.chunk_location(0);
        first.parent().unwrap_or(&first).display().to_string()
    }

    /// Opens chunk `id`'s file.
    fn open_chunk(&self, id: u32) -> Result<Source>;

    /// Every file (or object) where the chunks are, as name and location (for `verify`);
    /// none from stores that cannot list.
    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        Ok(Vec::new())
    }

    /// This store tuned for a reader that reads as `access` says, or `None` when it has
    /// nothing to tune.
    fn tuned(&self, access: &Access) -> Option<Arc<dyn ChunkStore>> {
        let _ = access;
        None
    }
}

granary_format::named_enum! {
    /// How a reader reads chunk files through the page cache.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum IoMode ("I/O mode") {
        /// Through the page cache where the data is resident or meant to stay, `O_DIRECT`
        /// elsewhere ([`crate::Opener`]).
        #[default]
        Auto = "auto",
        /// Always `O_DIRECT` where the file system allows it (cold benchmarks, or data that must
        /// not occupy memory).
        Direct = "direct",
        /// Always through the page cache.
        Buffered = "buffered",
    }
}

/// How a reader will read a dataset's chunks; stores that can use it tune themselves
/// ([`ChunkStore::tuned`]), others ignore it.
#[derive(Clone, Debug)]
pub struct Access {
    pub mode: IoMode,
    /// The dataset's chunk bytes, and the page cache [`IoMode::Auto`] may fill with them
    /// (`None`: half of [`crate::effective_memory`]).
    pub dataset_bytes: u64,
    pub page_cache_bytes: Option<u64>,
    /// Keys Auto's choice of which chunks to keep resident (the same in every process).
    pub seed: u64,
    /// Map files found resident (their reads are slices of the page cache).
    pub map_resident: bool,
    /// Fault in every page of such a map when opened (false: the reader populates the ranges
    /// it reads when it reads them).
    pub populate: bool,
    /// How files opened through the page cache are read, told to the kernel as advice.
    pub pattern: ReadPattern,
    /// The meter of the layer that reads with this access (origin).
    pub meter: Arc<Meter>,
}

/// How a reader reads the files it opens through the page cache, advised to the kernel
/// (`posix_fadvise`) so that its readahead matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPattern {
    /// No advice: the kernel's default readahead.
    Default,
    /// Front to back in large ranges (chunk-wise epochs): `POSIX_FADV_SEQUENTIAL`.
    Sequential,
    /// Single records at random offsets (lookups, the mount): `POSIX_FADV_RANDOM`, so a read
    /// moves its own bytes, not a readahead window.
    Random,
}

impl Access {
    /// Random access to a few records at a time: buffered, advised random, never a map (it
    /// would count whole chunks in the reader's RSS).
    pub fn positional() -> Self {
        Access {
            map_resident: false,
            pattern: ReadPattern::Random,
            ..Access::plain(IoMode::Buffered)
        }
    }

    /// Every file read `mode`'s way, without a dataset budget.
    pub fn plain(mode: IoMode) -> Self {
        Access {
            mode,
            dataset_bytes: u64::MAX,
            page_cache_bytes: Some(0),
            seed: 0,
            map_resident: true,
            populate: true,
            pattern: ReadPattern::Default,
            meter: Arc::default(),
        }
    }
}
