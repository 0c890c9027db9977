//! Streaming an epoch plan: an I/O thread queues each window's reads (whole-chunk ranges for
//! chunkwise and sequential plans, single records for global plans) with the engine, which
//! reads them in the background; as each window completes, the same thread checks every
//! record's CRC and decompresses in parallel (a rayon pool of the stream's own) and hands the
//! window to the consumer, which iterates samples in plan order. Raw samples are slices of the read buffer, never copied.
//!
//! Memory: read buffers come from one pool per stream that counts every buffer byte until the
//! last sample borrowing it is dropped. The next window's reads are submitted while the bytes
//! in use plus its own stay within [`StreamOptions::memory`]; the window right after the ones
//! already handed on is always submitted (so the stream never waits on itself). The hand-over
//! is a rendezvous channel, so at most three windows are alive besides the read-ahead the
//! budget allows: the one being consumed, one decoded (or being decoded) and waiting for the
//! consumer, and one being read.
//! [`crate::Dataset::window_for_memory`] sizes windows so that those three fit the budget.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use granary_format::{decode_record, ChunkEntry, SampleEntry, CHUNK_HEADER_LEN};
use rayon::prelude::*;

use crate::error::{ReadError, Result};
use crate::io::{BufPool, Completed, Engine, IoKind, Pending, Request};
use crate::plan::{EpochPlan, ShuffleMode};
use crate::residency::{IoMode, OpenCounts, Opener};
use crate::source::Source;
use crate::tier::{complete_window, Admission, CacheCounters, CacheHits, HotState};
use crate::{CachePolicy, ChunkCache, Dataset};

/// Options of the I/O path.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    pub io: IoKind,
    /// Reads in flight.
    pub queue_depth: usize,
    /// Cap on bytes in flight.
    pub max_inflight_bytes: usize,
    /// Bytes of read buffers the stream may hold (in flight, being decoded, and borrowed by
    /// samples not yet dropped): windows are read ahead only within it. Use the same value
    /// for [`crate::Dataset::window_for_memory`]. Samples served from maps of the page cache
    /// take no buffer.
    pub memory: u64,
    /// Page cache or O_DIRECT, per file ([`IoMode::Auto`]: through the page cache where the
    /// data is resident or kept resident, O_DIRECT elsewhere; see [`crate::Opener`]).
    pub io_mode: IoMode,
    /// Page cache that [`IoMode::Auto`] may fill with this dataset (`None`: half of
    /// [`crate::effective_memory`]).
    pub page_cache_bytes: Option<u64>,
    /// The local chunk tier: chunks it holds are read from it (and their whole-file CRC is
    /// checked: a damaged copy is discarded and the chunk refetched from the source); chunks
    /// read from the source are offered to it in the background. Chunk-wise and sequential
    /// plans only (global plans read single records).
    pub cache: Option<Arc<ChunkCache>>,
    /// Importance scores (a snapshot). With the tier's importance policy they choose the
    /// samples re-packed into hot chunks (the most important per byte that fit the quota);
    /// otherwise they rank whole chunks for admission.
    pub scores: Option<Arc<crate::ImportanceScores>>,
    /// With hot chunks, source chunks are read in ranges around the records the hot chunks
    /// serve; a gap shorter than this is read rather than skipped (fewer, larger requests:
    /// on network file systems a request costs more than 64 KiB of bandwidth).
    pub range_gap: u64,
    /// The other nodes of the job, sharing their tiers (needs `cache`): a chunk the local tier
    /// lacks is asked of the node that owns it before origin storage, and the local tier admits
    /// only the chunk copies this node owns.
    pub peers: Option<Arc<crate::Peers>>,
    /// Test hook: panic in this thread after its first window.
    #[cfg(test)]
    pub(crate) panic_in: Option<&'static str>,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            io: IoKind::Auto,
            queue_depth: 8,
            max_inflight_bytes: 256 << 20,
            memory: crate::DEFAULT_READER_MEMORY,
            io_mode: IoMode::Auto,
            page_cache_bytes: None,
            cache: None,
            scores: None,
            range_gap: 64 << 10,
            peers: None,
            #[cfg(test)]
            panic_in: None,
        }
    }
}

