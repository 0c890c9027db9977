//! Argument groups several commands share (`read`, `plan`, `mount`): the epoch order and
//! share, the local tier, the peers, a mixture of datasets.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use granary::{Mixture, PlanOptions, Shard, Share, ShuffleMode, SourceSpec};

/// Options shared by `read` and `plan`: which epoch order and which share of it.
#[derive(clap::Args, Clone)]
pub struct PlanArgs {
    /// Epoch order: chunkwise (permute chunks, shuffle inside windows of chunks), global
    /// (fully random, record-level reads) or sequential.
    #[arg(long, default_value = "chunkwise", value_parser = ShuffleMode::parse)]
    pub shuffle: ShuffleMode,
    /// Seed of every shuffle (the same seed gives the same epochs on every machine).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Chunks per shuffle window; by default as many as --memory allows.
    #[arg(long)]
    pub window: Option<usize>,
    /// Read-buffer budget of one reader (per worker; RSS is this plus ~20 MB): the window is
    /// budget / (3 x mean chunk size), since three windows are in memory (consumed, decoded,
    /// read); what is left reads further ahead. A mixture reads each of its sources with this
    /// budget (its streams share a pool of it per source).
    #[arg(long, default_value = "128MiB", value_parser = super::pack::parse_size)]
    pub memory: u64,
    /// This process's distributed rank.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Number of distributed ranks.
    #[arg(long, default_value_t = 1)]
    pub world_size: u32,
    /// Loader workers per rank (threads here, DataLoader workers in Python).
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Fraction of chunks reassigned between ranks each epoch, 0..1 (1: fully random;
    /// lower keeps each rank on a home set of chunks so node-local caches stay useful).
    #[arg(long, default_value_t = 1.0)]
    pub locality: f64,
    /// Pad each rank's share by repeating samples instead of dropping the remainder.
    #[arg(long)]
    pub pad: bool,
}

impl PlanArgs {
    /// These arguments as reader options (the rest at their defaults).
    pub fn reader_options(&self) -> granary::ReaderOptions {
        granary::ReaderOptions {
            shuffle: self.shuffle,
            seed: self.seed,
            window: self.window,
            memory: Some(self.memory),
            rank: self.rank,
            world_size: self.world_size,
            drop_last: !self.pad,
            locality: self.locality,
            ..Default::default()
        }
    }

    /// Plan options for `ds` (the window follows from the memory budget unless given).
    pub fn options(&self, ds: &granary::Dataset) -> anyhow::Result<PlanOptions> {
        let mut o = self.reader_options().plan();
        if self.window.is_none() {
            o.window_chunks = ds.window_for_memory(self.memory)?;
        }
        Ok(o)
    }

    /// Every (rank, worker) share of an epoch, rank by rank.
    pub fn shards(&self) -> Vec<Shard> {
        let (world_size, num_workers) = (self.world_size, self.workers);
        (0..world_size)
            .flat_map(|rank| {
                (0..num_workers).map(move |worker| Shard {
                    rank,
                    world_size,
                    worker,
                    num_workers,
                })
            })
            .collect()
    }
}

/// The local tier: `granary read` and `granary mount`.
#[derive(clap::Args, Clone)]
pub struct TierArgs {
    /// Local chunk tier (a directory on the node's SSD), shared by every reader of the dataset
    /// on the node (`granary read`, `granary mount`, Python).
    #[arg(long, value_name = "DIR", requires = "cache_size")]
    pub cache_dir: Option<PathBuf>,
    /// Byte quota of the local tier, e.g. 200GiB.
    #[arg(long, value_parser = super::pack::parse_size, requires = "cache_dir")]
    pub cache_size: Option<u64>,
    /// What the tier keeps when full: lru, static (fill once, never evict) or importance
    /// (by the node's score table, which training's report() feeds).
    #[arg(long, default_value = "static", value_parser = granary::TierPolicy::parse)]
    pub policy: granary::TierPolicy,
}

impl TierArgs {
    /// The tier of `ds`, when --cache-dir and --cache-size are given.
    pub fn open(&self, ds: &granary::Dataset) -> anyhow::Result<Option<Arc<granary::LocalTier>>> {
        Ok(match (&self.cache_dir, self.cache_size) {
            (Some(dir), Some(quota)) => Some(Arc::new(granary::LocalTier::open(
                dir,
                ds.snapshot().dataset_id(),
                quota,
                self.policy,
            )?)),
            _ => None,
        })
    }
}

/// Tiers shared by the nodes of one job: `granary read` and Python.
#[derive(clap::Args, Clone)]
pub struct PeerArgs {
    /// Every node's `granary serve` address (HOST:PORT), in node order, this node's included:
    /// comma-separated, or @FILE with one per line (a hostfile). Chunks this node's tier lacks
    /// are asked of the node that keeps them before origin storage. Default: $GRANARY_PEERS.
    #[arg(
        long,
        value_name = "LIST",
        requires = "cache_dir",
        env = "GRANARY_PEERS"
    )]
    pub peers: Option<String>,
    /// This node's number in --peers (default: rank / ranks per node, ranks numbered node by
    /// node).
    #[arg(long, requires = "peers")]
    pub node: Option<u32>,
    /// Seconds a peer may take to answer before it is marked down for the epoch (its chunks
    /// then come from origin storage).
    #[arg(long, default_value_t = granary::DEFAULT_PEER_TIMEOUT_S, value_name = "SECONDS")]
    pub peer_timeout: f64,
    /// Epoch whose plan decides which node keeps which chunk (default: the first epoch read).
    /// Every node of the job must use the same.
    #[arg(long, value_name = "EPOCH")]
    pub ownership_epoch: Option<u64>,
    /// File holding the job's secret, the one `granary serve` was given: every request to a
    /// peer is signed with it (default: the GRANARY_PEER_SECRET variable; without either,
    /// requests are unsigned and only servers started with --insecure answer them).
    #[arg(long, value_name = "FILE", requires = "peers")]
    pub peer_secret_file: Option<std::path::PathBuf>,
    /// CA certificate(s) (PEM) the peers' TLS certificates chain to: peers are then reached
    /// over TLS (servers started with `granary serve --tls-cert`).
    #[arg(long, value_name = "FILE", requires = "peers", env = "GRANARY_PEER_CA")]
    pub peer_ca: Option<std::path::PathBuf>,
}

