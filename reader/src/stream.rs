//! Streaming an epoch plan: an I/O thread queues each window's reads with the engine, which
//! reads them in the background; as each window completes, the same thread checks every
//! record's CRC and decompresses in parallel and hands the window to the consumer, which
//! iterates samples in plan order. Raw samples are slices of the read buffer, never copied.
//!
//! Memory: every buffer byte counts in the stream's pool until the last sample borrowing it is
//! dropped. The next window's reads are submitted while the bytes in use plus its own stay
//! within [`StreamOptions::memory`]; the window right after the ones handed on is always
//! submitted (the stream never waits on itself). The hand-over is a rendezvous channel, so at
//! most three windows are alive besides the read-ahead the budget allows (consumed, decoded,
//! being read): [`crate::Dataset::window_for_memory`] sizes windows so that those fit.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Instant;

use granary_format::decode_record;
use rayon::prelude::*;

use crate::dataset::Dataset;
use crate::error::{ReadError, Result};
use crate::io::{BufPool, Completed, Engine, IoKind, Pending, Request};
use crate::plan::{EpochPlan, ShuffleMode};
use crate::waits::{plan_shares, read_shares, Phase, Timeline, WaitReport};
use crate::window::{buffer_bytes, Prepared, Windows};
use granary_store::local::Opener;
use granary_store::tier::Importance;
use granary_store::LocalTier;
use granary_store::ReadPattern;
use granary_store::{Access, IoMode, MeterReading, StoreStack};

/// Options of the I/O path.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    pub io: IoKind,
    /// Reads in flight.
    pub queue_depth: usize,
    /// Cap on bytes in flight.
    pub max_inflight_bytes: usize,
    /// Bytes of read buffers the stream may hold (in flight, being decoded, borrowed by
    /// samples): windows are read ahead only within it. Use the same value for
    /// [`crate::Dataset::window_for_memory`].
    pub memory: u64,
    /// Page cache or O_DIRECT, per file ([`IoMode::Auto`]: through the page cache where the
    /// data is resident or kept resident, O_DIRECT elsewhere; see [`crate::Opener`]).
    pub io_mode: IoMode,
    /// Page cache that [`IoMode::Auto`] may fill with this dataset (`None`: half of
    /// [`crate::effective_memory`]).
    pub page_cache_bytes: Option<u64>,
    /// The local chunk tier: chunks it holds are read from it (a damaged copy is refetched
    /// from the source), chunks read from the source are offered to it. Chunk-wise and
    /// sequential plans only (global plans read single records).
    pub tier: Option<Arc<LocalTier>>,
    /// Importance scores (a snapshot): with the tier's importance policy they choose the
    /// samples re-packed into hot chunks, otherwise they rank whole chunks for admission.
    pub scores: Option<Arc<crate::ImportanceScores>>,
    /// With hot chunks, source chunks are read in ranges around the records the hot chunks
    /// serve; a gap shorter than this is read rather than skipped (fewer, larger requests).
    pub range_gap: u64,
    /// The other nodes of the job, sharing their tiers (needs `tier`): a chunk the local tier
    /// lacks is asked of its owner before origin; the local tier admits only what it owns.
    pub peers: Option<Arc<crate::Peers>>,
    /// Read-ahead shared with other streams of one consumer (a mixture's sources): their
    /// pool of read buffers, whose budget they share (`memory` then only sizes the windows),
    /// and their order of reads ahead. `None`: a pool of its own of `memory` bytes.
    pub shared: Option<crate::ReadAheadSeat>,
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
            tier: None,
            scores: None,
            range_gap: 64 << 10,
            peers: None,
            shared: None,
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
    /// Which source of a mixture it came from (its index in the mixture; 0 outside one).
    pub source: u32,
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

    /// The CRC-32 of `data()`, which the reader checked against the snapshot's: a consumer
    /// that wants a checksum (a digest of the epoch, say) need not compute it again.
    pub fn crc32(&self) -> u32 {
        self.crc32
    }

    /// True when `data()` borrows the read buffer (no copy was made).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.data, SampleData::Shared(..))
    }

    /// Where `data()` lies when it is a slice of a local file's map: the file's path, the open
    /// file, and the offset of `data()[0]` in it (another process may map it there).
    pub fn mapped_file(&self) -> Option<(&std::path::Path, &std::fs::File, u64)> {
        match &self.data {
            SampleData::Shared(buf, at, _) => buf
                .mapped_file()
                .map(|(path, file, start)| (path, file, start + *at as u64)),
            SampleData::Owned(_) => None,
        }
    }

    /// An error if `data()` is a slice of a map whose file was found cut short since the
    /// sample was checked: its bytes may read as zeros. A consumer that copies the bytes checks
    /// this after the copy; the stream checks it on the next call and ends with an error.
    pub fn intact(&self) -> Result<()> {
        match &self.data {
            SampleData::Shared(buf, ..) if buf.is_cut() => Err(cut_under_map(self.id, buf)),
            _ => Ok(()),
        }
    }
}

