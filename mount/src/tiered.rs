//! Whole samples for the mount: from the local tier when it holds the sample's chunk, else
//! from the dataset's own storage, CRC-checked either way; and Monarch's placement: a sample
//! missing from the tier has its whole chunk copied into the tier by a fetch thread (one large
//! sequential read instead of many small random ones), and later samples of that chunk come
//! from local storage. The read waits for that fetch when the chunk fits the tier's free space
//! or is already on its way; otherwise (a full tier that would evict for it) it reads its own
//! record from the origin meanwhile. The tier's policy and quota decide what stays.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use granary::{
    Access, BytesFrom, ChunkBytes, Dataset, ImportanceScores, LayerReading, LocalTier, ReadError,
    SampleInfo, SampleReader, ServedCounters,
};
use serde::Serialize;

/// How long a chunk the tier declined is not offered again (the tier may change meanwhile).
const DECLINED_FOR: Duration = Duration::from_secs(30);
/// Chunks fetched at once (each holds one chunk in memory while it is read and admitted).
const FETCH_THREADS: usize = 3;
/// Longest a read waits for its chunk's fetch before it reads the origin itself.
const WAIT_FOR_FETCH: Duration = Duration::from_secs(60);
/// Misses remembered to tell an order that reads chunks together from a random one, and how
/// many of them must be on one chunk before it is fetched at the cost of an eviction (a
/// quarter: a chunk-wise order with windows of up to 4 chunks; a random order over more than
/// ~16 chunks rarely).
const RECENT_MISSES: usize = 32;
const DENSE_MISSES: usize = 8;
/// How often the node's score table is re-read (the training loop keeps reporting into it).
const SCORES_EVERY: Duration = Duration::from_secs(30);

/// Counters of a mount, as `user.granary.stats` shows them.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ReadStats {
    pub samples_from_tier: u64,
    pub samples_from_origin: u64,
    pub bytes_from_tier: u64,
    pub bytes_from_origin: u64,
    /// Chunks copied into the tier by the background fetcher, and their bytes.
    pub chunks_fetched: u64,
    pub bytes_fetched: u64,
    /// Chunks fetched that the tier then declined, and fetches skipped because it would have.
    pub chunks_declined: u64,
    pub fetches_skipped: u64,
    /// Fetches that failed (the samples still came from the origin).
    pub fetch_errors: u64,
    /// Reads answered with EIO: damaged records or unreadable storage.
    pub read_errors: u64,
    /// Tier copies found damaged, removed, and read from the origin instead.
    pub tier_copies_discarded: u64,
}

#[derive(Default)]
struct Counters {
    served: ServedCounters,
    fetched: AtomicU64,
    bytes_fetched: AtomicU64,
    declined: AtomicU64,
    skipped: AtomicU64,
    fetch_errors: AtomicU64,
    read_errors: AtomicU64,
    discarded: AtomicU64,
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Relaxed);
}

/// The fetch queue: chunks waiting, the one being fetched, and recently declined ones.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<u32>,
    queued: HashSet<u32>,
    declined: HashMap<u32, Instant>,
    /// Chunks of the latest misses that would need an eviction.
    recent: VecDeque<u32>,
    stop: bool,
}

struct Tier {
    cache: Arc<LocalTier>,
    queue: Mutex<Queue>,
    /// Fetch threads wait here for work.
    wake: Condvar,
    /// Readers wait here for a fetch to end.
    fetched: Condvar,
    /// Chunks fetched and checked, while the tier writes them: readers are served from here.
    staged: Mutex<HashMap<u32, Arc<ChunkBytes>>>,
    scores: Mutex<(Option<Arc<ImportanceScores>>, Option<Instant>)>,
}

/// Reads whole samples for the mount. `Sync`: the FUSE threads share one.
pub struct TieredReader {
    /// Reads through the store stack: the tier's copies (one open per copy), else origin.
    reader: Arc<SampleReader>,
    tier: Option<Arc<Tier>>,
    counters: Arc<Counters>,
    fetchers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Whether first touches of a chunk fetch it (false: the tier is only read).
    fetching: AtomicBool,
}

