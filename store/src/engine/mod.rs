//! The I/O engine: batches of large positional reads of any sources, several in flight, through
//! io_uring or a pread thread pool with the same interface ([`IoKind`]).
//!
//! A source that is a local file, or a layer over one ([`crate::ChunkSource::local`]), is read
//! on its descriptor (or served from its map) and told what was read
//! ([`crate::ChunkSource::observe_local`]), so a layer over a local file (the meter) keeps the
//! fast path and still counts; every other source is read through
//! [`crate::ChunkSource::read_ranges`], one call per source and batch. Short reads, `EINTR` and
//! `EAGAIN` are retried; errors name the file and offset.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::buf::MapLease;
pub use crate::buf::{AlignedBuf, BufPool, ALIGN};
use crate::error::{Result, StoreError};
use crate::file::{eof_at, pread_at_least, read_error};
pub use crate::seam::LocalFile;
use crate::seam::{BytesFrom, LocalRead, RangeRead, Source};
pub use verified::{Expect, Relocate};

mod uring;
pub mod verified;
use uring::UringEngine;

/// Buffer bytes (idle and in use) of an engine made with [`Engine::new`].
const POOL_BYTES: usize = 128 << 20;
/// Largest single read submitted; bigger ranges are split so more requests are in flight.
const MAX_PIECE: usize = 4 << 20;
/// Largest single read of a local file through the page cache: such reads run in order per
/// file, and the kernel's readahead keeps the device busy between them.
const BUFFERED_PIECE: usize = 1 << 20;

/// Whether io_uring can be used in this process: `Ok(())`, or why not (what switched it off
/// and what to change), found once by setting up a small ring.
pub fn uring_available() -> std::result::Result<(), &'static str> {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let why = WHY.get_or_init(|| UringEngine::new(2, MAX_PIECE).err());
    why.as_deref().map_or(Ok(()), Err)
}

/// Logs, once per process and reason, that reads go to pread because io_uring cannot run.
fn said_once(why: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.iter().any(|w| w == why) {
        said.push(why.to_owned());
        log::warn!(
            "{why}: reading with pread instead (same results, less throughput on fast storage)"
        );
    }
}

granary_format::named_enum! {
    /// Which backend performs reads.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum IoKind ("I/O backend") {
        /// io_uring if the kernel offers it, else pread.
        Auto = "auto",
        /// io_uring.
        Uring = "uring" | "io_uring",
        /// A pool of threads issuing pread.
        Pread = "pread",
    }
}

/// One requested byte range of a chunk source, and what its bytes must be (checked where
/// they come from a copy: see [`verified`]).
#[derive(Clone)]
pub struct Request {
    pub source: Source,
    pub offset: u64,
    pub len: usize,
    pub expect: Expect,
}

impl Request {
    /// The map its bytes come from, when its source is a resident local file.
    pub fn map(&self) -> Option<&crate::file::Mapped> {
        self.source.local().and_then(|f| f.map())
    }

    /// True when its source is a local file opened with `O_DIRECT` (reads must be aligned).
    pub fn direct(&self) -> bool {
        self.source.local().is_some_and(|f| f.direct())
    }
}

/// The bytes of a completed request: `data()` is exactly the requested range.
pub struct Completed {
    bytes: Bytes,
    skip: usize,
    len: usize,
    from: BytesFrom,
}

/// Where a request's bytes are (from its submission on: a buffer to read into or its file's
/// map, both counted in the pool's budget; or bytes read again alone, which are not).
enum Bytes {
    /// Read into a buffer.
    Buf(AlignedBuf),
    /// In the file's map (bounds checked when the request completed), counted in the pool's
    /// bytes in use while borrowed: mapped pages are in the reader's RSS as long.
    Map(Source, #[allow(dead_code)] MapLease),
    /// Read again alone after a copy failed ([`verified`]).
    Owned(Vec<u8>),
}

impl AsRef<[u8]> for Completed {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

impl Bytes {
    fn buf_mut(&mut self) -> Option<&mut AlignedBuf> {
        match self {
            Bytes::Buf(b) => Some(b),
            _ => None,
        }
    }
}

impl Completed {
    pub fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Buf(b) => &b.as_slice()[self.skip..self.skip + self.len],
            Bytes::Map(..) => &self.map().expect("mapped file")[self.skip..self.skip + self.len],
            Bytes::Owned(v) => v,
        }
    }

