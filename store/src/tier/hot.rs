//! The hot chunks of an importance tier as one reader sees and feeds them ([`HotChunks`]):
//! which samples they hold (reloaded when another process changes them), which samples belong
//! in them (importance per stored byte at or above a threshold: the most important ones that
//! fit the quota), and the records harvested from what the reader read, handed to admission in
//! batches to be re-packed. What the policy knows of the dataset and of its samples' importance
//! comes through [`Importance`]; the one formula for a chunk's importance is
//! [`chunk_importance`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use granary_format::{ChunkEntry, SampleEntry};

use super::{
    Admission, HotMap, HotRecord, Job, LocalTier, TierPolicy, TierStore, HOT_RECORD_OVERHEAD,
};
use crate::error::Result;
use crate::seam::Source;

/// What the tier's admission needs to know of a dataset's samples: their entries and paths,
/// and how important each is now (the training loop's reported losses).
pub trait Importance: Send + Sync {
    /// Samples in the dataset.
    fn samples(&self) -> u64;
    /// Sample `id`'s entry in the snapshot and its path.
    fn sample(&self, id: u64) -> Result<(SampleEntry, Vec<u8>)>;
    /// Sample `id`'s importance now.
    fn score(&self, id: u64) -> f64;
    /// Whether the scores say anything yet (a loss was reported): before, every sample weighs
    /// the same.
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

/// The hot chunks of one reader's importance tier (see the module's documentation).
pub struct HotChunks {
    tier: TierStore,
    cache: Arc<LocalTier>,
    importance: Arc<dyn Importance>,
    map: HotMap,
    /// The dataset's chunk table: hot chunks made from chunks of other digests are not used.
    chunks: Arc<[ChunkEntry]>,
    version: Option<u64>,
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
    /// tier keeps none: its policy is not importance, or no loss was reported yet (every
    /// sample at the mean says nothing to re-pack).
    pub(crate) fn open(
        tier: &TierStore,
        importance: Arc<dyn Importance>,
        memory: u64,
    ) -> Result<Option<HotChunks>> {
        let cache = tier.cache().clone();
        if cache.policy() != TierPolicy::Importance || !importance.reported() {
            return Ok(None);
        }
        // The most important samples per byte that fit in 90 % of the quota, counting what a
        // hot chunk spends per record (footer entry, path) and per chunk (header, footer,
        // class table, trailer). Records are harvested in batches of an eighth of the quota
        // (at most an eighth of the reader's memory budget).
        let target = (cache.quota() / 8).min(memory / 8).clamp(4 << 10, 32 << 20);
        let classes = importance.classes();
        let per_chunk = 160 + classes.iter().map(|c| 8 + c.len() as u64).sum::<u64>();
        let budget =
            (cache.quota() / 10 * 9).saturating_sub(per_chunk * (cache.quota() / target + 1));
        let n = importance.samples();
        let mut v: Vec<(f64, u64)> = Vec::with_capacity(n as usize);
        for id in 0..n {
            let (e, path) = importance.sample(id)?;
            let cost = e.stored_len + HOT_RECORD_OVERHEAD + path.len() as u64;
            v.push((importance.score(id) / e.stored_len.max(1) as f64, cost));
        }
        v.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut used = 0u64;
        let mut threshold = f64::INFINITY;
        let mut above = 0u64;
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
        let chunks = tier.chunk_table();
        Ok(Some(HotChunks {
            version: cache.hot_map_version(),
            map: cache.hot_map(&chunks),
            chunks,
            tier: tier.clone(),
            cache,
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
    pub(crate) fn refresh(&mut self) {
        let v = self.cache.hot_map_version();
        if v != self.version {
            self.version = v;
            self.map = self.cache.hot_map(&self.chunks);
            let map = &self.map;
            self.files.retain(|id, _| map.chunks.contains_key(id));
        }
    }

    /// Where the tier holds sample `id`: its hot chunk's source and the record's offset in
    /// it. (Its bytes are checked when read: a record that fails drops the hot chunk, and is
    /// read from its own chunk, [`crate::verified::Relocate`].)
    pub(crate) fn locate(&mut self, id: u64) -> Option<(Source, u64)> {
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

    fn wants(&self, id: u64, stored_len: u64, cost: u64) -> bool {
        let per_byte = self.importance.score(id) / stored_len.max(1) as f64;
        (per_byte > self.threshold || (per_byte == self.threshold && cost <= self.tie_room))
            && !self.map.by_sample.contains_key(&id)
            && !self.harvested.contains(&id)
    }

    /// Keeps a copy of sample `id`'s stored record (what `record` finds for its entry, if
    /// anything) if it belongs in a hot chunk; hands a full batch to `admission`.
    pub(crate) fn harvest<'a>(
        &mut self,
        id: u64,
        record: impl FnOnce(&SampleEntry) -> Option<&'a [u8]>,
        admission: &Admission,
    ) {
        let Ok((entry, path)) = self.importance.sample(id) else {
            return;
        };
        let len = entry.stored_len;
        let cost = len + HOT_RECORD_OVERHEAD + path.len() as u64;
        if !self.wants(id, len, cost) {
            return;
        }
        let Some(stored) = record(&entry).filter(|r| r.len() as u64 == len) else {
            return;
        };
        let Some(source) = self.chunks.get(entry.chunk as usize) else {
            return;
        };
        let score = self.importance.score(id);
        if score / len.max(1) as f64 == self.threshold {
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
    pub(crate) fn flush(&mut self, admission: &Admission) {
        if !self.pending.is_empty() {
            admission.offer(Job::Hot(std::mem::take(&mut self.pending), self.target));
        }
        self.pending_bytes = 0;
    }
}
