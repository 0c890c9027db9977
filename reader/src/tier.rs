//! The dataset's samples weighed for the tier's admission (`Weighed`); the tier itself, what
//! reads feed it with and reading from it are the store's.

use std::sync::Arc;

use crate::dataset::Dataset;
use crate::importance::ImportanceScores;
use granary_format::SampleEntry;
use granary_store::tier::Importance;
use granary_store::StoreError;

/// A dataset's samples weighed by a score table, as the tier's admission asks
/// ([`granary_store::tier::chunk_importance`], hot chunks).
pub struct Weighed {
    pub ds: Arc<Dataset>,
    pub scores: Arc<ImportanceScores>,
}

impl Importance for Weighed {
    fn samples(&self) -> u64 {
        self.ds.len()
    }

    fn sample(&self, id: u64) -> granary_store::Result<Option<(SampleEntry, Vec<u8>)>> {
        if self.ds.snapshot().deleted_by(id).is_some() {
            return Ok(None);
        }
        let fail = |e: crate::ReadError| StoreError::Invalid(e.to_string());
        let entry = self.ds.sample(id).map_err(fail)?.entry;
        Ok(Some((entry, self.ds.path(id).map_err(fail)?)))
    }

    fn score(&self, id: u64) -> f64 {
        self.scores.score(id)
    }

    fn reported(&self) -> bool {
        self.scores.reported() > 0
    }

    fn classes(&self) -> Vec<Vec<u8>> {
        let classes = self.ds.classes().unwrap_or_default();
        classes.into_iter().map(<[u8]>::to_vec).collect()
    }
}

/// What [`purge_tier`] removed from a node's tier.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Purged {
    pub tier: std::path::PathBuf,
    pub bytes_freed: u64,
    pub entries_removed: u64,
    pub entries_left: u64,
    pub chunks_with_deleted_samples: u64,
}

/// Removes from the tier of `ds` under `dir` (a tier directory, as readers are given it)
/// every copy and hot chunk that holds records of its deleted samples or of chunks its
/// snapshot does not list: what a reader of it removes as it starts, done at once (`granary
/// cache purge`). An error if `dir` is not a directory (a mistyped path is no clean purge).
pub fn purge_tier(ds: &Dataset, dir: &std::path::Path) -> crate::Result<Purged> {
    if !dir.is_dir() {
        return Err(crate::ReadError::invalid(format!(
            "{}: no such tier directory",
            dir.display()
        )));
    }
    let snap = ds.snapshot();
    let (chunks, dead) = (snap.chunks(), ds.dead_chunks()?);
    let tier = granary_store::LocalTier::open(
        dir,
        snap.dataset_id(),
        u64::MAX,
        granary_store::TierPolicy::Lru,
    )?;
    let before = tier.stats()?;
    tier.forbid(chunks, &dead);
    let freed = tier.retain_current(chunks)?;
    let after = tier.stats()?;
    Ok(Purged {
        tier: after.dir,
        bytes_freed: freed,
        entries_removed: before.entries - after.entries,
        entries_left: after.entries,
        chunks_with_deleted_samples: dead.len() as u64,
    })
}
