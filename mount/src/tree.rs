//! The directory tree of a dataset, materialised lazily: a directory becomes known when it
//! is looked up or listed in its parent, and its listing is worked out when first asked for.
//!
//! Mounting reads nothing per sample, so it costs the same at a thousand samples as at a
//! billion; memory grows with the directories visited, not with the dataset. Files need no
//! per-file memory: a file is its sample (inode = sample id + 2), found by name in the
//! snapshot's namespace. The namespace lists every file and directory in path order, so a
//! directory's entries are a few runs of it: its subdirectories (each an entry, followed by
//! its subtree, which a listing skips with one search) and runs of positions holding its
//! direct files. Looking a name up is the page index (read once) and one page; a listing reads
//! consecutive pages, and the entries carry each file's size, mode and mtime.
//!
//! In a dataset whose samples have named fields the files are the fields, shown as
//! `KEY.FIELD` (inode = the field's index among all field entries + 2); a run of samples then
//! keeps each sample's first entry number (8 bytes a sample), so that listing stays a binary
//! search.
//!
//! Paths that cannot form a tree (empty components, `.`/`..`, names over 255 bytes, a
//! namespace out of order or without a file's directory) are found when the directory holding
//! them is listed or looked up, and that operation fails naming the path (`EIO` through the
//! mount); `granary verify` checks the whole namespace.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use granary::{Dataset, FileStat, NsEntry, ReadError};

/// Inode of the root directory (FUSE's fixed root).
pub const ROOT_INO: u64 = 1;

/// Longest name a directory entry may have (Linux `NAME_MAX`).
const NAME_MAX: usize = 255;

/// Paths fetched together ahead of a listing's walk through a run of direct files: the first
/// batch, and the most the batch grows to while the run goes on.
const READAHEAD: (u64, u64) = (64, 1 << 16);

/// Paths read together when a directory's entries are read in order (readdir).
const ENTRY_BATCH: u64 = 4096;

/// Namespace entries read last (a listing and the readdir after it read them in order).
#[derive(Debug, Default)]
struct Ahead {
    at: std::ops::Range<u64>,
    entries: Vec<NsEntry>,
}

/// One entry of a directory's listing, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Run {
    /// A subdirectory (index into the tree's directories).
    Dir(u32),
    /// Direct files at positions `start..end` of the snapshot's namespace; with fields,
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
    /// Each run with the listing position of its first entry.
    runs: Vec<(u64, Run)>,
    entries: u64,
}

#[derive(Debug)]
struct Dir {
    /// Full path, without a trailing slash (empty for the root).
    path: Box<[u8]>,
    parent: u32,
    /// Mode and mtime as packed, when the dataset records them.
    attrs: Option<granary::FileAttrs>,
    listing: OnceLock<Arc<Listing>>,
}

impl Dir {
    fn new(path: &[u8], parent: u32, attrs: Option<granary::FileAttrs>) -> Arc<Dir> {
        Arc::new(Dir {
            path: path.into(),
            parent,
            attrs,
            listing: OnceLock::new(),
        })
    }
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
pub struct Entry {
    pub node: Node,
    pub name: Vec<u8>,
    /// A file's size, mode and mtime when the listing had them at hand (a dataset without
    /// fields).
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

/// The field entry number of sample `id`'s first field.
fn field_first(ds: &Dataset, id: u64) -> Result<u64, ReadError> {
    let first = ds.snapshot().field_first(id);
    first.map_err(|e| ReadError::invalid(e.to_string()))
}

/// `dir/name` (`name` in the root).
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    match dir {
        [] => name.to_vec(),
        _ => [dir, b"/", name].concat(),
    }
}

impl Tree {
    /// The tree of `ds`: only its root now (nothing per sample or per directory).
    pub fn build(ds: &Dataset) -> Result<Tree, ReadError> {
        let fields = ds.has_fields();
        let files = match fields {
            true => ds.snapshot().field_entry_count(),
            false => ds.len(),
        };
        if files >= u64::MAX - ROOT_INO - 2 - u32::MAX as u64 {
            return Err(bad(format!("{files} files are too many for inode numbers")));
        }
        Ok(Tree {
            known: RwLock::new(Known {
                dirs: vec![Dir::new(b"", 0, None)],
                by_path: HashMap::from([(Box::default(), 0)]),
            }),
            samples: files,
            fields,
            ahead: Mutex::default(),
        })
    }

    /// The namespace entry at position `pos`: from the entries read last, or read now with
    /// the `batch - 1` after it (up to `end`).
    fn sorted(&self, ds: &Dataset, pos: u64, batch: u64, end: u64) -> Result<NsEntry, ReadError> {
        let mut a = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        if !a.at.contains(&pos) {
            let entries =
                ds.entries(pos..pos.saturating_add(batch.max(1)).min(end).max(pos + 1))?;
            *a = Ahead {
                at: pos..pos + entries.len() as u64,
                entries,
            };
        }
        a.entries
            .get(pos.wrapping_sub(a.at.start) as usize)
            .cloned()
            .ok_or_else(|| bad(format!("position {pos} of the namespace is out of range")))
    }

