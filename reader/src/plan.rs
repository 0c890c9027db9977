//! Epoch plans: which samples a (rank, worker) reads in an epoch, in which order, grouped into
//! windows of chunks. A plan is a pure function of (dataset shape, options, epoch, shard,
//! resume state): every rank computes every other rank's plan identically, without messages.
//!
//! Steps: (1) the epoch's global sequence of samples (chunk-grouped for `chunkwise`);
//! (2) an equal-count cut per rank (drop or pad the remainder); (3) a contiguous split per
//! loader worker; (4) windows of W chunks, samples shuffled within each window.

use std::collections::HashMap;
use std::ops::Range;

use granary_format::SplitMix64;

use crate::draws::Importance;
use crate::runs::{ChunkRuns, RunIds};

/// How an epoch is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShuffleMode {
    /// Permute chunk order, read windows of W chunks, shuffle samples within each window.
    Chunkwise,
    /// Fully random sample order (record-level reads).
    Global,
    /// Snapshot order.
    Sequential,
}

impl ShuffleMode {
    /// Parses `chunkwise`, `global` or `sequential`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "chunkwise" => Ok(ShuffleMode::Chunkwise),
            "global" => Ok(ShuffleMode::Global),
            "sequential" => Ok(ShuffleMode::Sequential),
            _ => Err(format!(
                "unknown shuffle mode {s:?}: use chunkwise, global or sequential"
            )),
        }
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
    pub const WHOLE: Shard = Shard {
        rank: 0,
        world_size: 1,
        worker: 0,
        num_workers: 1,
    };

    fn check(&self) -> Result<(), String> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(format!(
                "rank {} is not in 0..{}",
                self.rank, self.world_size
            ));
        }
        if self.num_workers == 0 || self.worker >= self.num_workers {
            return Err(format!(
                "worker {} is not in 0..{}",
                self.worker, self.num_workers
            ));
        }
        Ok(())
    }
}

/// Where an epoch stands: the configuration that was reading it and how many samples each
/// (rank, worker) had consumed, indexed `rank * num_workers + worker`. A small state: resuming
/// from it with the same configuration continues exactly; with another world size or worker
/// count the rest of the epoch is redistributed, never repeating or skipping a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochState {
    pub epoch: u64,
    pub world_size: u32,
    pub num_workers: u32,
    pub consumed: Vec<u64>,
}

/// The shape of a dataset that plans depend on: the sample range of every chunk.
#[derive(Clone, Debug)]
pub struct DatasetShape {
    /// `first[c]` is chunk c's first sample id; `first[C]` is the sample count.
    first: Vec<u64>,
    /// `guide[b]` is the chunk holding sample `b << shift` (one entry per chunk or so): where
    /// [`DatasetShape::chunk_of`]'s search starts, so that it touches a few entries of `first`
    /// instead of ~log2(C) scattered ones (a global plan asks it for every sample).
    guide: Vec<u32>,
    shift: u32,
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

    /// p_i for every sample (sums to 1): a table of N values, for tests and inspection; plans
    /// compute p_i of the samples they draw only.
    pub fn probabilities(&self) -> Vec<f64> {
        let n = self.scores.len() as usize;
        let mass: Vec<f64> = (0..n as u64).map(|i| self.mass(i)).collect();
        let total: f64 = mass.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let a = self.alpha.clamp(0.0, 0.999_999);
        mass.iter()
            .map(|m| (1.0 - a) / n as f64 + a * m / total)
            .collect()
    }
}

const TAG_CHUNKS: u64 = 1;
const TAG_GLOBAL: u64 = 2;
const TAG_HOME: u64 = 3;
const TAG_MOVE: u64 = 4;
const TAG_DEST: u64 = 5;
const TAG_RANK_ORDER: u64 = 6;
const TAG_WINDOW: u64 = 7;
const TAG_IMPORTANCE: u64 = 8;

/// Rounds of [`KeyedPermutation`]'s Feistel network (four make a pseudo-random permutation
/// of a Feistel network with random round functions; two more for margin, at ~2 ns each).
const FEISTEL_ROUNDS: usize = 6;

