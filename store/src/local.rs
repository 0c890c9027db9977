//! Chunk files in a local directory (or any mounted file system): the local store
//! ([`LocalDir`]) and how it opens files ([`Opener`]): per reader and per file, through the
//! page cache or with `O_DIRECT`.
//!
//! `O_DIRECT` is right for data that is not in memory and would only push other data out; it is
//! wrong for data already resident (the device is read again although memory holds the bytes)
//! and for a dataset that fits in memory (the first epoch should leave it resident for the next
//! ones). [`IoMode::Auto`] therefore:
//!
//! - gives the dataset a page-cache budget (half of [`effective_memory`]), and keeps a fixed,
//!   seeded subset of chunks of that size ("kept" chunks: all of them when the dataset fits)
//!   read buffered in every epoch, so they become and stay resident: the page cache acts as a
//!   static cache, the best any cache does under uniform epochs;
//! - maps every file that is resident already, so that its samples are slices of the page
//!   cache: no read, no copy, no buffer;
//! - reads the other kept chunks through the page cache and the rest with `O_DIRECT`, so that a
//!   dataset larger than memory does not evict the kept chunks.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use crate::buf::{AlignedBuf, ALIGN};
use crate::counts::Meter;
use crate::error::{Result, StoreError};
use crate::file::{map_file, open_regular, IoFile};
use crate::seam::{Access, ChunkStore, IoMode, ReadPattern, Source};

/// Opens one reader's local files as its [`Access`] says, and counts how. Shared by the layers
/// of the reader's stack (the origin directory and the local tier), so that both follow one
/// policy and one count.
#[derive(Debug)]
pub struct Opener {
    a: Access,
    /// Auto: chunk `c` is kept resident when its hash falls below this (`u64::MAX`: all).
    keep_below: u64,
    /// Whether the file system accepts O_DIRECT (0: not probed yet, 1: yes, 2: no), probed
    /// with one aligned read on first use.
    direct_ok: AtomicU8,
    /// Bytes of maps of resident files kept across windows ([`crate::mapcache`]): the page
    /// cache the dataset may keep resident.
    keep_maps: u64,
}

/// Share of a file's pages that must be resident for it to be mapped: all of them. A page
/// missing from a map is read by a page fault, where a device error is a SIGBUS instead of an
/// error naming the file; a partly resident file is read with `read` (buffered) instead, so that
/// a failing read is reported like any other.
const RESIDENT_SHARE: f64 = 1.0;

const UNPROBED: u8 = 0;
const DIRECT_OK: u8 = 1;
const NO_DIRECT: u8 = 2;

impl Opener {
    /// The opener of a reader that reads as `access` says.
    pub fn for_access(a: &Access) -> Self {
        let budget = a.page_cache_bytes.unwrap_or_else(|| effective_memory() / 2);
        let keep_below = if budget >= a.dataset_bytes {
            u64::MAX
        } else {
            (budget as f64 / a.dataset_bytes.max(1) as f64 * u64::MAX as f64) as u64
        };
        Opener {
            a: a.clone(),
            keep_below,
            direct_ok: AtomicU8::new(UNPROBED),
            keep_maps: budget,
        }
    }

    /// The meter its opens are counted in (the layer's that opens with it).
    pub(crate) fn meter(&self) -> &Arc<Meter> {
        &self.a.meter
    }

    /// True when most files will be read through the page cache (Buffered, or Auto with a
    /// budget for most of the dataset).
    pub fn mostly_buffered(&self) -> bool {
        match self.a.mode {
            IoMode::Buffered => true,
            IoMode::Direct => false,
            IoMode::Auto => self.keep_below > u64::MAX / 2,
        }
    }

    /// An opener that reads every file `mode`'s way without a dataset budget (Auto: buffered
    /// where resident).
    pub fn plain(mode: IoMode) -> Self {
        Opener::for_access(&Access::plain(mode))
    }

    /// An opener for random access to a few records at a time (see [`Access::positional`]).
    pub fn positional() -> Self {
        Opener::for_access(&Access::positional())
    }

