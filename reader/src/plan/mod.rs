//! Epoch plans: which samples a (rank, worker) reads in an epoch, in which order, grouped into
//! windows of chunks. A plan is a pure function of (dataset shape, options, epoch, shard,
//! resume state): every rank computes every other rank's plan identically, without messages.
//!
//! Steps: (1) the epoch's global sequence of samples (chunk-grouped for `chunkwise`);
//! (2) an equal-count cut per rank (drop or pad the remainder); (3) a contiguous split per
//! loader worker; (4) windows of W chunks, samples shuffled within each window.

mod keyed;
mod quality;

use std::ops::Range;

use granary_format::SplitMix64;

use crate::draws::Importance;
use crate::runs::ChunkRuns;

pub use keyed::KeyedPermutation;
use keyed::*;
pub use quality::{labels_from_class_counts, shuffle_quality, ShuffleQuality};

granary_format::named_enum! {
    /// How an epoch is ordered.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ShuffleMode ("shuffle mode") {
        /// Permute chunk order, read windows of W chunks, shuffle samples within each window.
        Chunkwise = "chunkwise",
        /// Fully random sample order (record-level reads).
        Global = "global",
        /// Snapshot order.
        Sequential = "sequential",
    }
}

/// Most samples per window in `global` mode (records are read one by one there; a window holds
/// as many as W chunks do on average).
pub const GLOBAL_WINDOW_SAMPLES: usize = 1024;

/// Options of a plan (the same on every rank and worker).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOptions {
    pub mode: ShuffleMode,
    pub seed: u64,
    /// Chunks per shuffle window (chunkwise and sequential modes).
    pub window_chunks: usize,
    /// Equal counts per rank: drop the remainder (true) or pad by repeating samples (false).
    pub drop_last: bool,
    /// Fraction of chunks reassigned between ranks each epoch, in [0, 1]; 1 = fully random.
    pub locality: f64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            mode: ShuffleMode::Chunkwise,
            seed: 0,
            window_chunks: 8,
            drop_last: true,
            locality: 1.0,
        }
    }
}

/// Which share of the epoch: a distributed rank and a loader worker inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub rank: u32,
    pub world_size: u32,
    pub worker: u32,
    pub num_workers: u32,
}

impl Shard {
    /// The whole dataset: one rank, one worker.
    pub const WHOLE: Shard = Shard::at((1, 1), 0);

    /// Shard `slot` (`rank * num_workers + worker`) of a configuration (ranks, workers).
    pub(crate) const fn at(config: (u32, u32), slot: u32) -> Shard {
        Shard {
            rank: slot / config.1,
            world_size: config.0,
            worker: slot % config.1,
            num_workers: config.1,
        }
    }

    fn check(&self) -> Result<(), String> {
        let (r, w, k, n) = (self.rank, self.world_size, self.worker, self.num_workers);
        if w == 0 || n == 0 {
            return Err(format!(
                "world size {w} with {n} workers: each must be at least 1"
            ));
        }
        if r >= w {
            return Err(format!("rank {r} is not in 0..{w}"));
        }
        if k >= n {
            return Err(format!("worker {k} is not in 0..{n}"));
        }
        Ok(())
    }
}

/// Where an epoch stands: the configuration that was reading it and how many samples each
/// (rank, worker) had consumed, indexed `rank * num_workers + worker`. Resuming with the same
/// configuration continues exactly; with another world size or worker count the rest of the
/// epoch is redistributed, never repeating or skipping a sample.
///
/// `column: Some(w)` is one loader worker's own state (as StatefulDataLoader keeps it): only
/// column `w`'s counts are known (ranks advance in lockstep). It resumes worker `w` of as many
/// workers: exactly at the same world size; at another, the rest of column `w` over all old
/// ranks is cut among the new ranks' workers `w`.
///
/// `then`: the epoch was resumed from this state under another configuration and read on
/// there before it was checkpointed again (see [`Continued`]).
///
/// `chunks: Some(c)`: the epoch was planned over the dataset's first `c` chunks (checkpointed
/// at an earlier generation) and is resumed as it was planned.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EpochState {
    pub epoch: u64,
    pub world_size: u32,
    pub num_workers: u32,
    pub consumed: Vec<u64>,
    pub column: Option<u32>,
    pub then: Option<Continued>,
    pub chunks: Option<u32>,
}

/// How far an epoch resumed under another configuration got there: the configuration and how
/// many samples each of its (rank, worker) delivered of its resumed plan. Such a state resumes
/// at that configuration (each shard skips its count of the resumed plan); a third
/// configuration within one epoch is refused, naming the one to use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Continued {
    pub world_size: u32,
    pub num_workers: u32,
    pub consumed: Vec<u64>,
}

