//! Where a write to an object store stages its files.

use std::path::PathBuf;

use crate::config::cache_home;

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
