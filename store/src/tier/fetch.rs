//! Fetch on first touch, the tier's admission for readers of single samples (the mount): a
//! sample missing from the tier has its whole chunk copied in by a fetch thread (one large
//! read instead of many small ones). A read may wait for its chunk's fetch when the chunk fits
//! the tier's free space or is on its way; a chunk the full tier would evict for is fetched
//! only while the misses concentrate on it. A fetched chunk is checked against the snapshot
//! and served from memory while the tier writes it. The tier's policy decides what stays.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use granary_format::ChunkEntry;

use super::TierStore;
use crate::counts::Meter;
use crate::error::{Result, StoreError};
use crate::file::{read_whole, ChunkBytes};

/// How long a chunk the tier declined is not offered again (the tier may change meanwhile).
const DECLINED_FOR: Duration = Duration::from_secs(30);
/// Longest a read waits for its chunk's fetch before it reads the store below itself.
const WAIT_FOR_FETCH: Duration = Duration::from_secs(60);
/// Misses remembered, and how many must be on one chunk before it is fetched at the cost of an
/// eviction (a quarter: a chunk-wise order with windows of up to 4 chunks).
const RECENT_MISSES: usize = 32;
const DENSE_MISSES: usize = 8;

/// How important a chunk is, for the tier's admission.
pub type ChunkScore = Arc<dyn Fn(&ChunkEntry) -> f64 + Send + Sync>;

/// The fetch queue: chunks waiting, the ones being fetched, and recently declined ones.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<u32>,
    queued: HashSet<u32>,
    declined: HashMap<u32, Instant>,
    /// Chunks of the latest misses that would need an eviction.
    recent: VecDeque<u32>,
    /// Chunks fetched and checked, while the tier writes them: readers are served from here.
    staged: HashMap<u32, Arc<ChunkBytes>>,
    stop: bool,
}

/// What the fetch threads and the readers share.
struct State {
    tier: TierStore,
    queue: Mutex<Queue>,
    /// Fetch threads wait here for work.
    wake: Condvar,
    /// Readers wait here for a fetch to end.
    fetched: Condvar,
    score: ChunkScore,
    /// Called after the tier admitted a chunk (it may have evicted copies a reader holds open).
    admitted: Arc<dyn Fn() + Send + Sync>,
    meter: Arc<Meter>,
}

