//! One store configuration.
//!
//! A front end (the CLI, the Python module, a benchmark) resolves a [`StoreConfig`] once: the
//! defaults, then the `GRANARY_*` environment variables ([`StoreConfig::from_env`]), then its
//! own flags or keywords. Nothing below reads the environment for these settings; everything
//! that opens a location takes the configuration ([`crate::open`]). The object store clients still
//! take their credentials and endpoints from the variables their users set (`AWS_*`,
//! `GOOGLE_*`, `AZURE_*`), as the `object_store` crate documents.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Result, StoreError};

/// Environment variables [`StoreConfig::from_env`] reads (seconds, decimals allowed).
pub const CONNECT_TIMEOUT_ENV: &str = "GRANARY_CONNECT_TIMEOUT";
/// See [`CONNECT_TIMEOUT_ENV`].
pub const REQUEST_TIMEOUT_ENV: &str = "GRANARY_REQUEST_TIMEOUT";
/// See [`CONNECT_TIMEOUT_ENV`].
pub const RETRY_TIMEOUT_ENV: &str = "GRANARY_RETRY_TIMEOUT";
/// Where fetched snapshots are cached ([`StoreConfig::snapshot_cache`]).
pub const SNAPSHOT_CACHE_ENV: &str = "GRANARY_SNAPSHOT_CACHE";
/// [`StoreConfig::snapshot_whole_max`], in bytes (`0`: read every 1.4 snapshot in blocks).
pub const WHOLE_MAX_ENV: &str = "GRANARY_SNAPSHOT_WHOLE_MAX";
/// [`StoreConfig::snapshot_cache_max`], in bytes on disk.
pub const CACHE_BUDGET_ENV: &str = "GRANARY_SNAPSHOT_CACHE_MAX";
/// `1`: S3 credentials may come from the instance's role ([`StoreConfig::aws_imds`]).
pub const AWS_IMDS_ENV: &str = "GRANARY_AWS_IMDS";

/// How the store reaches object stores and where it keeps node-local copies of what it
/// fetched.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// How long requests to object stores wait.
    pub timeouts: Timeouts,
    /// Where fetched snapshots are kept (default `snapshots` in the cache home:
    /// `$XDG_CACHE_HOME/granary`, else `~/.cache/granary`).
    pub snapshot_cache: PathBuf,
    /// Snapshots up to this many bytes (default 16 MiB) are fetched whole (one GET; every
    /// section checked at once); larger ones are read in checked blocks.
    pub snapshot_whole_max: u64,
    /// Bytes on disk the snapshot cache may take (default 16 GiB; least recently opened copies
    /// go first).
    pub snapshot_cache_max: u64,
    /// S3 credentials may come from the instance metadata service (cloud instances whose role
    /// provides them); otherwise a missing key is an error at once rather than a wait on a
    /// service that is not there.
    pub aws_imds: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            timeouts: Timeouts::default(),
            snapshot_cache: cache_home().join("snapshots"),
            snapshot_whole_max: 16 << 20,
            snapshot_cache_max: 16 << 30,
            aws_imds: false,
        }
    }
}

impl StoreConfig {
    /// The defaults, changed by the `GRANARY_*` variables that are set (for front ends; the
    /// library never reads them itself). A value that does not parse is an error naming the
    /// variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
    }

    /// [`StoreConfig::from_env`] over any source of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Self> {
        let mut c = StoreConfig::default();
        let text = |k: &str| var(k).map(|v| v.to_string_lossy().into_owned());
        let bad = |k: &str, v: &str, why: &str| StoreError::Invalid(format!("{k}={v}: {why}"));
        for (k, slot) in [
            (CONNECT_TIMEOUT_ENV, &mut c.timeouts.connect),
            (REQUEST_TIMEOUT_ENV, &mut c.timeouts.request),
            (RETRY_TIMEOUT_ENV, &mut c.timeouts.retry),
        ] {
            if let Some(v) = text(k) {
                *slot = parse_seconds(&v).map_err(|why| bad(k, &v, &why))?;
            }
        }
        if let Some(d) = var(SNAPSHOT_CACHE_ENV) {
            c.snapshot_cache = PathBuf::from(d);
        }
        for (k, slot) in [
            (WHOLE_MAX_ENV, &mut c.snapshot_whole_max),
            (CACHE_BUDGET_ENV, &mut c.snapshot_cache_max),
        ] {
            if let Some(v) = text(k) {
                *slot = v
                    .trim()
                    .parse()
                    .map_err(|_| bad(k, &v, "not a number of bytes"))?;
            }
        }
        if let Some(v) = text(AWS_IMDS_ENV) {
            c.aws_imds = match v.trim() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => return Err(bad(AWS_IMDS_ENV, &v, "use 1 or 0")),
            };
        }
        Ok(c)
    }
}

