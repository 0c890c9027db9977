//! What a writer is told: [`WriterOptions`] and the defaults.

use std::path::PathBuf;

use granary_store::StoreConfig;
use serde::{Deserialize, Serialize};

use crate::{hex_id, OutputOptions};

/// Default bytes of samples a writer holds in memory before spilling: a sixteenth of the
/// machine's memory, at most 512 MiB (256 MiB where the machine's memory is unknown). More
/// barely helps: spill logs are not fsynced, so a spilled sample costs only a copy into the
/// page cache and back (docs/writing.md).
pub fn default_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    total.map_or(256 << 20, |t| (t / 16).min(512 << 20))
}

/// Default number of spill logs.
pub const DEFAULT_BUCKETS: u32 = 64;
/// Default most bytes of one spill log read into memory at once when finishing.
pub const DEFAULT_GATHER_MEMORY: u64 = 512 << 20;

/// Everything a [`Writer`] needs to know: where the dataset goes and how its chunks are cut
/// (shared with `pack`), and how the writer mixes what it is given. Plain data that
/// (de)serializes by field names (Python builds it from keywords); the store's configuration
/// and an object-store destination are the front end's to set.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct WriterOptions {
    /// The dataset's destination, its chunking and mixing seed, resume and force.
    pub output: OutputOptions,
    /// How the store reaches object stores (source shards at URLs, the destination).
    #[serde(skip)]
    pub store: StoreConfig,
    /// The class table, when labels are class names (or indexes into it). Required with a
    /// shard that has labels: every chunk of a dataset carries the same class table, and
    /// shards do not talk to each other.
    pub classes: Option<Vec<Vec<u8>>>,
    /// Number of spill logs.
    pub buckets: u32,
    /// Most bytes of one log read whole when finishing (larger ones are read record by record).
    pub gather_memory: u64,
    /// Bytes of samples held in memory, in their buckets, before further ones go to the spill
    /// logs: a dataset that fits is written to local disk once (as chunks), not twice.
    pub memory: u64,
    /// Threads that checksum, compress and spill samples.
    pub threads: usize,
    /// About how many samples will be written. With it, samples go straight into chunks
    /// (chosen by a seeded hash of the key among as many as the expected bytes need) instead
    /// of through the spill logs: written to local disk once, while they come; such a writer
    /// cannot be resumed. See `writer::direct`.
    pub expected: Option<u64>,
    /// Declared field types: name -> type descriptor (`str`, `json`, `int`,
    /// `ndarray:uint8:32,32,3`, `npy`, `image:jpeg`, `bytes`; SPEC.md §6.5). Fields not named
    /// here take the type [`crate::Writer::declare_field_type`] gives them, else `bytes`.
    pub schema: std::collections::BTreeMap<String, String>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions::new(PathBuf::new())
    }
}

impl WriterOptions {
    /// Options with the documented defaults.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        WriterOptions {
            output: OutputOptions::new(out),
            store: StoreConfig::default(),
            classes: None,
            buckets: DEFAULT_BUCKETS,
            gather_memory: DEFAULT_GATHER_MEMORY,
            memory: default_memory(),
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            expected: None,
            schema: Default::default(),
        }
    }

    /// Refuses an expected count of zero, or one given with resume (a writer straight into
    /// chunks keeps nothing to resume from).
    pub(crate) fn check_expected(&self) -> Result<(), crate::PackError> {
        if self.expected == Some(0) {
            return Err(usage!("the expected number of samples must be at least 1"));
        }
        if self.expected.is_some() && self.output.resume {
            return Err(usage!(
                "a writer given the expected number of samples writes them straight into \
                 chunks and keeps nothing to resume from: leave out resume (--resume), or the \
                 expected count"
            ));
        }
        Ok(())
    }

    /// The settings a resumed writer must share with the interrupted one.
    pub(crate) fn settings(&self, dataset_id: &[u8; 16]) -> String {
        let classes = self.classes.as_ref().map(|c| {
            c.iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect::<Vec<_>>()
                .join("\u{1f}")
        });
        let schema: Vec<String> = self
            .schema
            .iter()
            .map(|(n, t)| format!("{n}:{t}"))
            .collect();
        format!(
            "writer=1\ndataset_id={}\nshard={}\ncompress={}\nchunk_size={}\nchunk_files={}\nseed={}\nbuckets={}\nclasses={}\nschema={}\n",
            hex_id(dataset_id),
            self.output.shard.map(|s| s.to_string()).unwrap_or_default(),
            self.output.compress,
            self.output.chunk_size,
            self.output.chunk_files,
            self.output.seed,
            self.buckets,
            classes.unwrap_or_else(|| "-".into()),
            schema.join("\u{1f}"),
        )
    }
}
