//! The file system itself, independent of FUSE: attributes, lookups, listings, opens and
//! reads as plain methods returning errno values, so that tests call them without a mount.
//! The `fuse` module only translates requests and replies.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use fuser::{FileAttr, FileType, INodeNo};
use granary::{Dataset, FileStat, ReadError};
use serde::Serialize;

use crate::tiered::{ReadStats, TieredReader};
use crate::tree::{Node, Tree, ROOT_INO};

/// Result of a file-system method: an errno value on failure.
pub type FsResult<T> = Result<T, i32>;

/// Block size reported in `st_blksize` (buffered readers size their reads by it).
const BLKSIZE: u32 = 128 << 10;

/// Extended attributes of the root directory (not listed, so copies do not carry them).
pub const XATTR_STATS: &str = "user.granary.stats";
pub const XATTR_PID: &str = "user.granary.pid";
pub const XATTR_DATASET: &str = "user.granary.dataset";

/// An open file: its sample, loaded whole (and CRC-checked) on the first read.
struct Handle {
    file: u64,
    /// The sample's bytes once read, or the error its read ended with: the kernel asks again
    /// after a failed read (readahead, then the read itself), and a store that did not answer
    /// must cost one bounded wait per open, not one per retry. Reopening the file tries again.
    data: OnceLock<FsResult<Arc<Vec<u8>>>>,
}

/// The mounted dataset.
pub struct MountFs {
    tree: Tree,
    reader: TieredReader,
    mtime: SystemTime,
    uid: u32,
    gid: u32,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    opens: AtomicU64,
    started: std::time::Instant,
    /// The bytes `statfs` reports: the chunk files', or a view's samples' (summed once).
    used_bytes: OnceLock<u64>,
}

/// `user.granary.stats`: what the mount did so far.
#[derive(Serialize)]
struct Stats {
    dataset: String,
    samples: u64,
    /// Directories looked up or listed so far (the tree is made as it is visited).
    directories_known: usize,
    /// GETs and bytes of the snapshot fetched so far (a snapshot read in blocks).
    snapshot_gets: Option<u64>,
    snapshot_bytes: Option<u64>,
    tier: Option<String>,
    opens: u64,
    open_files: usize,
    uptime_s: f64,
    #[serde(flatten)]
    reads: ReadStats,
    /// What passed through each layer of the mount's store stack (tier, origin), with the
    /// seconds reads waited there.
    layers: Vec<granary::LayerReading>,
}

