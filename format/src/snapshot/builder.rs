//! Writing a snapshot: [`SnapshotBuilder`].

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use super::fields::{encode_fields, FieldType};
use super::header::{
    ContentDigest, SnapshotHeader, BLOCK_SHIFT, DIGEST_PREFIX, SNAPSHOT_HEADER_LEN,
};
use super::namespace::{put_varint, EntryView, NsWriter};
use super::types::{ChunkEntry, FileAttrs, Lineage, RecordEntry, MAX_RECORD_OFFSET, RECORD_LEN};
use super::{features, SectionKind, SECTION_ENTRY_LEN, SECTION_TABLE_HEAD};
use crate::error::{bail, invalid, FormatError, Result};
use crate::{le, ChunkSummary, Compression, FieldEntry, SampleEntry, MAX_SAMPLES, NO_LABEL};

const WHAT: &str = "snapshot builder";

fn invalid(detail: impl Into<String>) -> FormatError {
    FormatError::invalid(WHAT, detail)
}

/// Builds a snapshot from finished chunks, in chunk id order.
///
/// Memory: every path (the namespace is sorted from them), each sample's size (8 bytes) and
/// attributes (16 bytes, with them) and, unless spooled to a file
/// ([`SnapshotBuilder::spool_samples`]), each record entry (16 bytes) and the namespace's
/// pages.
#[derive(Default)]
pub struct SnapshotBuilder {
    dataset_id: [u8; 16],
    classes: Vec<Vec<u8>>,
    chunks: Vec<ChunkEntry>,
    /// Class counts: each chunk's encoded pairs, back to back, and where each chunk's end
    /// (the first chunk's start, 0, left out).
    class_pairs: Vec<u8>,
    class_ends: Vec<u64>,
    /// The record table, then (once built) the namespace's pages.
    bulk: Bulk,
    sample_count: u64,
    path_blob: Vec<u8>,
    path_ends: Vec<u64>,
    sizes: Vec<u64>,
    lineage: Lineage,
    /// Each sample's attributes while every chunk with records has carried them.
    attrs: Vec<FileAttrs>,
    /// Whether the chunks with records so far all carried attributes (`None`: no records yet).
    with_attrs: Option<bool>,
    /// Directories given, the first attributes given for a path kept.
    dirs: BTreeMap<Vec<u8>, FileAttrs>,
    with_fields: Option<bool>,
    field_names: crate::FieldNames,
    field_entries: Vec<FieldEntry>,
    /// Where each sample's field entries end.
    field_ends: Vec<u64>,
    /// Field types the chunks' fields blocks declared.
    chunk_types: HashMap<Vec<u8>, String>,
    /// Paths are taken as given (tests of readers against hostile snapshots).
    unchecked: bool,
    /// Deleted samples, rising, each with the generation that deleted it.
    deleted: Vec<(u64, u32)>,
    /// Each chunk's revision (empty: all 0).
    revisions: Vec<u32>,
    /// The samples' ids in path order, if known ([`SnapshotBuilder::path_order_hint`]).
    order_hint: Option<Vec<u32>>,
}

impl SnapshotBuilder {
    /// A builder for dataset `dataset_id` with the given class names.
    pub fn new(dataset_id: [u8; 16], classes: Vec<Vec<u8>>) -> Self {
        SnapshotBuilder {
            dataset_id,
            classes,
            ..Default::default()
        }
    }

    /// Takes paths as given, unsafe ones included: what a hostile author writes, for tests
    /// of readers.
    #[cfg(any(test, feature = "test-support"))]
    pub fn unchecked_paths(&mut self) {
        self.unchecked = true;
    }

    /// Records directories with their attributes (any order), empty ones included, as a
    /// chunk's attributes block does: a directory already given (by an earlier chunk or
    /// call) keeps its attributes. Every ancestor of every path is a directory of the
    /// snapshot whether or not it is given; one not given gets [`FileAttrs::DIR_DEFAULT`].
    pub fn push_dirs(
        &mut self,
        dirs: impl IntoIterator<Item = (Vec<u8>, FileAttrs)>,
    ) -> Result<()> {
        for (d, a) in dirs {
            crate::check_relative_path(&d).map_err(|why| {
                FormatError::invalid(format!("directory {}", String::from_utf8_lossy(&d)), why)
            })?;
            if a.mode > 0o7777 {
                bail!(WHAT, "mode {:o} beyond 7777", a.mode);
            }
            self.dirs.entry(d).or_insert(a);
        }
        Ok(())
    }

