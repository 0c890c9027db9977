//! Mixtures: one epoch over several datasets (sources), each contributing a number of samples
//! set by its share (a weight, or a repeat or choose count).
//!
//! Each source's part of the epoch is an ordinary epoch plan of that source
//! ([`DatasetShape::take`]: the first samples of its chunk order, or passes over it), cut
//! for ranks and workers as any plan is, so every rank gets the same count of every source
//! and reads each source chunk by chunk in windows of its own. A shard delivers its parts
//! interleaved by [`Interleave`]: the j-th of a part's c samples sits at (j + ½) / c of the
//! shard's epoch, so every source is spread evenly over it and any prefix of the epoch holds
//! each source in its share (±1 sample).
//!
//! Resume ([`MixState`]) needs nothing but the count each shard delivered: replaying the
//! interleave gives how many of each source that was, which is an ordinary [`EpochState`] of
//! that source; each source's rest is redistributed as a single dataset's is. The state
//! carries each source's epoch count and shape, so a resumed epoch is the epoch that was
//! checkpointed: new weights apply from the next epoch, and a source that gained a
//! generation since is read as it was (its first chunks) until the epoch ends.

mod source;

use granary_format::SplitMix64;

use crate::plan::{shard_positions, DatasetShape, EpochPlan, EpochState, PlanOptions, Shard};

pub use source::{
    read_mix_epoch, MixReader, MixReport, MixStream, Mixture, SampleStream, SourceSpec,
    SourceTotals,
};

/// How much of each epoch a source contributes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    /// A share of the epoch's samples (weights are relative: 5/3/2 = 0.5/0.3/0.2). Every
    /// source of a mixture has a weight, or none has.
    Weight(f64),
    /// This many times the source's samples per epoch (0.5: half of them, a different half
    /// each epoch; 2: each sample twice).
    Repeat(f64),
    /// This many samples per epoch.
    Choose(u64),
}

impl std::str::FromStr for Share {
    type Err = String;
    /// `0.5` or `weight=0.5`, `repeat=2`, `choose=10000`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, v) = s.split_once('=').unwrap_or(("weight", s));
        let num = |v: &str| {
            v.trim()
                .parse::<f64>()
                .map_err(|_| format!("{kind} {v:?} is not a number"))
        };
        Ok(match kind.trim() {
            "weight" => Share::Weight(num(v)?),
            "repeat" => Share::Repeat(num(v)?),
            "choose" => Share::Choose(
                v.trim()
                    .parse()
                    .map_err(|_| format!("choose {v:?} is not a count of samples"))?,
            ),
            k => {
                return Err(format!(
                    "unknown share {k:?}: use weight=W, repeat=R or choose=N"
                ))
            }
        })
    }
}

impl std::fmt::Display for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Share::Weight(w) => write!(f, "weight={}", Number(*w)),
            Share::Repeat(r) => write!(f, "repeat={}", Number(*r)),
            Share::Choose(n) => write!(f, "choose={n}"),
        }
    }
}

/// The most samples a mixture's epoch takes (all sources together, and so from any one): a
/// plan holds a few bytes per sample of its rank's epoch, so a count past this would size an
/// allocation by a typo (`repeat=1e300`, `--epoch-size 100000000000`).
pub const MAX_EPOCH_SAMPLES: u64 = 1 << 32;

/// A number as a user writes it: plain where that is short (`0.5`, `2`), with an exponent
/// where it is not (`1e300`, not 301 digits); either way the text parses back to it.
struct Number(f64);

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        if v == 0.0 || (1e-6..1e16).contains(&v.abs()) {
            write!(f, "{v}")
        } else {
            write!(f, "{v:?}")
        }
    }
}

