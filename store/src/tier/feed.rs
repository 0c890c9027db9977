//! What a stream's reads feed its tier with ([`TierFeed`]): the reader says what it consumed
//! (a chunk read whole, ranges of a chunk) and the feed decides what to keep: whole chunks
//! offered with their importance ([`chunk_importance`]), or, with hot chunks ([`HotChunks`]),
//! the records that belong in them (importance per stored byte at or above the threshold that
//! fills the quota), harvested and handed to admission in batches. The reader also asks it
//! where hot chunks hold a window's samples. What the policy knows of the samples comes
//! through [`Importance`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use granary_format::{ChunkEntry, SampleEntry};

use super::{hot_cost, Admission, HotMap, HotRecord, Job, TierPolicy, TierStore};
use crate::engine::Completed;
use crate::error::Result;
use crate::seam::Source;

/// What the tier's admission needs to know of a dataset's samples: their entries and paths,
/// and how important each is now (the training loop's reported losses).
pub trait Importance: Send + Sync {
    fn samples(&self) -> u64;
    /// Sample `id`'s entry in the snapshot and its path; `None` for a sample the dataset does
    /// not hold any more (deleted), which no hot chunk takes.
    fn sample(&self, id: u64) -> Result<Option<(SampleEntry, Vec<u8>)>>;
    /// Sample `id`'s importance now.
    fn score(&self, id: u64) -> f64;
    /// Whether a loss was reported yet (before, every sample weighs the same).
    fn reported(&self) -> bool;
    /// The dataset's class names (a hot chunk carries its class table).
    fn classes(&self) -> Vec<Vec<u8>>;
}

/// A chunk's importance for admission: the sum of its samples' scores, or its sample count
/// without scores (so that importance admission then only adds hysteresis).
pub fn chunk_importance(ce: &ChunkEntry, scores: Option<&dyn Importance>) -> f64 {
    match scores {
        Some(s) => ce.samples().map(|id| s.score(id)).sum(),
        None => ce.sample_count as f64,
    }
}

/// A stream's feed into the stack's tier (see the module), finished at the end of the epoch.
pub struct TierFeed {
    pub(crate) admission: Admission,
    pub(crate) hot: Option<HotChunks>,
    pub(crate) importance: Option<Arc<dyn Importance>>,
    pub(crate) chunks: Arc<[ChunkEntry]>,
}

impl TierFeed {
    /// Whether the tier's hot chunks serve samples.
    pub fn has_hot(&self) -> bool {
        self.hot.is_some()
    }

    /// Per sample of `ids`: the hot chunk that holds it and the record's offset there, if any.
    pub fn hot_samples(&mut self, ids: &[u64]) -> Vec<Option<(Source, u64)>> {
        let Some(h) = self.hot.as_mut() else {
            return vec![None; ids.len()];
        };
        h.refresh();
        ids.iter().map(|&id| h.locate(id)).collect()
    }

    /// Chunk `chunk` was read whole into `read` (bytes from a copy are not offered again).
    pub fn consumed_whole(&mut self, chunk: u32, read: &Arc<Completed>) {
        if self.hot.is_some() {
            return self.consumed_ranges(chunk, &[(0, read)]);
        }
        let fresh = !read.from().is_copy();
        let Some(ce) = self.chunks.get(chunk as usize).filter(|_| fresh).cloned() else {
            return;
        };
        let score = chunk_importance(&ce, self.importance.as_deref());
        self.admission.offer(Job::Chunk(ce, read.clone(), score));
    }

    /// Ranges of chunk `chunk` were read: `(offset in the chunk, read)`, sorted by offset (only
    /// hot chunks take records of ranges, drawn or not).
    pub fn consumed_ranges(&mut self, chunk: u32, ranges: &[(u64, &Arc<Completed>)]) {
        let (Some(h), Some(ce)) = (self.hot.as_mut(), self.chunks.get(chunk as usize)) else {
            return;
        };
        for id in ce.samples() {
            h.harvest(
                id,
                |e| {
                    let k = ranges.partition_point(|&(start, _)| start <= e.offset);
                    let &(start, read) = ranges.get(k.checked_sub(1)?)?;
                    let fresh = !read.from().is_copy();
                    fresh.then(|| record(read.data(), e, start)).flatten()
                },
                &self.admission,
            );
        }
    }

    /// The end of the epoch: records still waiting go to the tier.
    pub fn finish(mut self) {
        if let Some(h) = self.hot.as_mut() {
            h.flush(&self.admission);
        }
        self.admission.finish();
    }
}

/// Record `e`'s stored bytes in `bytes`, which begin at offset `start` of its chunk.
fn record<'a>(bytes: &'a [u8], e: &SampleEntry, start: u64) -> Option<&'a [u8]> {
    let at = e.offset.checked_sub(start)? as usize;
    bytes.get(at..at + e.stored_len as usize)
}

