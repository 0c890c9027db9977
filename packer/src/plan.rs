//! The pack plan: which file goes into which chunk. Written to the work directory before any
//! chunk, so that `--resume` continues exactly the same plan even if the source is re-listed
//! differently.

use std::io::{BufReader, Read, Write};
use std::path::Path;

use granary_format::local::{LocalReader, LocalWriter, PACK_PLAN};
use granary_format::{encode_string_table, StringTable, NO_LABEL};

use crate::files::{FileTable, Meta};
use crate::IoAt;
use crate::PackError;

// The plan is a node-local file (docs/internals.md, kind `PACK_PLAN`); a plan of another
// version is not resumed.

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Canonical text of the settings the plan was made with (compared on resume).
    pub settings: String,
    pub dataset_id: [u8; 16],
    pub classes: Vec<Vec<u8>>,
    /// Every file, sorted by path, with every column filled.
    pub files: FileTable,
    /// Chunk order: `order[k]` is the index in `files` of the k-th file packed.
    pub order: Vec<u32>,
    /// The directories of the tree (walks only), sorted by path, with mode and mtime; their
    /// `size`, `ino` and `label` columns are unused (zero).
    pub dirs: FileTable,
    /// `order[chunk_starts[c]..chunk_starts[c + 1]]` are chunk `c`'s files.
    pub chunk_starts: Vec<u64>,
}

impl Plan {
    pub fn chunk_count(&self) -> usize {
        self.chunk_starts.len() - 1
    }

    /// Chunk `c`'s files, as indices into `files`, in record order.
    pub fn chunk_files(&self, c: usize) -> &[u32] {
        &self.order[self.chunk_starts[c] as usize..self.chunk_starts[c + 1] as usize]
    }

    /// Whether the pack records modes, mtimes and directories (not with `--no-metadata`).
    pub fn records_attrs(&self) -> bool {
        !self
            .settings
            .lines()
            .any(|l| l == crate::NO_METADATA_SETTING)
    }