    /// Takes chunk `c`'s attributes and directories. The snapshot records attributes (the
    /// ATTRS feature) only if every chunk with records carries them.
    fn push_attrs(&mut self, c: &ChunkSummary) -> Result<()> {
        if let Some(a) = &c.attrs {
            if a.len() != c.entries.len() {
                bail!(
                    WHAT,
                    "chunk {}: attributes for {} of {} records",
                    c.chunk_id,
                    a.len(),
                    c.entries.len()
                );
            }
            if let Some(x) = a.iter().find(|x| x.mode > 0o7777) {
                bail!(WHAT, "mode {:o} beyond 7777", x.mode);
            }
        }
        if !c.entries.is_empty() {
            match (self.with_attrs, &c.attrs) {
                (None | Some(true), Some(a)) => {
                    self.with_attrs = Some(true);
                    self.attrs.extend_from_slice(a);
                }
                (_, None) | (Some(false), _) => {
                    self.with_attrs = Some(false);
                    self.attrs = Vec::new();
                }
            }
        }
        self.push_dirs(c.dirs.iter().cloned())
    }

    /// Records the snapshot's lineage.
    pub fn lineage(&mut self, l: Lineage) {
        self.lineage = l;
    }

    /// Marks samples deleted: `(sample id, the generation that deleted it)`, ids rising. A
    /// deleted sample keeps its place (ids do not move) and its record entry, but has no
    /// namespace entry and counts in no chunk's sums or class counts; its path in the chunks
    /// pushed may be empty. Call before the first chunk.
    pub fn deletions(&mut self, deleted: Vec<(u64, u32)>) -> Result<()> {
        if self.sample_count > 0 {
            return Err(invalid("deletions are given before the first chunk"));
        }
        if deleted.windows(2).any(|w| w[0].0 >= w[1].0) || deleted.iter().any(|d| d.1 == 0) {
            return Err(invalid(
                "deleted ids must rise, each deleted by a generation from 1",
            ));
        }
        self.deleted = deleted;
        Ok(())
    }

    /// Sets each chunk's revision (by chunk id; missing ones are 0): a chunk compacted R times
    /// is the file `chunk-NNNNNNNN.rR.gchunk`.
    pub fn revisions(&mut self, revisions: Vec<u32>) {
        self.revisions = revisions;
    }

    /// The ids of the samples not deleted, in path order, as the caller knows them (a rewrite
    /// of a snapshot keeps its namespace's order): checked in one pass instead of sorting every
    /// path; sorted as usual if they are not in order.
    pub fn path_order_hint(&mut self, ids: Vec<u32>) {
        self.order_hint = Some(ids);
    }

    fn is_deleted(&self, id: u64) -> bool {
        self.deleted.binary_search_by_key(&id, |d| d.0).is_ok()
    }

    /// Keeps the record table (16 bytes per sample) and the namespace's pages in `file`
    /// instead of in memory. `file` must be empty, readable and writable. Call before the
    /// first chunk.
    pub fn spool_samples(&mut self, file: std::fs::File) -> Result<()> {
        if self.sample_count > 0 {
            return Err(invalid(
                "samples can be spooled only before the first chunk",
            ));
        }
        self.bulk = Bulk::File {
            w: std::io::BufWriter::with_capacity(1 << 20, file),
            len: 0,
        };
        Ok(())
    }