/// A keyed bijection on `0..n`: position `i` of a global shuffle is [`KeyedPermutation::at`]
/// `(i)`, computed in O(1) time and memory, so that no rank holds the whole permutation (8
/// bytes per sample: 8 GB at a billion samples). A balanced Feistel network on the smallest
/// even number of bits that covers `n`, whose round function is SplitMix64's finaliser of
/// the half-block and a round key; outputs past `n` are walked on through the network until
/// they fall in range (cycle-walking keeps it a bijection; fewer than 4 steps on average, as
/// the network's domain is under 4n).
#[derive(Clone, Debug)]
pub struct KeyedPermutation {
    n: u64,
    half: u32,
    keys: [u64; FEISTEL_ROUNDS],
}

impl KeyedPermutation {
    /// The permutation of `0..n` keyed by `key` (e.g. seed, epoch, a tag).
    pub fn new(n: u64, key: &[u64]) -> Self {
        let bits = (u64::BITS - n.saturating_sub(1).leading_zeros()).max(2);
        let mut r = SplitMix64::keyed(key);
        KeyedPermutation {
            n,
            half: bits.div_ceil(2),
            keys: std::array::from_fn(|_| r.next_u64()),
        }
    }

    /// The size of the domain.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True for the permutation of nothing.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The image of `i` (`i < n`).
    pub fn at(&self, i: u64) -> u64 {
        assert!(i < self.n, "position {i} outside 0..{}", self.n);
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for k in self.keys {
            let mut z = r ^ k;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (l, r) = (r, l ^ ((z ^ (z >> 31)) & mask));
        }
        (l << self.half) | r
    }
}

/// The global shuffle of `epoch`.
fn global_permutation(shape: &DatasetShape, o: &PlanOptions, epoch: u64) -> KeyedPermutation {
    KeyedPermutation::new(shape.samples(), &[o.seed, epoch, TAG_GLOBAL])
}

/// The epoch's global sequence before the per-rank cut.
#[cfg(test)]
fn global_sequence(shape: &DatasetShape, o: &PlanOptions, epoch: u64, world: u32) -> Vec<u64> {
    let n = shape.samples();
    match o.mode {
        ShuffleMode::Sequential => (0..n).collect(),
        ShuffleMode::Global => {
            let p = global_permutation(shape, o, epoch);
            (0..n).map(|i| p.at(i)).collect()
        }
        ShuffleMode::Chunkwise => {
            let order = chunk_order(shape, o, epoch, world);
            let mut v = Vec::with_capacity(n as usize);
            for c in order {
                v.extend(shape.chunk_samples(c));
            }
            v
        }
    }
}

