//! Mixtures opened on datasets and read: [`Mixture`] (the sources and their shares),
//! [`MixReader`] (a reader configuration opened for every source: tier, peers, memory) and
//! [`MixStream`] (one shard's epoch, its sources' streams interleaved).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::SourceMark;
use super::{
    epoch_counts, source_seed, Interleave, MixPlan, MixState, PartPlanner, PlanSource, Share,
};
use crate::config::Reader;
use crate::dataset::Dataset;
use crate::epoch::{add_layers, EpochReport};
use crate::error::{ReadError, Result};
use crate::options::ReaderOptions;
use crate::plan::{DatasetShape, Shard};
use crate::stream::{EpochStream, Sample};
use crate::waits::WaitReport;
use granary_store::buf::BufPool;
use granary_store::MeterReading;

use crate::readahead::{ReadAheadSeat, SharedReadAhead};

/// A stream of samples with the reader's counters: one dataset's ([`EpochStream`]) or a
/// mixture's ([`MixStream`]). What front ends hold.
pub trait SampleStream: Iterator<Item = Result<Sample>> + Send {
    /// The dataset streams it reads: itself, or a mixture's sources'.
    fn parts(&self) -> &[EpochStream];
    /// The I/O backend ("uring" or "pread"; a mixture's first source's).
    fn backend(&self) -> &'static str {
        self.parts().first().map_or("pread", |s| s.backend())
    }
    /// Why it reads with pread although io_uring was wanted.
    fn backend_fallback(&self) -> Option<&str> {
        self.parts().iter().find_map(|s| s.backend_fallback())
    }
    /// What passed through each layer of the store stacks so far, top first.
    fn layers(&self) -> Vec<(&'static str, MeterReading)> {
        let mut total = Vec::new();
        for s in self.parts() {
            add_layers(&mut total, s.layers());
        }
        total.into_iter().map(|l| (l.layer, l.reading)).collect()
    }
    /// How long the consumer waited so far, and on what.
    fn waits(&self) -> WaitReport {
        let mut w = WaitReport::default();
        for s in self.parts() {
            w += s.waits();
        }
        w
    }
    /// Bytes read from storage so far.
    fn bytes_read(&self) -> u64 {
        self.parts().iter().map(|s| s.bytes_read()).sum()
    }
    /// The most bytes of read buffers held at once.
    fn peak_buffer_bytes(&self) -> u64;
}

impl SampleStream for EpochStream {
    fn parts(&self) -> &[EpochStream] {
        std::slice::from_ref(self)
    }
    fn peak_buffer_bytes(&self) -> u64 {
        EpochStream::peak_buffer_bytes(self)
    }
}

/// A source as a user names it: a dataset (path, URL or view file) and its share.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceSpec {
    pub location: PathBuf,
    pub share: Share,
}

impl SourceSpec {
    /// A mixture file: one source per line, `LOCATION [weight=W | repeat=R | choose=N | W]`
    /// (no share: repeat=1), and optionally a line `epoch-size N`; `#` starts a comment.
    /// Relative locations are relative to the file's directory. Returns the sources and the
    /// epoch size.
    pub fn read_file(path: &Path) -> Result<(Vec<SourceSpec>, Option<u64>)> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ReadError::io("reading the mixture file", path, e))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut specs = Vec::new();
        let mut epoch_size = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |m: String| ReadError::invalid(format!("{}:{}: {m}", path.display(), n + 1));
            if let Some(v) = line.strip_prefix("epoch-size") {
                let v = v.trim();
                epoch_size = Some(
                    v.parse()
                        .map_err(|_| bad(format!("epoch-size {v:?} is not a sample count")))?,
                );
                continue;
            }
            let (loc, share) = match line.rsplit_once(char::is_whitespace) {
                Some((loc, s)) => match s.parse::<Share>() {
                    Ok(share) => (loc.trim(), share),
                    Err(e) if s.contains('=') => return Err(bad(e)),
                    Err(_) => (line, Share::Repeat(1.0)),
                },
                None => (line, Share::Repeat(1.0)),
            };
            let location = if loc.contains("://") || Path::new(loc).is_absolute() {
                PathBuf::from(loc)
            } else {
                base.join(loc)
            };
            specs.push(SourceSpec { location, share });
        }
        if specs.is_empty() {
            return Err(ReadError::invalid(format!(
                "{}: the mixture file names no source",
                path.display()
            )));
        }
        Ok((specs, epoch_size))
    }
}

