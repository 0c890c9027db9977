//! One rank's epoch, set up the same way by every caller: plan options whose window follows
//! from the memory budget, importance sampling that favours what the local tier holds, the
//! stream; and a driver that reads a rank's share with its loader workers as threads.

use std::sync::Arc;
use std::time::Instant;

use granary_store::MeterReading;
use serde::Serialize;

use crate::dataset::Dataset;
use crate::error::{ReadError, Result};
use crate::plan::{EpochPlan, EpochState, PlanOptions, Sampling, Shard};
use crate::stream::{EpochStream, StreamOptions};

/// Importance sampling: N draws with probability (1 − alpha)/N + alpha × score share, samples
/// the tier holds favoured `cache_boost` times; every sample gets the loss weight 1/(N p).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImportanceSampling {
    /// Mix between uniform (0) and score-proportional draws; must be in [0, 1).
    pub alpha: f64,
    /// How much samples in the local tier are favoured (1: not at all).
    pub cache_boost: f64,
}

/// Everything that decides how an epoch is planned and read.
#[derive(Clone, Debug, Default)]
pub struct EpochSetup {
    /// Order, seed, share rules. `window_chunks` 0 means as many chunks as
    /// `stream.memory` allows ([`Dataset::window_for_memory`]).
    pub plan: PlanOptions,
    /// Importance sampling; needs `stream.scores`. `None`: every sample once.
    pub sampling: Option<ImportanceSampling>,
    /// How chunks are read: I/O mode and backend, memory budget, local tier, scores.
    pub stream: StreamOptions,
}

impl EpochSetup {
    /// The plan options for `ds`, the window resolved.
    pub fn plan_options(&self, ds: &Dataset) -> Result<PlanOptions> {
        ds.resolve_window(&self.plan, self.stream.memory)
    }

    /// Checks what can be checked before any epoch: scores that match the dataset when
    /// importance sampling is asked for, and alpha in range.
    pub fn check(&self, ds: &Dataset) -> Result<()> {
        let scores = self.stream.scores.as_ref();
        let m = match (&self.sampling, scores) {
            (_, Some(s)) if s.len() != ds.len() => {
                format!(
                    "the score table has {} samples, the dataset {}",
                    s.len(),
                    ds.len()
                )
            }
            (Some(_), None) => "importance sampling needs a score table (written by report() \
                                from training, or ImportanceScores::save)"
                .into(),
            (Some(sm), _) if !(0.0..1.0).contains(&sm.alpha) => {
                format!("alpha {} is not in [0, 1)", sm.alpha)
            }
            _ => return Ok(()),
        };
        Err(ReadError::invalid(m))
    }

    /// The plan of `shard`'s share of epoch `epoch` (resumed after `resume` when given).
    pub fn plan(
        &self,
        ds: &Dataset,
        epoch: u64,
        shard: Shard,
        resume: Option<&EpochState>,
    ) -> Result<EpochPlan> {
        self.check(ds)?;
        let mut shape = ds.shape()?;
        if let Some(c) = resume.and_then(|r| r.chunks) {
            // An epoch of an earlier generation: its plan, over the chunks it had.
            if u64::from(c) > ds.chunk_count() || ds.view().is_some() {
                return Err(ReadError::invalid(format!(
                    "the resume state's epoch was planned over {c} chunks; {} has {}{}",
                    ds.location(),
                    ds.chunk_count(),
                    ds.view().map_or("", |_| " and is a view")
                )));
            }
            shape = shape.prefix(c);
        }
        let o = self.plan_options(ds)?;
        self.plan_of(ds, &shape, &o, epoch, shard, resume)
    }

    /// [`EpochSetup::plan`] of `ds` in a given shape and options (a mixture's source: its
    /// epoch count and resumed shape, its options).
    pub fn plan_of(
        &self,
        ds: &Dataset,
        shape: &crate::DatasetShape,
        o: &PlanOptions,
        epoch: u64,
        shard: Shard,
        resume: Option<&EpochState>,
    ) -> Result<EpochPlan> {
        let sampling = self.sampling.as_ref().zip(self.stream.scores.as_ref());
        // What the tier holds (hot samples, whole chunks), for the sampler to favour.
        let (hot, whole) = match (&self.stream.tier, sampling) {
            (Some(c), Some(_)) => {
                let chunks = ds.snapshot().chunks();
                (c.hot_map(chunks), c.resident_chunks(chunks)?)
            }
            _ => Default::default(),
        };
        let in_tier =
            |id: u64| hot.by_sample.contains_key(&id) || whole.contains(&shape.chunk_of(id));
        let sm = sampling.map(|(sm, scores)| Sampling {
            scores,
            alpha: sm.alpha,
            cached: Some(&in_tier),
            cache_boost: sm.cache_boost,
        });
        EpochPlan::build_sampled(shape, o, epoch, shard, resume, sm.as_ref())
            .map_err(ReadError::invalid)
    }

