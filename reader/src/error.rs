use std::path::PathBuf;

use granary_format::FormatError;
use granary_store::{RemoteKind, StoreError};

/// Result alias of the reader.
pub type Result<T> = std::result::Result<T, ReadError>;

/// Errors of the reader; each says which file, and where in it, was being read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file's bytes are not valid granary format.
    #[error("{}: {source}", path.display())]
    Format {
        path: PathBuf,
        #[source]
        source: FormatError,
    },
    /// A record is damaged: its bytes are not returned.
    #[error(transparent)]
    Record(Box<RecordError>),
    /// A file is not what the snapshot says: another dataset's chunk, another chunk id,
    /// another size, or it changed while being read.
    #[error("{}: {detail}", path.display())]
    Mismatch { path: PathBuf, detail: String },
    /// A reader thread failed or stopped: the epoch (or the batch) is incomplete.
    #[error("{0}")]
    Incomplete(String),
    /// An object store request failed (after the client's retries).
    #[error("{op} {url}: {detail}")]
    Remote {
        op: &'static str,
        url: String,
        detail: String,
        /// Missing, refused, failing after retries, or other.
        kind: RemoteKind,
    },
    /// An argument or option that is not possible as asked (out of range, inconsistent).
    #[error("{0}")]
    Invalid(String),
}

impl ReadError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ReadError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn mismatch(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        ReadError::Mismatch {
            path: path.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, source: FormatError) -> Self {
        ReadError::Format {
            path: path.into(),
            source,
        }
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

impl From<StoreError> for ReadError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io { op, path, source } => ReadError::Io { op, path, source },
            StoreError::Format { path, source } => ReadError::Format { path, source },
            StoreError::Damaged { path, detail } => ReadError::Mismatch { path, detail },
            StoreError::Remote {
                op,
                url,
                detail,
                kind,
            } => ReadError::Remote {
                op,
                url,
                detail,
                kind,
            },
            StoreError::Invalid(s) => ReadError::Invalid(s),
        }
    }
}
