//! A layer for test suites (the store's conformance suite, the reader's streams): [`FastOnly`]
//! checks that the I/O engine keeps its fast path through a layer over local files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::error::{Result, StoreError};
use crate::seam::{ChunkSource, ChunkStore, LocalFile, LocalRead, RangeRead, Source};

/// A layer over a local store whose sources refuse `read_ranges` but offer their local file to
/// the I/O engine, counting the bytes the engine reports having read: a read that lost the
/// fast path fails, naming it.
#[derive(Debug)]
pub struct FastOnly {
    inner: Arc<dyn ChunkStore>,
    observed: Arc<AtomicU64>,
}

impl FastOnly {
    /// The layer over `inner`, and the bytes it is told of.
    pub fn over(inner: Arc<dyn ChunkStore>) -> (FastOnly, Arc<AtomicU64>) {
        let observed = Arc::new(AtomicU64::new(0));
        let layer = FastOnly {
            inner,
            observed: observed.clone(),
        };
        (layer, observed)
    }
}

#[derive(Debug)]
struct FastOnlySource {
    inner: Source,
    observed: Arc<AtomicU64>,
}

impl ChunkStore for FastOnly {
    fn chunk_location(&self, id: u32) -> PathBuf {
        self.inner.chunk_location(id)
    }

    fn open_chunk(&self, id: u32) -> Result<Source> {
        Ok(Arc::new(FastOnlySource {
            inner: self.inner.open_chunk(id)?,
            observed: self.observed.clone(),
        }))
    }
}

impl ChunkSource for FastOnlySource {
    fn location(&self) -> &Path {
        self.inner.location()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_ranges(&self, _: &mut [RangeRead<'_>]) -> Result<()> {
        Err(StoreError::Invalid(
            "read through read_ranges: the engine lost the fast path".into(),
        ))
    }

    fn local(&self) -> Option<&dyn LocalFile> {
        self.inner.local()
    }

    fn observe_local(&self, read: LocalRead) {
        assert!(!read.failed, "{read:?}");
        self.observed.fetch_add(read.bytes, Relaxed);
        self.inner.observe_local(read);
    }
}