    /// The stream of `shard`'s share of epoch `epoch`.
    pub fn stream(
        &self,
        ds: Arc<Dataset>,
        epoch: u64,
        shard: Shard,
        resume: Option<&EpochState>,
    ) -> Result<EpochStream> {
        let plan = self.plan(&ds, epoch, shard, resume)?;
        EpochStream::new(ds, plan, self.plan.mode, &self.stream)
    }
}

/// What one rank's epoch delivered, summed over its workers: the figures of [`EpochReport`]
/// that its streams count.
#[derive(Clone, Debug, Default)]
pub(crate) struct EpochTotals {
    pub samples: u64,
    pub bytes: u64,
    pub bytes_read: u64,
    pub digest: u64,
    pub backend: &'static str,
    pub backend_fallback: Option<String>,
    pub peak_buffer_bytes: u64,
    pub elapsed_s: f64,
    pub first_sample_s: Option<f64>,
    pub layers: Vec<LayerReading>,
    pub waits: crate::WaitReport,
    /// Per source of a mixture (one entry for a dataset): samples, bytes, digest.
    pub per_source: Vec<(u64, u64, u64)>,
}

/// What passed through one layer of the readers' store stacks ([`granary_store::Metered`]),
/// summed over workers.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LayerReading {
    pub layer: &'static str,
    #[serde(flatten)]
    pub reading: MeterReading,
}

/// Layer `name`'s reading among `layers` (zeros when the stack had no such layer).
pub fn layer_reading(layers: &[LayerReading], name: &str) -> MeterReading {
    let l = layers.iter().find(|l| l.layer == name);
    l.map(|l| l.reading).unwrap_or_default()
}

/// Adds one worker's layer readings to `total`, by layer name (in the order first seen).
pub(crate) fn add_layers(total: &mut Vec<LayerReading>, worker: Vec<LayerReading>) {
    for w in worker {
        match total.iter_mut().find(|t| t.layer == w.layer) {
            Some(t) => t.reading += w.reading,
            None => total.push(w),
        }
    }
}

/// Reads rank `rank`'s share with `workers` loader workers (threads), each streaming the share
/// `open` gives it and touching every byte; a worker's error ends the epoch with it.
pub(crate) fn read_shards<S: crate::SampleStream>(
    rank: u32,
    world_size: u32,
    workers: u32,
    open: &(dyn Fn(Shard) -> Result<S> + Sync),
) -> Result<EpochTotals> {
    let t = Instant::now();
    let k = workers.max(1);
    let results: Vec<Result<EpochTotals>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..k)
            .map(|w| {
                s.spawn(move || -> Result<EpochTotals> {
                    let shard = Shard {
                        rank,
                        world_size,
                        worker: w,
                        num_workers: k,
                    };
                    let mut st = open(shard)?;
                    let mut r = EpochTotals::default();
                    for sample in st.by_ref() {
                        let sample = sample?;
                        if r.samples == 0 {
                            r.first_sample_s = Some(t.elapsed().as_secs_f64());
                        }
                        r.samples += 1;
                        let n = sample.data().len() as u64;
                        r.bytes += n;
                        // The CRC the reader verified these bytes against (computing it
                        // again would be a second pass over every byte, in the epoch's time).
                        let term = crate::digest_term(sample.id, sample.crc32());
                        r.digest = r.digest.wrapping_add(term);
                        add_source(&mut r.per_source, sample.source as usize, (1, n, term));
                    }
                    r.bytes_read = st.bytes_read();
                    r.backend = st.backend();
                    r.backend_fallback = st.backend_fallback().map(str::to_owned);
                    r.peak_buffer_bytes = st.peak_buffer_bytes();
                    r.layers = st
                        .layers()
                        .into_iter()
                        .map(|(layer, reading)| LayerReading { layer, reading })
                        .collect();
                    r.waits = st.waits();
                    Ok(r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|p| Err(crate::stream::thread_died("loader worker", &*p)))
            })
            .collect()
    });
    let mut r = EpochTotals::default();
    for res in results {
        r.add(res?);
    }
    r.elapsed_s = t.elapsed().as_secs_f64();
    Ok(r)
}

