//! The packer's index of the files it packs: every path in one byte arena and a fixed-width
//! record per file. A file costs its path plus 40 bytes (end offset and [`Meta`]) instead of a
//! `Vec` per path, which is what keeps a pack of many millions of files within ~100 bytes per
//! file (see docs/packing.md, "Packer memory").

/// What the scan found of a file (no padding: 32 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub size: u64,
    /// Inode number at scan time (only orders reads; never stored in the dataset).
    pub ino: u64,
    /// Modification time at scan time, nanoseconds since the epoch: a file whose size or
    /// mtime differs from the plan's has changed since the scan.
    pub mtime_ns: i64,
    /// Permission bits at scan time (`st_mode & 0o7777`), stored in the dataset.
    pub mode: u32,
    pub label: u32,
}

/// Files: the path arena and `ends` always hold every file; `meta` is either empty (not
/// filled yet) or holds one record per file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FileTable {
    bytes: Vec<u8>,
    /// `ends[i]` is where path `i` ends in `bytes` (it starts where path `i - 1` ends).
    ends: Vec<u64>,
    pub meta: Vec<Meta>,
}

impl FileTable {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of all paths together.
    pub fn path_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn ends(&self) -> &[u64] {
        &self.ends
    }

    fn start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.ends[i - 1] as usize
        }
    }

    /// Entry `i`'s mode and mtime.
    pub fn attrs(&self, i: usize) -> granary_format::FileAttrs {
        let m = &self.meta[i];
        granary_format::FileAttrs {
            mode: m.mode,
            mtime_ns: m.mtime_ns,
        }
    }

    pub fn path(&self, i: usize) -> &[u8] {
        &self.bytes[self.start(i)..self.ends[i] as usize]
    }

    pub fn paths(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.path(i))
    }

    /// Adds a path (its [`Meta`] is filled later, or with [`FileTable::push`]).
    pub fn push_path(&mut self, p: &[u8]) {
        self.bytes.extend_from_slice(p);
        self.ends.push(self.bytes.len() as u64);
    }

    /// Adds an entry with its [`Meta`].
    pub fn push(&mut self, p: &[u8], meta: Meta) {
        self.push_path(p);
        self.meta.push(meta);
    }

    /// A table from its arena and end offsets; `None` if the offsets do not describe `bytes`.
    pub fn from_parts(bytes: Vec<u8>, ends: Vec<u64>) -> Option<FileTable> {
        if !ends.is_sorted() || ends.last().copied().unwrap_or(0) != bytes.len() as u64 {
            return None;
        }
        Some(FileTable {
            bytes,
            ends,
            meta: Vec::new(),
        })
    }

    /// Keeps the files for which `keep(index, path)` is true, in order, compacting the arena
    /// and a filled `meta` in place (no second copy of the table).
    pub fn retain(&mut self, mut keep: impl FnMut(usize, &[u8]) -> bool) {
        let n = self.len();
        let filled = self.meta.len() == n;
        let (mut w, mut wb) = (0usize, 0usize);
        for i in 0..n {
            let (s, e) = (self.start(i), self.ends[i] as usize);
            if !keep(i, &self.bytes[s..e]) {
                continue;
            }
            self.bytes.copy_within(s..e, wb);
            wb += e - s;
            self.ends[w] = wb as u64;
            if filled {
                self.meta[w] = self.meta[i];
            }
            w += 1;
        }
        self.bytes.truncate(wb);
        self.ends.truncate(w);
        self.meta.truncate(w);
    }

    /// Sorts the files by path (bytewise). Free when they are sorted already (a walk of a
    /// typical tree); otherwise the arena is copied once in the new order.
    pub fn sort_by_path(&mut self) {
        if self.paths().is_sorted() {
            return;
        }
        use rayon::slice::ParallelSliceMut;
        let mut perm: Vec<u32> = (0..self.len() as u32).collect();
        perm.par_sort_unstable_by(|&a, &b| self.path(a as usize).cmp(self.path(b as usize)));
        let mut bytes = Vec::with_capacity(self.bytes.len());
        let mut ends = Vec::with_capacity(self.len());
        for &i in &perm {
            bytes.extend_from_slice(self.path(i as usize));
            ends.push(bytes.len() as u64);
        }
        if self.meta.len() == self.len() {
            self.meta = perm.iter().map(|&i| self.meta[i as usize]).collect();
        }
        self.bytes = bytes;
        self.ends = ends;
    }

    /// The first path that appears twice (the table must be sorted).
    pub fn first_duplicate(&self) -> Option<&[u8]> {
        (1..self.len())
            .find(|&i| self.path(i - 1) == self.path(i))
            .map(|i| self.path(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(paths: &[&str]) -> FileTable {
        let mut t = FileTable::default();
        for (i, p) in paths.iter().enumerate() {
            let meta = Meta {
                size: i as u64,
                ino: 100 + i as u64,
                mtime_ns: -(i as i64),
                mode: 0o644,
                label: i as u32,
            };
            t.push(p.as_bytes(), meta);
        }
        t
    }

    fn col<T>(t: &FileTable, f: impl Fn(&Meta) -> T) -> Vec<T> {
        t.meta.iter().map(f).collect()
    }

    fn paths(t: &FileTable) -> Vec<String> {
        t.paths()
            .map(|p| String::from_utf8(p.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn sort_moves_every_column_with_its_path() {
        let mut t = table(&["b/2", "a.x", "a/1", "", "b/10"]);
        t.sort_by_path();
        assert_eq!(paths(&t), ["", "a.x", "a/1", "b/10", "b/2"]);
        assert_eq!(col(&t, |m| m.size), [3, 1, 2, 4, 0]);
        assert_eq!(col(&t, |m| m.ino), [103, 101, 102, 104, 100]);
        assert_eq!(col(&t, |m| m.mtime_ns), [-3, -1, -2, -4, 0]);
        assert_eq!(col(&t, |m| m.label), [3, 1, 2, 4, 0]);
        assert_eq!(t.first_duplicate(), None);
        let mut d = table(&["x", "y", "x"]);
        d.sort_by_path();
        assert_eq!(d.first_duplicate(), Some(&b"x"[..]));
    }

    #[test]
    fn retain_compacts_paths_and_filled_columns_only() {
        let mut t = table(&["aa", "b", "ccc", "d", "eeee"]);
        t.retain(|i, p| i != 1 && p != b"d");
        assert_eq!(paths(&t), ["aa", "ccc", "eeee"]);
        assert_eq!(col(&t, |m| m.size), [0, 2, 4]);
        assert_eq!(col(&t, |m| m.label), [0, 2, 4]);
        assert_eq!(t.path_bytes(), b"aaccceeee");
        // Columns not filled yet stay empty.
        let mut u = FileTable::default();
        for p in ["x", "yy", "z"] {
            u.push_path(p.as_bytes());
        }
        u.retain(|_, p| p != b"yy");
        assert_eq!(paths(&u), ["x", "z"]);
        assert!(u.meta.is_empty());
        u.retain(|_, _| false);
        assert!(u.is_empty() && u.path_bytes().is_empty());
    }

    #[test]
    fn parts_must_describe_the_arena() {
        assert!(FileTable::from_parts(b"abc".to_vec(), vec![1, 3]).is_some());
        assert!(FileTable::from_parts(b"abc".to_vec(), vec![2, 1]).is_none());
        assert!(FileTable::from_parts(b"abc".to_vec(), vec![1, 2]).is_none());
        assert!(FileTable::from_parts(Vec::new(), vec![0, 0]).is_some());
    }
}