/// Samples each source contributes to an epoch: with weights, `epoch_size` (default: every
/// source's samples together) apportioned by weight (largest remainders, so the counts add up
/// exactly and each is within one sample of its weight's share); otherwise each source's
/// repeat or choose count (a source without either has repeat 1). Every count, and their
/// sum, is checked against [`MAX_EPOCH_SAMPLES`] before anything is planned.
pub fn epoch_counts(
    sizes: &[u64],
    shares: &[Share],
    epoch_size: Option<u64>,
) -> Result<Vec<u64>, String> {
    if sizes.is_empty() {
        return Err("a mixture needs at least one source".into());
    }
    if shares.len() != sizes.len() {
        return Err(format!(
            "{} shares for {} sources: give one per source",
            shares.len(),
            sizes.len()
        ));
    }
    let weights: Vec<f64> = shares
        .iter()
        .filter_map(|s| match s {
            Share::Weight(w) => Some(*w),
            _ => None,
        })
        .collect();
    if !weights.is_empty() && weights.len() != shares.len() {
        return Err("give every source a weight, or none (repeat=R / choose=N instead)".into());
    }
    for (i, s) in shares.iter().enumerate() {
        let bad = match *s {
            Share::Weight(v) | Share::Repeat(v) => !(v.is_finite() && v > 0.0),
            Share::Choose(n) => n == 0,
        };
        if bad {
            return Err(format!(
                "source {i}: {s} is not a positive number (leave a source out rather than give \
                 it nothing)"
            ));
        }
    }
    let too_many = |what: String| {
        format!(
            "{what}: an epoch takes at most {MAX_EPOCH_SAMPLES} samples (a plan holds a few \
             bytes per sample)"
        )
    };
    let counts: Vec<u64> = if weights.is_empty() {
        if epoch_size.is_some() {
            return Err("an epoch size goes with weights; repeat and choose set counts".into());
        }
        let mut counts = Vec::with_capacity(shares.len());
        for (i, (s, &n)) in shares.iter().zip(sizes).enumerate() {
            let c = match *s {
                Share::Repeat(r) => r * n as f64,
                Share::Choose(k) => k as f64,
                Share::Weight(_) => unreachable!("no weights here"),
            };
            if c > MAX_EPOCH_SAMPLES as f64 {
                return Err(too_many(format!(
                    "source {i}: {s} of {n} samples is {c:.0}"
                )));
            }
            counts.push(c.round() as u64);
        }
        counts
    } else {
        let total = epoch_size.unwrap_or_else(|| sizes.iter().sum());
        if total > MAX_EPOCH_SAMPLES {
            return Err(too_many(format!("an epoch size of {total}")));
        }
        apportion(total, &weights)?
    };
    let sum = counts.iter().fold(0u64, |a, &c| a.saturating_add(c));
    if sum > MAX_EPOCH_SAMPLES {
        return Err(too_many(format!("the sources' counts add up to {sum}")));
    }
    for (i, (&c, &n)) in counts.iter().zip(sizes).enumerate() {
        if c > 0 && n == 0 {
            return Err(format!("source {i} has no samples to give {c}"));
        }
    }
    Ok(counts)
}

/// `total` split by `weights` (positive, finite): floors of the exact shares, the rest one
/// each to the largest remainders (ties to the earlier source). The weights are taken relative
/// to the largest first, so that no sum or product of them overflows; a weight so small beside
/// it that its ratio is no number (below about 1e-308) is an error, never a silent nothing.
fn apportion(total: u64, weights: &[f64]) -> Result<Vec<u64>, String> {
    let max = weights.iter().copied().fold(0.0, f64::max);
    let rel: Vec<f64> = weights.iter().map(|w| w / max).collect();
    if let Some(i) = rel.iter().position(|&r| r == 0.0 || !r.is_normal()) {
        return Err(format!(
            "source {i}: weight={} is too small beside weight={} to be a share",
            Number(weights[i]),
            Number(max)
        ));
    }
    let sum: f64 = rel.iter().sum();
    let exact: Vec<f64> = rel.iter().map(|w| total as f64 * w / sum).collect();
    let mut counts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let given: u64 = counts.iter().sum();
    // A stable sort: ties stay in source order.
    let rest = |i: usize| exact[i] - exact[i].floor();
    let mut by_rest: Vec<usize> = (0..weights.len()).collect();
    by_rest.sort_by(|&a, &b| rest(b).total_cmp(&rest(a)));
    for &i in by_rest
        .iter()
        .cycle()
        .take(total.saturating_sub(given) as usize)
    {
        counts[i] += 1;
    }
    Ok(counts)
}

/// The seed of source `i`'s plans: sources with the same chunk counts get different orders.
pub fn source_seed(seed: u64, i: usize) -> u64 {
    SplitMix64::keyed(&[seed, TAG_MIX_SEED, i as u64]).next_u64()
}

const TAG_MIX_SEED: u64 = 0x006d_6978;

/// The order in which a shard delivers its parts' samples: an iterator of source indices,
/// `counts[i]` of source i, each source spread evenly (see the module documentation): the
/// j-th of c samples of a source comes at (2j + 1) / 2c of the order, ties to the earlier
/// source.
#[derive(Clone, Debug)]
pub struct Interleave {
    counts: Vec<u64>,
    next: Vec<u64>,
}

impl Interleave {
    /// From the start.
    pub fn new(counts: &[u64]) -> Self {
        Self::resume(counts, &vec![0; counts.len()])
    }

    /// After `done[i]` samples of each source were delivered (as replaying the order says).
    pub fn resume(counts: &[u64], done: &[u64]) -> Self {
        Interleave {
            counts: counts.to_vec(),
            next: done.to_vec(),
        }
    }