impl Continued {
    /// How many samples `shard` delivered of its resumed plan, or why `shard` cannot go on
    /// from this state.
    pub fn done_by(&self, shard: &Shard) -> Result<u64, String> {
        if (shard.world_size, shard.num_workers) != (self.world_size, self.num_workers)
            || self.consumed.len() != (self.world_size * self.num_workers) as usize
        {
            return Err(format!(
                "this epoch was resumed at world size {} with {} loader workers and checkpointed \
                 there; resume it with that configuration (not world size {} with {} workers: \
                 a third configuration within one epoch is not supported), or at the next epoch",
                self.world_size, self.num_workers, shard.world_size, shard.num_workers
            ));
        }
        Ok(self.consumed[(shard.rank * shard.num_workers + shard.worker) as usize])
    }
}

/// The shape of a dataset that plans depend on: the sample range of every chunk.
#[derive(Clone, Debug)]
pub struct DatasetShape {
    /// `first[c]` is chunk c's first sample id; `first[C]` is the sample count.
    first: Vec<u64>,
    /// `guide[b]` is the chunk holding sample `b << shift` (about one entry per chunk): where
    /// [`DatasetShape::chunk_of`]'s search starts, touching a few entries of `first` instead
    /// of ~log2(C) scattered ones (a global plan asks it for every sample).
    guide: Vec<u32>,
    shift: u32,
    /// Of a view ([`DatasetShape::select`]): the dataset sample id of each position, rising.
    /// Plans are computed over positions and hand out these ids.
    ids: Option<std::sync::Arc<[u64]>>,
    /// Of a mixture's source: the samples an epoch delivers ([`DatasetShape::take`]).
    take: Option<u64>,
    /// Positions plans skip as they hand samples out ([`DatasetShape::without`]): samples
    /// deleted since the epoch a resume state continues was planned, rising.
    dropped: Option<std::sync::Arc<[u64]>>,
}

impl DatasetShape {
    /// From the chunk sample counts, in chunk order.
    pub fn from_counts(counts: impl IntoIterator<Item = u64>) -> Self {
        let mut first = vec![0];
        for c in counts {
            first.push(first.last().unwrap() + c);
        }
        let (chunks, n) = (first.len() as u64 - 1, *first.last().unwrap());
        // Buckets of 2^shift samples, about as many as chunks.
        let shift = (n / chunks.max(1)).max(1).ilog2();
        let buckets = if n == 0 { 0 } else { ((n - 1) >> shift) + 1 };
        let mut guide = Vec::with_capacity(buckets as usize);
        let mut c = 0usize;
        for b in 0..buckets {
            while first[c + 1] <= b << shift {
                c += 1;
            }
            guide.push(c as u32);
        }
        DatasetShape {
            first,
            guide,
            shift,
            ids: None,
            take: None,
            dropped: None,
        }
    }

    /// This shape, with the dataset samples `ids` (rising) left out of every plan made of it
    /// after the plan is cut and resumed: an epoch planned before they were deleted, resumed
    /// after (its order, shares and resume counts are the epoch's as planned; the samples
    /// deleted since are not delivered).
    pub fn without(mut self, ids: &[u64]) -> DatasetShape {
        let pos: Vec<u64> = match &self.ids {
            None => ids
                .iter()
                .copied()
                .filter(|&i| i < self.samples())
                .collect(),
            Some(sel) => ids
                .iter()
                .filter_map(|i| sel.binary_search(i).ok().map(|p| p as u64))
                .collect(),
        };
        self.dropped = (!pos.is_empty()).then(|| pos.into());
        self
    }

    /// `p` (a plan of positions of this shape) without the positions [`DatasetShape::without`]
    /// dropped, its windows re-cut around what is left.
    fn drop_from(&self, mut p: EpochPlan) -> EpochPlan {
        let Some(gone) = &self.dropped else {
            return p;
        };
        let keep = |s: &u64| gone.binary_search(s).is_err();
        let mut samples = Vec::with_capacity(p.samples.len());
        let mut weights = Vec::new();
        let mut windows = Vec::with_capacity(p.windows.len());
        for w in &p.windows {
            let start = samples.len();
            for k in w.range.clone() {
                if keep(&p.samples[k]) {
                    samples.push(p.samples[k]);
                    if let Some(&x) = p.weights.get(k) {
                        weights.push(x);
                    }
                }
            }
            if samples.len() > start {
                let mut chunks: Vec<u32> =
                    samples[start..].iter().map(|&s| self.chunk_of(s)).collect();
                chunks.sort_unstable();
                chunks.dedup();
                windows.push(Window {
                    range: start..samples.len(),
                    chunks,
                });
            }
        }
        (p.samples, p.windows, p.weights) = (samples, windows, weights);
        p
    }

    /// This shape with epochs of `n` samples (what a mixture asks of each source): the first
    /// `n` of the epoch's order when `n` is below the sample count, otherwise passes over every
    /// sample, each in an order of its own (the first in the epoch's usual order).
    pub fn take(mut self, n: u64) -> DatasetShape {
        self.take = Some(n);
        self
    }

    /// Samples an epoch delivers before the cut per rank: the sample count, or what
    /// [`DatasetShape::take`] set.
    pub fn epoch_len(&self) -> u64 {
        self.take.unwrap_or_else(|| self.samples())
    }

