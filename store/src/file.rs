//! Local files as the engine reads them: opened only if regular, read with positional reads
//! (retrying short reads), mapped read-only, and counted as metadata operations.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use std::sync::Arc;

pub use crate::guard::{Mapped, PrivateMapped};

use crate::buf::{AlignedBuf, ALIGN};
use crate::error::{Result, StoreError};
use crate::seam::{BytesFrom, ChunkSource, LocalFile, RangeRead};

/// Opens `path` for reading only if it is a regular file: a FIFO, device or directory with a
/// data file's name (in a dataset or a tier) is an error at once instead of an `open` that
/// blocks forever or a read that fails later. `extra` adds open flags (`O_DIRECT`). The file is
/// opened non-blocking, checked with `fstat`, then switched back to blocking (io_uring would
/// otherwise answer reads on it with `EAGAIN`).
pub fn open_regular(path: &Path, extra: i32) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | extra)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(not_regular());
    }
    let flags = rustix::fs::fcntl_getfl(&f)?;
    rustix::fs::fcntl_setfl(&f, flags - rustix::fs::OFlags::NONBLOCK)?;
    Ok(f)
}

/// The error for a FIFO, device or directory where a regular file should be.
fn not_regular() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")
}

/// A local file opened for the engine (the local [`crate::ChunkSource`]), with whether reads
/// on it must be aligned.
#[derive(Debug)]
pub struct IoFile {
    pub file: File,
    pub path: PathBuf,
    pub direct: bool,
    /// The file mapped, when it is resident in the page cache: requests on it complete at once
    /// as slices of the map (no read, no copy, no buffer); perhaps a map kept from an earlier
    /// window ([`crate::mapcache`]).
    pub map: Option<Arc<Mapped>>,
    /// Its length when opened.
    pub len: u64,
    /// Where its bytes come from (the dataset's storage, or a copy in the local tier).
    pub from: BytesFrom,
}

impl IoFile {
    /// A file read with reads (`direct`: opened with `O_DIRECT`), not through a map; its
    /// length comes from one `fstat`.
    pub fn unmapped(file: File, path: &Path, direct: bool) -> Result<Self> {
        let md = file.metadata();
        Ok(IoFile {
            len: md.map_err(|e| StoreError::io("inspecting", path, e))?.len(),
            file,
            path: path.to_path_buf(),
            direct,
            map: None,
            from: BytesFrom::Origin,
        })
    }

    /// Marks where this file's bytes come from (a copy in the local tier, say).
    pub fn serving(mut self, from: BytesFrom) -> Self {
        self.from = from;
        self
    }

    /// Reads `r` from a file opened with `O_DIRECT`: through an aligned bounce buffer, since
    /// the caller's buffer, offset and length need not be aligned.
    fn read_direct(&self, r: &mut RangeRead<'_>) -> Result<()> {
        let start = r.offset & !(ALIGN as u64 - 1);
        let end = (r.offset + r.buf.len() as u64).next_multiple_of(ALIGN as u64);
        let skip = (r.offset - start) as usize;
        let mut bounce = AlignedBuf::new((end - start) as usize);
        let mut whole = RangeRead {
            offset: start,
            buf: bounce.as_mut_slice(),
            need: skip + r.need,
        };
        pread_at_least(&self.file, &self.path, &mut whole)?;
        let have = self.len.saturating_sub(r.offset).min(r.buf.len() as u64) as usize;
        r.buf[..have].copy_from_slice(&bounce.as_slice()[skip..skip + have]);
        Ok(())
    }
}