fn cut_under_map(id: u64, buf: &Completed) -> ReadError {
    let path = buf.mapped_file().map(|(path, ..)| path);
    let m = format!(
        "the file was cut short (truncated by another process) while sample {id} was read from \
         its map: its bytes may have read as zeros; the epoch stops here"
    );
    ReadError::mismatch(path.unwrap_or(std::path::Path::new("(mapped chunk)")), m)
}

/// What the reader threads hand the consumer. The epoch is complete only when `End` arrives:
/// a channel that closes without it means a reader thread died, and the consumer gets an
/// error, never a short epoch that looks complete.
enum Msg {
    /// The samples of one window (a damaged record is an `Err` in place; nothing follows it),
    /// or the error that failed the stream alone.
    Window(Vec<Result<Sample>>),
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
    backend: &'static str,
    /// Why the stream reads with pread although io_uring was wanted.
    backend_fallback: Option<String>,
    /// The stack the I/O thread reads through, for its layers' meters.
    stack: StoreStack,
    pool: Arc<BufPool>,
    /// The last sample delivered as a slice of a map (its id and buffer), checked on the next
    /// call: see [`Sample::intact`].
    watch: Option<(u64, Arc<Completed>)>,
    /// What the I/O thread did, and what the consumer's waits were attributed to.
    timeline: Arc<Timeline>,
}

impl EpochStream {
    /// Starts streaming `plan` from `ds`.
    pub fn new(
        ds: Arc<Dataset>,
        plan: EpochPlan,
        mode: ShuffleMode,
        opts: &StreamOptions,
    ) -> Result<Self> {
        // A view that keeps a small share of the samples reads most chunks in ranges: many
        // small reads scattered over the chunk files, which go best as copies through io_uring,
        // many in flight (docs/reading.md, "Views") unless its chunk files are wholly resident
        // (maps of them are faster still).
        let sparse_view = ds.selection().is_some_and(|ids| {
            (ids.len() as f64) < crate::window::SPARSE_SHARE * ds.len().max(1) as f64
        }) && !crate::view::chunks_mostly_resident(&ds);
        let access = Access {
            mode: opts.io_mode,
            dataset_bytes: ds.total_chunk_bytes()?,
            page_cache_bytes: opts.page_cache_bytes,
            seed: u64::from_le_bytes(ds.snapshot().dataset_id()[..8].try_into().expect("8 bytes")),
            map_resident: !sparse_view,
            // Mapped ranges are populated when their window is checked (on the decode pool),
            // not when the file is opened (a window waiting for room would be resident early).
            populate: false,
            // A view's windows may read ranges scattered over its chunks: no sequential
            // readahead past them.
            pattern: if mode == ShuffleMode::Global || ds.selection().is_some() {
                ReadPattern::Default
            } else {
                ReadPattern::Sequential
            },
            meter: Arc::default(),
        };
        // io_uring punts buffered reads of cold data to its worker threads, slower than pread's:
        // a stream that reads mostly through the page cache uses pread unless the backend is
        // forced.
        let kind = match opts.io {
            IoKind::Auto if !sparse_view && Opener::for_access(&access).mostly_buffered() => {
                IoKind::Pread
            }
            k => k,
        };
        let least = sparse_view as usize * SPARSE_VIEW_QUEUE_DEPTH;
        let queue_depth = opts.queue_depth.max(least);
        let pool = match &opts.shared {
            Some(seat) => seat.pool().clone(),
            None => BufPool::new(opts.memory.max(1) as usize),
        };
        let engine = Engine::with_pool(kind, queue_depth, opts.max_inflight_bytes, pool.clone())?;
        let backend = engine.name();
        let backend_fallback = engine.fallback().map(str::to_owned);
        let windows = Self::windows(&ds, mode, opts, access)?;
        let stack = windows.stack.clone();
        let (tx, rx) = sync_channel::<Msg>(0);
        let timeline = Arc::new(Timeline::default());
        let io = IoThread {
            timeline: timeline.clone(),
            windows,
            engine,
            decode_pool: decode_pool()?,
            seat: opts.shared.clone(),
            tx,
            #[cfg(test)]
            panic_in: opts.panic_in,
        };
        let io_thread = std::thread::Builder::new()
            .name("granary-io".into())
            .spawn(move || io.run(plan))
            .map_err(|e| ReadError::io("starting the I/O thread", "(thread)", e))?;
        Ok(EpochStream {
            rx,
            current: Vec::new().into_iter(),
            done: false,
            io_thread: Some(io_thread),
            delivered: 0,
            backend,
            backend_fallback,
            stack,
            pool,
            watch: None,
            timeline,
        })
    }

