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
            // Samples this generation deleted were in the epoch as planned: its plan is made of
            // the samples the state's generation had (ids do not move), and they are left out
            // as it is handed out.
            let snap = ds.snapshot();
            let g = snap.lineage().generation;
            let since: Vec<u64> = (snap.deleted().iter().copied())
                .filter(|&id| snap.deleted_by(id) == Some(g))
                .collect();
            shape = match since.is_empty() {
                true => shape.prefix(c),
                false => {
                    let had: std::sync::Arc<[u64]> = (0..ds.len())
                        .filter(|&id| snap.deleted_by(id).is_none_or(|d| d == g))
                        .collect();
                    let counts = ds.chunk_entries()?.into_iter().map(|ce| ce.sample_count);
                    let all = crate::DatasetShape::from_counts(counts);
                    all.select(had).prefix(c).without(&since)
                }
            };
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
pub(crate) fn add_layers(
    total: &mut Vec<LayerReading>,
    worker: impl IntoIterator<Item = (&'static str, MeterReading)>,
) {
    for (layer, reading) in worker {
        match total.iter_mut().find(|t| t.layer == layer) {
            Some(t) => t.reading += reading,
            None => total.push(LayerReading { layer, reading }),
        }
    }
}

/// Samples, bytes and digest of each source of a mixture (one entry for a dataset).
pub(crate) type PerSource = Vec<(u64, u64, u64)>;

/// Reads rank `rank`'s share of epoch `epoch` with `workers` loader workers (threads), each
/// streaming the share `open` gives it and touching every byte (a worker's error ends the
/// epoch with it). Returns the epoch as `granary read` reports it (`tier`: a tier was
/// configured), without the peers or snapshot figures the caller knows, and what each source
/// delivered.
pub(crate) fn read_shards<S: crate::SampleStream>(
    epoch: u64,
    (rank, world_size, workers): (u32, u32, u32),
    tier: bool,
    open: &(dyn Fn(Shard) -> Result<S> + Sync),
) -> Result<(EpochReport, PerSource)> {
    use crate::procstat::{cpu_seconds, device_read_bytes, peak_rss_bytes};
    let (t, cpu_s, device) = (Instant::now(), cpu_seconds(), device_read_bytes());
    let k = workers.max(1);
    let results: Vec<Result<(EpochReport, PerSource)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..k)
            .map(|w| {
                s.spawn(move || -> Result<(EpochReport, PerSource)> {
                    let mut st = open(Shard::at((world_size, k), rank * k + w))?;
                    let (mut r, mut per_source) = (EpochReport::default(), Vec::new());
                    for sample in st.by_ref() {
                        let sample = sample?;
                        if r.first_sample_s.is_none() {
                            r.first_sample_s = Some(t.elapsed().as_secs_f64());
                        }
                        // The CRC the reader verified these bytes against (computing it
                        // again would be a second pass over every byte, in the epoch's time).
                        let term = crate::digest_term(sample.id, sample.crc32());
                        let n = sample.data().len() as u64;
                        add_source(&mut per_source, sample.source as usize, (1, n, term));
                    }
                    r.bytes_read = st.bytes_read();
                    r.backend = st.backend().into();
                    r.backend_fallback = st.backend_fallback().map(str::to_owned);
                    r.peak_buffer_bytes = st.peak_buffer_bytes();
                    add_layers(&mut r.layers, st.layers());
                    r.waits = st.waits();
                    Ok((r, per_source))
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
    let (mut r, mut per_source) = (EpochReport::default(), Vec::new());
    for res in results {
        let (w, p) = res?;
        r.bytes_read += w.bytes_read;
        r.backend = w.backend;
        r.backend_fallback = r.backend_fallback.take().or(w.backend_fallback);
        r.peak_buffer_bytes = r.peak_buffer_bytes.max(w.peak_buffer_bytes);
        add_layers(&mut r.layers, w.layers.iter().map(|l| (l.layer, l.reading)));
        r.waits += w.waits;
        for (i, p) in p.into_iter().enumerate() {
            add_source(&mut per_source, i, p);
        }
        let firsts = [r.first_sample_s, w.first_sample_s];
        r.first_sample_s = firsts.into_iter().flatten().reduce(f64::min);
    }
    let (samples, bytes, digest) = (per_source.iter()).fold((0, 0, 0u64), |a, p| {
        (a.0 + p.0, a.1 + p.1, a.2.wrapping_add(p.2))
    });
    let secs = t.elapsed().as_secs_f64();
    let layer = |name| layer_reading(&r.layers, name);
    let (tr, pr, or) = (layer("tier"), layer("peers"), layer("origin"));
    // Chunks from other nodes' tiers count as neither hits nor misses of this node's tier.
    let ratio = |a: u64, b: u64, peer: u64| a as f64 / (a + b + peer).max(1) as f64;
    let r = EpochReport {
        epoch,
        samples,
        bytes,
        elapsed_s: secs,
        samples_per_s: samples as f64 / secs.max(1e-9),
        mb_per_s: bytes as f64 / 1e6 / secs.max(1e-9),
        cpu_s: cpu_seconds() - cpu_s,
        digest: format!("{digest:016x}"),
        device_read_bytes: device
            .zip(device_read_bytes())
            .map(|(a, b)| b.saturating_sub(a)),
        cache_sample_hit_ratio: tier
            .then(|| ratio(tr.served_samples, or.served_samples, pr.served_samples)),
        cache_byte_hit_ratio: tier
            .then(|| ratio(tr.served_bytes, or.served_bytes, pr.served_bytes)),
        cache_admissions_failed: tier.then_some(tr.admissions_failed),
        peak_rss_bytes: peak_rss_bytes(),
        kept_map_bytes: granary_store::local::kept_map_bytes(),
        ..r
    };
    Ok((r, per_source))
}

/// Adds (samples, bytes, digest) to source `i`'s figures.
fn add_source(per_source: &mut PerSource, i: usize, (n, bytes, digest): (u64, u64, u64)) {
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
    let snap0 = ds.snapshot_fetched();
    // Global plans read single records, never through the tier: no hit ratio to report.
    let tier = setup.stream.tier.is_some() && setup.plan.mode != crate::ShuffleMode::Global;
    let (mut r, _) = read_shards(epoch, (rank, world_size, workers), tier, &|shard| {
        setup.stream(ds.clone(), epoch, shard, None)
    })?;
    let snap = snap0.zip(ds.snapshot_fetched()).map(|(a, b)| b - a);
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
