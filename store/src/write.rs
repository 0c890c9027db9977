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
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::buf::{AlignedBuf, ALIGN};

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

/// Buffer of a file written with `O_DIRECT`: each write of it is one request to the device
/// (its memory is huge pages where the kernel has them: see [`crate::buf`]).
const DIRECT_BUFFER: usize = 4 << 20;

/// The least a write to a file written with `O_DIRECT` must be to go to the device from the
/// caller's memory (see `DirectOut::write_in_place`): smaller ones are gathered.
const IN_PLACE_MIN: usize = 1 << 20;

/// A file being written that appears under its name only when published.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    w: Option<Out>,
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
        Ok(Self::over(
            path,
            tmp,
            durability,
            Out::Buffered(BufWriter::with_capacity(buffer, f)),
        ))
    }

    /// As [`AtomicFile::create`], written past the page cache (`O_DIRECT`) where the file
    /// system takes it: whole buffers of 4 MiB go from memory to the device, the last part
    /// through the page cache. For large files that are written once and not read back soon
    /// (a pack's chunk files): the kernel neither copies their bytes into the page cache nor
    /// writes them back later, and they push nothing else out of memory. Where `O_DIRECT` does
    /// not pay ([`direct_pays`]: tmpfs) or is refused (some network file systems, at the open
    /// or at a write), the file is written through the page cache as [`AtomicFile::create`]
    /// writes it.
    pub fn direct(path: &Path, tmp: &Path, durability: Durability) -> io::Result<Self> {
        let f = File::create(tmp)?;
        let out = match direct_pays(&f) && set_direct(&f, true)? {
            true => Out::Direct(DirectOut::new(f)),
            false => Out::Buffered(BufWriter::with_capacity(BUFFER, f)),
        };
        Ok(Self::over(path, tmp, durability, out))
    }

    fn over(path: &Path, tmp: &Path, durability: Durability, out: Out) -> Self {
        AtomicFile {
            path: path.to_path_buf(),
            tmp: tmp.to_path_buf(),
            w: Some(out),
            durability,
            handed_over: false,
        }
    }

    /// True when the file is being written past the page cache (see [`AtomicFile::direct`]).
    pub fn is_direct(&self) -> bool {
        matches!(&self.w, Some(Out::Direct(d)) if d.direct)
    }

    /// The temporary name it is written under, for errors.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Flushes and (as the durability says) fsyncs the file, without renaming it yet.
    pub fn finish(mut self) -> io::Result<Pending> {
        let f = match self.w.take().expect("an AtomicFile is finished once") {
            Out::Buffered(w) => w.into_inner().map_err(|e| e.into_error())?,
            Out::Direct(d) => d.finish()?,
        };
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
    fn writer(&mut self) -> &mut dyn Write {
        match self
            .w
            .as_mut()
            .expect("an AtomicFile is written before it is finished")
        {
            Out::Buffered(w) => w,
            Out::Direct(d) => d,
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // Unflushed bytes go with the file (a flush on drop could only fail again).
        if let Some(Out::Buffered(w)) = self.w.take() {
            let _ = w.into_parts();
        }
        if !self.handed_over {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// How an [`AtomicFile`]'s bytes reach its file.
enum Out {
    Buffered(BufWriter<File>),
    Direct(DirectOut),
}

/// A file written with `O_DIRECT`: bytes are gathered in an aligned buffer, each full buffer
/// written at its (aligned) offset; the last, partial buffer is written through the page
/// cache at [`DirectOut::finish`] (a direct write must be a whole number of blocks).
struct DirectOut {
    f: File,
    buf: AlignedBuf,
    /// Bytes gathered in `buf`.
    len: usize,
    /// Where `buf` goes in the file.
    at: u64,
    /// False once the file system refused a direct write: `O_DIRECT` is off for the file and
    /// the buffer is written through the page cache.
    direct: bool,
}

impl DirectOut {
    /// Writing `f`, which has `O_DIRECT` on.
    fn new(f: File) -> DirectOut {
        DirectOut {
            f,
            buf: AlignedBuf::new(DIRECT_BUFFER),
            len: 0,
            at: 0,
            direct: true,
        }
    }

    /// Writes the gathered bytes (a whole buffer, unless `last`) at their offset.
    fn drain(&mut self, last: bool) -> io::Result<()> {
        if self.direct && (last || !self.len.is_multiple_of(ALIGN)) {
            // The end of the file: through the page cache.
            self.direct = set_direct(&self.f, false)?;
        }
        let bytes = &self.buf.as_slice()[..self.len];
        write_all_at(&self.f, bytes, self.at, &mut self.direct)?;
        self.at += self.len as u64;
        self.len = 0;
        Ok(())
    }

    /// Writes what is left and hands the file back (not yet synced).
    fn finish(mut self) -> io::Result<File> {
        if self.len > 0 {
            self.drain(true)?;
        }
        Ok(self.f)
    }
}

/// Whether writing `f` past the page cache pays: not on a file system whose files live in
/// memory (tmpfs, ramfs), where a direct write is a copy into the page cache plus an attempt
/// to drop it again (the default `Writer`'s chunks to tmpfs: 4,100-4,800 samples/s direct,
/// 5,000-5,300 through the page cache, 3 alternated runs).
pub(crate) fn direct_pays(f: &File) -> bool {
    use rustix::fs::FsWord;
    /// tmpfs's and ramfs's `f_type` (linux/magic.h).
    const MEMORY: [u32; 2] = [0x0102_1994, 0x8584_58f6];
    match rustix::fs::fstatfs(f) {
        Ok(st) => !MEMORY.iter().any(|&m| st.f_type == m as FsWord),
        Err(_) => false,
    }
}

/// Turns `O_DIRECT` on or off for `f`; returns whether it is on (false where the file system
/// refuses it).
pub(crate) fn set_direct(f: &File, on: bool) -> io::Result<bool> {
    use rustix::fs::OFlags;
    let flags = rustix::fs::fcntl_getfl(f)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    match rustix::fs::fcntl_setfl(f, flags) {
        Ok(()) => Ok(on),
        Err(e) if on && e == rustix::io::Errno::INVAL => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Writes all of `bytes` at `at` in `f`. Where `*direct` and the file system refuses the
/// write as it stands (`EINVAL`: an alignment it does not take), turns `O_DIRECT` off for `f`,
/// clears `*direct` and writes through the page cache.
pub(crate) fn write_all_at(f: &File, bytes: &[u8], at: u64, direct: &mut bool) -> io::Result<()> {
    match f.write_all_at(bytes, at) {
        Err(e) if *direct && e.raw_os_error() == Some(libc::EINVAL) => {
            *direct = set_direct(f, false)?;
            f.write_all_at(bytes, at)
        }
        r => r,
    }
}

impl DirectOut {
    /// Writes the whole blocks of `b` straight from `b` (no copy into the buffer) when they
    /// lie at a block boundary in memory where they go at one in the file, and `b` is large:
    /// a caller that laid its bytes out so (a pack reads a chunk's files to where they lie in
    /// the chunk, a block's worth past the chunk's header) hands the device its memory. The
    /// bytes up to the block boundary go into the buffer first, which is written out. Returns
    /// the bytes taken, `None` when `b` goes through the buffer.
    fn write_in_place(&mut self, b: &[u8]) -> io::Result<Option<usize>> {
        let pos = self.at + self.len as u64;
        let gap = (ALIGN - (pos % ALIGN as u64) as usize) % ALIGN;
        let aligned = (b.as_ptr() as usize)
            .wrapping_add(gap)
            .is_multiple_of(ALIGN);
        if !self.direct || !aligned || b.len() < gap + IN_PLACE_MIN {
            return Ok(None);
        }
        // `at` is at a block boundary, so the buffer with the gap filled is whole blocks (and
        // no fuller than the buffer: it is drained whenever it is full).
        self.buf.as_mut_slice()[self.len..self.len + gap].copy_from_slice(&b[..gap]);
        self.len += gap;
        if self.len > 0 {
            self.drain(false)?;
        }
        if !self.direct {
            return Ok(Some(gap)); // the file system refused direct writes: the rest as usual
        }
        let whole = (b.len() - gap) / ALIGN * ALIGN;
        write_all_at(&self.f, &b[gap..gap + whole], self.at, &mut self.direct)?;
        self.at += whole as u64;
        Ok(Some(gap + whole))
    }
}

impl Write for DirectOut {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if let Some(n) = self.write_in_place(b)? {
            return Ok(n);
        }
        let n = b.len().min(DIRECT_BUFFER - self.len);
        self.buf.as_mut_slice()[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
        if self.len == DIRECT_BUFFER {
            self.drain(false)?;
        }
        Ok(n)
    }

    /// Nothing: a partial buffer can be written only at the end (see [`DirectOut::finish`]).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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
    use std::os::unix::fs::OpenOptionsExt;

    /// A file `full` to be written as `full.tmp`, a link to /dev/full (which takes the open
    /// and refuses every write with ENOSPC).
    fn full_device(dir: &Path) -> (PathBuf, PathBuf) {
        let tmp = dir.join("full.tmp");
        std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
        (dir.join("full"), tmp)
    }

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
        let (p, tmp) = full_device(dir.path());
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

    /// Writes `parts` (offsets into one aligned source buffer, so that some start at a block
    /// boundary of memory) through a direct file and returns what the file holds and what
    /// was meant.
    fn direct_round_trip(parts: &[(usize, usize)]) -> (Vec<u8>, Vec<u8>, bool) {
        let dir = tempfile::tempdir().unwrap();
        let (p, tmp) = (dir.path().join("c"), dir.path().join("c.tmp"));
        let mut src = AlignedBuf::new(12 << 20);
        for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 31 % 253) as u8;
        }
        let mut f = AtomicFile::direct(&p, &tmp, Durability::File).unwrap();
        let direct = f.is_direct();
        let mut want = Vec::new();
        for &(at, len) in parts {
            let b = &src.as_slice()[at..at + len];
            f.write_all(b).unwrap();
            want.extend_from_slice(b);
        }
        f.publish().unwrap();
        (std::fs::read(&p).unwrap(), want, direct)
    }

    #[test]
    fn a_direct_file_holds_exactly_what_was_written_however_it_was_cut() {
        let cases: [&[(usize, usize)]; 7] = [
            &[],
            &[(5, 100)],
            // A header, then a run lying a header's length past a block boundary (in place).
            &[(0, 64), (4096 + 64, 9 << 20), (3, 1000)],
            // The same run one byte off (through the buffer).
            &[(0, 64), (4096 + 65, 9 << 20)],
            // Whole buffers and their edges.
            &[(0, 4 << 20), (0, 1), (0, (4 << 20) - 1), (7, 4096)],
            &[(1, 1 << 20), (0, 3 << 20), (4096, 5 << 20)],
            // Many small writes that cross buffer boundaries.
            &[(10, 333_333); 20],
        ];
        for parts in cases {
            let (got, want, _) = direct_round_trip(parts);
            assert_eq!(got.len(), want.len(), "{parts:?}");
            assert!(got == want, "{parts:?}: the bytes differ");
        }
        // Where this test runs (ext4 here), the file is direct; on tmpfs it is not.
        let (_, _, direct) = direct_round_trip(&[(0, 1)]);
        let fs_direct = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(tempfile::tempdir().unwrap().path().join("probe"))
            .is_ok_and(|f| direct_pays(&f));
        assert_eq!(direct, fs_direct);
    }

    #[test]
    fn a_file_on_tmpfs_is_written_through_the_page_cache() {
        // /dev/shm, where /proc/mounts says it is tmpfs (it is on Linux machines as a rule).
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        if !mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == Some("/dev/shm") && l.contains(" tmpfs "))
        {
            eprintln!("skipped: /dev/shm is not tmpfs here");
            return;
        }
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let (p, tmp) = (dir.path().join("c"), dir.path().join("c.tmp"));
        let mut f = AtomicFile::direct(&p, &tmp, Durability::File).unwrap();
        assert!(!f.is_direct());
        f.write_all(&[5; 10_000]).unwrap();
        f.publish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), vec![5; 10_000]);
    }

    #[test]
    fn a_direct_file_that_fails_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (p, tmp) = full_device(dir.path());
        let big = AlignedBuf::new(5 << 20);
        let r = AtomicFile::direct(&p, &tmp, Durability::File)
            .and_then(|mut f| f.write_all(big.as_slice()).and_then(|()| f.publish()));
        let e = r.expect_err("a full device fails");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert!(std::fs::symlink_metadata(&tmp).is_err());
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
