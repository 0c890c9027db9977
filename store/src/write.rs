//! The write side of local storage: files that appear under their name only complete.
//!
//! Every file granary writes goes through [`AtomicFile`] (or an appender, append.rs): written
//! under a temporary name of its own beside the final one ([`temp_target`]), created
//! exclusively, fsynced as its [`Durability`] says, renamed over the final name, and the
//! directory fsynced when asked. A final name that is not a regular file is refused. A file
//! dropped unpublished takes its temporary file with it; those a killed process left are
//! removed by the next writer of the directory on the same host. A publish can be split in
//! two ([`AtomicFile::finish`], [`Pending::publish`]).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::buf::{AlignedBuf, ALIGN};

/// What survives a crash of the machine once a file is published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Nothing is fsynced: a copy that can be made again (a cached snapshot, a tier copy).
    Rename,
    /// The file is fsynced before the rename; the caller syncs the directory once for many
    /// files ([`sync_dir`]).
    File,
    /// The file, then its directory after the rename.
    FileAndDir,
}

/// Buffer of the writer in front of the file.
const BUFFER: usize = 1 << 20;

/// Buffer of a file written with `O_DIRECT`: each write of it is one request to the device.
const DIRECT_BUFFER: usize = 4 << 20;

/// The least a write to an `O_DIRECT` file must be to go from the caller's memory.
const IN_PLACE_MIN: usize = 1 << 20;

/// A file being written that appears under its name only when published.
pub struct AtomicFile {
    /// `None` once finished.
    w: Option<Out>,
    /// The temporary file, removed if it is dropped unpublished.
    file: Pending,
}

impl AtomicFile {
    /// Starts `path`, written under a temporary name of its own beside it until it is
    /// published (see the module).
    pub fn create(path: &Path, durability: Durability) -> io::Result<Self> {
        let (file, f) = open_temp(path, durability)?;
        let w = Some(Out::Buffered(BufWriter::with_capacity(BUFFER, f)));
        Ok(AtomicFile { w, file })
    }

    /// As [`AtomicFile::create`], written past the page cache (`O_DIRECT`), the last part
    /// through it: for large files not read back soon (a pack's chunks). Where `O_DIRECT` does
    /// not pay ([`direct_pays`]) or is refused, the file is written through the page cache.
    pub fn direct(path: &Path, durability: Durability) -> io::Result<Self> {
        let (file, f) = open_temp(path, durability)?;
        Self::direct_over(file, f)
    }

    fn direct_over(file: Pending, f: File) -> io::Result<Self> {
        let w = match direct_pays(&f) && set_direct(&f, true)? {
            true => Out::Direct(DirectOut::new(f)),
            false => Out::Buffered(BufWriter::with_capacity(BUFFER, f)),
        };
        Ok(AtomicFile { w: Some(w), file })
    }

    /// The temporary name it is written under, for errors.
    pub fn tmp_path(&self) -> &Path {
        &self.file.tmp
    }

    /// Flushes and (as the durability says) fsyncs the file, without renaming it yet.
    pub fn finish(mut self) -> io::Result<Pending> {
        crash_point("write", &self.file.path);
        let f = match self.w.take().expect("an AtomicFile is finished once") {
            Out::Buffered(w) => w.into_inner().map_err(|e| e.into_error())?,
            Out::Direct(d) => d.finish()?,
        };
        self.file.take().synced(Some(&f))
    }

    /// Flushes, fsyncs, renames over the final name, and fsyncs the directory, as the
    /// durability says.
    pub fn publish(self) -> io::Result<()> {
        self.finish()?.publish()
    }

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
        // Unflushed bytes go with the file (a flush on drop could only fail again, or wait on
        // a store that does not answer); `file` then removes it.
        if let Some(Out::Buffered(w)) = self.w.take() {
            let _ = w.into_parts();
        }
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

/// How an [`AtomicFile`]'s bytes reach its file.
enum Out {
    Buffered(BufWriter<File>),
    Direct(DirectOut),
}

/// A file written with `O_DIRECT`: bytes are gathered in an aligned buffer, each full buffer
/// written at its offset; the last, partial one through the page cache.
struct DirectOut {
    f: File,
    buf: AlignedBuf,
    /// Bytes gathered in `buf`.
    len: usize,
    /// Where `buf` goes in the file.
    at: u64,
    /// False once the file system refused a direct write.
    direct: bool,
}

impl DirectOut {
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

