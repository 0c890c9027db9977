//! Read buffers: 4 KiB-aligned buffers (for `O_DIRECT`) recycled by a pool that counts
//! every byte handed out, so that a stream keeps its read-ahead within a memory budget.
//!
//! Buffers of 2 MiB and more are anonymous maps advised to use transparent huge pages, their
//! usable part starting at a 2 MiB boundary: a direct read's pages go to the device as one
//! segment per physically contiguous run, and a request holds at most `max_segments` of them,
//! so a 4 MiB read into scattered 4 KiB pages leaves as several requests, into huge pages as
//! one. Where transparent huge pages are off, the buffers are ordinary pages.

use std::sync::{Arc, Mutex};

/// Alignment of direct I/O offsets, lengths and buffers.
pub const ALIGN: usize = 4096;

/// Size (and alignment) of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE: usize = 2 << 20;

/// The memory of a buffer (heap, or an anonymous map): `footprint` bytes counted by the pool,
/// usable from `start`.
struct Block {
    mem: Box<dyn std::ops::DerefMut<Target = [u8]> + Send + Sync>,
    start: usize,
    footprint: usize,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} bytes)", self.footprint)
    }
}

impl Block {
    /// A block of `footprint` bytes whose usable part, `footprint - ALIGN` bytes at least,
    /// starts at a 4 KiB boundary (at a 2 MiB one for blocks of 2 MiB and more); `None` where
    /// the memory cannot be had.
    fn new(footprint: usize) -> Option<Block> {
        Self::mapped(footprint).or_else(|| {
            let mut vec = Vec::new();
            vec.try_reserve_exact(footprint).ok()?;
            vec.resize(footprint, 0);
            let start = vec.as_ptr().align_offset(ALIGN).min(ALIGN);
            Some(Block {
                mem: Box::new(vec),
                start,
                footprint,
            })
        })
    }

    /// A block of 2 MiB or more as an anonymous map (`None` for a smaller one, or where the
    /// map cannot be made).
    fn mapped(footprint: usize) -> Option<Block> {
        if footprint < HUGE {
            return None;
        }
        // The map is 2 MiB longer than the footprint so that its usable part can start at a
        // huge-page boundary; pages never touched take no memory.
        let map = memmap2::MmapMut::map_anon(footprint.checked_add(HUGE)?).ok()?;
        let start = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
        // Best effort: without transparent huge pages the buffer has ordinary pages.
        let _ = map.advise_range(memmap2::Advice::HugePage, start, footprint);
        Some(Block {
            mem: Box::new(map),
            start,
            footprint,
        })
    }
}

/// A buffer whose usable part starts at a 4 KiB boundary (no unsafe allocation needed: the
/// memory is over-allocated and the aligned start is found inside it). Buffers taken from a
/// [`BufPool`] go back to it when dropped, so steady-state reads neither allocate nor fault in
/// fresh pages.
pub struct AlignedBuf {
    block: Option<Block>,
    len: usize,
    pool: Option<Arc<BufPool>>,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` usable bytes, not pooled.
    pub fn new(len: usize) -> Self {
        Self::try_new(len).expect("memory for a buffer")
    }

    /// As [`AlignedBuf::new`]; `None` where the memory cannot be had (a buffer as large as a
    /// file the caller was given).
    pub fn try_new(len: usize) -> Option<Self> {
        len.checked_add(HUGE)?; // sizes are rounded up by less than that
        let block = Block::new(BufPool::fresh_size(len))?;
        Some(Self::from_block(block, len, None))
    }

    fn from_block(block: Block, len: usize, pool: Option<Arc<BufPool>>) -> Self {
        debug_assert!(block.start + len <= block.mem.len());
        AlignedBuf {
            block: Some(block),
            len,
            pool,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        let b = self
            .block
            .as_ref()
            .expect("a buffer has its block until dropped");
        &b.mem[b.start..b.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let b = self
            .block
            .as_mut()
            .expect("a buffer has its block until dropped");
        &mut b.mem[b.start..b.start + self.len]
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let (Some(pool), Some(block)) = (self.pool.take(), self.block.take()) {
            pool.put(block);
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
    free: Vec<(Block, std::time::Instant)>,
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
            self.idle -= v.footprint;
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
                .filter(|(_, (b, _))| b.footprint >= need && b.footprint <= Self::charge(len))
                .min_by_key(|(_, (b, _))| b.footprint)
                .map(|(i, _)| i);
            let reused = best.map(|i| st.free.swap_remove(i).0);
            match &reused {
                Some(b) => st.idle -= b.footprint,
                // Idle buffers too small for this request make room for a fresh one.
                None => st.shrink(self.cap, size),
            }
            st.in_use += reused.as_ref().map_or(size, |b| b.footprint);
            st.peak_in_use = st.peak_in_use.max(st.in_use);
            reused
        };
        let block = reused
            .or_else(|| Block::new(size))
            .expect("memory for a buffer");
        AlignedBuf::from_block(block, len, Some(self.clone()))
    }

    fn put(&self, b: Block) {
        let mut st = self.state.lock().expect("pool lock");
        st.in_use -= b.footprint;
        st.shrink(self.cap, b.footprint);
        if st.idle + st.in_use + b.footprint <= self.cap {
            st.idle += b.footprint;
            st.free.push((b, std::time::Instant::now()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_start_on_a_huge_page_boundary_and_are_recycled() {
        let pool = BufPool::new(64 << 20);
        let len = (4 << 20) + 123;
        let mut b = pool.get(len);
        assert_eq!(b.as_slice().len(), len);
        assert_eq!(b.as_slice().as_ptr() as usize % HUGE, 0);
        b.as_mut_slice().fill(7);
        assert!(b.as_slice().iter().all(|&x| x == 7));
        let charged = pool.in_use();
        assert!(charged >= len + ALIGN && charged <= BufPool::charge(len));
        let addr = b.as_slice().as_ptr();
        drop(b);
        let idle = || pool.state.lock().unwrap().idle;
        assert_eq!((pool.in_use(), idle()), (0, charged));
        // The idle buffer serves the next request of about the same size.
        let again = pool.get(len - 1000);
        assert_eq!(again.as_slice().as_ptr(), addr);
        assert_eq!(idle(), 0);
    }

    #[test]
    fn small_buffers_are_page_aligned_heap_memory() {
        let pool = BufPool::new(1 << 20);
        let mut b = pool.get(10_000);
        assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
        b.as_mut_slice()[9_999] = 1;
        assert_eq!(b.as_slice().len(), 10_000);
        let unpooled = AlignedBuf::new(3 << 20);
        assert!(unpooled.as_slice().iter().all(|&x| x == 0));
        assert_eq!(unpooled.as_slice().as_ptr() as usize % ALIGN, 0);
    }
}
