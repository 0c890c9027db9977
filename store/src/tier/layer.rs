//! The local tier as a layer of a store stack ([`TierStore`]): copies served as the local files
//! they are, a failed copy given up for the store below, a chunk opened below moved to a copy
//! that arrived.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use granary_format::ChunkEntry;

use super::{HotChunk, LocalTier};
use crate::file::IoFile;
use crate::local::Opener;
use crate::seam::{
    Access, BytesFrom, ChunkSource, ChunkStore, LocalFile, LocalRead, RangeRead, Source,
};
use crate::Result;

/// The local tier as a layer: a chunk the tier holds (its copy's size and header checked) is
/// read from the copy, opened once and never mapped (someone may cut it short: then it is a
/// short read naming the copy); any other chunk comes from the next store.
///
/// The layer owns what a copy's failure means ([`ChunkSource::fall_back`]): the copy is
/// discarded, logged once with its path, and the chunk opened in the store below. A chunk
/// opened below may later be served by a copy that arrived since
/// ([`ChunkSource::newer_copy`]). Readers verify bytes; they never name the layer.
#[derive(Debug, Clone)]
pub struct TierStore {
    cache: Arc<LocalTier>,
    next: Arc<dyn ChunkStore>,
    chunks: Arc<[ChunkEntry]>,
    opener: Arc<Opener>,
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
        }
    }

    /// The tier.
    pub fn cache(&self) -> &Arc<LocalTier> {
        &self.cache
    }

    /// Drops chunk `id`'s copy after it failed while read (`why`): removed from the tier and
    /// logged with its path; a failure to remove it is logged too (the read goes on from the
    /// next store either way).
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
        if let Err(e) = self.cache.discard(ce) {
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
        Ok(copy.map(|file| {
            Arc::new(TierCopy {
                file,
                tier: self.clone(),
                id,
            }) as Source
        }))
    }

    /// Chunk `id`'s entry in the dataset's chunk table.
    pub(crate) fn chunk_entry(&self, id: u32) -> Option<ChunkEntry> {
        self.chunks.get(id as usize).cloned()
    }

    /// Chunk `id` opened in the next store itself (not wrapped as a chunk below the tier).
    pub(crate) fn open_next(&self, id: u32) -> Result<Source> {
        self.next.open_chunk(id)
    }

    /// Chunk `id` opened in the store below the tier.
    fn open_below(&self, id: u32) -> Result<Source> {
        Ok(Arc::new(Below {
            inner: self.next.open_chunk(id)?,
            tier: self.clone(),
            id,
        }))
    }

    /// Hot chunk `h`, if its file is present with the mapped size (another process may evict
    /// it meanwhile: then it is a miss).
    pub(crate) fn open_hot(&self, h: &HotChunk) -> Option<Source> {
        let p = self.cache.hot_path(h)?;
        let f = self.opener.open_unmapped(&p, Some(h.id)).ok()?;
        Some(Arc::new(f.serving(BytesFrom::Tier)))
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
        match self.open_copy(id)? {
            Some(copy) => Ok(copy),
            None => self.open_below(id),
        }
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        self.next.list()
    }
}

/// A chunk's copy in the tier: read as the local file it is (the engine's fast path); when its
/// bytes fail, discarded and replaced by the chunk opened below.
#[derive(Debug)]
struct TierCopy {
    file: IoFile,
    tier: TierStore,
    id: u32,
}

impl ChunkSource for TierCopy {
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

    fn fall_back(&self, why: &dyn std::fmt::Display) -> Result<Option<Source>> {
        self.tier.drop_copy(self.id, why);
        self.tier.open_below(self.id).map(Some)
    }
}

/// A chunk the tier did not hold when it was opened, read from the store below; the tier's
/// copy, once one arrives, is offered by [`ChunkSource::newer_copy`].
#[derive(Debug)]
struct Below {
    inner: Source,
    tier: TierStore,
    id: u32,
}

#[deny(clippy::missing_trait_methods)]
impl ChunkSource for Below {
    fn location(&self) -> &Path {
        self.inner.location()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()> {
        self.inner.read_ranges(reads)
    }

    fn bytes_from(&self) -> BytesFrom {
        self.inner.bytes_from()
    }

    fn local(&self) -> Option<&dyn LocalFile> {
        self.inner.local()
    }

    fn observe_local(&self, read: LocalRead) {
        self.inner.observe_local(read)
    }

    fn fall_back(&self, why: &dyn std::fmt::Display) -> Result<Option<Source>> {
        Ok(self.inner.fall_back(why)?.map(|inner| {
            Arc::new(Below {
                inner,
                tier: self.tier.clone(),
                id: self.id,
            }) as Source
        }))
    }

    fn newer_copy(&self) -> Result<Option<Source>> {
        self.tier.open_copy(self.id)
    }
}
