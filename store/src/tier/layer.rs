//! The local tier as a layer of a store stack ([`TierStore`]): copies served as the local files
//! they are, a failed copy given up for the store below, a chunk read below moved to a copy
//! that arrived, hot chunks dropped when a record of theirs fails.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

use granary_format::ChunkEntry;

use super::fetch::{ChunkScore, Fetcher};
use super::{HotChunk, LocalTier};
use crate::error::Result;
use crate::file::{copy_range, IoFile};
use crate::local::Opener;
use crate::meter::metered_source;
use crate::seam::{
    open_sized, Access, BytesFrom, ChunkSource, ChunkStore, LocalFile, LocalRead, RangeRead, Source,
};

/// The local tier as a layer: a chunk the tier holds (its copy's size and header checked) is
/// read from the copy, opened once and never mapped (someone may cut it short); any other
/// chunk comes from the next store. A copy whose bytes fail the store's verified reads
/// ([`crate::verified`]) is discarded, logged with its path, and the chunk read below
/// ([`ChunkSource::fall_back`]).
#[derive(Debug, Clone)]
pub struct TierStore {
    pub(crate) cache: Arc<LocalTier>,
    /// The store below.
    pub(crate) next: Arc<dyn ChunkStore>,
    /// The dataset's chunk table.
    pub(crate) chunks: Arc<[ChunkEntry]>,
    opener: Arc<Opener>,
    pub(crate) fetch: Arc<OnceLock<Fetcher>>,
}

impl TierStore {
    /// `cache` in front of `next`, for a dataset whose chunk table is `chunks`; copies are
    /// opened as `access` says.
    pub fn new(
        cache: Arc<LocalTier>,
        next: Arc<dyn ChunkStore>,
        chunks: Arc<[ChunkEntry]>,
        access: &Access,
    ) -> TierStore {
        TierStore {
            cache,
            next,
            chunks,
            opener: Arc::new(Opener::for_access(access)),
            fetch: Arc::default(),
        }
    }

    /// Starts fetching on first touch ([`super::fetch`]) with `threads` threads, `score`
    /// ranking a chunk, `admitted` told after each chunk the tier took, counted in `meter`.
    /// False if it fetches already.
    pub(crate) fn fetch_on_touch(
        &self,
        threads: usize,
        score: ChunkScore,
        admitted: Arc<dyn Fn() + Send + Sync>,
        meter: Arc<crate::counts::Meter>,
    ) -> bool {
        // The fetcher's own view of the tier does not fetch (no cycle through it).
        let plain = TierStore {
            fetch: Arc::default(),
            ..self.clone()
        };
        self.fetch
            .set(Fetcher::start(plain, threads, score, admitted, meter))
            .is_ok()
    }

    /// Drops chunk `id`'s copy after it failed while read (`why`), logged with its path.
    fn drop_copy(&self, id: u32, why: &dyn std::fmt::Display) {
        let Some(ce) = self.chunks.get(id as usize) else {
            return;
        };
        let path = self.cache.dir().join(super::copy_file_name(id, &ce.digest));
        log::warn!(
            "tier copy {}: {why}; discarded, chunk {id} is read from {}",
            path.display(),
            self.next.location()
        );
        if let Err(e) = self.cache.discard(super::Key::copy(ce), true) {
            log::warn!("tier copy {}: cannot discard it: {e}", path.display());
        }
    }

    /// Chunk `id`'s copy in the tier, if it holds a sound one.
    fn open_copy(&self, id: u32) -> Result<Option<Source>> {
        let Some(ce) = self.chunks.get(id as usize) else {
            return Ok(None);
        };
        let copy = self
            .cache
            .open_copy(ce, |p| self.opener.open_unmapped(p, Some(id)))?;
        Ok(copy.map(|file| Arc::new(file) as Source))
    }

    /// Chunk `id` opened in the store below the tier, its size checked against the chunk table.
    fn open_below(&self, id: u32) -> Result<Source> {
        match self.chunks.get(id as usize) {
            Some(ce) => open_sized(&*self.next, ce),
            None => self.next.open_chunk(id),
        }
    }

    /// Hot chunk `h`, if its file is present with the mapped size. Its records that fail are
    /// read from their own chunks ([`crate::verified::Relocate`]), the hot chunk dropped.
    pub(crate) fn open_hot(&self, h: &HotChunk) -> Option<Source> {
        let p = self.cache.hot_path(h)?;
        let file = self.opener.open_unmapped(&p, Some(h.id)).ok()?;
        let hot = Arc::new(HotSource {
            file: file.serving(BytesFrom::Tier),
            cache: self.cache.clone(),
            id: h.id,
            dropped: AtomicBool::new(false),
        });
        // Read beside the tier's `open_chunk`, counted in its meter all the same.
        Some(metered_source(hot, self.opener.meter().clone()))
    }
}

impl ChunkStore for TierStore {
    fn chunk_location(&self, id: u32) -> PathBuf {
        self.next.chunk_location(id)
    }

    fn location(&self) -> String {
        self.next.location()
    }