impl ChunkSource for IoFile {
    fn location(&self) -> &Path {
        &self.path
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()> {
        for r in reads.iter_mut() {
            match &self.map {
                Some(m) => copy_range(m, &self.path, r)?,
                None if self.direct => self.read_direct(r)?,
                None => pread_at_least(&self.file, &self.path, r)?,
            }
        }
        Ok(())
    }

    fn bytes_from(&self) -> BytesFrom {
        self.from
    }

    fn local(&self) -> Option<&dyn LocalFile> {
        Some(self)
    }
}

impl LocalFile for IoFile {
    fn file(&self) -> &File {
        &self.file
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn direct(&self) -> bool {
        self.direct
    }

    fn map(&self) -> Option<&Mapped> {
        self.map.as_deref()
    }

    /// True when this file's map no longer shows the file as it was mapped: a read past the
    /// file's new end was caught by the SIGBUS guard ([`Mapped::is_cut`]), or the file is now
    /// shorter than the map (the rest of its last page reads as zeros without a fault). One
    /// `fstat`; false without a map.
    fn map_cut(&self) -> bool {
        self.map.as_ref().is_some_and(|m| {
            m.is_cut()
                || self
                    .file
                    .metadata()
                    .map_or(true, |md| md.len() < m.len() as u64)
        })
    }
}

/// Reads `r` with positional reads until its `need` bytes (and as many more as the file has,
/// up to its buffer) have arrived; retries `EINTR`/`EAGAIN` and short reads.
pub fn pread_at_least(file: &std::fs::File, path: &Path, r: &mut RangeRead<'_>) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < r.buf.len() {
        match file.read_at(&mut r.buf[done..], r.offset + done as u64) {
            Ok(0) if done >= r.need => return Ok(()),
            Ok(0) => return Err(eof_at(path, r.offset + done as u64)),
            Ok(n) => {
                done += n;
                if done >= r.need {
                    return Ok(()); // the rest, if any, lies past the end of the file
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) => {}
            Err(e) => return Err(read_error(path, r.offset + done as u64, e)),
        }
    }
    Ok(())
}

/// The error for a read of `path` at `offset` that failed with `e`.
pub fn read_error(path: &Path, offset: u64, e: std::io::Error) -> StoreError {
    let e = std::io::Error::new(e.kind(), format!("at offset {offset}: {e}"));
    StoreError::io("reading", path, e)
}

/// Serves `r` from `bytes`, a whole file held in memory (a map, a chunk fetched whole) at
/// `path`: its `need` bytes must be there, and as many more as `bytes` has, up to its buffer.
pub fn copy_range(bytes: &[u8], path: &Path, r: &mut RangeRead<'_>) -> Result<()> {
    let have = bytes.len().saturating_sub(r.offset as usize);
    if have < r.need {
        return Err(eof_at(path, r.offset + have as u64));
    }
    let n = have.min(r.buf.len());
    let at = r.offset as usize;
    r.buf[..n].copy_from_slice(&bytes[at..at + n]);
    Ok(())
}

/// The error for a source that ends at `offset`, before bytes a read needs.
pub fn eof_at(path: &Path, offset: u64) -> StoreError {
    StoreError::io(
        "reading",
        path,
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("file ends before offset {offset}"),
        ),
    )
}

/// Maps `file` read-only, guarded against the file being cut short ([`Mapped`]).
pub fn map_file(file: &File, path: &Path) -> Result<Mapped> {
    // SAFETY: granary dataset files, chunk copies and hot chunks of the tier are immutable
    // once published (nothing updates a file in place; writers create new files and rename
    // them, and removing a file leaves existing maps intact). The map is read-only and private
    // to this process. If another process truncates the file anyway, accesses past the new end
    // fault: the map is registered with the SIGBUS guard before it is returned, which turns
    // such a fault into zeros and a flag (`Mapped::is_cut`) that the checks above it see.
    let map = unsafe { Mmap::map(file) }.map_err(|e| StoreError::io("memory-mapping", path, e))?;
    Mapped::new(map).ok_or_else(|| no_guard(path))
}

/// Maps `file` privately (copy on write), guarded against the file being cut short
/// ([`PrivateMapped`]): another process's view of bytes this one checked, that it may write
/// into without changing the file.
pub fn map_file_private(file: &File, path: &Path) -> Result<PrivateMapped> {
    // SAFETY: as for `map_file`: the files mapped are immutable once published, and a
    // truncation under the map is caught by the SIGBUS guard it is registered with before it
    // is returned. The map is private: writes through it go to this process's copies of the
    // pages, never to the file or to other processes' maps.
    let map = unsafe { memmap2::MmapOptions::new().map_copy(file) }
        .map_err(|e| StoreError::io("memory-mapping", path, e))?;
    PrivateMapped::new(map).ok_or_else(|| no_guard(path))
}

/// The error for a map the SIGBUS guard has no room for.
fn no_guard(path: &Path) -> StoreError {
    StoreError::io(
        "memory-mapping",
        path,
        std::io::Error::other("no SIGBUS guard for another map (8192 in use)"),
    )
}

/// Whole chunk files larger than this are mapped rather than read into memory.
pub const READ_WHOLE_LIMIT: u64 = 512 << 20;

/// The bytes of a whole chunk file, in memory or mapped.
pub enum ChunkBytes {
    /// Read into memory.
    Owned(Vec<u8>),
    /// Memory-mapped (local chunks larger than [`READ_WHOLE_LIMIT`]).
    Mapped(Mapped),
}

impl std::ops::Deref for ChunkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ChunkBytes::Owned(v) => v,
            ChunkBytes::Mapped(m) => m,
        }
    }
}

/// The whole of `src` (exactly the length it had when opened, or an error naming it): read
/// front to back, or mapped when it is a local file larger than [`READ_WHOLE_LIMIT`].
pub fn read_whole(src: &dyn ChunkSource) -> Result<ChunkBytes> {
    let len = src.len();
    match src.local() {
        Some(local) if len > READ_WHOLE_LIMIT => {
            let map = map_file(local.file(), local.path())?;
            // The map has the file's size now, not when it was opened.
            if map.len() as u64 != len {
                return Err(StoreError::damaged(
                    src.location(),
                    "changed size while being read",
                ));
            }
            Ok(ChunkBytes::Mapped(map))
        }
        local => {
            // Read whole, front to back, whatever the handle's record-read advice.
            if let Some(l) = local.filter(|l| !l.direct()) {
                crate::advise(l.file(), crate::ReadPattern::Sequential);
            }
            let mut v = vec![0u8; len as usize];
            src.read_ranges(&mut [RangeRead {
                offset: 0,
                buf: &mut v,
                need: len as usize,
            }])?;
            Ok(ChunkBytes::Owned(v))
        }
    }
}

/// [`open_regular`] for writing, creating the file if needed (a lock file of the tier): a FIFO
/// or a directory put under its name is an error at once, never waited on.
pub fn open_regular_for_writing(path: &Path) -> std::io::Result<File> {
    // A FIFO without a reader would answer the open below with ENXIO: name it for what it is.
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(not_regular());
    }
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(f)
}

/// The bytes of the file at `path`, a regular file (one of the tier's, a score table): a
/// FIFO or a directory put under its name is an error, never waited on.
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut open_regular(path, 0)?, &mut b)?;
    Ok(b)
}