    /// Adds the next chunk. Chunks must arrive with ids 0, 1, 2, ...; their records lie back
    /// to back from offset 64.
    pub fn push_chunk(&mut self, c: &ChunkSummary) -> Result<()> {
        if c.chunk_id as usize != self.chunks.len() {
            bail!(
                WHAT,
                "chunk {} added where chunk {} belongs",
                c.chunk_id,
                self.chunks.len()
            );
        }
        if c.entries.len() != c.paths.len()
            || c.fields
                .as_ref()
                .is_some_and(|f| f.records.len() != c.entries.len())
        {
            return Err(invalid("entries, paths and fields differ"));
        }
        self.push_fields(c)?;
        self.push_attrs(c)?;
        let mut e = ChunkEntry {
            chunk_id: c.chunk_id,
            file_size: c.file_size,
            first_sample: self.sample_count,
            sample_count: c.entries.len() as u64,
            records_end: crate::CHUNK_HEADER_LEN as u64,
            file_crc: c.file_crc,
            digest: c.digest,
            ..Default::default()
        };
        let mut labels: BTreeMap<u32, u64> = BTreeMap::new();
        for (s, p) in c.entries.iter().zip(&c.paths) {
            let deleted = self.is_deleted(self.sample_count);
            if !self.unchecked && !deleted {
                crate::check_relative_path(p).map_err(|why| {
                    FormatError::invalid(format!("path {}", String::from_utf8_lossy(p)), why)
                })?;
            }
            let removed = s.flags & crate::FLAG_REMOVED != 0;
            let comp = SampleEntry {
                flags: s.flags & !crate::FLAG_REMOVED,
                ..*s
            }
            .compression()?;
            if removed && (!deleted || s.stored_len != 0) {
                bail!(
                    WHAT,
                    "chunk {}: sample {}: only a deleted sample's record is removed (and empty)",
                    c.chunk_id,
                    self.sample_count
                );
            }
            if !deleted {
                s.check_lengths()?;
            }
            if s.offset != e.records_end || s.offset > MAX_RECORD_OFFSET || s.chunk != c.chunk_id {
                bail!(
                    WHAT,
                    "chunk {}: record of {} at {} (records lie back to back from 64)",
                    c.chunk_id,
                    String::from_utf8_lossy(p),
                    s.offset
                );
            }
            if s.label != NO_LABEL && s.label as usize >= self.classes.len() {
                bail!(WHAT, "label {} of {} classes", s.label, self.classes.len());
            }
            e.records_end = s.offset + s.stored_len;
            if !deleted {
                if s.label != NO_LABEL {
                    *labels.entry(s.label).or_default() += 1;
                }
                e.orig_bytes += s.orig_len;
                e.compressed += (comp != Compression::None) as u32;
            }
            let r = RecordEntry {
                offset: s.offset,
                flags: s.flags as u16,
                crc32: s.crc32,
                label: s.label,
            }
            .encode();
            self.bulk
                .append(&r)
                .map_err(|e| invalid!(WHAT, "spooling record entries: {e}"))?;
            self.sizes.push(s.orig_len);
            self.sample_count += 1;
            self.path_blob.extend_from_slice(p);
            self.path_ends.push(self.path_blob.len() as u64);
        }
        if e.records_end + crate::CHUNK_TRAILER_LEN as u64 > e.file_size {
            bail!(
                WHAT,
                "chunk {}: records end at {} in a {}-byte file",
                c.chunk_id,
                e.records_end,
                e.file_size
            );
        }
        let mut next = 0u32;
        for (class, n) in labels {
            put_varint(&mut self.class_pairs, (class - next) as u64);
            put_varint(&mut self.class_pairs, n);
            next = class + 1;
        }
        self.class_ends.push(self.class_pairs.len() as u64);
        self.chunks.push(e);
        if self.sample_count > MAX_SAMPLES || self.chunks.len() as u64 > u32::MAX as u64 {
            bail!(WHAT, "more than {MAX_SAMPLES} samples or 2^32 - 1 chunks");
        }
        Ok(())
    }

