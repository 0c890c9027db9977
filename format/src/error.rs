use thiserror::Error;

/// Result alias of the format crate.
pub type Result<T> = std::result::Result<T, FormatError>;

/// Everything that can be wrong with bytes that claim to be granary format.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The bytes do not start (or end) with the expected magic.
    #[error("{what}: bad magic (expected {expected:?}, found {found:?}); not a granary file")]
    BadMagic {
        what: &'static str,
        expected: String,
        found: String,
    },
    /// The bytes end before a structure does.
    #[error("{what}: truncated (need {needed} bytes, have {available})")]
    Truncated {
        what: &'static str,
        needed: u64,
        available: u64,
    },
    /// A stored CRC does not match the bytes it covers.
    #[error("{what}: checksum mismatch (stored {expected:#010x}, computed {actual:#010x})")]
    ChecksumMismatch {
        what: String,
        expected: u32,
        actual: u32,
    },
    /// Bytes of a file read in pieces (a snapshot in an object store) could not be fetched.
    #[error("{what}: {detail}")]
    Unavailable { what: String, detail: String },
    /// A field holds a value the format does not allow.
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
}

/// [`FormatError::Invalid`] naming `what`, its detail built by `format!` from the rest.
macro_rules! invalid {
    ($what:expr, $($detail:tt)+) => {
        $crate::error::FormatError::invalid($what, format!($($detail)+))
    };
}

/// Returns [`invalid!`] as the error.
macro_rules! bail {
    ($($t:tt)+) => {
        return Err($crate::error::invalid!($($t)+))
    };
}

pub(crate) use {bail, invalid};

impl FormatError {
    pub(crate) fn invalid(what: impl Into<String>, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn bad_magic(what: &'static str, expected: &[u8], found: &[u8]) -> Self {
        FormatError::BadMagic {
            what,
            expected: String::from_utf8_lossy(expected).into_owned(),
            found: String::from_utf8_lossy(found).into_owned(),
        }
    }

    pub(crate) fn truncated(what: &'static str, needed: u64, available: u64) -> Self {
        FormatError::Truncated {
            what,
            needed,
            available,
        }
    }
}

/// Checks that `b` holds at least `n` bytes.
pub(crate) fn need(what: &'static str, b: &[u8], n: usize) -> Result<()> {
    match b.len() < n {
        true => Err(FormatError::truncated(what, n as u64, b.len() as u64)),
        false => Ok(()),
    }
}

/// Checks a stored CRC against the computed one.
pub(crate) fn check_crc(what: impl Into<String>, expected: u32, data: &[u8]) -> Result<()> {
    let actual = crc32fast::hash(data);
    if actual != expected {
        return Err(FormatError::ChecksumMismatch {
            what: what.into(),
            expected,
            actual,
        });
    }
    Ok(())
}