/// Fetch-on-first-touch admission into one stack's tier, with threads of its own (stopped
/// when dropped).
pub struct Fetcher {
    state: Arc<State>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Fetcher {
    /// Starts `threads` fetch threads admitting into `tier` (each holds one chunk in memory).
    pub(crate) fn start(
        tier: TierStore,
        threads: usize,
        score: ChunkScore,
        admitted: Arc<dyn Fn() + Send + Sync>,
        meter: Arc<Meter>,
    ) -> Fetcher {
        let state = Arc::new(State {
            tier,
            queue: Mutex::default(),
            wake: Condvar::new(),
            fetched: Condvar::new(),
            score,
            admitted,
            meter,
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = state.clone();
            match std::thread::Builder::new()
                .name(format!("granary-fetch-{i}"))
                .spawn(move || fetch_loop(&s))
            {
                Ok(h) => handles.push(h),
                Err(e) => log::warn!("cannot start fetch thread {i}: {e}"),
            }
        }
        if handles.is_empty() {
            // No thread to fetch: every request is declined, every read goes below.
            state.queue.lock().expect("fetch queue").stop = true;
        }
        Fetcher {
            state,
            threads: Mutex::new(handles),
        }
    }

    /// Chunk `chunk`'s bytes for a read that missed the tier, in memory once fetched and
    /// checked: queued (when it fits the tier's free space, or a quarter of the latest misses
    /// were on it) at the front and waited for. `None` when the read should go to the tier's
    /// copy or below it.
    pub(crate) fn fetched(&self, chunk: u32) -> Result<Option<Arc<ChunkBytes>>> {
        let (s, cache) = (&self.state, &self.state.tier.cache);
        if let Some(b) = s.queue.lock().expect("fetch queue").staged.get(&chunk) {
            return Ok(Some(b.clone()));
        }
        let size = s.tier.chunks.get(chunk as usize).map(|ce| ce.file_size);
        let fits = cache.used()?.saturating_add(size.unwrap_or(u64::MAX)) <= cache.quota;
        let mut q = s.queue.lock().expect("fetch queue");
        let was_queued = q.queued.contains(&chunk);
        // Under a random order over a tier smaller than the dataset each chunk would be
        // fetched again and again for a sample or two, evicting what was just fetched.
        if !fits && !was_queued {
            q.recent.push_back(chunk);
            if q.recent.len() > RECENT_MISSES {
                q.recent.pop_front();
            }
            let share = q.recent.iter().filter(|&&c| c == chunk).count();
            if share < DENSE_MISSES {
                return Ok(None);
            }
        }
        if !s.enqueue(&mut q, chunk) {
            return Ok(None);
        }
        if let Some(i) = q.waiting.iter().position(|&c| c == chunk) {
            q.waiting.remove(i);
            q.waiting.push_front(chunk);
        }
        let t0 = Instant::now();
        while q.queued.contains(&chunk) && !q.stop && !q.staged.contains_key(&chunk) {
            let Some(left) = WAIT_FOR_FETCH.checked_sub(t0.elapsed()) else {
                return Ok(None);
            };
            q = s.fetched.wait_timeout(q, left).expect("fetch queue").0;
        }
        Ok(q.staged.get(&chunk).filter(|_| !q.stop).cloned())
    }

    /// Stops the fetch threads (waiting for a fetch in progress); later requests are declined.
    pub(crate) fn stop(&self) {
        let s = &self.state;
        s.queue.lock().expect("fetch queue").stop = true;
        s.wake.notify_all();
        s.fetched.notify_all();
        for h in std::mem::take(&mut *self.threads.lock().expect("fetch threads")) {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fetcher")
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.stop();
    }
}

impl State {
    fn enqueue(&self, q: &mut Queue, chunk: u32) -> bool {
        if q.stop {
            return false;
        }
        if q.queued.contains(&chunk) {
            return true;
        }
        if let Some(t) = q.declined.get(&chunk) {
            if t.elapsed() < DECLINED_FOR {
                return false;
            }
            q.declined.remove(&chunk);
        }
        q.queued.insert(chunk);
        q.waiting.push_back(chunk);
        self.wake.notify_one();
        true
    }

    /// Fetches one chunk; false when the tier holds it already or declined it.
    fn fetch_one(&self, chunk: u32) -> Result<bool> {
        let t = &self.tier;
        let Some(ce) = t.chunks.get(chunk as usize).cloned() else {
            return Err(StoreError::Invalid(format!(
                "no chunk {chunk} in the dataset"
            )));
        };
        let cache = &t.cache;
        if cache.current()?.index.contains_key(&super::Key::copy(&ce)) {
            return Ok(true);
        }
        // Skipped when the tier would decline it now (evicting nothing).
        let score = (self.score)(&ce);
        let per_byte = score / ce.file_size.max(1) as f64;
        if cache
            .victims(&cache.current()?.index, ce.file_size, per_byte)
            .is_none()
        {
            self.meter.fetches_skipped.fetch_add(1, Relaxed);
            return Ok(false);
        }
        let src = t.next.open_chunk(chunk)?;
        let bytes = Arc::new(read_whole(&*src)?);
        self.meter
            .bytes_fetched
            .fetch_add(bytes.len() as u64, Relaxed);
        super::LocalTier::check_copy(&ce, &bytes, src.location())?;
        // Readers waiting for this chunk are served from memory now, not after the tier's write.
        let mut q = self.queue.lock().expect("fetch queue");
        q.staged.insert(chunk, bytes.clone());
        drop(q);
        self.fetched.notify_all();
        let admitted = cache.admit_checked(&ce, &bytes, score);
        self.queue
            .lock()
            .expect("fetch queue")
            .staged
            .remove(&chunk);
        if admitted? {
            self.meter.chunks_fetched.fetch_add(1, Relaxed);
            (self.admitted)();
            Ok(true)
        } else {
            self.meter.fetches_declined.fetch_add(1, Relaxed);
            Ok(false)
        }
    }
}

/// A fetch thread: fetches chunks in the order they were first touched.
fn fetch_loop(s: &State) {
    loop {
        let mut q = s.queue.lock().expect("fetch queue");
        while !q.stop && q.waiting.is_empty() {
            q = s.wake.wait(q).expect("fetch queue");
        }
        let (false, Some(chunk)) = (q.stop, q.waiting.pop_front()) else {
            return;
        };
        drop(q);
        let outcome = s.fetch_one(chunk);
        let mut q = s.queue.lock().expect("fetch queue");
        q.queued.remove(&chunk);
        s.fetched.notify_all();
        if let Err(e) = &outcome {
            s.meter.fetch_errors.fetch_add(1, Relaxed);
            log::warn!("fetching chunk {chunk} into the tier: {e}");
        }
        if !matches!(outcome, Ok(true)) {
            q.declined.insert(chunk, Instant::now());
        }
    }
}
