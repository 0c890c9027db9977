//! One store configuration, and the one factory that turns a path or a URL into a location.
//!
//! A front end (the CLI, the Python module, a benchmark) resolves a [`StoreConfig`] once: the
//! defaults, then the `GRANARY_*` environment variables ([`StoreConfig::from_env`]), then its
//! own flags or keywords. Nothing below reads the environment for these settings; everything
//! that opens a location takes the configuration ([`open`]). The object store clients still
//! take their credentials and endpoints from the variables their users set (`AWS_*`,
//! `GOOGLE_*`, `AZURE_*`), as the `object_store` crate documents.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::object::{cache_home, is_url, looks_like_url, ObjectUrl, Timeouts};
use crate::{Result, StoreError};

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

/// Snapshots up to this size are fetched whole (one GET; every section checked at once):
/// paging pays off only for large ones.
pub const WHOLE_MAX: u64 = 16 << 20;

/// Default bound of the snapshot cache: 16 GiB on disk.
pub const CACHE_BUDGET: u64 = 16 << 30;

/// How the store reaches object stores and where it keeps node-local copies of what it
/// fetched.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// How long requests to object stores wait.
    pub timeouts: Timeouts,
    /// Where fetched snapshots are kept (default `snapshots` in the cache home:
    /// `$XDG_CACHE_HOME/granary`, else `~/.cache/granary`).
    pub snapshot_cache: PathBuf,
    /// Snapshots up to this many bytes are fetched whole; larger ones (format 1.4 and later)
    /// are read in checked blocks.
    pub snapshot_whole_max: u64,
    /// Bytes on disk the snapshot cache may take (least recently opened copies go first).
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
            snapshot_whole_max: WHOLE_MAX,
            snapshot_cache_max: CACHE_BUDGET,
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
                *slot = crate::object::parse_seconds(&v).map_err(|why| bad(k, &v, &why))?;
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

/// Where a dataset (or a file of one) is: a local path, or a prefix in an object store.
#[derive(Clone, Debug)]
pub enum Location {
    /// A local path (a directory, or a file in one).
    Local(PathBuf),
    /// A prefix in an object store, with its client configured.
    Object(Arc<ObjectUrl>),
}

impl Location {
    /// The object store prefix, if this is one.
    pub fn object(&self) -> Option<&Arc<ObjectUrl>> {
        match self {
            Location::Object(u) => Some(u),
            Location::Local(_) => None,
        }
    }
}

/// Turns `location` into a [`Location`]: a URL with a known scheme (`s3://`, `gs://`, `az://`,
/// `http(s)://`) is an object store prefix configured by `cfg`; anything else is a local path,
/// but a string of the form `scheme://...` with an unknown scheme, which is an error unless a
/// local file of that name exists (write it `./name` to be sure). The one place that tells
/// URLs from paths.
pub fn open(location: &Path, cfg: &StoreConfig) -> Result<Location> {
    if let Some(url) = location.to_str().filter(|s| is_url(s)) {
        return Ok(Location::Object(Arc::new(ObjectUrl::open(url, cfg)?)));
    }
    if let Some(url) = location.to_str().filter(|s| looks_like_url(s)) {
        if !location.exists() {
            // An unknown scheme: say so rather than "no such file".
            ObjectUrl::open(url, cfg)?;
        }
    }
    Ok(Location::Local(location.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
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

    #[test]
    fn open_tells_urls_from_paths() {
        let cfg = StoreConfig::default();
        let u = open(Path::new("s3://bucket/ds"), &cfg).unwrap();
        assert_eq!(u.object().unwrap().url(), "s3://bucket/ds");
        assert!(matches!(
            open(Path::new("data/ds"), &cfg).unwrap(),
            Location::Local(_)
        ));
        let e = open(Path::new("ftp://host/ds"), &cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown scheme"), "{e}");
    }
}
