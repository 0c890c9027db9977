//! `extract`: restore the packed tree, never writing outside the target directory.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::dataset::Dataset;
use crate::error::{ReadError, Result};
use crate::pathfmt::escape_path;

/// What to extract and where.
#[derive(Clone, Debug)]
pub struct ExtractOptions {
    /// Target directory (created if missing). Existing files are never overwritten.
    pub out_dir: PathBuf,
    /// Only paths starting with these bytes.
    pub prefix: Vec<u8>,
    /// Restore each file's and directory's mode and mtime where the dataset records them (not
    /// packed with `--no-metadata`); otherwise files get the umask's mode and the time of the
    /// extraction. Empty directories are created either way.
    pub metadata: bool,
}

/// What [`extract`] did.
#[derive(Debug, Default)]
pub struct ExtractSummary {
    pub files: u64,
    pub bytes: u64,
    /// Directories the dataset records that were created or given their mode and mtime.
    pub dirs: u64,
    /// Samples that could not be restored, with the reason; nothing was written for them.
    pub failed: Vec<(String, String)>,
}

/// Restores every sample whose path starts with `opts.prefix` under `opts.out_dir`, byte-exact.
/// Paths that are not plain relative paths, and any path that would pass through a symbolic
/// link or an existing non-directory, are refused. A damaged record is reported and not
/// written; the rest are still extracted.
pub fn extract(ds: &Dataset, opts: &ExtractOptions) -> Result<ExtractSummary> {
    std::fs::create_dir_all(&opts.out_dir)
        .map_err(|e| ReadError::io("creating", &opts.out_dir, e))?;
    let mut by_chunk: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    // With fields each sample is the files KEY.FIELD: the prefix selects keys
    // first, then the file names.
    let key_prefix = match ds.has_fields() {
        true => granary_format::split_field_path(&opts.prefix).map_or(&opts.prefix[..], |(k, _)| k),
        false => &opts.prefix[..],
    };
    for id in selected(ds, key_prefix)? {
        let chunk = ds.sample(id)?.entry.chunk;
        by_chunk.entry(chunk).or_default().push(id);
    }
    let mut total = by_chunk
        .into_par_iter()
        .map(|(chunk, ids)| {
            let mut s = ExtractSummary::default();
            let bytes = ds.load_chunk(chunk);
            for id in ids {
                let path = ds.path(id).unwrap_or_default();
                let res = match &bytes {
                    Ok(b) => restore_sample(ds, opts, b, id, &path).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match res {
                    Ok((files, n)) => {
                        s.files += files;
                        s.bytes += n;
                    }
                    Err(e) => s.failed.push((escape_path(&path), e)),
                }
            }
            s
        })
        .reduce(ExtractSummary::default, |mut total, r| {
            total.files += r.files;
            total.bytes += r.bytes;
            total.failed.extend(r.failed);
            total
        });
    // Directories last, deepest first: creating files changes a directory's mtime, and a
    // directory without write permission could not take its files.
    for d in ds.dirs()?.iter().rev() {
        if !d.path.starts_with(&opts.prefix) {
            continue;
        }
        match restore_dir(&opts.out_dir, &d.path, d.attrs.filter(|_| opts.metadata)) {
            Ok(()) => total.dirs += 1,
            Err(e) => total.failed.push((escape_path(&d.path), e.to_string())),
        }
    }
    total.failed.sort();
    Ok(total)
}

/// Writes sample `id` (at `path`) from its chunk's bytes: its file, or with fields the files
/// `path.FIELD` under the prefix. The files written and their bytes.
fn restore_sample(
    ds: &Dataset,
    opts: &ExtractOptions,
    chunk: &[u8],
    id: u64,
    path: &[u8],
) -> Result<(u64, u64)> {
    let data = ds.decode_from(chunk, id)?;
    let stat = ds.stat(id)?;
    let attrs = stat.attrs.filter(|_| opts.metadata);
    if !ds.has_fields() {
        // The size the namespace shows is the file's, or an error.
        if stat.size != data.len() as u64 {
            let (n, size) = (data.len(), stat.size);
            let m =
                format!("sample {id}: its record holds {n} bytes, its namespace entry says {size}");
            return Err(ReadError::invalid(m));
        }
        write_new(&opts.out_dir, path, &data, attrs)?;
        return Ok((1, data.len() as u64));
    }
    let (mut files, mut n) = (0, 0);
    for (name, d) in ds.split_fields(id, &data)? {
        let file = [path, b".", name].concat();
        if file.starts_with(&opts.prefix) {
            write_new(&opts.out_dir, &file, d, attrs)?;
            files += 1;
            n += d.len() as u64;
        }
    }
    Ok((files, n))
}

/// Permission bits restored: set-user-id and set-group-id are not (as `tar` without `-p`
/// for someone other than root), the rest are.
const RESTORED_MODE: u32 = 0o1777;

/// Creates directory `root/rel` (and the ones above it) if missing, then gives it `attrs`.
fn restore_dir(root: &Path, rel: &[u8], attrs: Option<granary_format::FileAttrs>) -> Result<()> {
    let dir = safe_path(root, rel, true)?;
    let Some(a) = attrs else {
        return Ok(());
    };
    let f = File::open(&dir).map_err(|e| ReadError::io("opening", &dir, e))?;
    set_attrs(&f, &dir, a)
}

/// Gives the open file or directory `f` at `path` the mode and mtime `a`.
fn set_attrs(f: &File, path: &Path, a: granary_format::FileAttrs) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_times(std::fs::FileTimes::new().set_modified(a.modified()))
        .map_err(|e| ReadError::io("setting the mtime of", path, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(a.mode & RESTORED_MODE))
        .map_err(|e| ReadError::io("setting the mode of", path, e))
}

/// `root/rel` after checking that `rel` is a plain relative path, with every directory on the
/// way (and `rel` itself when `dir`) created if missing and refused if it is a symbolic link
/// or not a directory.
fn safe_path(root: &Path, rel: &[u8], dir: bool) -> Result<PathBuf> {
    granary_format::check_relative_path(rel).map_err(|why| {
        ReadError::invalid(format!("refusing unsafe path {}: {why}", escape_path(rel)))
    })?;
    let comps: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
    let mut path = root.to_path_buf();
    for (i, comp) in comps.iter().enumerate() {
        path.push(std::ffi::OsStr::from_bytes(comp));
        if dir || i + 1 < comps.len() {
            ensure_real_dir(&path)?;
        }
    }
    Ok(path)
}

/// The samples to extract (through a view, those of the view): every id once for the whole
/// tree (the namespace is not needed); for a prefix, the files of the namespace's range of it,
/// checked on the way as far as extraction relies on it: strictly sorted, no sample twice,
/// every path under the prefix (a crafted order would skip or repeat files).
fn selected(ds: &Dataset, prefix: &[u8]) -> Result<Vec<u64>> {
    let keep = |id: u64| ds.selects(id);
    if prefix.is_empty() {
        return Ok((0..ds.len()).filter(|&id| keep(id)).collect());
    }
    let damaged = |pos: u64, id: u64| {
        ReadError::invalid(format!(
            "{}: the snapshot's namespace is damaged at position {pos} (sample {id}); nothing \
             was extracted: run `granary verify`, then `granary reindex`",
            ds.snapshot_path().display()
        ))
    };
    let range = ds.prefix_range(prefix)?;
    let mut seen = std::collections::HashSet::new();
    let mut prev: Option<Vec<u8>> = None;
    let mut ids = Vec::new();
    let mut pos = range.start;
    while pos < range.end {
        let batch = ds.entries(pos..range.end.min(pos + 4096))?;
        if batch.is_empty() {
            return Err(damaged(pos, 0));
        }
        for e in batch {
            let bad = prev.as_ref().is_some_and(|p| *p >= e.path) || !e.path.starts_with(prefix);
            if let Some(id) = e.id {
                if !seen.insert(id) || bad {
                    return Err(damaged(pos, id));
                }
                if keep(id) {
                    ids.push(id);
                }
            }
            prev = Some(e.path);
            pos += 1;
        }
    }
    Ok(ids)
}

/// Creates `root/rel` (a new file) holding `data`, with `attrs` (mode, mtime) if given,
/// creating directories on the way. Refuses unsafe paths, symbolic links and existing files.
fn write_new(
    root: &Path,
    rel: &[u8],
    data: &[u8],
    attrs: Option<granary_format::FileAttrs>,
) -> Result<()> {
    let target = safe_path(root, rel, false)?;
    let mut f: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&target)
        .map_err(|e| ReadError::io("creating", &target, e))?;
    let done = (f.write_all(data).and_then(|_| f.flush()))
        .map_err(|e| ReadError::io("writing", &target, e))
        .and_then(|_| attrs.map_or(Ok(()), |a| set_attrs(&f, &target, a)));
    if done.is_err() {
        drop(f);
        let _ = std::fs::remove_file(&target);
    }
    done
}

fn ensure_real_dir(dir: &Path) -> Result<()> {
    let mut meta = std::fs::symlink_metadata(dir);
    if meta
        .as_ref()
        .is_err_and(|e| e.kind() == ErrorKind::NotFound)
    {
        match std::fs::create_dir(dir) {
            Ok(()) => return Ok(()),
            // Made meanwhile by another: looked at again.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => meta = std::fs::symlink_metadata(dir),
            Err(e) => return Err(ReadError::io("creating", dir, e)),
        }
    }
    let meta = meta.map_err(|e| ReadError::io("inspecting", dir, e))?;
    if meta.is_dir() {
        return Ok(());
    }
    let d = dir.display();
    let why = match meta.file_type().is_symlink() {
        true => format!("refusing to extract through symbolic link {d}"),
        false => format!("{d} exists and is not a directory"),
    };
    Err(ReadError::invalid(why))
}