/// A delivered sample: id, label, and its checked original bytes.
pub struct Sample {
    pub id: u64,
    pub label: u32,
    /// Importance-sampling weight 1/(N·p) (1 for uniform plans): multiply the loss by it.
    pub weight: f32,
    crc32: u32,
    data: SampleData,
}

enum SampleData {
    /// A slice of a shared read buffer (raw records).
    Shared(Arc<Completed>, usize, usize),
    /// Decompressed bytes.
    Owned(Vec<u8>),
}

impl Sample {
    /// The sample's original bytes (CRC-checked).
    pub fn data(&self) -> &[u8] {
        match &self.data {
            SampleData::Shared(buf, at, len) => &buf.data()[*at..*at + *len],
            SampleData::Owned(v) => v,
        }
    }

    /// The CRC-32 of `data()`: the reader computed it over these bytes and found it equal to
    /// the snapshot's before delivering them, so a consumer that wants a checksum (a digest of
    /// the epoch, say) need not compute it again.
    pub fn crc32(&self) -> u32 {
        self.crc32
    }

    /// True when `data()` borrows the read buffer (no copy was made).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.data, SampleData::Shared(..))
    }
}

/// What the reader threads hand the consumer. The epoch is complete only when `End` arrives:
/// a channel that closes without it means a reader thread died, and the consumer gets an
/// error, never a short epoch that looks complete.
enum Msg {
    /// The samples of one window (a damaged record is an `Err` in place; nothing follows it).
    Window(Vec<Result<Sample>>),
    /// The stream failed; nothing follows.
    Failed(ReadError),
    /// Every window of the plan was delivered.
    End,
}

/// Iterator over one shard's epoch: `Result<Sample>` in plan order. After an error the stream
/// ends (the error names chunk, offset and sample).
pub struct EpochStream {
    rx: Receiver<Msg>,
    current: std::vec::IntoIter<Result<Sample>>,
    done: bool,
    /// Joined when the channel closes without [`Msg::End`], for the panic's message.
    io_thread: Option<std::thread::JoinHandle<()>>,
    delivered: u64,
    opens: Arc<std::sync::Mutex<OpenCounts>>,
    backend: &'static str,
    bytes_read: Arc<AtomicU64>,
    stats: Arc<CacheCounters>,
    pool: Arc<BufPool>,
}

