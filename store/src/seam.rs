//! The storage seam: where chunk bytes come from.
//!
//! A [`ChunkStore`] opens a dataset's chunk files; each open file is a [`ChunkSource`] with a
//! length, batched ranged reads, and where its bytes come from ([`BytesFrom`]). Streams,
//! random access and the mount see only these two traits. Stores are layers: the local tier
//! ([`crate::TierStore`]) and the job's other nodes ([`crate::PeerStore`]) each wrap the next
//! store, down to origin storage (a [`crate::LocalDir`] or an object store); a reader builds
//! the stack it needs ([`crate::StoreStack`]).
//!
//! The store's I/O engine reads batches of ranges of many sources at once: a local file, or a
//! layer over one, it reads its own way ([`ChunkSource::local`], [`ChunkSource::observe_local`]),
//! every other source through [`ChunkSource::read_ranges`], one call per source and batch.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::counts::Meter;
use crate::error::Result;
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
    /// True for bytes from a copy (this node's tier, another node's): the store checks them
    /// against the snapshot before use and, when they fail, gives the copy up
    /// ([`ChunkSource::fall_back`], the engine's verified reads).
    pub fn is_copy(self) -> bool {
        self != BytesFrom::Origin
    }
}

/// One range to read: `buf` receives the bytes at `offset`; the first `need` bytes must exist
/// (the rest of `buf` may lie past the end of the source and is then left as it is).
pub struct RangeRead<'a> {
    pub offset: u64,
    pub buf: &'a mut [u8],
    pub need: usize,
}

/// What the I/O engine read of a source on its local file ([`ChunkSource::local`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalRead {
    /// Ranges read.
    pub ranges: u64,
    /// Bytes read (or served from the file's map).
    pub bytes: u64,
    /// The reader's wait attributed to these ranges: their share, by bytes, of the time their
    /// batch took from submission to completion (nothing for bytes served from a map).
    pub waited: Duration,
    /// The read failed.
    pub failed: bool,
}

/// A local file as the I/O engine reads it itself ([`ChunkSource::local`]): with positional
/// reads or io_uring on its descriptor, or as slices of its map.
pub trait LocalFile: Send + Sync + Debug {
    /// The open file.
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

    /// True for an empty source.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads every range (in any order, concurrently if the store can). Errors name the
    /// location and offset; a source that ends before a range's `need` bytes is an
    /// `UnexpectedEof` error, never a short buffer.
    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()>;

    /// Where its bytes come from. A source that may fall back to the next layer (a peer that
    /// fails) says where the bytes of its latest read came from, and before any read where
    /// it will try first.
    fn bytes_from(&self) -> BytesFrom {
        BytesFrom::Origin
    }

    /// The local file whose bytes this source serves as they are, which the store's I/O engine
    /// may read itself (io_uring or pread on its descriptor, or slices of its map) instead of
    /// calling [`ChunkSource::read_ranges`]; `None` (the default) for any other source. A layer
    /// that does not change the bytes forwards it (and learns of the reads through
    /// [`ChunkSource::observe_local`]).
    fn local(&self) -> Option<&dyn LocalFile> {
        None
    }

    /// True when this source is best read whole: a copy (checked against the snapshot's
    /// whole-file CRC when read whole) or a peer's chunk (peers serve whole chunks only).
    fn whole_reads(&self) -> bool {
        self.bytes_from().is_copy()
    }

    /// True when this source's reads are slices of a map of the page cache (which the
    /// reader's RSS counts while the source is open).
    fn mapped(&self) -> bool {
        self.local().is_some_and(|l| l.map().is_some())
    }

    /// Told by the engine what it read through [`ChunkSource::local`]. Layers forward it to
    /// the source they wrap.
    fn observe_local(&self, read: LocalRead) {
        let _ = read;
    }

    /// Gives up what this source served after those bytes failed (`why`: a read error, a
    /// short read, bytes that do not match the snapshot; `served`: where they came from), so
    /// that its later reads come from the layer below (the tier discards its copy, a peer's
    /// chunk is read at origin). True when the source now reads elsewhere (also when it already
    /// moved past `served`, for another reader's failure); false (the default) when nothing
    /// lies below it: the failure is the dataset's own. Called by the verified reads only.
    fn fall_back(&self, why: &str, served: BytesFrom) -> Result<bool> {
        let _ = (why, served);
        Ok(false)
    }
}

/// A shared open chunk file.
pub type Source = Arc<dyn ChunkSource>;

/// Where a dataset's chunk files are.
pub trait ChunkStore: Send + Sync + Debug {
    /// Location of chunk `id`'s file (a path, or a URL written as one), for errors.
    fn chunk_location(&self, id: u32) -> PathBuf;

    /// Where the chunks are (a directory, or a URL prefix), for messages: by default the
    /// parent of chunk 0's location.
    fn location(&self) -> String {
        let first = self.chunk_location(0);
        first.parent().unwrap_or(&first).display().to_string()
    }

    /// Opens chunk `id`'s file.
    fn open_chunk(&self, id: u32) -> Result<Source>;

    /// Every file (or object) where the chunks are, as name and location, so that `verify`
    /// can report what is not part of the dataset. Stores that cannot list return none.
    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        Ok(Vec::new())
    }

    /// This store tuned for a reader that reads as `access` says (a local directory: through
    /// the page cache or with `O_DIRECT`, resident files mapped), or `None` when the store has
    /// nothing to tune (it is then used as it is).
    fn tuned(&self, access: &Access) -> Option<Arc<dyn ChunkStore>> {
        let _ = access;
        None
    }
}

granary_format::named_enum! {
    /// How a reader reads chunk files through the page cache.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum IoMode ("I/O mode") {
        /// Through the page cache where the data is resident or meant to stay (see
        /// [`crate::Opener`]), `O_DIRECT` elsewhere.
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
    /// Page cache or `O_DIRECT`.
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
    /// The meter of the layer that reads with this access (origin): how its files were
    /// opened and the metadata calls that took.
    pub meter: Arc<Meter>,
}

/// How a reader reads the files it opens through the page cache, advised to the kernel
/// (`posix_fadvise`) so that its readahead matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPattern {
    /// No advice: the kernel's default readahead.
    Default,
    /// Front to back in large ranges (chunk-wise epochs): `POSIX_FADV_SEQUENTIAL` (the
    /// kernel's readahead doubles, and its larger folios make larger device requests).
    Sequential,
    /// Single records at random offsets (lookups, the mount): `POSIX_FADV_RANDOM`, so a
    /// record's read moves its own bytes and not a readahead window around them. Whole-chunk
    /// loads advise sequential on their own handle.
    Random,
}

impl Access {
    /// Random access to a few records at a time: buffered reads through the page cache, never
    /// a map (a map of every chunk touched would count whole chunks in the reader's RSS),
    /// advised random.
    pub fn positional() -> Self {
        Access {
            map_resident: false,
            pattern: ReadPattern::Random,
            ..Access::plain(IoMode::Buffered)
        }
    }

    /// Every file read `mode`'s way, without a dataset budget (Auto: buffered where
    /// resident).
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