    /// How many of each source the first `k` picks of the order over `counts` are.
    pub fn counts_after(counts: &[u64], k: u64) -> Vec<u64> {
        let mut it = Interleave::new(counts);
        it.by_ref().take(k as usize).for_each(drop);
        it.next
    }

    /// Where source `i` stands: (its samples delivered, its count). Its next sample is needed
    /// at (2 delivered + 1) / (2 count) of the order.
    pub fn position(&self, i: usize) -> (u64, u64) {
        (self.next[i], self.counts[i])
    }

    /// Samples left to deliver.
    pub fn remaining(&self) -> u64 {
        self.counts.iter().zip(&self.next).map(|(c, n)| c - n).sum()
    }
}

impl Iterator for Interleave {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        // A scan of the sources (a mixture has a few: each is a stream with its own reads),
        // comparing where their next samples come exactly.
        let at = |i: usize| {
            (
                u128::from(2 * self.next[i] + 1),
                u128::from(2 * self.counts[i]),
            )
        };
        let i = (0..self.counts.len())
            .filter(|&i| self.next[i] < self.counts[i])
            .min_by(|&a, &b| {
                let ((na, da), (nb, db)) = (at(a), at(b));
                (na * db).cmp(&(nb * da))
            })?;
        self.next[i] += 1;
        Some(i)
    }
}

/// What a source was when an epoch was planned: its dataset (the id the front end checks),
/// its chunk and sample counts (of the generation read), the samples the epoch took of it and
/// its window (which follows from the memory budget's share and the chunk sizes, both of
/// which may have changed since).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceMark {
    pub dataset: String,
    pub chunks: u32,
    pub samples: u64,
    pub take: u64,
    pub window: u64,
}

/// Where a mixture's epoch stands: the configuration reading it, how many samples each
/// (rank, worker) had delivered (`rank * num_workers + worker`), and every source as it was
/// planned. Resumed with the same configuration it continues exactly; with another world size
/// or worker count each source's rest is redistributed; in both cases nothing is repeated or
/// skipped.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MixState {
    pub epoch: u64,
    pub world_size: u32,
    pub num_workers: u32,
    pub consumed: Vec<u64>,
    pub sources: Vec<SourceMark>,
    /// One loader worker's own state (see [`EpochState::column`]).
    pub column: Option<u32>,
    /// Where the epoch got under another configuration it was resumed at (see
    /// [`EpochState::then`]).
    pub then: Option<crate::Continued>,
}

/// One source of a plan: its shape (with [`DatasetShape::take`] set to its epoch count), its
/// plan options, and its mark for resume states.
#[derive(Clone, Debug)]
pub struct PlanSource {
    pub shape: DatasetShape,
    pub options: PlanOptions,
    pub mark: SourceMark,
}

/// One shard's plan of a mixture's epoch: each source's part and the order they interleave.
#[derive(Clone, Debug)]
pub struct MixPlan {
    pub epoch: u64,
    pub parts: Vec<EpochPlan>,
    pub order: Interleave,
}

/// Plans one source's part of an epoch: (source index, its shape, its options, the shard, a
/// resume state of that source). [`MixPlan::build`] plans uniform parts; a reader passes its
/// sources' setups (importance sampling from each source's scores).
pub type PartPlanner<'a> = dyn Fn(usize, &DatasetShape, &PlanOptions, Shard, Option<&EpochState>) -> Result<EpochPlan, String>
    + 'a;

impl MixPlan {
    /// `shard`'s plan of `epoch`, every sample of each part drawn uniformly; with `resume`,
    /// what is left of the epoch it was taken in.
    pub fn build(
        sources: &[PlanSource],
        epoch: u64,
        shard: Shard,
        resume: Option<&MixState>,
    ) -> Result<MixPlan, String> {
        let uniform: &PartPlanner = &|_, sh, o, s, st| EpochPlan::build(sh, o, epoch, s, st);
        Self::build_with(sources, epoch, shard, resume, uniform)
    }

