//! A reader's options by name, as its users give them (`granary read`'s flags, Python's
//! keywords, the benchmarks, mixtures), with their defaults and checks; `ReaderOptions::open`
//! opens what they name for a dataset (`crate::Reader`). The struct deserializes (serde) from a
//! map of those names, which is how Python builds it from keywords, and serializes to one, which
//! is how Python learns every option and its default. Front ends read environment variables.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};

use crate::epoch::ImportanceSampling;
use crate::error::{ReadError, Result};
use crate::io::IoKind;
use crate::plan::{PlanOptions, ShuffleMode};
use crate::stream::StreamOptions;
use granary_store::auth::Secret;
use granary_store::{IoMode, TierPolicy};

/// Default importance sampling mix (`alpha`, `--alpha`).
pub const DEFAULT_ALPHA: f64 = 0.5;
/// Default favour of samples the tier holds under importance sampling (`cache_boost`).
pub const DEFAULT_CACHE_BOOST: f64 = 4.0;
/// Default seconds a peer may take to answer (`peer_timeout`, `--peer-timeout`).
pub const DEFAULT_PEER_TIMEOUT_S: f64 = 2.0;

granary_format::named_enum! {
    /// Which samples an epoch reads, by name.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum SamplingKind ("sampling") {
        /// Every sample once.
        #[default]
        Uniform = "uniform",
        /// Importance sampling (`alpha`, `cache_boost`; needs scores).
        Importance = "importance",
    }
}

/// Deserializes the job's secret from its text.
fn secret<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Secret>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| Secret::new(s.as_bytes(), "peer_secret"))
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// The job's secret never leaves in a serialization: it shows as none.
fn hidden<S: serde::Serializer>(_: &Option<Secret>, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_none()
}

/// Everything a user says about how one rank reads a dataset, by the names of Python's
/// keywords (the CLI's flags are the same names with dashes).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default)]
pub struct ReaderOptions {
    /// Epoch order.
    pub shuffle: ShuffleMode,
    pub seed: u64,
    /// Chunks per shuffle window (`None`: as many as `memory` allows).
    pub window: Option<usize>,
    /// Read-buffer budget of one reader (`None`: [`crate::DEFAULT_READER_MEMORY`]).
    pub memory: Option<u64>,
    pub rank: u32,
    pub world_size: u32,
    /// Drop the remainder of an uneven split (false: pad by repeating samples).
    pub drop_last: bool,
    /// Fraction of chunks reassigned between ranks each epoch, 0..1.
    pub locality: f64,
    /// Page cache or `O_DIRECT`, and the page cache `auto` may fill.
    pub io: IoMode,
    pub page_cache: Option<u64>,
    /// I/O backend and reads in flight.
    pub backend: IoKind,
    pub queue_depth: usize,
    /// With hot chunks, gaps shorter than this are read rather than skipped.
    pub range_gap: u64,
    /// The local tier: its directory and byte quota (both or neither), and policy.
    pub cache_dir: Option<PathBuf>,
    pub cache_size: Option<u64>,
    pub policy: TierPolicy,
    /// A score table file (`None`: the node's shared table next to the tier).
    pub scores: Option<PathBuf>,
    /// A tier table that does not match the dataset is ignored, and importance sampling
    /// before any table exists starts from uniform scores, instead of both being errors
    /// (Python's loaders: training creates the table). Not an option users give.
    #[serde(skip_serializing)]
    pub lenient_scores: bool,
    pub sampling: SamplingKind,
    pub alpha: f64,
    pub cache_boost: f64,
    /// Every node's `granary serve` address, in node order (tiers shared by a job's nodes).
    pub peers: Option<Vec<String>>,
    pub node: Option<u32>,
    /// Seconds a peer may take to answer before it is marked down for the epoch.
    pub peer_timeout: f64,
    /// The epoch whose plan decides which node keeps which chunk (`None`: 0).
    pub ownership_epoch: Option<u64>,
    /// The job's secret (its text), which signs every request to a peer.
    #[serde(deserialize_with = "secret", serialize_with = "hidden")]
    pub peer_secret: Option<Secret>,
    /// CA certificates (a PEM file) the peers' TLS certificates chain to.
    pub peer_ca: Option<PathBuf>,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        let s = StreamOptions::default();
        ReaderOptions {
            shuffle: ShuffleMode::Chunkwise,
            seed: 0,
            window: None,
            memory: None,
            rank: 0,
            world_size: 1,
            drop_last: true,
            locality: 1.0,
            io: s.io_mode,
            page_cache: s.page_cache_bytes,
            backend: s.io,
            queue_depth: s.queue_depth,
            range_gap: s.range_gap,
            cache_dir: None,
            cache_size: None,
            policy: TierPolicy::Static,
            scores: None,
            lenient_scores: false,
            sampling: SamplingKind::Uniform,
            alpha: DEFAULT_ALPHA,
            cache_boost: DEFAULT_CACHE_BOOST,
            peers: None,
            node: None,
            peer_timeout: DEFAULT_PEER_TIMEOUT_S,
            ownership_epoch: None,
            peer_secret: None,
            peer_ca: None,
        }
    }
}