    /// Takes chunk `c`'s fields: all samples of a dataset have fields or none do.
    fn push_fields(&mut self, c: &ChunkSummary) -> Result<()> {
        if !c.entries.is_empty() {
            let has = c.fields.is_some();
            if *self.with_fields.get_or_insert(has) != has {
                bail!(
                    WHAT,
                    "chunk {} {} fields but earlier ones {}: a dataset's samples all have \
                     fields or none do",
                    c.chunk_id,
                    if has { "has" } else { "has no" },
                    if has { "had none" } else { "had" }
                );
            }
        }
        let Some(f) = &c.fields else {
            return Ok(());
        };
        if !f.types.is_empty() && f.types.len() != f.names.len() {
            return Err(invalid("a chunk's field types do not match its names"));
        }
        for (n, t) in f.names.iter().zip(&f.types) {
            FieldType::parse(t).map_err(invalid)?;
            let old = self
                .chunk_types
                .entry(n.clone())
                .or_insert_with(|| t.clone());
            if old != t {
                bail!(
                    WHAT,
                    "field {} is {old} in one chunk and {t} in chunk {}",
                    String::from_utf8_lossy(n),
                    c.chunk_id
                );
            }
        }
        for (i, (r, s)) in f.records.iter().zip(&c.entries).enumerate() {
            // A deleted sample's entries are kept as they were; its record may be gone.
            if !self.is_deleted(self.sample_count + i as u64) {
                crate::chunk::check_group(s, r)?;
            }
            for e in r {
                let name = f
                    .names
                    .get(e.name as usize)
                    .ok_or_else(|| invalid("a field names no known name"))?;
                let name = self.field_names.id(name);
                self.field_entries.push(FieldEntry { name, ..*e });
            }
            self.field_ends.push(self.field_entries.len() as u64);
        }
        Ok(())
    }

    fn path(&self, i: usize) -> &[u8] {
        let start = i.checked_sub(1).map_or(0, |p| self.path_ends[p]);
        &self.path_blob[start as usize..self.path_ends[i] as usize]
    }