    /// The stream's store stack (tier → peers → origin, as configured) and what it feeds the
    /// tier with: admission, hot chunks, scores.
    fn windows(
        ds: &Arc<Dataset>,
        mode: ShuffleMode,
        opts: &StreamOptions,
        access: Access,
    ) -> Result<Windows> {
        // Global plans read single records: no tier.
        let cache = opts.tier.clone().filter(|_| mode != ShuffleMode::Global);
        if opts.tier.is_some() && cache.is_none() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                log::warn!(
                    "a global shuffle reads single records from the dataset itself: the local \
                     tier is not used (it serves chunk-wise and sequential epochs, random access \
                     and the mount)"
                )
            });
        }
        // Peers share tiers only: without a local tier there is nothing to share.
        let peers = opts.peers.clone().filter(|_| cache.is_some());
        let stack = ds.stack(access, cache.clone(), peers.clone())?;
        // With a tier, chunks are read whole: they can be admitted, and copies are checked
        // against the whole-file CRC.
        let whole = cache.is_some();
        let mut w = Windows::new(ds.clone(), stack.clone(), mode, opts.range_gap, whole);
        let importance = opts.scores.clone().map(|scores| {
            let ds = ds.clone();
            Arc::new(crate::tier::Weighed { ds, scores }) as Arc<dyn Importance>
        });
        let classes = ds.classes().unwrap_or_default();
        let classes = classes.into_iter().map(<[u8]>::to_vec).collect();
        w.feed = stack.tier_feed(classes, importance, opts.memory)?;
        Ok(w)
    }

    /// The most bytes of read buffers this stream held at once; the budget is
    /// [`StreamOptions::memory`], exceeded only by a single window larger than it.
    pub fn peak_buffer_bytes(&self) -> u64 {
        self.pool.peak_in_use() as u64
    }

    /// The I/O backend in use ("uring" or "pread").
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Why the stream reads with pread although the default backend prefers io_uring (the
    /// kernel refused the ring); `None` when it reads with io_uring or pread was asked for.
    pub fn backend_fallback(&self) -> Option<&str> {
        self.backend_fallback.as_deref()
    }

    /// What passed through each layer of the stream's store stack so far (top first), and
    /// how long the stream's reads waited in it.
    pub fn layers(&self) -> Vec<(&'static str, MeterReading)> {
        self.stack.layers()
    }

    /// Bytes read from storage so far (what every layer served of its own).
    pub fn bytes_read(&self) -> u64 {
        self.layers().iter().map(|l| l.1.served_bytes).sum()
    }

    /// How long the consumer waited for samples so far, and on what ([`WaitReport`]).
    pub fn waits(&self) -> WaitReport {
        self.timeline.report()
    }
}

