//! Read buffers: 4 KiB-aligned heap buffers (for `O_DIRECT`) recycled by a pool that counts
//! every byte handed out, so that a stream keeps its read-ahead within a memory budget.

use std::sync::{Arc, Mutex};

/// Alignment of direct I/O offsets, lengths and buffers.
pub const ALIGN: usize = 4096;

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

/// Idle buffers unused for this long are freed: a stream that pauses (evaluation, a slow
/// step) gives its spare memory back.
const IDLE_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Recycles read buffers and accounts for them: `in_use` counts the bytes of every buffer
/// handed out and not yet dropped (wherever it is: in flight, being decoded, held by samples
/// the consumer has not dropped), so a stream can keep its read-ahead within a memory budget.
/// Idle buffers are kept only while idle + in use stays within `cap`, and only for
/// [`IDLE_TTL`].
#[derive(Debug)]
pub struct BufPool {
    state: Mutex<PoolState>,
    cap: usize,
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<(Vec<u8>, std::time::Instant)>,
    idle: usize,
    in_use: usize,
    peak_in_use: usize,
}

impl PoolState {
    /// Frees idle buffers older than [`IDLE_TTL`], then (oldest first) until `idle + in_use +
    /// extra <= cap`.
    fn shrink(&mut self, cap: usize, extra: usize) {
        let now = std::time::Instant::now();
        self.free.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
        while let Some((v, t)) = self.free.last() {
            if now.duration_since(*t) < IDLE_TTL && self.idle + self.in_use + extra <= cap {
                break;
            }
            self.idle -= v.len();
            self.free.pop();
        }
    }
}

impl BufPool {
    /// A pool whose buffers, idle and in use, stay within `cap` bytes as long as the reads
    /// asked of it do (it never refuses a buffer: the caller keeps its requests in budget).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(BufPool {
            state: Mutex::new(PoolState::default()),
            cap,
        })
    }

    /// The most bytes a buffer for a read of `len` bytes takes from the pool: fresh sizes are
    /// rounded up (to whole pages below 1 MiB, to whole MiB above) so that a buffer also fits
    /// the next, slightly larger request, and an idle buffer up to an eighth (at least a page,
    /// at most 1 MiB) larger may be reused for it.
    pub fn charge(len: usize) -> usize {
        let size = Self::fresh_size(len);
        size + (size / 8).next_multiple_of(ALIGN).min(1 << 20)
    }

    fn fresh_size(len: usize) -> usize {
        let need = len + ALIGN;
        if need < 1 << 20 {
            need.next_multiple_of(ALIGN)
        } else {
            need.next_multiple_of(1 << 20)
        }
    }

    /// A buffer of `len` usable aligned bytes (contents unspecified: reads overwrite them).
    pub fn get(self: &Arc<Self>, len: usize) -> AlignedBuf {
        let need = len + ALIGN;
        let size = Self::fresh_size(len);
        let reused = {
            let mut st = self.state.lock().expect("pool lock");
            // The smallest idle buffer that fits and is not much larger (see `charge`).
            let best = st
                .free
                .iter()
                .enumerate()
                .filter(|(_, (v, _))| v.len() >= need && v.len() <= Self::charge(len))
                .min_by_key(|(_, (v, _))| v.len())
                .map(|(i, _)| i);
            let reused = best.map(|i| st.free.swap_remove(i).0);
            match &reused {
                Some(v) => st.idle -= v.len(),
                // Idle buffers too small for this request make room for a fresh one.
                None => st.shrink(self.cap, size),
            }
            st.in_use += reused.as_ref().map_or(size, Vec::len);
            st.peak_in_use = st.peak_in_use.max(st.in_use);
            reused
        };
        let vec = reused.unwrap_or_else(|| vec![0u8; size]);
        AlignedBuf::from_vec(vec, len, Some(self.clone()))
    }

    fn put(&self, v: Vec<u8>) {
        let mut st = self.state.lock().expect("pool lock");
        st.in_use -= v.len();
        st.shrink(self.cap, v.len());
        if st.idle + st.in_use + v.len() <= self.cap {
            st.idle += v.len();
            st.free.push((v, std::time::Instant::now()));
        }
    }

    /// Counts `len` bytes of a map borrowed by a completed request until the lease drops.
    pub fn lease(self: &Arc<Self>, len: usize) -> MapLease {
        let mut st = self.state.lock().expect("pool lock");
        st.in_use += len;
        st.peak_in_use = st.peak_in_use.max(st.in_use);
        // Mapped pages are memory too: idle buffers make room for them.
        st.shrink(self.cap, 0);
        MapLease {
            pool: self.clone(),
            len,
        }
    }

    /// Bytes of buffers handed out and not yet dropped, and of maps borrowed.
    pub fn in_use(&self) -> usize {
        self.state.lock().expect("pool lock").in_use
    }

    /// The most bytes in use at once so far.
    pub fn peak_in_use(&self) -> usize {
        self.state.lock().expect("pool lock").peak_in_use
    }

    /// Bytes of idle buffers kept for reuse.
    pub fn idle(&self) -> usize {
        self.state.lock().expect("pool lock").idle
    }

    /// The pool's bound on idle plus in-use bytes.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

/// Mapped bytes a completed request borrows, counted in its pool's bytes in use.
pub struct MapLease {
    pool: Arc<BufPool>,
    len: usize,
}

impl Drop for MapLease {
    fn drop(&mut self) {
        self.pool.state.lock().expect("pool lock").in_use -= self.len;
    }
}
