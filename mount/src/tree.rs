//! The directory tree of a dataset, materialised lazily: a directory becomes known when it
//! is looked up or listed in its parent, and its listing is worked out when first asked for.
//!
//! Mounting reads nothing per sample, so it costs the same at a thousand samples as at a
//! billion; memory grows with the directories visited, not with the dataset. Files need no
//! per-file memory: a file is its sample (inode = sample id + 2), found by name through the
//! snapshot's path hash index, and listed through the path order. Every path with a given
//! prefix is contiguous in the path order, so a directory's entries are a few runs: its
//! subdirectories, and runs of positions in the path order holding its direct files. Listing
//! a directory reads its direct files' paths and, for each subdirectory, where its subtree
//! ends; looking a directory up is one search of the path order. With path pages (format 1.5)
//! a search is the page index (read once) and one page, and a directory's paths are
//! consecutive pages; older snapshots are searched by bisection through the paths by id.
//!
//! In a dataset whose samples have named fields (format 1.3) the files are the fields, shown
//! as `KEY.FIELD` (inode = the field's index among all field entries + 2); a run of samples
//! then keeps each sample's first entry number (8 bytes a sample), so that listing stays a
//! binary search.
//!
//! Paths that cannot form a tree (absolute or empty components, `.`/`..`, a name that is both
//! a file and a directory, a path order out of order) are found when the directory holding
//! them is listed or looked up, and that operation fails naming the path (`EIO` through the
//! mount); `granary verify` checks the whole path order.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use granary::{Dataset, FileStat, PathEntry, ReadError};

/// Inode of the root directory (FUSE's fixed root).
pub const ROOT_INO: u64 = 1;

/// Longest name a directory entry may have (Linux `NAME_MAX`).
const NAME_MAX: usize = 255;

/// Paths fetched together ahead of a listing's walk through a run of direct files: the first
/// batch, and the most the batch grows to while the run goes on.
const READAHEAD: (u64, u64) = (64, 1 << 16);

/// Paths read together when a directory's entries are read in order (readdir).
const ENTRY_BATCH: u64 = 4096;

/// Positions of the path order read last, with their sample ids, paths and (listing pages)
/// stats (a listing and the readdir after it read them in order).
#[derive(Debug, Default)]
struct Ahead {
    at: std::ops::Range<u64>,
    entries: Vec<PathEntry>,
}

/// One entry of a directory's listing, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Run {
    /// A subdirectory (index into the tree's directories).
    Dir(u32),
    /// Direct files at positions `start..end` of the snapshot's path order; with fields,
    /// `firsts[i]` is the entry number (within the run) of position `start + i`'s first field.
    Files {
        start: u64,
        end: u64,
        firsts: Vec<u64>,
    },
}

/// A directory's entries, worked out on first use.
#[derive(Debug, Default)]
struct Listing {
    runs: Vec<Run>,
    /// `starts[k]`: listing position of the first entry of `runs[k]`.
    starts: Vec<u64>,
    entries: u64,
}

#[derive(Debug)]
struct Dir {
    /// Full path, without a trailing slash (empty for the root).
    path: Box<[u8]>,
    parent: u32,
    /// Mode and mtime as packed (datasets of format 1.2).
    attrs: Option<granary::FileAttrs>,
    listing: OnceLock<Listing>,
}

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// A directory (index 0 is the root).
    Dir(u32),
    /// A file: the sample id (with fields: the field's index among all field entries).
    File(u64),
}

/// One directory entry as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub node: Node,
    pub name: Cow<'a, [u8]>,
    /// A file's size, mode and mtime when the listing had them at hand (listing pages, format
    /// 1.6, in a dataset without fields).
    pub stat: Option<FileStat>,
}

/// The directories known so far.
#[derive(Debug, Default)]
struct Known {
    dirs: Vec<Arc<Dir>>,
    by_path: HashMap<Box<[u8]>, u32>,
}