/// Chunk order of a chunkwise epoch. With locality < 1, each rank keeps a home set of chunks
/// (balanced by sample count) and only a seeded fraction of chunks moves to a random rank.
fn chunk_order(shape: &DatasetShape, o: &PlanOptions, epoch: u64, world: u32) -> Vec<u32> {
    let mut chunks: Vec<u32> = (0..shape.chunks()).collect();
    if o.locality >= 1.0 || world <= 1 {
        SplitMix64::keyed(&[o.seed, epoch, TAG_CHUNKS]).shuffle(&mut chunks);
        return chunks;
    }
    let home = home_ranks(shape, o, world);
    let mut owned: Vec<Vec<u32>> = vec![Vec::new(); world as usize];
    for c in 0..shape.chunks() {
        let mut r = SplitMix64::keyed(&[o.seed, epoch, TAG_MOVE, c as u64]);
        let owner = if r.next_f64() < o.locality {
            SplitMix64::keyed(&[o.seed, epoch, TAG_DEST, c as u64]).below(world as u64) as u32
        } else {
            home[c as usize]
        };
        owned[owner as usize].push(c);
    }
    let mut out = Vec::with_capacity(shape.chunks() as usize);
    for (r, mut cs) in owned.into_iter().enumerate() {
        SplitMix64::keyed(&[o.seed, epoch, TAG_RANK_ORDER, r as u64]).shuffle(&mut cs);
        out.extend(cs);
    }
    out
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
        let len = shape.chunk_samples(c).end - shape.chunk_samples(c).start;
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
    let order: Vec<u32> = match o.mode {
        ShuffleMode::Chunkwise => chunk_order(shape, o, epoch, world),
        ShuffleMode::Sequential => (0..shape.chunks()).collect(),
        ShuffleMode::Global => {
            let mut v: Vec<u32> = (0..shape.chunks()).collect();
            SplitMix64::keyed(&[o.seed, epoch, TAG_HOME]).shuffle(&mut v);
            v
        }
    };
    // The per-rank cut: `n / world` samples each (drop_last), the remainder to no one; its
    // chunks count as the last rank's.
    let n = shape.samples();
    let per = if o.drop_last {
        n / world as u64
    } else {
        n.div_ceil(world as u64)
    };
    rank_by_middle(shape, &order, per.max(1) * world as u64, world)
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
fn shard_positions(n: u64, shard: &Shard, drop_last: bool) -> Range<u64> {
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
        let s = Shard {
            rank: i / old.1,
            world_size: old.0,
            worker: i % old.1,
            num_workers: old.1,
        };
        let pos = shard_positions(n, &s, drop_last);
        let from = pos.start + consumed[i as usize].min(pos.end - pos.start);
        (s, pos, from)
    })
}