    /// The source and local file whose map holds the bytes, if they are in one.
    fn mapped(&self) -> Option<(&Source, &dyn LocalFile)> {
        match &self.bytes {
            Bytes::Map(f, _) => f.local().map(|l| (f, l)),
            _ => None,
        }
    }

    /// The map that holds the bytes, if they are in one.
    fn map(&self) -> Option<&crate::file::Mapped> {
        self.mapped().and_then(|(_, l)| l.map())
    }

    /// Where the bytes came from in the end (after any copy that failed was read again below
    /// it): for counts by layer.
    pub fn from(&self) -> BytesFrom {
        self.from
    }

    /// Maps the pages of `data()[at..at + len]` into the page tables in one call instead of
    /// a fault per page, when the bytes are in a map (best effort: before Linux 5.14 they
    /// fault in as read).
    pub fn populate(&self, at: usize, len: usize) {
        if let Some(m) = self.map() {
            m.populate(self.skip + at, len);
        }
    }

    /// True when the bytes were served from a map of the page cache (no read, no copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Map(..))
    }

    /// For bytes in a map: the mapped file, its path, and the offset in it where `data()`
    /// starts.
    pub fn mapped_file(&self) -> Option<(&std::path::Path, &std::fs::File, u64)> {
        let (f, l) = self.mapped()?;
        Some((f.location(), l.file(), self.skip as u64))
    }

    /// True when the bytes are in a map whose file was cut short (truncated by another
    /// process) since it was mapped: pages of it read as zeros (one `fstat`).
    pub fn is_cut(&self) -> bool {
        self.mapped().is_some_and(|(_, l)| l.map_cut())
    }
}

/// A piece of a request: `buf[at..at + len]` receives file bytes `[offset, offset + len)`,
/// of which the first `need` must arrive (the rest may lie past the end of the file).
struct Piece {
    req: usize,
    at: usize,
    offset: u64,
    len: usize,
    need: usize,
}

/// `reqs` queued: which are read on their local file (decided once: a source may move to a
/// local copy while it is read), and their buffers and pieces; a request on a mapped file gets
/// no buffer and no pieces, only a lease on the map.
fn plan(reqs: Arc<[Request]>, pool: &Arc<BufPool>) -> QueuedBatch {
    let local: Vec<bool> = reqs.iter().map(|r| r.source.local().is_some()).collect();
    let mut done = Vec::with_capacity(reqs.len());
    let mut pieces = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let (bytes, skip) = if r.map().is_some() {
            (Bytes::Map(r.source.clone(), pool.lease(r.len)), r.offset)
        } else {
            let (start, end) = if r.direct() {
                let s = r.offset & !(ALIGN as u64 - 1);
                (s, (r.offset + r.len as u64).next_multiple_of(ALIGN as u64))
            } else {
                (r.offset, r.offset + r.len as u64)
            };
            let total = (end - start) as usize;
            let needed_end = (r.offset + r.len as u64 - start) as usize;
            // A source that is not a local file (an object store, a peer) gets the range
            // whole: it splits it into its own requests (an object store's GETs of up to
            // `GET_PART`), so that a whole chunk is one GET, not one per piece.
            let piece = if local[i] && !r.direct() {
                BUFFERED_PIECE
            } else if !local[i] {
                total.max(1)
            } else {
                MAX_PIECE
            };
            for at in (0..total).step_by(piece) {
                let len = piece.min(total - at);
                let need = needed_end.saturating_sub(at).min(len);
                pieces.push(Piece {
                    req: i,
                    at,
                    offset: start + at as u64,
                    len,
                    need,
                });
            }
            (Bytes::Buf(pool.get(total)), r.offset - start)
        };
        done.push(Completed {
            bytes,
            skip: skip as usize,
            len: r.len,
            from: r.source.bytes_from(),
        });
    }
    QueuedBatch {
        queued: Instant::now(),
        reqs,
        local,
        done,
        pieces,
    }
}

