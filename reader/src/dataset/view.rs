//! A view file opened as a dataset ([`Dataset::open_with`] of a view file): the dataset it
//! names, checked to be the one the view was made of, with the selection attached. Writing
//! views, and what reading one costs, are the `view` module's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use granary_format::ViewFile;
use granary_store::StoreConfig;

use super::Dataset;
use crate::error::{ReadError, Result};

/// A view attached to an open dataset.
#[derive(Debug)]
pub struct View {
    /// The view file.
    pub file: PathBuf,
    /// What was selected, in words.
    pub description: String,
    /// The selected sample ids, rising.
    pub ids: Arc<[u64]>,
}

/// True if `path` is a local file that starts like a view file.
pub(crate) fn is_view_file(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut head))
            .is_ok()
        && ViewFile::is_view(&head)
}

/// Opens the view file at `path`: its dataset (where the file says, a relative path taken from
/// the file's directory) with the selection attached, after checking that the dataset is the
/// one the view was made of (id and content digest).
pub(crate) fn open(path: &Path, cfg: &StoreConfig) -> Result<Dataset> {
    let bytes = std::fs::read(path).map_err(|e| ReadError::io("reading view", path, e))?;
    let v = ViewFile::decode(&bytes).map_err(|e| ReadError::format(path, e))?;
    let target = match granary_store::object::is_url(&v.location) {
        true => PathBuf::from(&v.location),
        false => super::parent_dir(path).join(&v.location),
    };
    let mut ds = Dataset::open_with(&target, cfg)?;
    let snap = ds.snapshot();
    let generation = snap.lineage().generation;
    let same = snap.dataset_id() == v.dataset_id
        && snap.content_digest() == v.snapshot
        && snap.sample_count() == v.samples;
    let live = snap.live_count();
    if !same {
        let hex = granary_format::hex16;
        return Err(ReadError::invalid(format!(
            "{}: a stale view: it was made of dataset {} generation {} (content {}, {} \
             samples), but {} is now dataset {} generation {} (content {}, {} samples), and its \
             ids could name other samples; make the view again (`granary view`)",
            path.display(),
            hex(&v.dataset_id),
            v.generation,
            hex(&v.snapshot),
            v.samples,
            target.display(),
            hex(&snap.dataset_id()),
            generation,
            hex(&snap.content_digest()),
            live
        )));
    }
    ds.view = Some(Arc::new(View {
        file: path.to_path_buf(),
        description: v.description,
        ids: v.ids.into(),
    }));
    Ok(ds)
}