    fn known(&self) -> std::sync::RwLockReadGuard<'_, Known> {
        self.known.read().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, dir: u32) -> Arc<Dir> {
        self.known().dirs[dir as usize].clone()
    }

    /// Makes directory `path` known (once), child of `parent`, with its attributes.
    fn add_dir(
        &self,
        parent: u32,
        path: &[u8],
        attrs: Option<granary::FileAttrs>,
    ) -> Result<u32, ReadError> {
        if let Some(&d) = self.known().by_path.get(path) {
            return Ok(d);
        }
        checked(path)?;
        let mut k = self.known.write().unwrap_or_else(|p| p.into_inner());
        if let Some(&d) = k.by_path.get(path) {
            return Ok(d);
        }
        let idx =
            u32::try_from(k.dirs.len()).map_err(|_| bad("more than 2^32 directories".into()))?;
        k.dirs.push(Dir::new(path, parent, attrs));
        k.by_path.insert(path.into(), idx);
        Ok(idx)
    }

    /// The listing of directory `dir`, worked out on first use.
    fn listing(&self, ds: &Dataset, dir: u32) -> Result<Arc<Listing>, ReadError> {
        let d = self.get(dir);
        if let Some(l) = d.listing.get() {
            return Ok(l.clone());
        }
        let l = Arc::new(self.list(ds, dir, &d.path)?);
        // Another thread may have listed it meanwhile: the same listing.
        Ok(d.listing.get_or_init(|| l).clone())
    }

    /// Works out the listing of directory `dir` (`path`): one walk through its positions in
    /// the namespace, skipping each subdirectory's subtree with one search.
    fn list(&self, ds: &Dataset, dir: u32, path: &[u8]) -> Result<Listing, ReadError> {
        let prefix: Vec<u8> = match dir {
            0 => Vec::new(),
            _ => [path, b"/"].concat(),
        };
        let range = match dir {
            0 => 0..ds.entry_count(),
            _ => ds.prefix_range(&prefix)?,
        };
        let mut pos = range.start;
        let mut l = Listing::default();
        let mut prev: Option<Vec<u8>> = None;
        let mut subdirs: HashMap<Vec<u8>, u32> = HashMap::new();
        let (mut fetched_to, mut batch, mut in_files) = (pos, READAHEAD.0, false);
        while pos < range.end {
            // Read ahead only through a run of direct files (a subdirectory needs one entry),
            // in batches that grow while the run goes on.
            if pos >= fetched_to || !in_files {
                fetched_to = pos + if in_files { batch } else { 1 };
                if in_files {
                    batch = (batch * 2).min(READAHEAD.1);
                }
            }
            let e = self.sorted(ds, pos, fetched_to - pos, range.end)?;
            checked(&e.path)?;
            let rest = e.path.strip_prefix(&prefix[..]).unwrap_or_default();
            let slash = rest.iter().position(|&b| b == b'/');
            // A subdirectory's entry comes before its subtree ("D" < "D/x"), but siblings may
            // sort between them ("D-1", "D.txt" < "D/"): its subtree is skipped where it starts.
            let below = slash.and_then(|i| subdirs.get(&rest[..i]).map(|_| i));
            if prev.as_ref().is_some_and(|p| *p >= e.path)
                || !e.path.starts_with(&prefix)
                || (slash.is_some() && below.is_none())
            {
                return Err(bad(format!(
                    "the snapshot's namespace is out of order or lacks the directory of {:?} \
                     (run `granary verify`)",
                    granary::escape_path(&e.path)
                )));
            }
            prev = Some(e.path.clone());
            match (below, e.id) {
                (Some(i), _) => {
                    let sub = [&prefix[..], &rest[..=i]].concat();
                    pos = ds.prefix_end(&sub)?.max(pos + 1);
                    batch = READAHEAD.0;
                    in_files = false;
                }
                (None, None) => {
                    let sub = self.add_dir(dir, &e.path, e.attrs)?;
                    subdirs.insert(rest.to_vec(), sub);
                    l.runs.push((l.entries, Run::Dir(sub)));
                    l.entries += 1;
                    pos += 1;
                    in_files = false;
                }
                (None, Some(id)) => {
                    // Through a view, its files only (a file left out ends a run).
                    if ds.selects(id) {
                        self.add_file(ds, &mut l, pos, id, rest)?;
                    }
                    pos += 1;
                    in_files = true;
                }
            }
        }
        Ok(l)
    }