/// `shard`'s part of a global epoch, evaluated position by position (O(share) memory).
fn global_part(shape: &DatasetShape, o: &PlanOptions, epoch: u64, shard: &Shard) -> Vec<u64> {
    let n = shape.samples();
    let p = global_permutation(shape, o, epoch);
    shard_positions(n, shard, o.drop_last)
        .map(|i| p.at(i % n))
        .collect()
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
    while start < seq.len() {
        let end;
        let mut chunks: Vec<u32>;
        if o.mode == ShuffleMode::Global {
            // As many records as W chunks hold on average: the same bytes per window as a
            // chunk-wise plan, so the same memory budget holds (the order does not depend on it).
            let per_chunk = (shape.samples() / u64::from(shape.chunks()).max(1)).max(1) as usize;
            let size = (w * per_chunk).clamp(1, GLOBAL_WINDOW_SAMPLES);
            end = (start + size).min(seq.len());
            chunks = seq[start..end].iter().map(|&s| shape.chunk_of(s)).collect();
        } else {
            // W runs of consecutive samples from the same chunk.
            chunks = Vec::new();
            let mut i = start;
            let mut prev = None;
            while i < seq.len() {
                let c = shape.chunk_of(seq[i]);
                if prev != Some(c) {
                    if chunks.len() == w {
                        break;
                    }
                    chunks.push(c);
                    prev = Some(c);
                }
                i += 1;
            }
            end = i;
            if o.mode == ShuffleMode::Chunkwise {
                let key = [
                    o.seed,
                    epoch,
                    TAG_WINDOW,
                    shard.rank as u64,
                    shard.worker as u64,
                    windows.len() as u64,
                ];
                SplitMix64::keyed(&key).shuffle(&mut seq[start..end]);
            }
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
    if probs.is_none() && o.mode == ShuffleMode::Global {
        let part = global_part(shape, o, epoch, shard);
        return windows(shape, o, epoch, shard, part);
    }
    // The epoch is whole chunks in a chunk order: take this shard's positions straight from
    // it (O(chunks + share) memory) instead of building every rank's sequence (8 bytes per
    // sample of the dataset: 8 GB on every rank at a billion samples).
    let mut seq = chunk_runs(shape, o, epoch, shard.world_size, probs);
    let part = seq.at(shard_positions(seq.len(), shard, o.drop_last));
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
    match probs {
        None => {
            let order: Vec<u32> = match o.mode {
                ShuffleMode::Sequential => (0..shape.chunks()).collect(),
                _ => chunk_order(shape, o, epoch, world),
            };
            ChunkRuns::new(order, RunIds::Samples(&shape.first))
        }
        Some(imp) => ChunkRuns::new(
            chunk_order(shape, o, epoch, world),
            RunIds::Draws(imp, vec![o.seed, epoch, TAG_IMPORTANCE]),
        ),
    }
}

/// What the shards of configuration `old` (ranks, workers) had not delivered of an epoch
/// (`consumed`: each shard's count), in their order; regrouped by chunk in the epoch's chunk
/// order when the epoch reads chunk by chunk. Builds every old shard's plan: 8 bytes per
/// sample left (the reference that [`global_rest_part`] and [`chunk_rest_part`] are tested
/// against).
#[cfg(test)]
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
    let n = shape.samples();
    // (position in the rest where the run starts, the run of epoch positions).
    let mut runs: Vec<(u64, Range<u64>)> = Vec::new();
    let mut total = 0u64;
    for (_, pos, from) in old_shards(n, old, o.drop_last, consumed) {
        if from < pos.end {
            runs.push((total, from..pos.end));
            total += pos.end - from;
        }
    }
    let p = global_permutation(shape, o, epoch);
    shard_positions(total, shard, o.drop_last)
        .map(|i| {
            let j = i % total;
            let (at, run) = &runs[runs.partition_point(|(s, _)| *s <= j) - 1];
            p.at((run.start + (j - at)) % n)
        })
        .collect()
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
            let key = [
                o.seed,
                epoch,
                TAG_WINDOW,
                s.rank.into(),
                s.worker.into(),
                index,
            ];
            SplitMix64::keyed(&key).shuffle(&mut left);
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
    let Range { start: mut i, end } = shard_positions(total, shard, o.drop_last);
    let mut out = Vec::with_capacity((end - i) as usize);
    while i < end {
        // Index `j` of the rest (wrapping past its end: padding).
        let j = i % total;
        let s = segments.partition_point(|s| s.0 <= j) - 1;
        let (at, pos, len, times) = segments[s];
        let take = (end - i).min(at + len * times - j);
        if times == 1 {
            seq.extend(pos + (j - at)..pos + (j - at) + take, &mut out);
        } else {
            for t in j..j + take {
                let q = pos + (t - at) / times;
                seq.extend(q..q + 1, &mut out);
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
        let lens = (0..shape.chunks()).map(|c| {
            let r = shape.chunk_samples(c);
            r.end - r.start
        });
        let imp = sampling.map(|sm| Importance::new(&mass, sm.alpha, lens, &key));
        let mut p = Self::build_inner(shape, o, epoch, shard, resume, imp.as_ref())?;
        if let Some(imp) = &imp {
            let n = shape.samples() as f64;
            p.weights = p
                .samples
                .iter()
                .map(|&s| (1.0 / (n * imp.p(s))) as f32)
                .collect();
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
            return Ok(fresh(shape, o, epoch, &shard, probs));
        };
        if st.epoch != epoch {
            return Err(format!(
                "resume state is for epoch {}, not {epoch}",
                st.epoch
            ));
        }
        let old = (st.world_size, st.num_workers);
        if st.world_size == 0
            || st.num_workers == 0
            || st.consumed.len() != (old.0 * old.1) as usize
        {
            return Err(format!(
                "resume state lists {} counts for {} ranks x {} workers",
                st.consumed.len(),
                old.0,
                old.1
            ));
        }
        if old == (shard.world_size, shard.num_workers) {
            // Same configuration: continue exactly where this shard stopped.
            let mut p = fresh(shape, o, epoch, &shard, probs);
            let done = st.consumed[(shard.rank * shard.num_workers + shard.worker) as usize];
            p.skip(shape, done as usize);
            return Ok(p);
        }
        // Another configuration: what the old shards had not delivered yet is cut again for
        // the new ranks and workers.
        let part = match (o.mode, probs) {
            (ShuffleMode::Global, None) => {
                global_rest_part(shape, o, epoch, &shard, old, &st.consumed)
            }
            _ => chunk_rest_part(shape, o, epoch, &shard, old, &st.consumed, probs),
        };
        Ok(windows(shape, o, epoch, &shard, part))
    }

    /// Drops the first `n` samples (already consumed); windows are trimmed and re-based.
    pub fn skip(&mut self, shape: &DatasetShape, n: usize) {
        let n = n.min(self.samples.len());
        self.samples.drain(..n);
        self.windows.retain(|w| w.range.end > n);
        for w in &mut self.windows {
            w.range = w.range.start.saturating_sub(n)..w.range.end - n;
        }
        if let Some(w) = self.windows.first_mut() {
            let mut cs: Vec<u32> = self.samples[w.range.clone()]
                .iter()
                .map(|&s| shape.chunk_of(s))
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

/// How well an order is shuffled, measured on labels (see [`shuffle_quality`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ShuffleQuality {
    /// Mean length of runs of consecutive samples with the same label (a global shuffle over C
    /// balanced classes gives about C / (C - 1)).
    pub mean_label_run: f64,
    /// Mean total-variation distance between the label histogram of each block of
    /// consecutive samples and the histogram of the whole sequence (0 = perfectly mixed).
    pub block_label_tv: f64,
    /// Fraction of consecutive pairs that come from the same chunk.
    pub same_chunk_pairs: f64,
}

/// Measures `seq` (sample ids in delivery order) with blocks of `block` samples.
pub fn shuffle_quality(
    shape: &DatasetShape,
    label: impl Fn(u64) -> u32,
    seq: &[u64],
    block: usize,
) -> ShuffleQuality {
    if seq.is_empty() {
        return ShuffleQuality::default();
    }
    let labels: Vec<u32> = seq.iter().map(|&s| label(s)).collect();
    let runs = 1 + labels.windows(2).filter(|w| w[0] != w[1]).count();
    let mut global: HashMap<u32, f64> = HashMap::new();
    for &l in &labels {
        *global.entry(l).or_default() += 1.0 / labels.len() as f64;
    }
    let block = block.max(1);
    let mut tv_sum = 0.0;
    let mut blocks = 0;
    for b in labels.chunks(block) {
        let mut h: HashMap<u32, f64> = HashMap::new();
        for &l in b {
            *h.entry(l).or_default() += 1.0 / b.len() as f64;
        }
        let tv: f64 = global
            .iter()
            .map(|(l, p)| (h.get(l).copied().unwrap_or(0.0) - p).abs())
            .sum::<f64>()
            / 2.0;
        tv_sum += tv;
        blocks += 1;
    }
    let same = seq
        .windows(2)
        .filter(|w| shape.chunk_of(w[0]) == shape.chunk_of(w[1]))
        .count();
    ShuffleQuality {
        mean_label_run: labels.len() as f64 / runs as f64,
        block_label_tv: tv_sum / blocks as f64,
        same_chunk_pairs: same as f64 / (seq.len() - 1).max(1) as f64,
    }
}

#[cfg(test)]
mod share_tests {
    use super::*;

    /// The rank share taken from the chunk runs equals the cut of the full sequence, for
    /// shapes with empty chunks, padding and dropping, every mode that reads whole chunks, and
    /// locality below 1.
    #[test]
    fn rank_share_equals_cutting_the_whole_sequence() {
        let mut r = SplitMix64::new(7);
        for case in 0..300 {
            let chunks = 1 + r.below(40);
            let counts: Vec<u64> = (0..chunks)
                .map(|_| if r.below(5) == 0 { 0 } else { r.below(30) })
                .collect();
            let shape = DatasetShape::from_counts(counts);
            let world = 1 + r.below(9) as u32;
            let o = PlanOptions {
                mode: if case % 3 == 0 {
                    ShuffleMode::Sequential
                } else {
                    ShuffleMode::Chunkwise
                },
                seed: case,
                drop_last: case % 2 == 0,
                locality: if case % 4 == 1 { 0.3 } else { 1.0 },
                ..PlanOptions::default()
            };
            for rank in 0..world {
                let seq = global_sequence(&shape, &o, 3, world);
                let want = cut_rank(&seq, world, rank, o.drop_last);
                let mut runs = chunk_runs(&shape, &o, 3, world, None);
                assert_eq!(
                    runs.at(rank_positions(shape.samples(), world, rank, o.drop_last)),
                    want,
                    "case {case} rank {rank}/{world}"
                );
            }
        }
    }

    /// The keyed permutation is a bijection on 0..n for every n (cycle-walking included),
    /// depends on its key, and is not close to the identity.
    #[test]
    fn keyed_permutation_is_a_keyed_bijection() {
        for n in (0..70).chain([255, 256, 257, 1000, 4095, 4097, 65_537]) {
            let p = KeyedPermutation::new(n, &[1, 2]);
            let mut img: Vec<u64> = (0..n).map(|i| p.at(i)).collect();
            let other: Vec<u64> = {
                let q = KeyedPermutation::new(n, &[1, 3]);
                (0..n).map(|i| q.at(i)).collect()
            };
            if n >= 16 {
                let fixed = img
                    .iter()
                    .enumerate()
                    .filter(|(i, &v)| *i as u64 == v)
                    .count();
                assert!(
                    fixed < (n as usize / 4).max(4),
                    "n {n}: {fixed} fixed points"
                );
                assert_ne!(img, other, "n {n}: another key, the same order");
            }
            img.sort_unstable();
            assert!(img.iter().copied().eq(0..n), "n {n}: not a bijection");
        }
        // The largest domains: in range, and distinct on a sample of positions.
        let n = u64::MAX - 5;
        let p = KeyedPermutation::new(n, &[9]);
        let mut seen: Vec<u64> = (0..1000).map(|i| p.at(n - 1 - i * 7919)).collect();
        assert!(seen.iter().all(|&v| v < n));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 1000);
    }

    /// The guided `chunk_of` answers as the plain search over chunk starts, for shapes with
    /// empty chunks, one chunk, skewed sizes and ids past the end.
    #[test]
    fn chunk_of_matches_the_plain_search() {
        let mut r = SplitMix64::new(3);
        for case in 0..300 {
            let chunks = 1 + r.below(if case % 3 == 0 { 3 } else { 60 });
            let counts: Vec<u64> = (0..chunks)
                .map(|_| match r.below(6) {
                    0 => 0,
                    1 => r.below(2000),
                    _ => r.below(50),
                })
                .collect();
            let shape = DatasetShape::from_counts(counts);
            let n = shape.samples();
            for id in (0..n + 3).chain([u64::MAX]) {
                let want = (shape.first.partition_point(|&f| f <= id) - 1) as u32;
                assert_eq!(shape.chunk_of(id), want, "case {case} id {id} of {n}");
            }
        }
    }

    /// A global shard's part, evaluated position by position, equals cutting the whole
    /// permuted sequence for its rank and then its worker.
    #[test]
    fn global_part_equals_cutting_the_whole_sequence() {
        let mut r = SplitMix64::new(11);
        for case in 0..200 {
            let counts: Vec<u64> = (0..1 + r.below(20)).map(|_| r.below(40)).collect();
            let shape = DatasetShape::from_counts(counts);
            let (world, workers) = (1 + r.below(7) as u32, 1 + r.below(4) as u32);
            let o = PlanOptions {
                mode: ShuffleMode::Global,
                seed: case,
                drop_last: case % 2 == 0,
                ..PlanOptions::default()
            };
            let seq = global_sequence(&shape, &o, 5, world);
            for rank in 0..world {
                let share = cut_rank(&seq, world, rank, o.drop_last);
                for worker in 0..workers {
                    let shard = Shard {
                        rank,
                        world_size: world,
                        worker,
                        num_workers: workers,
                    };
                    assert_eq!(
                        global_part(&shape, &o, 5, &shard),
                        split_worker(&share, workers, worker),
                        "case {case} rank {rank}/{world} worker {worker}/{workers}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_global_rest_part_equals_cutting_the_regrouped_rest() {
        let mut r = SplitMix64::new(12);
        for case in 0..300 {
            let counts: Vec<u64> = (0..1 + r.below(12)).map(|_| r.below(30)).collect();
            let shape = DatasetShape::from_counts(counts);
            let old = (1 + r.below(6) as u32, 1 + r.below(3) as u32);
            let o = PlanOptions {
                mode: ShuffleMode::Global,
                seed: case,
                drop_last: case % 2 == 0,
                ..PlanOptions::default()
            };
            let consumed = some_consumed(&mut r, &shape, old);
            let rest = regrouped_rest(&shape, &o, 3, old, &consumed, None);
            each_new_shard(&mut r, &rest, o.drop_last, |shard, want| {
                let got = global_rest_part(&shape, &o, 3, shard, old, &consumed);
                assert_eq!(got, want, "case {case} {old:?} -> {shard:?}");
            });
        }
    }

    /// What each shard of configuration `old` had delivered: all of its part, none, or some.
    fn some_consumed(r: &mut SplitMix64, shape: &DatasetShape, old: (u32, u32)) -> Vec<u64> {
        (0..old.0 * old.1)
            .map(|_| match r.below(4) {
                0 => 0,
                1 => u64::MAX,
                _ => r.below(2 + shape.samples() / u64::from(old.0 * old.1).max(1)),
            })
            .collect()
    }

    /// Calls `check` with every shard of a random new configuration and its cut of `rest`.
    fn each_new_shard(
        r: &mut SplitMix64,
        rest: &[u64],
        drop_last: bool,
        mut check: impl FnMut(&Shard, &[u64]),
    ) {
        let (world, workers) = (1 + r.below(7) as u32, 1 + r.below(4) as u32);
        for rank in 0..world {
            let share = cut_rank(rest, world, rank, drop_last);
            for worker in 0..workers {
                let shard = Shard {
                    rank,
                    world_size: world,
                    worker,
                    num_workers: workers,
                };
                check(&shard, split_worker(&share, workers, worker));
            }
        }
    }

    /// Resuming an epoch read chunk by chunk (chunk-wise, sequential, importance-sampled, or
    /// global with importance) at another configuration gives each new shard exactly its cut
    /// of everything the old shards had left, regrouped in chunk order.
    #[test]
    fn a_chunk_rest_part_equals_cutting_the_regrouped_rest() {
        let mut r = SplitMix64::new(21);
        let mass = |i: u64| ((i * 7919) % 11) as f64 + 0.25;
        for case in 0..400 {
            let counts: Vec<u64> = (0..1 + r.below(14))
                .map(|_| if r.below(5) == 0 { 0 } else { r.below(30) })
                .collect();
            let shape = DatasetShape::from_counts(counts);
            let old = (1 + r.below(6) as u32, 1 + r.below(3) as u32);
            let o = PlanOptions {
                mode: match case % 4 {
                    0 => ShuffleMode::Sequential,
                    3 => ShuffleMode::Global,
                    _ => ShuffleMode::Chunkwise,
                },
                seed: case,
                window_chunks: 1 + r.below(4) as usize,
                drop_last: r.below(2) == 0,
                locality: if case % 5 == 1 { 0.4 } else { 1.0 },
            };
            // Global epochs read chunk by chunk only when importance-sampled.
            let sampled = o.mode == ShuffleMode::Global || r.below(3) == 0;
            let lens = (0..shape.chunks()).map(|c| {
                let s = shape.chunk_samples(c);
                s.end - s.start
            });
            let imp =
                sampled.then(|| Importance::new(&mass, 0.7, lens, &[case, 3, TAG_IMPORTANCE]));
            let consumed = some_consumed(&mut r, &shape, old);
            let rest = regrouped_rest(&shape, &o, 3, old, &consumed, imp.as_ref());
            each_new_shard(&mut r, &rest, o.drop_last, |shard, want| {
                let got = chunk_rest_part(&shape, &o, 3, shard, old, &consumed, imp.as_ref());
                assert_eq!(got, want, "case {case} {o:?} {old:?} -> {shard:?}");
            });
        }
    }
}