/// The longest pause between two attempts of one request (the client's backoff doubles from
/// 100 ms up to this).
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// How long granary waits on an object store. A request that cannot connect within `connect`,
/// or that receives no byte for `request` (waiting for the answer or within its body), fails
/// and is retried with backoff until `retry` has passed since its first attempt; then the
/// operation fails with an error naming the URL. A store that accepts connections and never
/// answers therefore fails an operation within [`Timeouts::bound`]. A slow transfer that keeps
/// making progress is never cut off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// Establishing a connection.
    pub connect: Duration,
    /// No byte received for this long (the answer, or the next part of its body).
    pub request: Duration,
    /// Retrying a failed request, counted from its first attempt.
    pub retry: Duration,
}

impl Default for Timeouts {
    /// 10 s to connect, 60 s without progress, 120 s of retries: long enough that a user on a
    /// slow or busy link does not hit them, short enough that a dead endpoint is an error
    /// within a few minutes rather than a hang.
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            request: Duration::from_secs(60),
            retry: Duration::from_secs(120),
        }
    }
}

impl Timeouts {
    /// The longest one operation waits on a store that never answers: the retry window, one
    /// more attempt begun just before it closed, and one backoff pause.
    pub fn bound(&self) -> Duration {
        self.retry + self.request.max(self.connect) + MAX_BACKOFF.min(self.retry)
    }
}

/// A duration given as seconds ("10", "2.5"), positive and at most a day.
pub fn parse_seconds(s: &str) -> std::result::Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| "not a number of seconds".to_string())?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err("must be more than 0 and at most 86400 seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// granary's local cache directory: `$XDG_CACHE_HOME/granary`, else `~/.cache/granary`.
pub fn cache_home() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("granary")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;
    use std::time::Duration;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<std::ffi::OsString> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).map(Into::into)
    }

    #[test]
    fn variables_change_the_defaults_and_bad_values_name_the_variable() {
        assert_eq!(
            StoreConfig::from_vars(vars(&[])).unwrap(),
            StoreConfig::default()
        );
        let c = StoreConfig::from_vars(vars(&[
            (CONNECT_TIMEOUT_ENV, "2.5"),
            (RETRY_TIMEOUT_ENV, "7s"),
            (SNAPSHOT_CACHE_ENV, "/x/snaps"),
            (WHOLE_MAX_ENV, "0"),
            (CACHE_BUDGET_ENV, "1024"),
            (AWS_IMDS_ENV, "1"),
        ]))
        .unwrap();
        assert_eq!(c.timeouts.connect, Duration::from_millis(2500));
        assert_eq!(c.timeouts.request, Timeouts::default().request);
        assert_eq!(c.timeouts.retry, Duration::from_secs(7));
        assert_eq!(c.snapshot_cache, Path::new("/x/snaps"));
        assert_eq!((c.snapshot_whole_max, c.snapshot_cache_max), (0, 1024));
        assert!(c.aws_imds);
        for (k, v) in [
            (REQUEST_TIMEOUT_ENV, "soon"),
            (WHOLE_MAX_ENV, "16M"),
            (AWS_IMDS_ENV, "yes"),
        ] {
            let e = StoreConfig::from_vars(vars(&[(k, v)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(k), "{e}");
        }
    }
}