    /// Adds the direct file at position `pos` (named `name`) to listing `l`.
    fn add_file(
        &self,
        ds: &Dataset,
        l: &mut Listing,
        pos: u64,
        id: u64,
        name: &[u8],
    ) -> Result<(), ReadError> {
        let count = match self.fields {
            false => 1,
            true => {
                // A key shown as NAME.FIELD files must split back into it (SPEC.md §3).
                if name.contains(&b'.') {
                    return Err(bad(format!(
                        "a key with fields whose last component holds a '.': {:?}",
                        granary::escape_path(name)
                    )));
                }
                let fs = ds.fields(id)?;
                if let Some(f) = fs.iter().find(|f| name.len() + 1 + f.name.len() > NAME_MAX) {
                    return Err(bad(format!(
                        "a name of {} bytes: {:?}.{}",
                        name.len() + 1 + f.name.len(),
                        granary::escape_path(&ds.path(id)?),
                        String::from_utf8_lossy(f.name)
                    )));
                }
                fs.len() as u64
            }
        };
        match l.runs.last_mut() {
            Some((first, Run::Files { end, firsts, .. })) if *end == pos => {
                if self.fields {
                    firsts.push(l.entries - *first);
                }
                *end += 1;
            }
            _ => {
                let firsts = if self.fields { vec![0] } else { Vec::new() };
                let run = Run::Files {
                    start: pos,
                    end: pos + 1,
                    firsts,
                };
                l.runs.push((l.entries, run));
            }
        }
        l.entries += count;
        Ok(())
    }

    /// Makes the record entries of `dir`'s files present at once before a listing that
    /// shows their sizes reads them one by one (readdirplus of a dataset with fields, whose
    /// files are fields); nothing otherwise: the namespace entries carry the files' stats.
    pub fn prefetch_file_attrs(&self, ds: &Dataset, dir: u32) -> Result<(), ReadError> {
        if !self.fields {
            return Ok(());
        }
        let l = self.listing(ds, dir)?;
        let mut ids = Vec::new();
        for (_, r) in &l.runs {
            if let Run::Files { start, end, .. } = r {
                for pos in *start..*end {
                    ids.extend(self.sorted(ds, pos, ENTRY_BATCH, *end)?.id);
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

    /// The entry `name` of directory `dir`, with a file's stat when the file is a sample (one
    /// page of the namespace).
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
                    let first = field_first(ds, id)?;
                    k.map(|k| (Node::File(first + k as u64), None))
                }
            },
        };
        if file.is_some() {
            return Ok(file);
        }
        // A directory not known yet, made known.
        match ds.find(&path)? {
            Some((_, e)) if e.is_dir() => {
                Ok(Some((Node::Dir(self.add_dir(dir, &path, e.attrs)?), None)))
            }
            _ => Ok(None),
        }
    }

    /// Parent directory of `dir` (the root's is itself).
    pub fn parent(&self, dir: u32) -> u32 {
        self.get(dir).parent
    }

    /// Number of entries of `dir` (without `.` and `..`): lists it if it was not yet.
    pub fn entry_count(&self, ds: &Dataset, dir: u32) -> Result<u64, ReadError> {
        Ok(self.listing(ds, dir)?.entries)
    }

    /// Mode and mtime of `dir` as packed, if the dataset records them.
    pub fn dir_attrs(&self, dir: u32) -> Option<granary::FileAttrs> {
        self.get(dir).attrs
    }

    /// Entry number `k` (0-based, without `.` and `..`) of directory `dir`, if it exists;
    /// lists `dir` if it was not yet.
    pub fn entry(&self, ds: &Dataset, dir: u32, k: u64) -> Result<Option<Entry>, ReadError> {
        let l = self.listing(ds, dir)?;
        if k >= l.entries {
            return Ok(None);
        }
        let (first, run) = &l.runs[l.runs.partition_point(|r| r.0 <= k) - 1];
        match run {
            Run::Dir(sub) => Ok(Some(Entry {
                node: Node::Dir(*sub),
                name: split_last(&self.get(*sub).path).1.to_vec(),
                stat: None,
            })),
            Run::Files { start, end, firsts } => {
                // With fields: the sample at run position `i`, its field `j`.
                let local = k - first;
                let i = match self.fields {
                    true => firsts.partition_point(|&f| f <= local) - 1,
                    false => local as usize,
                };
                let pos = start + i as u64;
                let e = self.sorted(ds, pos, ENTRY_BATCH, *end)?;
                let id =
                    e.id.ok_or_else(|| bad(format!("position {pos} is no file")))?;
                let name = split_last(&e.path).1;
                if !self.fields {
                    let (node, stat) = (Node::File(id), Some(e.stat()));
                    let name = name.to_vec();
                    return Ok(Some(Entry { node, name, stat }));
                }
                let j = local - firsts[i];
                let fs = ds.fields(id)?;
                let f = fs
                    .get(j as usize)
                    .ok_or_else(|| bad(format!("sample {id} has fewer fields")))?;
                Ok(Some(Entry {
                    node: Node::File(field_first(ds, id)? + j),
                    name: [name, b".", f.name].concat(),
                    stat: None,
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