    /// Writes the whole blocks of a large `b` straight from its memory when they lie at a
    /// block boundary there where they go at one in the file (a pack lays a chunk's files out
    /// so); the bytes up to that boundary go through the buffer. Returns the bytes taken,
    /// `None` when `b` goes through the buffer.
    fn write_in_place(&mut self, b: &[u8]) -> io::Result<Option<usize>> {
        let pos = self.at + self.len as u64;
        let gap = (ALIGN - (pos % ALIGN as u64) as usize) % ALIGN;
        let aligned = (b.as_ptr() as usize)
            .wrapping_add(gap)
            .is_multiple_of(ALIGN);
        if !self.direct || !aligned || b.len() < gap + IN_PLACE_MIN {
            return Ok(None);
        }
        // `at` is at a block boundary, so the buffer with the gap filled is whole blocks.
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

/// Whether writing `f` past the page cache pays: not on a file system whose files live in
/// memory (tmpfs, ramfs), where a direct write is a copy plus an attempt to drop it again.
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

/// Writes all of `bytes` at `at` in `f`; where `*direct` and the file system refuses it
/// (`EINVAL`), turns `O_DIRECT` off, clears `*direct` and writes through the page cache.
pub(crate) fn write_all_at(f: &File, bytes: &[u8], at: u64, direct: &mut bool) -> io::Result<()> {
    match f.write_all_at(bytes, at) {
        Err(e) if *direct && e.raw_os_error() == Some(libc::EINVAL) => {
            *direct = set_direct(f, false)?;
            f.write_all_at(bytes, at)
        }
        r => r,
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

/// A file being written under a temporary name, sealed (written whole and synced) into a
/// [`Pending`] rename: [`AtomicFile`], or the appender (append.rs).
pub trait Seal: Write {
    /// Writes what is left, syncs as the durability says, and hands the file to its rename.
    fn seal(self) -> io::Result<Pending>;
    /// The temporary name it is written under, for errors.
    fn tmp_path(&self) -> &Path;
}

impl Seal for AtomicFile {
    fn seal(self) -> io::Result<Pending> {
        self.finish()
    }

    fn tmp_path(&self) -> &Path {
        &self.file.tmp
    }
}

/// A temporary file to be renamed over `path` (once written whole and synced: see
/// [`Seal`]); removed if it is dropped unpublished.
pub struct Pending {
    pub(crate) path: PathBuf,
    tmp: PathBuf,
    durability: Durability,
    published: bool,
}

impl Pending {
    /// This pending file, leaving one that removes nothing when dropped.
    fn take(&mut self) -> Pending {
        let taken = Pending {
            path: std::mem::take(&mut self.path),
            tmp: std::mem::take(&mut self.tmp),
            durability: self.durability,
            published: self.published,
        };
        self.published = true;
        taken
    }

    /// The temporary file written whole (`f`, or opened again), synced as the durability says.
    pub(crate) fn synced(self, f: Option<&File>) -> io::Result<Pending> {
        if self.durability != Durability::Rename {
            crash_point("fsync", &self.path);
            match f {
                Some(f) => f.sync_all()?,
                None => File::open(&self.tmp)?.sync_all()?,
            }
        }
        Ok(self)
    }

    /// The temporary name it is written under.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Renames it over the final name (then fsyncs the directory where the durability says).
    pub fn publish(mut self) -> io::Result<()> {
        crash_point("rename", &self.path);
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

/// Replaces `path` whole with what `write` writes; see [`AtomicFile`].
pub fn write_atomic(
    path: &Path,
    durability: Durability,
    write: impl FnOnce(&mut AtomicFile) -> io::Result<()>,
) -> io::Result<()> {
    let mut f = AtomicFile::create(path, durability)?;
    write(&mut f)?;
    f.publish()
}

/// Refuses to replace `path` when it exists and is not a regular file: a rename over a device
/// (`/dev/null`), a directory or a symbolic link would replace that thing itself.
pub fn check_target(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => {
            let what = match m.file_type() {
                t if t.is_symlink() => "a symbolic link",
                t if t.is_dir() => "a directory",
                _ => "not a regular file",
            };
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is {what}: granary replaces only regular files, whole, and will not \
                     replace it",
                    path.display()
                ),
            ))
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes a report (metrics, a summary) to `path` whole, after refusing what is not a
/// report's place ([`check_report_target`]).
pub fn publish_report(path: &Path, bytes: &[u8]) -> io::Result<()> {
    check_report_target(path)?;
    write_atomic(path, Durability::Rename, |w| w.write_all(bytes))
}

/// The checks of [`publish_report`], to make before the work whose report it is: refuses a
/// target that is not a regular file ([`check_target`]), a dataset's or view's own file, or
/// any file in a dataset's directory.
pub fn check_report_target(path: &Path) -> io::Result<()> {
    check_target(path)?;
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if [".gsnap", ".gchunk", ".gview"]
        .iter()
        .any(|e| name.ends_with(e))
    {
        return refuse(format!(
            "{}: a granary file's name; a report is never written over a dataset's or view's \
             files",
            path.display()
        ));
    }
    let dir = parent_of(path);
    if dir.join(granary_format::SNAPSHOT_FILE).exists() {
        return refuse(format!(
            "{}: inside the dataset {}; write reports elsewhere (a dataset's directory holds \
             only its own files)",
            path.display(),
            dir.display()
        ));
    }
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no such directory", dir.display()),
        ));
    }
    Ok(())
}

/// The name of the file `name` is a temporary file for (`NAME.HOST-PID-SEQ.tmp`, as
/// [`AtomicFile`] names them), or None when `name` is not one.
pub fn temp_target(name: &str) -> Option<&str> {
    let (target, tag) = name.strip_suffix(".tmp")?.rsplit_once('.')?;
    let mut parts = tag.split('-');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    match ok(parts.next()) && ok(parts.next()) && ok(parts.next()) && parts.next().is_none() {
        true if !target.is_empty() => Some(target),
        _ => None,
    }
}

/// This host, as 8 hex digits of its name: only this host's dead processes' files are swept.
fn host_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let name = rustix::system::uname();
        let h = crc32fast::hash(name.nodename().to_bytes());
        format!("{h:08x}")
    })
}

