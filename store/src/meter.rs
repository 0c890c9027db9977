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

/// Declares the counts of a layer once: the live counters ([`Meter`]), their value
/// ([`MeterReading`]), how a meter is read, and how readings add up and subtract.
macro_rules! counts {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// What one layer saw, counted since it was made (subtract two readings for an
        /// interval; add workers' readings for a process's).
        #[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
        pub struct MeterReading {
            $($(#[$doc])* pub $name: u64,)*
            /// Seconds callers waited in opens and reads, summed over callers (two threads
            /// waiting one second each count two).
            pub wait_s: f64,
        }

        /// The counters one layer ([`Metered`]) and what works inside it add to.
        #[derive(Debug, Default)]
        pub struct Meter {
            $(pub(crate) $name: AtomicU64,)*
            wait_ns: AtomicU64,
        }

        impl Meter {
            /// The counts so far.
            pub fn reading(&self) -> MeterReading {
                MeterReading {
                    $($name: self.$name.load(Relaxed),)*
                    wait_s: self.wait_ns.load(Relaxed) as f64 / 1e9,
                }
            }
        }

        impl std::ops::AddAssign for MeterReading {
            fn add_assign(&mut self, o: Self) {
                $(self.$name += o.$name;)*
                self.wait_s += o.wait_s;
            }
        }

        impl std::ops::Sub for MeterReading {
            type Output = MeterReading;
            fn sub(self, o: Self) -> MeterReading {
                MeterReading {
                    $($name: self.$name.saturating_sub(o.$name),)*
                    wait_s: self.wait_s - o.wait_s,
                }
            }
        }
    };
}

counts! {
    /// Chunks opened.
    opens,
    /// `read_ranges` calls (a batch of ranges of one chunk each).
    reads,
    /// Ranges read.
    ranges,
    /// Bytes read (the ranges' lengths as asked, up to the end of the chunk).
    bytes,
    /// Opens and reads that failed.
    errors,
    /// Copies (a tier's, a peer's) given up for the layer below after their bytes failed
    /// (layers nest: the tier's count includes the peers').
    fallbacks,
    /// Samples delivered from this layer's own bytes (not nested: a sample counts in the
    /// layer that served it alone; [`crate::StoreStack::served`]).
    served_samples,
    /// The bytes read from this layer's own bytes to deliver them (whole chunks, ranges,
    /// records: what was read, not only the samples' records).
    served_bytes,
    /// Files a local store opened through the page cache (not resident yet, but kept resident,
    /// or the mode says so), found resident and mapped (served without a read or a copy), and
    /// opened with `O_DIRECT` (the origin layer only).
    opened_buffered,
    opened_resident,
    opened_direct,
    /// File-system metadata calls (open, stat) a local store made (for a dataset's snapshot:
    /// those of opening it).
    metadata_ops,
    /// Offers the tier's admission failed to store (a full or failing disk).
    admissions_failed,
    /// Offers it dropped because its queue was full while the tier was full too.
    admissions_skipped,
    /// Fetch on first touch (the tier's layer only): chunks fetched and kept, and the bytes
    /// read for fetches.
    chunks_fetched,
    bytes_fetched,
    /// Chunks fetched that the tier then declined, and fetches skipped because it would have.
    fetches_declined,
    fetches_skipped,
    /// Fetches that failed (the samples still came from below).
    fetch_errors,
    /// Chunks other nodes' tiers served with the snapshot's size and digest, and their bytes
    /// (the peers' layer only).
    chunks_from_peers,
    bytes_from_peers,
    /// Chunks another node owns read from origin instead, by reason: the owner did not hold it
    /// yet, served a copy that failed the size or digest check, or did not answer (or was
    /// already marked down).
    missing_at_owner,
    rejected,
    unreachable,
    /// The bytes read from origin for them (the peers' report's `bytes_from_origin` is all
    /// that came from origin).
    bytes_from_origin_instead,
    /// Times a peer was marked down (at most once per peer and epoch).
    peers_marked_down,
}

impl Meter {
    /// Counts `samples` samples in `bytes` bytes delivered from this layer's own bytes.
    pub fn served(&self, samples: u64, bytes: u64) {
        self.served_samples.fetch_add(samples, Relaxed);
        self.served_bytes.fetch_add(bytes, Relaxed);
    }

    /// Counts `n` file-system metadata calls.
    pub fn metadata_ops(&self, n: u64) {
        self.metadata_ops.fetch_add(n, Relaxed);
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