impl EpochStream {
    /// Starts streaming `plan` from `ds`.
    pub fn new(
        ds: Arc<Dataset>,
        plan: EpochPlan,
        mode: ShuffleMode,
        opts: &StreamOptions,
    ) -> Result<Self> {
        let mut opener = Opener::new(
            opts.io_mode,
            ds.total_chunk_bytes()?,
            opts.page_cache_bytes,
            u64::from_le_bytes(ds.snapshot().dataset_id()[..8].try_into().expect("8 bytes")),
        );
        // Mapped ranges are populated when their window is submitted (within the budget), not
        // when the file is opened (a prepared window waiting for room would be resident
        // early); global plans read single records, which fault in as they are read.
        opener.populate = false;
        let populate = mode != ShuffleMode::Global;
        // io_uring shines on O_DIRECT reads; buffered reads of cold data are punted to its
        // worker threads and ran at half the speed of pread threads here (0.8–0.9 vs 1.7–1.8
        // GB/s, 20,000 ImageNet-like files): a stream that reads mostly through the page cache
        // uses pread unless the backend is forced.
        let kind = match opts.io {
            IoKind::Auto
                if opener.mostly_buffered() && std::env::var_os("GRANARY_IO").is_none() =>
            {
                IoKind::Pread
            }
            k => k,
        };
        let budget = opts.memory.max(1) as usize;
        let pool = BufPool::new(budget);
        let mut engine = Engine::with_pool(
            kind,
            opts.queue_depth,
            opts.max_inflight_bytes,
            pool.clone(),
        )?;
        let backend = engine.name();
        let (tx, rx) = sync_channel::<Msg>(0);
        let opens = Arc::new(std::sync::Mutex::new(OpenCounts::default()));
        let opens2 = opens.clone();
        let range_gap = opts.range_gap;
        let bytes_read = Arc::new(AtomicU64::new(0));
        let counter = bytes_read.clone();
        let stats = Arc::new(CacheCounters::default());
        let stats2 = stats.clone();
        let pool2 = pool.clone();
        let cache = opts.cache.clone().filter(|_| mode != ShuffleMode::Global);
        // Peers share tiers only: without a local tier there is nothing to share.
        let peers = opts.peers.clone().filter(|_| cache.is_some());
        let admission = cache.clone().map(|c| {
            Admission::start(c, ds.clone(), opts.memory / 4, stats.clone(), peers.clone())
        });
        let scores = opts.scores.clone();
        // An importance tier with a score table holds hot chunks (re-packed samples); a table
        // with no loss reported yet (every sample at the mean) says nothing to re-pack.
        let mut hot = match (&cache, &scores) {
            (Some(c), Some(s)) if c.policy() == CachePolicy::Importance && s.reported() > 0 => {
                Some(HotState::new(&ds, c.clone(), s.clone(), opts.memory)?)
            }
            _ => None,
        };
        #[cfg(test)]
        let panic_in = opts.panic_in;
        let io_thread = std::thread::Builder::new()
            .name("granary-io".into())
            .spawn(move || {
                let decode_pool = match decode_pool() {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Msg::Failed(e));
                        return;
                    }
                };
                let mut files: HashMap<u32, Source> = HashMap::new();
                let mut checked: HashSet<u32> = Default::default();
                // Windows whose reads are in flight (both engines read in the background while
                // this thread decodes or waits for the consumer), and the next window,
                // prepared, waiting for room in the budget.
                let mut pending: std::collections::VecDeque<(Prepared, Pending)> =
                    Default::default();
                let mut next: Option<(Prepared, Vec<Request>)> = None;
                let mut windows = plan.windows.iter();
                let mut failure = None;
                loop {
                    // Read ahead as far as the budget allows; the window after the ones handed
                    // on is always read (the stream never waits on itself).
                    while failure.is_none() {
                        if next.is_none() {
                            let Some(w) = windows.next() else { break };
                            let ids = &plan.samples[w.range.clone()];
                            let weights = plan.weights.get(w.range.clone()).unwrap_or(&[]);
                            match prepare_window(
                                &ds,
                                &mut opener,
                                &mut files,
                                &mut checked,
                                ids,
                                weights,
                                mode,
                                cache.as_deref(),
                                peers.as_ref(),
                                hot.as_mut(),
                                range_gap,
                            ) {
                                Ok(p) => next = Some(p),
                                Err(e) => {
                                    failure = Some(e);
                                    break;
                                }
                            }
                        }
                        let (_, reqs) = next.as_ref().expect("prepared above");
                        let fits = pending.len() < MAX_WINDOWS_AHEAD
                            && pool2.in_use() + buffer_bytes(reqs) <= budget;
                        if !pending.is_empty() && !fits {
                            break;
                        }
                        let (prep, reqs) = next.take().expect("prepared above");
                        if populate {
                            for r in &reqs {
                                if let Some(m) = r.map() {
                                    // Every page in one call instead of a fault per page (best
                                    // effort: before Linux 5.14 they fault in as read).
                                    let _ = m.advise_range(
                                        memmap2::Advice::PopulateRead,
                                        r.offset as usize,
                                        r.len,
                                    );
                                }
                            }
                        }
                        let t = engine.submit(reqs);
                        pending.push_back((prep, t));
                    }
                    let Some((prep, t)) = pending.pop_front() else {
                        break;
                    };
                    let done = engine.wait(t).and_then(|bufs| {
                        complete_window(
                            &ds,
                            &prep,
                            bufs,
                            cache.as_deref(),
                            &mut files,
                            &mut checked,
                            hot.as_mut(),
                            &mut opener,
                        )
                    });
                    let (bufs, served) = match done {
                        Ok(d) => d,
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    };
                    *opens2.lock().expect("open counts") = opener.counts;
                    if mode != ShuffleMode::Global {
                        // A chunk belongs to one window: its map goes with the window's
                        // samples, not with the stream (which would keep every chunk of the
                        // epoch mapped).
                        files.retain(|_, f| f.local().is_none_or(|l| l.map.is_none()));
                    }
                    let bufs: Vec<Arc<Completed>> = bufs.into_iter().map(Arc::new).collect();
                    let n: u64 = bufs.iter().map(|b| b.data().len() as u64).sum();
                    counter.fetch_add(n, Relaxed);
                    stats2.count(
                        &prep,
                        &bufs,
                        &served,
                        admission.as_ref(),
                        scores.as_deref(),
                        hot.as_mut(),
                        &ds,
                    );
                    let samples = decode_pool.install(|| decode_window(&ds, prep, bufs));
                    #[cfg(test)]
                    if panic_in == Some("decode") {
                        decode_pool.install(|| panic!("injected into decoding"));
                    }
                    let stop = samples.iter().any(|x| x.is_err());
                    // The consumer takes this window when it has finished the previous one;
                    // meanwhile the reads queued above go on.
                    if tx.send(Msg::Window(samples)).is_err() || stop {
                        // The consumer is gone, or has the error of a damaged record. (Reads
                        // still in flight complete in the engine's Drop.)
                        return;
                    }
                    #[cfg(test)]
                    if panic_in == Some("io") {
                        panic!("injected into the I/O thread");
                    }
                }
                // Complete what is still in flight before the buffers go (the engines' Drop
                // also waits), then report a failure after every sample before it.
                for (_, t) in pending {
                    let _ = engine.wait(t);
                }
                if let Some(e) = failure {
                    let _ = tx.send(Msg::Failed(e));
                    return;
                }
                if let Some(h) = hot.as_mut() {
                    h.flush(admission.as_ref());
                }
                if let Some(a) = admission {
                    a.finish();
                }
                let _ = tx.send(Msg::End);
            })
            .map_err(|e| ReadError::io("starting the I/O thread", "(thread)", e))?;
        Ok(EpochStream {
            rx,
            current: Vec::new().into_iter(),
            done: false,
            io_thread: Some(io_thread),
            delivered: 0,
            opens,
            backend,
            bytes_read,
            stats,
            pool,
        })
    }

    /// The most bytes of read buffers this stream held at once (in flight, being decoded,
    /// borrowed by samples not yet dropped, waiting for the tier); the budget is
    /// [`StreamOptions::memory`], exceeded only by a single window larger than it.
    pub fn peak_buffer_bytes(&self) -> u64 {
        self.pool.peak_in_use() as u64
    }

    /// The I/O backend in use ("uring" or "pread").
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// How the files read so far were opened: through the page cache (kept resident, or found
    /// resident) or with O_DIRECT.
    pub fn open_counts(&self) -> OpenCounts {
        *self.opens.lock().expect("open counts")
    }

    /// Bytes read from storage so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Relaxed)
    }

    /// How much of the epoch so far came from the local tier.
    pub fn cache_stats(&self) -> CacheHits {
        self.stats.hits()
    }
}

