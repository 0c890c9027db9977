//! A reader opened for a dataset: what [`ReaderOptions`] name (the local tier, the job's other
//! nodes) opened once, and each epoch's [`EpochSetup`] (the score table is read again every
//! epoch: training keeps reporting into it).

use std::sync::Arc;
use std::time::Duration;

use crate::dataset::Dataset;
use crate::epoch::EpochSetup;
use crate::error::{ReadError, Result};
use crate::importance::ImportanceScores;
use crate::options::ReaderOptions;
use granary_store::{LocalTier, Peers};

impl ReaderOptions {
    /// Checks the options and opens what they name for `ds`: the tier and the peers (whose
    /// ownership every node computes the same, each node's capacity taken to be this one's
    /// quota).
    pub fn open(self, ds: &Arc<Dataset>) -> Result<Reader> {
        let o = self;
        o.check()?;
        let id = ds.snapshot().dataset_id();
        let cache = match (&o.cache_dir, o.cache_size) {
            (Some(dir), Some(quota)) => Some(Arc::new(LocalTier::open(dir, id, quota, o.policy)?)),
            _ => None,
        };
        let tls_ca = o.tls_ca()?;
        let peers = match (&o.peers, o.cache_size) {
            (Some(addrs), Some(quota)) => {
                let nodes = addrs.len() as u32;
                let ownership = crate::ownership(
                    ds,
                    &ds.resolve_window(&o.plan(), o.memory_budget())?,
                    o.ownership_epoch.unwrap_or(0),
                    o.world_size,
                    nodes,
                    &vec![quota; nodes as usize],
                )?;
                Some(Arc::new(Peers::new(
                    id,
                    addrs.clone(),
                    o.node.unwrap_or(o.rank / (o.world_size / nodes)),
                    ownership,
                    Duration::from_secs_f64(o.peer_timeout),
                    o.peer_secret.clone(),
                    tls_ca.as_deref(),
                )?))
            }
            _ => None,
        };
        Ok(Reader {
            ds: ds.clone(),
            options: o,
            cache,
            peers,
        })
    }
}

/// Reader options opened for a dataset: its tier and peers, and each epoch's setup.
pub struct Reader {
    pub(crate) ds: Arc<Dataset>,
    pub(crate) options: ReaderOptions,
    pub(crate) cache: Option<Arc<LocalTier>>,
    peers: Option<Arc<Peers>>,
}

impl Reader {
    /// The job's other nodes, if any.
    pub fn peers(&self) -> Option<&Arc<Peers>> {
        self.peers.as_ref()
    }

    /// A new epoch: every peer is asked again.
    pub fn begin_epoch(&self) {
        if let Some(p) = &self.peers {
            p.begin_epoch();
        }
    }

    /// The score table as it is now, if any.
    fn scores(&self) -> Result<Option<Arc<ImportanceScores>>> {
        let o = &self.options;
        let table = match (&o.scores, &self.cache) {
            (Some(p), _) => Some(
                ImportanceScores::load(p)
                    .map_err(|e| ReadError::invalid(format!("loading the score table: {e}")))?,
            ),
            // The tier's own table, damaged: like a damaged copy, a miss (training's next
            // report() writes it again), not the end of the epoch. Leniency is for it only
            // (training writes it as it reports); a file the user names must fit the dataset.
            (None, Some(t)) if t.scores_path().exists() => ImportanceScores::load(&t.scores_path())
                .map_err(|e| {
                    log::warn!("the tier's score table cannot be used ({e}); read without it")
                })
                .ok()
                .filter(|t| !o.lenient_scores || t.len() == self.ds.len()),
            _ => None,
        };
        Ok(match table {
            Some(t) => Some(Arc::new(t)),
            None if o.importance().is_none() => None,
            // Importance sampling before any loss was reported: every sample at the mean
            // score, so draws are uniform (still favouring what the tier holds) until
            // report()ed losses reach the table.
            None if o.lenient_scores => Some(Arc::new(ImportanceScores::new(self.ds.len(), 0.8))),
            None => {
                return Err(ReadError::invalid(
                    "importance sampling needs scores: a score table file (--scores FILE), or \
                     a tier (--cache-dir) whose score table report() from training has written"
                        .into(),
                ))
            }
        })
    }

    /// This epoch's setup (the score table read again).
    pub fn setup(&self) -> Result<EpochSetup> {
        let o = &self.options;
        Ok(EpochSetup {
            plan: o.plan(),
            sampling: o.importance(),
            stream: crate::stream::StreamOptions {
                tier: self.cache.clone(),
                scores: self.scores()?,
                peers: self.peers.clone(),
                ..o.stream()
            },
        })
    }
}