    fn open_chunk(&self, id: u32) -> Result<Source> {
        let levels: [OnceLock<Source>; LEVELS] = Default::default();
        let _ = levels[0].set(match self.open_copy(id)? {
            Some(copy) => copy,
            None => self.open_below(id)?,
        });
        Ok(Arc::new(TierChunk {
            tier: self.clone(),
            id,
            levels,
            set: AtomicUsize::new(1),
            change: Mutex::new(()),
            fetched: AtomicBool::new(false),
        }))
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        self.next.list()
    }
}

/// The most sources a chunk opened through the tier moves through (moves to a newer copy stop
/// while fewer than 4 places are left, so that falling back always can).
const LEVELS: usize = 8;

/// A chunk opened through the tier: its copy, else the store below; a failed copy is given up
/// for the store below, and a chunk read below moves to a copy that arrived since (random
/// reads keep sources open). Every source it moved through stays open until it is dropped, so
/// that the local file it lends the engine ([`ChunkSource::local`]) stays valid.
#[derive(Debug)]
struct TierChunk {
    tier: TierStore,
    id: u32,
    levels: [OnceLock<Source>; LEVELS],
    /// How many of `levels` are set; the last one serves.
    set: AtomicUsize,
    /// Moves are made one at a time.
    change: Mutex<()>,
    /// The latest read was served from a chunk just fetched, in memory while the tier writes it.
    fetched: AtomicBool,
}

impl TierChunk {
    /// The source that serves now.
    fn current(&self) -> &Source {
        let n = self.set.load(Acquire);
        self.levels[n - 1].get().expect("levels are set in order")
    }

    /// Makes `src` the source that serves; false when no place is left.
    fn push(&self, src: Source) -> bool {
        let n = self.set.load(Acquire);
        if n == LEVELS || self.levels[n].set(src).is_err() {
            return false;
        }
        self.set.store(n + 1, Release);
        true
    }

    /// A chunk read below moves to the tier's copy once one arrived; never from a map (its
    /// slices may be in use).
    fn move_to_copy(&self) -> Result<()> {
        let cur = self.current();
        if cur.bytes_from().is_copy() || cur.mapped() || self.set.load(Acquire) + 4 > LEVELS {
            return Ok(());
        }
        if let Some(copy) = self.tier.open_copy(self.id)? {
            let _g = self.change.lock().expect("tier chunk lock");
            if self.current().bytes_from() != BytesFrom::Tier {
                self.push(copy);
            }
        }
        Ok(())
    }
}

impl ChunkSource for TierChunk {
    fn location(&self) -> &Path {
        self.current().location()
    }

    fn len(&self) -> u64 {
        self.current().len()
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()> {
        self.move_to_copy()?;
        if let (Some(f), false) = (self.tier.fetch.get(), self.current().bytes_from().is_copy()) {
            if let Some(bytes) = f.fetched(self.id)? {
                self.fetched.store(true, Relaxed);
                let at = self.current().location();
                return reads.iter_mut().try_for_each(|r| copy_range(&bytes, at, r));
            }
            // Fetched and written meanwhile: the copy serves.
            self.move_to_copy()?;
        }
        self.fetched.store(false, Relaxed);
        self.current().read_ranges(reads)
    }

    fn bytes_from(&self) -> BytesFrom {
        match self.fetched.load(Relaxed) {
            true => BytesFrom::Tier,
            false => self.current().bytes_from(),
        }
    }

    fn local(&self) -> Option<&dyn LocalFile> {
        self.current().local()
    }

    fn observe_local(&self, read: LocalRead) {
        self.current().observe_local(read)
    }

    fn fall_back(&self, why: &str, served: BytesFrom) -> Result<bool> {
        // Bytes fetched passed the snapshot's whole-file CRC: a record of them that fails its
        // own is the dataset's error.
        if self.fetched.load(Relaxed) && served == BytesFrom::Tier {
            return Ok(false);
        }
        let _g = self.change.lock().expect("tier chunk lock");
        let cur = self.current().clone();
        if cur.bytes_from() != served {
            // Another reader's failure moved it already.
            return Ok(true);
        }
        if served != BytesFrom::Tier {
            return cur.fall_back(why, served);
        }
        self.tier.drop_copy(self.id, &why);
        let below = self.tier.open_below(self.id)?;
        Ok(self.push(below))
    }
}

/// A hot chunk in the tier, read as the local file it is. When one of its records fails, the
/// hot chunk is removed (once); the record is then read from its own chunk.
#[derive(Debug)]
struct HotSource {
    file: IoFile,
    cache: Arc<LocalTier>,
    id: u32,
    dropped: AtomicBool,
}

impl ChunkSource for HotSource {
    fn location(&self) -> &Path {
        &self.file.path
    }

    fn len(&self) -> u64 {
        self.file.len
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()> {
        self.file.read_ranges(reads)
    }

    fn bytes_from(&self) -> BytesFrom {
        BytesFrom::Tier
    }

    fn local(&self) -> Option<&dyn LocalFile> {
        Some(&self.file)
    }

    fn fall_back(&self, why: &str, _: BytesFrom) -> Result<bool> {
        if !self.dropped.swap(true, Relaxed) {
            log::warn!(
                "hot chunk {}: {why}; dropped from the tier, its records are read from their \
                 chunks",
                self.file.path.display()
            );
            self.cache.discard(super::Key::Hot(self.id), true)?;
        }
        Ok(false)
    }
}