/// The hot chunks of one reader's importance tier (see the module).
pub struct HotChunks {
    tier: TierStore,
    importance: Arc<dyn Importance>,
    map: HotMap,
    /// The identity of `hot.map` as last read.
    version: Option<crate::mapcache::FileKey>,
    files: HashMap<u32, Option<Source>>,
    threshold: f64,
    /// Bytes still allowed for samples exactly at the threshold.
    tie_room: u64,
    pending: Vec<HotRecord>,
    pending_bytes: u64,
    target: u64,
    harvested: HashSet<u64>,
}

impl HotChunks {
    /// The hot chunks of `tier` for a reader with `memory` bytes of budget, or `None` when the
    /// policy is not importance or no loss was reported yet.
    pub(crate) fn open(
        tier: &TierStore,
        importance: Arc<dyn Importance>,
        memory: u64,
    ) -> Result<Option<HotChunks>> {
        let cache = &tier.cache;
        if cache.policy != TierPolicy::Importance || !importance.reported() {
            return Ok(None);
        }
        // The most important samples per byte that fit in 90 % of the quota, counting what a
        // hot chunk spends per record and per chunk; harvested in batches of an eighth of the
        // quota (at most an eighth of the reader's memory budget).
        let target = (cache.quota / 8).min(memory / 8).clamp(4 << 10, 32 << 20);
        let classes = importance.classes();
        let per_chunk = 160 + classes.iter().map(|c| 8 + c.len() as u64).sum::<u64>();
        let budget = (cache.quota / 10 * 9).saturating_sub(per_chunk * (cache.quota / target + 1));
        let n = importance.samples();
        let mut v: Vec<(f64, u64)> = Vec::with_capacity(n as usize);
        for id in 0..n {
            let Some((e, path)) = importance.sample(id)? else {
                continue;
            };
            let cost = hot_cost(e.stored_len, &path);
            v.push((importance.score(id) / e.stored_len.max(1) as f64, cost));
        }
        v.sort_by(|a, b| b.0.total_cmp(&a.0));
        let (mut used, mut threshold, mut above) = (0u64, f64::INFINITY, 0u64);
        for (per_byte, cost) in v {
            if used + cost > budget {
                break;
            }
            if per_byte < threshold {
                above = used;
            }
            used += cost;
            threshold = per_byte;
        }
        // Samples exactly at the threshold (ties) only while the budget lasts.
        let tie_room = budget.saturating_sub(above);
        cache.rescore_hot(|id| importance.score(id))?;
        Ok(Some(HotChunks {
            version: cache.file_key("hot.map"),
            map: cache.hot_map(&tier.chunks),
            tier: tier.clone(),
            importance,
            files: HashMap::new(),
            threshold,
            tie_room,
            target,
            pending: Vec::new(),
            pending_bytes: 0,
            harvested: HashSet::new(),
        }))
    }

    /// Picks up hot chunks admitted or evicted by any process since the last look.
    fn refresh(&mut self) {
        let v = self.tier.cache.file_key("hot.map");
        if v != self.version {
            self.version = v;
            self.map = self.tier.cache.hot_map(&self.tier.chunks);
            let map = &self.map;
            self.files.retain(|id, _| map.chunks.contains_key(id));
        }
    }

    /// Where the tier holds sample `id`: its hot chunk's source and the record's offset.
    fn locate(&mut self, id: u64) -> Option<(Source, u64)> {
        let (h, off) = *self.map.by_sample.get(&id)?;
        let f = self.files.entry(h).or_insert_with(|| {
            // Another process may evict it between map and open: then it is a miss.
            self.map
                .chunks
                .get(&h)
                .and_then(|hc| self.tier.open_hot(hc))
        });
        Some((f.clone()?, off))
    }

    /// Keeps a copy of sample `id`'s stored record (what `record` finds) if it belongs in a hot
    /// chunk; hands a full batch to `admission`.
    fn harvest<'a>(
        &mut self,
        id: u64,
        record: impl FnOnce(&SampleEntry) -> Option<&'a [u8]>,
        admission: &Admission,
    ) {
        let Ok(Some((entry, path))) = self.importance.sample(id) else {
            return;
        };
        let (len, score) = (entry.stored_len, self.importance.score(id));
        let (cost, per_byte) = (hot_cost(len, &path), score / len.max(1) as f64);
        let tie = per_byte == self.threshold;
        if !(per_byte > self.threshold || tie && cost <= self.tie_room)
            || self.map.by_sample.contains_key(&id)
            || self.harvested.contains(&id)
        {
            return;
        }
        let Some(stored) = record(&entry).filter(|r| r.len() as u64 == len) else {
            return;
        };
        let Some(source) = self.tier.chunks.get(entry.chunk as usize) else {
            return;
        };
        if tie {
            self.tie_room -= cost;
        }
        self.harvested.insert(id);
        self.pending_bytes += cost;
        self.pending.push(HotRecord {
            id,
            entry,
            source: source.digest,
            path,
            stored: stored.to_vec(),
            score,
        });
        if self.pending_bytes >= self.target {
            self.flush(admission);
        }
    }

    /// Hands the records harvested so far to `admission`.
    fn flush(&mut self, admission: &Admission) {
        if !self.pending.is_empty() {
            admission.offer(Job::Hot(std::mem::take(&mut self.pending), self.target));
        }
        self.pending_bytes = 0;
    }
}