impl EpochTotals {
    /// Adds one worker's figures.
    fn add(&mut self, w: EpochTotals) {
        self.samples += w.samples;
        self.bytes += w.bytes;
        self.bytes_read += w.bytes_read;
        self.digest = self.digest.wrapping_add(w.digest);
        self.backend = w.backend;
        self.backend_fallback = self.backend_fallback.take().or(w.backend_fallback);
        self.peak_buffer_bytes = self.peak_buffer_bytes.max(w.peak_buffer_bytes);
        add_layers(&mut self.layers, w.layers);
        self.waits += w.waits;
        for (i, p) in w.per_source.into_iter().enumerate() {
            add_source(&mut self.per_source, i, p);
        }
        let firsts = [self.first_sample_s, w.first_sample_s];
        self.first_sample_s = firsts.into_iter().flatten().reduce(f64::min);
    }
}

/// Adds (samples, bytes, digest) to source `i`'s figures.
fn add_source(
    per_source: &mut Vec<(u64, u64, u64)>,
    i: usize,
    (n, bytes, digest): (u64, u64, u64),
) {
    if per_source.len() <= i {
        per_source.resize(i + 1, (0, 0, 0));
    }
    let p = &mut per_source[i];
    (p.0, p.1, p.2) = (p.0 + n, p.1 + bytes, p.2.wrapping_add(digest));
}

/// What one epoch delivered.
#[derive(Serialize, Default, Clone, Debug)]
pub struct EpochReport {
    pub epoch: u64,
    pub samples: u64,
    pub bytes: u64,
    pub bytes_read: u64,
    pub elapsed_s: f64,
    pub samples_per_s: f64,
    pub mb_per_s: f64,
    pub cpu_s: f64,
    pub digest: String,
    pub backend: String,
    /// Why the backend is pread although the default prefers io_uring (what switched io_uring
    /// off, and what to change); null when it is not a fallback.
    pub backend_fallback: Option<String>,
    /// Bytes this process had read from storage devices during the epoch (`read_bytes` of
    /// `/proc/self/io`: page-cache hits do not count), when the kernel reports it.
    pub device_read_bytes: Option<u64>,
    /// Share of samples and of bytes served by the local tier (when one is configured).
    pub cache_sample_hit_ratio: Option<f64>,
    pub cache_byte_hit_ratio: Option<f64>,
    /// Chunks the tier failed to store (full or failing disk; reads went on from the source).
    /// The counts behind these (what each layer served) are in `layers`.
    pub cache_admissions_failed: Option<u64>,
    /// The most bytes of read buffers (and borrowed maps) one worker's stream held at once.
    pub peak_buffer_bytes: u64,
    /// The process's peak resident set so far (`VmHWM`), when the kernel reports it.
    pub peak_rss_bytes: Option<u64>,
    /// Bytes of the maps of resident chunks the process keeps for its next epochs (page cache,
    /// counted in its RSS as file pages; bounded by the page-cache budget).
    #[serde(default)]
    pub kept_map_bytes: u64,
    /// With tiers shared between nodes: what came from where.
    pub peers: Option<PeerReport>,
    /// For a snapshot read in blocks from an object store: the GETs and bytes this epoch
    /// fetched of it (sample entries, beyond the chunks themselves).
    pub snapshot_gets: Option<u64>,
    pub snapshot_bytes_fetched: Option<u64>,
    /// Seconds from the epoch's start to its first sample.
    pub first_sample_s: Option<f64>,
    /// What passed through each layer of the store stack (tier, peers, origin, as configured),
    /// summed over workers, top first, with the seconds the workers waited in it.
    pub layers: Vec<LayerReading>,
    /// How long the workers waited for samples, and what the reader was doing meanwhile
    /// ([`crate::WaitReport`]). Summed over workers.
    pub waits: crate::WaitReport,
}