    /// True when Auto keeps chunk `chunk` resident (read buffered in every epoch).
    pub fn keeps(&self, chunk: u32) -> bool {
        self.keep_below == u64::MAX
            || granary_format::SplitMix64::keyed(&[self.a.seed, chunk as u64]).next_u64()
                < self.keep_below
    }

    /// Opens `path` for the engine; `chunk` keys Auto's choice of what to keep resident (the
    /// dataset chunk the file holds, or its tier copy's; a hot chunk's id; `None`: through the
    /// page cache only where already resident). A resident file (Auto or Buffered) is mapped:
    /// its requests complete as slices of the map.
    pub fn open(&self, path: &Path, chunk: Option<u32>) -> Result<IoFile> {
        self.open_as(path, chunk, true)
    }

    /// [`Opener::open`] for a file that someone else may cut short while it is read (a copy
    /// in the local tier): never mapped, so its bytes are read into buffers once, checked
    /// there, and a truncation is a short read (a miss), never SIGBUS or bytes that change
    /// after their check.
    pub fn open_unmapped(&self, path: &Path, chunk: Option<u32>) -> Result<IoFile> {
        self.open_as(path, chunk, false)
    }

    fn open_as(&self, path: &Path, chunk: Option<u32>, may_map: bool) -> Result<IoFile> {
        if self.a.mode == IoMode::Direct {
            return self.open_direct(path);
        }
        self.a.meter.metadata_ops(2); // open and fstat
        let file = open_regular(path, 0).map_err(|e| StoreError::io("opening", path, e))?;
        let md = file
            .metadata()
            .map_err(|e| StoreError::io("inspecting", path, e))?;
        let len = md.len();
        // The residency check: one `cachestat` call where the kernel has it, else `mincore` on
        // the map that then serves the reads.
        let map =
            match (len > 0 && self.a.map_resident && may_map).then(|| cached_share(&file, len)) {
                Some(Some(share)) if share >= RESIDENT_SHARE => {
                    self.map_of(&file, &md, path, chunk, |_| true)
                }
                Some(None) => self.map_of(&file, &md, path, chunk, |m| {
                    mapped_share(m) >= RESIDENT_SHARE
                }),
                _ => None,
            };
        if let Some(map) = &map {
            if self.a.populate {
                // Every page mapped in one call instead of a fault per page (best effort: on
                // kernels before 5.14 the pages fault in as they are read).
                map.populate(0, map.len());
            }
            self.a.meter.opened_resident.fetch_add(1, Relaxed);
        } else {
            let buffered = self.a.mode == IoMode::Buffered
                || chunk.is_some_and(|c| self.keeps(c))
                || self.direct_ok.load(Relaxed) == NO_DIRECT;
            if !buffered {
                drop(file);
                return self.open_direct(path);
            }
            self.a.meter.opened_buffered.fetch_add(1, Relaxed);
            advise(&file, self.a.pattern);
        }
        Ok(IoFile {
            file,
            path: path.to_path_buf(),
            direct: false,
            map,
            len,
            from: crate::seam::BytesFrom::Origin,
        })
    }

    /// A map of `file` (metadata `md`) whose pages `resident` finds all in memory: the one kept
    /// from before, or a new one, kept ([`crate::mapcache`]) when `chunk` is one the opener
    /// keeps resident.
    fn map_of(
        &self,
        file: &std::fs::File,
        md: &std::fs::Metadata,
        path: &Path,
        chunk: Option<u32>,
        resident: impl Fn(&crate::file::Mapped) -> bool,
    ) -> Option<Arc<crate::file::Mapped>> {
        let cache = crate::mapcache::MapCache::global();
        if let Some(m) = cache.get(md) {
            return resident(&m).then_some(m);
        }
        let m = Arc::new(map_file(file, path).ok()?);
        if !resident(&m) {
            return None;
        }
        // A kept chunk's map is kept for the next window and epoch.
        if chunk.is_some_and(|c| self.keeps(c)) {
            cache.put(md, path, m.clone(), self.keep_maps);
        }
        Some(m)
    }

