//! Finding the files to pack: a walk of SRC or a file list, then a parallel stat.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::{PackError, Skipped};

/// A file found by the scan.
pub(crate) struct Found {
    pub rel: Vec<u8>,
    pub size: u64,
    /// Inode number: reading a chunk's files in inode order follows the on-disk layout.
    pub ino: u64,
    /// Modification time in nanoseconds since the epoch (see [`mtime_ns`]).
    pub mtime_ns: i64,
}

/// A file's modification time in nanoseconds since the epoch, as the plan records it.
pub(crate) fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    m.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec())
}

pub(crate) struct ScanResult {
    pub files: Vec<Found>,
    pub skipped: Vec<Skipped>,
    pub warnings: Vec<String>,
    /// Class names: the distinct first directories of every name listed (also of the names
    /// another shard packs), sorted by bytes.
    pub classes: Vec<Vec<u8>>,
    /// Number of names listed (before the shard selection and the stat).
    pub names: u64,
    /// Digest of every name listed, in listing order: shards of one pack must agree on it.
    pub names_digest: u64,
}

fn abs(src: &Path, rel: &[u8]) -> PathBuf {
    src.join(OsStr::from_bytes(rel))
}

/// Lists regular files under `src` (relative paths, raw bytes), then stats them in parallel.
pub(crate) fn scan(
    src: &Path,
    files_from: Option<&Path>,
    follow_links: bool,
    skip_unreadable: bool,
    shard: Option<crate::ShardSpec>,
    on_found: &(dyn Fn(u64) + Sync),
) -> Result<ScanResult, PackError> {
    let mut warnings = Vec::new();
    let mut skipped = Vec::new();
    let mut rels: Vec<Vec<u8>> = match files_from {
        Some(list) => read_list(src, list)?,
        None => walk(
            src,
            follow_links,
            skip_unreadable,
            &mut warnings,
            &mut skipped,
            on_found,
        )?,
    };
    // Every shard sees every name (for the classes and the digest) but stats and keeps only
    // its own.
    let names = rels.len() as u64;
    let mut names_digest = 0x6772_616e_6172_7931u64 ^ names;
    let mut classes: Vec<Vec<u8>> = Vec::new();
    for rel in &rels {
        names_digest = crate::shard::mix64(names_digest ^ granary_format::path_hash(rel));
        if let Some(i) = rel.iter().position(|&b| b == b'/') {
            if classes.last().map(|c| &c[..]) != Some(&rel[..i]) {
                classes.push(rel[..i].to_vec());
            }
        }
    }
    classes.sort_unstable();
    classes.dedup();
    if let Some(s) = shard {
        rels.retain(|r| s.owns(r));
    }
    // (size, inode, mtime) of each regular file; None for what is not one.
    type Stat = Option<(u64, u64, i64)>;
    let stats: Vec<Result<Stat, Skipped>> = rels
        .par_iter()
        .map(|rel| {
            let p = abs(src, rel);
            let md = if follow_links {
                std::fs::metadata(&p)
            } else {
                std::fs::symlink_metadata(&p)
            };
            match md {
                Ok(m) if m.is_file() => Ok(Some((
                    m.len(),
                    std::os::unix::fs::MetadataExt::ino(&m),
                    mtime_ns(&m),
                ))),
                Ok(m) if m.file_type().is_symlink() => Ok(None),
                Ok(_) => Ok(None),
                Err(e) => Err(Skipped {
                    path: rel.clone(),
                    reason: format!("cannot stat: {e}"),
                }),
            }
        })
        .collect();
    let mut files = Vec::with_capacity(rels.len());
    let mut not_regular = 0u64;
    for (rel, st) in rels.into_iter().zip(stats) {
        match st {
            Ok(Some((size, ino, mtime_ns))) => files.push(Found {
                rel,
                size,
                ino,
                mtime_ns,
            }),
            Ok(None) => {
                not_regular += 1;
                if not_regular <= 5 {
                    warnings.push(format!(
                        "skipping {}: not a regular file{}",
                        String::from_utf8_lossy(&rel),
                        if follow_links {
                            ""
                        } else {
                            " (symlinks are followed only with --follow-links)"
                        }
                    ));
                }
            }
            Err(s) if skip_unreadable => skipped.push(s),
            Err(s) => {
                return Err(PackError::Source {
                    path: abs(src, &s.path),
                    detail: s.reason,
                })
            }
        }
    }
    if not_regular > 5 {
        warnings.push(format!(
            "skipped {not_regular} entries that are not regular files in all"
        ));
    }
    files.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));
    if let Some(w) = files.windows(2).find(|w| w[0].rel == w[1].rel) {
        return Err(PackError::Usage(format!(
            "{} is listed twice",
            String::from_utf8_lossy(&w[0].rel)
        )));
    }
    Ok(ScanResult {
        files,
        skipped,
        warnings,
        classes,
        names,
        names_digest,
    })
}

