//! The metering layer: wraps any store and counts what passes through it - chunks opened,
//! read calls, ranges, bytes, failures, and the time callers spent waiting in them - so that a
//! reader can tell which layer it waits on. It is a store itself and implements the whole
//! seam (a wrapper that forgot a method would silently change what the store below does), so
//! it can sit anywhere in a stack: over origin, over the peers, over the tier.
//!
//! Over a local file it forwards the file to the I/O engine ([`ChunkSource::local`]), which
//! reads it on its descriptor as it would unwrapped and reports what it read
//! ([`ChunkSource::observe_local`]): the fast path is kept and every read still counted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::seam::{
    Access, BytesFrom, ChunkSource, ChunkStore, LocalFile, LocalRead, RangeRead, Source,
};

/// What one layer saw, counted since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct MeterReading {
    /// Chunks opened.
    pub opens: u64,
    /// `read_ranges` calls (a batch of ranges of one chunk each).
    pub reads: u64,
    /// Ranges read.
    pub ranges: u64,
    /// Bytes read (the ranges' lengths as asked, up to the end of the chunk).
    pub bytes: u64,
    /// Opens and reads that failed.
    pub errors: u64,
    /// Copies (a tier's, a peer's) given up for the layer below after their bytes failed
    /// (layers nest: the tier's count includes the peers').
    pub fallbacks: u64,
    /// Samples delivered from this layer's own bytes, and their bytes (not nested: a sample
    /// counts in the layer that served it alone; [`crate::StoreStack::served`]).
    pub served_samples: u64,
    pub served_bytes: u64,
    /// Offers the tier's admission failed to store (a full or failing disk), and offers it
    /// dropped because its queue was full while the tier was full too (the tier's layer only).
    pub admissions_failed: u64,
    pub admissions_skipped: u64,
    /// Fetch on first touch (the tier's layer only): chunks fetched and kept, the bytes read
    /// for fetches, chunks fetched that the tier then declined, fetches skipped because it
    /// would have, and fetches that failed (the samples still came from below).
    pub chunks_fetched: u64,
    pub bytes_fetched: u64,
    pub fetches_declined: u64,
    pub fetches_skipped: u64,
    pub fetch_errors: u64,
    /// Seconds callers waited in opens and reads, summed over callers (two threads waiting one
    /// second each count two).
    pub wait_s: f64,
}

impl std::ops::AddAssign for MeterReading {
    fn add_assign(&mut self, o: Self) {
        self.opens += o.opens;
        self.reads += o.reads;
        self.ranges += o.ranges;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.fallbacks += o.fallbacks;
        self.served_samples += o.served_samples;
        self.served_bytes += o.served_bytes;
        self.admissions_failed += o.admissions_failed;
        self.admissions_skipped += o.admissions_skipped;
        self.chunks_fetched += o.chunks_fetched;
        self.bytes_fetched += o.bytes_fetched;
        self.fetches_declined += o.fetches_declined;
        self.fetches_skipped += o.fetches_skipped;
        self.fetch_errors += o.fetch_errors;
        self.wait_s += o.wait_s;
    }
}

/// The counters one [`Metered`] store and its sources add to.
#[derive(Debug, Default)]
pub struct Meter {
    opens: AtomicU64,
    reads: AtomicU64,
    ranges: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    fallbacks: AtomicU64,
    served_samples: AtomicU64,
    served_bytes: AtomicU64,
    admissions_failed: AtomicU64,
    admissions_skipped: AtomicU64,
    pub(crate) chunks_fetched: AtomicU64,
    pub(crate) bytes_fetched: AtomicU64,
    pub(crate) fetches_declined: AtomicU64,
    pub(crate) fetches_skipped: AtomicU64,
    pub(crate) fetch_errors: AtomicU64,
    wait_ns: AtomicU64,
}

impl Meter {
    /// The counts so far.
    pub fn reading(&self) -> MeterReading {
        MeterReading {
            opens: self.opens.load(Relaxed),
            reads: self.reads.load(Relaxed),
            ranges: self.ranges.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            fallbacks: self.fallbacks.load(Relaxed),
            served_samples: self.served_samples.load(Relaxed),
            served_bytes: self.served_bytes.load(Relaxed),
            admissions_failed: self.admissions_failed.load(Relaxed),
            admissions_skipped: self.admissions_skipped.load(Relaxed),
            chunks_fetched: self.chunks_fetched.load(Relaxed),
            bytes_fetched: self.bytes_fetched.load(Relaxed),
            fetches_declined: self.fetches_declined.load(Relaxed),
            fetches_skipped: self.fetches_skipped.load(Relaxed),
            fetch_errors: self.fetch_errors.load(Relaxed),
            wait_s: self.wait_ns.load(Relaxed) as f64 / 1e9,
        }
    }

    /// Counts `samples` samples in `bytes` bytes delivered from this layer's own bytes.
    pub fn served(&self, samples: u64, bytes: u64) {
        self.served_samples.fetch_add(samples, Relaxed);
        self.served_bytes.fetch_add(bytes, Relaxed);
    }

    /// Counts an offer the tier failed to store; how many had failed before.
    pub(crate) fn admission_failed(&self) -> u64 {
        self.admissions_failed.fetch_add(1, Relaxed)
    }

    /// Counts `n` offers dropped.
    pub(crate) fn admissions_skipped(&self, n: u64) {
        self.admissions_skipped.fetch_add(n, Relaxed);
    }

    fn waited(&self, t0: Instant, failed: bool) {
        self.wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        if failed {
            self.errors.fetch_add(1, Relaxed);
        }
    }

    /// Counts one read of `ranges` ranges that delivered `bytes` (none when it failed) after
    /// `waited`, whoever performed it (the source itself, or the engine on its local file).
    fn read(&self, ranges: u64, bytes: u64, waited: std::time::Duration, failed: bool) {
        self.reads.fetch_add(1, Relaxed);
        self.ranges.fetch_add(ranges, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        self.wait_ns.fetch_add(waited.as_nanos() as u64, Relaxed);
        if failed {
            self.errors.fetch_add(1, Relaxed);
        }
    }
}

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

    /// The counters.
    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
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
        self.meter.waited(t0, r.is_err());
        let inner = r?;
        Ok(Arc::new(MeteredSource {
            inner,
            meter: self.meter.clone(),
        }))
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