/// The datasets of a mixture and what each contributes to an epoch.
pub struct Mixture {
    sources: Vec<MixSource>,
}

struct MixSource {
    name: String,
    ds: Arc<Dataset>,
    share: Share,
    shape: DatasetShape,
    /// Its epoch count is `take`.
    mark: SourceMark,
}

impl Mixture {
    /// The mixture of `datasets` (a name for messages, the opened dataset) with `shares`:
    /// checks the shares ([`epoch_counts`]) and that no dataset (or view) appears twice.
    pub fn new(
        datasets: Vec<(String, Arc<Dataset>)>,
        shares: &[Share],
        epoch_size: Option<u64>,
    ) -> Result<Mixture> {
        let mut shapes = Vec::with_capacity(datasets.len());
        for (i, (name, ds)) in datasets.iter().enumerate() {
            for (other, ods) in &datasets[..i] {
                let same_ids = ds.view().map(|v| &v.ids) == ods.view().map(|v| &v.ids);
                if ds.snapshot().dataset_id() == ods.snapshot().dataset_id() && same_ids {
                    return Err(ReadError::invalid(format!(
                        "{name} and {other} are the same samples of one dataset: give it once, \
                         with a larger share (repeat=2 reads each sample twice)"
                    )));
                }
            }
            shapes.push(ds.shape()?);
        }
        let sizes: Vec<u64> = shapes.iter().map(DatasetShape::samples).collect();
        let counts = epoch_counts(&sizes, shares, epoch_size).map_err(ReadError::invalid)?;
        let sources = datasets
            .into_iter()
            .zip(shapes)
            .zip(shares.iter().zip(counts))
            .map(|(((name, ds), shape), (&share, count))| MixSource {
                mark: SourceMark {
                    dataset: granary_format::DatasetId(ds.snapshot().dataset_id()).to_string(),
                    chunks: shape.chunks(),
                    samples: shape.samples(),
                    take: count,
                    window: 0,
                },
                name,
                ds,
                share,
                shape,
            })
            .collect();
        Ok(Mixture { sources })
    }