impl Iterator for EpochStream {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        // A sample handed on as a slice of a map was checked before the consumer read it: if
        // its file was cut short meanwhile, the consumer may have seen zeros, and the stream
        // ends with an error. Checked once per run of samples from one map (an `fstat`).
        if let Some((id, buf)) = self.watch.take() {
            let same = match self.current.as_slice().first() {
                Some(Ok(Sample {
                    data: SampleData::Shared(next, ..),
                    ..
                })) => Arc::ptr_eq(next, &buf),
                _ => false,
            };
            if !same && buf.is_cut() {
                self.done = true;
                self.current = Vec::new().into_iter();
                return Some(Err(cut_under_map(id, &buf)));
            }
        }
        loop {
            if let Some(s) = self.current.next() {
                match &s {
                    Err(_) => {
                        // Samples after a damaged one are not delivered: the stream ends here.
                        self.done = true;
                        self.current = Vec::new().into_iter();
                    }
                    Ok(Sample {
                        id,
                        data: SampleData::Shared(buf, ..),
                        ..
                    }) if buf.is_mapped() => self.watch = Some((*id, buf.clone())),
                    Ok(_) => {}
                }
                self.delivered += 1;
                return Some(s);
            }
            if self.done {
                return None;
            }
            let t0 = Instant::now();
            let msg = self.rx.recv();
            self.timeline.waited(t0, Instant::now());
            if let Ok(Msg::Window(v)) = msg {
                self.current = v.into_iter();
                continue;
            }
            self.done = true;
            if msg.is_ok() {
                return None;
            }
            // Closed without `End`: a reader thread died. Never a silent short epoch.
            let why = match self.io_thread.take().map(|t| t.join()) {
                Some(Err(panic)) => thread_died("I/O", panic.as_ref()).to_string(),
                _ => "the reader's threads ended without finishing the epoch".into(),
            };
            let n = self.delivered;
            let m = format!("{why}; the epoch is incomplete after {n} samples");
            return Some(Err(ReadError::Incomplete(m)));
        }
    }
}

/// The stream's I/O thread: prepares windows, keeps their reads in flight within the budget,
/// checks and decodes each completed window and hands it to the consumer.
struct IoThread {
    timeline: Arc<Timeline>,
    windows: Windows,
    /// Reads with the stream's pool of read buffers, whose cap is the budget.
    engine: Engine,
    /// Checks and decodes the windows' records.
    decode_pool: Arc<rayon::ThreadPool>,
    /// Its place in read-ahead shared with other streams (a mixture's sources).
    seat: Option<crate::ReadAheadSeat>,
    tx: SyncSender<Msg>,
    #[cfg(test)]
    panic_in: Option<&'static str>,
}