    /// The directories chunk `c` records: the first chunk of a pack (or of a shard, which
    /// scanned the directories it owns) records all of them, the others none.
    pub fn chunk_dirs(&self, c: usize) -> Vec<granary_format::DirAttrs> {
        match c {
            0 => (0..self.dirs.len())
                .map(|i| (self.dirs.path(i).to_vec(), self.dirs.attrs(i)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Bytes of chunk `c`'s files.
    pub fn chunk_bytes(&self, c: usize) -> u64 {
        self.chunk_files(c)
            .iter()
            .map(|&i| self.files.meta[i as usize].size)
            .sum()
    }

    /// Groups files of the given sizes (already in their final order) into chunks of about
    /// `target` bytes and at most `max_files` files. A file of `target` bytes or more gets a
    /// chunk of its own.
    pub fn assign_chunks(
        sizes: impl IntoIterator<Item = u64>,
        target: u64,
        max_files: u64,
    ) -> Vec<u64> {
        let mut starts = vec![0u64];
        let mut fill = 0u64;
        let mut n = 0u64;
        for (i, size) in sizes.into_iter().enumerate() {
            let i = i as u64;
            n = i + 1;
            let start = *starts.last().unwrap();
            let open = start < i;
            if open
                && (size >= target || fill.saturating_add(size) > target || i - start >= max_files)
            {
                starts.push(i);
                fill = 0;
            }
            fill = fill.saturating_add(size);
            if size >= target {
                starts.push(i + 1);
                fill = 0;
            }
        }
        if *starts.last().unwrap() != n {
            starts.push(n);
        }
        starts
    }

    /// Writes the plan to `w` as it goes (no encoded copy in memory): a pack of millions of
    /// files would otherwise hold its index twice here.
    pub fn write_to(&self, w: impl Write) -> std::io::Result<()> {
        let classes = encode_string_table(self.classes.iter());
        let f = &self.files;
        let n = f.len() as u64;
        // Every field's length, in the order written below.
        let body_len = 8
            + self.settings.len() as u64
            + 16
            + 8
            + classes.len() as u64
            + 8
            + n * 8
            + f.path_bytes().len() as u64
            + n * (8 + 4 + 8 + 8 + 4 + 4)
            + 8
            + self.dirs.len() as u64 * (8 + 8 + 4)
            + self.dirs.path_bytes().len() as u64
            + 8
            + self.chunk_starts.len() as u64 * 8;
        let mut w = LocalWriter::new(w, &PACK_PLAN, body_len)?;
        put_blob_to(&mut w, self.settings.as_bytes())?;
        w.write_all(&self.dataset_id)?;
        put_blob_to(&mut w, &classes)?;
        w.write_all(&n.to_le_bytes())?;
        put_all(&mut w, f.ends(), |v| v.to_le_bytes())?;
        w.write_all(f.path_bytes())?;
        put_all(&mut w, &f.meta, |m| m.size.to_le_bytes())?;
        put_all(&mut w, &f.meta, |m| m.label.to_le_bytes())?;
        put_all(&mut w, &f.meta, |m| m.ino.to_le_bytes())?;
        put_all(&mut w, &f.meta, |m| m.mtime_ns.to_le_bytes())?;
        put_all(&mut w, &f.meta, |m| m.mode.to_le_bytes())?;
        put_all(&mut w, &self.order, |v| v.to_le_bytes())?;
        let d = &self.dirs;
        w.write_all(&(d.len() as u64).to_le_bytes())?;
        put_all(&mut w, d.ends(), |v| v.to_le_bytes())?;
        w.write_all(d.path_bytes())?;
        put_all(&mut w, &d.meta, |m| m.mtime_ns.to_le_bytes())?;
        put_all(&mut w, &d.meta, |m| m.mode.to_le_bytes())?;
        w.write_all(&(self.chunk_starts.len() as u64).to_le_bytes())?;
        put_all(&mut w, &self.chunk_starts, |v| v.to_le_bytes())?;
        w.finish().map(drop)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        self.write_to(&mut b).expect("writing to memory");
        b
    }

    /// Reads a plan of `len` bytes from `r`; `None` if it is damaged, truncated, inconsistent
    /// or of another version. No count is trusted before the bytes it needs are known to be
    /// there.
    pub fn read_from(r: impl Read, len: u64) -> Option<Plan> {
        let mut r = Body(LocalReader::new(r, &PACK_PLAN, len).ok()?);
        let settings = String::from_utf8(r.blob()?).ok()?;
        let dataset_id = r.array::<16>()?;
        let classes = r.strings("plan classes")?;
        let n = r.u64()?;
        // Every file takes at least 44 bytes (end, size, label, inode, mtime, mode, order).
        if n > r.0.left() / 44 || n > granary_format::MAX_SAMPLES {
            return None;
        }
        let n = n as usize;
        let mut files = r.paths(n)?;
        files.meta = vec![Meta::default(); n];
        let m = &mut files.meta;
        r.each(n, |i, b| m[i].size = u64::from_le_bytes(b))?;
        r.each(n, |i, b| m[i].label = u32::from_le_bytes(b))?;
        r.each(n, |i, b| m[i].ino = u64::from_le_bytes(b))?;
        r.each(n, |i, b| m[i].mtime_ns = i64::from_le_bytes(b))?;
        r.each(n, |i, b| m[i].mode = u32::from_le_bytes(b))?;
        let order = r.column(n, u32::from_le_bytes)?;
        let nd = r.u64()?;
        // Every directory takes at least 20 bytes (end, mtime, mode).
        if nd > r.0.left() / 20 {
            return None;
        }
        let nd = nd as usize;
        let mut dirs = r.paths(nd)?;
        dirs.meta = vec![Meta::default(); nd];
        let m = &mut dirs.meta;
        r.each(nd, |i, b| m[i].mtime_ns = i64::from_le_bytes(b))?;
        r.each(nd, |i, b| m[i].mode = u32::from_le_bytes(b))?;
        let nc = r.u64()?;
        if nc > r.0.left() / 8 {
            return None;
        }
        let chunk_starts = r.column(nc as usize, u64::from_le_bytes)?;
        r.0.finish().ok()?;
        // Sorted, distinct paths; labels that name a class; order a permutation; chunk
        // boundaries that cover it.
        if (1..n).any(|i| files.path(i - 1) >= files.path(i))
            || files
                .meta
                .iter()
                .any(|m| m.label != NO_LABEL && m.label as usize >= classes.len())
        {
            return None;
        }
        let mut seen = vec![false; n];
        for &i in &order {
            if std::mem::replace(seen.get_mut(i as usize)?, true) {
                return None;
            }
        }
        if chunk_starts.first() != Some(&0)
            || chunk_starts.last() != Some(&(n as u64))
            || chunk_starts.windows(2).any(|w| w[0] > w[1])
        {
            return None;
        }
        if (1..nd).any(|i| dirs.path(i - 1) >= dirs.path(i)) {
            return None;
        }
        Some(Plan {
            settings,
            dataset_id,
            classes,
            files,
            order,
            chunk_starts,
            dirs,
        })
    }

    /// Reads the plan file at `path`; `None` if it is missing or unusable.
    pub fn load(path: &Path) -> Option<Plan> {
        let f = std::fs::File::open(path).ok()?;
        let len = f.metadata().ok()?.len();
        Plan::read_from(BufReader::with_capacity(1 << 20, f), len)
    }

    /// Writes the plan atomically (temporary name, fsync, rename, fsync of the directory).
    pub fn save(&self, path: &Path) -> Result<(), PackError> {
        let durable = granary_store::write::Durability::FileAndDir;
        granary_store::write::write_atomic(path, durable, |w| self.write_to(w)).at("writing", path)
    }
}

fn put_blob_to(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&(data.len() as u64).to_le_bytes())?;
    w.write_all(data)
}

/// Writes a column of fixed-width values through a small buffer.
fn put_all<T: Copy, const N: usize>(
    w: &mut impl Write,
    col: &[T],
    enc: impl Fn(T) -> [u8; N],
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64 << 10);
    for &v in col {
        buf.extend_from_slice(&enc(v));
        if buf.len() >= 64 << 10 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)
}

/// Reads a framed body field by field (the frame keeps its CRC and how many bytes are left).
pub(crate) struct Body<R: Read>(pub(crate) LocalReader<R>);

impl<R: Read> Body<R> {
    pub(crate) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut a = [0u8; N];
        self.0.read_body(&mut a).ok()?;
        Some(a)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }
    /// `n` bytes, if the file has that many left.
    fn bytes(&mut self, n: u64) -> Option<Vec<u8>> {
        if n > self.0.left() {
            return None;
        }
        let mut b = vec![0u8; n as usize];
        self.0.read_body(&mut b).ok()?;
        Some(b)
    }
    pub(crate) fn blob(&mut self) -> Option<Vec<u8>> {
        let n = self.u64()?;
        self.bytes(n)
    }
    /// A string table in a blob (`what` names it in errors).
    pub(crate) fn strings(&mut self, what: &'static str) -> Option<Vec<Vec<u8>>> {
        let blob = self.blob()?;
        let table = StringTable::parse(&blob, what).ok()?;
        table
            .iter()
            .map(|c| c.map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()
            .ok()
    }
    /// A table of `n` paths: their end offsets, then the arena.
    fn paths(&mut self, n: usize) -> Option<FileTable> {
        let ends = self.column(n, u64::from_le_bytes)?;
        let bytes = self.bytes(ends.last().copied().unwrap_or(0))?;
        FileTable::from_parts(bytes, ends)
    }
    /// `n` values of `N` bytes each, handed to `each` with their index (the caller checked
    /// that `n` fits the file).
    fn each<const N: usize>(
        &mut self,
        n: usize,
        mut each: impl FnMut(usize, [u8; N]),
    ) -> Option<()> {
        if (n as u64).checked_mul(N as u64)? > self.0.left() {
            return None;
        }
        let mut buf = vec![0u8; (64 << 10) / N * N];
        let mut i = 0;
        while i < n {
            let k = (n - i).min(buf.len() / N);
            self.0.read_body(&mut buf[..k * N]).ok()?;
            for c in buf[..k * N].chunks_exact(N) {
                each(i, c.try_into().expect("N bytes"));
                i += 1;
            }
        }
        Some(())
    }
    fn column<T, const N: usize>(&mut self, n: usize, dec: fn([u8; N]) -> T) -> Option<Vec<T>> {
        let mut out = Vec::with_capacity(n.min(self.0.left() as usize / N));
        self.each(n, |_, b| out.push(dec(b)))?;
        Some(out)
    }
}

/// How the source differs from a plan made of it earlier.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SourceChanges {
    /// Files whose size or modification time differs from the plan's.
    pub modified: Vec<Vec<u8>>,
    /// Files of the plan that are gone (or no longer regular files).
    pub removed: Vec<Vec<u8>>,
    /// Files that the plan does not have.
    pub added: Vec<Vec<u8>>,
}

impl SourceChanges {
    /// Compares the files of a plan with a fresh scan (both sorted by path).
    pub fn between(planned: &FileTable, found: &FileTable) -> Self {
        use std::cmp::Ordering::*;
        let mut c = SourceChanges::default();
        let (mut p, mut f) = (0, 0);
        // A table's path `i`; past its end, greater than any path.
        fn next(t: &FileTable, i: usize) -> (bool, Option<&[u8]>) {
            (i >= t.len(), (i < t.len()).then(|| t.path(i)))
        }
        while p < planned.len() || f < found.len() {
            let ord = next(planned, p).cmp(&next(found, f));
            match ord {
                Less => c.removed.push(planned.path(p).to_vec()),
                Greater => c.added.push(found.path(f).to_vec()),
                Equal => {
                    let (a, b) = (&planned.meta[p], &found.meta[f]);
                    if (a.size, a.mtime_ns) != (b.size, b.mtime_ns) {
                        c.modified.push(planned.path(p).to_vec());
                    }
                }
            }
            p += (ord != Greater) as usize;
            f += (ord != Less) as usize;
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        self.modified.is_empty() && self.removed.is_empty() && self.added.is_empty()
    }
}

impl std::fmt::Display for SourceChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lists = [
            ("modified", &self.modified),
            ("removed", &self.removed),
            ("added", &self.added),
        ];
        let said: Vec<String> = lists
            .into_iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(what, list)| {
                let shown: Vec<_> = list
                    .iter()
                    .take(3)
                    .map(|p| String::from_utf8_lossy(p))
                    .collect();
                format!("{} {what}, e.g. {}", list.len(), shown.join(", "))
            })
            .collect();
        f.write_str(&said.join("; "))
    }
}

