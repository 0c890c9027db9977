//! Where a pack may write, and what it may replace: the source is only ever read, `--force`
//! replaces only a granary dataset (or the build directory of one), and one pack at a time
//! builds a given output.

use std::fs::File;
use std::path::{Component, Path, PathBuf};

use granary_format::{parse_chunk_file_name, SNAPSHOT_FILE};

use crate::{upload, IoAt, OutputOptions, PackError, PLAN_FILE};

/// Claims the output of a new write (whole or a shard's part; not an append) before anything
/// is written: an object-store destination must be empty or hold only what granary writes
/// (returns what it holds, for the publish); a local dataset at `out` is replaced only with
/// `force`; a shard's `out` must not be a dataset already.
pub(crate) fn claim(
    o: &OutputOptions,
    warnings: &mut Vec<String>,
) -> Result<Vec<(String, u64)>, PackError> {
    let out = &o.out;
    if o.shard.is_some() && out.join(SNAPSHOT_FILE).exists() {
        return Err(usage!(
            "{} is a dataset already (merged, or written whole); shards build a new dataset: \
             choose another output or remove it",
            out.display()
        ));
    }
    match &o.destination {
        Some(d) => upload::check_destination(d, o.force, o.resume, warnings),
        None => {
            if o.shard.is_none() && std::fs::symlink_metadata(out).is_ok() {
                if !o.force {
                    return Err(usage!(
                        "{} already exists; pass --force (Python: force=True) to replace it",
                        out.display()
                    ));
                }
                check_replaceable(out, Kind::Dataset)?;
            }
            Ok(Vec::new())
        }
    }
}

/// `path` made absolute with every symbolic link and `..` resolved, also when its last
/// components do not exist yet (they are then taken lexically: a missing directory cannot be a
/// link).
pub(crate) fn resolve(path: &Path) -> Result<PathBuf, PackError> {
    let abs = std::path::absolute(path).at("finding the current directory for", path)?;
    let mut existing = abs.as_path();
    let mut tail = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(mut p) => {
                for c in tail.iter().rev() {
                    match c {
                        Component::ParentDir => {
                            p.pop();
                        }
                        Component::Normal(n) => p.push(n),
                        _ => {}
                    }
                }
                return Ok(p);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(parent) = existing.parent() else {
                    return Err(PackError::io("resolving", path, e));
                };
                tail.extend(existing.components().next_back());
                existing = parent;
            }
            Err(e) => return Err(PackError::io("resolving", path, e)),
        }
    }
}

/// Refuses an output that is the source, lies inside it, or contains it (`src` is resolved
/// already; `out` and the build directory `work` are resolved here).
pub(crate) fn check_disjoint(src: &Path, out: &Path, work: &Path) -> Result<(), PackError> {
    let (out_abs, work_abs) = (resolve(out)?, resolve(work)?);
    let refuse = |why: &str| {
        Err(usage!(
            "the output {} {why} the source {}; pack never writes into its source: choose an output outside it",
            out.display(),
            src.display()
        ))
    };
    if out_abs == src {
        return refuse("is");
    }
    if out_abs.starts_with(src) || work_abs.starts_with(src) {
        return refuse("is inside");
    }
    if src.starts_with(&out_abs) || src.starts_with(&work_abs) {
        return refuse("contains");
    }
    Ok(())
}

/// Where `upgrade` keeps the 1.x snapshot it replaced (in the dataset's directory or prefix):
/// one of a dataset's own files.
pub const LEGACY_SNAPSHOT_FILE: &str = "snapshot-1.x.gsnap";

/// The name a file in a build directory will have once written: `name` itself, or what a
/// temporary file is being written for (`AtomicFile`'s names, or the `NAME.tmp` of builds
/// that earlier versions interrupted).
pub(crate) fn final_name(name: &str) -> &str {
    granary_store::write::temp_target(name)
        .or_else(|| name.strip_suffix(".tmp"))
        .unwrap_or(name)
}

/// What kind of directory [`check_replaceable`] expects.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A published dataset: the snapshot and chunk files.
    Dataset,
    /// A pack's build directory: also the plan and temporary files of an interrupted run.
    Build,
}

/// True for the names a pack writes into `kind` of directory: a dataset's snapshot (and the
/// 1.x one `upgrade` keeps) and chunks; in a build directory also its plan, part file and
/// upload markers, a file being written (`AtomicFile`'s temporary names), and the fixed
/// temporary names of builds that earlier versions interrupted.
fn ours(name: &str, kind: Kind) -> bool {
    let temp = ["pack-plan.tmp", "part.tmp", "snapshot.tmp"];
    [SNAPSHOT_FILE, LEGACY_SNAPSHOT_FILE].contains(&name)
        || parse_chunk_file_name(name).is_some()
        || kind == Kind::Build
            && (granary_store::write::temp_target(name).is_some_and(|t| ours(t, kind))
                || [PLAN_FILE, crate::PART_FILE].contains(&name)
                || temp.contains(&name)
                || name
                    .strip_suffix(".tmp")
                    .and_then(parse_chunk_file_name)
                    .is_some()
                || crate::upload::parse_sent_name(name).is_some())
}

