//! One reader configuration, built and checked here and used by every front end (the CLI's
//! `granary read`, Python's `Stream`, the benchmarks): the plan, the memory budget and I/O,
//! the local tier, the score table, the sampling and the job's other nodes. A front end only
//! converts its arguments into a [`ReaderConfig`]; [`ReaderConfig::open`] opens what it
//! names (the tier, the peers) for a dataset, and [`Reader::setup`] gives each epoch's
//! [`EpochSetup`] (the score table is read again every epoch: training keeps reporting into
//! it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::dataset::Dataset;
use crate::epoch::{EpochSetup, ImportanceSampling};
use crate::error::{ReadError, Result};
use crate::importance::ImportanceScores;
use crate::io::IoKind;
use crate::plan::PlanOptions;
use crate::stream::StreamOptions;
use granary_store::{IoMode, LocalTier, Peers, TierPolicy};

/// Which samples an epoch reads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum SamplingMode {
    /// Every sample once.
    #[default]
    Uniform,
    /// Importance sampling (needs scores).
    Importance(ImportanceSampling),
}

/// Where the importance score table comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ScoreSource {
    /// The node's shared table next to the tier (fed by `report()` from training), when the
    /// tier has one.
    #[default]
    Tier,
    /// A table written by `ImportanceScores::save`.
    File(PathBuf),
}

/// The local tier.
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    /// Its directory (on the node's SSD), shared by every reader of the dataset on the node.
    pub dir: PathBuf,
    /// Its byte quota.
    pub quota: u64,
    /// What it keeps when full.
    pub policy: TierPolicy,
}

/// Tiers shared by the nodes of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerConfig {
    /// Every node's `granary serve` address (`host:port`), in node order, this node's included.
    pub addrs: Vec<String>,
    /// This node's number (default: rank / ranks per node, ranks numbered node by node).
    pub node: Option<u32>,
    /// How long a peer may take to answer before it is marked down for the epoch.
    pub timeout: Duration,
    /// The epoch whose plan decides which node keeps which chunk (the same on every node).
    pub ownership_epoch: u64,
    /// The job's secret, which signs every request to a peer (`granary serve` refuses
    /// requests without it unless started with `--insecure`).
    pub secret: Option<granary_store::auth::Secret>,
    /// Certificates (PEM) the peers' TLS certificates chain to: peers are then reached over
    /// TLS (`granary serve --tls-cert`); `None`: plain HTTP.
    pub tls_ca: Option<Vec<u8>>,
}

/// The most reads in flight a reader may ask for (the engine's limit).
pub const MAX_QUEUE_DEPTH: usize = 4096;

/// Everything that decides how one rank reads a dataset.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Order, seed, share rules; `window_chunks` 0: as many chunks as `memory` allows.
    pub plan: PlanOptions,
    /// This rank and the job's size (the peers' ownership and default node follow from them).
    pub rank: u32,
    pub world_size: u32,
    /// Read-buffer budget of one reader.
    pub memory: u64,
    /// Page cache or `O_DIRECT`, and the page cache Auto may fill (`None`: half of memory).
    pub io_mode: IoMode,
    pub page_cache_bytes: Option<u64>,
    /// I/O backend and reads in flight.
    pub backend: IoKind,
    pub queue_depth: usize,
    /// With hot chunks, gaps shorter than this are read rather than skipped.
    pub range_gap: u64,
    pub tier: Option<TierConfig>,
    pub scores: ScoreSource,
    /// A tier table that does not match the dataset is ignored, and importance sampling
    /// before any table exists starts from uniform scores (SHADE starts uniform), instead of
    /// both being errors (Python's loaders, which create the table as training reports).
    pub lenient_scores: bool,
    pub sampling: SamplingMode,
    pub peers: Option<PeerConfig>,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        let s = StreamOptions::default();
        ReaderConfig {
            plan: PlanOptions {
                window_chunks: 0,
                ..Default::default()
            },
            rank: 0,
            world_size: 1,
            memory: s.memory,
            io_mode: s.io_mode,
            page_cache_bytes: s.page_cache_bytes,
            backend: s.io,
            queue_depth: s.queue_depth,
            range_gap: s.range_gap,
            tier: None,
            scores: ScoreSource::Tier,
            lenient_scores: false,
            sampling: SamplingMode::Uniform,
            peers: None,
        }
    }
}