/// The completed requests of `batch`, each told to its source if the engine read it on a local
/// file (`local`, decided when the batch was queued: [`observe`]).
fn finish(batch: QueuedBatch) -> Result<Vec<Completed>> {
    let QueuedBatch {
        queued,
        reqs,
        local,
        mut done,
        ..
    } = batch;
    for (c, r) in done.iter_mut().zip(&reqs[..]) {
        if let Bytes::Map(..) = c.bytes {
            let mapped = r.map().map_or(0, |m| m.len() as u64);
            if r.offset + r.len as u64 > mapped {
                failed(&r.source);
                return Err(eof_at(r.source.location(), mapped));
            }
        }
        // Where the bytes came from in the end.
        c.from = r.source.bytes_from();
    }
    observe(&reqs, &local, queued.elapsed());
    Ok(done)
}

/// Tells each source the engine read on its local file (`local`) what it read, and a share of
/// the batch's time `took` by its bytes (a map's requests waited for nothing).
fn observe(reqs: &[Request], local: &[bool], took: Duration) {
    let read = |r: &Request| r.source.local().is_some_and(|f| f.map().is_none());
    let on_file = || reqs.iter().zip(local).filter(|(_, &l)| l).map(|(r, _)| r);
    let total: u64 = on_file().filter(|r| read(r)).map(|r| r.len as u64).sum();
    for r in on_file() {
        let waited = if read(r) && total > 0 {
            took.mul_f64(r.len as f64 / total as f64)
        } else {
            Duration::ZERO
        };
        r.source.observe_local(LocalRead {
            ranges: 1,
            bytes: r.len as u64,
            waited,
            failed: false,
        });
    }
}

/// Tells a source that a read of its local file failed.
fn failed(source: &Source) {
    source.observe_local(LocalRead {
        ranges: 1,
        bytes: 0,
        waited: Duration::ZERO,
        failed: true,
    });
}

/// Each piece with its part of its request's buffer (`pieces` hold each request's pieces in
/// order, back to back; requests served from a map have none).
fn piece_slices<'a, 'p>(
    done: &'a mut [Completed],
    pieces: &'p [Piece],
) -> Vec<(&'p Piece, &'a mut [u8])> {
    let mut rests: Vec<Option<&mut [u8]>> = done
        .iter_mut()
        .map(|c| c.bytes.buf_mut().map(|b| b.as_mut_slice()))
        .collect();
    pieces
        .iter()
        .map(|p| {
            let rest = rests[p.req].take().expect("a buffer for every read piece");
            let (a, b) = rest.split_at_mut(p.len);
            rests[p.req] = Some(b);
            (p, a)
        })
        .collect()
}

/// Pieces (with their buffers) grouped for reading, each group by one thread.
fn group_pieces<'a, 'p>(
    reqs: &[Request],
    pieces: impl IntoIterator<Item = (&'p Piece, &'a mut [u8])>,
) -> Vec<Vec<(&'p Piece, &'a mut [u8])>> {
    let mut groups: Vec<Vec<(&Piece, &mut [u8])>> = Vec::new();
    // Per source: its latest group, and where that group's last piece ends.
    let mut by_source: std::collections::HashMap<*const (), (usize, u64)> = Default::default();
    for (p, dst) in pieces {
        let src = &reqs[p.req].source;
        let local = src.local();
        // O_DIRECT pieces are read in parallel (the device gets them all at once). The
        // pieces of one range of a file read through the page cache are read in order by
        // one thread, as the kernel's readahead expects. A remote source's ranges go to one
        // thread (one `read_ranges` call, which it may serve concurrently).
        if local.is_some_and(|f| f.direct()) {
            groups.push(vec![(p, dst)]);
            continue;
        }
        let key = Arc::as_ptr(src) as *const ();
        let end = p.offset + p.len as u64;
        match by_source.get_mut(&key) {
            Some((g, next)) if local.is_none() || *next == p.offset => {
                *next = end;
                groups[*g].push((p, dst));
            }
            _ => {
                groups.push(vec![(p, dst)]);
                by_source.insert(key, (groups.len() - 1, end));
            }
        }
    }
    groups
}