impl Iterator for EpochStream {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        loop {
            if let Some(s) = self.current.next() {
                if s.is_err() {
                    // Samples after a damaged one are not delivered: the stream ends here.
                    self.done = true;
                    self.current = Vec::new().into_iter();
                }
                self.delivered += 1;
                return Some(s);
            }
            if self.done {
                return None;
            }
            let msg = self.rx.recv();
            match msg {
                Ok(Msg::Window(v)) => self.current = v.into_iter(),
                Ok(Msg::End) => {
                    self.done = true;
                    return None;
                }
                Ok(Msg::Failed(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Err(_) => {
                    // Closed without `End`: a reader thread died. Never a silent short epoch.
                    self.done = true;
                    let why = match self.io_thread.take().map(|t| t.join()) {
                        Some(Err(panic)) => thread_died("I/O", panic.as_ref()),
                        _ => ReadError::Incomplete(
                            "the reader's threads ended without finishing the epoch".into(),
                        ),
                    };
                    return Some(Err(ReadError::Incomplete(format!(
                        "{why}; the epoch is incomplete after {} samples",
                        self.delivered
                    ))));
                }
            }
        }
    }
}

/// The error for a reader thread that panicked, with the panic's message.
pub(crate) fn thread_died(which: &str, panic: &(dyn std::any::Any + Send)) -> ReadError {
    let msg = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    ReadError::Incomplete(format!("granary's {which} thread panicked: {msg}"))
}

/// The process's pool for CRC checks and decompression, shared by all its streams (one thread
/// per core: streams of several workers in one process would otherwise each start one per
/// core, and their idle threads spin against each other's work). It is not rayon's global
/// pool, and a process forked from one that has the pool (a DataLoader worker) starts its own:
/// a child has the pool's state but none of its threads, and would wait on them forever.
fn decode_pool() -> Result<Arc<rayon::ThreadPool>> {
    static POOL: std::sync::Mutex<Option<(u32, Arc<rayon::ThreadPool>)>> =
        std::sync::Mutex::new(None);
    let mut g = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    match g.as_ref() {
        Some((p, pool)) if *p == pid => return Ok(pool.clone()),
        // The parent's pool: its threads do not exist here, so it is never dropped (dropping
        // would signal them).
        Some(_) => std::mem::forget(g.take()),
        None => {}
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("granary-crc-{i}"))
        .build()
        .map_err(|e| ReadError::Incomplete(format!("cannot start the decode threads: {e}")))?;
    let pool = Arc::new(pool);
    *g = Some((pid, pool.clone()));
    Ok(pool)
}

/// Most windows in flight ahead of the one being completed.
const MAX_WINDOWS_AHEAD: usize = 8;

/// The most bytes a batch can take from the pool: its buffers (aligned and rounded as the
/// pool does), or the mapped ranges it borrows.
fn buffer_bytes(reqs: &[Request]) -> usize {
    reqs.iter()
        .map(|r| match (r.map(), r.direct()) {
            (Some(_), _) => r.len,
            (None, direct) => {
                BufPool::charge(r.len + if direct { 2 * crate::io::ALIGN } else { 0 })
            }
        })
        .sum()
}

/// A window whose reads are queued: what decoding needs once they complete.
pub(crate) struct Prepared {
    pub(crate) ids: Vec<u64>,
    /// Per sample: (request index, offset of the record in that request's bytes).
    pub(crate) locs: Vec<(u32, u64)>,
    pub(crate) entries: Vec<SampleEntry>,
    pub(crate) labels: Vec<u32>,
    pub(crate) weights: Vec<f32>,
    /// Chunk headers to check, and the request whose bytes start with them.
    pub(crate) header_req: Vec<(u32, usize)>,
    /// With a cache: chunks read whole, their request, and whether from the cache.
    pub(crate) whole: Vec<(u32, usize, bool)>,
    /// Records read from hot chunks: (hot chunk id, request, sample index in the window).
    pub(crate) hot: Vec<(u32, usize, usize)>,
    /// Ranges of source chunks read around records served by hot chunks: (chunk, request,
    /// offset of the range in the chunk).
    pub(crate) ranges: Vec<(u32, usize, u64)>,
}

/// The read among `placed` (start, request; sorted by start) whose bytes hold record `e`.
fn covering(placed: &[(u64, usize)], reqs: &[Request], e: &SampleEntry) -> Option<usize> {
    let i = placed.partition_point(|&(start, _)| start <= e.offset);
    let (start, r) = *placed.get(i.checked_sub(1)?)?;
    (e.offset + e.stored_len <= start + reqs[r].len as u64).then_some(r)
}

/// Plans a window's reads: whole ranges from each chunk's start (chunkwise, sequential), or
/// one read per record plus a header read per chunk not seen yet (global). With hot chunks,
/// samples they hold are read from them, and a source chunk of which the window needs less
/// than half is read record by record instead of whole.
#[allow(clippy::too_many_arguments)]
fn prepare_window(
    ds: &Dataset,
    opener: &mut Opener,
    files: &mut HashMap<u32, Source>,
    checked: &mut HashSet<u32>,
    ids: &[u64],
    weights: &[f32],
    mode: ShuffleMode,
    cache: Option<&ChunkCache>,
    peers: Option<&Arc<crate::Peers>>,
    mut hot: Option<&mut HotState>,
    range_gap: u64,
) -> Result<(Prepared, Vec<Request>)> {
    let mut entries = Vec::with_capacity(ids.len());
    // Chunks in order of first use, with their entry.
    let mut chunks: Vec<(u32, ChunkEntry)> = Vec::new();
    let mut chunk_index: HashMap<u32, usize> = HashMap::new();
    for &id in ids {
        let info = ds.sample(id)?;
        let ce = ds.check_placement(&info)?;
        if let std::collections::hash_map::Entry::Vacant(v) = chunk_index.entry(info.entry.chunk) {
            v.insert(chunks.len());
            chunks.push((info.entry.chunk, ce));
        }
        entries.push(info.entry);
    }
    let labels: Vec<u32> = entries.iter().map(|e| e.label).collect();
    // Which samples the hot chunks can serve.
    let mut in_hot: Vec<Option<(u32, Source, u64)>> = vec![None; ids.len()];
    if let (Some(h), false) = (hot.as_deref_mut(), mode == ShuffleMode::Global) {
        h.refresh();
        for (i, &id) in ids.iter().enumerate() {
            in_hot[i] = h.locate(id, opener);
        }
    }
    // Per chunk: bytes the window needs from the source if hot samples come from hot chunks.
    let mut needed = vec![0u64; chunks.len()];
    for (i, e) in entries.iter().enumerate() {
        if in_hot[i].is_none() {
            needed[chunk_index[&e.chunk]] += e.stored_len;
        }
    }
    // How each chunk is read: whole (from a tier copy or the source), record by record
    // (global plans), or in ranges around what the hot chunks hold.
    let mut by_range = vec![false; chunks.len()];
    for (k, (c, ce)) in chunks.iter().enumerate() {
        let mut copy = files
            .get(c)
            .is_some_and(|f| f.location() != ds.chunk_path(*c));
        if !files.contains_key(c) {
            // Another process may evict a cached copy between lookup and open: then the
            // source serves the chunk.
            let cached = cache.map(|t| t.lookup(ce)).transpose()?.flatten();
            if let Some(Ok(f)) = cached.map(|p| opener.open_unmapped(&p, Some(*c))) {
                ds.check_chunk_size(ce, &f)?;
                files.insert(*c, Arc::new(f));
                copy = true;
            } else if let Some(src) = peers.and_then(|p| p.source(ds, ce)) {
                // Another node's tier keeps it: read whole from there (or, should that fail,
                // from origin), CRC-checked, and not admitted here.
                files.insert(*c, src);
                copy = true;
            }
        }
        by_range[k] = hot.is_some() && !copy;
        // A chunk whose window samples all come from hot chunks is not even opened.
        if !files.contains_key(c) && (needed[k] > 0 || !by_range[k]) {
            files.insert(*c, ds.open_source(*c, opener)?);
        }
    }
    let mut reqs: Vec<Request> = Vec::new();
    let mut locs: Vec<(u32, u64)> = vec![(0, 0); ids.len()];
    let mut header_req: Vec<(u32, usize)> = Vec::new();
    let mut whole: Vec<(u32, usize, bool)> = Vec::new();
    let mut hot_reads = Vec::new();
    let mut ranges: Vec<(u32, usize, u64)> = Vec::new();
    // Per chunk read in one piece or in ranges: (start, request) sorted by start.
    let mut placed: HashMap<u32, Vec<(u64, usize)>> = HashMap::new();
    for (k, (c, ce)) in chunks.iter().enumerate() {
        if mode == ShuffleMode::Global {
            if !checked.contains(c) {
                header_req.push((*c, reqs.len()));
                reqs.push(Request {
                    source: files[c].clone(),
                    offset: 0,
                    len: CHUNK_HEADER_LEN,
                });
            }
            continue;
        }
        if by_range[k] {
            // The records the hot chunks do not hold, in ranges that skip no less than
            // `range_gap`: large records are read alone, runs of small ones together.
            let mut want: Vec<(u64, u64)> = entries
                .iter()
                .zip(&in_hot)
                .filter(|(e, h)| e.chunk == *c && h.is_none())
                .map(|(e, _)| (e.offset, e.offset + e.stored_len))
                .collect();
            want.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::new();
            for (start, end) in want {
                match merged.last_mut() {
                    Some(last) if start <= last.1 + range_gap => last.1 = last.1.max(end),
                    _ => merged.push((start, end)),
                }
            }
            if !checked.contains(c) && !merged.is_empty() {
                if merged[0].0 <= range_gap + CHUNK_HEADER_LEN as u64 {
                    merged[0].0 = 0;
                } else {
                    merged.insert(0, (0, CHUNK_HEADER_LEN as u64));
                }
                header_req.push((*c, reqs.len()));
            }
            let list = placed.entry(*c).or_default();
            for (start, end) in merged {
                ranges.push((*c, reqs.len(), start));
                list.push((start, reqs.len()));
                reqs.push(Request {
                    source: files[c].clone(),
                    offset: start,
                    len: (end - start) as usize,
                });
            }
            continue;
        }
        // Whole ranges from the chunk start: the header is checked on the way. With a cache,
        // whole files: they can be admitted, and cached copies are checked against the
        // whole-file CRC.
        let end = if cache.is_some() {
            ce.file_size
        } else {
            entries
                .iter()
                .filter(|e| e.chunk == *c)
                .map(|e| e.offset + e.stored_len)
                .max()
                .unwrap_or(0)
        };
        if !checked.contains(c) {
            header_req.push((*c, reqs.len()));
        }
        if cache.is_some() {
            let from_cache = files[c].location() != ds.chunk_path(*c);
            whole.push((*c, reqs.len(), from_cache));
        }
        placed.insert(*c, vec![(0, reqs.len())]);
        reqs.push(Request {
            source: files[c].clone(),
            offset: 0,
            len: end.max(CHUNK_HEADER_LEN as u64) as usize,
        });
    }
    for (i, e) in entries.iter().enumerate() {
        if let Some(r) = placed.get(&e.chunk).and_then(|l| covering(l, &reqs, e)) {
            locs[i] = (r as u32, e.offset - reqs[r].offset);
            continue;
        }
        locs[i] = (reqs.len() as u32, 0);
        match in_hot[i].take() {
            Some((h, file, offset)) => {
                hot_reads.push((h, reqs.len(), i));
                reqs.push(Request {
                    source: file,
                    offset,
                    len: e.stored_len as usize,
                });
            }
            None => {
                // Global plans: one read per record.
                reqs.push(Request {
                    source: files[&e.chunk].clone(),
                    offset: e.offset,
                    len: e.stored_len as usize,
                });
            }
        }
    }
    // Headers are checked when this window's reads complete, before any of its samples (or
    // of a later window) is delivered.
    for (c, _) in &header_req {
        checked.insert(*c);
    }
    let prep = Prepared {
        ids: ids.to_vec(),
        locs,
        entries,
        labels,
        weights: weights.to_vec(),
        header_req,
        whole,
        hot: hot_reads,
        ranges,
    };
    Ok((prep, reqs))
}

fn decode_window(ds: &Dataset, prep: Prepared, bufs: Vec<Arc<Completed>>) -> Vec<Result<Sample>> {
    let Prepared {
        ids,
        locs,
        entries,
        labels,
        weights,
        ..
    } = prep;
    (0..ids.len())
        .into_par_iter()
        .map(|i| {
            let (b, at) = locs[i];
            let e = &entries[i];
            let buf = &bufs[b as usize];
            let stored = buf
                .data()
                .get(at as usize..(at + e.stored_len) as usize)
                .ok_or_else(|| {
                    ReadError::Invalid(format!("sample {}: read buffer too short", ids[i]))
                })?;
            let data = match decode_record(e, stored) {
                Ok(std::borrow::Cow::Borrowed(_)) => {
                    SampleData::Shared(buf.clone(), at as usize, e.stored_len as usize)
                }
                Ok(std::borrow::Cow::Owned(v)) => SampleData::Owned(v),
                Err(err) => {
                    let info = ds.sample(ids[i])?;
                    return Err(ds.record_error(&info, err));
                }
            };
            Ok(Sample {
                id: ids[i],
                label: labels[i],
                weight: weights.get(i).copied().unwrap_or(1.0),
                crc32: e.crc32,
                data,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PlanOptions, Shard};

    /// A reader thread that panics mid-epoch ends the stream with an error naming the thread,
    /// after fewer samples than the plan has: never a short epoch that looks complete.
    #[test]
    fn a_reader_thread_that_panics_is_an_error_not_a_short_epoch() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        for i in 0..64 {
            let p = src.join(format!("c{}/{i:03}", i % 4));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![i as u8; 700]).unwrap();
        }
        let out = tmp.path().join("ds");
        let mut o = granary_packer::PackOptions::new(&src, &out);
        o.chunk_size = 2 << 10;
        granary_packer::pack(&o).unwrap();
        let ds = Arc::new(Dataset::open(&out).unwrap());
        let plan = PlanOptions {
            window_chunks: 1,
            ..Default::default()
        };
        let shard = Shard {
            rank: 0,
            world_size: 1,
            worker: 0,
            num_workers: 1,
        };
        for (thread, io) in [
            (None, IoKind::Pread),
            (Some("io"), IoKind::Pread),
            (Some("decode"), IoKind::Pread),
            (Some("io"), IoKind::Auto),
            (Some("decode"), IoKind::Auto),
        ] {
            let opts = StreamOptions {
                io,
                panic_in: thread,
                ..Default::default()
            };
            let stream = ds.stream_epoch(&plan, 0, shard, None, &opts).unwrap();
            let all: Vec<Result<Sample>> = stream.collect();
            let Some(thread) = thread else {
                assert_eq!(all.len(), 64);
                assert!(all.iter().all(|s| s.is_ok()));
                continue;
            };
            let ok = all.iter().filter(|s| s.is_ok()).count();
            assert!(ok < 64, "{thread}: {ok} samples");
            let err = all
                .last()
                .unwrap()
                .as_ref()
                .err()
                .expect("ends with an error");
            // Decoding runs on the stream's CRC pool, whose panics reach the I/O thread.
            let want = if thread == "io" {
                "granary's I/O thread panicked: injected into the I/O thread"
            } else {
                "granary's I/O thread panicked: injected into decoding"
            };
            assert!(err.to_string().contains(want), "{err}");
            assert!(matches!(err, ReadError::Incomplete(_)), "{err:?}");
        }
    }
}