    /// Passes over the samples an epoch makes (at least one).
    fn passes(&self) -> u64 {
        match self.samples() {
            0 => 1,
            n => self.epoch_len().div_ceil(n).max(1),
        }
    }

    /// The shape of the first `chunks` chunks (what a dataset was before generations were
    /// appended to it: appends keep every chunk and sample id).
    pub fn prefix(&self, chunks: u32) -> DatasetShape {
        let counts = (0..chunks.min(self.chunks())).map(|c| self.chunk_len(c));
        let mut s = DatasetShape::from_counts(counts);
        if let Some(ids) = &self.ids {
            let n = s.samples() as usize;
            s.ids = Some(ids[..n].into());
        }
        s.take = self.take;
        s
    }

    /// The shape of the samples `ids` (rising, each below [`DatasetShape::samples`]) of this
    /// dataset: each chunk holds its selected samples, numbered 0..ids.len() in id order.
    pub fn select(&self, ids: std::sync::Arc<[u64]>) -> DatasetShape {
        let mut counts = vec![0u64; self.chunks() as usize];
        for &id in ids.iter() {
            counts[self.chunk_of(id) as usize] += 1;
        }
        DatasetShape {
            ids: Some(ids),
            take: self.take,
            ..Self::from_counts(counts)
        }
    }

    /// The chunk holding dataset sample `id` (what a plan hands out; through a view, a selected
    /// sample's id, or `None` for one the view does not hold).
    pub fn chunk_of_sample(&self, id: u64) -> Option<u32> {
        match &self.ids {
            None => (id < self.samples()).then(|| self.chunk_of(id)),
            Some(ids) => ids
                .binary_search(&id)
                .ok()
                .map(|pos| self.chunk_of(pos as u64)),
        }
    }

    pub fn samples(&self) -> u64 {
        *self.first.last().unwrap()
    }

    pub fn chunks(&self) -> u32 {
        (self.first.len() - 1) as u32
    }

    pub fn chunk_samples(&self, c: u32) -> Range<u64> {
        self.first[c as usize]..self.first[c as usize + 1]
    }

    /// Samples in chunk `c`.
    pub(crate) fn chunk_len(&self, c: u32) -> u64 {
        self.first[c as usize + 1] - self.first[c as usize]
    }

    /// The chunk holding sample `id`.
    pub fn chunk_of(&self, id: u64) -> u32 {
        let b = (id >> self.shift) as usize;
        let Some(&lo) = self.guide.get(b) else {
            // Past the last bucket: as the plain search over the chunk starts says.
            return (self.first.partition_point(|&f| f <= id) - 1) as u32;
        };
        // Sample `id` lies in a chunk from guide[b] to guide[b + 1] (that one included).
        let hi = self
            .guide
            .get(b + 1)
            .map_or(self.first.len(), |&h| h as usize + 1);
        lo + self.first[lo as usize + 1..hi].partition_point(|&f| f <= id) as u32
    }
}

/// A run of the plan read together: its chunks and its samples (already in delivery order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Positions in [`EpochPlan::samples`].
    pub range: Range<usize>,
    /// Chunks holding the window's samples, ascending.
    pub chunks: Vec<u32>,
}

/// One shard's plan for one epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochPlan {
    pub epoch: u64,
    /// Sample ids in delivery order.
    pub samples: Vec<u64>,
    pub windows: Vec<Window>,
    /// Importance-sampling weight 1/(N·p) of each sample in `samples` (empty for uniform
    /// plans): multiply the sample's loss by it to keep the gradient unbiased.
    pub weights: Vec<f32>,
}

/// Importance sampling (opt-in): each epoch draws N samples with replacement, sample i with
/// probability p_i = (1 − α)/N + α · s_i·b_i / Σ s·b, where s is the importance score and b is
/// `cache_boost` for samples in the local cache tier (1 otherwise). Every sample keeps at least
/// the floor (1 − α)/N. Every rank must pass the same scores (a snapshot taken at the epoch
/// boundary) so that plans stay identical everywhere.
pub struct Sampling<'a> {
    pub scores: &'a crate::ImportanceScores,
    /// Mix between uniform (0) and score-proportional (→ 1); must be < 1.
    pub alpha: f64,
    /// Which samples the local tier holds, and how much to favour them.
    pub cached: Option<&'a (dyn Fn(u64) -> bool + Sync)>,
    pub cache_boost: f64,
}

impl Sampling<'_> {
    /// Sample `i`'s mass: its score times the cache boost if the tier holds it.
    pub fn mass(&self, i: u64) -> f64 {
        let b = match self.cached {
            Some(c) if c(i) => self.cache_boost.max(0.0),
            _ => 1.0,
        };
        self.scores.score(i).max(0.0) * b
    }
}

