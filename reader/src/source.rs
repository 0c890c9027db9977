//! The storage seam: where chunk bytes come from.
//!
//! A [`ChunkStore`] opens a dataset's chunk files; each open file is a [`ChunkSource`] with a
//! length and batched ranged reads. Plans, streams, the tier and random access see only these
//! two traits, so a store that is not a local directory (an object store, a peer node's tier)
//! plugs in without touching them. Local files are the first implementation ([`LocalDir`],
//! whose sources are [`IoFile`]s); the I/O engine recognises them ([`ChunkSource::local`]) and
//! reads them its own way (io_uring or pread, `O_DIRECT` or buffered, or as slices of a map of
//! the page cache). Every other source is read through [`ChunkSource::read_ranges`], one call
//! per source and batch, so it can issue the ranges concurrently.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{ReadError, Result};
use crate::io::IoFile;
use crate::residency::Opener;

/// One range to read: `buf` receives the bytes at `offset`; the first `need` bytes must exist
/// (the rest of `buf` may lie past the end of the source and is then left as it is).
pub struct RangeRead<'a> {
    pub offset: u64,
    pub buf: &'a mut [u8],
    pub need: usize,
}

/// An open chunk file.
pub trait ChunkSource: Send + Sync + Debug {
    /// Where the bytes are (a path, or a URL written as one), for errors.
    fn location(&self) -> &Path;

    /// Length in bytes, as seen when the source was opened.
    fn len(&self) -> u64;

    /// True for an empty source.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads every range (in any order, concurrently if the store can). Errors name the
    /// location and offset; a source that ends before a range's `need` bytes is an
    /// `UnexpectedEof` error, never a short buffer.
    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()>;

    /// The local file behind this source, which the engine reads itself (io_uring, pread or a
    /// map). `None` for sources that only [`ChunkSource::read_ranges`] can read.
    fn local(&self) -> Option<&IoFile> {
        None
    }

    /// For a chunk asked of the node that owns it: whether its last read came from that node
    /// (`Some(true)`) or from origin storage (`Some(false)`). `None` for every other source.
    fn served_by_peer(&self) -> Option<bool> {
        None
    }
}

/// A shared open chunk file.
pub type Source = Arc<dyn ChunkSource>;

/// Where a dataset's chunk files are.
pub trait ChunkStore: Send + Sync + Debug {
    /// Location of chunk `id`'s file (a path, or a URL written as one), for errors and for
    /// telling a tier copy from the original.
    fn chunk_location(&self, id: u32) -> PathBuf;

    /// Opens chunk `id`'s file. A local store lets `opener` decide how it is read (mapped where
    /// resident, `O_DIRECT` or buffered otherwise); other stores may ignore it.
    fn open_chunk(&self, id: u32, opener: &mut Opener) -> Result<Source>;

    /// Every file (or object) where the chunks are, as name and location, so that `verify`
    /// can report what is not part of the dataset. Stores that cannot list return none.
    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        Ok(Vec::new())
    }
}

/// Chunk files in a local directory (or any mounted file system).
#[derive(Debug, Clone)]
pub struct LocalDir {
    dir: PathBuf,
}

impl LocalDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        LocalDir { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl ChunkStore for LocalDir {
    fn chunk_location(&self, id: u32) -> PathBuf {
        self.dir.join(granary_format::chunk_file_name(id))
    }

    fn open_chunk(&self, id: u32, opener: &mut Opener) -> Result<Source> {
        Ok(Arc::new(opener.open(&self.chunk_location(id), Some(id))?))
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        let rd =
            std::fs::read_dir(&self.dir).map_err(|e| ReadError::io("listing", &self.dir, e))?;
        Ok(rd
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect())
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
                Some(m) => {
                    let have = m.len().saturating_sub(r.offset as usize);
                    if have < r.need {
                        return Err(eof_at(&self.path, r.offset + have as u64));
                    }
                    let n = have.min(r.buf.len());
                    r.buf[..n].copy_from_slice(&m[r.offset as usize..r.offset as usize + n]);
                }
                None => pread_at_least(&self.file, &self.path, r)?,
            }
        }
        Ok(())
    }

    fn local(&self) -> Option<&IoFile> {
        Some(self)
    }
}

/// Reads `r` with positional reads until its `need` bytes (and as many more as the file has,
/// up to its buffer) have arrived; retries `EINTR`/`EAGAIN` and short reads.
pub(crate) fn pread_at_least(
    file: &std::fs::File,
    path: &Path,
    r: &mut RangeRead<'_>,
) -> Result<()> {
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
            Err(e) => {
                return Err(ReadError::io(
                    "reading",
                    path,
                    std::io::Error::new(
                        e.kind(),
                        format!("at offset {}: {e}", r.offset + done as u64),
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// The error for a source that ends at `offset`, before bytes a read needs.
pub(crate) fn eof_at(path: &Path, offset: u64) -> ReadError {
    ReadError::io(
        "reading",
        path,
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("file ends before offset {offset}"),
        ),
    )
}
