//! Batches handed from a DataLoader worker to the training process without a copy: when every
//! sample of a batch is a slice of a local chunk file's map (the chunks the reader keeps
//! mapped because they are resident), the worker sends where each sample lies — file, offset,
//! length — instead of its bytes, and the training process maps the same files itself
//! ([`map_file`]) and hands out views of them. The worker has checked every sample's CRC-32
//! over those very pages of the page cache; nothing is copied on either side.
//!
//! The training process's maps are private (copy on write), so a loop that writes into a
//! sample's tensor changes its own copy of the page, never the file or another process's view;
//! and guarded like every map granary makes, so a file cut short under them is an error
//! ([`FileMap::check`]), not a SIGBUS. A file is identified by path, device and inode: a file
//! replaced since the worker read it is an error naming it, never another file's bytes.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use granary::{ReadError, Sample, StoreError};
use granary_store::file::{map_file_private, PrivateMapped};
use numpy::ndarray::ArrayViewMut1;
use numpy::PyArray1;
use pyo3::prelude::*;

use crate::err;

/// Where a batch's samples lie: the distinct files (path, device, inode), then per sample the
/// index of its file and its offset there.
pub(crate) type Refs = (Vec<(PathBuf, u64, u64)>, Vec<u32>, Vec<i64>);

/// The samples' places in mapped local files, when every one of them is such a slice (else
/// `None`: the batch is copied). One `fstat` per distinct file.
pub(crate) fn refs_of(samples: &[Sample]) -> PyResult<Option<Refs>> {
    let mut files: Vec<(PathBuf, u64, u64)> = Vec::new();
    // The files' identities, in the order of `files`.
    let mut seen: Vec<*const std::fs::File> = Vec::new();
    let mut which = Vec::with_capacity(samples.len());
    let mut starts = Vec::with_capacity(samples.len());
    for s in samples {
        let Some((path, file, at)) = s.mapped_file() else {
            return Ok(None);
        };
        let key = file as *const std::fs::File;
        let k = match seen.iter().position(|&f| f == key) {
            Some(k) => k,
            None => {
                let md = file
                    .metadata()
                    .map_err(|e| err(ReadError::Store(StoreError::io("looking at", path, e))))?;
                files.push((path.to_path_buf(), md.dev(), md.ino()));
                seen.push(key);
                seen.len() - 1
            }
        };
        which.push(k as u32);
        starts.push(at as i64);
    }
    Ok(Some((files, which, starts)))
}

/// A chunk file mapped into this process privately, for the views a worker's batch refers
/// to; the numpy array [`map_file`] returns keeps it alive.
#[pyclass(module = "granary._native")]
pub(crate) struct FileMap {
    map: PrivateMapped,
    path: PathBuf,
}

#[pymethods]
impl FileMap {
    /// The file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Raises DamagedError if the file was cut short (truncated by another process) since it
    /// was mapped: bytes read through the map may have been zeros instead of the file's.
    fn check(&self) -> PyResult<()> {
        if self.map.is_cut() {
            return Err(err(ReadError::Store(StoreError::damaged(
                &self.path,
                "the file was cut short (truncated by another process) while the training \
                 process read samples from its map: their bytes may have read as zeros",
            ))));
        }
        Ok(())
    }
}

/// Maps the chunk file at `path` privately and returns (a writable uint8 array of the whole
/// file, its [`FileMap`]), after checking that it is the file a worker read: the same device
/// and inode (`dev`, `ino`), else an error naming it.
#[pyfunction]
pub(crate) fn map_file(
    py: Python<'_>,
    path: PathBuf,
    dev: u64,
    ino: u64,
) -> PyResult<(Bound<'_, PyArray1<u8>>, Bound<'_, FileMap>)> {
    let map = py
        .detach(|| open_same(&path, dev, ino))
        .map_err(|e| err(ReadError::Store(e)))?;
    let owner = Bound::new(py, FileMap { map, path })?;
    let array = borrow_map(&owner);
    Ok((array, owner))
}

fn open_same(path: &Path, dev: u64, ino: u64) -> Result<PrivateMapped, StoreError> {
    let file = std::fs::File::open(path).map_err(|e| StoreError::io("opening", path, e))?;
    let md = file
        .metadata()
        .map_err(|e| StoreError::io("looking at", path, e))?;
    if (md.dev(), md.ino()) != (dev, ino) {
        return Err(StoreError::damaged(
            path,
            "this is not the file a DataLoader worker read the batch from: it was replaced \
             (or removed and written again) since; the dataset changed under the job",
        ));
    }
    map_file_private(&file, path)
}

/// A numpy array of the whole map, whose base is `owner` (so the map outlives it).
#[allow(unsafe_code)]
fn borrow_map<'py>(owner: &Bound<'py, FileMap>) -> Bound<'py, PyArray1<u8>> {
    let mut me = owner.borrow_mut();
    let view = ArrayViewMut1::from(me.map.bytes_mut());
    // SAFETY: the array's memory is the map held by `owner`, which numpy keeps alive as the
    // array's base object for as long as the array (and every view of it) lives; the map is
    // never moved, remapped or unmapped while `owner` lives (FileMap gives no access that
    // could). The map is private copy-on-write, so writes through the array change this
    // process's copies of its pages only; reads past a truncation are caught by the SIGBUS
    // guard it is registered with (see `FileMap::check`).
    unsafe { PyArray1::borrow_from_array(&view, owner.clone().into_any()) }
}