/// The most reads in flight a reader may ask for (the engine's limit).
pub const MAX_QUEUE_DEPTH: usize = 4096;

impl ReaderOptions {
    /// Checks what does not need the dataset: every check of what a user gives is here
    /// ([`ReaderOptions::open`] runs it).
    pub fn check(&self) -> Result<()> {
        let ensure = |ok: bool, m: String| ok.then_some(()).ok_or_else(|| ReadError::invalid(m));
        let (dir, size) = (self.cache_dir.is_some(), self.cache_size.is_some());
        let m = "cache_dir and cache_size go together (the tier's directory and quota)";
        ensure(dir == size, m.into())?;
        let locality = self.locality;
        let m = format!("locality must be in [0, 1], not {locality}");
        ensure((0.0..=1.0).contains(&locality), m)?;
        let m = "memory must be a positive number of bytes";
        ensure(self.memory != Some(0), m.into())?;
        if let Some(f) = &self.scores {
            // Its contents are checked when an epoch loads it (training may rewrite it).
            std::fs::File::open(f)
                .map_err(|e| ReadError::invalid(format!("the score table {}: {e}", f.display())))?;
        }
        let depth = self.queue_depth;
        let m = format!("queue_depth must be 1 to {MAX_QUEUE_DEPTH} reads in flight, not {depth}");
        ensure((1..=MAX_QUEUE_DEPTH).contains(&depth), m)?;
        let importance = self.sampling == SamplingKind::Importance;
        let m = format!("alpha {} is not in [0, 1)", self.alpha);
        ensure(!importance || (0.0..1.0).contains(&self.alpha), m)?;
        let positive = |x: f64| x > 0.0 && x.is_finite();
        let boost = self.cache_boost;
        let m = format!("cache_boost must be a positive number (1: no favour), not {boost}");
        ensure(positive(boost), m)?;
        let m = "cache_size must be a positive number of bytes";
        ensure(self.cache_size != Some(0), m.into())?;
        let m = "node numbers this node in the peer list: it needs peers";
        ensure(self.node.is_none() || self.peers.is_some(), m.into())?;
        let timeout = self.peer_timeout;
        let m = format!("peer_timeout must be a positive number of seconds, not {timeout}");
        ensure(positive(timeout), m)?;
        if let Some(addrs) = &self.peers {
            let nodes = addrs.len() as u32;
            let m = "peers share tiers: they need a local tier (its directory and quota: \
                     cache_dir and cache_size, --cache-dir and --cache-size)";
            ensure(dir, m.into())?;
            ensure(nodes > 0, "the peer list names no node".into())?;
            let m = format!(
                "world size {} is not a multiple of the {nodes} nodes in the peer list",
                self.world_size
            );
            ensure(self.world_size.is_multiple_of(nodes), m)?;
        }
        self.tls_ca()?;
        Ok(())
    }

    /// The plan these options ask for (`window_chunks` 0: as many chunks as `memory` allows).
    pub fn plan(&self) -> PlanOptions {
        PlanOptions {
            mode: self.shuffle,
            seed: self.seed,
            window_chunks: self.window.unwrap_or(0),
            drop_last: self.drop_last,
            locality: self.locality,
        }
    }