fn walk(
    src: &Path,
    follow_links: bool,
    skip_unreadable: bool,
    warnings: &mut Vec<String>,
    skipped: &mut Vec<Skipped>,
    on_found: &(dyn Fn(u64) + Sync),
) -> Result<Vec<Vec<u8>>, PackError> {
    let mut out = Vec::new();
    let mut special = 0u64;
    for entry in walkdir::WalkDir::new(src)
        .min_depth(1)
        .follow_links(follow_links)
        .sort_by_file_name()
    {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                let path = e
                    .path()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| src.to_path_buf());
                let rel = path
                    .strip_prefix(src)
                    .unwrap_or(&path)
                    .as_os_str()
                    .as_bytes()
                    .to_vec();
                let detail = e.to_string();
                if skip_unreadable {
                    skipped.push(Skipped {
                        path: rel,
                        reason: detail,
                    });
                    continue;
                }
                return Err(PackError::Source { path, detail });
            }
        };
        let ft = entry.file_type();
        if ft.is_dir() {
            continue;
        }
        let rel = entry
            .path()
            .strip_prefix(src)
            .map_err(|_| PackError::Usage(format!("walk left {}", src.display())))?
            .as_os_str()
            .as_bytes()
            .to_vec();
        if ft.is_file() {
            out.push(rel);
            if out.len() % 4096 == 0 {
                on_found(out.len() as u64);
            }
        } else {
            special += 1;
            if special <= 5 {
                let kind = if ft.is_symlink() {
                    "symbolic link (use --follow-links to follow links)"
                } else {
                    "special file"
                };
                warnings.push(format!("skipping {}: {kind}", entry.path().display()));
            }
        }
    }
    if special > 5 {
        warnings.push(format!("skipped {special} links and special files in all"));
    }
    on_found(out.len() as u64);
    Ok(out)
}

/// Reads a file list: NUL-separated if it contains a NUL byte, newline-separated otherwise.
/// Entries are relative to `src` (a leading `./` is dropped) or absolute paths inside `src`.
fn read_list(src: &Path, list: &Path) -> Result<Vec<Vec<u8>>, PackError> {
    let data = std::fs::read(list).map_err(|e| PackError::io("reading file list", list, e))?;
    let sep = if data.contains(&0) { 0 } else { b'\n' };
    let src_bytes = src.as_os_str().as_bytes();
    let mut out = Vec::new();
    for (lineno, item) in data.split(|&b| b == sep).enumerate() {
        let mut item = item;
        if sep == b'\n' && item.last() == Some(&b'\r') {
            item = &item[..item.len() - 1];
        }
        if item.is_empty() {
            continue;
        }
        if item.first() == Some(&b'/') {
            let rest = item
                .strip_prefix(src_bytes)
                .and_then(|r| r.strip_prefix(b"/"))
                .ok_or_else(|| {
                    PackError::Usage(format!(
                        "{}: entry {}: {} is not inside {}",
                        list.display(),
                        lineno + 1,
                        String::from_utf8_lossy(item),
                        src.display()
                    ))
                })?;
            item = rest;
        }
        while let Some(rest) = item.strip_prefix(b"./") {
            item = rest;
        }
        granary_format::check_relative_path(item).map_err(|why| {
            PackError::Usage(format!(
                "{}: entry {}: {why}: {}",
                list.display(),
                lineno + 1,
                String::from_utf8_lossy(item)
            ))
        })?;
        out.push(item.to_vec());
    }
    Ok(out)
}