impl MountFs {
    /// The file system of the dataset `reader` reads: its directory tree, materialised as it is
    /// visited (nothing per sample is read now), and fixes every timestamp to the snapshot file's mtime. Files and
    /// directories belong to `uid`/`gid`.
    pub fn new(reader: TieredReader, uid: u32, gid: u32) -> Result<MountFs, ReadError> {
        let ds = reader.dataset().clone();
        let tree = Tree::build(&ds)?;
        let mtime = std::fs::metadata(ds.snapshot_path())
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(MountFs {
            tree,
            reader,
            mtime,
            uid,
            gid,
            handles: Mutex::default(),
            next_fh: AtomicU64::new(1),
            opens: AtomicU64::new(0),
            started: std::time::Instant::now(),
            used_bytes: OnceLock::new(),
        })
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        self.reader.dataset()
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn reader(&self) -> &TieredReader {
        &self.reader
    }

    /// Logs a failure of the dataset (damage, unreadable storage) and turns it into `EIO`.
    fn eio(&self, what: &str, e: &ReadError) -> i32 {
        log::warn!("mount: {what}: {e}");
        libc::EIO
    }

    fn node(&self, ino: u64) -> FsResult<Node> {
        let n = self.tree.node(ino).ok_or(libc::ENOENT)?;
        if let Node::File(file) = n {
            // A sample a view leaves out, or one deleted, has no file here.
            let ds = self.dataset();
            let id = match ds.has_fields() {
                false => Some(file),
                true => ds.snapshot().field_owner(file).ok().map(|(id, _)| id),
            };
            if !id.is_some_and(|id| ds.selects(id)) {
                return Err(libc::ENOENT);
            }
        }
        Ok(n)
    }

    fn dir(&self, ino: u64) -> FsResult<u32> {
        match self.node(ino)? {
            Node::Dir(d) => Ok(d),
            Node::File(_) => Err(libc::ENOTDIR),
        }
    }

    /// Attributes of `node`, given a file's stat when the caller has it at hand already (a
    /// listing page's entry: then nothing is read).
    ///
    /// Modes and mtimes are the packed files' and directories' where the dataset records them
    /// (feature ATTRS); otherwise 0444 files, 0555 directories and the snapshot's mtime.
    fn attr(&self, node: Node, known: Option<FileStat>) -> FsResult<FileAttr> {
        let (kind, size, recorded) = match (node, known) {
            (Node::Dir(d), _) => (FileType::Directory, 4096, self.tree.dir_attrs(d)),
            (Node::File(_), Some(st)) => (FileType::RegularFile, st.size, st.attrs),
            (Node::File(file), None) => {
                let (_, st, field) = self
                    .file(file)
                    .map_err(|e| self.eio("reading the namespace", &e))?;
                let size = field.map_or(st.size, |f| f.end - f.start);
                (FileType::RegularFile, size, st.attrs)
            }
        };
        let (perm, mtime) = match recorded {
            Some(a) => (a.mode as u16, a.modified()),
            None if kind == FileType::Directory => (0o555, self.mtime),
            None => (0o444, self.mtime),
        };
        Ok(FileAttr {
            ino: INodeNo(self.tree.ino(node)),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            // A directory's link count is 1, "not counted" (as btrfs and many network file
            // systems report; `find` then reads the directory instead of trusting it):
            // counting subdirectories would mean listing every directory a lookup passes.
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: BLKSIZE,
        })
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&self, ino: u64) -> FsResult<FileAttr> {
        self.attr(self.node(ino)?, None)
    }

    /// The sample file `file` is, its stat and, with fields, the range of the sample's bytes
    /// that is the file's field.
    fn file(&self, file: u64) -> Result<(u64, FileStat, Option<Range<u64>>), ReadError> {
        let ds = self.dataset();
        if !ds.has_fields() {
            return Ok((file, ds.stat(file)?, None));
        }
        let owner = ds.snapshot().field_owner(file);
        let (id, k) = owner.map_err(|e| ReadError::invalid(e.to_string()))?;
        // Saturating: a damaged field table must give EIO, not overflow.
        let range = match ds.fields(id)?.get(k) {
            Some(f) => f.offset..f.offset.saturating_add(f.len),
            None => return Err(ReadError::invalid(format!("sample {id} has no field {k}"))),
        };
        Ok((id, ds.stat(id)?, Some(range)))
    }

    /// The entry `name` of directory `parent` (one namespace page, or a directory already
    /// known).
    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<FileAttr> {
        let d = self.dir(parent)?;
        let (node, stat) = match name {
            b"." => (Node::Dir(d), None),
            b".." => (Node::Dir(self.tree.parent(d)), None),
            _ => self
                .tree
                .lookup(self.dataset(), d, name)
                .map_err(|e| self.eio("looking up a path", &e))?
                .ok_or(libc::ENOENT)?,
        };
        self.attr(node, stat)
    }

    /// Checks that `ino` is a directory that can be listed.
    pub fn opendir(&self, ino: u64) -> FsResult<()> {
        self.dir(ino).map(|_| ())
    }

    /// Lists directory `ino` from position `offset` (0 and 1 are `.` and `..`): calls `add`
    /// with each entry's attributes, name and the offset that follows it until `add` returns
    /// true (the reply is full) or the listing ends.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(&FileAttr, &[u8], u64) -> bool,
    ) -> FsResult<()> {
        let d = self.dir(ino)?;
        let ds = self.dataset();
        let eio = |e: ReadError| self.eio("listing a directory", &e);
        let total = self.tree.entry_count(ds, d).map_err(eio)? + 2;
        if offset <= 2 && offset < total {
            // A listing's files' attributes, fetched together rather than one by one.
            self.tree.prefetch_file_attrs(ds, d).map_err(eio)?;
        }
        for pos in offset..total {
            let (node, name, stat) = match pos {
                0 => (Node::Dir(d), b".".to_vec(), None),
                1 => (Node::Dir(self.tree.parent(d)), b"..".to_vec(), None),
                _ => {
                    let e = self.tree.entry(ds, d, pos - 2).map_err(eio)?;
                    let e = e.ok_or(libc::EIO)?;
                    (e.node, e.name, e.stat)
                }
            };
            if add(&self.attr(node, stat)?, &name, pos + 1) {
                break;
            }
        }
        Ok(())
    }

