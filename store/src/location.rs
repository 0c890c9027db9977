//! The one factory that turns a path or a URL into a location, configured by a
//! [`StoreConfig`]: nothing else tells URLs from paths.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::StoreConfig;
use crate::error::Result;
use crate::object::{is_url, looks_like_url, staging_dir, ObjectUrl};

/// Where a dataset (or a file of one) is: a local path, or a prefix in an object store.
#[derive(Clone, Debug)]
pub enum Location {
    /// A local path (a directory, or a file in one).
    Local(PathBuf),
    /// A prefix in an object store, with its client configured.
    Object(Arc<ObjectUrl>),
}

/// Turns `location` into a [`Location`]: a URL with a known scheme (`s3://`, `gs://`, `az://`,
/// `http(s)://`) is an object store prefix configured by `cfg`; anything else is a local path,
/// but a string of the form `scheme://...` with an unknown scheme, which is an error unless a
/// local file of that name exists (write it `./name` to be sure). The one place that tells
/// URLs from paths.
pub fn open(location: &Path, cfg: &StoreConfig) -> Result<Location> {
    match location.to_str().filter(|s| looks_like_url(s)) {
        // An unknown scheme is an error too (saying so rather than "no such file").
        Some(url) if is_url(url) || !location.exists() => {
            Ok(Location::Object(Arc::new(ObjectUrl::open(url, cfg)?)))
        }
        _ => Ok(Location::Local(location.to_path_buf())),
    }
}

/// Where a dataset written to `out` goes: `None` for a local path, else the object store (its
/// client configured by `cfg`) and the local staging directory (`staging`, or
/// [`staging_dir`]). Refuses read-only URLs, and a staging directory for a local path.
pub fn write_destination(
    out: &str,
    staging: Option<&Path>,
    cfg: &StoreConfig,
) -> std::result::Result<Option<(Arc<ObjectUrl>, PathBuf)>, String> {
    let Location::Object(u) = open(Path::new(out), cfg).map_err(|e| format!("{out}: {e}"))? else {
        return match staging {
            Some(_) => Err(format!(
                "a staging directory is for writing to an object store URL; {out} is a local path"
            )),
            None => Ok(None),
        };
    };
    if !u.writable() {
        return Err(format!(
            "{out}: http(s) URLs are read-only; write to s3://, gs:// or az://"
        ));
    }
    let staging = staging.map_or_else(|| staging_dir(u.url()), Path::to_path_buf);
    Ok(Some((u, staging)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_tells_urls_from_paths() {
        let cfg = StoreConfig::default();
        let Location::Object(u) = open(Path::new("s3://bucket/ds"), &cfg).unwrap() else {
            panic!("not an object store")
        };
        assert_eq!(u.url(), "s3://bucket/ds");
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
