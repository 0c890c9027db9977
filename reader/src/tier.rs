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
