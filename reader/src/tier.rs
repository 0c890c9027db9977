//! The local tier as a stream reports it (`TierHits`, from its stack's meters), and the
//! dataset's samples
//! weighed for the tier's admission (`Weighed`). The tier's storage itself (quota, policies,
//! files, locking), admission into it (`granary_store::tier::Admission`) and its hot chunks
//! (`granary_store::tier::HotChunks`) are the store's; reading from it is the
//! [`crate::TierStore`] layer of the stream's stack.

use std::sync::Arc;

use crate::dataset::Dataset;
use crate::importance::ImportanceScores;
use granary_format::SampleEntry;
use granary_store::tier::Importance;
use granary_store::{StoreError, StoreStack};

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

    fn sample(&self, id: u64) -> granary_store::Result<(SampleEntry, Vec<u8>)> {
        let fail = |e: crate::ReadError| StoreError::Invalid(e.to_string());
        let entry = self.ds.sample(id).map_err(fail)?.entry;
        Ok((entry, self.ds.path(id).map_err(fail)?))
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

/// Hits and misses of the local tier during one stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierHits {
    /// Served by this node's tier. (JSON keeps the names scripts read: `samples_from_cache`,
    /// `samples_from_source`, `bytes_from_cache`, `bytes_from_source`.)
    #[serde(rename = "samples_from_cache")]
    pub samples_from_tier: u64,
    /// Read from origin storage.
    #[serde(rename = "samples_from_source")]
    pub samples_from_origin: u64,
    #[serde(rename = "bytes_from_cache")]
    pub bytes_from_tier: u64,
    #[serde(rename = "bytes_from_source")]
    pub bytes_from_origin: u64,
    /// Served by other nodes' tiers (shared tiers, [`crate::Peers`]); not counted above.
    pub samples_from_peers: u64,
    pub bytes_from_peers: u64,
    /// Chunks or hot chunks the tier failed to store (a full or failing disk: the first
    /// failure is also printed as a warning; reads go on from the source).
    pub admissions_failed: u64,
    /// Offers the tier did not get because admission was busy and the queue of waiting
    /// offers was full, while the tier was full too (it would have had to evict): the least
    /// valuable per byte go. An offer the tier has room for waits instead (the stream slows
    /// to the tier's write speed), so a tier that can hold the dataset gets all of it.
    #[serde(default)]
    pub admissions_skipped: u64,
}

impl std::ops::AddAssign for TierHits {
    fn add_assign(&mut self, o: TierHits) {
        self.samples_from_tier += o.samples_from_tier;
        self.samples_from_origin += o.samples_from_origin;
        self.bytes_from_tier += o.bytes_from_tier;
        self.bytes_from_origin += o.bytes_from_origin;
        self.samples_from_peers += o.samples_from_peers;
        self.bytes_from_peers += o.bytes_from_peers;
        self.admissions_failed += o.admissions_failed;
        self.admissions_skipped += o.admissions_skipped;
    }
}

impl TierHits {
    /// A stream's counts so far, from the meters of its `stack`: what each layer served, and
    /// what the tier's admission failed to store or dropped.
    pub(crate) fn of(stack: &StoreStack) -> TierHits {
        let (tier, peers, origin) = (
            stack.layer("tier"),
            stack.layer("peers"),
            stack.layer("origin"),
        );
        TierHits {
            samples_from_tier: tier.served_samples,
            samples_from_origin: origin.served_samples,
            bytes_from_tier: tier.served_bytes,
            bytes_from_origin: origin.served_bytes,
            samples_from_peers: peers.served_samples,
            bytes_from_peers: peers.served_bytes,
            admissions_failed: tier.admissions_failed,
            admissions_skipped: tier.admissions_skipped,
        }
    }
}