    /// The ids of the samples not deleted, sorted by path; fails on a path found twice.
    fn path_order(&self) -> Result<Vec<u32>> {
        let n = self.sample_count as usize;
        if let Some(h) = &self.order_hint {
            let live = n - self.deleted.len();
            let in_order = h.len() == live
                && h.iter()
                    .all(|&i| (i as usize) < n && !self.is_deleted(i as u64))
                && h.windows(2)
                    .all(|w| self.path(w[0] as usize) < self.path(w[1] as usize));
            if in_order {
                return Ok(h.clone());
            }
        }
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&i| !self.is_deleted(i as u64))
            .collect();
        order.sort_unstable_by(|&a, &b| self.path(a as usize).cmp(self.path(b as usize)));
        if let Some(w) = order
            .windows(2)
            .find(|w| self.path(w[0] as usize) == self.path(w[1] as usize))
        {
            bail!(
                WHAT,
                "duplicate path {}",
                String::from_utf8_lossy(self.path(w[0] as usize))
            );
        }
        Ok(order)
    }

    /// Every directory of the namespace, sorted: those given and every ancestor of a path
    /// (given attributes, or [`FileAttrs::DIR_DEFAULT`]).
    fn all_dirs(&self, order: &[u32]) -> Vec<(Vec<u8>, FileAttrs)> {
        let mut dirs = self.dirs.clone();
        let ancestors = |p: &[u8], dirs: &mut BTreeMap<Vec<u8>, FileAttrs>| {
            for (i, _) in p.iter().enumerate().filter(|(_, &b)| b == b'/') {
                dirs.entry(p[..i].to_vec())
                    .or_insert(FileAttrs::DIR_DEFAULT);
            }
        };
        let given: Vec<Vec<u8>> = dirs.keys().cloned().collect();
        for d in &given {
            ancestors(d, &mut dirs);
        }
        let mut parent: &[u8] = b"";
        for &i in order {
            let p = self.path(i as usize);
            let this = &p[..p.iter().rposition(|&b| b == b'/').unwrap_or(0)];
            if this != parent {
                ancestors(p, &mut dirs);
                parent = this;
            }
        }
        dirs.into_iter().collect()
    }

    /// Refuses a directory whose path is a field file's, `KEY.NAME` (one name for two things).
    fn check_field_files(&self, order: &[u32], dirs: &[(Vec<u8>, FileAttrs)]) -> Result<()> {
        for (d, _) in dirs {
            let Some((key, name)) = crate::split_field_path(d) else {
                continue;
            };
            let Ok(i) = order.binary_search_by(|&s| self.path(s as usize).cmp(key)) else {
                continue;
            };
            let s = order[i] as usize;
            let start = s.checked_sub(1).map_or(0, |p| self.field_ends[p]);
            let fields = &self.field_entries[start as usize..self.field_ends[s] as usize];
            if fields
                .iter()
                .any(|f| self.field_names.names[f.name as usize] == name)
            {
                bail!(
                    WHAT,
                    "{} is both a directory and the file of key {}'s field {}",
                    String::from_utf8_lossy(d),
                    String::from_utf8_lossy(key),
                    String::from_utf8_lossy(name)
                );
            }
        }
        Ok(())
    }

    /// The namespace section, files and directories merged in path order: its head, and its
    /// pages appended to `bulk` (where they lie there).
    fn namespace(&self, order: &[u32], attrs: bool, bulk: &mut Bulk) -> Result<Section> {
        let dirs = self.all_dirs(order);
        if self.with_fields == Some(true) {
            self.check_field_files(order, &dirs)?;
        }
        let at = bulk.len();
        let mut sink = |b: &[u8]| bulk.append(b);
        let mut w = NsWriter::new(self.sample_count, attrs, &mut sink);
        let (mut f, mut d) = (0usize, 0usize);
        while f < order.len() || d < dirs.len() {
            let fp = order.get(f).map(|&i| self.path(i as usize));
            let dp = dirs.get(d).map(|x| x.0.as_slice());
            let e = match (fp, dp) {
                (Some(a), Some(b)) if a == b => {
                    bail!(
                        WHAT,
                        "{} is both a file and a directory",
                        String::from_utf8_lossy(a)
                    )
                }
                (Some(path), b) if b.is_none_or(|b| path < b) => {
                    let id = order[f] as usize;
                    f += 1;
                    EntryView {
                        path,
                        id: Some(id as u64),
                        size: self.sizes[id],
                        attrs: attrs.then(|| self.attrs[id]),
                    }
                }
                _ => {
                    d += 1;
                    EntryView {
                        path: &dirs[d - 1].0,
                        id: None,
                        size: 0,
                        attrs: Some(dirs[d - 1].1),
                    }
                }
            };
            w.push(e)?;
        }
        let head = w.finish()?;
        Ok(Section::new(SectionKind::Namespace, head, at..bulk.len()))
    }

    /// The fields section, names sorted (entries renamed to match) and typed as their chunks
    /// declared them (a 1.x chunk declares none: bytes).
    fn fields_section(&self) -> Vec<u8> {
        let mut entries = self.field_entries.clone();
        let (names, types) =
            (self.field_names).sorted(&mut entries, |n| self.chunk_types.get(n).cloned());
        encode_fields(&names, &types, &self.field_ends, &entries)
    }

    /// Serializes the snapshot. Fails if two samples share a path, a file is also a
    /// directory, or the attributes do not cover every sample.
    pub fn build(self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .map_err(|e| match e.downcast::<FormatError>() {
                Ok(f) => f,
                Err(e) => invalid(e.to_string()),
            })?;
        Ok(out)
    }

    /// Checks what the builder was given and builds every section: in memory but for the
    /// record table and the namespace's pages (in `bulk`).
    fn sections(&self, bulk: &mut Bulk) -> Result<Body> {
        let n = self.sample_count;
        // Without samples, directories given make a tree with attributes.
        let with_attrs = self.with_attrs.unwrap_or(n == 0 && !self.dirs.is_empty());
        let with_fields = self.with_fields == Some(true);
        let ns = self.namespace(&self.path_order()?, with_attrs, bulk)?;
        let mut counts = vec![0u8; 8];
        le::put_words(&mut counts, &self.class_ends);
        counts.extend_from_slice(&self.class_pairs);
        let mem = |kind, b| Section::new(kind, b, 0..0);
        let mut sections = vec![
            mem(SectionKind::Lineage, self.lineage.encode().to_vec()),
            mem(
                SectionKind::Chunks,
                self.chunks.iter().flat_map(|c| c.encode()).collect(),
            ),
            mem(
                SectionKind::Classes,
                crate::encode_string_table(self.classes.iter()),
            ),
            mem(SectionKind::ClassCounts, counts),
        ];
        if with_fields {
            sections.push(mem(SectionKind::Fields, self.fields_section()));
        }
        let records = Section::new(SectionKind::Records, Vec::new(), 0..n * RECORD_LEN as u64);
        sections.extend([records, ns]);
        let with_deletions = !self.deleted.is_empty();
        if with_deletions {
            if let Some(d) = self.deleted.iter().find(|d| d.0 >= n) {
                bail!(WHAT, "sample {} deleted of {n} samples", d.0);
            }
            let mut b = Vec::with_capacity(8 + 8 * self.deleted.len());
            b.extend_from_slice(&(self.deleted.len() as u64).to_le_bytes());
            for &(id, g) in &self.deleted {
                b.extend_from_slice(&(id as u32).to_le_bytes());
                b.extend_from_slice(&g.to_le_bytes());
            }
            sections.push(mem(SectionKind::Deletions, b));
        }
        let with_revisions = self.revisions.iter().any(|&r| r > 0);
        if with_revisions {
            let c = self.chunks.len();
            if self.revisions.len() > c {
                bail!(WHAT, "revisions for {} of {c} chunks", self.revisions.len());
            }
            let mut b = Vec::with_capacity(4 * c);
            for i in 0..c {
                b.extend_from_slice(&self.revisions.get(i).copied().unwrap_or(0).to_le_bytes());
            }
            sections.push(mem(SectionKind::Revisions, b));
        }
        let incompat = (with_attrs as u32 * features::ATTRS)
            | (with_fields as u32 * features::FIELDS)
            | (with_deletions as u32 * features::DELETIONS)
            | (with_revisions as u32 * features::REVISIONS);
        Ok(Body::lay_out(sections, incompat))
    }

    /// Writes the snapshot to `w`; returns its length. Everything is checked before the first
    /// byte is written. The body is produced twice (once for the block CRCs, which the header
    /// needs, once to write), the record table and the namespace's pages read from their
    /// spool each time rather than held.
    pub fn write_to(mut self, w: &mut impl Write) -> std::io::Result<u64> {
        let inv = |e: FormatError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let mut bulk = std::mem::take(&mut self.bulk);
        let body = self.sections(&mut bulk).map_err(inv)?;
        if let Bulk::File { w, .. } = &mut bulk {
            w.flush()?;
        }
        let mut header = SnapshotHeader {
            dataset_id: self.dataset_id,
            samples: self.sample_count,
            chunks: self.chunks.len() as u32,
            body_end: body.end,
            block_shift: BLOCK_SHIFT,
            incompat: body.incompat,
            ..Default::default()
        };
        let mut digest = ContentDigest::new();
        digest.update(&header.encode()[..DIGEST_PREFIX]);
        let crcs = block_crcs(|f| {
            body.emit(&bulk, &mut |b| {
                digest.update(b);
                f(b)
            })
        })?;
        digest.update(&crcs);
        header.digest = digest.finish();
        header.table_crc = crc32fast::hash(&crcs);
        w.write_all(&header.encode())?;
        body.emit(&bulk, &mut |b| w.write_all(b))?;
        w.write_all(&crcs)?;
        Ok(body.end + crcs.len() as u64)
    }
}