/// The tree: directories materialised as they are visited, files resolved through the
/// snapshot. Shared by the mount's threads.
#[derive(Debug)]
pub struct Tree {
    known: RwLock<Known>,
    /// The directories the dataset records (empty ones too), as `D/`, sorted.
    recorded: Vec<(Box<[u8]>, granary::FileAttrs)>,
    /// Number of files: samples, or field entries when the samples have fields.
    samples: u64,
    fields: bool,
    ahead: Mutex<Ahead>,
}

fn bad(detail: String) -> ReadError {
    ReadError::invalid(format!("cannot mount this dataset: {detail}"))
}

/// Checks that `path` can be a path in a file system tree: relative, no empty, `.` or `..`
/// components, no NUL byte, every name at most 255 bytes.
fn check_path(path: &[u8]) -> Result<(), String> {
    if path.is_empty() {
        return Err("an empty path".into());
    }
    if path.contains(&0) {
        return Err("a path with a NUL byte".into());
    }
    for name in path.split(|&b| b == b'/') {
        match name {
            b"" => {
                return Err("a path with an empty component (or a leading or trailing /)".into())
            }
            b"." | b".." => return Err("a path with a . or .. component".into()),
            n if n.len() > NAME_MAX => return Err(format!("a name of {} bytes", n.len())),
            _ => {}
        }
    }
    Ok(())
}

/// [`check_path`] as the error of a mount.
fn checked(path: &[u8]) -> Result<(), ReadError> {
    check_path(path).map_err(|e| bad(format!("{e}: {:?}", granary::escape_path(path))))
}

/// Splits `path` at its last `/`: (directory, name).
fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// `dir/name` (`name` in the root).
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        p.extend_from_slice(dir);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

impl Tree {
    /// The tree of `ds`: only its root, and the directories the dataset records, are read
    /// now (O(recorded directories), nothing per sample).
    pub fn build(ds: &Dataset) -> Result<Tree, ReadError> {
        let fields = ds.has_fields();
        let files = match fields {
            true => ds.snapshot().field_entry_count(),
            false => ds.len(),
        };
        if files >= u64::MAX - ROOT_INO - 2 - u32::MAX as u64 {
            return Err(bad(format!("{files} files are too many for inode numbers")));
        }
        let mut recorded: Vec<(Box<[u8]>, granary::FileAttrs)> = ds
            .dirs()?
            .into_iter()
            .map(|(mut d, a)| {
                d.push(b'/');
                (d.into_boxed_slice(), a)
            })
            .collect();
        recorded.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let root = Arc::new(Dir {
            path: Box::default(),
            parent: 0,
            attrs: None,
            listing: OnceLock::new(),
        });
        Ok(Tree {
            known: RwLock::new(Known {
                dirs: vec![root],
                by_path: HashMap::from([(Box::default(), 0)]),
            }),
            recorded,
            samples: files,
            fields,
            ahead: Mutex::default(),
        })
    }

    /// The sample id, path and (listing pages) stat at position `pos` of the path order:
    /// from the positions read last, or read now with the `batch - 1` after it (up to `end`).
    fn sorted(&self, ds: &Dataset, pos: u64, batch: u64, end: u64) -> Result<PathEntry, ReadError> {
        let mut a = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        if !a.at.contains(&pos) {
            let entries =
                ds.sorted_paths(pos..pos.saturating_add(batch.max(1)).min(end).max(pos + 1))?;
            *a = Ahead {
                at: pos..pos + entries.len() as u64,
                entries,
            };
        }
        a.entries
            .get(pos.wrapping_sub(a.at.start) as usize)
            .cloned()
            .ok_or_else(|| bad(format!("position {pos} of the path order is out of range")))
    }