impl PeerArgs {
    /// The node addresses, from the list or the hostfile.
    fn addresses(list: &str) -> anyhow::Result<Vec<String>> {
        let text = match list.strip_prefix('@') {
            Some(file) => std::fs::read_to_string(file)
                .with_context(|| format!("reading the peer list {file}"))?,
            None => list.replace(',', "\n"),
        };
        let addrs: Vec<String> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        anyhow::ensure!(!addrs.is_empty(), "the peer list {list:?} names no node");
        Ok(addrs)
    }

    /// These arguments in `o` (the first epoch read is the default ownership epoch); the job's
    /// secret is read from its file or the environment only when --peers is given.
    pub fn apply(&self, o: &mut granary::ReaderOptions, first_epoch: u64) -> anyhow::Result<()> {
        let Some(list) = &self.peers else {
            return Ok(());
        };
        o.peers = Some(Self::addresses(list)?);
        o.node = self.node;
        o.peer_timeout = self.peer_timeout;
        o.ownership_epoch = Some(self.ownership_epoch.unwrap_or(first_epoch));
        o.peer_secret = super::job_secret(self.peer_secret_file.as_deref())?;
        o.peer_ca = self.peer_ca.clone();
        Ok(())
    }
}

/// Several datasets read as one epoch: `read` and `plan`.
#[derive(clap::Args, Clone)]
pub struct MixArgs {
    /// Shares of the datasets given, one per dataset, comma-separated: weights (0.5,0.3,0.2:
    /// each epoch holds that share of every source's samples together, or of --epoch-size),
    /// or per source repeat=R (R times its samples: 0.5 is half of them, a different half
    /// every epoch) or choose=N (N samples). Several datasets without --weights: repeat=1 each.
    #[arg(long, value_name = "LIST")]
    pub weights: Option<String>,
    /// A mixture file: one dataset per line (path, URL or view file; relative to the file)
    /// with its share (0.5, weight=0.5, repeat=R or choose=N; none: repeat=1), and optionally
    /// a line `epoch-size N`; `#` starts a comment. Instead of datasets on the command line.
    #[arg(long, value_name = "FILE", conflicts_with = "weights")]
    pub mixture: Option<PathBuf>,
    /// Samples in each epoch of a weighted mixture (default: its sources' samples together).
    #[arg(long, value_name = "N")]
    pub epoch_size: Option<u64>,
}

impl MixArgs {
    /// The mixture these arguments and `datasets` describe, opened; `None` for one dataset
    /// read alone.
    pub fn open(&self, datasets: &[PathBuf]) -> anyhow::Result<Option<Mixture>> {
        let (specs, size) = match &self.mixture {
            Some(file) => {
                anyhow::ensure!(
                    datasets.is_empty(),
                    "give the datasets in the mixture file {} or on the command line, not both",
                    file.display()
                );
                let (specs, size) = SourceSpec::read_file(file)?;
                (specs, self.epoch_size.or(size))
            }
            None if datasets.len() == 1 && self.weights.is_none() => {
                anyhow::ensure!(
                    self.epoch_size.is_none(),
                    "--epoch-size goes with a weighted mixture (--weights or --mixture)"
                );
                return Ok(None);
            }
            None => (self.specs(datasets)?, self.epoch_size),
        };
        let open = |p: &Path| -> granary::Result<granary::Dataset> {
            super::open_dataset(p).map_err(|e| granary::ReadError::invalid(format!("{e:#}")))
        };
        Ok(Some(Mixture::open(&specs, size, open)?))
    }

    fn specs(&self, datasets: &[PathBuf]) -> anyhow::Result<Vec<SourceSpec>> {
        let shares: Vec<Share> = match &self.weights {
            None => vec![Share::Repeat(1.0); datasets.len()],
            Some(list) => list
                .split(',')
                .map(|s| s.trim().parse::<Share>().map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()
                .with_context(|| format!("--weights {list}"))?,
        };
        anyhow::ensure!(
            shares.len() == datasets.len(),
            "--weights gives {} shares for {} datasets: give one per dataset",
            shares.len(),
            datasets.len()
        );
        Ok(datasets
            .iter()
            .zip(shares)
            .map(|(d, share)| SourceSpec {
                location: d.clone(),
                share,
            })
            .collect())
    }
}
