//! Whole samples for the mount: from the local tier when it holds the sample's chunk, else
//! from the dataset's own storage, CRC-checked either way; and Monarch's placement: a sample
//! read from the dataset's storage asks a background thread to copy its whole chunk into the
//! tier (one large sequential read instead of many small random ones), so that later samples
//! of that chunk come from local storage. The tier's policy and quota decide what stays.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use granary::{ChunkCache, Dataset, ImportanceScores, ReadError, SampleInfo, SampleReader};
use granary_format::decode_record;
use serde::Serialize;

/// Open tier copies kept at most (then all are closed and reopened as needed).
const MAX_OPEN_COPIES: usize = 256;
/// How long a chunk the tier declined is not offered again (the tier may change meanwhile).
const DECLINED_FOR: Duration = Duration::from_secs(30);
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
    samples_tier: AtomicU64,
    samples_origin: AtomicU64,
    bytes_tier: AtomicU64,
    bytes_origin: AtomicU64,
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
    stop: bool,
}

struct Tier {
    cache: Arc<ChunkCache>,
    copies: Mutex<HashMap<u32, Arc<File>>>,
    queue: Mutex<Queue>,
    wake: Condvar,
    scores: Mutex<(Option<Arc<ImportanceScores>>, Option<Instant>)>,
}

/// Reads whole samples for the mount. `Sync`: the FUSE threads share one.
pub struct TieredReader {
    origin: SampleReader,
    tier: Option<Arc<Tier>>,
    counters: Arc<Counters>,
    fetcher: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Whether first touches of a chunk fetch it (false: the tier is only read).
    fetching: AtomicBool,
}