    /// Opens `path` with `O_DIRECT` when the file system accepts it (checked with one aligned
    /// read on the first file), buffered otherwise.
    fn open_direct(&self, path: &Path) -> Result<IoFile> {
        if self.direct_ok.load(Relaxed) != NO_DIRECT {
            self.a.meter.metadata_ops(1);
            match open_regular(path, libc::O_DIRECT) {
                Ok(file) => {
                    if self.direct_ok.load(Relaxed) == UNPROBED {
                        let mut buf = AlignedBuf::new(ALIGN);
                        let verdict =
                            match std::os::unix::fs::FileExt::read_at(&file, buf.as_mut_slice(), 0)
                            {
                                Ok(_) => DIRECT_OK,
                                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => NO_DIRECT,
                                Err(e) => return Err(StoreError::io("reading", path, e)),
                            };
                        self.direct_ok.store(verdict, Relaxed);
                    }
                    if self.direct_ok.load(Relaxed) == DIRECT_OK {
                        self.a.meter.opened_direct.fetch_add(1, Relaxed);
                        self.a.meter.metadata_ops(1); // its fstat
                        return IoFile::unmapped(file, path, true);
                    }
                }
                // The file system refuses O_DIRECT (tmpfs): buffered reads for this reader.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_ok.store(NO_DIRECT, Relaxed)
                }
                // Missing, not a regular file, not permitted: not a verdict on O_DIRECT.
                Err(e) => return Err(StoreError::io("opening", path, e)),
            }
        }
        self.a.meter.metadata_ops(2); // open and fstat
        let file = open_regular(path, 0).map_err(|e| StoreError::io("opening", path, e))?;
        self.a.meter.opened_buffered.fetch_add(1, Relaxed);
        IoFile::unmapped(file, path, false)
    }
}

/// Chunk files in a local directory (or any mounted file system), opened by an [`Opener`]
/// (by default [`Opener::positional`]: random reads through the page cache).
#[derive(Debug, Clone)]
pub struct LocalDir {
    dir: PathBuf,
    opener: Arc<Opener>,
    /// Each chunk's revision, by id (a compacted chunk's file name says it); empty: all 0.
    revisions: Arc<[u32]>,
}

