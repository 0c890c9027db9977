//! The local tier as a stream feeds it: hot chunks seen and fed (`HotState`), hits counted
//! (`TierCounters`), and the background admission thread (`Admission`). The tier's storage
//! itself (quota, policies, files, locking) is [`crate::cache`]; reading from it is the
//! [`crate::TierStore`] layer of the stream's stack; the stream's windows (the `window`
//! module) check, count and offer what they read.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::error::Result;
use crate::io::Completed;
use crate::{Dataset, LocalTier};
use granary_store::tier::{HotMap, HotRecord};
use granary_store::StoreStack;
use granary_store::{BytesFrom, ServedCounters, Source};

/// Bytes a record costs in a hot chunk besides its stored bytes and path: its footer entry and
/// path offset.
const HOT_RECORD_OVERHEAD: u64 = granary_format::SAMPLE_ENTRY_LEN as u64 + 8;

/// The hot chunks of an importance tier as one stream sees and feeds them: which samples
/// they hold (reloaded when another process changes them), which samples belong in them
/// (score per stored byte at or above `threshold`: the most important ones that fit the
/// quota), and the records harvested from source reads, waiting to be re-packed.
pub(crate) struct HotState {
    stack: StoreStack,
    cache: Arc<LocalTier>,
    scores: Arc<crate::ImportanceScores>,
    map: HotMap,
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
            map: cache.hot_map(),
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
            self.map = self.cache.hot_map();
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

