//! Finding the files to pack: a walk of SRC or a file list, then a parallel stat.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::files::{FileTable, Meta};
use crate::{lock, IoAt, PackError, Skipped};

/// A file's modification time in nanoseconds since the epoch, as the plan records it.
pub(crate) fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec())
}

/// A directory's mode and mtime, as the plan records them.
fn dir_meta(m: &std::fs::Metadata) -> Meta {
    Meta {
        mode: m.mode() & 0o7777,
        mtime_ns: mtime_ns(m),
        ..Meta::default()
    }
}

#[derive(Default)]
pub(crate) struct ScanResult {
    /// The regular files, sorted by path, with size, inode and mtime (labels not yet filled).
    pub files: FileTable,
    /// The directories a walk passed, or the ancestors of the files listed (not the root),
    /// sorted by path, with mode and mtime; of a shard, those it owns.
    pub dirs: FileTable,
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

/// Lists regular files under `src` (relative paths, raw bytes), then stats them in parallel,
/// with a spinner saying `what` meanwhile.
pub(crate) fn scan(
    src: &Path,
    opts: &crate::PackOptions,
    what: &str,
) -> Result<ScanResult, PackError> {
    let template = format!("{{spinner}} {what}: {{pos}} files found ({{elapsed}})");
    let pb = crate::progress_bar(opts.output.progress, None, &template);
    let mut r = ScanResult::default();
    match &opts.files_from {
        Some(list) => r.files = read_list(src, list)?,
        None => walk(src, opts, &mut r, &|n| pb.set_position(n))?,
    }
    r.dirs.sort_by_path();
    // Every shard sees every name (for the classes and the digest) but stats and keeps only
    // its own.
    r.names = r.files.len() as u64;
    r.names_digest = 0x6772_616e_6172_7931u64 ^ r.names;
    for rel in r.files.paths() {
        r.names_digest = crate::shard::mix64(r.names_digest ^ granary_format::path_hash(rel));
        if let Some(i) = rel.iter().position(|&b| b == b'/') {
            if r.classes.last().map(|c| &c[..]) != Some(&rel[..i]) {
                r.classes.push(rel[..i].to_vec());
            }
        }
    }
    r.classes.sort_unstable();
    r.classes.dedup();
    if opts.files_from.is_some() {
        r.dirs = list_ancestors(src, &r.files);
    }
    // Each shard records the directories it owns (by the same hash as files), so that the
    // merged dataset records every directory once.
    if let Some(s) = opts.output.shard {
        r.files.retain(|_, r| s.owns(r));
        r.dirs.retain(|_, r| s.owns(r));
    }
    let files = &mut r.files;
    files.sort_by_path();
    if let Some(dup) = files.first_duplicate() {
        return Err(usage!("{} is listed twice", String::from_utf8_lossy(dup)));
    }
    // What is not a regular file or cannot be stat'ed is marked and dropped below.
    let (kind, failures) = stat_files(src, files, opts.follow_links);
    if let Some((i, reason)) = failures.first().filter(|_| !opts.skip_unreadable) {
        return Err(PackError::Source {
            path: abs(src, files.path(*i)),
            detail: reason.clone(),
        });
    }
    for (i, reason) in failures {
        let path = files.path(i).to_vec();
        r.skipped.push(Skipped { path, reason });
    }
    let not_regular = (0..files.len()).filter(|&i| kind[i] == NOT_REGULAR);
    let links = match opts.follow_links {
        true => "",
        false => " (symlinks are followed only with --follow-links)",
    };
    let shown = not_regular.clone().take(5).map(|i| {
        let p = String::from_utf8_lossy(files.path(i));
        format!("skipping {p}: not a regular file{links}")
    });
    r.warnings.extend(shown);
    let not_regular = not_regular.count();
    if not_regular > 5 {
        r.warnings.push(format!(
            "skipped {not_regular} entries that are not regular files in all"
        ));
    }
    files.retain(|i, _| kind[i] == REGULAR);
    Ok(r)
}

/// What a file's stat found.
const REGULAR: u8 = 0;
const NOT_REGULAR: u8 = 1;
const FAILED: u8 = 2;

/// Size, inode, mtime and mode of each file, in parallel, straight into the table's
/// [`Meta`]; returns each file's kind ([`REGULAR`], [`NOT_REGULAR`], [`FAILED`]) and the
/// failures (by index, sorted).
fn stat_files(
    src: &Path,
    files: &mut FileTable,
    follow_links: bool,
) -> (Vec<u8>, Vec<(usize, String)>) {
    let n = files.len();
    let mut meta = vec![Meta::default(); n];
    let mut kind = vec![REGULAR; n];
    let failures = std::sync::Mutex::new(Vec::<(usize, String)>::new());
    let table = &*files;
    meta.par_iter_mut()
        .zip(kind.par_iter_mut())
        .enumerate()
        .for_each(|(i, (meta, kind))| {
            let p = abs(src, table.path(i));
            let md = if follow_links {
                std::fs::metadata(&p)
            } else {
                std::fs::symlink_metadata(&p)
            };
            match md {
                Ok(m) if m.is_file() => {
                    *meta = Meta {
                        size: m.len(),
                        ino: m.ino(),
                        mtime_ns: mtime_ns(&m),
                        mode: m.mode() & 0o7777,
                        label: 0,
                    }
                }
                Ok(_) => *kind = NOT_REGULAR,
                Err(e) => {
                    *kind = FAILED;
                    lock(&failures).push((i, format!("cannot stat: {e}")));
                }
            }
        });
    files.meta = meta;
    let mut failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    failures.sort_unstable_by_key(|(i, _)| *i);
    (kind, failures)
}

/// Walks `src`: its regular files and directories into `r`; what cannot be read is the error
/// or (`--skip-unreadable`) skipped.
fn walk(
    src: &Path,
    opts: &crate::PackOptions,
    r: &mut ScanResult,
    on_found: &(dyn Fn(u64) + Sync),
) -> Result<(), PackError> {
    let (follow_links, skip_unreadable) = (opts.follow_links, opts.skip_unreadable);
    let (out, dirs, warnings, skipped) =
        (&mut r.files, &mut r.dirs, &mut r.warnings, &mut r.skipped);
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
            // Its mode and mtime, for the dataset (a directory that cannot be stat'ed now is
            // simply not recorded: its files are what the pack is about).
            if let (Ok(m), Ok(rel)) = (entry.metadata(), entry.path().strip_prefix(src)) {
                dirs.push(rel.as_os_str().as_bytes(), dir_meta(&m));
            }
            continue;
        }
        let rel = entry
            .path()
            .strip_prefix(src)
            .map_err(|_| usage!("walk left {}", src.display()))?
            .as_os_str()
            .as_bytes();
        if ft.is_file() {
            out.push_path(rel);
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
    Ok(())
}

/// The directories of a file list: every ancestor of a name listed, stat'ed in parallel, sorted
/// (one that cannot be stat'ed is not recorded, as in a walk: the files are what a pack is
/// about, and a missing one is reported when it is stat'ed).
fn list_ancestors(src: &Path, files: &FileTable) -> FileTable {
    let mut names: Vec<&[u8]> = Vec::new();
    let mut last: &[u8] = b"";
    for rel in files.paths() {
        let parent = &rel[..rel.iter().rposition(|&b| b == b'/').unwrap_or(0)];
        if parent != last {
            last = parent;
            names.extend(
                parent
                    .iter()
                    .enumerate()
                    .filter(|(_, &b)| b == b'/')
                    .map(|(i, _)| &parent[..i])
                    .chain((!parent.is_empty()).then_some(parent)),
            );
        }
    }
    names.sort_unstable();
    names.dedup();
    let found: Vec<Option<Meta>> = names
        .par_iter()
        .map(|d| {
            let m = std::fs::metadata(abs(src, d)).ok().filter(|m| m.is_dir())?;
            Some(dir_meta(&m))
        })
        .collect();
    let mut dirs = FileTable::default();
    for (d, f) in names.iter().zip(found) {
        if let Some(meta) = f {
            dirs.push(d, meta);
        }
    }
    dirs
}

/// Reads a file list: NUL-separated if it contains a NUL byte, newline-separated otherwise.
/// Entries are relative to `src` (a leading `./` is dropped) or absolute paths inside `src`.
fn read_list(src: &Path, list: &Path) -> Result<FileTable, PackError> {
    let data = std::fs::read(list).at("reading file list", list)?;
    let sep = if data.contains(&0) { 0 } else { b'\n' };
    let src_bytes = src.as_os_str().as_bytes();
    let mut out = FileTable::default();
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
                    usage!(
                        "{}: entry {}: {} is not inside {}",
                        list.display(),
                        lineno + 1,
                        String::from_utf8_lossy(item),
                        src.display()
                    )
                })?;
            item = rest;
        }
        while let Some(rest) = item.strip_prefix(b"./") {
            item = rest;
        }
        granary_format::check_relative_path(item).map_err(|why| {
            usage!(
                "{}: entry {}: {why}: {}",
                list.display(),
                lineno + 1,
                String::from_utf8_lossy(item)
            )
        })?;
        out.push_path(item);
    }
    Ok(out)
}