/// Each chunk's home rank under locality < 1: a seeded permutation of the chunks cut into
/// contiguous blocks of ~N/world samples (a chunk goes where its middle sample falls).
fn home_ranks(shape: &DatasetShape, o: &PlanOptions, world: u32) -> Vec<u32> {
    let mut chunks: Vec<u32> = (0..shape.chunks()).collect();
    SplitMix64::keyed(&[o.seed, TAG_HOME]).shuffle(&mut chunks);
    rank_by_middle(shape, &chunks, shape.samples(), world)
}

/// For chunks listed in `order` (their samples back to back), the rank whose block of
/// `per_rank_total / world`-sized positions holds each chunk's middle sample.
fn rank_by_middle(shape: &DatasetShape, order: &[u32], total: u64, world: u32) -> Vec<u32> {
    let n = total.max(1);
    let mut rank = vec![0u32; shape.chunks() as usize];
    let mut acc = 0u64;
    for &c in order {
        let len = shape.chunk_len(c);
        let mid = acc + len / 2;
        rank[c as usize] = ((mid as u128 * world as u128 / n as u128) as u32).min(world - 1);
        acc += len;
    }
    rank
}

/// Which rank reads each chunk: with locality < 1 its home rank (the one that reads it in most
/// epochs), otherwise the rank whose share of `epoch`'s uniform plan holds most of it (the
/// middle of its run of samples). Global plans spread every chunk over all ranks; there each
/// chunk gets a seeded rank, balanced by sample count. The same on every rank: a node can tell
/// which node's tier should keep a chunk without asking.
pub fn chunk_readers(shape: &DatasetShape, o: &PlanOptions, epoch: u64, world: u32) -> Vec<u32> {
    let world = world.max(1);
    if o.locality < 1.0 && world > 1 {
        return home_ranks(shape, o, world);
    }
    let order = match o.mode {
        ShuffleMode::Global => {
            let mut v: Vec<u32> = (0..shape.chunks()).collect();
            SplitMix64::keyed(&[o.seed, epoch, TAG_HOME]).shuffle(&mut v);
            v
        }
        _ => pass_order(shape, o, epoch, world),
    };
    // The per-rank cut: `n / world` samples each (drop_last), the remainder to no one; its
    // chunks count as the last rank's.
    let per = rank_positions(shape.samples(), world, 0, o.drop_last).end;
    rank_by_middle(shape, &order, per.max(1) * world as u64, world)
}

/// Checks that a resume state of configuration `old` (ranks, workers) lists a count for every
/// shard of it.
pub(crate) fn check_counts(old: (u32, u32), consumed: &[u64]) -> Result<(), String> {
    if old.0 == 0 || old.1 == 0 || consumed.len() != (old.0 * old.1) as usize {
        return Err(format!(
            "resume state lists {} counts for {} ranks x {} workers",
            consumed.len(),
            old.0,
            old.1
        ));
    }
    Ok(())
}

/// Rank `rank`'s equal-count share of `seq`: `len / world` samples (drop_last) or
/// `ceil(len / world)` (pad: positions past the end wrap to the start).
#[cfg(test)]
fn cut_rank(seq: &[u64], world: u32, rank: u32, drop_last: bool) -> Vec<u64> {
    let n = seq.len();
    rank_positions(n as u64, world, rank, drop_last)
        .map(|p| seq[(p % n as u64) as usize])
        .collect()
}

/// The positions of a sequence of `n` that rank `rank` takes (see [`cut_rank`]); past `n`
/// when padding (they wrap to the start).
fn rank_positions(n: u64, world: u32, rank: u32, drop_last: bool) -> Range<u64> {
    if n == 0 {
        return 0..0;
    }
    let w = u64::from(world);
    let per = if drop_last { n / w } else { n.div_ceil(w) };
    u64::from(rank) * per..(u64::from(rank) + 1) * per
}

/// Worker `k`'s contiguous part of a rank's share.
#[cfg(test)]
fn split_worker(seq: &[u64], workers: u32, k: u32) -> &[u64] {
    let r = worker_range(seq.len() as u64, workers, k);
    &seq[r.start as usize..r.end as usize]
}

/// Where worker `k`'s part lies in a share of `len` samples.
fn worker_range(len: u64, workers: u32, k: u32) -> Range<u64> {
    let (kk, k) = (u64::from(workers), u64::from(k));
    let (base, rem) = (len / kk, len % kk);
    let start = k * base + k.min(rem);
    start..start + base + u64::from(k < rem)
}

/// The positions of a sequence of `n` that `shard` takes: its worker's part of its rank's
/// share (past `n` when padding).
pub(crate) fn shard_positions(n: u64, shard: &Shard, drop_last: bool) -> Range<u64> {
    let ranks = rank_positions(n, shard.world_size, shard.rank, drop_last);
    let part = worker_range(ranks.end - ranks.start, shard.num_workers, shard.worker);
    ranks.start + part.start..ranks.start + part.end
}