    /// Drops hot chunk `h` (a record in it failed its CRC) from the tier and from this view.
    pub(crate) fn discard(&mut self, h: u32) -> Result<()> {
        self.map.forget(h);
        self.files.remove(&h);
        Ok(self.cache.discard_hot(h)?)
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
        self.pending.push(HotRecord {
            id,
            entry: info.entry,
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

#[derive(Default)]
pub(crate) struct TierCounters {
    served: ServedCounters,
    admissions_failed: AtomicU64,
    admissions_skipped: AtomicU64,
}

impl TierCounters {
    /// The counts so far.
    pub(crate) fn hits(&self) -> TierHits {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let s = self.served.get();
        TierHits {
            samples_from_tier: s.samples_tier,
            samples_from_origin: s.samples_origin,
            bytes_from_tier: s.bytes_tier,
            bytes_from_origin: s.bytes_origin,
            samples_from_peers: s.samples_peers,
            bytes_from_peers: s.bytes_peers,
            admissions_failed: l(&self.admissions_failed),
            admissions_skipped: l(&self.admissions_skipped),
        }
    }

    /// Counts a failed admission (warning on the first); false if the tier's file system is
    /// full, so that the stream stops admitting (it keeps serving what the tier holds).
    fn admission_failed(&self, dir: &std::path::Path, e: &granary_store::StoreError) -> bool {
        let full = matches!(e, granary_store::StoreError::Io { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded));
        if self.admissions_failed.fetch_add(1, Relaxed) == 0 {
            log::warn!(
                "the local tier in {} could not store a chunk ({e}); reads go \
                 on from the source{}",
                dir.display(),
                if full {
                    ", and this stream admits nothing more"
                } else {
                    ""
                }
            );
        }
        !full
    }

    /// Counts `samples` samples in `bytes` bytes that came from `from`.
    pub(crate) fn add(&self, from: BytesFrom, samples: u64, bytes: u64) {
        self.served.add(from, samples, bytes);
    }
}

/// Work for the admission thread: a source chunk's bytes with its importance, or records to
/// re-pack into a hot chunk.
pub(crate) enum Job {
    /// The chunk's bytes are the read buffer itself (counted in the stream's budget while
    /// they wait).
    Chunk(granary_format::ChunkEntry, Arc<Completed>, f64),
    /// Records, and the size of the hot chunks to make of them.
    Hot(Vec<HotRecord>, u64),
}

impl Job {
    fn bytes(&self) -> u64 {
        match self {
            Job::Chunk(ce, ..) => ce.file_size,
            Job::Hot(r, _) => r
                .iter()
                .map(|r| r.stored.len() as u64 + HOT_RECORD_OVERHEAD + r.path.len() as u64)
                .sum(),
        }
    }

    fn per_byte(&self) -> f64 {
        let score = match self {
            Job::Chunk(_, _, s) => *s,
            Job::Hot(r, _) => r.iter().map(|r| r.score).sum(),
        };
        score / self.bytes().max(1) as f64
    }
}

/// Offers waiting for the admission thread (and their bytes), and whether the stream has
/// finished.
#[derive(Default)]
struct Waiting {
    jobs: std::collections::VecDeque<Job>,
    bytes: u64,
    done: bool,
}

type Mailbox = (std::sync::Mutex<Waiting>, std::sync::Condvar);

/// Background admission into the tier: a queue of offers bounded in bytes, written by a
/// thread of its own. An offer the tier has room for (or, with shared tiers, a chunk this node
/// must keep) waits for room in the queue, so the tier fills completely even when it writes
/// slower than the source reads; an offer that would make the full tier evict is dropped when
/// the queue is full (the least valuable per byte first), and counted
/// ([`TierHits::admissions_skipped`]).
pub(crate) struct Admission {
    slot: Arc<Mailbox>,
    thread: std::thread::JoinHandle<()>,
    /// Most bytes of offers waiting for the admission thread (hot records included).
    max_waiting: u64,
    /// With a shared tier, only the chunk copies this node owns are admitted.
    peers: Option<Arc<crate::Peers>>,
    cache: Arc<LocalTier>,
    stats: Arc<TierCounters>,
}

impl Admission {
    pub(crate) fn start(
        cache: Arc<LocalTier>,
        ds: Arc<Dataset>,
        max_waiting: u64,
        stats: Arc<TierCounters>,
        peers: Option<Arc<crate::Peers>>,
    ) -> Admission {
        let slot: Arc<Mailbox> = Arc::default();
        let s2 = slot.clone();
        let (cache2, stats2) = (cache.clone(), stats.clone());
        let thread = std::thread::spawn(move || admit_offers(&s2, &cache2, &ds, &stats2));
        Admission {
            slot,
            thread,
            max_waiting,
            peers,
            cache,
            stats,
        }
    }

    pub(crate) fn offer(&self, job: Job) {
        // With a shared tier a chunk copy is admitted exactly when this node keeps it, and then
        // it must be: other nodes will ask for it.
        let must_keep = match (&job, &self.peers) {
            (Job::Chunk(ce, ..), Some(p)) if !p.keeps(ce.chunk_id) => return,
            (Job::Chunk(..), Some(_)) => true,
            _ => false,
        };
        let (m, cv) = &*self.slot;
        let mut g = m.lock().expect("admission lock");
        // An offer the tier will take without evicting waits for room (the stream's read-ahead
        // waits with it: the chunk's buffer is in its budget) instead of being dropped.
        let wait = must_keep
            || matches!(job, Job::Chunk(..))
                && self
                    .cache
                    .used()
                    .is_ok_and(|u| u + g.bytes + job.bytes() <= self.cache.quota());
        let bytes = job.bytes();
        while wait && !g.jobs.is_empty() && g.bytes + bytes > self.max_waiting && !g.done {
            // Never wait on a thread that is gone.
            if self.thread.is_finished() {
                return;
            }
            g = cv
                .wait_timeout(g, std::time::Duration::from_millis(100))
                .expect("admission lock")
                .0;
        }
        let skipped = self.enqueue(&mut g, job, wait);
        drop(g);
        cv.notify_all();
        if skipped > 0 {
            self.stats.admissions_skipped.fetch_add(skipped, Relaxed);
        }
    }

    /// Queues `job` (`wait`: room was waited for; otherwise, in a full queue, the least
    /// valuable offer per byte goes); returns how many offers were dropped.
    fn enqueue(&self, g: &mut Waiting, job: Job, wait: bool) -> u64 {
        let bytes = job.bytes();
        let fits = g.bytes + bytes <= self.max_waiting;
        let job = match job {
            Job::Hot(more, target) => {
                // Hot records join waiting ones (they are grouped into hot chunks as written);
                // past the cap the newer records wait for the next epoch's harvest.
                let waiting = g.jobs.iter_mut().find_map(|j| match j {
                    Job::Hot(w, _) => Some(w),
                    _ => None,
                });
                match waiting {
                    Some(w) if fits => {
                        w.extend(more);
                        g.bytes += bytes;
                        return 0;
                    }
                    Some(_) => return 1,
                    None => Job::Hot(more, target),
                }
            }
            job => job,
        };
        if wait || g.jobs.is_empty() || fits {
            g.bytes += bytes;
            g.jobs.push_back(job);
            return 0;
        }
        // Full: the least valuable per byte (waiting or this one) goes.
        let worst = g
            .jobs
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.per_byte().total_cmp(&b.1.per_byte()))
            .map(|(i, j)| (i, j.per_byte()));
        if let Some((i, _)) = worst.filter(|&(_, w)| w < job.per_byte()) {
            let old = g.jobs.remove(i).expect("index from the queue");
            g.bytes -= old.bytes();
            g.bytes += bytes;
            g.jobs.push_back(job);
        }
        1
    }

    pub(crate) fn finish(self) {
        {
            let (m, cv) = &*self.slot;
            m.lock().expect("admission lock").done = true;
            cv.notify_all();
        }
        let _ = self.thread.join();
    }
}

/// The admission thread: writes the offers of `slot` into the tier in order until the stream
/// has finished and nothing waits. Errors only cost a missed admission; the epoch goes on from
/// the source. On a full file system it stops admitting (offers are taken and dropped).
fn admit_offers(slot: &Mailbox, cache: &LocalTier, ds: &Dataset, stats: &TierCounters) {
    let mut admitting = true;
    loop {
        let job = {
            let (m, cv) = slot;
            let mut g = m.lock().expect("admission lock");
            while g.jobs.is_empty() && !g.done {
                g = cv.wait(g).expect("admission lock");
            }
            let job = g.jobs.pop_front();
            if let Some(j) = &job {
                g.bytes -= j.bytes();
            }
            // An offer may be waiting for room in the queue.
            cv.notify_all();
            match job {
                Some(j) => j,
                None => return,
            }
        };
        if !admitting {
            continue;
        }
        let mut failed = |e: granary_store::StoreError| {
            admitting &= stats.admission_failed(cache.dir(), &e);
        };
        match job {
            Job::Chunk(ce, bytes, score) => {
                if let Err(e) = cache.admit(&ce, bytes.data(), score) {
                    failed(e);
                }
            }
            Job::Hot(records, target) => {
                let classes = ds.classes().unwrap_or_default();
                // Hot chunks of about `target` bytes each (offers merge while one is written).
                let mut group = Vec::new();
                let mut bytes = 0;
                for r in records {
                    bytes += r.stored.len() as u64 + HOT_RECORD_OVERHEAD + r.path.len() as u64;
                    group.push(r);
                    if bytes >= target {
                        if let Err(e) = cache.admit_hot(&group, &classes) {
                            failed(e);
                            break;
                        }
                        group.clear();
                        bytes = 0;
                    }
                }
                if !group.is_empty() {
                    if let Err(e) = cache.admit_hot(&group, &classes) {
                        failed(e);
                    }
                }
            }
        }
    }
}