impl LocalDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_revisions(dir, Arc::from(Vec::new()))
    }

    /// The chunk files of a dataset whose chunks have these revisions (by id; a chunk past
    /// the table's end is at revision 0): the snapshot's revisions section.
    pub fn with_revisions(dir: impl Into<PathBuf>, revisions: Arc<[u32]>) -> Self {
        LocalDir {
            dir: dir.into(),
            opener: Arc::new(Opener::positional()),
            revisions,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl ChunkStore for LocalDir {
    fn chunk_location(&self, id: u32) -> PathBuf {
        let revision = self.revisions.get(id as usize).copied().unwrap_or(0);
        self.dir
            .join(granary_format::chunk_file_name_at(id, revision))
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn open_chunk(&self, id: u32) -> Result<Source> {
        Ok(Arc::new(
            self.opener.open(&self.chunk_location(id), Some(id))?,
        ))
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        let rd =
            std::fs::read_dir(&self.dir).map_err(|e| StoreError::io("listing", &self.dir, e))?;
        Ok(rd
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect())
    }

    fn tuned(&self, access: &Access) -> Option<Arc<dyn ChunkStore>> {
        Some(Arc::new(LocalDir {
            dir: self.dir.clone(),
            opener: Arc::new(Opener::for_access(access)),
            revisions: self.revisions.clone(),
        }))
    }
}

/// Bytes of the maps of resident chunks this process keeps for its next epochs
/// ([`crate::mapcache`]).
pub fn kept_map_bytes() -> u64 {
    crate::mapcache::MapCache::global().kept().1
}

/// The share of `f`'s pages (`len` bytes) that the page cache holds, from `mincore` on a
/// mapping of the file: exact, and unlike a probing read it starts no readahead (which would
/// pull a cold file into memory just by asking). 0 where the file cannot be mapped.
pub fn resident_share(f: &std::fs::File, len: u64) -> f64 {
    if len == 0 {
        return 1.0;
    }
    map_file(f, Path::new("(residency probe)")).map_or(0.0, |m| mapped_share(&m))
}

/// The share of `f`'s pages (`len` bytes) that the page cache holds, from `cachestat` (Linux
/// 6.5): one call that walks the file's folios, where `mincore` looks up every 4 KiB page.
/// `None` where the kernel lacks it or a seccomp filter refuses it.
fn cached_share(f: &std::fs::File, len: u64) -> Option<f64> {
    use std::os::fd::AsRawFd;
    /// `cachestat`'s number, the same on every architecture (added after the tables merged).
    const SYS_CACHESTAT: libc::c_long = 451;
    static MISSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if MISSING.load(Relaxed) {
        return None;
    }
    if len == 0 {
        return Some(1.0);
    }
    // `struct cachestat_range` (offset, length; length 0: to the end of the file), and
    // `struct cachestat` (nr_cache first, then the dirty, writeback, evicted and recently
    // evicted pages).
    let range = [0u64; 2];
    let mut st = [0u64; 5];
    // SAFETY: cachestat reads one `struct cachestat_range` from `range` and writes one
    // `struct cachestat` into `st`, both live and laid out as the kernel's (u64 fields, no
    // padding); the descriptor is open for the call's duration; flags must be 0.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            range.as_ptr(),
            st.as_mut_ptr(),
            0 as libc::c_uint,
        )
    };
    if r != 0 {
        MISSING.store(true, Relaxed);
        return None;
    }
    let pages = len.div_ceil(rustix::param::page_size() as u64);
    Some((st[0] as f64 / pages as f64).min(1.0))
}

/// The share of `map`'s pages that the page cache holds (`mincore`); 0 if it cannot tell.
fn mapped_share(map: &memmap2::Mmap) -> f64 {
    let page = rustix::param::page_size();
    let pages = map.len().div_ceil(page);
    if pages == 0 {
        return 1.0;
    }
    let mut resident = vec![0u8; pages];
    // SAFETY: `map` is a live read-only mapping of `map.len()` bytes starting at a page-aligned
    // address (mmap returns one); mincore only inspects that range and writes one byte per
    // page of it into `resident`, which holds ceil(map.len() / page size) bytes.
    let r = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            resident.as_mut_ptr(),
        )
    };
    if r != 0 {
        return 0.0;
    }
    resident.iter().filter(|&&b| b & 1 == 1).count() as f64 / pages as f64
}

/// Memory this process can expect to use: the node's `MemTotal`, or the memory cgroup's limit
/// (v1 `memory.limit_in_bytes` or v2 `memory.max`, the lowest along the cgroup's path) when
/// lower. Page cache is charged to the cgroup, so a dataset larger than the limit does not
/// stay resident however large the node is.
pub fn effective_memory() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(u64::MAX);
    total.min(cgroup_memory_limit().unwrap_or(u64::MAX))
}

/// The lowest memory limit on this process's cgroup path (v1 or v2), if any.
fn cgroup_memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut limits = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let places: &[(&str, &str)] = if controllers.split(',').any(|c| c == "memory") {
            &[("/sys/fs/cgroup/memory", "memory.limit_in_bytes")]
        } else if controllers.is_empty() {
            &[
                ("/sys/fs/cgroup", "memory.max"),
                ("/sys/fs/cgroup/unified", "memory.max"),
            ]
        } else {
            continue;
        };
        for (root, file) in places {
            // The cgroup's directory and its parents up to the hierarchy's root.
            let dir = PathBuf::from(format!("{root}{path}"));
            for d in dir.ancestors().take_while(|d| d.starts_with(root)) {
                let limit = std::fs::read_to_string(d.join(file)).ok();
                limits.extend(limit.and_then(|s| s.trim().parse::<u64>().ok()));
            }
        }
    }
    limits.into_iter().min()
}

