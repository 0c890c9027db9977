//! Views: a subset of a dataset's samples chosen once (`granary view`, [`create_view`]) and
//! saved as a small checksummed file ([`granary_format::ViewFile`]) pinned to the dataset's id
//! and generation. Opening the file opens the dataset with the selection attached: epoch plans
//! are computed over the selected samples alone (chunk-wise as usual: each chunk holds its
//! selected samples), so streams, ranks, workers and resume work on a view as on a dataset,
//! and nothing of the dataset is rewritten.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use granary_format::ViewFile;
use granary_store::StoreConfig;

use crate::{Dataset, ReadError, Result};

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
/// one the view was made of (id, generation, sample count).
pub(crate) fn open(path: &Path, cfg: &StoreConfig) -> Result<Dataset> {
    let bytes = std::fs::read(path).map_err(|e| ReadError::io("reading view", path, e))?;
    let v = ViewFile::decode(&bytes).map_err(|e| ReadError::format(path, e))?;
    let target = match granary_store::object::is_url(&v.location) {
        true => PathBuf::from(&v.location),
        false => {
            let base = path.parent().unwrap_or(Path::new("."));
            base.join(&v.location)
        }
    };
    let ds = Dataset::open_with(&target, cfg)?;
    let snap = ds.snapshot();
    let generation = snap.lineage().generation;
    let same = snap.dataset_id() == v.dataset_id
        && generation == v.generation
        && snap.sample_count() == v.samples;
    if !same {
        return Err(ReadError::invalid(format!(
            "{}: the view was made of dataset {} generation {} ({} samples), but {} is dataset \
             {} generation {} ({} samples): its ids would name other samples; make the view \
             again (`granary view`)",
            path.display(),
            granary_format::DatasetId(v.dataset_id),
            v.generation,
            v.samples,
            target.display(),
            granary_format::DatasetId(snap.dataset_id()),
            generation,
            snap.sample_count()
        )));
    }
    Ok(ds.with_view(View {
        file: path.to_path_buf(),
        description: v.description,
        ids: v.ids.into(),
    }))
}
