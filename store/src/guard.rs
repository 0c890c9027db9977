//! Maps that survive their file being cut short.
//!
//! A read through a map of a file that another process truncated faults with SIGBUS, which
//! kills the process; granary's files are immutable once written, but a user (or a tool) can
//! still truncate one under a running job. Every map granary makes is registered here
//! ([`Mapped`]); a SIGBUS handler finds the faulting address in the registry, puts a page of
//! zeros over the vanished page (the read then completes), marks the map as cut and returns.
//! Nothing is served unchecked: chunk records are CRC-checked against the snapshot, and the
//! snapshot's own lookups check [`Mapped::is_cut`], so the read becomes an error naming the
//! file. A fault outside every registered map goes to the handler that was there before.
//! Nothing is spent on the read path: registering is one scan of a fixed table.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use memmap2::{Mmap, MmapMut};

/// Maps registered at once. A map beyond this is refused ([`Mapped::new`] gives `None`) and
/// the caller reads the file instead.
const SLOTS: usize = 8192;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    cut: AtomicBool,
    /// The map may be written (a private copy-on-write map): its zero pages must be too.
    writable: AtomicBool,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        cut: AtomicBool::new(false),
        writable: AtomicBool::new(false),
    }
}; SLOTS];
/// Where the next free-slot search starts.
static HINT: AtomicUsize = AtomicUsize::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// Whether our handler is installed (tried once).
static INSTALLED: OnceLock<bool> = OnceLock::new();
/// The SIGBUS action that was there before ours (written once, before ours is installed).
static mut PREVIOUS: Option<libc::sigaction> = None;

/// A map of a file, registered so that a truncation of the file under it is a page of zeros
/// and a flag ([`Guarded::is_cut`]) instead of SIGBUS: read-only ([`Mapped`]) or private
/// ([`PrivateMapped`]). Dereferences to the map.
#[derive(Debug)]
pub struct Guarded<M> {
    map: M,
    slot: usize,
    /// Per [`POPULATE_PIECE`] of the map: its page tables were filled once
    /// ([`Mapped::populate`]).
    populated: Box<[AtomicBool]>,
}

/// A read-only map of a file, guarded.
pub type Mapped = Guarded<Mmap>;

/// A private, copy-on-write map of a file, guarded: reads share the page cache's pages (no
/// copy), a write makes a private copy of its page and never reaches the file. For handing a
/// file's bytes to code that may write into them (a training process given tensors that are
/// views of a chunk file).
pub type PrivateMapped = Guarded<MmapMut>;

/// What [`Mapped::populate`] fills at a time, and remembers it filled.
pub const POPULATE_PIECE: usize = 2 << 20;

impl<M: Deref<Target = [u8]>> Guarded<M> {
    /// Registers `map` (`writable`: a private map, whose zero pages must be writable too);
    /// `None` if the handler cannot be installed or the table is full (the caller then reads
    /// instead of mapping).
    fn register(map: M, writable: bool) -> Option<Self> {
        let slot = register(map.as_ptr() as usize, map.len(), writable)?;
        let pieces = map.len().div_ceil(POPULATE_PIECE);
        let populated = (0..pieces).map(|_| AtomicBool::new(false)).collect();
        Some(Guarded {
            map,
            slot,
            populated,
        })
    }

    /// True once a read found part of the file gone (truncated after it was mapped): bytes
    /// read through the map since may be zeros instead of the file's.
    pub fn is_cut(&self) -> bool {
        TABLE[self.slot].cut.load(Ordering::Acquire)
    }
}

impl Mapped {
    /// Registers `map`; `None` if it cannot be guarded.
    pub fn new(map: Mmap) -> Option<Mapped> {
        Self::register(map, false)
    }

    /// Fills the page tables of `[at, at + len)` of the map in one call per piece instead of a
    /// fault per page (best effort: before Linux 5.14 the pages fault in as read), once per
    /// piece of the map's life: a map kept across windows (by the map cache) is filled
    /// once (pages the kernel reclaims meanwhile fault in again when read).
    pub fn populate(&self, at: usize, len: usize) {
        let end = (at + len).min(self.map.len());
        if at >= end {
            return;
        }
        for p in at / POPULATE_PIECE..end.div_ceil(POPULATE_PIECE) {
            if !self.populated[p].swap(true, Ordering::Relaxed) {
                let from = p * POPULATE_PIECE;
                let n = POPULATE_PIECE.min(self.map.len() - from);
                let _ = self
                    .map
                    .advise_range(memmap2::Advice::PopulateRead, from, n);
            }
        }
    }
}

impl PrivateMapped {
    /// Registers `map` (a private map: `MmapOptions::map_copy`); `None` if it cannot be
    /// guarded.
    pub fn new(map: MmapMut) -> Option<PrivateMapped> {
        Self::register(map, true)
    }

    /// The map's bytes, for reading and writing (copy on write: the file does not change).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }
}