impl TieredReader {
    /// Reads `ds`, with `cache` as its local tier when given; `fetch` starts the background
    /// fetcher that copies first-touched chunks into the tier.
    pub fn new(ds: Arc<Dataset>, cache: Option<Arc<ChunkCache>>, fetch: bool) -> TieredReader {
        let counters: Arc<Counters> = Arc::default();
        let tier = cache.map(|cache| {
            Arc::new(Tier {
                cache,
                copies: Mutex::default(),
                queue: Mutex::default(),
                wake: Condvar::new(),
                scores: Mutex::new((None, None)),
            })
        });
        let fetcher = match (&tier, fetch) {
            (Some(t), true) => {
                let (t, ds, c) = (t.clone(), ds.clone(), counters.clone());
                Some(
                    std::thread::Builder::new()
                        .name("granary-fetch".into())
                        .spawn(move || fetch_loop(&t, &ds, &c))
                        .expect("spawning the fetch thread"),
                )
            }
            _ => None,
        };
        TieredReader {
            origin: SampleReader::new(ds),
            fetching: AtomicBool::new(fetcher.is_some()),
            tier,
            counters,
            fetcher: Mutex::new(fetcher),
        }
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<Dataset> {
        self.origin.dataset()
    }

    /// The counters so far.
    pub fn stats(&self) -> ReadStats {
        let c = &*self.counters;
        let l = |a: &AtomicU64| a.load(Relaxed);
        ReadStats {
            samples_from_tier: l(&c.samples_tier),
            samples_from_origin: l(&c.samples_origin),
            bytes_from_tier: l(&c.bytes_tier),
            bytes_from_origin: l(&c.bytes_origin),
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
    /// is one (a damaged copy is removed and the origin read instead), else from the origin,
    /// which also asks for the chunk to be fetched into the tier.
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
        if let Some(t) = &self.tier {
            if let Some(data) = self.read_tier(t, &info)? {
                add(&self.counters.samples_tier, 1);
                add(&self.counters.bytes_tier, info.entry.stored_len);
                return Ok(data);
            }
        }
        let mut out = vec![0u8; info.entry.orig_len as usize];
        self.origin.read_into(&info, &mut out)?;
        add(&self.counters.samples_origin, 1);
        add(&self.counters.bytes_origin, info.entry.stored_len);
        if let Some(t) = &self.tier {
            if self.fetching.load(Relaxed) {
                t.request(info.entry.chunk);
            }
        }
        Ok(out)
    }

    /// The sample from the tier's copy of its chunk; `None` when the tier has none (or had a
    /// damaged one, now removed).
    fn read_tier(&self, t: &Tier, info: &SampleInfo) -> Result<Option<Vec<u8>>, ReadError> {
        let e = &info.entry;
        let ds = self.dataset();
        let ce = ds.chunk(e.chunk)?;
        let cached = t.copies.lock().expect("tier copies").get(&e.chunk).cloned();
        let file = match cached {
            Some(f) => f,
            None => match t.cache.open_copy(&ce)? {
                Some((f, _)) => {
                    let f = Arc::new(f);
                    let mut copies = t.copies.lock().expect("tier copies");
                    if copies.len() >= MAX_OPEN_COPIES {
                        copies.clear();
                    }
                    copies.insert(e.chunk, f.clone());
                    f
                }
                None => return Ok(None),
            },
        };
        let inside = e
            .offset
            .checked_add(e.stored_len)
            .is_some_and(|end| end <= ce.file_size);
        let mut stored = vec![0u8; e.stored_len as usize];
        let ok = inside && file.read_exact_at(&mut stored, e.offset).is_ok();
        let decoded = if ok {
            decode_record(e, &stored).ok().map(|d| d.into_owned())
        } else {
            None
        };
        match decoded {
            Some(d) => Ok(Some(d)),
            None => {
                // Never served: dropped from the tier, and the origin answers.
                t.copies.lock().expect("tier copies").remove(&e.chunk);
                let _ = t.cache.discard(e.chunk);
                add(&self.counters.discarded, 1);
                Ok(None)
            }
        }
    }

    /// Forgets the open tier copies (after the tier's content changed elsewhere, a copy we
    /// hold open may have been evicted; its bytes stay valid but its space is not freed
    /// until it is closed).
    pub fn close_copies(&self) {
        if let Some(t) = &self.tier {
            t.copies.lock().expect("tier copies").clear();
        }
    }

    /// Stops the fetcher (waiting for a fetch in progress to finish).
    pub fn shutdown(&self) {
        self.fetching.store(false, Relaxed);
        if let Some(t) = &self.tier {
            t.queue.lock().expect("fetch queue").stop = true;
            t.wake.notify_all();
        }
        if let Some(h) = self.fetcher.lock().expect("fetcher").take() {
            let _ = h.join();
        }
    }

    /// Asks for chunk `chunk` to be fetched into the tier (no-op without a fetcher).
    pub fn prefetch(&self, chunk: u32) {
        if let (Some(t), true) = (&self.tier, self.fetching.load(Relaxed)) {
            t.request(chunk);
        }
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
    fn request(&self, chunk: u32) {
        let mut q = self.queue.lock().expect("fetch queue");
        if q.stop || q.queued.contains(&chunk) {
            return;
        }
        if let Some(t) = q.declined.get(&chunk) {
            if t.elapsed() < DECLINED_FOR {
                return;
            }
            q.declined.remove(&chunk);
        }
        q.queued.insert(chunk);
        q.waiting.push_back(chunk);
        self.wake.notify_one();
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
fn fetch_loop(t: &Tier, ds: &Dataset, c: &Counters) {
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
        let outcome = fetch_one(t, ds, c, chunk);
        let mut q = t.queue.lock().expect("fetch queue");
        q.queued.remove(&chunk);
        match outcome {
            Ok(true) => {}
            Ok(false) => {
                q.declined.insert(chunk, Instant::now());
            }
            Err(e) => {
                add(&c.fetch_errors, 1);
                q.declined.insert(chunk, Instant::now());
                eprintln!("granary mount: fetching chunk {chunk} into the tier: {e}");
            }
        }
    }
}

/// Fetches one chunk; false when the tier holds it already or declined it.
fn fetch_one(t: &Tier, ds: &Dataset, c: &Counters, chunk: u32) -> Result<bool, ReadError> {
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
    let bytes = ds.load_chunk(chunk)?;
    add(&c.bytes_fetched, bytes.len() as u64);
    if t.cache.admit(&ce, &bytes, score)? {
        add(&c.fetched, 1);
        // Admission may have evicted copies held open here: let their space go.
        t.copies.lock().expect("tier copies").clear();
        Ok(true)
    } else {
        add(&c.declined, 1);
        Ok(false)
    }
}
