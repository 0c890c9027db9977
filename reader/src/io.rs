//! The I/O engine: batches of large positional reads, several in flight, through io_uring or a
//! pread thread pool with the same interface. `GRANARY_IO=uring|pread` forces a backend.
//!
//! Files are opened with `O_DIRECT` where the file system allows it (reads then bypass the page
//! cache and go straight into 4 KiB-aligned buffers); elsewhere (tmpfs, some FUSE mounts) they
//! are read buffered. Short reads, `EINTR` and `EAGAIN` are retried; errors name the file and
//! offset.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{ReadError, Result};

/// Alignment of direct I/O offsets, lengths and buffers.
pub const ALIGN: usize = 4096;
static METADATA_OPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts metadata operations (opens, stats) the reader issues, for benchmarks.
pub(crate) fn count_metadata_ops(n: u64) {
    METADATA_OPS.fetch_add(n, Ordering::Relaxed);
}

/// Metadata operations (file opens and stats) issued by this process's granary readers so far:
/// what a parallel file system's metadata server would see.
pub fn metadata_ops() -> u64 {
    METADATA_OPS.load(Ordering::Relaxed)
}

/// Opens `path` for reading only if it is a regular file: a FIFO, device or directory with a
/// data file's name (in a dataset or a tier) is an error at once instead of an `open` that
/// blocks forever or a read that fails later. `extra` adds open flags (`O_DIRECT`). The file is
/// opened non-blocking, checked with `fstat`, then switched back to blocking (io_uring would
/// otherwise answer reads on it with `EAGAIN`).
pub fn open_regular(path: &Path, extra: i32) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | extra)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let flags = rustix::fs::fcntl_getfl(&f)?;
    rustix::fs::fcntl_setfl(&f, flags - rustix::fs::OFlags::NONBLOCK)?;
    Ok(f)
}

/// Idle read buffers an engine keeps for reuse.
pub const POOL_BYTES: usize = 512 << 20;
/// Largest single read submitted; bigger ranges are split so more requests are in flight.
pub const MAX_PIECE: usize = 4 << 20;

/// Which backend performs reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// io_uring if the kernel offers it, else pread; `GRANARY_IO` overrides.
    Auto,
    /// io_uring.
    Uring,
    /// A pool of threads issuing pread.
    Pread,
}

impl IoKind {
    /// Parses `auto`, `uring` or `pread`.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(IoKind::Auto),
            "uring" | "io_uring" => Ok(IoKind::Uring),
            "pread" => Ok(IoKind::Pread),
            _ => Err(format!(
                "unknown I/O backend {s:?}: use auto, uring or pread"
            )),
        }
    }
}

/// A file opened for the engine, with whether reads on it must be aligned.
#[derive(Debug)]
pub struct IoFile {
    pub file: File,
    pub path: PathBuf,
    pub direct: bool,
    /// The file mapped, when it is resident in the page cache: requests on it complete at once
    /// as slices of the map (no read, no copy, no buffer).
    pub map: Option<memmap2::Mmap>,
}

impl IoFile {
    /// A file read with reads (`direct`: opened with `O_DIRECT`), not through a map.
    pub fn unmapped(file: File, path: &Path, direct: bool) -> Self {
        IoFile {
            file,
            path: path.to_path_buf(),
            direct,
            map: None,
        }
    }
}

