//! The granary reader library.
//!
//! [`Dataset::open`] maps a dataset's snapshot and checks its header and section table: O(1)
//! in the number of samples, no per-sample parsing or allocation. Samples are looked up by id
//! or path locally and read with their CRC checked end to end. [`verify`] checks everything;
//! [`extract`] restores the packed tree byte-exact.
//!
//! Epochs are streamed by [`Dataset::stream_epoch`]: an [`EpochPlan`] (a pure function of
//! the dataset shape, [`PlanOptions`], epoch and [`Shard`]) says which samples this rank and
//! loader worker read and in which order; the I/O engine ([`io`]) reads whole chunk ranges with
//! several large reads in flight (io_uring, or a pread pool), and samples arrive CRC-checked.
//!
//! A local tier ([`LocalTier`] in [`StreamOptions::tier`]) on the node's SSD keeps chunk
//! copies (`lru`, `static`) or hot chunks of the most important samples (`importance`, chosen by
//! [`ImportanceScores`] that the training loop feeds through [`SharedScores::report`]); plans
//! can draw importance-sampled epochs ([`EpochPlan::build_sampled`]).
//!
//! ```no_run
//! use std::sync::Arc;
//! use granary::{Dataset, EpochState, PlanOptions, Shard, ShuffleMode, StreamOptions};
//!
//! # fn main() -> granary::Result<()> {
//! let ds = Arc::new(Dataset::open("train.granary")?);
//! let plan = PlanOptions { mode: ShuffleMode::Chunkwise, seed: 42, window_chunks: 4, ..Default::default() };
//! let shard = Shard { rank: 0, world_size: 1, worker: 0, num_workers: 1 };
//! for epoch in 0..3 {
//!     for sample in ds.stream_epoch(&plan, epoch, shard, None, &StreamOptions::default())? {
//!         let sample = sample?; // CRC-checked; raw samples borrow the read buffer
//!         let (_id, _label, _bytes) = (sample.id, sample.label, sample.data());
//!     }
//! }
//! // Resume epoch 3 after 1000 samples, even with another world size or worker count:
//! let state = EpochState { epoch: 3, world_size: 1, num_workers: 1, consumed: vec![1000], column: None, then: None, chunks: None };
//! let rest = ds.stream_epoch(&plan, 3, shard, Some(&state), &StreamOptions::default())?;
//! # drop(rest);
//! # Ok(())
//! # }
//! ```

pub mod bill;
mod config;
mod dataset;
mod draws;
mod epoch;
mod error;
mod extract;
mod importance;
pub mod io;
pub mod mix;
mod options;
mod pathfmt;
pub mod plan;
pub mod procstat;
mod random;
mod readahead;
mod runs;
mod stream;
mod tier;
mod verify;
mod view;
mod waits;
mod window;

pub use config::Reader;
pub use dataset::{ownership, ChunkBytes, Dataset, SampleInfo, View};
pub use epoch::{
    layer_reading, measure_epoch, EpochReport, EpochSetup, ImportanceSampling, LayerReading,
    PeerReport,
};
pub use error::{ReadError, RecordError, Result};
pub use extract::{extract, ExtractOptions, ExtractSummary};
pub use granary_format::{Compression, FileAttrs, FileStat, FormatError, NsEntry, NO_LABEL};
pub use granary_store::{
    copy_file_name, decode_hot_map, decode_tier_index, effective_memory, hot_file_name,
    parse_copy_file_name, resident_share, Access, BytesFrom, ChunkSource, ChunkStore, DatasetId,
    IoMode, LocalDir, LocalTier, MeterReading, Opener, Ownership, Peers, RangeRead, ReadPattern,
    RemoteKind, Source, StoreConfig, StoreError, StoreStack, TierPolicy, TierStats,
};
pub use importance::{batch_weights, ImportanceScores, SharedScores};
pub use mix::{
    epoch_counts, read_mix_epoch, Interleave, MixPlan, MixReader, MixReport, MixState, MixStream,
    Mixture, SampleStream, Share, SourceMark, SourceSpec, SourceTotals,
};
pub use options::{
    ReaderOptions, SamplingKind, DEFAULT_ALPHA, DEFAULT_CACHE_BOOST, DEFAULT_PEER_TIMEOUT_S,
};
pub use pathfmt::{escape_path, unescape_path};
pub use plan::{
    labels_from_class_counts, shuffle_quality, Continued, DatasetShape, EpochPlan, EpochState,
    KeyedPermutation, PlanOptions, Sampling, Shard, ShuffleMode, ShuffleQuality,
};
pub use random::SampleReader;
pub use readahead::{ReadAheadSeat, SharedReadAhead};
pub use stream::{EpochStream, Sample, StreamOptions};
pub use tier::Weighed;
pub use tier::{purge_tier, Purged};
pub use verify::{verify, verify_with, Problem, VerifyReport};
pub use view::{view_reads, write_view, ViewReads};
pub use waits::WaitReport;

/// Read-buffer budget of one reader (one stream) by default ([`StreamOptions::memory`]), from
/// which the shuffle window follows ([`Dataset::window_for_memory`]): the CLI's `--memory`,
/// Python's `memory=`, the benchmarks.
pub const DEFAULT_READER_MEMORY: u64 = 128 << 20;

/// The order-independent digest term of a delivered sample: a keyed hash of its id and the
/// CRC-32 of the bytes delivered. Epoch digests are sums of terms (mod 2^64), so the digests of
/// every rank and worker of an epoch add up to [`Dataset::full_digest`] exactly when together
/// they delivered every sample once with the right bytes.
pub fn digest_term(id: u64, crc32: u32) -> u64 {
    granary_format::SplitMix64::keyed(&[id, crc32 as u64]).next_u64()
}
