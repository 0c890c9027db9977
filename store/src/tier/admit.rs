//! Admission into the tier as streams feed it (copy-on-read): chunks and hot records offered
//! ([`Admission::offer`]) are written by a thread of its own.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use granary_format::ChunkEntry;

use super::{HotRecord, LocalTier};
use crate::counts::Meter;
use crate::error::StoreError;
use crate::peers::Peers;

/// Bytes a record of `stored` bytes at `path` costs in a hot chunk: those, its path and its
/// footer entry and path offset.
pub(crate) fn hot_cost(stored: u64, path: &[u8]) -> u64 {
    stored + path.len() as u64 + granary_format::SAMPLE_ENTRY_LEN as u64 + 8
}

/// Counts a failed admission into the tier at `dir` in `meter` (warning on the first); false if
/// the tier's file system is full, so that the stream stops admitting.
fn failed(meter: &Meter, dir: &Path, e: &StoreError) -> bool {
    let full = matches!(e, StoreError::Io { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded));
    if meter.admissions_failed.fetch_add(1, Relaxed) == 0 {
        let stop = full.then_some(", and this stream admits nothing more");
        log::warn!(
            "the local tier in {} could not store a chunk ({e}); reads go on from the source{}",
            dir.display(),
            stop.unwrap_or_default()
        );
    }
    !full
}

/// Work for the admission thread.
pub enum Job {
    /// A chunk's bytes (the read buffer itself, in the stream's budget while it waits) and its
    /// importance.
    Chunk(ChunkEntry, Arc<dyn AsRef<[u8]> + Send + Sync>, f64),
    /// Records to re-pack, and the size of the hot chunks to make of them.
    Hot(Vec<HotRecord>, u64),
}

impl Job {
    fn bytes(&self) -> u64 {
        match self {
            Job::Chunk(ce, ..) => ce.file_size,
            Job::Hot(r, _) => r
                .iter()
                .map(|r| hot_cost(r.stored.len() as u64, &r.path))
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

/// Offers waiting for the admission thread, their bytes, and whether the stream has finished.
#[derive(Default)]
struct Waiting {
    jobs: std::collections::VecDeque<Job>,
    bytes: u64,
    done: bool,
}

type Mailbox = (std::sync::Mutex<Waiting>, std::sync::Condvar);

/// Background admission into the tier: a queue of offers bounded in bytes. An offer the tier
/// has room for (or a chunk this node must keep for its peers) waits for room in the queue, so
/// the tier fills even when it writes slower than the source reads; an offer that would make
/// the full tier evict is dropped when the queue is full (the least valuable per byte first),
/// and counted ([`crate::MeterReading::admissions_skipped`]).
pub struct Admission {
    slot: Arc<Mailbox>,
    /// `None` if no thread could be started: offers are then dropped.
    thread: Option<std::thread::JoinHandle<()>>,
    max_waiting: u64,
    /// With a shared tier, only the chunk copies this node owns are admitted.
    peers: Option<Arc<Peers>>,
    cache: Arc<LocalTier>,
    counts: Arc<Meter>,
}

impl Admission {
    /// Starts admitting into `cache` what is offered (hot chunks carry the class table
    /// `classes`); failures and dropped offers are counted in `counts`.
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

    /// Offers `job` for admission (see the type's documentation for when it waits).
    pub fn offer(&self, job: Job) {
        // With a shared tier a chunk copy is admitted exactly when this node keeps it.
        let must_keep = match (&job, &self.peers) {
            (Job::Chunk(ce, ..), Some(p)) if !p.keeps(ce.chunk_id) => return,
            (Job::Chunk(..), Some(_)) => true,
            _ => false,
        };
        let (m, cv) = &*self.slot;
        let mut g = m.lock().expect("admission lock");
        let bytes = job.bytes();
        let fits = |used| used + g.bytes + bytes <= self.cache.quota;
        let wait = must_keep || matches!(job, Job::Chunk(..)) && self.cache.used().is_ok_and(fits);
        while wait && !g.jobs.is_empty() && g.bytes + bytes > self.max_waiting && !g.done {
            // Never wait on a thread that is gone.
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                self.counts.admissions_skipped.fetch_add(1, Relaxed);
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
        self.counts.admissions_skipped.fetch_add(skipped, Relaxed);
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
        let per_byte = |i: usize| g.jobs[i].per_byte();
        let worst = (0..g.jobs.len()).min_by(|&a, &b| per_byte(a).total_cmp(&per_byte(b)));
        if let Some(i) = worst.filter(|&i| per_byte(i) < job.per_byte()) {
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
/// has finished and nothing waits. Errors only cost a missed admission; on a full file system
/// it stops admitting.
fn admit_offers(slot: &Mailbox, cache: &LocalTier, classes: &[Vec<u8>], counts: &Meter) {
    let mut admitting = true;
    let (m, cv) = slot;
    loop {
        let mut g = m.lock().expect("admission lock");
        while g.jobs.is_empty() && !g.done {
            g = cv.wait(g).expect("admission lock");
        }
        let Some(job) = g.jobs.pop_front() else {
            return;
        };
        g.bytes -= job.bytes();
        drop(g);
        // An offer may be waiting for room in the queue.
        cv.notify_all();
        if !admitting {
            continue;
        }
        let admitted = match job {
            Job::Chunk(ce, bytes, score) => cache.admit(&ce, (*bytes).as_ref(), score).map(drop),
            // Hot chunks of about `target` bytes each (offers merge while one is written).
            Job::Hot(records, target) => {
                let mut bytes = 0;
                let mut ends = |r: &HotRecord| {
                    bytes += hot_cost(r.stored.len() as u64, &r.path);
                    let end = bytes >= target;
                    if end {
                        bytes = 0;
                    }
                    end
                };
                let mut groups = records.chunk_by(|r, _| !ends(r));
                groups.try_for_each(|group| cache.admit_hot(group, classes).map(drop))
            }
        };
        if let Err(e) = admitted {
            admitting &= failed(counts, cache.dir(), &e);
        }
    }
}
