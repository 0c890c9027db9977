//! The local tier as a stream feeds it: hot chunks seen and harvested (`HotState`) and hits
//! counted (`TierCounters`). The tier's storage itself (quota, policies, files, locking) and
//! admission into it (`granary_store::tier::Admission`, the background thread a stream offers
//! chunks and hot records to) are the store's; reading from it is the [`crate::TierStore`]
//! layer of the stream's stack; the stream's windows (the `window` module) check, count and
//! offer what they read.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::error::Result;
use crate::{Dataset, LocalTier};
use granary_store::tier::{
    Admission, AdmissionCounters, HotMap, HotRecord, Job, HOT_RECORD_OVERHEAD,
};
use granary_store::StoreStack;
use granary_store::{BytesFrom, ServedCounters, Source};

/// The hot chunks of an importance tier as one stream sees and feeds them: which samples
/// they hold (reloaded when another process changes them), which samples belong in them
/// (score per stored byte at or above `threshold`: the most important ones that fit the
/// quota), and the records harvested from source reads, waiting to be re-packed.
pub(crate) struct HotState {
    stack: StoreStack,
    cache: Arc<LocalTier>,
    scores: Arc<crate::ImportanceScores>,
    map: HotMap,
    /// The dataset's chunk table: hot chunks made from chunks of other digests are not used.
    chunks: Arc<[granary_format::ChunkEntry]>,
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

impl HotState {
    pub(crate) fn new(
        ds: &Dataset,
        stack: StoreStack,
        cache: Arc<LocalTier>,
        scores: Arc<crate::ImportanceScores>,
        memory: u64,
    ) -> Result<HotState> {
        // The most important samples per byte that fit in 90 % of the quota, counting what a
        // hot chunk spends per record (footer entry, path) and per chunk (header, footer,
        // class table, trailer). Records are harvested in batches of an eighth of the quota
        // (at most an eighth of the stream's memory budget).
        let target = (cache.quota() / 8).min(memory / 8).clamp(4 << 10, 32 << 20);
        let classes = ds.classes()?;
        let per_chunk = 160 + classes.iter().map(|c| 8 + c.len() as u64).sum::<u64>();
        let budget =
            (cache.quota() / 10 * 9).saturating_sub(per_chunk * (cache.quota() / target + 1));
        // Before any loss is reported every score is the same: nothing is hot yet.
        let n = if scores.reported() == 0 { 0 } else { ds.len() };
        let mut v: Vec<(f64, u64)> = Vec::with_capacity(n as usize);
        for id in 0..n {
            let len = ds.sample(id)?.entry.stored_len;
            let cost = len + HOT_RECORD_OVERHEAD + ds.path(id)?.len() as u64;
            v.push((scores.score(id) / len.max(1) as f64, cost));
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
        cache.rescore_hot(|id| scores.score(id))?;
        Ok(HotState {
            version: cache.hot_map_version(),
            chunks: ds.snapshot().chunks().into(),
            map: cache.hot_map(ds.snapshot().chunks()),
            stack,
            cache,
            scores,
            files: HashMap::new(),
            threshold,
            tie_room,
            target,
            pending: Vec::new(),
            pending_bytes: 0,
            harvested: HashSet::new(),
        })
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

    /// Where the tier holds sample `id`: its hot chunk id, file and record offset.
    pub(crate) fn locate(&mut self, id: u64) -> Option<(u32, Source, u64)> {
        let (h, off) = *self.map.by_sample.get(&id)?;
        let f = match self.files.get(&h) {
            Some(f) => f.clone(),
            None => {
                // Another process may evict it between map and open: then it is a miss.
                let f = self
                    .map
                    .chunks
                    .get(&h)
                    .and_then(|hc| self.stack.open_hot(hc));
                self.files.insert(h, f.clone());
                f
            }
        }?;
        Some((h, f, off))
    }

    fn wants(&self, id: u64, stored_len: u64, cost: u64) -> bool {
        let per_byte = self.scores.score(id) / stored_len.max(1) as f64;
        (per_byte > self.threshold || (per_byte == self.threshold && cost <= self.tie_room))
            && !self.map.by_sample.contains_key(&id)
            && !self.harvested.contains(&id)
    }

    /// Keeps a copy of sample `id`'s stored record if it belongs in a hot chunk; hands a full
    /// batch to `admission`.
    pub(crate) fn harvest(
        &mut self,
        ds: &Dataset,
        id: u64,
        stored: &[u8],
        admission: Option<&Admission>,
    ) {
        let Ok(info) = ds.sample(id) else { return };
        let Ok(path) = ds.path(id) else { return };
        let len = info.entry.stored_len;
        let cost = len + HOT_RECORD_OVERHEAD + path.len() as u64;
        if stored.len() as u64 != len || !self.wants(id, len, cost) {
            return;
        }
        if self.scores.score(id) / len.max(1) as f64 == self.threshold {
            self.tie_room -= cost;
        }
        self.harvested.insert(id);
        self.pending_bytes += cost;
        let Ok(source) = ds.chunk(info.entry.chunk) else {
            return;
        };
        self.pending.push(HotRecord {
            id,
            entry: info.entry,
            source: source.digest,
            path: path.to_vec(),
            stored: stored.to_vec(),
            score: self.scores.score(id),
        });
        if self.pending_bytes >= self.target {
            self.flush(admission);
        }
    }

    pub(crate) fn flush(&mut self, admission: Option<&Admission>) {
        if let (Some(a), false) = (admission, self.pending.is_empty()) {
            a.offer(Job::Hot(std::mem::take(&mut self.pending), self.target));
        }
        self.pending.clear();
        self.pending_bytes = 0;
    }
}

/// Hits and misses of the local tier during one stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierHits {
    /// Served by this node's tier. (JSON keeps the names scripts read: `samples_from_cache`,
    /// `samples_from_source`, `bytes_from_cache`, `bytes_from_source`.)
    #[serde(rename = "samples_from_cache")]
    pub samples_from_tier: u64,
    /// Read from origin storage.
    #[serde(rename = "samples_from_source")]
    pub samples_from_origin: u64,
    #[serde(rename = "bytes_from_cache")]
    pub bytes_from_tier: u64,
    #[serde(rename = "bytes_from_source")]
    pub bytes_from_origin: u64,
    /// Served by other nodes' tiers (shared tiers, [`crate::Peers`]); not counted above.
    pub samples_from_peers: u64,
    pub bytes_from_peers: u64,
    /// Chunks or hot chunks the tier failed to store (a full or failing disk: the first
    /// failure is also printed as a warning; reads go on from the source).
    pub admissions_failed: u64,
    /// Offers the tier did not get because admission was busy and the queue of waiting
    /// offers was full, while the tier was full too (it would have had to evict): the least
    /// valuable per byte go. An offer the tier has room for waits instead (the stream slows
    /// to the tier's write speed), so a tier that can hold the dataset gets all of it.
    #[serde(default)]
    pub admissions_skipped: u64,
}

impl std::ops::AddAssign for TierHits {
    fn add_assign(&mut self, o: TierHits) {
        self.samples_from_tier += o.samples_from_tier;
        self.samples_from_origin += o.samples_from_origin;
        self.bytes_from_tier += o.bytes_from_tier;
        self.bytes_from_origin += o.bytes_from_origin;
        self.samples_from_peers += o.samples_from_peers;
        self.bytes_from_peers += o.bytes_from_peers;
        self.admissions_failed += o.admissions_failed;
        self.admissions_skipped += o.admissions_skipped;
    }
}

/// What one stream counts of its tier: samples and bytes by where they came from, and what
/// admission failed to store or dropped.
#[derive(Default)]
pub(crate) struct TierCounters {
    served: ServedCounters,
    pub(crate) admission: Arc<AdmissionCounters>,
}

impl TierCounters {
    /// The counts so far.
    pub(crate) fn hits(&self) -> TierHits {
        let s = self.served.get();
        let (failed, skipped) = self.admission.get();
        TierHits {
            samples_from_tier: s.samples_tier,
            samples_from_origin: s.samples_origin,
            bytes_from_tier: s.bytes_tier,
            bytes_from_origin: s.bytes_origin,
            samples_from_peers: s.samples_peers,
            bytes_from_peers: s.bytes_peers,
            admissions_failed: failed,
            admissions_skipped: skipped,
        }
    }

    /// Counts `samples` samples in `bytes` bytes that came from `from`.
    pub(crate) fn add(&self, from: BytesFrom, samples: u64, bytes: u64) {
        self.served.add(from, samples, bytes);
    }
}