/// Where bytes being written go, piece by piece.
type Sink<'a> = &'a mut dyn FnMut(&[u8]) -> std::io::Result<()>;

/// The bytes a builder holds until the snapshot is written (the record table, then the
/// namespace's pages), in memory or appended to a spool file.
enum Bulk {
    Mem(Vec<u8>),
    File {
        w: std::io::BufWriter<std::fs::File>,
        len: u64,
    },
}

impl Default for Bulk {
    fn default() -> Self {
        Bulk::Mem(Vec::new())
    }
}

impl Bulk {
    fn append(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Bulk::Mem(v) => v.extend_from_slice(b),
            Bulk::File { w, len } => {
                w.write_all(b)?;
                *len += b.len() as u64;
            }
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        match self {
            Bulk::Mem(v) => v.len() as u64,
            Bulk::File { len, .. } => *len,
        }
    }

    /// Hands bytes `r` to `f`, at most 1 MiB at a time (from a spool file flushed before).
    fn emit(&self, r: std::ops::Range<u64>, f: Sink<'_>) -> std::io::Result<()> {
        match self {
            Bulk::Mem(v) => f(&v[r.start as usize..r.end as usize]),
            Bulk::File { w, .. } => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; (1 << 20).min(r.end - r.start) as usize];
                let mut at = r.start;
                while at < r.end {
                    let k = (r.end - at).min(buf.len() as u64) as usize;
                    w.get_ref().read_exact_at(&mut buf[..k], at)?;
                    f(&buf[..k])?;
                    at += k as u64;
                }
                Ok(())
            }
        }
    }
}

