//! What a layer counts: one type ([`Meter`], live; [`MeterReading`], its value) declared once
//! for every count of every layer. Every report (`read --json`, Python, the mount's
//! statistics, the bill, Prometheus) derives from readings of it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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

        /// The counters one layer (the metering layer) and what works inside it add to.
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
    /// Copies given up for the layer below after their bytes failed (the tier's count
    /// includes the peers').
    fallbacks,
    /// Samples delivered from this layer's own bytes (counted in that layer alone,
    /// [`crate::StoreStack::served`]), and the bytes read to deliver them.
    served_samples,
    served_bytes,
    /// Files a local store opened through the page cache, found resident and mapped, and
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
    /// Fetch on first touch (the tier's layer only): chunks fetched and kept, the bytes read
    /// for fetches, chunks fetched that the tier then declined, fetches skipped because it
    /// would have, and fetches that failed.
    chunks_fetched,
    bytes_fetched,
    fetches_declined,
    fetches_skipped,
    fetch_errors,
    /// Chunks other nodes' tiers served with the snapshot's size and digest, and their bytes
    /// (the peers' layer only).
    chunks_from_peers,
    bytes_from_peers,
    /// Chunks another node owns read from origin instead, by reason: the owner did not hold it,
    /// served a copy that failed the checks, or did not answer (or was marked down); and the
    /// bytes read from origin for them.
    missing_at_owner,
    rejected,
    unreachable,
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

    /// Counts `waited` in an open or read, and the failure when it `failed`.
    pub(crate) fn waited(&self, waited: Duration, failed: bool) {
        self.wait_ns.fetch_add(waited.as_nanos() as u64, Relaxed);
        if failed {
            self.errors.fetch_add(1, Relaxed);
        }
    }

    /// Counts one read of `ranges` ranges that delivered `bytes` (none when it failed) after
    /// `waited`, by the source itself or the engine on its local file.
    pub(crate) fn read(&self, ranges: u64, bytes: u64, waited: Duration, failed: bool) {
        self.reads.fetch_add(1, Relaxed);
        self.ranges.fetch_add(ranges, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        self.waited(waited, failed);
    }
}
