//! The granary reader library.
//!
//! [`Dataset::open`] maps a dataset's snapshot and checks its header and section table: O(1)
//! in the number of samples, no per-sample parsing or allocation. Samples are looked up by id
//! or path locally and read with their CRC checked end to end. [`verify`] checks everything;
//! [`extract`] restores the packed tree byte-exact.

mod dataset;
mod error;
mod extract;
pub mod io;
mod pathfmt;
pub mod plan;
mod stream;
mod verify;

pub use dataset::{ChunkBytes, Dataset, SampleInfo};
pub use error::{ReadError, RecordError, Result};
pub use extract::{extract, ExtractOptions, ExtractSummary};
pub use granary_format::{Compression, FormatError, NO_LABEL};
pub use pathfmt::{escape_path, unescape_path};
pub use plan::{
    shuffle_quality, DatasetShape, EpochPlan, EpochState, PlanOptions, Shard, ShuffleMode,
    ShuffleQuality,
};
pub use stream::{EpochStream, Sample, StreamOptions};
pub use verify::{verify, Problem, VerifyReport};