/// Creates the temporary file for `path` (which [`check_target`] accepts) beside it,
/// exclusively, under a name no other writer uses (this host, this process, a counter), after
/// sweeping the directory's dead writers' files.
pub(crate) fn open_temp(path: &Path, durability: Durability) -> io::Result<(Pending, File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    check_target(path)?;
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file name granary can write", path.display()),
        )
    })?;
    sweep_dead_temps(parent_of(path));
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!(
        "{name}.{}-{:x}-{seq:x}.tmp",
        host_tag(),
        std::process::id()
    ));
    let f = File::options().write(true).create_new(true).open(&tmp)?;
    crash_point("create", path);
    let file = Pending {
        path: path.to_path_buf(),
        tmp,
        durability,
        published: false,
    };
    Ok((file, f))
}

/// Removes `dir`'s temporary files made on this host by processes that are gone, once per
/// directory and process (a pack lists its directory once, not once per chunk). Best effort.
fn sweep_dead_temps(dir: &Path) {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SWEPT: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let swept = SWEPT.get_or_init(Default::default);
    if !swept
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(dir.to_path_buf())
    {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let tag = format!(".{}-", host_tag());
    for e in entries.flatten() {
        let file = e.file_name();
        let pid = file.to_str().and_then(|f| {
            let rest = f[temp_target(f)?.len()..].strip_prefix(tag.as_str())?;
            i32::from_str_radix(rest.split('-').next()?, 16).ok()
        });
        // Signal 0 sends nothing: it asks whether the process exists.
        let gone = pid
            .and_then(rustix::process::Pid::from_raw)
            .is_some_and(|p| rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH));
        if gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Fsyncs directory `dir` (`.` for an empty path), so that the renames in it survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let d = Some(dir).filter(|d| !d.as_os_str().is_empty());
    let d = d.unwrap_or(Path::new("."));
    crash_point("fsync-dir", d);
    File::open(d)?.sync_all()
}

/// A place where a command that writes may be killed: before each step of publishing a file
/// and before each rename or removal around whole datasets. The crash harness
/// (`tests/crash.rs`) lists the points with `GRANARY_CRASH_LOG=FILE`, then runs once for each
/// with `GRANARY_CRASH_AT=N`: the process kills itself (SIGKILL) at the N-th point.
pub fn crash_point(what: &str, path: &Path) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static ARMED: OnceLock<(Option<u64>, Option<PathBuf>)> = OnceLock::new();
    static PASSED: AtomicU64 = AtomicU64::new(0);
    let (at, log) = ARMED.get_or_init(|| {
        let at = std::env::var("GRANARY_CRASH_AT")
            .ok()
            .and_then(|v| v.parse().ok());
        let log = std::env::var_os("GRANARY_CRASH_LOG").map(PathBuf::from);
        (at, log)
    });
    if at.is_none() && log.is_none() {
        return;
    }
    let n = PASSED.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(log) = log {
        use std::io::Write as _;
        if let Ok(mut f) = File::options().create(true).append(true).open(log) {
            let _ = writeln!(f, "{n} {what} {}", path.display());
        }
    }
    if *at == Some(n) {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught: nothing runs after it.
        std::process::abort();
    }
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

    /// A file `full` written as `full.tmp`, a link to /dev/full (which takes the open and
    /// refuses every write with ENOSPC): the file open on it, to be written through.
    fn full_device(dir: &Path) -> (PathBuf, PathBuf, File) {
        let tmp = dir.join("full.tmp");
        std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
        let f = File::options().write(true).open(&tmp).unwrap();
        (dir.join("full"), tmp, f)
    }

    /// The temporary file `tmp` of `path`, not published.
    fn pending(path: &Path, tmp: &Path, durability: Durability) -> Pending {
        Pending {
            path: path.to_path_buf(),
            tmp: tmp.to_path_buf(),
            durability,
            published: false,
        }
    }

    /// True when `f` is being written past the page cache.
    fn is_direct(f: &AtomicFile) -> bool {
        matches!(&f.w, Some(Out::Direct(d)) if d.direct)
    }

    /// The temporary files in `dir`.
    fn temps(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| temp_target(n).is_some())
            .collect()
    }

    #[test]
    fn atomic_write_replaces_whole_or_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("index");
        for d in [Durability::Rename, Durability::File, Durability::FileAndDir] {
            write_atomic(&p, d, |w| w.write_all(b"old")).unwrap();
            let failed = write_atomic(&p, d, |w| {
                w.write_all(b"half")?;
                Err(io::Error::other("disk full"))
            });
            assert!(failed.is_err());
            assert_eq!(temps(dir.path()), Vec::<String>::new(), "{d:?}");
            assert_eq!(std::fs::read(&p).unwrap(), b"old");
        }
    }

    #[test]
    fn a_file_whose_last_bytes_cannot_be_written_leaves_nothing() {
        // /dev/full takes the open and refuses every write with ENOSPC: the buffered bytes fail
        // only when finish flushes them.
        let dir = tempfile::tempdir().unwrap();
        let (p, tmp, file) = full_device(dir.path());
        let buffered = Out::Buffered(BufWriter::with_capacity(BUFFER, file));
        let file = pending(&p, &tmp, Durability::Rename);
        let mut f = AtomicFile {
            w: Some(buffered),
            file,
        };
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
        let p = dir.path().join("c");
        let mut src = AlignedBuf::new(12 << 20);
        for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 31 % 253) as u8;
        }
        let mut f = AtomicFile::direct(&p, Durability::File).unwrap();
        let direct = is_direct(&f);
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
        let p = dir.path().join("c");
        let mut f = AtomicFile::direct(&p, Durability::File).unwrap();
        assert!(!is_direct(&f));
        f.write_all(&[5; 10_000]).unwrap();
        f.publish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), vec![5; 10_000]);
    }

    #[test]
    fn a_direct_file_that_fails_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (p, tmp, file) = full_device(dir.path());
        let big = AlignedBuf::new(5 << 20);
        let r = AtomicFile::direct_over(pending(&p, &tmp, Durability::File), file)
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
        let mut f = AtomicFile::create(&p, Durability::FileAndDir).unwrap();
        f.write_all(b"new").unwrap();
        let pending = f.finish().unwrap();
        let tmp = pending.tmp_path().to_path_buf();
        assert!(!p.exists() && tmp.exists());
        assert_eq!(
            temp_target(tmp.file_name().unwrap().to_str().unwrap()),
            Some("snapshot.gsnap")
        );
        drop(pending);
        assert!(
            !p.exists() && !tmp.exists(),
            "an unpublished file is removed"
        );
        let mut f = AtomicFile::create(&p, Durability::FileAndDir).unwrap();
        f.write_all(b"new").unwrap();
        f.finish().unwrap().publish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(temps(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn a_target_that_is_not_a_regular_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        for (p, what) in [(&link, "a symbolic link"), (&sub, "a directory")] {
            let e = write_atomic(p, Durability::Rename, |w| w.write_all(b"x")).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(sub.is_dir());
        let e = write_atomic(Path::new("/dev/null"), Durability::Rename, |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert_eq!(temps(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn temporary_names_are_unique_and_a_dead_writers_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.prom");
        // One left by a process of this host that is gone (pid 0x7ffffffe runs nowhere), one
        // of another file, one by another host's process, and names that are not ours.
        let dead = dir
            .path()
            .join(format!("m.prom.{}-7ffffffe-0.tmp", host_tag()));
        let dead_other = dir
            .path()
            .join(format!("index.{}-7ffffffe-3.tmp", host_tag()));
        let other = dir.path().join("m.prom.00000000-7ffffffe-0.tmp");
        for f in [&dead, &dead_other, &other, &dir.path().join("m.prom.tmp")] {
            std::fs::write(f, b"left").unwrap();
        }
        // The first file this process writes in the directory sweeps it.
        let a = AtomicFile::create(&p, Durability::Rename).unwrap();
        let b = AtomicFile::create(&p, Durability::Rename).unwrap();
        assert_ne!(a.tmp_path(), b.tmp_path());
        assert!(!dead.exists() && !dead_other.exists() && other.exists());
        drop((a, b));
        write_atomic(&p, Durability::Rename, |w| w.write_all(b"x")).unwrap();
        let mut left = temps(dir.path());
        left.sort();
        assert_eq!(left, vec!["m.prom.00000000-7ffffffe-0.tmp".to_string()]);
        for (name, target) in [
            (
                "chunk-00000001.gchunk.0a1b2c3d-1f-0.tmp",
                Some("chunk-00000001.gchunk"),
            ),
            ("snapshot.tmp", None),
            ("x.gchunk.tmp", None),
            ("x.zz-1-2.tmp", None),
            (".1-2-3.tmp", None),
        ] {
            assert_eq!(temp_target(name), target, "{name}");
        }
    }
}