pub(crate) fn put_blob(b: &mut Vec<u8>, data: &[u8]) {
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_assignment() {
        assert_eq!(
            Plan::assign_chunks([3, 3, 3, 10, 1, 4, 4, 0], 7, 100),
            vec![0, 2, 3, 4, 6, 8]
        );
        assert_eq!(Plan::assign_chunks([], 7, 100), vec![0]);
        assert_eq!(Plan::assign_chunks([20], 7, 100), vec![0, 1]);
        assert_eq!(Plan::assign_chunks([0, 0], 7, 100), vec![0, 2]);
        // The file cap: 0-byte files never fill a chunk by size.
        assert_eq!(Plan::assign_chunks([0; 7], 7, 3), vec![0, 3, 6, 7]);
        assert_eq!(Plan::assign_chunks([1, 1, 9, 1], 7, 2), vec![0, 2, 3, 4]);
        assert_eq!(Plan::assign_chunks([1; 4], 7, 1), vec![0, 1, 2, 3, 4]);
    }

    fn file(size: u64, ino: u64, mtime_ns: i64, label: u32) -> Meta {
        let mode = 0o644;
        Meta {
            size,
            ino,
            mtime_ns,
            mode,
            label,
        }
    }

    fn dir(mode: u32, mtime_ns: i64) -> Meta {
        Meta {
            mode,
            mtime_ns,
            ..Meta::default()
        }
    }

    fn sample() -> Plan {
        let mut files = FileTable::default();
        files.push(b"a/1", file(5, 9, 1_700_000_000_123_456_789, 0));
        files.push(b"a/2", file(7, 3, 4, 0));
        files.push(b"\xff", file(0, 1, -5, NO_LABEL));
        Plan {
            settings: "s".into(),
            dataset_id: [3; 16],
            classes: vec![b"a".to_vec()],
            files,
            order: vec![2, 0, 1],
            chunk_starts: vec![0, 1, 3],
            dirs: {
                let mut d = FileTable::default();
                d.push(b"a", dir(0o750, 1_600_000_000_000_000_000));
                d.push(b"a/empty", dir(0o700, -7));
                d
            },
        }
    }

    fn decode(b: &[u8]) -> Option<Plan> {
        Plan::read_from(b, b.len() as u64)
    }

    #[test]
    fn encode_round_trip_and_damage() {
        let p = sample();
        assert_eq!(p.chunk_files(1), [0, 1]);
        assert_eq!(p.chunk_bytes(1), 12);
        let b = p.encode();
        granary_format::testing::dump_fuzz_seed("pack_plan", "three-files", &b);
        assert_eq!(decode(&b), Some(p));
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut]), None, "cut at {cut}");
        }
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert_eq!(decode(&d), None, "flip at {i}");
        }
        // A longer length than the bytes there: the reader runs dry and refuses.
        assert_eq!(Plan::read_from(&b[..], b.len() as u64 + 8), None);
    }

    #[test]
    fn inconsistent_plans_are_refused_even_with_a_valid_crc() {
        let bad = [
            Plan {
                order: vec![0, 0, 1],
                ..sample()
            },
            Plan {
                order: vec![0, 1, 7],
                ..sample()
            },
            Plan {
                chunk_starts: vec![0, 2],
                ..sample()
            },
            Plan {
                chunk_starts: vec![0, 2, 1, 3],
                ..sample()
            },
            {
                let mut p = sample();
                p.files.meta[0].label = 4;
                p
            },
            {
                let mut files = FileTable::default();
                files.push(b"b", file(1, 1, 1, NO_LABEL));
                files.push(b"a", file(1, 1, 1, NO_LABEL));
                files.push(b"c", file(1, 1, 1, NO_LABEL));
                Plan { files, ..sample() }
            },
        ];
        for p in bad {
            assert_eq!(decode(&p.encode()), None, "{p:?}");
        }
    }
}