/// A section's bytes: a head in memory, then a range of the builder's bulk bytes.
struct Section {
    kind: SectionKind,
    head: Vec<u8>,
    tail: std::ops::Range<u64>,
}

impl Section {
    fn new(kind: SectionKind, head: Vec<u8>, tail: std::ops::Range<u64>) -> Self {
        Section { kind, head, tail }
    }

    fn len(&self) -> u64 {
        self.head.len() as u64 + self.tail.end - self.tail.start
    }
}

/// A snapshot's body laid out: the section table, the sections and where the body ends.
struct Body {
    table: Vec<u8>,
    sections: Vec<Section>,
    end: u64,
    incompat: u32,
}

impl Body {
    /// Places `sections` (in order) after the section table, each at the next multiple of 8.
    fn lay_out(sections: Vec<Section>, incompat: u32) -> Body {
        let table_end =
            (SNAPSHOT_HEADER_LEN + SECTION_TABLE_HEAD + sections.len() * SECTION_ENTRY_LEN) as u64;
        let mut table = Vec::with_capacity(table_end as usize - SNAPSHOT_HEADER_LEN);
        // Each u32 count and kind is followed by a zero u32: together, one u64 word.
        le::put_words(&mut table, &[sections.len() as u64]);
        let (mut at, mut end) = (le::align8(table_end), table_end);
        for s in &sections {
            le::put_words(&mut table, &[s.kind as u64, at, s.len()]);
            end = at + s.len();
            at = le::align8(end);
        }
        Body {
            table,
            sections,
            end,
            incompat,
        }
    }

    /// Hands the body's bytes to `f` in order: the table, then each section after its padding.
    fn emit(&self, bulk: &Bulk, f: Sink<'_>) -> std::io::Result<()> {
        f(&self.table)?;
        let mut pos = (SNAPSHOT_HEADER_LEN + self.table.len()) as u64;
        for s in &self.sections {
            let pad = le::align8(pos) - pos;
            f(&[0u8; 8][..pad as usize])?;
            f(&s.head)?;
            bulk.emit(s.tail.clone(), f)?;
            pos += pad + s.len();
        }
        debug_assert_eq!(pos, self.end);
        Ok(())
    }
}

/// The CRC-32 of every block of the bytes `emit` hands out, in order (the block CRC table).
fn block_crcs(emit: impl FnOnce(Sink<'_>) -> std::io::Result<()>) -> std::io::Result<Vec<u8>> {
    let bs = 1usize << BLOCK_SHIFT;
    let (mut crcs, mut cur, mut fill) = (Vec::<u8>::new(), crc32fast::Hasher::new(), 0usize);
    emit(&mut |mut b: &[u8]| {
        while !b.is_empty() {
            let k = (bs - fill).min(b.len());
            cur.update(&b[..k]);
            fill += k;
            b = &b[k..];
            if fill == bs {
                let done = std::mem::replace(&mut cur, crc32fast::Hasher::new());
                crcs.extend_from_slice(&done.finalize().to_le_bytes());
                fill = 0;
            }
        }
        Ok(())
    })?;
    if fill > 0 {
        crcs.extend_from_slice(&cur.finalize().to_le_bytes());
    }
    Ok(crcs)
}
