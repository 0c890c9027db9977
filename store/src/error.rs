//! Errors of the store stack: each names the file or object and what was being done, and says
//! of which kind it is, so that a caller can tell a missing object from a refused one, a
//! server that kept failing from damaged bytes, and a local I/O error from all of them.

use std::path::PathBuf;

use granary_format::FormatError;

/// Result alias of the store stack.
pub type Result<T> = std::result::Result<T, StoreError>;

/// What kind of failure an object store request ended in (after the client's retries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    /// The object or bucket does not exist.
    NotFound,
    /// The credentials were rejected or may not do this.
    Denied,
    /// The server kept failing or throttling (retried with backoff, then given up), or did
    /// not answer in time.
    Transient,
    /// Anything else the server or the client said.
    Failed,
}

/// Errors of the store stack.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A local system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file's or object's bytes are not valid granary format.
    #[error("{}: {source}", path.display())]
    Format {
        path: PathBuf,
        #[source]
        source: FormatError,
    },
    /// Bytes that are not what the snapshot says: wrong size, another dataset's or chunk's,
    /// cut short or changed while being read.
    #[error("{}: {detail}", path.display())]
    Damaged { path: PathBuf, detail: String },
    /// An object store request failed (after the client's retries).
    #[error("{op} {url}: {detail}")]
    Remote {
        op: &'static str,
        url: String,
        detail: String,
        kind: RemoteKind,
    },
    /// An argument or setting that cannot work as given (a malformed URL, missing
    /// credentials).
    #[error("{0}")]
    Invalid(String),
    /// A thread of the store (the I/O engine's) stopped before finishing what it was given:
    /// the reads it had are lost, never returned short.
    #[error("{0}")]
    Stopped(String),
}

impl StoreError {
    /// A local I/O error of `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Bytes at `path` that are not what the snapshot says.
    pub fn damaged(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        StoreError::Damaged {
            path: path.into(),
            detail: detail.into(),
        }
    }

    /// Bytes at `path` that are not granary format.
    pub fn format(path: impl Into<PathBuf>, source: FormatError) -> Self {
        StoreError::Format {
            path: path.into(),
            source,
        }
    }

    /// True for a missing object, bucket or file.
    pub fn is_not_found(&self) -> bool {
        match self {
            StoreError::Remote { kind, .. } => *kind == RemoteKind::NotFound,
            StoreError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            _ => false,
        }
    }
}

/// The message a panic carried (`panic!("...")` or a formatted one), or "no message".
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}
