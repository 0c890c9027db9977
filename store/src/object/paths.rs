//! Where granary keeps node-local state for object stores: the cache home, staging.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::url::ObjectUrl;
use crate::{Location, StoreConfig};

/// granary's local cache directory: `$XDG_CACHE_HOME/granary`, else `~/.cache/granary`.
pub fn cache_home() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("granary")
}

/// The default staging directory of a write to `url` (spill logs, chunks in transit, resume
/// state): one per destination under [`cache_home`], so that a resumed write finds it again.
pub fn staging_dir(url: &str) -> PathBuf {
    let name: String = url
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '.' | '_' => c,
            _ => '_',
        })
        .collect();
    cache_home().join("uploads").join(name)
}

/// Where a dataset written to `out` goes: `None` for a local path, else the object store (its
/// client configured by `cfg`) and the local staging directory (`staging`, or
/// [`staging_dir`]). Refuses read-only URLs, and a staging directory for a local path.
pub fn write_destination(
    out: &str,
    staging: Option<&Path>,
    cfg: &StoreConfig,
) -> std::result::Result<Option<(Arc<ObjectUrl>, PathBuf)>, String> {
    let u = match crate::open(Path::new(out), cfg).map_err(|e| format!("{out}: {e}"))? {
        Location::Object(u) => u,
        Location::Local(_) => {
            return match staging {
                Some(_) => Err(format!(
                    "a staging directory is for writing to an object store URL; {out} is a \
                     local path"
                )),
                None => Ok(None),
            };
        }
    };
    if !u.writable() {
        return Err(format!(
            "{out}: http(s) URLs are read-only; write to s3://, gs:// or az://"
        ));
    }
    let staging = staging.map_or_else(|| staging_dir(u.url()), Path::to_path_buf);
    Ok(Some((u, staging)))
}
