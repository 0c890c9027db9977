//! Admission into the tier, as streams feed it (copy-on-read): chunks read from below the
//! tier and records harvested for hot chunks are offered ([`Admission::offer`]) and written by
//! a thread of its own, within a bound on the bytes waiting, the least valuable per byte
//! dropped first when the tier would have to evict.

use std::path::Path;
use std::sync::Arc;

use granary_format::ChunkEntry;

use super::{HotRecord, LocalTier};
use crate::counts::Meter;
use crate::error::StoreError;
use crate::peers::Peers;

/// Bytes a record costs in a hot chunk besides its stored bytes and path: its footer entry and
/// path offset.
pub const HOT_RECORD_OVERHEAD: u64 = granary_format::SAMPLE_ENTRY_LEN as u64 + 8;

/// Counts a failed admission into the tier at `dir` in `meter` (warning on the first); false if
/// the tier's file system is full, so that the stream stops admitting (it keeps serving what
/// the tier holds).
fn failed(meter: &Meter, dir: &Path, e: &StoreError) -> bool {
    let full = matches!(e, StoreError::Io { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded));
    if meter.admission_failed() == 0 {
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

/// Work for the admission thread: a source chunk's bytes with its importance, or records to
/// re-pack into a hot chunk.
pub enum Job {
    /// The chunk's bytes are the read buffer itself (counted in the stream's budget while
    /// they wait).
    Chunk(ChunkEntry, Arc<dyn AsRef<[u8]> + Send + Sync>, f64),
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
/// (in the tier layer's meter: [`crate::MeterReading::admissions_skipped`]).
pub struct Admission {
    slot: Arc<Mailbox>,
    /// `None` if no thread could be started: offers are then dropped (and counted).
    thread: Option<std::thread::JoinHandle<()>>,
    /// Most bytes of offers waiting for the admission thread (hot records included).
    max_waiting: u64,
    /// With a shared tier, only the chunk copies this node owns are admitted.
    peers: Option<Arc<Peers>>,
    cache: Arc<LocalTier>,
    counts: Arc<Meter>,
}

impl Admission {
    /// Starts admitting into `cache` what is offered, with at most `max_waiting` bytes of
    /// offers waiting; hot chunks carry the dataset's class table `classes`; with `peers`
    /// (a shared tier) only the chunk copies this node keeps are admitted. Failures and
    /// dropped offers are counted in `counts`, the tier layer's meter.
    pub fn start(
        cache: Arc<LocalTier>,
        classes: Vec<Vec<u8>>,
        max_waiting: u64,
        counts: Arc<Meter>,
        peers: Option<Arc<Peers>>,
    ) -> Admission {
        let slot: Arc<Mailbox> = Arc::default();
        let s2 = slot.clone();
        let (cache2, counts2) = (cache.clone(), counts.clone());
        let thread = std::thread::Builder::new()
            .name("granary-admit".into())
            .spawn(move || admit_offers(&s2, &cache2, &classes, &counts2))
            .ok();
        Admission {
            slot,
            thread,
            max_waiting,
            peers,
            cache,
            counts,
        }
    }

    /// Whether bytes a reader consumed are worth offering (a chunk read whole, records for hot
    /// chunks): only what did not come from a copy (this node's tier has it, or a peer keeps
    /// it for the job).
    pub fn takes(&self, read: &crate::engine::Completed) -> bool {
        !read.from().is_copy()
    }

    /// Offers `job` for admission (see the type's documentation for when it waits).
    pub fn offer(&self, job: Job) {
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
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                self.counts.admissions_skipped(1);
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
            self.counts.admissions_skipped(skipped);
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

    /// Lets the thread write what waits, and waits for it.
    pub fn finish(self) {
        {
            let (m, cv) = &*self.slot;
            m.lock().expect("admission lock").done = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread {
            let _ = t.join();
        }
    }
}

/// The admission thread: writes the offers of `slot` into the tier in order until the stream
/// has finished and nothing waits. Errors only cost a missed admission; the epoch goes on from
/// the source. On a full file system it stops admitting (offers are taken and dropped).
fn admit_offers(slot: &Mailbox, cache: &LocalTier, classes: &[Vec<u8>], counts: &Meter) {
    let mut admitting = true;
    loop {
        let job = {
            let (m, cv) = slot;
            let mut g = m.lock().expect("admission lock");
            while g.jobs.is_empty() && !g.done {
                g = cv.wait(g).expect("admission lock");
            }
            let job = g.jobs.pop_front();
            g.bytes -= job.as_ref().map_or(0, Job::bytes);
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
        let mut failed = |e: StoreError| {
            admitting &= failed(counts, cache.dir(), &e);
        };
        match job {
            Job::Chunk(ce, bytes, score) => {
                if let Err(e) = cache.admit(&ce, (*bytes).as_ref(), score) {
                    failed(e);
                }
            }
            Job::Hot(records, target) => {
                // Hot chunks of about `target` bytes each (offers merge while one is written).
                let mut group = Vec::new();
                let mut bytes = 0;
                for r in records {
                    bytes += r.stored.len() as u64 + HOT_RECORD_OVERHEAD + r.path.len() as u64;
                    group.push(r);
                    if bytes >= target {
                        if let Err(e) = cache.admit_hot(&group, classes) {
                            failed(e);
                            break;
                        }
                        group.clear();
                        bytes = 0;
                    }
                }
                if !group.is_empty() {
                    if let Err(e) = cache.admit_hot(&group, classes) {
                        failed(e);
                    }
                }
            }
        }
    }
}
