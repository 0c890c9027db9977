//! Deleting samples without rewriting a chunk: the next generation of the dataset's snapshot
//! lists them as deleted (feature DELETIONS) and its namespace no longer holds them, so no
//! reader of it delivers, lists or finds them. Sample ids do not move, so resume states,
//! score tables and the other samples' places stay valid; the deleted records' bytes stay in
//! their chunk files until those are compacted.

use std::path::{Path, PathBuf};
use std::time::Instant;

use granary_format::{FileAttrs, Lineage};
use serde::Serialize;

use granary_store::StoreConfig;

use crate::place::Place;
use crate::publish::spooled_builder;
use crate::PackError;

/// What a deletion did.
#[derive(Debug, Clone, Serialize)]
pub struct DeleteSummary {
    pub dataset: PathBuf,
    /// The generation published.
    pub generation: u64,
    /// Samples this deletion removed.
    pub deleted: u64,
    /// Samples asked for that an earlier generation had deleted already.
    pub already_deleted: u64,
    /// Samples the dataset holds now, and deleted samples in all.
    pub samples: u64,
    pub deleted_total: u64,
    /// Chunks holding a sample this deletion removed, and the bytes those records take
    /// there (still in the chunk files until `compact`).
    pub chunks_affected: u64,
    pub dead_bytes: u64,
    /// The new snapshot's size.
    pub snapshot_bytes: u64,
    pub elapsed_s: f64,
}

/// Publishes the next generation of the dataset at `dataset` (a directory, or a writable
/// object-store URL) with the samples `ids` (any order, repeats allowed, each below the
/// sample count) deleted, atomically: killed at any point, the dataset is the old generation
/// or the new one. A directory is locked (an append, upgrade, reindex, compaction or another
/// deletion waits for it); on an object store, a generation published while this one was
/// built is refused (there is no lock: one PUT replaces the snapshot). Refuses a deletion
/// that removes nothing new.
pub fn delete(dataset: &Path, ids: &[u64], cfg: &StoreConfig) -> Result<DeleteSummary, PackError> {
    let t0 = Instant::now();
    let place = Place::of(dataset, cfg)?;
    let _lock = place.lock("delete")?;
    // Read under the lock: what another command published before is what this one extends.
    let snap = place.snapshot()?;
    let n = snap.sample_count();
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if let Some(&bad) = ids.iter().find(|&&i| i >= n) {
        return Err(usage!("sample {bad} of a dataset of {n} samples"));
    }
    let lineage = snap.lineage();
    let generation = lineage.generation + 1;
    if generation > u32::MAX as u64 {
        return Err(usage!(
            "{}: generation {generation} is past the format's deletions",
            dataset.display()
        ));
    }
    let (fresh, already): (Vec<u64>, Vec<u64>) =
        ids.into_iter().partition(|&i| snap.deleted_by(i).is_none());
    if fresh.is_empty() {
        return Err(usage!(
            "nothing to delete in {}: {} of the samples asked for were deleted already",
            dataset.display(),
            already.len()
        ));
    }
    let mut chunks: Vec<u32> = Vec::new();
    let mut dead_bytes = 0u64;
    for &id in &fresh {
        let e = snap.sample(id)?;
        dead_bytes += e.stored_len;
        if chunks.last() != Some(&e.chunk) {
            chunks.push(e.chunk);
        }
    }
    chunks.dedup();
    let mut all: Vec<(u64, u32)> = Vec::with_capacity(snap.deleted().len() + fresh.len());
    all.extend(
        snap.deleted()
            .iter()
            .map(|&i| (i, snap.deleted_by(i).unwrap_or(0) as u32)),
    );
    all.extend(fresh.iter().map(|&i| (i, generation as u32)));
    all.sort_unstable();
    let classes = (0..snap.class_count())
        .map(|c| snap.class_name(c as u32).map(<[u8]>::to_vec))
        .collect::<Result<Vec<_>, _>>()?;
    let mut b = spooled_builder(&place.scratch(), snap.dataset_id(), classes)?;
    b.deletions(all)?;
    b.revisions(snap.revisions().to_vec());
    let (summaries, order) = snap.chunk_summaries_and_order()?;
    for c in summaries {
        b.push_chunk(&c)?;
    }
    // The namespace's order, less the samples deleted now: no sort of every path.
    let gone: std::collections::HashSet<u64> = fresh.iter().copied().collect();
    b.path_order_hint(
        order
            .into_iter()
            .filter(|&i| !gone.contains(&(i as u64)))
            .collect(),
    );
    let dirs = snap.dirs()?.into_iter();
    b.push_dirs(dirs.map(|d| (d.path, d.attrs.unwrap_or(FileAttrs::DIR_DEFAULT))))?;
    b.lineage(Lineage {
        generation,
        parent: snap.content_digest(),
    });
    // An object store has no lock: refuse to publish over a generation published meanwhile.
    if place.snapshot_key()? != (snap.dataset_id(), snap.content_digest()) {
        return Err(usage!(
            "{}: another command published a new generation while this deletion ran; run it \
             again",
            place.show()
        ));
    }
    let len = place.publish_snapshot(b)?;
    Ok(DeleteSummary {
        dataset: dataset.to_path_buf(),
        generation,
        deleted: fresh.len() as u64,
        already_deleted: already.len() as u64,
        samples: snap.live_count() - fresh.len() as u64,
        deleted_total: snap.deleted().len() as u64 + fresh.len() as u64,
        chunks_affected: chunks.len() as u64,
        dead_bytes,
        snapshot_bytes: len,
        elapsed_s: t0.elapsed().as_secs_f64(),
    })
}