impl ReaderConfig {
    /// Checks what does not need the dataset.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(ReadError::invalid(m));
        if !(0.0..=1.0).contains(&self.plan.locality) {
            return bad(format!(
                "locality must be in [0, 1], not {}",
                self.plan.locality
            ));
        }
        if !(1..=MAX_QUEUE_DEPTH).contains(&self.queue_depth) {
            return bad(format!(
                "queue_depth must be 1 to {MAX_QUEUE_DEPTH} reads in flight, not {}",
                self.queue_depth
            ));
        }
        if let SamplingMode::Importance(s) = self.sampling {
            if !(0.0..1.0).contains(&s.alpha) {
                return bad(format!("alpha {} is not in [0, 1)", s.alpha));
            }
        }
        if let Some(p) = &self.peers {
            let nodes = p.addrs.len() as u32;
            if self.tier.is_none() {
                return bad(
                    "peers share tiers: they need a local tier (its directory and \
                     quota: cache_dir and cache_size, --cache-dir and --cache-size)"
                        .into(),
                );
            }
            if nodes == 0 {
                return bad("the peer list names no node".into());
            }
            if !self.world_size.is_multiple_of(nodes) {
                return bad(format!(
                    "world size {} is not a multiple of the {nodes} nodes in the peer list",
                    self.world_size
                ));
            }
            if p.timeout.is_zero() {
                return bad("the peer timeout must be a positive number of seconds".into());
            }
        }
        Ok(())
    }

    /// Opens what the configuration names for `ds`: the tier and the peers (whose ownership
    /// every node computes the same, each node's capacity taken to be this one's quota).
    pub fn open(self, ds: &Arc<Dataset>) -> Result<Reader> {
        self.check()?;
        let cache = match &self.tier {
            Some(t) => Some(Arc::new(LocalTier::open(
                &t.dir,
                ds.snapshot().dataset_id(),
                t.quota,
                t.policy,
            )?)),
            None => None,
        };
        let peers = match (&self.peers, &self.tier) {
            (Some(p), Some(t)) => {
                let nodes = p.addrs.len() as u32;
                let ownership = crate::ownership(
                    ds,
                    &ds.resolve_window(&self.plan, self.memory)?,
                    p.ownership_epoch,
                    self.world_size,
                    nodes,
                    &vec![t.quota; nodes as usize],
                )?;
                Some(Arc::new(Peers::new(
                    ds.snapshot().dataset_id(),
                    p.addrs.clone(),
                    p.node.unwrap_or(self.rank / (self.world_size / nodes)),
                    ownership,
                    p.timeout,
                    p.secret.clone(),
                    p.tls_ca.as_deref(),
                )?))
            }
            _ => None,
        };
        Ok(Reader {
            ds: ds.clone(),
            config: self,
            cache,
            peers,
        })
    }
}

/// A configuration opened for a dataset: its tier and peers, and each epoch's setup.
pub struct Reader {
    ds: Arc<Dataset>,
    config: ReaderConfig,
    cache: Option<Arc<LocalTier>>,
    peers: Option<Arc<Peers>>,
}

impl Reader {
    /// The dataset.
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }

    /// The configuration.
    pub fn config(&self) -> &ReaderConfig {
        &self.config
    }

    /// The local tier, if any.
    pub fn tier(&self) -> Option<&Arc<LocalTier>> {
        self.cache.as_ref()
    }

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
        let c = &self.config;
        let path = match (&c.scores, &self.cache) {
            (ScoreSource::File(p), _) => Some(p.clone()),
            (ScoreSource::Tier, Some(t)) if t.scores_path().exists() => Some(t.scores_path()),
            _ => None,
        };
        let table = match path {
            Some(p) => match ImportanceScores::load(&p) {
                Ok(t) => Some(Arc::new(t)),
                // The tier's own table, damaged: like a damaged copy, a miss (training's next
                // report() writes it again), not the end of the epoch.
                Err(e) if matches!(c.scores, ScoreSource::Tier) => {
                    log::warn!("the tier's score table cannot be used ({e}); read without it");
                    None
                }
                Err(e) => return Err(ReadError::invalid(format!("loading the score table: {e}"))),
            },
            None => None,
        };
        let table = table.filter(|t| !c.lenient_scores || t.len() == self.ds.len());
        let importance = matches!(c.sampling, SamplingMode::Importance(_));
        Ok(match table {
            // Importance sampling before any loss was reported: every sample at the mean
            // score, so draws are uniform (still favouring what the tier holds) until
            // report()ed losses reach the table.
            None if importance && c.lenient_scores => {
                Some(Arc::new(ImportanceScores::new(self.ds.len(), 0.8)))
            }
            None if importance => {
                return Err(ReadError::invalid(
                    "importance sampling needs scores: a score table file (--scores FILE), or \
                     a tier (--cache-dir) whose score table report() from training has written"
                        .into(),
                ))
            }
            t => t,
        })
    }

    /// This epoch's setup (the score table read again).
    pub fn setup(&self) -> Result<EpochSetup> {
        let c = &self.config;
        Ok(EpochSetup {
            plan: c.plan.clone(),
            sampling: match c.sampling {
                SamplingMode::Uniform => None,
                SamplingMode::Importance(s) => Some(s),
            },
            stream: StreamOptions {
                io: c.backend,
                io_mode: c.io_mode,
                page_cache_bytes: c.page_cache_bytes,
                queue_depth: c.queue_depth,
                memory: c.memory,
                tier: self.cache.clone(),
                scores: self.scores()?,
                range_gap: c.range_gap,
                peers: self.peers.clone(),
                ..StreamOptions::default()
            },
        })
    }
}
