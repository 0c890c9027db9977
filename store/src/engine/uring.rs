//! The io_uring backend of the engine: one ring shared by a queue of batches, on the engine's
//! thread, reading local files' pieces on their descriptors (other sources are read through
//! their own batched reads when their batch is queued).

use std::os::fd::AsRawFd;

use super::{
    eof_at, failed, finish, group_pieces, piece_slices, read_error, read_groups, QueuedBatch,
    Reply, REMOTE_SOURCES_IN_FLIGHT,
};
use crate::error::{Result, StoreError};

/// A batch of requests being read by the io_uring engine.
struct Batch {
    id: u64,
    q: QueuedBatch,
    /// The descriptor of each request read on its local file (-1 for the others): a source
    /// that moves to another file while the batch is read keeps this one open.
    fds: Vec<i32>,
    /// Start address of each buffer's usable part (as an integer, so the engine stays `Send`;
    /// 0 for a mapped request, which has no pieces).
    addrs: Vec<usize>,
    /// Bytes read of each piece.
    done: Vec<usize>,
    /// Pieces not yet complete (queued or in flight).
    remaining: usize,
    /// Pieces of this batch in flight.
    inflight: usize,
    error: Option<StoreError>,
    reply: Reply,
}

/// io_uring: one ring shared by a queue of batches, so the reads of the next batch keep the
/// device busy while the previous batch's last reads complete. Lives on the engine's thread.
pub(super) struct UringEngine {
    ring: io_uring::IoUring,
    depth: usize,
    max_inflight_bytes: usize,
    batches: std::collections::VecDeque<Batch>,
    /// (batch id, piece) waiting to be submitted, in order.
    todo: std::collections::VecDeque<(u64, usize)>,
    next_id: u64,
    inflight: usize,
    inflight_bytes: usize,
    broken: bool,
}

/// Why setting up an io_uring ring failed with `e`, in the words an administrator needs: what
/// switched it off and what to change.
fn why_no_uring(e: &std::io::Error) -> String {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => match sysctl.as_str() {
            "2" => "io_uring is switched off on this machine (sysctl kernel.io_uring_disabled = 2)"
                .into(),
            "1" => "io_uring is only for the group in kernel.io_uring_group here \
                    (sysctl kernel.io_uring_disabled = 1)"
                .into(),
            _ => format!(
                "setting up io_uring was refused ({e}): a seccomp filter (container runtimes \
                 install one that blocks it) or a security module"
            ),
        },
        Some(libc::ENOSYS) => "this kernel has no io_uring (ENOSYS)".into(),
        Some(libc::ENOMEM) => format!(
            "not enough lockable memory for an io_uring ring ({e}; raise the memlock limit, \
             `ulimit -l`)"
        ),
        _ => format!("setting up io_uring failed: {e}"),
    }
}