    /// The read-buffer budget of one reader.
    pub fn memory_budget(&self) -> u64 {
        self.memory.unwrap_or(crate::DEFAULT_READER_MEMORY)
    }

    /// Importance sampling's parameters, when the options ask for it.
    pub fn importance(&self) -> Option<ImportanceSampling> {
        (self.sampling == SamplingKind::Importance).then_some(ImportanceSampling {
            alpha: self.alpha,
            cache_boost: self.cache_boost,
        })
    }

    /// The peers' CA certificates (the file `peer_ca` names), read.
    pub(crate) fn tls_ca(&self) -> Result<Option<Vec<u8>>> {
        let Some(f) = &self.peer_ca else {
            return Ok(None);
        };
        let ca = std::fs::read(f)
            .map_err(|e| ReadError::invalid(format!("reading the CA file {}: {e}", f.display())))?;
        Ok(Some(ca))
    }

    /// The stream options of an epoch read with these options (no tier, scores or peers: the
    /// `Reader` adds what it opened).
    pub(crate) fn stream(&self) -> StreamOptions {
        StreamOptions {
            io: self.backend,
            io_mode: self.io,
            page_cache_bytes: self.page_cache,
            queue_depth: self.queue_depth,
            memory: self.memory_budget(),
            range_gap: self.range_gap,
            ..StreamOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_to_what_they_print() {
        for s in [SamplingKind::Uniform, SamplingKind::Importance] {
            assert_eq!(s.to_string().parse::<SamplingKind>(), Ok(s));
        }
        for m in [
            ShuffleMode::Chunkwise,
            ShuffleMode::Global,
            ShuffleMode::Sequential,
        ] {
            assert_eq!(m.to_string().parse::<ShuffleMode>(), Ok(m));
        }
        for p in [TierPolicy::Lru, TierPolicy::Static, TierPolicy::Importance] {
            assert_eq!(p.to_string().parse::<TierPolicy>(), Ok(p));
        }
        for m in [IoMode::Auto, IoMode::Direct, IoMode::Buffered] {
            assert_eq!(m.to_string().parse::<IoMode>(), Ok(m));
        }
        for k in [IoKind::Auto, IoKind::Uring, IoKind::Pread] {
            assert_eq!(k.to_string().parse::<IoKind>(), Ok(k));
        }
    }

    #[test]
    fn what_cannot_work_is_refused_by_name() {
        let refused = |o: ReaderOptions, what: &str| {
            let e = o.check().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        refused(
            ReaderOptions {
                cache_dir: Some("t".into()),
                ..Default::default()
            },
            "cache_dir and cache_size go together",
        );
        refused(
            ReaderOptions {
                peers: Some(vec!["a:1".into()]),
                ..Default::default()
            },
            "cache_dir",
        );
        refused(
            ReaderOptions {
                cache_dir: Some("t".into()),
                cache_size: Some(1 << 20),
                peers: Some(vec!["a:1".into()]),
                peer_timeout: 0.0,
                ..Default::default()
            },
            "peer_timeout",
        );
        refused(
            ReaderOptions {
                sampling: SamplingKind::Importance,
                alpha: 1.0,
                ..Default::default()
            },
            "alpha",
        );
        refused(
            ReaderOptions {
                locality: 1.5,
                ..Default::default()
            },
            "locality",
        );
        refused(
            ReaderOptions {
                queue_depth: 0,
                ..Default::default()
            },
            "queue_depth",
        );
        for boost in [0.0, -1.0, f64::NAN] {
            refused(
                ReaderOptions {
                    cache_boost: boost,
                    ..Default::default()
                },
                "cache_boost",
            );
        }
        refused(
            ReaderOptions {
                cache_dir: Some("t".into()),
                cache_size: Some(0),
                ..Default::default()
            },
            "cache_size",
        );
        refused(
            ReaderOptions {
                node: Some(1),
                ..Default::default()
            },
            "needs peers",
        );
    }
}
