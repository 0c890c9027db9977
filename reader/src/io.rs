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
}

impl IoFile {
    /// Opens `path`, with `O_DIRECT` when `direct` and the file system accepts it (checked with
    /// one aligned read), buffered otherwise.
    pub fn open(path: &Path, direct: bool) -> Result<IoFile> {
        if direct {
            if let Ok(file) = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                let mut probe = AlignedBuf::new(ALIGN);
                match file.read_at(probe.as_mut_slice(), 0) {
                    Ok(_) => {
                        return Ok(IoFile {
                            file,
                            path: path.to_path_buf(),
                            direct: true,
                        })
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    Err(e) => return Err(ReadError::io("reading", path, e)),
                }
            }
        }
        let file = File::open(path).map_err(|e| ReadError::io("opening", path, e))?;
        Ok(IoFile {
            file,
            path: path.to_path_buf(),
            direct: false,
        })
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
    buf: AlignedBuf,
    skip: usize,
    len: usize,
}

impl Completed {
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[self.skip..self.skip + self.len]
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

fn plan_pieces(reqs: &[Request], pool: &Arc<BufPool>) -> (Vec<AlignedBuf>, Vec<usize>, Vec<Piece>) {
    let mut bufs = Vec::with_capacity(reqs.len());
    let mut skips = Vec::with_capacity(reqs.len());
    let mut pieces = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let (start, end) = if r.file.direct {
            let s = r.offset & !(ALIGN as u64 - 1);
            (s, (r.offset + r.len as u64).next_multiple_of(ALIGN as u64))
        } else {
            (r.offset, r.offset + r.len as u64)
        };
        let total = (end - start) as usize;
        let needed_end = (r.offset + r.len as u64 - start) as usize;
        bufs.push(pool.get(total));
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

fn finish(bufs: Vec<AlignedBuf>, skips: Vec<usize>, reqs: &[Request]) -> Vec<Completed> {
    bufs.into_iter()
        .zip(skips)
        .zip(reqs)
        .map(|((buf, skip), r)| Completed {
            buf,
            skip,
            len: r.len,
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

    /// Reads every request; results are in request order. On error, every read in flight is
    /// completed before returning, and the error names the file and offset.
    pub fn read(&mut self, reqs: &[Request]) -> Result<Vec<Completed>> {
        match self {
            Engine::Uring(u) => u.read(reqs),
            Engine::Pread(p) => p.read(reqs),
        }
    }
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
        Ok(finish(bufs, skips, reqs))
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

/// io_uring: one ring, reads submitted in batches, completions reaped as they come.
pub struct UringEngine {
    ring: io_uring::IoUring,
    depth: usize,
    max_inflight_bytes: usize,
    pool: Arc<BufPool>,
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
        })
    }

    fn read(&mut self, reqs: &[Request]) -> Result<Vec<Completed>> {
        let (mut bufs, skips, pieces) = plan_pieces(reqs, &self.pool);
        // Progress of each piece (bytes done); pieces wait in `todo` until submitted.
        let mut done = vec![0usize; pieces.len()];
        let mut todo: std::collections::VecDeque<usize> = (0..pieces.len()).collect();
        let ptrs: Vec<*mut u8> = bufs
            .iter_mut()
            .map(|b| b.as_mut_slice().as_mut_ptr())
            .collect();
        let mut inflight = 0usize;
        let mut inflight_bytes = 0usize;
        let mut error: Option<ReadError> = None;
        while inflight > 0 || (error.is_none() && !todo.is_empty()) {
            while error.is_none() && inflight < self.depth {
                let Some(&i) = todo.front() else { break };
                let p = &pieces[i];
                let len = p.len - done[i];
                if inflight > 0 && inflight_bytes + len > self.max_inflight_bytes {
                    break;
                }
                let r = &reqs[p.req];
                // SAFETY: the target lies inside bufs[p.req][p.at + done[i] .. p.at + p.len], a
                // live heap allocation that is neither moved nor accessed until every read in
                // flight has completed (this loop only returns once `inflight` is 0), and the
                // file descriptor stays open for as long as `reqs` lives.
                let entry = io_uring::opcode::Read::new(
                    io_uring::types::Fd(r.file.file.as_raw_fd()),
                    unsafe { ptrs[p.req].add(p.at + done[i]) },
                    len as u32,
                )
                .offset(p.offset + done[i] as u64)
                .build()
                .user_data(i as u64);
                // SAFETY: see above; the entry's buffer outlives its completion.
                if unsafe { self.ring.submission().push(&entry) }.is_err() {
                    break;
                }
                todo.pop_front();
                inflight += 1;
                inflight_bytes += len;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    // The ring is unusable. Reads may still be in flight into `bufs`: leak the
                    // buffers rather than free memory the kernel could still write.
                    std::mem::forget(bufs);
                    return Err(ReadError::io("waiting on io_uring", "(kernel)", e));
                }
            }
            let cqes: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, res) in cqes {
                let i = ud as usize;
                let p = &pieces[i];
                let asked = p.len - done[i];
                inflight -= 1;
                inflight_bytes -= asked;
                if res == -libc::EINTR || res == -libc::EAGAIN {
                    todo.push_front(i);
                } else if res < 0 {
                    let e = std::io::Error::from_raw_os_error(-res);
                    let at = p.offset + done[i] as u64;
                    error.get_or_insert(ReadError::io(
                        "reading",
                        &reqs[p.req].file.path,
                        std::io::Error::new(e.kind(), format!("at offset {at}: {e}")),
                    ));
                } else if res == 0 {
                    if done[i] < p.need {
                        error.get_or_insert(eof_error(&reqs[p.req], p.offset + done[i] as u64));
                    }
                } else {
                    done[i] += res as usize;
                    if done[i] < p.need {
                        todo.push_front(i); // short read: ask for the rest
                    }
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        Ok(finish(bufs, skips, reqs))
    }
}
