//! Views: a subset of a dataset's samples chosen once (`granary view`, [`write_view`]) and
//! saved as a small checksummed file ([`granary_format::ViewFile`]) pinned to the dataset's id
//! and its snapshot's content digest. Opening the file opens the dataset with the selection
//! attached: epochs are planned over the selected samples alone (each chunk holds its selected
//! samples), so streams, ranks, workers and resume work on a view as on a dataset, and nothing
//! of the dataset is rewritten.

use std::path::{Path, PathBuf};

use granary_format::ViewFile;

use crate::dataset::Dataset;
use crate::error::{ReadError, Result};

/// Writes a view of `ds` (opened from `dataset`, as the user named it) holding `ids` (any
/// order; repeats dropped; each below the sample count) to `output`, atomically; returns the
/// view as written. The view names its dataset by URL, or by a path relative to the view
/// file's directory (so the two can move together; absolute when they share nothing but the
/// root).
pub fn write_view(
    dataset: &Path,
    ds: &Dataset,
    output: &Path,
    mut ids: Vec<u64>,
    description: String,
) -> Result<ViewFile> {
    let shown = dataset.display();
    if ds.view().is_some() {
        let m = format!("{shown} is a view; make views of the dataset itself");
        return Err(ReadError::invalid(m));
    }
    ids.sort_unstable();
    ids.dedup();
    let snap = ds.snapshot();
    let n = snap.sample_count();
    if let Some(&bad) = ids.iter().find(|&&i| i >= n) {
        let m = format!("sample {bad} of a dataset of {n} samples");
        return Err(ReadError::invalid(m));
    }
    if ids.is_empty() {
        let m = format!("{description}: selects no sample of {shown}");
        return Err(ReadError::invalid(m));
    }
    let view = ViewFile {
        dataset_id: snap.dataset_id(),
        snapshot: snap.content_digest(),
        generation: snap.lineage().generation,
        samples: snap.sample_count(),
        location: location(dataset, output)?,
        description,
        ids,
    };
    let bytes = view.encode();
    let durable = granary_store::write::Durability::FileAndDir;
    granary_store::write::write_atomic(output, durable, |f| std::io::Write::write_all(f, &bytes))
        .map_err(|e| ReadError::io("writing view", output, e))?;
    Ok(view)
}

/// Where a view file at `output` says its dataset `dataset` is.
fn location(dataset: &Path, output: &Path) -> Result<String> {
    let s = dataset.to_string_lossy();
    if granary_store::object::is_url(&s) {
        return Ok(s.into_owned());
    }
    let canon = |p: &Path| std::fs::canonicalize(p).map_err(|e| ReadError::io("resolving", p, e));
    let ds = canon(dataset)?;
    let dir = canon(crate::dataset::parent_dir(output))?;
    let common = ds
        .components()
        .zip(dir.components())
        .take_while(|(a, b)| a == b)
        .count();
    let up = dir.components().count() - common;
    let mut rel: PathBuf = std::iter::repeat_n("..", up).collect();
    rel.extend(ds.components().skip(common));
    let text = match (common > 1, rel.as_os_str().is_empty()) {
        (true, true) => PathBuf::from("."),
        (true, false) => rel,
        (false, _) => ds,
    };
    text.into_os_string().into_string().map_err(|p| {
        ReadError::invalid(format!(
            "{}: not UTF-8, cannot be written in a view file",
            p.to_string_lossy()
        ))
    })
}

/// What one epoch of a view reads from its dataset's chunks (chunk-wise or sequential, without
/// a tier), as the reader chooses per chunk: ranges around the selected records, or the chunk
/// up to its last selected record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ViewReads {
    /// Bytes of the selected samples as stored.
    pub delivered: u64,
    /// Bytes read for them.
    pub read: u64,
    pub chunks_whole: u64,
    pub chunks_in_ranges: u64,
}

/// What an epoch of `ds`'s view (or of what a deletion left) reads (reads every selected
/// sample's record entry), with `range_gap` as the stream's. `None` without a selection.
pub fn view_reads(ds: &Dataset, range_gap: u64) -> Result<Option<ViewReads>> {
    let Some(ids) = ds.selection() else {
        return Ok(None);
    };
    let shape = ds.shape()?;
    let mut r = ViewReads::default();
    for c in 0..shape.chunks() {
        let pos = shape.chunk_samples(c);
        if pos.is_empty() {
            continue;
        }
        let ids = &ids[pos.start as usize..pos.end as usize];
        ds.prefetch_samples(ids)?;
        let mut want = Vec::with_capacity(ids.len());
        for &id in ids {
            let e = ds.sample(id)?.entry;
            want.push((e.offset, e.offset + e.stored_len));
        }
        let needed: u64 = want.iter().map(|(a, b)| b - a).sum();
        r.delivered += needed;
        let ce = ds.chunk(c)?;
        if crate::window::sparse(needed, &ce) {
            r.chunks_in_ranges += 1;
            let ranges = crate::window::coalesce(want, range_gap, true);
            r.read += ranges.iter().map(|(a, b)| b - a).sum::<u64>();
        } else {
            r.chunks_whole += 1;
            r.read += want.iter().map(|w| w.1).max().unwrap_or(0);
        }
    }
    Ok(Some(r))
}

/// Whether most of the chunk files holding `ds`'s view are wholly in the page cache (read
/// whole by an epoch of the dataset, say): then maps of them serve the view's records
/// fastest. From `mincore` on up to [`PROBES`] of its chunks (none read, no readahead);
/// false for chunks that are not local files.
pub(crate) fn chunks_mostly_resident(ds: &Dataset) -> bool {
    let Some(ids) = ds.selection() else {
        return false;
    };
    let (n, probes) = (ids.len(), PROBES.min(ids.len()));
    let probed = (0..probes).map(|k| Ok(ds.sample(ids[k * n / probes])?.entry.chunk));
    let Ok(mut chunks) = probed.collect::<Result<Vec<u32>>>() else {
        return false;
    };
    chunks.dedup();
    let resident = chunks
        .iter()
        .filter(|&&c| {
            std::fs::File::open(ds.chunk_path(c)).is_ok_and(|f| {
                let len = f.metadata().map_or(0, |m| m.len());
                granary_store::resident_share(&f, len) >= 0.9
            })
        })
        .count();
    2 * resident > chunks.len()
}

/// Chunks [`chunks_mostly_resident`] looks at, at most.
const PROBES: usize = 16;
