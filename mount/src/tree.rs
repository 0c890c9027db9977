//! The directory tree of a dataset, built once from the snapshot's path order.
//!
//! Files need no per-file memory here: a file is its sample (inode = sample id + 2), found by
//! name through the snapshot's path hash index, and listed through the path order. Only
//! directories are materialised. Every path with a given prefix is contiguous in the path
//! order, so a directory's entries are a few runs: its subdirectories, and runs of positions
//! in the path order holding its direct files. Listing a directory of a million files reads
//! only that directory's entries; building the tree is one pass over the sorted paths.
//!
//! In a dataset whose samples have named fields (format 1.3) the files are the fields, shown
//! as `KEY.FIELD` (inode = the field's index among all field entries + 2); a run of samples
//! then keeps each sample's first entry number (8 bytes a sample), so that listing stays a
//! binary search.

use std::borrow::Cow;
use std::collections::HashMap;

use granary::{Dataset, ReadError};

/// Inode of the root directory (FUSE's fixed root).
pub const ROOT_INO: u64 = 1;

/// Longest name a directory entry may have (Linux `NAME_MAX`).
const NAME_MAX: usize = 255;

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

#[derive(Debug)]
struct Dir {
    /// Full path, without a trailing slash (empty for the root).
    path: Box<[u8]>,
    parent: u32,
    runs: Vec<Run>,
    /// `starts[k]`: listing position of the first entry of `runs[k]`.
    starts: Vec<u64>,
    entries: u64,
    subdirs: u32,
    /// Mode and mtime as packed (datasets of format 1.2).
    attrs: Option<granary::FileAttrs>,
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
}

/// The tree: directories materialised, files resolved through the snapshot.
#[derive(Debug)]
pub struct Tree {
    dirs: Vec<Dir>,
    by_path: HashMap<Box<[u8]>, u32>,
    /// Number of files: samples, or field entries when the samples have fields.
    samples: u64,
    fields: bool,
}

