//! Maps of resident chunk files kept from one window to the next, and one epoch to the next.
//!
//! A warm epoch reads chunk files the page cache holds through maps of them. Made and dropped
//! for every window, a map costs filling its page tables (`MADV_POPULATE_READ`) and clearing
//! them (`munmap`). A kept map costs no memory of its own (its pages are the page cache's)
//! beyond its page tables, but it counts in the process's RSS (as file pages, `RssFile`) and
//! its pages are reclaimed after unmapped ones.
//!
//! The cache is per process, keyed by the file's device, inode, size and times (a file
//! replaced or rewritten is not the one mapped), and bounded: at most [`MAX_MAPS`] maps and
//! the bytes the opener may keep resident (its page-cache budget), the oldest dropped first.
//! A map is only ever handed out again after the file was opened by path and found wholly
//! resident; one whose file was cut short under it is dropped. A map of a file since removed
//! keeps its blocks allocated until dropped: each insertion checks the oldest entry's path
//! still names the file it mapped, and drops it if not.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::guard::Mapped;

/// Maps kept at most (the SIGBUS guard has 8,192 slots; the rest stay for maps in use).
pub const MAX_MAPS: usize = 4096;

/// Which file a map (or a tier's view of its `index`) shows: a file with another inode, size
/// or times is another file.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) struct FileKey {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    pub(crate) fn of(md: &std::fs::Metadata) -> FileKey {
        FileKey {
            dev: md.dev(),
            ino: md.ino(),
            len: md.len(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }
}

#[derive(Default)]
struct Inner {
    maps: HashMap<FileKey, (Arc<Mapped>, PathBuf)>,
    /// Insertion order, oldest first.
    order: VecDeque<FileKey>,
    bytes: u64,
}

/// Kept maps (the process's: [`MapCache::global`]).
#[derive(Default)]
pub struct MapCache {
    inner: Mutex<Inner>,
}

impl MapCache {
    /// The process's.
    pub fn global() -> &'static MapCache {
        static CACHE: OnceLock<MapCache> = OnceLock::new();
        CACHE.get_or_init(Default::default)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A map table: a panic elsewhere leaves it consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kept map of the file whose metadata is `md`, unless it was cut short under it.
    pub fn get(&self, md: &std::fs::Metadata) -> Option<Arc<Mapped>> {
        let key = FileKey::of(md);
        let mut c = self.lock();
        let map = c.maps.get(&key)?.0.clone();
        if map.is_cut() {
            c.remove(&key);
            return None;
        }
        Some(map)
    }

    /// Keeps `map` of `path` (metadata `md`) within `budget` bytes of kept maps.
    pub fn put(&self, md: &std::fs::Metadata, path: &Path, map: Arc<Mapped>, budget: u64) {
        let key = FileKey::of(md);
        let len = map.len() as u64;
        if len > budget {
            return;
        }
        let mut c = self.lock();
        if c.maps.contains_key(&key) {
            return;
        }
        // The oldest entry's file removed or replaced: its blocks are free once its map goes.
        if let Some(old) = c.order.front().copied() {
            let gone = c.maps.get(&old).is_some_and(|(_, p)| {
                std::fs::metadata(p).map_or(true, |m| FileKey::of(&m) != old)
            });
            if gone {
                c.remove(&old);
            }
        }
        while c.bytes + len > budget || c.maps.len() >= MAX_MAPS {
            let Some(old) = c.order.front().copied() else {
                break;
            };
            c.remove(&old);
        }
        c.bytes += len;
        c.order.push_back(key);
        c.maps.insert(key, (map, path.to_path_buf()));
    }

    /// Maps kept now and their bytes.
    pub fn kept(&self) -> (usize, u64) {
        let c = self.lock();
        (c.maps.len(), c.bytes)
    }
}

impl Inner {
    fn remove(&mut self, key: &FileKey) {
        if let Some((m, _)) = self.maps.remove(key) {
            self.bytes -= m.len() as u64;
            self.order.retain(|k| k != key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, len: usize) -> (PathBuf, std::fs::File) {
        let p = dir.join(name);
        std::fs::write(&p, vec![7u8; len]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        (p, f)
    }

    fn map(p: &Path, f: &std::fs::File) -> Arc<Mapped> {
        Arc::new(crate::file::map_file(f, p).unwrap())
    }

    #[test]
    fn kept_maps_are_found_by_file_bounded_and_dropped_when_their_file_changes() {
        let c = MapCache::default();
        let tmp = tempfile::tempdir().unwrap();
        let (pa, fa) = file(tmp.path(), "a", 8192);
        let (pb, fb) = file(tmp.path(), "b", 8192);
        let ma = fa.metadata().unwrap();
        c.put(&ma, &pa, map(&pa, &fa), 1 << 20);
        assert!(c.get(&ma).is_some(), "the same file finds its map");
        assert!(
            c.get(&fb.metadata().unwrap()).is_none(),
            "another file does not"
        );
        // Rewritten in place (new size): another file.
        std::fs::write(&pa, vec![1u8; 4096]).unwrap();
        let ma2 = std::fs::metadata(&pa).unwrap();
        assert!(
            c.get(&ma2).is_none(),
            "a rewritten file is not the one mapped"
        );
        // Over the budget, the oldest goes; and a removed file's map goes at the next insertion.
        let mb = fb.metadata().unwrap();
        c.put(&mb, &pb, map(&pb, &fb), 8192);
        assert!(
            c.get(&ma).is_none() && c.get(&mb).is_some(),
            "budget of one map: the oldest went"
        );
        std::fs::remove_file(&pb).unwrap();
        let (pc, fc) = file(tmp.path(), "c", 4096);
        let mc = fc.metadata().unwrap();
        c.put(&mc, &pc, map(&pc, &fc), 1 << 20);
        assert!(c.get(&mb).is_none(), "the removed file's map was dropped");
        assert!(c.get(&mc).is_some());
        // Larger than the budget: not kept.
        let (pd, fd) = file(tmp.path(), "d", 16384);
        let md = fd.metadata().unwrap();
        c.put(&md, &pd, map(&pd, &fd), 8192);
        assert!(c.get(&md).is_none());
        assert_eq!(c.kept(), (1, 4096));
    }
}