/// Every shard of configuration `old` (ranks, workers) of a sequence of `n`: the shard, its
/// positions and the first it had not delivered (`consumed`: each shard's count).
fn old_shards(
    n: u64,
    old: (u32, u32),
    drop_last: bool,
    consumed: &[u64],
) -> impl Iterator<Item = (Shard, Range<u64>, u64)> + '_ {
    (0..old.0 * old.1).map(move |i| {
        let s = Shard::at(old, i);
        let pos = shard_positions(n, &s, drop_last);
        let from = pos.start + consumed[i as usize].min(pos.end - pos.start);
        (s, pos, from)
    })
}

/// `shard`'s part of a global epoch, evaluated position by position (O(share) memory).
fn global_part(shape: &DatasetShape, o: &PlanOptions, epoch: u64, shard: &Shard) -> Vec<u64> {
    let g = GlobalOrder::new(shape, o, epoch);
    shard_positions(g.len, shard, o.drop_last)
        .map(|i| g.at(i))
        .collect()
}

/// A global epoch's sequence, position by position: the epoch's permutation, or for a shape
/// that takes another count ([`DatasetShape::take`]) the start of it, or passes over the
/// samples with a permutation each.
struct GlobalOrder {
    samples: u64,
    len: u64,
    passes: Vec<KeyedPermutation>,
}

impl GlobalOrder {
    fn new(shape: &DatasetShape, o: &PlanOptions, epoch: u64) -> Self {
        let (samples, len) = (shape.samples(), shape.epoch_len());
        let passes = (0..shape.passes())
            .map(|p| match p {
                0 => KeyedPermutation::new(samples, &[o.seed, epoch, TAG_GLOBAL]),
                _ => KeyedPermutation::new(samples, &[o.seed, epoch, TAG_GLOBAL, p]),
            })
            .collect();
        GlobalOrder {
            samples,
            len,
            passes,
        }
    }

    /// The sample at position `i` (past the end: wrapped to the start, as padding does).
    fn at(&self, i: u64) -> u64 {
        let i = i % self.len;
        self.passes[(i / self.samples) as usize].at(i % self.samples)
    }
}

/// The chunk order of an epoch read chunk by chunk, with as many passes over the chunks as
/// the shape's epoch needs ([`DatasetShape::take`]): the first in the epoch's order
/// (sequential: chunk ids), the others each in a seeded order of its own.
fn pass_order(shape: &DatasetShape, o: &PlanOptions, epoch: u64, world: u32) -> Vec<u32> {
    let mut order: Vec<u32> = match o.mode {
        ShuffleMode::Sequential => (0..shape.chunks()).collect(),
        _ => chunk_order(shape, o, epoch, world),
    };
    for pass in 1..shape.passes() {
        let mut next: Vec<u32> = (0..shape.chunks()).collect();
        if o.mode != ShuffleMode::Sequential {
            SplitMix64::keyed(&[o.seed, epoch, TAG_CHUNKS, pass]).shuffle(&mut next);
        }
        order.extend(next);
    }
    order
}

/// The generator that shuffles window `index` of `shard`'s chunk-wise plan.
fn window_rng(o: &PlanOptions, epoch: u64, shard: &Shard, index: u64) -> SplitMix64 {
    let (rank, worker) = (shard.rank.into(), shard.worker.into());
    SplitMix64::keyed(&[o.seed, epoch, TAG_WINDOW, rank, worker, index])
}

/// Groups a shard's sequence into windows and shuffles within chunkwise windows.
fn windows(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    shard: &Shard,
    mut seq: Vec<u64>,
) -> EpochPlan {
    let mut windows = Vec::new();
    let mut start = 0;
    let w = o.window_chunks.max(1);
    // A global window holds as many records as W chunks do on average: the same bytes per
    // window as a chunk-wise plan, so the same memory budget holds (the order does not depend
    // on it).
    let per_chunk = (shape.samples() / u64::from(shape.chunks()).max(1)).max(1) as usize;
    let size = w.saturating_mul(per_chunk).clamp(1, GLOBAL_WINDOW_SAMPLES);
    while start < seq.len() {
        let mut chunks: Vec<u32> = Vec::new();
        let mut end = start;
        if o.mode == ShuffleMode::Global {
            end = (start + size).min(seq.len());
            chunks.extend(seq[start..end].iter().map(|&s| shape.chunk_of(s)));
        } else {
            // W runs of consecutive samples from the same chunk.
            while end < seq.len() {
                let c = shape.chunk_of(seq[end]);
                if chunks.last() != Some(&c) {
                    if chunks.len() == w {
                        break;
                    }
                    chunks.push(c);
                }
                end += 1;
            }
        }
        if o.mode == ShuffleMode::Chunkwise {
            window_rng(o, epoch, shard, windows.len() as u64).shuffle(&mut seq[start..end]);
        }
        chunks.sort_unstable();
        chunks.dedup();
        windows.push(Window {
            range: start..end,
            chunks,
        });
        start = end;
    }
    EpochPlan {
        epoch,
        samples: seq,
        windows,
        weights: Vec::new(),
    }
}