/// Checks that `dir` holds nothing but what a pack writes (regular files with granary's names)
/// before `--force` deletes it: anything else is the user's, and the user has to remove it.
pub(crate) fn check_replaceable(dir: &Path, kind: Kind) -> Result<(), PackError> {
    let what = match kind {
        Kind::Dataset => "a granary dataset",
        Kind::Build => "the build directory of a granary pack",
    };
    let refuse = |detail: String| {
        Err(usage!(
            "{} is not {what} ({detail}); --force replaces only that: remove it yourself if it should go",
            dir.display()
        ))
    };
    let md = std::fs::symlink_metadata(dir).at("inspecting", dir)?;
    if !md.is_dir() {
        return refuse(if md.file_type().is_symlink() {
            "a symbolic link".into()
        } else {
            "not a directory".into()
        });
    }
    let entries = std::fs::read_dir(dir).at("listing", dir)?;
    for e in entries {
        let e = e.at("listing", dir)?;
        let name = e.file_name();
        let regular = e.file_type().map(|t| t.is_file()).unwrap_or(false);
        match name.to_str() {
            Some(n) if regular && ours(n, kind) => {}
            _ => return refuse(format!("it holds {}", e.path().display())),
        }
    }
    Ok(())
}

/// An exclusive lock on a directory, held until dropped.
pub(crate) struct DirLock {
    _dir: File,
}

/// Takes the exclusive lock on the open directory `dir` (at `path`) if no one holds it.
fn try_lock(dir: &File, path: &Path) -> Result<bool, PackError> {
    match rustix::fs::flock(dir, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(PackError::io("locking", path, e.into())),
    }
}

impl DirLock {
    /// Locks the build directory `work` (which must exist) of `out` for the whole pack (also
    /// across the rename that publishes it), or fails naming the pack that holds it: a second
    /// pack of the same output fails at once instead of mixing its chunks with ours.
    pub(crate) fn build(work: &Path, out: &Path) -> Result<Self, PackError> {
        use std::os::unix::fs::MetadataExt;
        let dir = File::open(work).at("opening", work)?;
        if !try_lock(&dir, work)? {
            return Err(usage!(
                "another granary pack is building {} right now (it holds the lock on {}); wait for it to finish or stop it",
                out.display(),
                work.display()
            ));
        }
        // A pack that finished between our open and our lock renamed the directory we hold
        // to its output: the lock is only ours if the name still leads to what we locked.
        let held = dir.metadata().at("inspecting", work)?;
        let now = std::fs::metadata(work).at("inspecting", work)?;
        if (held.dev(), held.ino()) != (now.dev(), now.ino()) {
            return Err(usage!(
                "another granary pack of {} finished while this one started; run again to replace it",
                out.display()
            ));
        }
        Ok(DirLock { _dir: dir })
    }

    /// The longest a command waits for another one rewriting the same dataset.
    pub(crate) const WAIT: std::time::Duration = std::time::Duration::from_secs(120);

    /// Locks a published dataset's directory for a command that rewrites it in place
    /// (`what`: `append`, `upgrade`, `reindex`, `merge`): two of them never interleave their
    /// writes. A second one waits for the first (saying so once) up to [`DirLock::WAIT`],
    /// then fails naming the dataset.
    pub(crate) fn dataset(dataset: &Path, what: &str) -> Result<Self, PackError> {
        let dir = File::open(dataset).at("opening", dataset)?;
        let start = std::time::Instant::now();
        for waits in 0.. {
            if try_lock(&dir, dataset)? {
                break;
            }
            if start.elapsed() >= Self::WAIT {
                return Err(usage!(
                    "{}: another granary command has been rewriting it for {} s (it holds \
                     the lock on the directory); run {what} again once it is done",
                    dataset.display(),
                    Self::WAIT.as_secs()
                ));
            }
            if waits == 0 {
                eprintln!(
                    "granary {what}: waiting for another granary command rewriting {} \
                     (it holds the lock on the directory)",
                    dataset.display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(DirLock { _dir: dir })
    }
}

/// Removes everything in `dir` (a build directory checked by [`check_replaceable`]) but keeps
/// the directory itself, so the lock on it stays held.
pub(crate) fn empty_dir(dir: &Path) -> Result<(), PackError> {
    remove_files_where(dir, |_, _| true)
}

/// Removes the entries of `dir` for which `ours(name, is a regular file)` holds.
pub(crate) fn remove_files_where(
    dir: &Path,
    ours: impl Fn(&str, bool) -> bool,
) -> Result<(), PackError> {
    let entries = std::fs::read_dir(dir).at("listing", dir)?;
    for e in entries {
        let e = e.at("listing", dir)?;
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if ours(&e.file_name().to_string_lossy(), is_file) {
            let p = e.path();
            std::fs::remove_file(&p).at("removing", &p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_handles_missing_tails_links_and_dotdot() {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();
        assert_eq!(resolve(&base.join("link")).unwrap(), base.join("real"));
        assert_eq!(
            resolve(&base.join("link/new/../x")).unwrap(),
            base.join("real/x")
        );
        assert_eq!(resolve(&base.join("real/..")).unwrap(), base);
    }

    #[test]
    fn only_granary_names_are_replaceable() {
        assert!(ours("snapshot.gsnap", Kind::Dataset));
        assert!(ours("chunk-00000003.gchunk", Kind::Dataset));
        assert!(!ours("pack-plan.bin", Kind::Dataset));
        assert!(ours("pack-plan.bin", Kind::Build));
        assert!(ours("chunk-00000003.gchunk.tmp", Kind::Build));
        assert!(ours(
            "chunk-00000003.gchunk.0a0b0c0d-1f2-0.tmp",
            Kind::Build
        ));
        assert!(ours("snapshot.gsnap.0a0b0c0d-1f2-3.tmp", Kind::Build));
        assert!(!ours("snapshot.gsnap.0a0b0c0d-1f2-3.tmp", Kind::Dataset));
        assert!(!ours("notes.txt.0a0b0c0d-1f2-3.tmp", Kind::Build));
        assert!(!ours("chunk-3.gchunk", Kind::Build));
        assert!(!ours("important.txt", Kind::Build));
    }
}