    /// [`MixPlan::build`] with each part planned by `plan`.
    pub fn build_with(
        sources: &[PlanSource],
        epoch: u64,
        shard: Shard,
        resume: Option<&MixState>,
        plan: &PartPlanner,
    ) -> Result<MixPlan, String> {
        let Some(st) = resume else {
            let parts = sources
                .iter()
                .enumerate()
                .map(|(i, s)| plan(i, &s.shape, &s.options, shard, None))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(MixPlan::from_start(epoch, parts));
        };
        let shapes = resumed_shapes(sources, st, epoch)?;
        // Each old shard's parts (fresh plans: a state is taken in a fresh epoch) and how
        // many of each it delivered.
        let (old_w, old_k) = (st.world_size, st.num_workers);
        let mut per_source: Vec<Vec<u64>> = vec![Vec::new(); sources.len()];
        let mut mine = None;
        for (slot, &done) in st.consumed.iter().enumerate() {
            let old = Shard::at((old_w, old_k), slot as u32);
            let counts: Vec<u64> = shapes
                .iter()
                .zip(sources)
                .map(|(sh, s)| shard_positions(sh.epoch_len(), &old, s.options.drop_last))
                .map(|pos| pos.end - pos.start)
                .collect();
            let total: u64 = counts.iter().sum();
            if done > total {
                return Err(format!(
                    "resume state: shard {slot} delivered {done} samples of an epoch that gives \
                     it {total}"
                ));
            }
            let after = Interleave::counts_after(&counts, done);
            for (i, a) in after.iter().enumerate() {
                per_source[i].push(*a);
            }
            if old == shard {
                mine = Some((counts, after));
            }
        }
        let parts = (shapes.iter().zip(sources).zip(&st.sources).zip(&per_source))
            .enumerate()
            .map(|(i, (((sh, s), mark), consumed))| {
                // The checkpointed epoch's windows.
                let o = PlanOptions {
                    window_chunks: mark.window.max(1) as usize,
                    ..s.options.clone()
                };
                let state = EpochState {
                    epoch,
                    world_size: old_w,
                    num_workers: old_k,
                    consumed: consumed.clone(),
                    column: st.column,
                    then: None,
                    chunks: None,
                };
                plan(i, sh, &o, shard, Some(&state))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut plan = MixPlan::from_start(epoch, parts);
        if let Some((counts, after)) = mine {
            // The same configuration: the interleave goes on where it stopped.
            plan.order = Interleave::resume(&counts, &after);
        }
        if let Some(then) = &st.then {
            // Read on under the configuration it was resumed at: less what this shard
            // delivered there.
            plan.skip(&shapes, then.done_by(&shard)?);
        }
        Ok(plan)
    }

    /// The plan of `parts` delivered whole, interleaved from the start.
    fn from_start(epoch: u64, parts: Vec<EpochPlan>) -> MixPlan {
        let counts: Vec<u64> = parts.iter().map(|p| p.len() as u64).collect();
        let order = Interleave::new(&counts);
        MixPlan {
            epoch,
            parts,
            order,
        }
    }

    /// Samples in the plan.
    pub fn len(&self) -> u64 {
        self.order.remaining()
    }

    /// Drops the first `n` deliveries of the plan (`shapes`: its sources' shapes).
    fn skip(&mut self, shapes: &[DatasetShape], n: u64) {
        let mut taken = vec![0usize; self.parts.len()];
        for i in self.order.by_ref().take(n as usize) {
            taken[i] += 1;
        }
        for ((p, shape), t) in self.parts.iter_mut().zip(shapes).zip(taken) {
            p.skip(shape, t);
        }
    }

    /// True when the plan delivers nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The sources' shapes as the checkpointed epoch planned them: the state's counts, and each
/// source's first chunks when it gained a generation since.
fn resumed_shapes(
    sources: &[PlanSource],
    st: &MixState,
    epoch: u64,
) -> Result<Vec<DatasetShape>, String> {
    if st.epoch != epoch {
        return Err(format!(
            "resume state is for epoch {}, not {epoch}",
            st.epoch
        ));
    }
    if st.sources.len() != sources.len() {
        return Err(format!(
            "resume state of a mixture of {} sources, this one has {}",
            st.sources.len(),
            sources.len()
        ));
    }
    crate::plan::check_counts((st.world_size, st.num_workers), &st.consumed)?;
    sources
        .iter()
        .zip(&st.sources)
        .enumerate()
        .map(|(i, (s, m))| {
            if !m.dataset.is_empty() && m.dataset != s.mark.dataset {
                return Err(format!(
                    "resume state: source {i} was dataset {}, this mixture's is {}",
                    m.dataset, s.mark.dataset
                ));
            }
            if m.chunks > s.shape.chunks() {
                return Err(format!(
                    "resume state: source {i} had {} chunks, it has {} now (a dataset only \
                     grows by appended generations)",
                    m.chunks,
                    s.shape.chunks()
                ));
            }
            let shape = s.shape.prefix(m.chunks);
            if shape.samples() != m.samples {
                return Err(format!(
                    "resume state: source {i}'s first {} chunks held {} samples, they hold {} \
                     now",
                    m.chunks,
                    m.samples,
                    shape.samples()
                ));
            }
            Ok(shape.take(m.take))
        })
        .collect()
}

#[cfg(test)]
mod tests;