/// The full plan of `shard` for `epoch`, ignoring any resume state.
fn fresh(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    shard: &Shard,
    probs: Option<&Importance>,
) -> EpochPlan {
    let part = if probs.is_none() && o.mode == ShuffleMode::Global {
        global_part(shape, o, epoch, shard)
    } else {
        // The epoch is whole chunks in a chunk order: take this shard's positions straight
        // from it (O(chunks + share) memory) instead of building every rank's sequence (8
        // bytes per sample of the dataset: 8 GB on every rank at a billion samples).
        let mut seq = chunk_runs(shape, o, epoch, shard.world_size, probs);
        seq.at(shard_positions(seq.len(), shard, o.drop_last))
    };
    windows(shape, o, epoch, shard, part)
}

/// The sequence of an epoch read chunk by chunk by `world` ranks: uniform epochs list every
/// chunk's samples in the epoch's chunk order (chunk ids when sequential), importance-sampled
/// epochs the draws that fall in every chunk, in the epoch's chunk order.
fn chunk_runs<'a>(
    shape: &'a DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    world: u32,
    probs: Option<&'a Importance<'a>>,
) -> ChunkRuns<'a> {
    if probs.is_some() {
        return ChunkRuns::new(chunk_order(shape, o, epoch, world), &shape.first, probs);
    }
    let mut runs = ChunkRuns::new(pass_order(shape, o, epoch, world), &shape.first, None);
    runs.truncate(shape.epoch_len());
    runs
}

/// What the shards of configuration `old` (ranks, workers) had not delivered of an epoch
/// (`consumed`: each shard's count), in their order; regrouped by chunk in the epoch's chunk
/// order when the epoch reads chunk by chunk. Builds every old shard's plan: 8 bytes per
/// sample left (the reference that [`global_rest_part`] and [`chunk_rest_part`] are tested
/// against, and what a resume after a deletion cuts).
fn regrouped_rest(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    old: (u32, u32),
    consumed: &[u64],
    probs: Option<&Importance>,
) -> Vec<u64> {
    let mut rest = Vec::new();
    for r in 0..old.0 {
        for k in 0..old.1 {
            let s = Shard {
                rank: r,
                world_size: old.0,
                worker: k,
                num_workers: old.1,
            };
            let p = fresh(shape, o, epoch, &s, probs);
            let done = (consumed[(r * old.1 + k) as usize] as usize).min(p.samples.len());
            rest.extend_from_slice(&p.samples[done..]);
        }
    }
    if o.mode != ShuffleMode::Global || probs.is_some() {
        // The old epoch's chunk order: importance draws and chunk-wise epochs follow the
        // shuffled order, sequential ones the chunk ids.
        let order: Vec<u32> = match (o.mode, probs) {
            (ShuffleMode::Sequential, None) => (0..shape.chunks()).collect(),
            _ => chunk_order(shape, o, epoch, old.0),
        };
        let mut chunk_pos = vec![0usize; shape.chunks() as usize];
        for (i, &c) in order.iter().enumerate() {
            chunk_pos[c as usize] = i;
        }
        rest.sort_by_key(|&s| (chunk_pos[shape.chunk_of(s) as usize], s));
    }
    rest
}

/// `shard`'s part of what the shards of configuration `old` had not delivered of a global
/// epoch, without building it: each old shard's rest is a run of positions of the epoch's
/// permutation, so the new part is found among the runs and evaluated position by position
/// (O(old shards + part) memory; the same samples as cutting [`regrouped_rest`]).
fn global_rest_part(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    shard: &Shard,
    old: (u32, u32),
    consumed: &[u64],
) -> Vec<u64> {
    let g = GlobalOrder::new(shape, o, epoch);
    let (mut segments, mut total) = (Vec::new(), 0u64);
    for (_, pos, from) in old_shards(g.len, old, o.drop_last, consumed) {
        if from < pos.end {
            segments.push((total, from, pos.end - from, 1));
            total += pos.end - from;
        }
    }
    let part = shard_positions(total, shard, o.drop_last);
    cut_rest(&segments, total, part, |r, out| {
        out.extend(r.map(|p| g.at(p)))
    })
}

