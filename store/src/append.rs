//! Appending to many files at once, without a descriptor each, the writes in the background.
//!
//! Each file has an [`Appender`], which gathers bytes in a buffer of whole blocks; a full
//! buffer goes to the [`Appends`] all of them share, whose threads write it at its offset
//! (past the page cache where that pays) while the appender fills another. Memory: one buffer
//! per appender, and at most `in_flight` more queued or being written. A failed write is the
//! error of every later call on any appender of the pool, naming the file.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::buf::{AlignedBuf, ALIGN};
use crate::write::{
    crash_point, direct_pays, open_temp, set_direct, write_all_at, Durability, Pending, Seal,
};

/// The background writes of many [`Appender`]s (see the module documentation).
pub struct Appends {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a write is queued or completes, or the pool closes.
    changed: Condvar,
    /// Bytes in a buffer: whole blocks.
    cap: usize,
    in_flight: usize,
}

struct State {
    queue: VecDeque<Job>,
    /// Writes queued or being written.
    pending: usize,
    /// Buffers of completed writes, for the next full appender.
    free: Vec<AlignedBuf>,
    /// False once the file system refused a direct write.
    direct: bool,
    /// The first failed write: what, and where.
    failed: Option<(io::ErrorKind, String)>,
    closed: bool,
}

/// A file appended to: its temporary name, and whether its appender was dropped unpublished
/// (its queued writes are then dropped, not failed).
struct Target {
    path: PathBuf,
    abandoned: AtomicBool,
}

/// A full buffer to write at `at` in `path`.
struct Job {
    path: Arc<Target>,
    at: u64,
    buf: AlignedBuf,
}

impl Appends {
    /// A pool writing on `threads` threads from buffers of about `buffer` bytes, at most
    /// `in_flight` of them queued or being written.
    pub fn new(buffer: usize, threads: usize, in_flight: usize) -> io::Result<Appends> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                pending: 0,
                free: Vec::new(),
                direct: true,
                failed: None,
                closed: false,
            }),
            changed: Condvar::new(),
            // Whole blocks, less one so that a buffer's memory is `buffer` (see crate::buf).
            cap: (buffer / ALIGN).saturating_sub(1).max(1) * ALIGN,
            in_flight: in_flight.max(1),
        });
        let mut pool = Appends {
            shared,
            threads: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let t = std::thread::Builder::new()
                .name(format!("granary-append-{i}"))
                .spawn(move || shared.run())?;
            pool.threads.push(t);
        }
        Ok(pool)
    }
}

impl Drop for Appends {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.closed = true;
            // A pool goes only when its files are finished or abandoned.
            st.pending -= st.queue.len();
            st.queue.clear();
        }
        self.shared.changed.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl State {
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some((kind, what)) => Err(io::Error::new(*kind, what.clone())),
            None => Ok(()),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(st)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every buffer handed over is written; the first failure if one failed.
    fn wait_idle(&self) -> io::Result<()> {
        let mut st = self.lock();
        while st.pending > 0 {
            st = self.wait(st);
        }
        st.check()
    }

    /// One writer thread: writes queued buffers until the pool closes.
    fn run(&self) {
        loop {
            let (job, direct) = {
                let mut st = self.lock();
                loop {
                    if let Some(job) = st.queue.pop_front() {
                        break (job, st.direct);
                    }
                    if st.closed {
                        return;
                    }
                    st = self.wait(st);
                }
            };
            // A file flushed before its end (not how the writer uses it) goes on unaligned.
            let direct = direct && job.at.is_multiple_of(ALIGN as u64);
            let written = match job.path.abandoned.load(Relaxed) {
                true => Ok(false),
                false => write_at(
                    &job.path.path,
                    &job.buf.as_slice()[..self.cap],
                    job.at,
                    direct,
                ),
            };
            let mut st = self.lock();
            st.pending -= 1;
            match written {
                Ok(refused) => st.direct &= !refused,
                // Removed under a write by its appender's drop: nobody waits for that file.
                Err(_) if job.path.abandoned.load(Relaxed) => {}
                Err(e) => {
                    let what = format!("writing {} at {}: {e}", job.path.path.display(), job.at);
                    st.failed.get_or_insert((e.kind(), what));
                }
            }
            if st.free.len() < self.in_flight {
                st.free.push(job.buf);
            }
            drop(st);
            self.changed.notify_all();
        }
    }

    /// A buffer to fill: a free one, or a new one while fewer than `in_flight` writes are
    /// pending.
    fn take(&self) -> io::Result<AlignedBuf> {
        let mut st = self.lock();
        loop {
            st.check()?;
            if let Some(b) = st.free.pop() {
                return Ok(b);
            }
            if st.pending < self.in_flight {
                drop(st);
                return AlignedBuf::try_new(self.cap).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::OutOfMemory, "no memory for a write buffer")
                });
            }
            st = self.wait(st);
        }
    }

    fn submit(&self, job: Job) -> io::Result<()> {
        let mut st = self.lock();
        st.check()?;
        st.queue.push_back(job);
        st.pending += 1;
        drop(st);
        self.changed.notify_all();
        Ok(())
    }
}

/// Writes `bytes` at `at` in the existing file `path`, with `O_DIRECT` when `direct`; true
/// when the file system refused the direct write.
fn write_at(path: &Path, bytes: &[u8], at: u64, direct: bool) -> io::Result<bool> {
    let f = OpenOptions::new().write(true).open(path)?;
    let mut on = direct && set_direct(&f, true)?;
    write_all_at(&f, bytes, at, &mut on)?;
    Ok(direct && !on)
}

