//! A dataset's chunk files under a URL prefix, read with ranged GETs.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::stream::{self, StreamExt, TryStreamExt};

use super::ops::fetch_range_into;
use super::{ObjectUrl, GETS_IN_FLIGHT, GET_PART};
use crate::error::{Result, StoreError};
use crate::seam::{ChunkSource, ChunkStore, RangeRead, Source};

/// The chunk files of a dataset under a URL prefix. Chunk sizes come from the snapshot, so
/// opening a chunk costs no request.
#[derive(Debug)]
pub struct ObjectChunks {
    url: Arc<ObjectUrl>,
    sizes: Vec<u64>,
    /// Each chunk's revision (empty: all 0).
    revisions: Arc<[u32]>,
}

impl ObjectChunks {
    /// Chunks under `url` with the sizes the snapshot records (indexed by chunk id).
    pub fn new(url: Arc<ObjectUrl>, sizes: Vec<u64>) -> Self {
        ObjectChunks {
            url,
            sizes,
            revisions: Arc::from(Vec::new()),
        }
    }

    /// [`ObjectChunks::new`] of a dataset whose chunks have these revisions (by id).
    pub fn with_revisions(mut self, revisions: Arc<[u32]>) -> Self {
        self.revisions = revisions;
        self
    }

    fn name(&self, id: u32) -> String {
        let revision = self.revisions.get(id as usize).copied().unwrap_or(0);
        granary_format::chunk_file_name_at(id, revision)
    }
}

impl ChunkStore for ObjectChunks {
    fn chunk_location(&self, id: u32) -> PathBuf {
        PathBuf::from(self.url.object_url(&self.name(id)))
    }

    fn location(&self) -> String {
        self.url.url().to_string()
    }

    fn open_chunk(&self, id: u32) -> Result<Source> {
        let len = *self.sizes.get(id as usize).ok_or_else(|| {
            StoreError::Invalid(format!(
                "chunk {id} is not in the snapshot of {}",
                self.url.url
            ))
        })?;
        let name = self.name(id);
        Ok(Arc::new(ObjectChunk {
            location: PathBuf::from(self.url.object_url(&name)),
            url: self.url.clone(),
            name,
            len,
        }))
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        // Plain HTTP has no listing (the client's WebDAV PROPFIND is refused by most servers):
        // such a store cannot list, and says so by listing nothing, as the seam asks.
        if !self.url.writable() {
            return Ok(Vec::new());
        }
        Ok(self
            .url
            .list()?
            .into_iter()
            .map(|(name, _)| {
                let location = PathBuf::from(self.url.object_url(&name));
                (name, location)
            })
            .collect())
    }
}

/// One chunk object, read with ranged GETs.
#[derive(Debug)]
struct ObjectChunk {
    url: Arc<ObjectUrl>,
    name: String,
    location: PathBuf,
    len: u64,
}

impl ChunkSource for ObjectChunk {
    fn location(&self) -> &Path {
        &self.location
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()> {
        // Every range clipped to the object and split into parts of at most GET_PART bytes;
        // all parts of the call in flight together (up to GETS_IN_FLIGHT).
        let mut parts: Vec<(Range<u64>, &mut [u8])> = Vec::new();
        for r in reads.iter_mut() {
            let end = (r.offset + r.buf.len() as u64).min(self.len);
            if r.offset + r.need as u64 > end {
                return Err(crate::file::eof_at(&self.location, self.len));
            }
            let buf = &mut r.buf[..(end - r.offset.min(end)) as usize];
            let starts = (r.offset..).step_by(GET_PART as usize);
            for (at, part) in starts.zip(buf.chunks_mut(GET_PART as usize)) {
                parts.push((at..at + part.len() as u64, part));
            }
        }
        if parts.is_empty() {
            return Ok(());
        }
        let client = self.url.client()?;
        let key = self.url.key(&self.name);
        let url = self.url.object_url(&self.name);
        let len = self.len;
        let fetches = stream::iter(parts)
            .map(|(range, dst)| fetch_range_into(&*client, &key, &url, range, Some(len), dst));
        let fetched = fetches.buffer_unordered(GETS_IN_FLIGHT).try_collect::<()>();
        self.url.run("reading", &url, fetched)?
    }
}