/// `shard`'s part of what the shards of configuration `old` had not delivered of an epoch read
/// chunk by chunk, without gathering it. Each old shard's rest is what its current window
/// had not delivered (shuffled over the window) and a run of positions of the epoch's
/// sequence; listed in sequence order (chunk order, then ids) they are cut for the new shards
/// and evaluated position by position. O(old shards x window + chunks + part) memory; the
/// same samples as cutting [`regrouped_rest`].
fn chunk_rest_part(
    shape: &DatasetShape,
    o: &PlanOptions,
    epoch: u64,
    shard: &Shard,
    old: (u32, u32),
    consumed: &[u64],
    probs: Option<&Importance>,
) -> Vec<u64> {
    let mut seq = chunk_runs(shape, o, epoch, old.0, probs);
    let n = seq.len();
    // Positions of the sequence left, each listed once for every old shard that had it left
    // (padding repeats positions).
    let mut pieces: Vec<Range<u64>> = Vec::new();
    for (s, pos, from) in old_shards(n, old, o.drop_last, consumed) {
        let mut run = from..pos.end;
        if o.mode == ShuffleMode::Chunkwise && from < pos.end {
            // Its current window was shuffled: what it had not delivered is scattered.
            let (index, win) = seq.window_at(pos, o.window_chunks.max(1), from);
            let mut left: Vec<u64> = win.clone().map(|p| p % n).collect();
            window_rng(o, epoch, &s, index).shuffle(&mut left);
            pieces.extend(
                left[(from - win.start) as usize..]
                    .iter()
                    .map(|&q| q..q + 1),
            );
            run = win.end..run.end;
        }
        let mut p = run.start;
        while p < run.end {
            let (q, take) = (p % n, (run.end - p).min(n - p % n));
            pieces.push(q..q + take);
            p += take;
        }
    }
    // Sweep them into segments of positions listed the same number of times: (index of the
    // segment's first sample in the rest, first position, positions, times).
    let mut ends: Vec<(u64, i64)> = pieces
        .iter()
        .flat_map(|p| [(p.start, 1), (p.end, -1)])
        .collect();
    drop(pieces);
    ends.sort_unstable();
    let (mut segments, mut total, mut times) = (Vec::new(), 0u64, 0i64);
    for (i, &(at, d)) in ends.iter().enumerate() {
        times += d;
        let next = ends.get(i + 1).map_or(at, |e| e.0);
        if next > at && times > 0 {
            segments.push((total, at, next - at, times as u64));
            total += (next - at) * times as u64;
        }
    }
    let part = shard_positions(total, shard, o.drop_last);
    cut_rest(&segments, total, part, |r, out| seq.extend(r, out))
}

/// The samples at positions `part` (wrapping past `total`: padding) of a rest of `total`
/// samples listed as `segments`: (index of the segment's first sample in the rest, its first
/// position in the epoch's sequence, positions, times each is listed). `extend` appends the
/// sample ids at a range of positions of the sequence.
fn cut_rest(
    segments: &[(u64, u64, u64, u64)],
    total: u64,
    part: Range<u64>,
    mut extend: impl FnMut(Range<u64>, &mut Vec<u64>),
) -> Vec<u64> {
    let Range { start: mut i, end } = part;
    let mut out = Vec::with_capacity((end - i) as usize);
    while i < end {
        // Index `j` of the rest (wrapping past its end: padding).
        let j = i % total;
        let s = segments.partition_point(|s| s.0 <= j) - 1;
        let (at, pos, len, times) = segments[s];
        let take = (end - i).min(at + len * times - j);
        if times == 1 {
            extend(pos + (j - at)..pos + (j - at) + take, &mut out);
        } else {
            for t in j..j + take {
                let q = pos + (t - at) / times;
                extend(q..q + 1, &mut out);
            }
        }
        i += take;
    }
    out
}

impl EpochPlan {
    /// Builds `shard`'s plan for `epoch`; with `resume`, only what is left of the epoch.
    pub fn build(
        shape: &DatasetShape,
        o: &PlanOptions,
        epoch: u64,
        shard: Shard,
        resume: Option<&EpochState>,
    ) -> Result<EpochPlan, String> {
        Self::build_sampled(shape, o, epoch, shard, resume, None)
    }

    /// [`EpochPlan::build`] with importance sampling: the epoch draws N samples as `sampling`
    /// says (chunk-grouped, windowed, partitioned and resumable like uniform plans) and
    /// [`EpochPlan::weights`] carries each drawn sample's weight 1/(N·p).
    pub fn build_sampled(
        shape: &DatasetShape,
        o: &PlanOptions,
        epoch: u64,
        shard: Shard,
        resume: Option<&EpochState>,
        sampling: Option<&Sampling>,
    ) -> Result<EpochPlan, String> {
        if let Some(sm) = sampling {
            if shape.ids.is_some() {
                return Err(
                    "importance sampling through a view, or of a dataset with deleted \
                            samples, is not supported yet: sample the whole dataset, or make a \
                            dataset of the samples"
                        .into(),
                );
            }
            if !(0.0..1.0).contains(&sm.alpha) {
                return Err(format!("alpha {} is not in [0, 1)", sm.alpha));
            }
            if sm.scores.len() != shape.samples() {
                return Err(format!(
                    "{} scores for {} samples",
                    sm.scores.len(),
                    shape.samples()
                ));
            }
        }
        // The chunks' draw counts are computed once and shared by every step (the
        // redistribution after a resume rebuilds several old shards' plans).
        let key = [o.seed, epoch, TAG_IMPORTANCE];
        let mass = |i: u64| sampling.map_or(1.0, |sm| sm.mass(i));
        // A mixture's source draws its epoch count.
        let imp =
            sampling.map(|sm| Importance::new(&mass, sm.alpha, &shape.first, &key, shape.take));
        let mut p = Self::build_inner(shape, o, epoch, shard, resume, imp.as_ref())?;
        if let Some(imp) = &imp {
            let n = shape.samples() as f64;
            p.weights = p
                .samples
                .iter()
                .map(|&s| (1.0 / (n * imp.p(s))) as f32)
                .collect();
        }
        // Through a view the plan was made over positions: hand out the samples' ids.
        if let Some(ids) = &shape.ids {
            for s in &mut p.samples {
                *s = ids[*s as usize];
            }
        }
        Ok(p)
    }