/// One epoch's reads with tiers shared between nodes ([`crate::Peers`]); what the peers did
/// is the `peers` layer's reading in [`EpochReport::layers`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct PeerReport {
    /// This node, and the fingerprint of who keeps what (equal on every node of the job).
    pub node: u32,
    pub ownership: String,
    /// Bytes of whole chunks this rank read from its own node's tier, from other nodes' tiers,
    /// and from origin storage (everything else, peers' fallbacks included).
    pub bytes_from_local_tier: u64,
    pub bytes_from_peers: u64,
    pub bytes_from_origin: u64,
    /// Peers marked down at the end of the epoch.
    pub down: Vec<String>,
}

/// Reads rank `rank`'s share of epoch `epoch` with `workers` loader workers (threads), each
/// streaming its own share and touching every byte (a worker's error ends the epoch with it),
/// measured as `granary read` reports it: throughput, CPU time, device bytes, tier hit ratios
/// and the process's peak RSS.
pub fn measure_epoch(
    ds: &Arc<Dataset>,
    setup: &EpochSetup,
    epoch: u64,
    rank: u32,
    world_size: u32,
    workers: u32,
) -> Result<EpochReport> {
    // A bad setup fails here, before any worker starts.
    setup.check(ds)?;
    let start = Start::now();
    let snap0 = ds.snapshot_fetched();
    let t = read_shards(rank, world_size, workers, &|shard| {
        setup.stream(ds.clone(), epoch, shard, None)
    })?;
    let snap = snap0.zip(ds.snapshot_fetched()).map(|(a, b)| b - a);
    // Global plans read single records, never through the tier: no hit ratio to report.
    let tier = setup.stream.tier.is_some() && setup.plan.mode != crate::ShuffleMode::Global;
    let mut r = start.report(epoch, t, tier);
    let served = |name| layer_reading(&r.layers, name).served_bytes;
    let peers = setup.stream.peers.as_ref().filter(|_| tier);
    r.peers = peers.map(|p| PeerReport {
        node: p.me(),
        ownership: p.ownership().fingerprint(),
        bytes_from_local_tier: served("tier"),
        bytes_from_peers: served("peers"),
        bytes_from_origin: served("origin"),
        down: p.down(),
    });
    r.snapshot_gets = snap.map(|s| s.reads);
    r.snapshot_bytes_fetched = snap.map(|s| s.bytes);
    Ok(r)
}

/// The process's counters when an epoch starts, to measure it by.
pub(crate) struct Start {
    cpu_s: f64,
    device: Option<u64>,
}

impl Start {
    pub(crate) fn now() -> Start {
        Start {
            cpu_s: crate::procstat::cpu_seconds(),
            device: crate::procstat::device_read_bytes(),
        }
    }

    /// The epoch that read `t` since, as `granary read` reports it (`tier`: a tier was
    /// configured), without the peers or snapshot figures the caller knows.
    pub(crate) fn report(&self, epoch: u64, t: EpochTotals, tier: bool) -> EpochReport {
        use crate::procstat::{cpu_seconds, device_read_bytes, peak_rss_bytes};
        let secs = t.elapsed_s.max(1e-9);
        let layer = |name| layer_reading(&t.layers, name);
        let (tr, pr, or) = (layer("tier"), layer("peers"), layer("origin"));
        // Chunks from other nodes' tiers count as neither hits nor misses of this node's tier.
        let ratio = |a: u64, b: u64, peer: u64| a as f64 / (a + b + peer).max(1) as f64;
        EpochReport {
            epoch,
            samples: t.samples,
            bytes: t.bytes,
            bytes_read: t.bytes_read,
            elapsed_s: t.elapsed_s,
            samples_per_s: t.samples as f64 / secs,
            mb_per_s: t.bytes as f64 / 1e6 / secs,
            cpu_s: cpu_seconds() - self.cpu_s,
            digest: format!("{:016x}", t.digest),
            backend: t.backend.to_string(),
            backend_fallback: t.backend_fallback,
            device_read_bytes: match (self.device, device_read_bytes()) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            },
            cache_sample_hit_ratio: tier
                .then(|| ratio(tr.served_samples, or.served_samples, pr.served_samples)),
            cache_byte_hit_ratio: tier
                .then(|| ratio(tr.served_bytes, or.served_bytes, pr.served_bytes)),
            cache_admissions_failed: tier.then_some(tr.admissions_failed),
            peak_buffer_bytes: t.peak_buffer_bytes,
            peak_rss_bytes: peak_rss_bytes(),
            kept_map_bytes: granary_store::local::kept_map_bytes(),
            first_sample_s: t.first_sample_s,
            layers: t.layers,
            waits: t.waits,
            ..Default::default()
        }
    }
}