/// A heap buffer whose usable part starts at a 4 KiB boundary (no unsafe allocation needed:
/// the Vec is over-allocated and the aligned start is found inside it). Buffers taken from a
/// [`BufPool`] go back to it when dropped, so steady-state reads neither allocate nor fault in
/// fresh pages.
pub struct AlignedBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
    pool: Option<Arc<BufPool>>,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` usable bytes, not pooled.
    pub fn new(len: usize) -> Self {
        Self::from_vec(vec![0u8; len + ALIGN], len, None)
    }

    fn from_vec(vec: Vec<u8>, len: usize, pool: Option<Arc<BufPool>>) -> Self {
        let start = vec.as_ptr().align_offset(ALIGN).min(ALIGN);
        debug_assert!(start + len <= vec.len());
        AlignedBuf {
            vec,
            start,
            len,
            pool,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.put(std::mem::take(&mut self.vec));
        }
    }
}

/// Recycles read buffers (bounded: at most `max_bytes` kept idle).
#[derive(Debug)]
pub struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
    max_bytes: usize,
}

impl BufPool {
    /// A pool keeping at most `max_bytes` of idle buffers.
    pub fn new(max_bytes: usize) -> Arc<Self> {
        Arc::new(BufPool {
            free: Mutex::new(Vec::new()),
            max_bytes,
        })
    }

    /// A buffer of `len` usable aligned bytes (contents unspecified: reads overwrite them).
    pub fn get(self: &Arc<Self>, len: usize) -> AlignedBuf {
        let need = len + ALIGN;
        let reused = {
            let mut free = self.free.lock().expect("pool lock");
            // The smallest idle buffer that fits.
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.len() >= need)
                .min_by_key(|(_, v)| v.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        // Fresh sizes are rounded up (to a power of two below 1 MiB, to whole MiB above) so
        // that a buffer also fits the next, slightly larger request.
        let size = if need < 1 << 20 {
            need.next_power_of_two()
        } else {
            need.next_multiple_of(1 << 20)
        };
        let vec = reused.unwrap_or_else(|| vec![0u8; size]);
        AlignedBuf::from_vec(vec, len, Some(self.clone()))
    }

    fn put(&self, v: Vec<u8>) {
        let mut free = self.free.lock().expect("pool lock");
        let held: usize = free.iter().map(Vec::len).sum();
        if held + v.len() <= self.max_bytes {
            free.push(v);
        }
    }
}

/// One requested byte range of a file.
#[derive(Clone)]
pub struct Request {
    pub file: Arc<IoFile>,
    pub offset: u64,
    pub len: usize,
}

/// The bytes of a completed request: `data()` is exactly the requested range.
pub struct Completed {
    src: Source,
    skip: usize,
    len: usize,
}

/// Where a completed request's bytes are.
enum Source {
    /// Read into a buffer.
    Buf(AlignedBuf),
    /// In the file's map (bounds checked when the request completed).
    Map(Arc<IoFile>),
}

impl Completed {
    pub fn data(&self) -> &[u8] {
        match &self.src {
            Source::Buf(b) => &b.as_slice()[self.skip..self.skip + self.len],
            Source::Map(f) => {
                &f.map.as_deref().expect("mapped file")[self.skip..self.skip + self.len]
            }
        }
    }

    /// True when the bytes were served from a map of the page cache (no read, no copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.src, Source::Map(_))
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

/// Buffers and pieces to read for `reqs`; a request on a mapped file gets neither (`None`).
fn plan_pieces(
    reqs: &[Request],
    pool: &Arc<BufPool>,
) -> (Vec<Option<AlignedBuf>>, Vec<usize>, Vec<Piece>) {
    let mut bufs = Vec::with_capacity(reqs.len());
    let mut skips = Vec::with_capacity(reqs.len());
    let mut pieces = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        if r.file.map.is_some() {
            bufs.push(None);
            skips.push(r.offset as usize);
            continue;
        }
        let (start, end) = if r.file.direct {
            let s = r.offset & !(ALIGN as u64 - 1);
            (s, (r.offset + r.len as u64).next_multiple_of(ALIGN as u64))
        } else {
            (r.offset, r.offset + r.len as u64)
        };
        let total = (end - start) as usize;
        let needed_end = (r.offset + r.len as u64 - start) as usize;
        bufs.push(Some(pool.get(total)));
        skips.push((r.offset - start) as usize);
        let mut at = 0;
        while at < total {
            let len = MAX_PIECE.min(total - at);
            let need = needed_end.saturating_sub(at).min(len);
            pieces.push(Piece {
                req: i,
                at,
                offset: start + at as u64,
                len,
                need,
            });
            at += len;
        }
    }
    (bufs, skips, pieces)
}

fn finish(
    bufs: Vec<Option<AlignedBuf>>,
    skips: Vec<usize>,
    reqs: &[Request],
) -> Result<Vec<Completed>> {
    bufs.into_iter()
        .zip(skips)
        .zip(reqs)
        .map(|((buf, skip), r)| {
            let src = match buf {
                Some(b) => Source::Buf(b),
                None => {
                    let mapped = r.file.map.as_ref().map_or(0, |m| m.len() as u64);
                    if r.offset + r.len as u64 > mapped {
                        return Err(eof_error(r, mapped));
                    }
                    Source::Map(r.file.clone())
                }
            };
            Ok(Completed {
                src,
                skip,
                len: r.len,
            })
        })
        .collect()
}

fn eof_error(r: &Request, offset: u64) -> ReadError {
    ReadError::io(
        "reading",
        &r.file.path,
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("file ends before offset {offset}"),
        ),
    )
}

/// A reading engine: executes batches of requests with up to `queue_depth` reads in flight
/// and at most `max_inflight_bytes` bytes outstanding.
pub enum Engine {
    Uring(Box<UringEngine>),
    Pread(PreadEngine),
}

impl Engine {
    /// Creates the engine `kind` asks for (`Auto`: `GRANARY_IO`, else io_uring when available).
    pub fn new(kind: IoKind, queue_depth: usize, max_inflight_bytes: usize) -> Result<Engine> {
        let kind = match (kind, std::env::var("GRANARY_IO").ok().as_deref()) {
            (IoKind::Auto, Some("pread")) => IoKind::Pread,
            (IoKind::Auto, Some("uring")) => IoKind::Uring,
            (IoKind::Auto, Some(other)) if !other.is_empty() => {
                return Err(ReadError::Invalid(format!(
                    "GRANARY_IO={other}: use uring or pread"
                )))
            }
            (k, _) => k,
        };
        let qd = queue_depth.clamp(1, 4096);
        let cap = max_inflight_bytes.max(MAX_PIECE);
        match kind {
            IoKind::Pread => Ok(Engine::Pread(PreadEngine {
                threads: qd,
                max_inflight_bytes: cap,
                pool: BufPool::new(POOL_BYTES),
            })),
            IoKind::Uring => UringEngine::new(qd, cap).map(|u| Engine::Uring(Box::new(u))),
            IoKind::Auto => Ok(match UringEngine::new(qd, cap) {
                Ok(u) => Engine::Uring(Box::new(u)),
                Err(_) => Engine::Pread(PreadEngine {
                    threads: qd,
                    max_inflight_bytes: cap,
                    pool: BufPool::new(POOL_BYTES),
                }),
            }),
        }
    }

    /// Short name: "uring" or "pread".
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Uring(_) => "uring",
            Engine::Pread(_) => "pread",
        }
    }

    /// Queues a batch; with io_uring its reads start at once and overlap the batches before
    /// it. Collect it with [`Engine::wait`], oldest batch first.
    pub fn submit(&mut self, reqs: Vec<Request>) -> Pending {
        match self {
            Engine::Uring(u) => Pending::Uring(u.submit(reqs)),
            Engine::Pread(_) => Pending::Pread(reqs),
        }
    }

    /// Completes a batch returned by [`Engine::submit`] (in submission order).
    pub fn wait(&mut self, p: Pending) -> Result<Vec<Completed>> {
        match (self, p) {
            (Engine::Uring(u), Pending::Uring(id)) => u.wait(id),
            (Engine::Pread(e), Pending::Pread(reqs)) => e.read(&reqs),
            _ => Err(ReadError::Invalid(
                "batch waited on by another engine".into(),
            )),
        }
    }

    /// Reads every request; results are in request order. On error, every read in flight is
    /// completed before returning, and the error names the file and offset.
    pub fn read(&mut self, reqs: &[Request]) -> Result<Vec<Completed>> {
        match self {
            Engine::Uring(u) => u.read(reqs),
            Engine::Pread(p) => p.read(reqs),
        }
    }
}

/// A batch submitted to an [`Engine`].
pub enum Pending {
    Uring(u64),
    Pread(Vec<Request>),
}

/// pread from a pool of threads (one read per thread in flight).
pub struct PreadEngine {
    threads: usize,
    max_inflight_bytes: usize,
    pool: Arc<BufPool>,
}

impl PreadEngine {
    fn read(&mut self, reqs: &[Request]) -> Result<Vec<Completed>> {
        let (mut bufs, skips, pieces) = plan_pieces(reqs, &self.pool);
        // Hand each piece its own disjoint slice of its buffer.
        let mut slices: Vec<Vec<&mut [u8]>> = Vec::with_capacity(bufs.len());
        {
            let mut by_req: Vec<Vec<&Piece>> = vec![Vec::new(); reqs.len()];
            for p in &pieces {
                by_req[p.req].push(p);
            }
            for (buf, ps) in bufs.iter_mut().zip(&by_req) {
                let Some(buf) = buf else {
                    slices.push(Vec::new());
                    continue;
                };
                let mut rest = buf.as_mut_slice();
                let mut v = Vec::with_capacity(ps.len());
                for p in ps {
                    let (a, b) = rest.split_at_mut(p.len);
                    v.push(a);
                    rest = b;
                }
                slices.push(v);
            }
        }
        let mut work: Vec<(&Piece, &mut [u8])> = Vec::with_capacity(pieces.len());
        let mut iters: Vec<_> = slices.into_iter().map(|v| v.into_iter()).collect();
        for p in &pieces {
            work.push((p, iters[p.req].next().expect("one slice per piece")));
        }
        let threads = self
            .threads
            .min(work.len())
            .min(self.max_inflight_bytes / MAX_PIECE + 1)
            .max(1);
        let queue = Mutex::new(work.into_iter());
        let first_error: Mutex<Option<ReadError>> = Mutex::new(None);
        let failed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    if failed.load(Ordering::Relaxed) > 0 {
                        return;
                    }
                    let next = queue.lock().expect("queue lock").next();
                    let Some((p, dst)) = next else { return };
                    if let Err(e) = pread_full(&reqs[p.req], p, dst) {
                        failed.fetch_add(1, Ordering::Relaxed);
                        first_error.lock().expect("error lock").get_or_insert(e);
                        return;
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().expect("error lock") {
            return Err(e);
        }
        finish(bufs, skips, reqs)
    }
}

fn pread_full(r: &Request, p: &Piece, dst: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < p.len {
        match r
            .file
            .file
            .read_at(&mut dst[done..], p.offset + done as u64)
        {
            Ok(0) if done >= p.need => return Ok(()),
            Ok(0) => return Err(eof_error(r, p.offset + done as u64)),
            Ok(n) => {
                done += n;
                if done >= p.need {
                    return Ok(()); // the rest, if any, lies past the end of the file
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) => {}
            Err(e) => {
                return Err(ReadError::io(
                    "reading",
                    &r.file.path,
                    std::io::Error::new(
                        e.kind(),
                        format!("at offset {}: {e}", p.offset + done as u64),
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// A batch of requests being read by the io_uring engine.
struct Batch {
    id: u64,
    reqs: Vec<Request>,
    bufs: Vec<Option<AlignedBuf>>,
    /// Start address of each buffer's usable part (as an integer, so the engine stays `Send`;
    /// 0 for a mapped request, which has no pieces).
    addrs: Vec<usize>,
    skips: Vec<usize>,
    pieces: Vec<Piece>,
    done: Vec<usize>,
    /// Pieces not yet complete (queued or in flight).
    remaining: usize,
    /// Pieces of this batch in flight.
    inflight: usize,
    error: Option<ReadError>,
}

/// io_uring: one ring shared by a queue of batches, so the reads of the next batch keep the
/// device busy while the previous batch's last reads complete.
pub struct UringEngine {
    ring: io_uring::IoUring,
    depth: usize,
    max_inflight_bytes: usize,
    pool: Arc<BufPool>,
    batches: std::collections::VecDeque<Batch>,
    /// (batch id, piece) waiting to be submitted, in order.
    todo: std::collections::VecDeque<(u64, usize)>,
    next_id: u64,
    inflight: usize,
    inflight_bytes: usize,
    broken: bool,
}

impl UringEngine {
    fn new(depth: usize, max_inflight_bytes: usize) -> Result<Self> {
        let ring = io_uring::IoUring::new(depth.next_power_of_two() as u32)
            .map_err(|e| ReadError::io("creating io_uring", "(kernel)", e))?;
        Ok(UringEngine {
            ring,
            depth,
            max_inflight_bytes,
            pool: BufPool::new(POOL_BYTES),
            batches: Default::default(),
            todo: Default::default(),
            next_id: 0,
            inflight: 0,
            inflight_bytes: 0,
            broken: false,
        })
    }

    fn batch_mut(&mut self, id: u64) -> Option<&mut Batch> {
        let front = self.batches.front()?.id;
        self.batches.get_mut(id.checked_sub(front)? as usize)
    }

    /// Queues a batch of requests; returns its id for [`UringEngine::wait`].
    pub fn submit(&mut self, reqs: Vec<Request>) -> u64 {
        let (mut bufs, skips, pieces) = plan_pieces(&reqs, &self.pool);
        let addrs = bufs
            .iter_mut()
            .map(|b| {
                b.as_mut()
                    .map_or(0, |b| b.as_mut_slice().as_mut_ptr() as usize)
            })
            .collect();
        let id = self.next_id;
        self.next_id += 1;
        self.todo.extend((0..pieces.len()).map(|p| (id, p)));
        self.batches.push_back(Batch {
            id,
            reqs,
            bufs,
            addrs,
            skips,
            done: vec![0; pieces.len()],
            remaining: pieces.len(),
            inflight: 0,
            pieces,
            error: None,
        });
        self.fill();
        id
    }

    /// Pushes queued pieces into the submission queue up to the depth and byte caps.
    fn fill(&mut self) {
        while self.inflight < self.depth && !self.broken {
            let Some(&(id, i)) = self.todo.front() else {
                break;
            };
            let (max_bytes, inflight) = (self.max_inflight_bytes, self.inflight_bytes);
            let Some(b) = self.batch_mut(id) else {
                self.todo.pop_front();
                continue;
            };
            if b.error.is_some() {
                // A failed batch reads nothing more.
                b.remaining -= 1;
                self.todo.pop_front();
                continue;
            }
            let p = &b.pieces[i];
            let len = p.len - b.done[i];
            if inflight > 0 && inflight + len > max_bytes {
                break;
            }
            let fd = b.reqs[p.req].file.file.as_raw_fd();
            let target = (b.addrs[p.req] + p.at + b.done[i]) as *mut u8;
            let entry = io_uring::opcode::Read::new(io_uring::types::Fd(fd), target, len as u32)
                .offset(p.offset + b.done[i] as u64)
                .build()
                .user_data((id << 24) | i as u64);
            // SAFETY: `target..target + len` lies inside the usable part of `bufs[p.req]` of a
            // batch this engine owns; the buffer's heap allocation is neither moved, read nor
            // freed until the read completes (batches leave the engine only when none of their
            // pieces is in flight, and Drop waits for every read in flight), and the file
            // descriptor belongs to `reqs`, which the batch keeps open as long.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                break;
            }
            self.todo.pop_front();
            let b = self.batch_mut(id).expect("batch exists");
            b.inflight += 1;
            self.inflight += 1;
            self.inflight_bytes += len;
        }
    }

    /// Waits for one completion at least and processes every available one.
    fn reap(&mut self) -> Result<()> {
        match self.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) => {}
            Err(e) => {
                self.broken = true;
                return Err(ReadError::io("waiting on io_uring", "(kernel)", e));
            }
        }
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in cqes {
            let (id, i) = (ud >> 24, (ud & 0xFF_FFFF) as usize);
            self.inflight -= 1;
            let Some(b) = self.batch_mut(id) else {
                continue;
            };
            b.inflight -= 1;
            let p = &b.pieces[i];
            let asked = p.len - b.done[i];
            let mut requeue = false;
            if res == -libc::EINTR || res == -libc::EAGAIN {
                requeue = true;
            } else if res < 0 {
                let e = std::io::Error::from_raw_os_error(-res);
                let at = p.offset + b.done[i] as u64;
                let path = b.reqs[p.req].file.path.clone();
                b.error.get_or_insert(ReadError::io(
                    "reading",
                    path,
                    std::io::Error::new(e.kind(), format!("at offset {at}: {e}")),
                ));
                b.remaining -= 1;
            } else if res == 0 {
                if b.done[i] < p.need {
                    let e = eof_error(&b.reqs[p.req], p.offset + b.done[i] as u64);
                    b.error.get_or_insert(e);
                }
                b.remaining -= 1;
            } else {
                b.done[i] += res as usize;
                if b.done[i] < p.need {
                    requeue = true; // short read: ask for the rest
                } else {
                    b.remaining -= 1;
                }
            }
            self.inflight_bytes -= asked;
            if requeue {
                self.todo.push_front((id, i));
            }
        }
        Ok(())
    }

    /// Waits until batch `id` (the oldest one) is complete; returns its buffers in request
    /// order, or its first error once none of its reads is in flight any more.
    pub fn wait(&mut self, id: u64) -> Result<Vec<Completed>> {
        if self.batches.front().map(|b| b.id) != Some(id) {
            return Err(ReadError::Invalid(format!(
                "io_uring batch {id} is not the oldest one"
            )));
        }
        loop {
            self.fill();
            let b = self.batches.front().expect("checked above");
            let finished = b.remaining == 0 || (b.error.is_some() && b.inflight == 0);
            if finished {
                let b = self.batches.pop_front().expect("checked above");
                self.todo.retain(|(t, _)| *t != id);
                if let Some(e) = b.error {
                    return Err(e);
                }
                return finish(b.bufs, b.skips, &b.reqs);
            }
            self.reap()?;
        }
    }

    fn read(&mut self, reqs: &[Request]) -> Result<Vec<Completed>> {
        let id = self.submit(reqs.to_vec());
        self.wait(id)
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Never free a buffer the kernel may still write: wait for every read in flight.
        while self.inflight > 0 && !self.broken {
            if self.reap().is_err() {
                break;
            }
        }
        if self.inflight > 0 {
            for b in std::mem::take(&mut self.batches) {
                std::mem::forget(b);
            }
        }
    }
}