fn bad(detail: String) -> ReadError {
    ReadError::Invalid(format!("cannot mount this dataset: {detail}"))
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

/// Splits `path` at its last `/`: (directory, name).
fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

impl Tree {
    /// Builds the tree of `ds` in one pass over its path order. Refuses a snapshot whose paths
    /// cannot form a tree (absolute or empty components, `.`/`..`, a name that is both a file
    /// and a directory) or whose path order is not sorted, naming the path.
    pub fn build(ds: &Dataset) -> Result<Tree, ReadError> {
        // One pass over every path in path order: fetched at once if fetched at all.
        ds.prefetch_paths()?;
        let n = ds.len();
        let fields = ds.has_fields();
        let files = match fields {
            true => ds.snapshot().field_entry_count(),
            false => n,
        };
        if files >= u64::MAX - ROOT_INO - 2 - u32::MAX as u64 {
            return Err(bad(format!("{files} files are too many for inode numbers")));
        }
        let mut t = Tree {
            dirs: vec![Dir {
                path: Box::default(),
                parent: 0,
                runs: Vec::new(),
                starts: Vec::new(),
                entries: 0,
                subdirs: 0,
                attrs: None,
            }],
            by_path: HashMap::from([(Box::default(), 0)]),
            samples: files,
            fields,
        };
        // The directories the dataset records (empty ones too), each placed where its files
        // would be in the path order: at the key `D/`.
        let mut recorded: Vec<(Vec<u8>, granary::FileAttrs)> = ds
            .dirs()?
            .into_iter()
            .map(|(mut d, a)| {
                d.push(b'/');
                (d, a)
            })
            .collect();
        recorded.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut next_dir = 0;
        // Directories from the root to the current one.
        let mut stack: Vec<u32> = vec![0];
        let mut prev: Option<&[u8]> = None;
        for pos in 0..=n {
            let path = match pos < n {
                true => Some(ds.path(ds.sorted_id(pos)?)?),
                false => None,
            };
            // Recorded directories that sort before this file (all of them after the last).
            while let Some((key, attrs)) = recorded.get(next_dir) {
                if path.is_some_and(|p| p < &key[..]) {
                    break;
                }
                let dir = &key[..key.len() - 1];
                check_path(dir)
                    .map_err(|e| bad(format!("{e}: {:?}", granary::escape_path(dir))))?;
                let d = t.enter(ds, &mut stack, dir)?;
                t.dirs[d as usize].attrs = Some(*attrs);
                next_dir += 1;
            }
            let Some(path) = path else { break };
            let shown = || granary::escape_path(path);
            check_path(path).map_err(|e| bad(format!("{e}: {:?}", shown())))?;
            if prev.is_some_and(|p| p >= path) {
                return Err(bad(format!(
                    "the snapshot's path order is not sorted at {:?} (run `granary verify`)",
                    shown()
                )));
            }
            prev = Some(path);
            let (dir, name) = split_last(path);
            let count = match fields {
                false => 1,
                true => {
                    let id = ds.sorted_id(pos)?;
                    let fs = ds.fields(id)?;
                    if let Some(f) = fs.iter().find(|f| name.len() + 1 + f.name.len() > NAME_MAX) {
                        return Err(bad(format!(
                            "a name of {} bytes: {:?}.{}",
                            name.len() + 1 + f.name.len(),
                            shown(),
                            String::from_utf8_lossy(f.name)
                        )));
                    }
                    fs.len() as u64
                }
            };
            t.enter(ds, &mut stack, dir)?;
            let cur = *stack.last().unwrap() as usize;
            let d = &mut t.dirs[cur];
            match d.runs.last_mut() {
                Some(Run::Files { end, firsts, .. }) if *end == pos => {
                    if fields {
                        firsts.push(d.entries - d.starts.last().copied().unwrap_or(0));
                    }
                    *end += 1;
                }
                _ => {
                    d.starts.push(d.entries);
                    d.runs.push(Run::Files {
                        start: pos,
                        end: pos + 1,
                        firsts: if fields { vec![0] } else { Vec::new() },
                    });
                }
            }
            d.entries += count;
        }
        Ok(t)
    }

    /// Makes `stack` the chain of directories from the root to `dir`: leaves those that are not
    /// its ancestors, creates the rest (in path order, each exactly once). Returns `dir`'s
    /// index.
    fn enter(&mut self, ds: &Dataset, stack: &mut Vec<u32>, dir: &[u8]) -> Result<u32, ReadError> {
        while stack.len() > 1 {
            let top = &self.dirs[*stack.last().unwrap() as usize].path;
            if dir == &top[..] || (dir.starts_with(top) && dir.get(top.len()) == Some(&b'/')) {
                break;
            }
            stack.pop();
        }
        loop {
            let cur = *stack.last().unwrap();
            let cur_len = self.dirs[cur as usize].path.len();
            if cur_len == dir.len() {
                return Ok(cur);
            }
            let from = if cur == 0 { 0 } else { cur_len + 1 };
            let end = dir[from..]
                .iter()
                .position(|&b| b == b'/')
                .map_or(dir.len(), |i| from + i);
            let sub = self.add_dir(ds, cur, &dir[..end])?;
            stack.push(sub);
        }
    }

    fn add_dir(&mut self, ds: &Dataset, parent: u32, path: &[u8]) -> Result<u32, ReadError> {
        let shown = || granary::escape_path(path);
        if self.by_path.contains_key(path) {
            return Err(bad(format!(
                "directory {:?} appears twice in the path order (run `granary verify`)",
                shown()
            )));
        }
        let file = match self.fields {
            true => ds.lookup_field(path)?.is_some(),
            false => ds.lookup(path)?.is_some(),
        };
        if file {
            return Err(bad(format!("{:?} is both a file and a directory", shown())));
        }
        let idx =
            u32::try_from(self.dirs.len()).map_err(|_| bad("more than 2^32 directories".into()))?;
        self.dirs.push(Dir {
            path: path.into(),
            parent,
            runs: Vec::new(),
            starts: Vec::new(),
            entries: 0,
            subdirs: 0,
            attrs: None,
        });
        self.by_path.insert(path.into(), idx);
        let p = &mut self.dirs[parent as usize];
        p.starts.push(p.entries);
        p.runs.push(Run::Dir(idx));
        p.entries += 1;
        p.subdirs += 1;
        Ok(idx)
    }

    /// Number of directories, the root included.
    pub fn dir_count(&self) -> usize {
        self.dirs.len()
    }

    /// Inode number of `node`: a file's is its sample id + 2, a directory's follows the files.
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
        (d > 0 && d < self.dirs.len() as u64).then_some(Node::Dir(d as u32))
    }

    /// The entry `name` of directory `dir`.
    pub fn lookup(&self, ds: &Dataset, dir: u32, name: &[u8]) -> Result<Option<Node>, ReadError> {
        let d = &self.dirs[dir as usize];
        if name.is_empty() || name.contains(&b'/') || name.len() > NAME_MAX {
            return Ok(None);
        }
        let mut path = Vec::with_capacity(d.path.len() + 1 + name.len());
        if dir != 0 {
            path.extend_from_slice(&d.path);
            path.push(b'/');
        }
        path.extend_from_slice(name);
        if let Some(&sub) = self.by_path.get(&path[..]) {
            return Ok(Some(Node::Dir(sub)));
        }
        if !self.fields {
            return Ok(ds.lookup(&path)?.map(Node::File));
        }
        let Some((id, name)) = ds.lookup_field(&path)? else {
            return Ok(None);
        };
        let k = ds.fields(id)?.iter().position(|f| f.name == name);
        let first = ds
            .snapshot()
            .field_first(id)
            .map_err(|e| ReadError::Invalid(e.to_string()))?;
        Ok(k.map(|k| Node::File(first + k as u64)))
    }

    /// The sample a file is and, with fields, which of its fields.
    pub fn file_sample(&self, ds: &Dataset, file: u64) -> Result<(u64, Option<usize>), ReadError> {
        if !self.fields {
            return Ok((file, None));
        }
        let (id, k) = ds
            .snapshot()
            .field_owner(file)
            .map_err(|e| ReadError::Invalid(e.to_string()))?;
        Ok((id, Some(k)))
    }

    /// Parent directory of `dir` (the root's is itself).
    pub fn parent(&self, dir: u32) -> u32 {
        self.dirs[dir as usize].parent
    }

    /// Number of entries of `dir` (without `.` and `..`).
    pub fn entry_count(&self, dir: u32) -> u64 {
        self.dirs[dir as usize].entries
    }

    /// Mode and mtime of `dir` as packed, if the dataset records them.
    pub fn dir_attrs(&self, dir: u32) -> Option<granary::FileAttrs> {
        self.dirs[dir as usize].attrs
    }

    /// Number of subdirectories of `dir`.
    pub fn subdir_count(&self, dir: u32) -> u32 {
        self.dirs[dir as usize].subdirs
    }

    /// Name of directory `dir` within its parent (empty for the root).
    pub fn dir_name(&self, dir: u32) -> &[u8] {
        split_last(&self.dirs[dir as usize].path).1
    }

    /// Entry number `k` (0-based, without `.` and `..`) of directory `dir`, if it exists.
    pub fn entry<'a>(
        &self,
        ds: &'a Dataset,
        dir: u32,
        k: u64,
    ) -> Result<Option<Entry<'a>>, ReadError>
    where
        Self: 'a,
    {
        let d = &self.dirs[dir as usize];
        if k >= d.entries {
            return Ok(None);
        }
        let r = d.starts.partition_point(|&s| s <= k) - 1;
        match &d.runs[r] {
            Run::Dir(sub) => Ok(Some(Entry {
                node: Node::Dir(*sub),
                name: Cow::Borrowed(&[]),
            })),
            Run::Files { start, firsts, .. } if self.fields => {
                let local = k - d.starts[r];
                let i = firsts.partition_point(|&f| f <= local) - 1;
                let j = local - firsts[i];
                let id = ds.sorted_id(start + i as u64)?;
                let fs = ds.fields(id)?;
                let f = fs
                    .get(j as usize)
                    .ok_or_else(|| bad(format!("sample {id} has fewer fields")))?;
                let name = [split_last(ds.path(id)?).1, b".", f.name].concat();
                let first = ds
                    .snapshot()
                    .field_first(id)
                    .map_err(|e| ReadError::Invalid(e.to_string()))?;
                Ok(Some(Entry {
                    node: Node::File(first + j),
                    name: Cow::Owned(name),
                }))
            }
            Run::Files { start, .. } => {
                let pos = start + (k - d.starts[r]);
                let id = ds.sorted_id(pos)?;
                let name = split_last(ds.path(id)?).1;
                Ok(Some(Entry {
                    node: Node::File(id),
                    name: Cow::Borrowed(name),
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
