//! Datasets in object stores: `s3://`, `gs://`, `az://` and read-only `http(s)://` URLs,
//! through the `object_store` crate (ranged GETs, retries with backoff, the configuration
//! variables users already set: `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...).
//!
//! A dataset at a URL is the same directory of immutable files as on disk, as objects under a
//! prefix. `granary::Dataset::open` fetches the snapshot once and keeps it in a local cache keyed by the
//! dataset id and the snapshot header's CRC ([`granary_format::snapshot_key`]), so reopening
//! costs one 96-byte ranged GET; chunks are read with ranged GETs ([`ObjectChunks`]), many in
//! flight, sizes taken from the snapshot (no HEAD per chunk). Everything the local reader
//! checks (headers, sizes, CRCs of every record) is checked the same way: a truncated or
//! replaced object is an error naming its URL, never short or wrong bytes.
//!
//! The async runtime and the HTTP clients belong to one process: a process forked after using
//! them (a PyTorch `DataLoader` worker) starts its own on first use and never touches the
//! parent's, whose threads do not exist in the child.

mod chunks;
mod client;
mod errors;
mod ops;
mod paths;
mod runtime;
pub mod snapcache;
mod timeouts;
mod uploads;
mod url;

pub use crate::config::{cache_home, parse_seconds, Timeouts};
pub use chunks::ObjectChunks;
pub use errors::remote_error;
pub(crate) use ops::Sized;
pub use paths::staging_dir;
pub use runtime::block_on;
pub use snapcache::{fetch_snapshot, snapshot_head};
pub use uploads::{abort_open_uploads, OpenUploadInfo};
pub(crate) use url::PeerLink;
pub use url::{is_url, looks_like_url, ObjectUrl};

/// URL schemes granary reads (and, but for `http(s)`, writes).
pub const SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https"];

/// Largest single ranged GET: a whole-chunk read of a default 32 MiB chunk is one GET; larger
/// ranges are split into parts of this size, fetched concurrently. Measured on SeaweedFS with
/// its disk cold (docs/object-stores.md): 8 MiB parts read 4,123 samples/s, whole chunks 4,776.
pub const GET_PART: u64 = 32 << 20;

/// GETs in flight per read call (each reader thread issues its own).
pub const GETS_IN_FLIGHT: usize = 16;

/// Parts of a multipart upload; files up to this size are one PUT.
pub const PUT_PART: usize = 16 << 20;

/// Multipart upload parts in flight per upload.
pub(super) const PUTS_IN_FLIGHT: usize = 4;