    fn build_inner(
        shape: &DatasetShape,
        o: &PlanOptions,
        epoch: u64,
        shard: Shard,
        resume: Option<&EpochState>,
        probs: Option<&Importance>,
    ) -> Result<EpochPlan, String> {
        shard.check()?;
        if !(0.0..=1.0).contains(&o.locality) {
            return Err(format!("locality {} is not in [0, 1]", o.locality));
        }
        let Some(st) = resume else {
            return Ok(shape.drop_from(fresh(shape, o, epoch, &shard, probs)));
        };
        if let Some(then) = &st.then {
            // Resumed under `then`'s configuration first: this shard's part of that, less
            // what it delivered there.
            let done = then.done_by(&shard)?;
            let first = EpochState {
                then: None,
                chunks: None,
                ..st.clone()
            };
            let mut p = Self::build_inner(shape, o, epoch, shard, Some(&first), probs)?;
            p.skip_positions(shape, done as usize);
            return Ok(p);
        }
        if st.epoch != epoch {
            return Err(format!(
                "resume state is for epoch {}, not {epoch}",
                st.epoch
            ));
        }
        let old = (st.world_size, st.num_workers);
        check_counts(old, &st.consumed)?;
        if let Some(col) = st.column {
            if col >= old.1 || shard.num_workers != old.1 || shard.worker != col {
                return Err(format!(
                    "resume state of loader worker {col} of {} (one worker's own state, as \
                     StatefulDataLoader keeps them) resumes worker {col} of {} workers, not \
                     worker {} of {}",
                    old.1, old.1, shard.worker, shard.num_workers
                ));
            }
        }
        if old == (shard.world_size, shard.num_workers) && shape.dropped.is_none() {
            // Same configuration: continue exactly where this shard stopped.
            let mut p = fresh(shape, o, epoch, &shard, probs);
            let done = st.consumed[(shard.rank * shard.num_workers + shard.worker) as usize];
            p.skip_positions(shape, done as usize);
            return Ok(shape.drop_from(p));
        }
        // Another configuration: what the old shards had not delivered yet is cut again for
        // the new ranks and workers; of a worker's own state, what its column had not
        // delivered, for the new ranks' workers of that index (the other columns count as
        // delivered: their workers cut theirs).
        let known = |i: usize| st.column.is_none_or(|col| i as u32 % old.1 == col);
        let consumed: Vec<u64> = (st.consumed.iter().enumerate())
            .map(|(i, &c)| if known(i) { c } else { u64::MAX })
            .collect();
        let cut = match st.column {
            None => shard,
            Some(_) => Shard::at((shard.world_size, 1), shard.rank),
        };
        let part = match (&shape.dropped, o.mode, probs) {
            // Samples deleted since the epoch was planned: its rest without them, cut equally
            // (at any configuration, the same one included: every share stays equal).
            (Some(gone), ..) => {
                let mut rest = regrouped_rest(shape, o, epoch, old, &consumed, probs);
                rest.retain(|p| gone.binary_search(p).is_err());
                let n = rest.len() as u64;
                let at = shard_positions(n, &cut, o.drop_last);
                at.map(|p| rest[(p % n.max(1)) as usize]).collect()
            }
            (None, ShuffleMode::Global, None) => {
                global_rest_part(shape, o, epoch, &cut, old, &consumed)
            }
            _ => chunk_rest_part(shape, o, epoch, &cut, old, &consumed, probs),
        };
        Ok(windows(shape, o, epoch, &shard, part))
    }

    /// Drops the first `n` samples (already consumed); windows are trimmed and re-based.
    pub fn skip(&mut self, shape: &DatasetShape, n: usize) {
        self.skip_with(n, |s| shape.chunk_of_sample(s));
    }

    /// [`EpochPlan::skip`] of a plan still made of `shape`'s positions (not yet dataset ids).
    fn skip_positions(&mut self, shape: &DatasetShape, n: usize) {
        self.skip_with(n, |s| Some(shape.chunk_of(s)));
    }

    fn skip_with(&mut self, n: usize, chunk_of: impl Fn(u64) -> Option<u32>) {
        let n = n.min(self.samples.len());
        self.samples.drain(..n);
        self.windows.retain(|w| w.range.end > n);
        for w in &mut self.windows {
            w.range = w.range.start.saturating_sub(n)..w.range.end - n;
        }
        if let Some(w) = self.windows.first_mut() {
            let mut cs: Vec<u32> = self.samples[w.range.clone()]
                .iter()
                .filter_map(|&s| chunk_of(s))
                .collect();
            cs.sort_unstable();
            cs.dedup();
            w.chunks = cs;
        }
    }

    /// Number of samples in the plan.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when the plan delivers nothing.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

#[cfg(test)]
mod tests;
