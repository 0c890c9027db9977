//! The write side of local storage: files that appear under their name only complete.
//!
//! Every file granary writes into a dataset, a staging directory, the tier or a cache goes
//! through [`AtomicFile`]: written under a temporary name in the same directory, flushed,
//! fsynced as its [`Durability`] says, renamed over the final name, and the directory fsynced
//! when asked. A file dropped before it is published (an error, a panic, a full disk) takes
//! its temporary file with it; the final name then still holds its old content, or nothing.
//! A publish can also be split in two ([`AtomicFile::finish`], then [`Pending::publish`]), so
//! that a caller can check or write something else between the last byte and the rename (a
//! merge writes its snapshot, then the parts' removal markers, then renames the snapshot).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// What survives a crash of the machine once a file is published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Nothing is fsynced: a copy that can be made again (a cached snapshot, a tier copy). The
    /// rename still makes the file appear whole or not at all to other processes.
    Rename,
    /// The file is fsynced before the rename; the caller syncs the directory once for many
    /// files ([`sync_dir`]), as a pack does for its chunks.
    File,
    /// The file, then its directory after the rename.
    FileAndDir,
}

/// Buffer of the writer in front of the file.
const BUFFER: usize = 1 << 20;

/// A file being written that appears under its name only when published.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    w: Option<BufWriter<File>>,
    durability: Durability,
    /// Set once [`AtomicFile::finish`] handed the temporary file to a [`Pending`].
    handed_over: bool,
}

impl AtomicFile {
    /// Starts `path`, written under `tmp` (which must be in the same directory) until it is
    /// published. An old file at `tmp` is replaced.
    pub fn create(path: &Path, tmp: &Path, durability: Durability) -> io::Result<Self> {
        Self::with_buffer(path, tmp, durability, BUFFER)
    }

    /// As [`AtomicFile::create`], with a buffer of `buffer` bytes: a write at least that large
    /// goes to the file as it is, without a copy into the buffer (a chunk's records of 100 KB
    /// and more), smaller ones are gathered.
    pub fn with_buffer(
        path: &Path,
        tmp: &Path,
        durability: Durability,
        buffer: usize,
    ) -> io::Result<Self> {
        let f = File::create(tmp)?;
        Ok(AtomicFile {
            path: path.to_path_buf(),
            tmp: tmp.to_path_buf(),
            w: Some(BufWriter::with_capacity(buffer, f)),
            durability,
            handed_over: false,
        })
    }

    /// The temporary name it is written under, for errors.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Flushes and (as the durability says) fsyncs the file, without renaming it yet.
    pub fn finish(mut self) -> io::Result<Pending> {
        let w = self.w.take().expect("an AtomicFile is finished once");
        let f = w.into_inner().map_err(|e| e.into_error())?;
        if self.durability != Durability::Rename {
            f.sync_all()?;
        }
        self.handed_over = true;
        Ok(Pending {
            path: std::mem::take(&mut self.path),
            tmp: std::mem::take(&mut self.tmp),
            durability: self.durability,
            published: false,
        })
    }

    /// Flushes, fsyncs, renames over the final name, and fsyncs the directory, as the
    /// durability says.
    pub fn publish(self) -> io::Result<()> {
        self.finish()?.publish()
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.writer().write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer().flush()
    }
}

impl AtomicFile {
    fn writer(&mut self) -> &mut BufWriter<File> {
        self.w
            .as_mut()
            .expect("an AtomicFile is written before it is finished")
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // Unflushed bytes go with the file (a flush on drop could only fail again).
        if let Some(w) = self.w.take() {
            let _ = w.into_parts();
        }
        if !self.handed_over {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A file written whole and synced, waiting to be renamed into place.
pub struct Pending {
    path: PathBuf,
    tmp: PathBuf,
    durability: Durability,
    published: bool,
}

impl Pending {
    /// The temporary name it is written under.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Renames it over the final name (then fsyncs the directory where the durability says).
    pub fn publish(mut self) -> io::Result<()> {
        std::fs::rename(&self.tmp, &self.path)?;
        self.published = true;
        if self.durability == Durability::FileAndDir {
            sync_dir(parent_of(&self.path))?;
        }
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Replaces `path` whole with what `write` writes, under the temporary name `tmp` (same
/// directory); see [`AtomicFile`].
pub fn write_atomic(
    path: &Path,
    tmp: &Path,
    durability: Durability,
    write: impl FnOnce(&mut AtomicFile) -> io::Result<()>,
) -> io::Result<()> {
    let mut f = AtomicFile::create(path, tmp, durability)?;
    write(&mut f)?;
    f.publish()
}

/// Fsyncs directory `dir` (`.` for an empty path), so that the renames in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let d = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(d)?.sync_all()
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_whole_or_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("index");
        let tmp = dir.path().join("index.tmp1");
        for d in [Durability::Rename, Durability::File, Durability::FileAndDir] {
            write_atomic(&p, &tmp, d, |w| w.write_all(b"old")).unwrap();
            let failed = write_atomic(&p, &tmp, d, |w| {
                w.write_all(b"half")?;
                Err(io::Error::other("disk full"))
            });
            assert!(failed.is_err());
            assert!(!tmp.exists(), "{d:?}: the temporary file stays");
            assert_eq!(std::fs::read(&p).unwrap(), b"old");
        }
    }

    #[test]
    fn a_file_whose_last_bytes_cannot_be_written_leaves_nothing() {
        // /dev/full takes the open and refuses every write with ENOSPC: the buffered bytes fail
        // only when finish flushes them.
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("full.tmp");
        std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
        let p = dir.path().join("full");
        let mut f = AtomicFile::create(&p, &tmp, Durability::Rename).unwrap();
        f.write_all(b"buffered").unwrap();
        let e = f.publish().expect_err("a full device fails the flush");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert!(
            std::fs::symlink_metadata(&tmp).is_err(),
            "the temporary name stays"
        );
        assert!(!p.exists());
    }

    #[test]
    fn a_pending_file_is_renamed_only_when_published() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("snapshot.gsnap");
        let tmp = dir.path().join("snapshot.tmp");
        let mut f = AtomicFile::create(&p, &tmp, Durability::FileAndDir).unwrap();
        f.write_all(b"new").unwrap();
        let pending = f.finish().unwrap();
        assert!(!p.exists() && tmp.exists());
        drop(pending);
        assert!(
            !p.exists() && !tmp.exists(),
            "an unpublished file is removed"
        );
        let mut f = AtomicFile::create(&p, &tmp, Durability::FileAndDir).unwrap();
        f.write_all(b"new").unwrap();
        f.finish().unwrap().publish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert!(!tmp.exists());
    }
}