impl TieredReader {
    /// Reads `ds`, with `cache` as its local tier when given; `fetch` starts the background
    /// fetcher that copies first-touched chunks into the tier.
    pub fn new(
        ds: Arc<Dataset>,
        cache: Option<Arc<LocalTier>>,
        fetch: bool,
    ) -> Result<TieredReader, ReadError> {
        let counters: Arc<Counters> = Arc::default();
        let stack = ds.stack(Access::positional(), cache.clone(), None)?;
        let reader = Arc::new(SampleReader::with_stack(ds, stack));
        let tier = cache.map(|cache| {
            Arc::new(Tier {
                cache,
                queue: Mutex::default(),
                wake: Condvar::new(),
                fetched: Condvar::new(),
                staged: Mutex::default(),
                scores: Mutex::new((None, None)),
            })
        });
        let fetchers = match (&tier, fetch) {
            (Some(t), true) => (0..FETCH_THREADS)
                .map(|i| {
                    let (t, r, c) = (t.clone(), reader.clone(), counters.clone());
                    std::thread::Builder::new()
                        .name(format!("granary-fetch-{i}"))
                        .spawn(move || fetch_loop(&t, &r, &c))
                        .expect("spawning a fetch thread")
                })
                .collect(),
            _ => Vec::new(),
        };
        Ok(TieredReader {
            reader,
            fetching: AtomicBool::new(!fetchers.is_empty()),
            tier,
            counters,
            fetchers: Mutex::new(fetchers),
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<Dataset> {
        self.reader.dataset()
    }

    /// The counters so far.
    pub fn stats(&self) -> ReadStats {
        let c = &*self.counters;
        let l = |a: &AtomicU64| a.load(Relaxed);
        let served = c.served.get();
        ReadStats {
            // Chunks a peer served count as origin's here: the mount reads without peers.
            samples_from_tier: served.samples_tier,
            samples_from_origin: served.samples_origin + served.samples_peers,
            bytes_from_tier: served.bytes_tier,
            bytes_from_origin: served.bytes_origin + served.bytes_peers,
            chunks_fetched: l(&c.fetched),
            bytes_fetched: l(&c.bytes_fetched),
            chunks_declined: l(&c.declined),
            fetches_skipped: l(&c.skipped),
            fetch_errors: l(&c.fetch_errors),
            read_errors: l(&c.read_errors),
            tier_copies_discarded: l(&c.discarded),
        }
    }

    /// Sample `id`'s original bytes, CRC-checked: from the tier's copy of its chunk if there
    /// is one (a damaged copy is removed and the origin read instead), else after fetching
    /// the chunk into the tier (see `fetch_and_wait`), else from the origin.
    pub fn read(&self, id: u64) -> Result<Vec<u8>, ReadError> {
        let r = self.read_inner(id);
        if r.is_err() {
            add(&self.counters.read_errors, 1);
        }
        r
    }

    fn read_inner(&self, id: u64) -> Result<Vec<u8>, ReadError> {
        let ds = self.dataset();
        let info = ds.sample(id)?;
        let chunk = info.entry.chunk;
        let mut out = vec![0u8; info.entry.orig_len as usize];
        // A damaged tier copy is dropped and the read starts over once (the chunk may be
        // fetched again); a second damaged copy sends the read to the origin.
        for _ in 0..2 {
            if let Some(data) = self.read_staged(&info)? {
                return Ok(self.count(&info, BytesFrom::Tier, data));
            }
            let mut src = self.reader.source(chunk)?;
            // A miss: the whole chunk is fetched (one large read) and this read waits for it,
            // unless a full tier would have to evict for a chunk that only this read wants
            // (see `fetch_and_wait`); then the origin answers.
            if let (Some(t), false) = (&self.tier, src.bytes_from().is_copy()) {
                if self.fetching.load(Relaxed) {
                    let ce = ds.chunk(chunk)?;
                    let fits = t.cache.used()? + ce.file_size <= t.cache.quota();
                    if t.fetch_and_wait(chunk, fits) {
                        if let Some(data) = self.read_staged(&info)? {
                            return Ok(self.count(&info, BytesFrom::Tier, data));
                        }
                        src = self.reader.source(chunk)?;
                    }
                }
            }
            match self.reader.read_from(&src, &info, &mut out) {
                Ok(()) => return Ok(self.count(&info, src.bytes_from(), out)),
                // Never served: the copy is given up (the tier drops it, logged), and the
                // read starts over.
                Err(e) if src.bytes_from().is_copy() => {
                    self.reader.fall_back(chunk, &src, &e)?;
                    add(&self.counters.discarded, 1);
                }
                Err(e) => return Err(e),
            }
        }
        // Two copies failed: read through whatever serves the chunk now, past every copy that
        // fails, without fetching again.
        let from = self.reader.read_served(&info, &mut out)?;
        Ok(self.count(&info, from, out))
    }

    /// Counts a sample read from `from`.
    fn count(&self, info: &SampleInfo, from: BytesFrom, data: Vec<u8>) -> Vec<u8> {
        self.counters.served.add(from, 1, info.entry.stored_len);
        data
    }

    /// The sample from a chunk just fetched and checked, while the tier writes it.
    fn read_staged(&self, info: &SampleInfo) -> Result<Option<Vec<u8>>, ReadError> {
        let Some(t) = &self.tier else {
            return Ok(None);
        };
        let staged = t
            .staged
            .lock()
            .expect("staged")
            .get(&info.entry.chunk)
            .cloned();
        // Whole-file CRC checked when fetched; the record's own CRC is checked again here.
        staged
            .map(|bytes| Ok(self.dataset().decode_from(&bytes, info.id)?.into_owned()))
            .transpose()
    }

    /// Forgets the open tier copies (after the tier's content changed elsewhere, a copy we
    /// hold open may have been evicted; its bytes stay valid but its space is not freed
    /// until it is closed).
    pub fn close_copies(&self) {
        self.reader.forget(|_, s| s.bytes_from().is_copy());
    }

    /// Stops the fetcher (waiting for a fetch in progress to finish).
    pub fn shutdown(&self) {
        self.fetching.store(false, Relaxed);
        if let Some(t) = &self.tier {
            t.queue.lock().expect("fetch queue").stop = true;
            t.wake.notify_all();
            t.fetched.notify_all();
        }
        for h in std::mem::take(&mut *self.fetchers.lock().expect("fetchers")) {
            let _ = h.join();
        }
    }

    /// Asks for chunk `chunk` to be fetched into the tier (no-op without a fetcher); returns
    /// whether it is queued or being fetched.
    pub fn prefetch(&self, chunk: u32) -> bool {
        match (&self.tier, self.fetching.load(Relaxed)) {
            (Some(t), true) => t.request(chunk),
            _ => false,
        }
    }

    /// What passed through each layer of the reader's store stack so far, top first.
    pub fn layers(&self) -> Vec<LayerReading> {
        self.reader
            .stack()
            .layers()
            .into_iter()
            .map(|(layer, reading)| LayerReading { layer, reading })
            .collect()
    }

    /// Where the tier is, if there is one.
    pub fn tier_dir(&self) -> Option<PathBuf> {
        self.tier.as_ref().map(|t| t.cache.dir().to_path_buf())
    }
}

impl Drop for TieredReader {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Tier {
    /// Queues `chunk` for fetching (unless queued, being fetched, or recently declined);
    /// returns whether it is queued or being fetched now.
    fn request(&self, chunk: u32) -> bool {
        let mut q = self.queue.lock().expect("fetch queue");
        self.enqueue(&mut q, chunk)
    }

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

    /// Queues `chunk` (when it `fits` the tier's free space, or a quarter of the latest misses
    /// were on it), moves
    /// it to the front and waits until its fetch ended (at most [`WAIT_FOR_FETCH`]). False
    /// when this read should go to the origin (not fetched, declined, stopping, timed out).
    fn fetch_and_wait(&self, chunk: u32, fits: bool) -> bool {
        let mut q = self.queue.lock().expect("fetch queue");
        let was_queued = q.queued.contains(&chunk);
        // A chunk that needs an eviction is fetched only while the misses concentrate on it
        // (an order that reads a chunk's samples together, such as the chunk-wise sampler's):
        // under a random order over a tier smaller than the dataset each chunk would be
        // fetched again and again for a sample or two, evicting what was just fetched.
        if !fits && !was_queued {
            q.recent.push_back(chunk);
            if q.recent.len() > RECENT_MISSES {
                q.recent.pop_front();
            }
            let share = q.recent.iter().filter(|&&c| c == chunk).count();
            if share < DENSE_MISSES {
                return false;
            }
        }
        if !self.enqueue(&mut q, chunk) {
            return false;
        }
        if let Some(i) = q.waiting.iter().position(|&c| c == chunk) {
            q.waiting.remove(i);
            q.waiting.push_front(chunk);
        }
        let t0 = Instant::now();
        while q.queued.contains(&chunk) && !q.stop && !self.is_staged(chunk) {
            let Some(left) = WAIT_FOR_FETCH.checked_sub(t0.elapsed()) else {
                return false;
            };
            q = self.fetched.wait_timeout(q, left).expect("fetch queue").0;
        }
        !q.stop
    }

    fn is_staged(&self, chunk: u32) -> bool {
        self.staged.lock().expect("staged").contains_key(&chunk)
    }

    /// The node's score table (re-read every 30 s), if the training loop wrote one.
    fn scores(&self) -> Option<Arc<ImportanceScores>> {
        let mut s = self.scores.lock().expect("scores");
        if s.1.is_none_or(|t| t.elapsed() >= SCORES_EVERY) {
            let path = self.cache.scores_path();
            s.0 = path
                .exists()
                .then(|| ImportanceScores::load(&path).ok().map(Arc::new))
                .flatten();
            s.1 = Some(Instant::now());
        }
        s.0.clone()
    }
}

/// The fetcher: takes chunks in the order they were first touched, skips those the tier
/// holds or would decline, reads the rest whole (one large read) and offers them.
fn fetch_loop(t: &Tier, r: &SampleReader, c: &Counters) {
    loop {
        let chunk = {
            let mut q = t.queue.lock().expect("fetch queue");
            loop {
                if q.stop {
                    return;
                }
                if let Some(c) = q.waiting.pop_front() {
                    break c;
                }
                q = t.wake.wait(q).expect("fetch queue");
            }
        };
        let outcome = fetch_one(t, r, c, chunk);
        let mut q = t.queue.lock().expect("fetch queue");
        q.queued.remove(&chunk);
        t.fetched.notify_all();
        match outcome {
            Ok(true) => {}
            Ok(false) => {
                q.declined.insert(chunk, Instant::now());
            }
            Err(e) => {
                add(&c.fetch_errors, 1);
                q.declined.insert(chunk, Instant::now());
                log::warn!("mount: fetching chunk {chunk} into the tier: {e}");
            }
        }
    }
}

/// Fetches one chunk; false when the tier holds it already or declined it.
fn fetch_one(t: &Tier, r: &SampleReader, c: &Counters, chunk: u32) -> Result<bool, ReadError> {
    let ds = r.dataset();
    let ce = ds.chunk(chunk)?;
    if t.cache.resident_chunks()?.contains(&chunk) {
        return Ok(true);
    }
    let score = match t.scores() {
        Some(s) if s.len() == ds.len() => ce.samples().map(|id| s.score(id)).sum(),
        _ => ce.sample_count as f64,
    };
    if !t.cache.would_admit(ce.file_size, score)? {
        add(&c.skipped, 1);
        return Ok(false);
    }
    let bytes = Arc::new(ds.load_chunk(chunk)?);
    add(&c.bytes_fetched, bytes.len() as u64);
    if bytes.len() as u64 != ce.file_size || crc32fast::hash(&bytes) != ce.file_crc {
        return Err(ReadError::invalid(format!(
            "chunk {chunk} ({}): its whole-file CRC does not match the snapshot",
            ds.chunk_path(chunk).display()
        )));
    }
    // Checked: readers waiting for this chunk are served from memory now, not after the
    // tier's write and fsync.
    t.staged
        .lock()
        .expect("staged")
        .insert(chunk, bytes.clone());
    drop(t.queue.lock().expect("fetch queue"));
    t.fetched.notify_all();
    let admitted = t.cache.admit(&ce, &bytes, score);
    t.staged.lock().expect("staged").remove(&chunk);
    if admitted? {
        add(&c.fetched, 1);
        // Admission may have evicted copies held open here: let their space go.
        r.forget(|_, s| s.bytes_from().is_copy());
        Ok(true)
    } else {
        add(&c.declined, 1);
        Ok(false)
    }
}