/// Reads one group of [`group_pieces`]: on the local file where the batch was planned so
/// (`local`), else through the source's own reads.
fn read_group(reqs: &[Request], local: &[bool], group: Vec<(&Piece, &mut [u8])>) -> Result<()> {
    let Some(first) = group.first() else {
        return Ok(());
    };
    let src = reqs[first.0.req].source.clone();
    let on_file = local[first.0.req];
    let mut reads: Vec<RangeRead<'_>> = group
        .into_iter()
        .map(|(p, buf)| RangeRead {
            offset: p.offset,
            buf,
            need: p.need,
        })
        .collect();
    match src.local().filter(|_| on_file) {
        Some(f) => reads
            .iter_mut()
            .try_for_each(|r| pread_at_least(f.file(), f.path(), r))
            .inspect_err(|_| failed(&src)),
        None => src.read_ranges(&mut reads),
    }
}

/// Sources that are not local files read at once by one batch of the io_uring engine.
const REMOTE_SOURCES_IN_FLIGHT: usize = 8;

/// What a submitter gets back for one batch.
type Reply = std::sync::mpsc::SyncSender<Result<Vec<Completed>>>;

/// A reading engine: executes batches of requests with up to `queue_depth` reads in flight
/// and at most `max_inflight_bytes` bytes outstanding, in the background on a thread of its own
/// (the io_uring ring's, or pread's), so reads go on while the submitter decodes or waits for
/// its consumer. Buffers are taken from the pool when a batch is submitted.
pub struct Engine {
    name: &'static str,
    /// Why this engine reads with pread although io_uring was wanted (`auto`).
    fallback: Option<String>,
    pool: Arc<BufPool>,
    tx: Option<std::sync::mpsc::Sender<(QueuedBatch, Reply)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The background thread completes every read in flight (the kernel may still write
        // into their buffers), sees the channel closed and ends.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Engine {
    /// Creates the engine `kind` asks for (`Auto`: io_uring when available, else pread)
    /// with a buffer pool of [`POOL_BYTES`].
    pub fn new(kind: IoKind, queue_depth: usize, max_inflight_bytes: usize) -> Result<Engine> {
        Self::with_pool(
            kind,
            queue_depth,
            max_inflight_bytes,
            BufPool::new(POOL_BYTES),
        )
    }

    /// [`Engine::new`] reading into buffers of `pool` (whose accounting a stream uses to keep
    /// its read-ahead within its memory budget).
    pub fn with_pool(
        kind: IoKind,
        queue_depth: usize,
        max_inflight_bytes: usize,
        pool: Arc<BufPool>,
    ) -> Result<Engine> {
        let qd = queue_depth.clamp(1, 4096);
        let cap = max_inflight_bytes.max(MAX_PIECE);
        let (ring, fallback) = match kind {
            IoKind::Pread => (None, None),
            IoKind::Uring | IoKind::Auto => match UringEngine::new(qd, cap) {
                Ok(r) => (Some(r), None),
                Err(why) if kind == IoKind::Uring => {
                    return Err(StoreError::Invalid(format!(
                        "the io_uring backend was asked for (--backend uring, GRANARY_IO=uring) \
                         but cannot run: {why}; use the default backend (auto), which reads \
                         with pread then"
                    )))
                }
                Err(why) => {
                    said_once(&why);
                    (None, Some(why))
                }
            },
        };
        let (tx, rx) = std::sync::mpsc::channel::<(QueuedBatch, Reply)>();
        let name = if ring.is_some() { "uring" } else { "pread" };
        let thread = std::thread::Builder::new().name(format!("granary-{name}"));
        let thread = match ring {
            Some(ring) => thread.spawn(move || ring.serve(rx)),
            None => thread.spawn(move || serve_pread(rx, qd, cap)),
        }
        .map_err(|e| StoreError::io("starting the I/O engine's thread", "(thread)", e))?;
        Ok(Engine {
            name,
            fallback,
            pool,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// The pool the engine's buffers come from.
    pub fn pool(&self) -> &Arc<BufPool> {
        &self.pool
    }

    /// Short name: "uring" or "pread".
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Why this engine reads with pread although the default backend prefers io_uring (the
    /// kernel refused the ring); `None` if it reads with io_uring or pread was asked for.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Queues a batch: its buffers are taken from the pool now and its reads start in the
    /// background at once, after those of the batches before it. Collect it with
    /// [`Engine::wait`].
    pub fn submit(&mut self, reqs: Arc<[Request]>) -> Pending {
        let batch = plan(reqs.clone(), &self.pool);
        let (reply, done) = std::sync::mpsc::sync_channel(1);
        // A batch the engine's thread cannot take (a failed send gives it back) is answered
        // at once.
        let unsent = match &self.tx {
            Some(tx) => tx.send((batch, reply)).err().map(|e| (e.0).1),
            None => Some(reply),
        };
        if let Some(reply) = unsent {
            let _ = reply.send(Err(StoreError::Stopped(format!(
                "granary's {} thread has stopped",
                self.name
            ))));
        }
        Pending(done, reqs)
    }

    /// Completes a batch returned by [`Engine::submit`]: its buffers in request order, each
    /// verified ([`verified::settle`]: bytes of a copy that fail what their request
    /// expects are read again below the copy), or the first error (naming file and offset)
    /// once none of its reads is in flight any more.
    pub fn wait(&mut self, p: Pending) -> Result<Vec<Completed>> {
        let read = p.0.recv().map_err(|_| self.ended());
        verified::settle(&p.1, read.and_then(|r| r))
    }

    /// The error for a batch whose reply will never come.
    fn ended(&self) -> StoreError {
        StoreError::Stopped(format!(
            "granary's {} thread ended without finishing a batch",
            self.name
        ))
    }

    /// [`Engine::wait`] for at most `timeout`: `Err(p)` gives the batch back when it is not
    /// complete by then.
    pub fn wait_for(
        &mut self,
        p: Pending,
        timeout: std::time::Duration,
    ) -> std::result::Result<Result<Vec<Completed>>, Pending> {
        match p.0.recv_timeout(timeout) {
            Ok(r) => Ok(verified::settle(&p.1, r)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(p),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Ok(Err(self.ended())),
        }
    }

    /// Reads every request; results are in request order. On error, every read in flight is
    /// completed before returning, and the error names the file and offset.
    pub fn read(&mut self, reqs: &[Request]) -> Result<Vec<Completed>> {
        let p = self.submit(reqs.into());
        self.wait(p)
    }
}

/// A batch submitted to an [`Engine`]: its reply, and its requests (to settle it).
pub struct Pending(
    std::sync::mpsc::Receiver<Result<Vec<Completed>>>,
    Arc<[Request]>,
);

/// Requests queued on an engine, with their buffers and pieces.
struct QueuedBatch {
    queued: Instant,
    reqs: Arc<[Request]>,
    /// Which requests are read on their local file (the others through their source's own
    /// reads, which count them).
    local: Vec<bool>,
    /// Each request's bytes (their source told again when the batch completes).
    done: Vec<Completed>,
    pieces: Vec<Piece>,
}

/// The pread engine's background thread: runs each batch on a thread of its own as soon as it
/// is queued, so that the reads of the windows read ahead overlap (two sequential streams keep
/// the device busy where one leaves it idle between readahead rounds). At most `threads` ranges
/// are read at once over all batches ([`Slots`]), the oldest batch first. Ends when the engine
/// is dropped, after every batch it started has completed.
fn serve_pread(
    rx: std::sync::mpsc::Receiver<(QueuedBatch, Reply)>,
    queue_depth: usize,
    max_inflight_bytes: usize,
) {
    let threads = queue_depth.min(max_inflight_bytes / MAX_PIECE + 1).max(1);
    let slots = Arc::new(Slots::new(threads));
    let mut running: Vec<std::thread::JoinHandle<()>> = Vec::new();
    for (id, (mut batch, reply)) in (0u64..).zip(rx) {
        running.retain(|h| !h.is_finished());
        let slots = slots.clone();
        // If no thread can be started the reply is dropped with the closure, and the
        // submitter's wait reports that the engine did not finish the batch.
        if let Ok(h) = std::thread::Builder::new()
            .name("granary-pread-batch".into())
            .spawn(move || {
                let work = group_pieces(&batch.reqs, piece_slices(&mut batch.done, &batch.pieces));
                let slots = Some((&*slots, id));
                let read = read_groups(&batch.reqs, &batch.local, work, threads, slots);
                let _ = reply.send(read.and_then(|()| finish(batch)));
            })
        {
            running.push(h);
        }
    }
    for h in running {
        let _ = h.join();
    }
}

/// The reads the pread engine's batches may have in flight together. A free slot goes to the
/// oldest batch that waits for one, so the window the consumer needs next is never starved by
/// the windows read ahead of it.
struct Slots {
    state: Mutex<SlotState>,
    freed: std::sync::Condvar,
}

struct SlotState {
    free: usize,
    /// Threads waiting for a slot, per batch id.
    waiting: std::collections::BTreeMap<u64, usize>,
}

/// A slot taken by [`Slots::take`], given back when dropped.
struct SlotGuard<'a>(&'a Slots);

impl Slots {
    fn new(n: usize) -> Self {
        Slots {
            state: Mutex::new(SlotState {
                free: n,
                waiting: Default::default(),
            }),
            freed: std::sync::Condvar::new(),
        }
    }

    /// Waits for a free slot that no older batch waits for.
    fn take(&self, batch: u64) -> SlotGuard<'_> {
        let mut g = self.state.lock().expect("slots lock");
        *g.waiting.entry(batch).or_default() += 1;
        while g.free == 0 || g.waiting.keys().next() != Some(&batch) {
            g = self.freed.wait(g).expect("slots lock");
        }
        g.free -= 1;
        match g.waiting.get_mut(&batch) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                g.waiting.remove(&batch);
            }
        }
        drop(g);
        // The next waiter (of this batch or a younger one) may take a slot left free.
        self.freed.notify_all();
        SlotGuard(self)
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.state.lock().expect("slots lock").free += 1;
        self.0.freed.notify_all();
    }
}

/// Reads groups of [`group_pieces`] with up to `threads` threads, each group holding one of
/// `slots` (with its batch's id) while it is read, when given; the first error stops the rest
/// and is returned.
fn read_groups(
    reqs: &[Request],
    local: &[bool],
    work: Vec<Vec<(&Piece, &mut [u8])>>,
    threads: usize,
    slots: Option<(&Slots, u64)>,
) -> Result<()> {
    let read = |group| {
        let _slot = slots.map(|(s, batch)| s.take(batch));
        read_group(reqs, local, group)
    };
    let threads = threads.min(work.len()).max(1);
    if threads == 1 {
        return work.into_iter().try_for_each(read);
    }
    let queue = Mutex::new(work.into_iter());
    let first_error: Mutex<Option<StoreError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let next = queue.lock().expect("queue lock").next();
                let Some(group) = next else { return };
                if let Err(e) = read(group) {
                    first_error.lock().expect("error lock").get_or_insert(e);
                    // Nothing more is read.
                    queue.lock().expect("queue lock").by_ref().for_each(drop);
                    return;
                }
            });
        }
    });
    let first = first_error.into_inner().expect("error lock");
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod slot_tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn waiting(slots: &Slots, batch: u64) -> bool {
        slots.state.lock().unwrap().waiting.contains_key(&batch)
    }

    #[test]
    fn a_freed_slot_goes_to_the_oldest_waiting_batch() {
        let slots = Slots::new(1);
        let order = Mutex::new(Vec::new());
        let held = slots.take(5);
        std::thread::scope(|s| {
            let take = |batch| {
                let _g = slots.take(batch);
                order.lock().unwrap().push(batch);
            };
            // The younger batch asks first.
            s.spawn(move || take(7));
            while !waiting(&slots, 7) {
                std::thread::yield_now();
            }
            s.spawn(move || take(6));
            while !waiting(&slots, 6) {
                std::thread::yield_now();
            }
            drop(held);
        });
        assert_eq!(*order.lock().unwrap(), vec![6, 7]);
        assert_eq!(slots.state.lock().unwrap().free, 1);
    }

    #[test]
    fn slots_bound_the_reads_of_all_batches() {
        let slots = Slots::new(2);
        let now = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for batch in 0..4u64 {
                for _ in 0..3 {
                    let (slots, now, most) = (&slots, &now, &most);
                    s.spawn(move || {
                        let _g = slots.take(batch);
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        now.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            }
        });
        assert!(most.load(Ordering::SeqCst) <= 2);
    }
}