    /// Opens every source of `specs` with `open` and makes the mixture.
    pub fn open(
        specs: &[SourceSpec],
        epoch_size: Option<u64>,
        open: impl Fn(&Path) -> Result<Dataset>,
    ) -> Result<Mixture> {
        let datasets = specs
            .iter()
            .map(|s| {
                Ok((
                    s.location.display().to_string(),
                    Arc::new(open(&s.location)?),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let shares: Vec<Share> = specs.iter().map(|s| s.share).collect();
        Self::new(datasets, &shares, epoch_size)
    }

    /// Sources in the mixture.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// True for no sources (never: [`Mixture::new`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Source `i`'s name, dataset, share, samples and epoch count.
    pub fn name(&self, i: usize) -> &str {
        &self.sources[i].name
    }
    pub fn dataset(&self, i: usize) -> &Arc<Dataset> {
        &self.sources[i].ds
    }
    pub fn share(&self, i: usize) -> Share {
        self.sources[i].share
    }
    pub fn samples(&self, i: usize) -> u64 {
        self.sources[i].shape.samples()
    }
    /// Samples source `i` contributes to every epoch.
    pub fn count(&self, i: usize) -> u64 {
        self.sources[i].mark.take
    }
}

/// A reader configuration opened for every source of a mixture. Each source gets its own
/// plan seed (derived from the seed), its own tier and peers as a dataset read alone would,
/// a share of the tier's quota (half split evenly, half by epoch counts), and the memory
/// budget a dataset read alone gets: its window is the one `memory` gives it alone, and a
/// shard's streams share one pool of read buffers of `memory` per source, so that whichever
/// source the consumer is about to need can read ahead. (Why per source: a stream holds up to
/// three windows of at least a chunk, so k sources need 3k chunks whatever the budget.)
pub struct MixReader {
    mix: Arc<Mixture>,
    readers: Vec<Reader>,
    memory: u64,
}

impl MixReader {
    /// Opens `options` for every source of `mix`.
    pub fn open(mix: Arc<Mixture>, options: &ReaderOptions) -> Result<MixReader> {
        if options.locality < 1.0 {
            return Err(ReadError::invalid(
                "locality below 1 is not supported for mixtures yet".into(),
            ));
        }
        if options.scores.is_some() {
            return Err(ReadError::invalid(
                "a mixture's sources are sampled by the score tables next to their tiers \
                 (--cache-dir), not by one score file"
                    .into(),
            ));
        }
        let total: u64 = (0..mix.len()).map(|i| mix.count(i)).sum::<u64>().max(1);
        let n = mix.len() as f64;
        let readers = (0..mix.len())
            .map(|i| {
                let part = (mix.count(i) as f64 / total as f64 + 1.0 / n) / 2.0;
                let mut o = options.clone();
                o.seed = source_seed(options.seed, i);
                o.cache_size = o.cache_size.map(|q| ((q as f64 * part) as u64).max(1));
                o.open(mix.dataset(i))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MixReader {
            memory: options
                .memory_budget()
                .saturating_mul(readers.len().max(1) as u64),
            mix,
            readers,
        })
    }

    /// The mixture.
    pub fn mixture(&self) -> &Arc<Mixture> {
        &self.mix
    }

    /// The read-buffer budget of a shard's streams together: the reader's `memory` per
    /// source.
    pub fn memory(&self) -> u64 {
        self.memory
    }

    /// A new epoch: every peer is asked again.
    pub fn begin_epoch(&self) {
        for r in &self.readers {
            r.begin_epoch();
        }
    }

    /// Every source's setup for an epoch (its score table read again).
    fn setups(&self) -> Result<Vec<crate::EpochSetup>> {
        self.readers.iter().map(|r| r.setup()).collect()
    }

    /// The plan sources (shape with the epoch count, resolved options, mark) of this epoch.
    pub fn plan_sources(&self) -> Result<Vec<PlanSource>> {
        self.plan_sources_of(&self.setups()?)
    }

    fn plan_sources_of(&self, setups: &[crate::EpochSetup]) -> Result<Vec<PlanSource>> {
        setups
            .iter()
            .zip(&self.mix.sources)
            .map(|(setup, s)| {
                let options = setup.plan_options(&s.ds)?;
                let mut mark = s.mark.clone();
                mark.window = options.window_chunks as u64;
                Ok(PlanSource {
                    shape: s.shape.clone().take(s.mark.take),
                    options,
                    mark,
                })
            })
            .collect()
    }

    /// `shard`'s plan of `epoch` (what is left of it with `resume`).
    pub fn plan(&self, epoch: u64, shard: Shard, resume: Option<&MixState>) -> Result<MixPlan> {
        Ok(self.planned(epoch, shard, resume)?.1)
    }

    /// Every source's setup for `epoch`, and [`MixReader::plan`] with each source planned by
    /// its setup (importance sampling by its scores, when asked).
    fn planned(
        &self,
        epoch: u64,
        shard: Shard,
        resume: Option<&MixState>,
    ) -> Result<(Vec<crate::EpochSetup>, MixPlan)> {
        let setups = self.setups()?;
        for (setup, s) in setups.iter().zip(&self.mix.sources) {
            setup.check(&s.ds)?;
        }
        let part: &PartPlanner = &|i, sh, o, s, st| {
            setups[i]
                .plan_of(&self.mix.sources[i].ds, sh, o, epoch, s, st)
                .map_err(|e| format!("source {i} ({}): {e}", self.mix.name(i)))
        };
        let sources = self.plan_sources_of(&setups)?;
        let plan = MixPlan::build_with(&sources, epoch, shard, resume, part);
        Ok((setups, plan.map_err(ReadError::invalid)?))
    }

    /// `shard`'s stream of `epoch` (what is left of it with `resume`).
    pub fn stream(&self, epoch: u64, shard: Shard, resume: Option<&MixState>) -> Result<MixStream> {
        let (setups, plan) = self.planned(epoch, shard, resume)?;
        let len = plan.len();
        let pool = BufPool::new(self.memory.max(1) as usize);
        // Reads ahead in the order the interleave needs them, as many in flight as one
        // source's budget (what one dataset read alone has).
        let n = self.readers.len().max(1);
        let shared = SharedReadAhead::new(n, pool.clone(), self.memory as usize / n);
        let streams = plan
            .parts
            .into_iter()
            .zip(&self.readers)
            .zip(setups)
            .enumerate()
            .map(|(i, ((p, r), mut setup))| {
                let (first, count) = plan.order.position(i);
                setup.stream.shared = Some(ReadAheadSeat::new(shared.clone(), i, first, count));
                EpochStream::new(r.ds.clone(), p, setup.plan.mode, &setup.stream)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MixStream {
            pool,
            streams,
            order: plan.order,
            len,
            delivered: 0,
            done: false,
        })
    }

    /// A resume state for `epoch` at this configuration, nothing consumed yet, with every
    /// source's mark: what front ends fill with their counts.
    pub fn state(&self, epoch: u64, world_size: u32, num_workers: u32) -> Result<MixState> {
        Ok(MixState {
            epoch,
            world_size,
            num_workers,
            consumed: vec![0; (world_size * num_workers) as usize],
            sources: self.plan_sources()?.into_iter().map(|s| s.mark).collect(),
            column: None,
            then: None,
        })
    }
}

/// One shard's epoch of a mixture: its sources' streams, read in the plan's interleave. Each
/// sample carries its source ([`Sample::source`]). A source's stream that ends before the
/// plan says, or has samples past it, is an error, never a short epoch.
pub struct MixStream {
    /// The read buffers all its sources' streams share.
    pool: Arc<BufPool>,
    streams: Vec<EpochStream>,
    order: Interleave,
    len: u64,
    delivered: u64,
    done: bool,
}

impl MixStream {
    /// Samples the shard's plan holds (after any resume).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when it delivers nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn fail(&mut self, e: ReadError) -> Option<Result<Sample>> {
        self.done = true;
        Some(Err(e))
    }
}

impl Iterator for MixStream {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        if self.done {
            return None;
        }
        let Some(i) = self.order.next() else {
            // Every source must have ended too (its stream received its end).
            self.done = true;
            for (i, s) in self.streams.iter_mut().enumerate() {
                if let Some(x) = s.next() {
                    let e = x.err().unwrap_or_else(|| {
                        ReadError::Incomplete(format!(
                            "source {i} has samples past its part of the epoch"
                        ))
                    });
                    return self.fail(e);
                }
            }
            return None;
        };
        match self.streams[i].next() {
            Some(Ok(mut s)) => {
                s.source = i as u32;
                self.delivered += 1;
                Some(Ok(s))
            }
            Some(Err(e)) => self.fail(e),
            None => {
                let e = ReadError::Incomplete(format!(
                    "source {i}'s stream ended before its part of the epoch did; the epoch is \
                     incomplete after {} samples",
                    self.delivered
                ));
                self.fail(e)
            }
        }
    }
}

impl SampleStream for MixStream {
    fn parts(&self) -> &[EpochStream] {
        &self.streams
    }
    /// Of the read buffers the sources' streams share.
    fn peak_buffer_bytes(&self) -> u64 {
        self.pool.peak_in_use() as u64
    }
}

/// What one source gave a rank's epoch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SourceTotals {
    pub source: String,
    pub share: String,
    pub samples: u64,
    /// This source's part of the samples delivered.
    pub fraction: f64,
    pub bytes: u64,
    /// Order-independent digest of the source's samples (as `granary read` prints for a
    /// dataset alone).
    pub digest: String,
}

/// What one rank's epoch of a mixture delivered, summed over its workers: what a dataset's
/// epoch reports (`granary read`'s figures, over every source) and each source's part.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MixReport {
    #[serde(flatten)]
    pub report: EpochReport,
    pub sources: Vec<SourceTotals>,
}

/// Reads rank `rank`'s share of a mixture's epoch with `workers` loader workers (threads),
/// touching every byte; a worker's error ends the epoch with it.
pub fn read_mix_epoch(
    reader: &MixReader,
    epoch: u64,
    rank: u32,
    world_size: u32,
    workers: u32,
) -> Result<MixReport> {
    let tier = reader.readers.iter().any(|r| r.cache.is_some())
        && reader
            .readers
            .iter()
            .any(|r| r.options.shuffle != crate::ShuffleMode::Global);
    let shards = (rank, world_size, workers);
    let (report, mut per) = crate::epoch::read_shards(epoch, shards, tier, &|shard| {
        reader.stream(epoch, shard, None)
    })?;
    per.resize(reader.mix.len(), (0, 0, 0));
    let samples = report.samples;
    Ok(MixReport {
        report,
        sources: per
            .iter()
            .enumerate()
            .map(|(i, p)| SourceTotals {
                source: reader.mix.name(i).to_string(),
                share: reader.mix.share(i).to_string(),
                samples: p.0,
                fraction: p.0 as f64 / samples.max(1) as f64,
                bytes: p.1,
                digest: format!("{:016x}", p.2),
            })
            .collect(),
    })
}