/// Appends to one file through an [`Appends`]: full buffers are written in the background;
/// [`Write::flush`] writes the rest and waits until every write of the pool is done.
pub struct Appender {
    path: Arc<Target>,
    /// Its rename, until [`Appender::seal`] hands it over.
    file: Option<Pending>,
    pool: Arc<Shared>,
    /// The buffer being filled, taken on the first write after a full one.
    buf: Option<AlignedBuf>,
    len: usize,
    /// Where `buf` goes in the file.
    at: u64,
}

impl Appender {
    /// Starts `target`, appended to through `pool` under a temporary name until it is
    /// published, as every file granary writes ([`crate::write`]).
    pub fn create(target: &Path, durability: Durability, pool: &Appends) -> io::Result<Appender> {
        let (file, f) = open_temp(target, durability)?;
        if !direct_pays(&f) {
            pool.shared.lock().direct = false;
        }
        Ok(Appender {
            path: Arc::new(Target {
                path: file.tmp_path().to_path_buf(),
                abandoned: AtomicBool::new(false),
            }),
            file: Some(file),
            pool: Arc::clone(&pool.shared),
            buf: None,
            len: 0,
            at: 0,
        })
    }
}

impl Seal for Appender {
    /// The file written whole and synced, to be renamed over its target.
    fn seal(mut self) -> io::Result<Pending> {
        crash_point("write", &self.file.as_ref().expect("sealed once").path);
        self.flush()?;
        let file = self.file.take().expect("sealed once");
        file.synced(None)
    }

    fn tmp_path(&self) -> &Path {
        &self.path.path
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        // Its writes still queued are dropped, and its file removed (by `file`).
        if self.file.is_some() {
            self.path.abandoned.store(true, Relaxed);
        }
    }
}

impl Write for Appender {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let cap = self.pool.cap;
        let buf = match &mut self.buf {
            Some(buf) => buf,
            None => self.buf.insert(self.pool.take()?),
        };
        let n = b.len().min(cap - self.len);
        buf.as_mut_slice()[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
        if self.len == cap {
            let buf = self.buf.take().expect("filled above");
            let (path, at) = (Arc::clone(&self.path), self.at);
            self.pool.submit(Job { path, at, buf })?;
            self.at += cap as u64;
            self.len = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(buf) = &self.buf {
            write_at(&self.path.path, &buf.as_slice()[..self.len], self.at, false)?;
            self.at += self.len as u64;
            self.len = 0;
        }
        self.pool.wait_idle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_files_hold_exactly_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 17 % 251) as u8).collect();
        // (buffer, write sizes): buffer-fulls of whole blocks, writes larger than the buffer,
        // a flush in the middle (the rest then lies in the file before the next buffer).
        let cases: [(usize, &[usize]); 4] = [
            (16 << 10, &[64, 100_000, 1, 4096, 250_000]),
            (1 << 20, &[64, 2_500_000, 7]),
            (20_000, &[5; 10]),
            (64 << 10, &[0]),
        ];
        for (i, (buffer, sizes)) in cases.iter().enumerate() {
            // Two files filled in turns through one pool of two threads and two buffers.
            let pool = Appends::new(*buffer, 2, 2).unwrap();
            let paths = [0, 1].map(|k| dir.path().join(format!("a{i}-{k}")));
            let mut a = paths
                .clone()
                .map(|p| Appender::create(&p, Durability::Rename, &pool).unwrap());
            let mut at = 0;
            for (k, n) in sizes.iter().enumerate() {
                for f in &mut a {
                    f.write_all(&data[at..at + n]).unwrap();
                }
                at += n;
                if k == 2 {
                    a[0].flush().unwrap();
                }
            }
            for f in &mut a {
                f.write_all(&data[at..at + 3333]).unwrap();
                f.flush().unwrap();
            }
            at += 3333;
            for (f, p) in a.into_iter().zip(&paths) {
                f.seal().unwrap().publish().unwrap();
                let got = std::fs::read(p).unwrap();
                assert!(got == data[..at], "case {i}: {} bytes of {at}", got.len());
            }
        }
    }

    #[test]
    fn a_failed_background_write_is_the_next_calls_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Appends::new(16 << 10, 1, 1).unwrap();
        let mut a = Appender::create(&dir.path().join("gone"), Durability::Rename, &pool).unwrap();
        // The file disappears: the background write of the first full buffer cannot open it.
        std::fs::remove_file(a.tmp_path()).unwrap();
        let chunk = vec![7u8; 64 << 10];
        let mut err = None;
        for _ in 0..8 {
            if let Err(e) = a.write_all(&chunk) {
                err = Some(e);
                break;
            }
        }
        let e = err
            .or_else(|| a.flush().err())
            .expect("the failure comes back");
        assert!(e.to_string().contains("gone"), "{e}");
        assert!(pool.shared.wait_idle().is_err());
    }

    #[test]
    fn an_appender_dropped_unpublished_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Appends::new(16 << 10, 1, 1).unwrap();
        let mut a = Appender::create(&dir.path().join("x"), Durability::File, &pool).unwrap();
        a.write_all(&[1u8; 40 << 10]).unwrap();
        drop(a);
        // Its writes still queued are dropped, not the pool's failure.
        pool.shared.wait_idle().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