/// Tells the kernel how `file` will be read (advice only: a kernel that ignores it reads the
/// file with its default readahead).
pub fn advise(file: &std::fs::File, pattern: ReadPattern) {
    let advice = match pattern {
        ReadPattern::Default => return,
        ReadPattern::Sequential => rustix::fs::Advice::Sequential,
        ReadPattern::Random => rustix::fs::Advice::Random,
    };
    let _ = rustix::fs::fadvise(file, 0, None, advice);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!(IoMode::parse("auto"), Ok(IoMode::Auto));
        assert_eq!(IoMode::parse("direct"), Ok(IoMode::Direct));
        assert_eq!(IoMode::parse("buffered"), Ok(IoMode::Buffered));
        assert!(IoMode::parse("mmap").is_err());
    }

    /// An opener for a dataset of `dataset_bytes` (identified by `seed`) with
    /// `page_cache_bytes` of page cache for it.
    fn opener(dataset_bytes: u64, page_cache_bytes: u64, seed: u64) -> Opener {
        Opener::for_access(&Access {
            dataset_bytes,
            page_cache_bytes: Some(page_cache_bytes),
            seed,
            ..Access::plain(IoMode::Auto)
        })
    }

    #[test]
    fn the_kept_share_follows_the_budget() {
        let all = opener(100, 100, 7);
        assert!((0..1000).all(|c| all.keeps(c)));
        let none = opener(100, 0, 7);
        assert!((0..1000).all(|c| !none.keeps(c)));
        let quarter = opener(400, 100, 7);
        let kept = (0..10_000).filter(|&c| quarter.keeps(c)).count();
        assert!((2300..2700).contains(&kept), "{kept}");
        // Every process of a job keeps the same chunks.
        let again = opener(400, 100, 7);
        assert!((0..1000).all(|c| quarter.keeps(c) == again.keeps(c)));
    }

    #[test]
    fn a_file_just_written_is_resident_and_memory_is_known() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![1u8; 1 << 20]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        assert_eq!(resident_share(&f, 1 << 20), 1.0);
        assert!(effective_memory() > 64 << 20);
        // cachestat (where the kernel has it) agrees, and sees a file pushed out of memory.
        if let Some(share) = cached_share(&f, f.metadata().unwrap().len()) {
            assert_eq!(share, 1.0);
            f.sync_all().unwrap();
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
            let after =
                cached_share(&f, f.metadata().unwrap().len()).expect("cachestat worked once");
            assert!(after < 1.0, "{after}");
            assert!((after - resident_share(&f, 1 << 20)).abs() < 0.01);
        }
    }

    #[test]
    fn a_kept_chunk_is_mapped_once_and_its_map_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("chunk");
        std::fs::write(&p, vec![3u8; 3 << 20]).unwrap();
        let keeps = Opener::for_access(&Access {
            dataset_bytes: 3 << 20,
            page_cache_bytes: Some(64 << 20),
            ..Access::plain(IoMode::Auto)
        });
        let a = keeps.open(&p, Some(0)).unwrap();
        let b = keeps.open(&p, Some(0)).unwrap();
        let (ma, mb) = (
            a.map.clone().expect("resident"),
            b.map.clone().expect("resident"),
        );
        assert!(Arc::ptr_eq(&ma, &mb), "the second open finds the first map");
        // Rewritten: another file, another map.
        drop((a, b));
        std::fs::write(&p, vec![4u8; 2 << 20]).unwrap();
        let c = keeps.open(&p, Some(0)).unwrap();
        let mc = c.map.clone().expect("resident");
        assert!(!Arc::ptr_eq(&ma, &mc) && mc.len() == 2 << 20 && mc[0] == 4);
        // A budget of nothing keeps nothing.
        let none = Opener::for_access(&Access {
            dataset_bytes: 3 << 20,
            page_cache_bytes: Some(0),
            ..Access::plain(IoMode::Auto)
        });
        let q = dir.path().join("other");
        std::fs::write(&q, vec![5u8; 1 << 20]).unwrap();
        let x = none.open(&q, Some(0)).unwrap().map.expect("resident");
        let y = none.open(&q, Some(0)).unwrap().map.expect("resident");
        assert!(!Arc::ptr_eq(&x, &y));
    }
}
