//! A reader's options by name, as its users give them: `granary read`'s flags and Python's
//! keywords are the same options with the same defaults ([`ReaderOptions::default`], the one
//! place they are written), and [`ReaderOptions::config`] checks them and makes the
//! [`ReaderConfig`] every front end reads with. The options are plain data: the enums parse
//! from and print as the names users write (`FromStr`, `Display`), and the whole struct
//! deserializes (serde) from a map of those names, which is how Python builds it from keywords,
//! and serializes to one, which is how Python learns every option and its default.
//! Environment variables are not read here: front ends read them.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::config::{PeerConfig, ReaderConfig, SamplingMode, ScoreSource, TierConfig};
use crate::epoch::ImportanceSampling;
use crate::error::{ReadError, Result};
use crate::io::IoKind;
use crate::plan::{PlanOptions, ShuffleMode};
use crate::stream::StreamOptions;
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
fn secret<'de, D>(d: D) -> std::result::Result<Option<granary_store::auth::Secret>, D::Error>
where
    D: Deserializer<'de>,
{
    Option::<String>::deserialize(d)?
        .map(|s| granary_store::auth::Secret::new(s.as_bytes(), "peer_secret"))
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// The job's secret never leaves in a serialization: it shows as none.
fn hidden<S: serde::Serializer>(
    _: &Option<granary_store::auth::Secret>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
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
    /// before any table exists starts from uniform scores, instead of both being errors.
    /// Python's loaders set it: training creates the table as it reports losses.
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
    pub peer_secret: Option<granary_store::auth::Secret>,
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

impl ReaderOptions {
    /// Checks the options and makes the reader configuration they describe (reading the
    /// peers' CA file). Every check of what a user gives is here or in
    /// [`ReaderConfig::check`], which this runs.
    pub fn config(self) -> Result<ReaderConfig> {
        let bad = |m: String| Err(ReadError::invalid(m));
        let tier = match (self.cache_dir, self.cache_size) {
            (Some(dir), Some(quota)) => Some(TierConfig {
                dir,
                quota,
                policy: self.policy,
            }),
            (None, None) => None,
            _ => {
                return bad(
                    "cache_dir and cache_size go together (the tier's directory and quota)".into(),
                )
            }
        };
        if !(self.peer_timeout > 0.0 && self.peer_timeout.is_finite()) {
            return bad(format!(
                "peer_timeout must be a positive number of seconds, not {}",
                self.peer_timeout
            ));
        }
        let tls_ca = match &self.peer_ca {
            Some(f) => Some(std::fs::read(f).map_err(|e| {
                ReadError::invalid(format!("reading the CA file {}: {e}", f.display()))
            })?),
            None => None,
        };
        let config = ReaderConfig {
            plan: PlanOptions {
                mode: self.shuffle,
                seed: self.seed,
                // 0: as many chunks as the memory budget allows.
                window_chunks: self.window.unwrap_or(0),
                drop_last: self.drop_last,
                locality: self.locality,
            },
            rank: self.rank,
            world_size: self.world_size,
            memory: self.memory.unwrap_or(crate::DEFAULT_READER_MEMORY),
            io_mode: self.io,
            page_cache_bytes: self.page_cache,
            backend: self.backend,
            queue_depth: self.queue_depth,
            range_gap: self.range_gap,
            tier,
            scores: match self.scores {
                Some(f) => ScoreSource::File(f),
                None => ScoreSource::Tier,
            },
            lenient_scores: self.lenient_scores,
            sampling: match self.sampling {
                SamplingKind::Uniform => SamplingMode::Uniform,
                SamplingKind::Importance => SamplingMode::Importance(ImportanceSampling {
                    alpha: self.alpha,
                    cache_boost: self.cache_boost,
                }),
            },
            peers: self.peers.map(|addrs| PeerConfig {
                addrs,
                node: self.node,
                timeout: Duration::from_secs_f64(self.peer_timeout),
                ownership_epoch: self.ownership_epoch.unwrap_or(0),
                secret: self.peer_secret,
                tls_ca,
            }),
        };
        config.check()?;
        Ok(config)
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
    fn the_defaults_make_the_default_configuration() {
        let c = ReaderOptions::default().config().unwrap();
        let d = ReaderConfig::default();
        assert_eq!(c.plan, d.plan);
        assert_eq!(
            (c.memory, c.io_mode, c.backend, c.queue_depth, c.range_gap),
            (d.memory, d.io_mode, d.backend, d.queue_depth, d.range_gap)
        );
        assert!(c.tier.is_none() && c.peers.is_none());
    }

    #[test]
    fn what_cannot_work_is_refused_by_name() {
        let refused = |o: ReaderOptions, what: &str| {
            let e = o.config().unwrap_err().to_string();
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
    }
}