impl IoThread {
    fn run(mut self, plan: EpochPlan) {
        // However the thread ends, nothing of it waits to read ahead any more.
        let _leaving = self.seat.clone().map(crate::readahead::Leaving);
        // Windows whose reads are in flight (read in the background while this thread decodes
        // or waits for the consumer), and the next window, prepared, waiting for room.
        let mut pending: VecDeque<InFlightWindow> = VecDeque::new();
        let mut next: Option<WaitingWindow> = None;
        let mut windows = plan.windows.iter();
        let mut failure = None;
        loop {
            // Read ahead as far as the budget allows; the window after the ones handed on is
            // always read (the stream never waits on itself).
            while failure.is_none() {
                if next.is_none() {
                    let Some(w) = windows.next() else { break };
                    let ids = &plan.samples[w.range.clone()];
                    let weights = plan.weights.get(w.range.clone()).unwrap_or(&[]);
                    let t = Instant::now();
                    let before = self.timeline.on().then(|| self.windows.stack.layers());
                    let prepared = self.windows.prepare(ids, weights);
                    if let Some(before) = before {
                        let secs = t.elapsed().as_secs_f64();
                        let shares = plan_shares(&before, &self.windows.stack.layers(), secs);
                        self.timeline.record(t, Phase::Plan(shares));
                    }
                    match prepared {
                        Ok(prep) => next = Some((prep, w.range.start as u64)),
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    }
                }
                let ahead = pending.len();
                if !self.submit_if_room(ahead, ahead == 0, &mut pending, &mut next) {
                    break;
                }
            }
            let Some((prep, t, counted)) = pending.pop_front() else {
                break;
            };
            // A prepared window waits for room: submit it as soon as the consumer frees
            // buffers, not only when the oldest window completes, so that the reads in flight
            // fill the budget (the device's bandwidth grows with bytes in flight).
            let read_start = Instant::now();
            let before = self.timeline.on().then(|| self.windows.stack.layers());
            let read = if next.is_some() && failure.is_none() {
                self.wait_submitting(t, &mut pending, &mut next)
            } else {
                self.engine.wait(t).map_err(ReadError::from)
            };
            drop(counted);
            let done = self.windows.complete(&prep, read);
            if let Some(before) = before {
                let shares = read_shares(&before, &self.windows.stack.layers());
                self.timeline.record(read_start, Phase::Read(shares));
            }
            let bufs = match done {
                Ok(d) => d,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            self.windows.release_maps();
            let bufs: Vec<Arc<Completed>> = bufs.into_iter().map(Arc::new).collect();
            self.windows.count(&prep, &bufs);
            let ds = &self.windows.ds;
            // Global plans read single records; other plans populate the mapped ranges of a
            // window before checking it.
            let populate = self.windows.mode != ShuffleMode::Global;
            let check_start = Instant::now();
            let samples = self.decode_pool.install(|| {
                if populate {
                    populate_maps(&bufs);
                }
                decode_window(ds, prep, bufs)
            });
            self.timeline.record(check_start, Phase::Check);
            #[cfg(test)]
            if self.panic_in == Some("decode") {
                self.decode_pool
                    .install(|| panic!("injected into decoding"));
            }
            let stop = samples.iter().any(|x| x.is_err());
            // Waiting for the consumer, this stream submits nothing: a window of it waiting to
            // read ahead must not hold the other streams' back meanwhile.
            if let Some(seat) = &self.seat {
                seat.step_aside();
            }
            // The consumer takes this window when it has finished the previous one; meanwhile
            // the reads queued above go on.
            if self.tx.send(Msg::Window(samples)).is_err() || stop {
                // The consumer is gone, or has the error of a damaged record. (Reads still in
                // flight complete in the engine's Drop.)
                return;
            }
            #[cfg(test)]
            if self.panic_in == Some("io") {
                panic!("injected into the I/O thread");
            }
        }
        // Complete what is still in flight before the buffers go (the engines' Drop also
        // waits), then report a failure after every sample before it.
        for (_, t, _) in pending {
            let _ = self.engine.wait(t);
        }
        if let Some(e) = failure {
            let _ = self.tx.send(Msg::Window(vec![Err(e)]));
            return;
        }
        self.windows.finish();
        let _ = self.tx.send(Msg::End);
    }

    /// Submits the prepared window `next` if the budget has room for it with `ahead` windows
    /// in flight, and reads shared with other streams let it read ahead now (`force`: in any
    /// case), queuing it on `pending`; true if it did.
    fn submit_if_room(
        &mut self,
        ahead: usize,
        force: bool,
        pending: &mut VecDeque<InFlightWindow>,
        next: &mut Option<WaitingWindow>,
    ) -> bool {
        let Some((prep, first)) = next.as_ref() else {
            return false;
        };
        let bytes = buffer_bytes(&prep.reqs);
        let pool = self.engine.pool();
        let fits = ahead < MAX_WINDOWS_AHEAD && pool.in_use() + bytes <= pool.cap();
        // What the shared read-ahead orders is reads; ranges of maps of resident files (a
        // warm epoch) read nothing and go as the budget allows.
        let unmapped = |r: &Request| r.map().map_or(r.len, |_| 0);
        let reads: usize = prep.reqs.iter().map(unmapped).sum();
        let counted = match &self.seat {
            Some(seat) if reads > 0 && force => Some(seat.read_now(reads)),
            Some(seat) if reads > 0 && fits => {
                let Some(c) = seat.try_read_ahead(*first, reads) else {
                    return false;
                };
                Some(c)
            }
            _ if fits || force => None,
            _ => return false,
        };
        let (prep, _) = next.take().expect("checked above");
        let t = self.engine.submit(prep.reqs.clone());
        pending.push_back((prep, t, counted));
        true
    }

    /// Waits for the reads of `t` (the oldest window in flight); meanwhile, every
    /// [`ROOM_POLL`], submits the prepared window `next` once the budget has room for it.
    fn wait_submitting(
        &mut self,
        mut t: Pending,
        pending: &mut VecDeque<InFlightWindow>,
        next: &mut Option<WaitingWindow>,
    ) -> Result<Vec<Completed>> {
        loop {
            // `t` is in flight too.
            if self.submit_if_room(pending.len() + 1, false, pending, next) {
                return Ok(self.engine.wait(t)?);
            }
            match self.engine.wait_for(t, ROOM_POLL) {
                Ok(r) => return Ok(r?),
                Err(back) => t = back,
            }
        }
    }
}

/// A window whose reads are in flight, counted in the read-ahead shared with other streams
/// (if any) until it completes.
type InFlightWindow = (Prepared, Pending, Option<crate::readahead::InFlight>);

/// The next window, prepared, waiting for room: its reads and its first sample's index in
/// the plan.
type WaitingWindow = (Prepared, u64);

/// Reads in flight, at least, for a view read mostly in ranges (see [`EpochStream::new`]).
const SPARSE_VIEW_QUEUE_DEPTH: usize = 32;

/// How often a stream whose next window waits for room looks whether the consumer freed
/// buffers, while it waits for reads.
const ROOM_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Maps the pages of a window's mapped bytes into the page tables before they are checked, in
/// pieces on the decode pool's threads (one call per piece instead of a fault per page; on a
/// warm epoch this is much of the reader's CPU, and would otherwise run on one thread).
fn populate_maps(bufs: &[Arc<Completed>]) {
    const PIECE: usize = 4 << 20;
    let pieces: Vec<(&Completed, usize)> = bufs
        .iter()
        .filter(|b| b.is_mapped())
        .flat_map(|b| (0..b.data().len()).step_by(PIECE).map(move |at| (&**b, at)))
        .collect();
    pieces.into_par_iter().for_each(|(b, at)| {
        b.populate(at, PIECE.min(b.data().len() - at));
    });
}

/// The error for a reader thread that panicked, with the panic's message.
pub(crate) fn thread_died(which: &str, panic: &(dyn std::any::Any + Send)) -> ReadError {
    let msg = granary_store::panic_message(panic);
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

fn decode_window(ds: &Dataset, prep: Prepared, bufs: Vec<Arc<Completed>>) -> Vec<Result<Sample>> {
    let (ids, locs, entries, weights) = (&prep.ids, &prep.locs, &prep.entries, &prep.weights);
    // Checked in file order (the records of a buffer front to back, which the memory
    // system streams), delivered in the window's shuffled order.
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_unstable_by_key(|&i| locs[i]);
    let checked: Vec<Result<Sample>> = order
        .par_iter()
        .map(|&i| {
            let (b, at) = locs[i];
            let e = &entries[i];
            let buf = &bufs[b as usize];
            let stored = buf
                .data()
                .get(at as usize..(at + e.stored_len) as usize)
                .ok_or_else(|| {
                    ReadError::invalid(format!("sample {}: read buffer too short", ids[i]))
                })?;
            let data = match decode_record(e, stored) {
                Ok(std::borrow::Cow::Borrowed(_)) => {
                    SampleData::Shared(buf.clone(), at as usize, e.stored_len as usize)
                }
                Ok(std::borrow::Cow::Owned(v)) => SampleData::Owned(v),
                Err(_) if buf.is_cut() => return Err(cut_under_map(ids[i], buf)),
                Err(err) => {
                    let info = ds.sample(ids[i])?;
                    return Err(ds.record_error(&info, err));
                }
            };
            Ok(Sample {
                id: ids[i],
                label: e.label,
                weight: weights.get(i).copied().unwrap_or(1.0),
                source: 0,
                crc32: e.crc32,
                data,
            })
        })
        .collect();
    let mut out: Vec<Option<Result<Sample>>> = (0..ids.len()).map(|_| None).collect();
    for (k, r) in order.into_iter().zip(checked) {
        out[k] = Some(r);
    }
    out.into_iter()
        .map(|r| r.expect("every sample checked once"))
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
        o.output.chunk_size = 2 << 10;
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