    fn known(&self) -> std::sync::RwLockReadGuard<'_, Known> {
        self.known.read().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, dir: u32) -> Arc<Dir> {
        self.known().dirs[dir as usize].clone()
    }

    /// Recorded directories whose key starts with `prefix`, as a range of `recorded`.
    fn recorded_under(&self, prefix: &[u8]) -> std::ops::Range<usize> {
        let r = &self.recorded;
        let a = r.partition_point(|(k, _)| &k[..] < prefix);
        a..a + r[a..].partition_point(|(k, _)| k.starts_with(prefix))
    }

    /// The directory `path` (child of `parent`), made known if the dataset has it: a recorded
    /// directory, or a path under `path/`. Refuses a name that is both a file and a directory.
    fn child_dir(&self, ds: &Dataset, parent: u32, path: &[u8]) -> Result<Option<u32>, ReadError> {
        if let Some(&d) = self.known().by_path.get(path) {
            return Ok(Some(d));
        }
        let mut key = path.to_vec();
        key.push(b'/');
        let exists = !self.recorded_under(&key).is_empty() || {
            let at = ds.lower_bound(&key)?;
            at < ds.len() && self.sorted(ds, at, 1, ds.len())?.path.starts_with(&key)
        };
        if !exists {
            return Ok(None);
        }
        self.add_dir(ds, parent, path).map(Some)
    }

    /// Makes directory `path` known (once), child of `parent`.
    fn add_dir(&self, ds: &Dataset, parent: u32, path: &[u8]) -> Result<u32, ReadError> {
        if let Some(&d) = self.known().by_path.get(path) {
            return Ok(d);
        }
        checked(path)?;
        let file = match self.fields {
            true => ds.lookup_field(path)?.is_some(),
            false => ds.lookup(path)?.is_some(),
        };
        if file {
            return Err(bad(format!(
                "{:?} is both a file and a directory",
                granary::escape_path(path)
            )));
        }
        let mut key = path.to_vec();
        key.push(b'/');
        let attrs = self
            .recorded
            .binary_search_by(|(k, _)| k[..].cmp(&key))
            .ok()
            .map(|i| self.recorded[i].1);
        let mut k = self.known.write().unwrap_or_else(|p| p.into_inner());
        if let Some(&d) = k.by_path.get(path) {
            return Ok(d);
        }
        let idx =
            u32::try_from(k.dirs.len()).map_err(|_| bad("more than 2^32 directories".into()))?;
        k.dirs.push(Arc::new(Dir {
            path: path.into(),
            parent,
            attrs,
            listing: OnceLock::new(),
        }));
        k.by_path.insert(path.into(), idx);
        Ok(idx)
    }

    /// Directory `dir` with its listing worked out.
    fn listed(&self, ds: &Dataset, dir: u32) -> Result<Arc<Dir>, ReadError> {
        let d = self.get(dir);
        if d.listing.get().is_none() {
            let l = self.list(ds, dir, &d.path)?;
            let _ = d.listing.set(l); // another thread may have listed it meanwhile: the same
        }
        Ok(d)
    }

    /// Works out the listing of directory `dir` (`path`): one walk through its positions in
    /// the path order, merged with the directories the dataset records under it, skipping
    /// each subdirectory's subtree by galloping past it.
    fn list(&self, ds: &Dataset, dir: u32, path: &[u8]) -> Result<Listing, ReadError> {
        let prefix: Vec<u8> = match dir {
            0 => Vec::new(),
            _ => [path, b"/"].concat(),
        };
        let range = match dir {
            0 => 0..ds.len(),
            _ => ds.prefix_range(&prefix)?,
        };
        let rec = self.recorded_under(&prefix);
        let (mut pos, mut ri) = (range.start, rec.start);
        let mut l = Listing::default();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut prev: Option<Vec<u8>> = None;
        // A listing that would touch most blocks of the paths anyway fetches them whole, in
        // large GETs, rather than a few at a time (snapshots without path pages).
        ds.prefetch_for_listing(range.clone())?;
        let (mut fetched_to, mut batch, mut in_files) = (pos, READAHEAD.0, false);
        loop {
            // Read ahead only through a run of direct files (a subdirectory needs one path),
            // in batches that grow while the run goes on.
            if pos >= fetched_to || !in_files {
                fetched_to = pos + if in_files { batch } else { 1 };
                if in_files {
                    batch = (batch * 2).min(READAHEAD.1);
                }
            }
            let file = match pos < range.end {
                true => Some(self.sorted(ds, pos, fetched_to - pos, range.end)?.path),
                false => None,
            };
            let rec_key = (ri < rec.end).then(|| &self.recorded[ri].0[..]);
            let (key, is_file) = match (file.as_deref(), rec_key) {
                (None, None) => break,
                (Some(f), Some(r)) if r <= f => (r, false),
                (Some(f), _) => (f, true),
                (None, Some(r)) => (r, false),
            };
            if is_file {
                checked(key)?;
                if prev.as_deref().is_some_and(|p| p >= key) || !key.starts_with(&prefix) {
                    return Err(bad(format!(
                        "the snapshot's path order is not sorted at {:?} (run `granary verify`)",
                        granary::escape_path(key)
                    )));
                }
                prev = Some(key.to_vec());
            }
            let rest = &key[prefix.len()..];
            if !is_file && rest.is_empty() {
                // The record of this directory itself (`D/`).
                ri += 1;
                continue;
            }
            match rest.iter().position(|&b| b == b'/') {
                Some(i) => {
                    let name = &rest[..i];
                    if !seen.insert(name.to_vec()) {
                        return Err(bad(format!(
                            "directory {:?} appears twice in the path order (run `granary verify`)",
                            granary::escape_path(&[&prefix[..], name].concat())
                        )));
                    }
                    let child = [&prefix[..], name].concat();
                    let sub = self.add_dir(ds, dir, &child)?;
                    l.starts.push(l.entries);
                    l.runs.push(Run::Dir(sub));
                    l.entries += 1;
                    let below = [&child[..], b"/"].concat();
                    pos = ds.prefix_end(&below, pos)?;
                    ri = rec.start + self.recorded_under_from(&below, rec.start..rec.end);
                    batch = READAHEAD.0;
                    in_files = false;
                }
                None => {
                    self.add_file(ds, &mut l, pos, rest)?;
                    pos += 1;
                    in_files = true;
                }
            }
        }
        Ok(l)
    }

    /// The offset within `range` of `recorded` of the first key past every key starting with
    /// `below` (and every key before it).
    fn recorded_under_from(&self, below: &[u8], range: std::ops::Range<usize>) -> usize {
        self.recorded[range].partition_point(|(k, _)| &k[..] < below || k.starts_with(below))
    }

    /// Adds the direct file at position `pos` (named `name`) to listing `l`.
    fn add_file(
        &self,
        ds: &Dataset,
        l: &mut Listing,
        pos: u64,
        name: &[u8],
    ) -> Result<(), ReadError> {
        let count = match self.fields {
            false => 1,
            true => {
                let id = ds.sorted_id(pos)?;
                let fs = ds.fields(id)?;
                if let Some(f) = fs.iter().find(|f| name.len() + 1 + f.name.len() > NAME_MAX) {
                    return Err(bad(format!(
                        "a name of {} bytes: {:?}.{}",
                        name.len() + 1 + f.name.len(),
                        granary::escape_path(ds.path(id)?),
                        String::from_utf8_lossy(f.name)
                    )));
                }
                fs.len() as u64
            }
        };
        match l.runs.last_mut() {
            Some(Run::Files { end, firsts, .. }) if *end == pos => {
                if self.fields {
                    firsts.push(l.entries - l.starts.last().copied().unwrap_or(0));
                }
                *end += 1;
            }
            _ => {
                l.starts.push(l.entries);
                l.runs.push(Run::Files {
                    start: pos,
                    end: pos + 1,
                    firsts: if self.fields { vec![0] } else { Vec::new() },
                });
            }
        }
        l.entries += count;
        Ok(())
    }

    /// Makes the sample entries (and attributes) of `dir`'s files present at once, before a
    /// listing that shows their attributes reads them one by one (readdirplus).
    /// Nothing for a snapshot held whole (no ids are gathered), or whose listing pages carry
    /// the files' stats (format 1.6, without fields).
    pub fn prefetch_file_attrs(&self, ds: &Dataset, dir: u32) -> Result<(), ReadError> {
        if !ds.snapshot().is_paged() || self.stats_in_listings(ds) {
            return Ok(());
        }
        let d = self.listed(ds, dir)?;
        let Some(l) = d.listing.get() else {
            return Ok(());
        };
        let mut ids = Vec::new();
        for r in &l.runs {
            if let Run::Files { start, end, .. } = r {
                for pos in *start..*end {
                    ids.push(ds.sorted_id(pos)?);
                }
            }
        }
        ds.prefetch_samples_at(&ids)
    }

    /// Number of directories known so far (looked up or listed), the root included.
    pub fn dir_count(&self) -> usize {
        self.known().dirs.len()
    }

    /// Inode number of `node`: a file's is its sample id + 2, a directory's follows the files
    /// (in the order the directories became known).
    pub fn ino(&self, node: Node) -> u64 {
        match node {
            Node::Dir(0) => ROOT_INO,
            Node::Dir(d) => self.samples + ROOT_INO + d as u64,
            Node::File(id) => id + ROOT_INO + 1,
        }
    }

    /// The node of inode `ino`, if there is one.
    pub fn node(&self, ino: u64) -> Option<Node> {
        if ino == ROOT_INO {
            return Some(Node::Dir(0));
        }
        let files_end = self.samples + ROOT_INO + 1;
        if (ROOT_INO + 1..files_end).contains(&ino) {
            return Some(Node::File(ino - ROOT_INO - 1));
        }
        let d = ino.checked_sub(self.samples + ROOT_INO)?;
        (d > 0 && d < self.dir_count() as u64).then_some(Node::Dir(d as u32))
    }

    /// Whether the listing pages carry the stats of the tree's files (format 1.6, files that
    /// are samples, not fields).
    fn stats_in_listings(&self, ds: &Dataset) -> bool {
        !self.fields && ds.listings_carry_stats()
    }

    /// The entry `name` of directory `dir`, with a file's stat when the file is a sample
    /// ([`Dataset::lookup_stat`]: read in blocks with listing pages, the page that holds the
    /// path; otherwise the tables by id, which the file's attributes need anyway).
    pub fn lookup(
        &self,
        ds: &Dataset,
        dir: u32,
        name: &[u8],
    ) -> Result<Option<(Node, Option<FileStat>)>, ReadError> {
        if name.is_empty() || name.contains(&b'/') || name.len() > NAME_MAX {
            return Ok(None);
        }
        let path = join(&self.get(dir).path, name);
        if let Some(&sub) = self.known().by_path.get(&path[..]) {
            return Ok(Some((Node::Dir(sub), None)));
        }
        let file = match self.fields {
            false => ds
                .lookup_stat(&path)?
                .map(|(id, stat)| (Node::File(id), Some(stat))),
            true => match ds.lookup_field(&path)? {
                None => None,
                Some((id, name)) => {
                    let k = ds.fields(id)?.iter().position(|f| f.name == name);
                    let first = ds
                        .snapshot()
                        .field_first(id)
                        .map_err(|e| ReadError::invalid(e.to_string()))?;
                    k.map(|k| (Node::File(first + k as u64), None))
                }
            },
        };
        match file {
            Some(f) => Ok(Some(f)),
            None => Ok(self
                .child_dir(ds, dir, &path)?
                .map(|d| (Node::Dir(d), None))),
        }
    }

    /// The sample a file is and, with fields, which of its fields.
    pub fn file_sample(&self, ds: &Dataset, file: u64) -> Result<(u64, Option<usize>), ReadError> {
        if !self.fields {
            return Ok((file, None));
        }
        let (id, k) = ds
            .snapshot()
            .field_owner(file)
            .map_err(|e| ReadError::invalid(e.to_string()))?;
        Ok((id, Some(k)))
    }

    /// Parent directory of `dir` (the root's is itself).
    pub fn parent(&self, dir: u32) -> u32 {
        self.get(dir).parent
    }

    /// Number of entries of `dir` (without `.` and `..`): lists it if it was not yet.
    pub fn entry_count(&self, ds: &Dataset, dir: u32) -> Result<u64, ReadError> {
        let d = self.listed(ds, dir)?;
        Ok(d.listing.get().map_or(0, |l| l.entries))
    }

    /// Mode and mtime of `dir` as packed, if the dataset records them.
    pub fn dir_attrs(&self, dir: u32) -> Option<granary::FileAttrs> {
        self.get(dir).attrs
    }

    /// Name of directory `dir` within its parent (empty for the root).
    pub fn dir_name(&self, dir: u32) -> Vec<u8> {
        split_last(&self.get(dir).path).1.to_vec()
    }

    /// Entry number `k` (0-based, without `.` and `..`) of directory `dir`, if it exists;
    /// lists `dir` if it was not yet.
    pub fn entry<'a>(
        &self,
        ds: &'a Dataset,
        dir: u32,
        k: u64,
    ) -> Result<Option<Entry<'a>>, ReadError>
    where
        Self: 'a,
    {
        let d = self.listed(ds, dir)?;
        let Some(l) = d.listing.get() else {
            return Ok(None);
        };
        if k >= l.entries {
            return Ok(None);
        }
        let r = l.starts.partition_point(|&s| s <= k) - 1;
        match &l.runs[r] {
            Run::Dir(sub) => Ok(Some(Entry {
                node: Node::Dir(*sub),
                name: Cow::Owned(self.dir_name(*sub)),
                stat: None,
            })),
            Run::Files { start, end, firsts } if self.fields => {
                let local = k - l.starts[r];
                let i = firsts.partition_point(|&f| f <= local) - 1;
                let j = local - firsts[i];
                let PathEntry { id, path, .. } =
                    self.sorted(ds, start + i as u64, ENTRY_BATCH, *end)?;
                let fs = ds.fields(id)?;
                let f = fs
                    .get(j as usize)
                    .ok_or_else(|| bad(format!("sample {id} has fewer fields")))?;
                let name = [split_last(&path).1, b".", f.name].concat();
                let first = ds
                    .snapshot()
                    .field_first(id)
                    .map_err(|e| ReadError::invalid(e.to_string()))?;
                Ok(Some(Entry {
                    node: Node::File(first + j),
                    name: Cow::Owned(name),
                    stat: None,
                }))
            }
            Run::Files { start, end, .. } => {
                let pos = start + (k - l.starts[r]);
                let e = self.sorted(ds, pos, ENTRY_BATCH, *end)?;
                Ok(Some(Entry {
                    node: Node::File(e.id),
                    name: Cow::Owned(split_last(&e.path).1.to_vec()),
                    stat: e.stat,
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_cannot_be_a_tree_are_refused() {
        for p in [
            &b""[..],
            b"/abs",
            b"a//b",
            b"a/",
            b"./a",
            b"a/../b",
            b"a\0b",
            &[b'x'; 256],
        ] {
            assert!(check_path(p).is_err(), "{p:?}");
        }
        for p in [&b"a"[..], b"a/b/c.jpg", b"\xff\xfe/x", &[b'x'; 255]] {
            assert!(check_path(p).is_ok(), "{p:?}");
        }
    }

    #[test]
    fn split_last_component() {
        assert_eq!(split_last(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split_last(b"c"), (&b""[..], &b"c"[..]));
    }
}
