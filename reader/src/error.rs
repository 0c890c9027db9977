use std::path::PathBuf;

use granary_format::FormatError;
use granary_store::StoreError;

/// Result alias of the reader.
pub type Result<T> = std::result::Result<T, ReadError>;

/// Errors of the reader: what the store stack reported (local I/O, bytes that are not granary
/// format or not what the snapshot says, object store requests, arguments or settings that
/// cannot work), wrapped as it is; a damaged record, named by file, chunk, offset and sample;
/// an epoch that stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// What the store stack (or the reader, in the store's terms) reported.
    #[error(transparent)]
    Store(StoreError),
    /// A record whose bytes fail their checks.
    #[error(transparent)]
    Record(Box<RecordError>),
    /// A stream that ended before delivering every sample of its share (a reader thread that
    /// died, a consumer that stopped): never a short epoch that looks complete.
    #[error("{0}")]
    Incomplete(String),
}

impl From<StoreError> for ReadError {
    /// The store's error as it is, except a store thread that stopped (the I/O engine's): the
    /// epoch it was reading for is incomplete.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Stopped(m) => ReadError::Incomplete(m),
            e => ReadError::Store(e),
        }
    }
}

impl ReadError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ReadError::Store(StoreError::io(op, path, source))
    }

    pub(crate) fn mismatch(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        ReadError::Store(StoreError::damaged(path, detail))
    }

    pub(crate) fn format(path: impl Into<PathBuf>, source: FormatError) -> Self {
        ReadError::Store(StoreError::format(path, source))
    }

    /// An argument or setting that cannot work as given.
    pub fn invalid(message: String) -> Self {
        ReadError::Store(StoreError::Invalid(message))
    }
}

/// A damaged record: which file, chunk, offset and sample.
#[derive(Debug, thiserror::Error)]
#[error("{} (chunk {chunk}, offset {offset}): sample {sample} ({sample_path}): {source}", path.display())]
pub struct RecordError {
    pub path: PathBuf,
    pub chunk: u32,
    pub offset: u64,
    pub sample: u64,
    pub sample_path: String,
    #[source]
    pub source: FormatError,
}
