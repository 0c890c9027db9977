//! The metering layer: wraps any store and counts what passes through it (chunks opened, read
//! calls, ranges, bytes, failures, the time callers waited), so that a reader can tell which
//! layer it waits on. It implements the whole seam (a forgotten method would silently change
//! what the store below does). A local file is forwarded to the I/O engine
//! ([`ChunkSource::local`]), which reports what it read ([`ChunkSource::observe_local`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use crate::counts::Meter;
use crate::error::Result;
use crate::seam::{
    Access, BytesFrom, ChunkSource, ChunkStore, LocalFile, LocalRead, RangeRead, Source,
};

/// A store whose every open and read is counted in a [`Meter`].
#[derive(Debug)]
pub struct Metered {
    inner: Arc<dyn ChunkStore>,
    meter: Arc<Meter>,
}

impl Metered {
    /// `inner`, counted in `meter` (shared, so that a reader can read it while it reads).
    pub fn new(inner: Arc<dyn ChunkStore>, meter: Arc<Meter>) -> Self {
        Metered { inner, meter }
    }
}

#[deny(clippy::missing_trait_methods)]
impl ChunkStore for Metered {
    fn chunk_location(&self, id: u32) -> PathBuf {
        self.inner.chunk_location(id)
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn open_chunk(&self, id: u32) -> Result<Source> {
        let t0 = Instant::now();
        let r = self.inner.open_chunk(id);
        self.meter.opens.fetch_add(1, Relaxed);
        self.meter.waited(t0.elapsed(), r.is_err());
        Ok(metered_source(r?, self.meter.clone()))
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        self.inner.list()
    }

    fn tuned(&self, access: &Access) -> Option<Arc<dyn ChunkStore>> {
        // The tuned store is counted in the same meter.
        let tuned = self.inner.tuned(access)?;
        Some(Arc::new(Metered::new(tuned, self.meter.clone())))
    }
}

/// An open chunk whose reads are counted.
#[derive(Debug)]
struct MeteredSource {
    inner: Source,
    meter: Arc<Meter>,
}

/// `inner`, its reads counted in `meter` (also for a source a layer opens itself: hot chunks).
pub(crate) fn metered_source(inner: Source, meter: Arc<Meter>) -> Source {
    Arc::new(MeteredSource { inner, meter })
}

#[deny(clippy::missing_trait_methods)]
impl ChunkSource for MeteredSource {
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
        let len = self.inner.len();
        let bytes: u64 = reads
            .iter()
            .map(|r| (r.buf.len() as u64).min(len.saturating_sub(r.offset)))
            .sum();
        let t0 = Instant::now();
        let r = self.inner.read_ranges(reads);
        let delivered = if r.is_ok() { bytes } else { 0 };
        self.meter
            .read(reads.len() as u64, delivered, t0.elapsed(), r.is_err());
        r
    }

    fn bytes_from(&self) -> BytesFrom {
        self.inner.bytes_from()
    }

    fn local(&self) -> Option<&dyn LocalFile> {
        self.inner.local()
    }

    fn fall_back(&self, why: &str, served: BytesFrom) -> Result<bool> {
        let moved = self.inner.fall_back(why, served)?;
        if moved {
            self.meter.fallbacks.fetch_add(1, Relaxed);
        }
        Ok(moved)
    }

    fn whole_reads(&self) -> bool {
        self.inner.whole_reads()
    }

    fn mapped(&self) -> bool {
        self.inner.mapped()
    }

    fn observe_local(&self, read: LocalRead) {
        self.meter
            .read(read.ranges, read.bytes, read.waited, read.failed);
        self.inner.observe_local(read);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalDir;

    #[test]
    fn every_open_read_range_byte_and_failure_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(dir.path().join(granary_format::chunk_file_name(0)), &data).unwrap();
        let meter = Arc::new(Meter::default());
        let store = Metered::new(Arc::new(LocalDir::new(dir.path())), meter.clone());
        let src = store.open_chunk(0).unwrap();
        assert_eq!(src.len(), 10_000);
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 4096]);
        src.read_ranges(&mut [
            RangeRead {
                offset: 10,
                buf: &mut a,
                need: 100,
            },
            // Reaches past the end: counted up to it.
            RangeRead {
                offset: 9_000,
                buf: &mut b,
                need: 1_000,
            },
        ])
        .unwrap();
        assert_eq!(a[..], data[10..110]);
        assert_eq!(b[..1_000], data[9_000..]);
        let r = meter.reading();
        assert_eq!(
            (r.opens, r.reads, r.ranges, r.bytes, r.errors),
            (1, 1, 2, 1_100, 0)
        );
        assert!(r.wait_s > 0.0);
        let mut c = vec![0u8; 16];
        assert!(src
            .read_ranges(&mut [RangeRead {
                offset: 9_995,
                buf: &mut c,
                need: 16,
            }])
            .is_err());
        assert!(store.open_chunk(5).is_err());
        let r = meter.reading();
        assert_eq!(
            (r.opens, r.reads, r.ranges, r.bytes, r.errors),
            (2, 2, 3, 1_100, 2)
        );
    }
}