    /// Opens file `ino` for reading; returns the handle. Directories are `EISDIR`, opening
    /// for writing is `EROFS`.
    pub fn open(&self, ino: u64, write: bool) -> FsResult<u64> {
        let file = match self.node(ino)? {
            Node::Dir(_) => return Err(libc::EISDIR),
            Node::File(file) => file,
        };
        if write {
            return Err(libc::EROFS);
        }
        let fh = self.next_fh.fetch_add(1, Relaxed);
        let h = Arc::new(Handle {
            file,
            data: OnceLock::new(),
        });
        self.handles.lock().expect("handles").insert(fh, h);
        self.opens.fetch_add(1, Relaxed);
        Ok(fh)
    }

    /// Up to `size` bytes at `offset` of open file `fh`: the sample's bytes and the range of
    /// them to reply with. The whole sample is read and CRC-checked on the first read of a
    /// handle; a damaged record is `EIO`, never wrong bytes.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<(Arc<Vec<u8>>, Range<usize>)> {
        let h = self
            .handles
            .lock()
            .expect("handles")
            .get(&fh)
            .cloned()
            .ok_or(libc::EBADF)?;
        let data = h.data.get_or_init(|| {
            let d = self.load(h.file).map(Arc::new);
            d.map_err(|(what, e)| self.eio(&what, &e))
        });
        let data = data.clone()?;
        let start = (offset.min(data.len() as u64)) as usize;
        let end = start.saturating_add(size as usize).min(data.len());
        Ok((data, start..end))
    }

    /// The bytes of file `file`: its whole sample read and checked; a field is its slice. On
    /// failure, the error with what was being read (the sample's path once it is known).
    fn load(&self, file: u64) -> Result<Vec<u8>, (String, ReadError)> {
        let ds = self.dataset();
        let (id, st, field) = self
            .file(file)
            .map_err(|e| ("reading the namespace".to_string(), e))?;
        let path = ds
            .path(id)
            .map(|p| granary::escape_path(&p))
            .unwrap_or_default();
        let at = |e| (format!("reading {path:?}"), e);
        let data = self.reader.read(id).map_err(at)?;
        let out = match field {
            // The size `stat` showed (the namespace's) is what a read hands out, or an error:
            // never another number of bytes.
            None if data.len() as u64 != st.size => Err(format!(
                "sample {id}: its record holds {} bytes, its namespace entry says {}",
                data.len(),
                st.size
            )),
            None => Ok(data),
            Some(f) => data
                .get(f.start as usize..f.end as usize)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| format!("sample {id}: its bytes do not hold its field {f:?}")),
        };
        out.map_err(|e| at(ReadError::invalid(e)))
    }

    /// Closes open file `fh`.
    pub fn release(&self, fh: u64) {
        self.handles.lock().expect("handles").remove(&fh);
    }

    /// Extended attribute `name` of `ino`: the root has the mount's statistics (JSON), the
    /// process id serving the mount, and the dataset's path. `ENODATA` otherwise.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        self.node(ino)?;
        if ino != ROOT_INO {
            return Err(libc::ENODATA);
        }
        match name {
            n if n == XATTR_STATS.as_bytes() => Ok(self.stats_json().into_bytes()),
            n if n == XATTR_PID.as_bytes() => Ok(std::process::id().to_string().into_bytes()),
            n if n == XATTR_DATASET.as_bytes() => Ok(self.dataset().location().into_bytes()),
            _ => Err(libc::ENODATA),
        }
    }

    /// The statistics as JSON.
    pub fn stats_json(&self) -> String {
        let ds = self.dataset();
        let s = Stats {
            dataset: ds.location(),
            samples: ds.selected_len(),
            directories_known: self.tree.dir_count(),
            snapshot_gets: ds.snapshot_fetched().map(|f| f.reads),
            snapshot_bytes: ds.snapshot_fetched().map(|f| f.bytes),
            tier: self.reader.tier_dir().map(|p| p.display().to_string()),
            opens: self.opens.load(Relaxed),
            open_files: self.handles.lock().expect("handles").len(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            reads: self.reader.stats(),
            layers: self.reader.layers(),
        };
        serde_json::to_string(&s).expect("stats serialise")
    }

    /// (total bytes, files) for `statfs`: a view's are its samples'.
    pub fn totals(&self) -> (u64, u64) {
        let ds = self.dataset();
        let bytes = *self.used_bytes.get_or_init(|| match ds.selection() {
            None => ds.total_chunk_bytes().unwrap_or(0),
            Some(ids) => ids
                .iter()
                .filter_map(|&id| ds.sample(id).ok())
                .map(|s| s.entry.stored_len)
                .sum(),
        });
        let files = ds.selected_len();
        (bytes, files + self.tree.dir_count() as u64)
    }
}