impl UringEngine {
    /// A ring of `depth` entries (rounded up to a power of two), or why the kernel refused it
    /// ([`why_no_uring`]).
    pub(super) fn new(
        depth: usize,
        max_inflight_bytes: usize,
    ) -> std::result::Result<Self, String> {
        let ring = io_uring::IoUring::new(depth.next_power_of_two() as u32)
            .map_err(|e| why_no_uring(&e))?;
        Ok(UringEngine {
            ring,
            depth,
            max_inflight_bytes,
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

    /// Serves the batches `rx` sends, in order, until the channel closes; each batch's result
    /// goes to its reply channel as soon as it is complete.
    pub(super) fn serve(mut self, rx: std::sync::mpsc::Receiver<(QueuedBatch, Reply)>) {
        let mut open = true;
        loop {
            // Block for work only when nothing is queued or in flight; end when nothing more
            // can come.
            if self.batches.is_empty() {
                match rx.recv() {
                    Ok((b, reply)) => self.submit(b, reply),
                    Err(_) => return,
                }
            }
            while open {
                match rx.try_recv() {
                    Ok((b, reply)) => self.submit(b, reply),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => open = false,
                }
            }
            self.fill();
            while let Some(b) = self.batches.front() {
                if !(b.remaining == 0 || (b.error.is_some() && b.inflight == 0)) {
                    break;
                }
                let b = self.batches.pop_front().expect("checked above");
                let id = b.id;
                self.todo.retain(|(t, _)| *t != id);
                let result = match b.error {
                    Some(e) => Err(e),
                    None => finish(b.q),
                };
                let _ = b.reply.send(result);
            }
            if self.batches.is_empty() {
                continue;
            }
            if let Err(e) = self.reap() {
                // The ring is unusable: every batch fails (their buffers stay with the engine,
                // whose Drop keeps any the kernel may still write).
                let msg = e.to_string();
                for b in self.batches.iter_mut() {
                    let _ = b.reply.send(Err(StoreError::Stopped(msg.clone())));
                }
                return;
            }
        }
    }

    /// Queues a batch of requests.
    fn submit(&mut self, mut q: QueuedBatch, reply: Reply) {
        // Sources that are not local files (when the batch was queued) are read through their
        // own batched reads, here and now; the ring reads the rest.
        let slices = piece_slices(&mut q.done, &q.pieces);
        let others = slices.into_iter().filter(|(p, _)| !q.local[p.req]);
        // Each source's ranges from one thread, several sources at once: an object store's
        // reads are network round trips, not ring submissions.
        let groups = group_pieces(&q.reqs, others);
        let error = read_groups(&q.reqs, &q.local, groups, REMOTE_SOURCES_IN_FLIGHT, None).err();
        let addrs = q
            .done
            .iter_mut()
            .map(|c| {
                c.bytes
                    .buf_mut()
                    .map_or(0, |b| b.as_mut_slice().as_mut_ptr() as usize)
            })
            .collect();
        let fds = q
            .reqs
            .iter()
            .zip(&q.local)
            .map(|(r, &l)| match r.source.local().filter(|_| l) {
                Some(f) => f.file().as_raw_fd(),
                None => -1,
            })
            .collect();
        let id = self.next_id;
        self.next_id += 1;
        let on_ring = |&p: &usize| q.local[q.pieces[p].req];
        let ring_pieces: Vec<usize> = (0..q.pieces.len()).filter(on_ring).collect();
        self.todo.extend(ring_pieces.iter().map(|&p| (id, p)));
        self.batches.push_back(Batch {
            id,
            fds,
            addrs,
            done: vec![0; q.pieces.len()],
            remaining: ring_pieces.len(),
            inflight: 0,
            q,
            error,
            reply,
        });
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
            let p = &b.q.pieces[i];
            let len = p.len - b.done[i];
            if inflight > 0 && inflight + len > max_bytes {
                break;
            }
            // Only local files' pieces are queued on the ring.
            let fd = b.fds[p.req];
            let target = (b.addrs[p.req] + p.at + b.done[i]) as *mut u8;
            let entry = io_uring::opcode::Read::new(io_uring::types::Fd(fd), target, len as u32)
                .offset(p.offset + b.done[i] as u64)
                .build()
                .user_data((id << 24) | i as u64);
            // SAFETY: `target..target + len` lies inside the usable part of `done[p.req]` of a
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
                return Err(StoreError::io("waiting on io_uring", "(kernel)", e));
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
            let p = &b.q.pieces[i];
            let asked = p.len - b.done[i];
            let (src, at) = (&b.q.reqs[p.req].source, p.offset + b.done[i] as u64);
            let requeue = match res {
                _ if res == -libc::EINTR || res == -libc::EAGAIN => true,
                ..=0 => {
                    if res < 0 {
                        let e = std::io::Error::from_raw_os_error(-res);
                        b.error.get_or_insert(read_error(src.location(), at, e));
                        failed(src);
                    } else if b.done[i] < p.need {
                        b.error.get_or_insert(eof_at(src.location(), at));
                        failed(src);
                    }
                    false
                }
                // A short read: the rest is asked for.
                _ => {
                    b.done[i] += res as usize;
                    b.done[i] < p.need
                }
            };
            if !requeue {
                b.remaining -= 1;
            }
            self.inflight_bytes -= asked;
            if requeue {
                self.todo.push_front((id, i));
            }
        }
        Ok(())
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
            std::mem::forget(std::mem::take(&mut self.batches));
        }
    }
}