impl<M> Deref for Guarded<M> {
    type Target = M;

    fn deref(&self) -> &M {
        &self.map
    }
}

impl<M: Deref<Target = [u8]>> AsRef<[u8]> for Guarded<M> {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl<M> Drop for Guarded<M> {
    /// Unregistered before the map goes (the field is dropped after this).
    fn drop(&mut self) {
        TABLE[self.slot].start.store(0, Ordering::Release);
    }
}

/// Claims a slot of the table for the map at `start..start + len`; `None` if the handler
/// cannot be installed or the table is full.
fn register(start: usize, len: usize, writable: bool) -> Option<usize> {
    if !install() {
        return None;
    }
    let first = HINT.fetch_add(1, Ordering::Relaxed);
    for k in 0..SLOTS {
        let i = (first + k) % SLOTS;
        let s = &TABLE[i];
        // Claim the slot with a marker, fill it, then publish the start.
        if s.start.load(Ordering::Relaxed) == 0
            && s.start
                .compare_exchange(0, usize::MAX, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            s.len.store(len, Ordering::Relaxed);
            s.cut.store(false, Ordering::Relaxed);
            s.writable.store(writable, Ordering::Relaxed);
            s.start.store(start.max(1), Ordering::Release);
            return Some(i);
        }
    }
    None
}

fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        PAGE.store(rustix::param::page_size(), Ordering::Relaxed);
        // SAFETY: `sa` is fully initialised (zeroed, then the handler, flags and an empty
        // mask); the previous action is written to PREVIOUS before our handler can run (it is
        // installed by the same call, and PREVIOUS is only read by the handler), and nothing
        // writes PREVIOUS again (this runs once).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return false;
            }
            PREVIOUS = Some(old);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) == 0
        }
    })
}

/// The SIGBUS handler: a fault inside a registered map gets a page of zeros over the missing
/// page and the map is marked cut; any other fault goes to the previous handler.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a handler installed with SA_SIGINFO.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for s in TABLE.iter() {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 || start == usize::MAX {
            continue;
        }
        let len = s.len.load(Ordering::Relaxed);
        if addr < start || addr >= start + len {
            continue;
        }
        let at = addr & !(page - 1);
        let prot = if s.writable.load(Ordering::Relaxed) {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: `at..at + page` lies within a live map of ours (registered until just
        // before it is unmapped), read-only or private (copy-on-write, so its pages are this
        // process's alone): replacing that page with an anonymous zero page of the same
        // protection changes what accesses to it see, nothing else. mmap is a plain system
        // call, safe to make in a signal handler.
        let r = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            s.cut.store(true, Ordering::Release);
            return;
        }
        break;
    }
    // SAFETY: PREVIOUS was written before this handler was installed and is never written
    // again; calling the previous handler with the arguments we were given is what the kernel
    // would have done; restoring the default action and returning re-runs the faulting
    // access, which then takes that action.
    unsafe {
        let prev = std::ptr::addr_of!(PREVIOUS).read();
        match prev {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(p.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                    f(sig);
                }
            }
            _ => {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Truncates the file at `p` to `len` bytes, as another process would under a map.
    fn cut(p: &std::path::Path, len: u64) {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(len).unwrap();
    }

    #[test]
    fn a_file_cut_short_under_its_map_reads_zeros_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&vec![7u8; 5 * 4096 + 100]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: a private test file, truncated below on purpose.
        let m = Mapped::new(unsafe { Mmap::map(&f) }.unwrap()).unwrap();
        assert_eq!(m[0], 7);
        assert!(!m.is_cut());
        cut(&p, 4096);
        // Past the new end: zeros, not SIGBUS; before it, the file's bytes.
        let tail: u64 = m[4096..].iter().map(|&b| b as u64).sum();
        assert_eq!(tail, 0);
        assert!(m.is_cut());
        assert_eq!(m[100], 7);
        drop(m);
        // Another map of a whole file is not marked.
        let m2 = Mapped::new(unsafe { Mmap::map(&f) }.unwrap()).unwrap();
        assert!(!m2.is_cut());
    }

    #[test]
    fn a_private_map_is_written_privately_and_survives_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 3 * 4096]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: a private test file, truncated below on purpose.
        let map = unsafe { memmap2::MmapOptions::new().map_copy(&f) }.unwrap();
        let mut m = PrivateMapped::new(map).unwrap();
        m.bytes_mut()[0] = 9;
        assert_eq!(m.bytes_mut()[0], 9);
        assert_eq!(std::fs::read(&p).unwrap()[0], 7, "the write stayed private");
        cut(&p, 4096);
        // Past the new end: zeros that can be written, not SIGBUS; the flag says so.
        assert_eq!(m.bytes_mut()[2 * 4096 + 5], 0);
        assert!(m.is_cut());
        m.bytes_mut()[2 * 4096 + 5] = 1;
        assert_eq!(m.bytes_mut()[2 * 4096 + 5], 1);
    }
}
