//! The metadata snapshot, format 2.0: a header, a body of sections (read in place), and the
//! body's block CRCs. See `SPEC.md`.

mod builder;
mod check;
mod fields;
mod header;
pub(crate) mod namespace;
mod types;

use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{bail, invalid, FormatError, Result};
use crate::strtab::StringTable;
use crate::{le, ChunkFields, ChunkSummary, Compression, SampleEntry, NO_LABEL};

pub use builder::SnapshotBuilder;
use fields::FieldsLayout;
pub use fields::{FieldType, DTYPES, FIELDS_HEADER_LEN, SNAP_FIELD_LEN};
pub use header::{
    features, Blocks, ContentDigest, Pager, SnapshotHeader, BLOCK_SHIFT, BLOCK_SHIFTS,
    DIGEST_PREFIX, SNAPSHOT_HEADER_LEN,
};
use namespace::NsLayout;
pub use namespace::{
    prefix_successor, Entry, EntryView, FileStat, NsEntry, PageIndex, NS_HEADER_LEN, PAGE_TARGET,
    RESTART_INTERVAL,
};
pub use types::{
    ChunkEntry, FileAttrs, Lineage, RecordEntry, SampleField, ATTRS_LEN, CHUNK_ENTRY_LEN,
    LINEAGE_LEN, MAX_RECORD_OFFSET, RECORD_LEN,
};

/// Length of the section table's count word and reserved word.
pub const SECTION_TABLE_HEAD: usize = 8;
/// Length of one section table entry.
pub const SECTION_ENTRY_LEN: usize = 24;
/// Most sections a snapshot may have.
pub const MAX_SECTIONS: u32 = 64;

/// Section kinds of format 2.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    /// The generation and the snapshot it extends ([`Lineage`], 24 bytes).
    Lineage = 1,
    /// The chunk table: one [`ChunkEntry`] (56 bytes) per chunk.
    Chunks = 2,
    /// The class names (a string table); labels index it.
    Classes = 3,
    /// Per chunk, how many of its samples carry each class.
    ClassCounts = 4,
    /// Feature FIELDS: field names, types, each sample's fields.
    Fields = 5,
    /// One [`RecordEntry`] (16 bytes) per sample, in sample id order.
    Records = 6,
    /// Every file and directory in path order ([`NsEntry`]), the page index, the id table.
    Namespace = 7,
    /// Feature DELETIONS: the deleted samples, each with the generation that deleted it.
    Deletions = 8,
    /// Feature REVISIONS: each chunk's revision (how many times it was compacted).
    Revisions = 9,
}

/// Every kind, in order of value, and its name in errors.
const KINDS: [(SectionKind, &str); 9] = [
    (SectionKind::Lineage, "snapshot lineage"),
    (SectionKind::Chunks, "snapshot chunk table"),
    (SectionKind::Classes, "snapshot classes"),
    (SectionKind::ClassCounts, "snapshot class counts"),
    (SectionKind::Fields, "snapshot fields"),
    (SectionKind::Records, "snapshot record table"),
    (SectionKind::Namespace, "snapshot namespace"),
    (SectionKind::Deletions, "snapshot deletions"),
    (SectionKind::Revisions, "snapshot chunk revisions"),
];

impl SectionKind {
    /// The section's name in errors.
    pub fn name(self) -> &'static str {
        KINDS[self as usize - 1].1
    }

    fn from_u32(k: u32) -> Option<SectionKind> {
        KINDS.get((k as usize).wrapping_sub(1)).map(|k| k.0)
    }
}

/// Where each section lies.
#[derive(Clone, Debug, Default)]
struct Sections {
    at: [Option<Range<usize>>; 9],
    /// Every entry of the table in order, unknown kinds included: (kind, range).
    all: Vec<(u32, Range<usize>)>,
}

impl Sections {
    fn get(&self, k: SectionKind) -> Range<usize> {
        self.at[k as usize - 1].clone().unwrap_or(0..0)
    }
}

/// A snapshot used in place over any byte container (a memory map, a `Vec`, a sparse file
/// filled by a [`Pager`]).
///
/// [`Snapshot::open`] checks the header, the block CRC table, the section table and every
/// section's size (O(1) in the number of samples) and reads the chunk table (O(chunks)).
/// Every byte of the body is used only after the CRC of its block was checked. Accessors
/// bounds-check what they read and return errors, never panic. [`Snapshot::check_blocks`]
/// and [`Snapshot::check_structure`] are the full O(n) checks.
pub struct Snapshot<B> {
    bytes: B,
    h: SnapshotHeader,
    blocks: Blocks,
    pager: Option<Arc<dyn Pager>>,
    s: Sections,
    lineage: Lineage,
    chunks: Vec<ChunkEntry>,
    class_count: u64,
    ns: NsLayout,
    fields: Option<FieldsLayout>,
    /// The deleted samples, rising, and the generation that deleted each.
    deleted: Arc<[u64]>,
    deleted_in: Vec<u32>,
    /// Each chunk's revision (empty: all 0).
    revisions: Vec<u32>,
    page_index: OnceLock<PageIndex>,
    /// The pages decoded last, the most recent last.
    decoded: Mutex<Vec<(usize, Arc<Vec<NsEntry>>)>>,
}

/// Decoded pages a snapshot keeps.
const DECODED_PAGES: usize = 8;

/// What identifies a snapshot's content, read from its 96-byte header alone: the dataset id
/// and the content digest (a 128-bit digest of the counts, the features, the body and the
/// block CRC table). Checks magic, version and the header CRC.
pub fn snapshot_key(header: &[u8]) -> Result<([u8; 16], [u8; 16])> {
    let h = SnapshotHeader::decode(header)?;
    Ok((h.dataset_id, h.digest))
}

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// Opens a snapshot held whole (see the type's docs for what is checked).
    pub fn open(bytes: B) -> Result<Self> {
        Self::open_with(bytes, None)
    }

    /// Opens a snapshot of which `bytes` holds only what `pager` has made present (the rest
    /// reads as zeros until then): every block is asked for before its first use.
    pub fn open_paged(bytes: B, pager: Arc<dyn Pager>) -> Result<Self> {
        Self::open_with(bytes, Some(pager))
    }

    fn open_with(bytes: B, pager: Option<Arc<dyn Pager>>) -> Result<Self> {
        let b = bytes.as_ref();
        let len = b.len() as u64;
        let head = SNAPSHOT_HEADER_LEN as u64;
        if let Some(p) = &pager {
            p.need_all(std::slice::from_ref(&(0..head.min(len))))?;
        }
        let h = SnapshotHeader::decode(b)?;
        if len != h.file_len() {
            bail!(
                "snapshot",
                "file is {len} bytes, its header describes {} (truncated or extended)",
                h.file_len()
            );
        }
        if let Some(p) = &pager {
            p.need_all(&[h.crc_table()])?;
        }
        let t = h.crc_table();
        let blocks = Blocks::parse(&h, &b[t.start as usize..t.end as usize])?;
        let mut snap = Snapshot {
            bytes,
            h,
            blocks,
            pager,
            s: Sections::default(),
            lineage: Lineage::default(),
            chunks: Vec::new(),
            class_count: 0,
            ns: NsLayout::default(),
            fields: None,
            deleted: Arc::from(Vec::new()),
            deleted_in: Vec::new(),
            revisions: Vec::new(),
            page_index: OnceLock::new(),
            decoded: Mutex::new(Vec::new()),
        };
        snap.s = snap.section_table()?;
        snap.lineage = Lineage::decode(snap.at(snap.sized(SectionKind::Lineage, LINEAGE_LEN)?)?)?;
        snap.chunks = snap.chunk_table()?;
        snap.class_count = snap.classes()?.len();
        snap.check_class_counts_index()?;
        snap.sized(SectionKind::Records, snap.h.samples as usize * RECORD_LEN)?;
        if snap.h.has_deletions() {
            (snap.deleted, snap.deleted_in) = snap.deletions_section()?;
        }
        if snap.h.has_revisions() {
            let c = snap.h.chunks as usize;
            let b = snap.at(snap.sized(SectionKind::Revisions, 4 * c)?)?;
            snap.revisions = b.chunks_exact(4).map(|w| le::u32_at(w, 0)).collect();
        }
        let ns = snap.s.get(SectionKind::Namespace);
        snap.ns = NsLayout::parse(
            snap.section_head(SectionKind::Namespace, NS_HEADER_LEN)?,
            ns,
            (snap.h.samples, snap.live_count()),
        )?;
        if snap.h.has_fields() {
            let f = snap.s.get(SectionKind::Fields);
            let fh = snap.section_head(SectionKind::Fields, FIELDS_HEADER_LEN)?;
            snap.fields = Some(FieldsLayout::parse(fh, f, snap.h.samples)?);
            snap.check_field_tables()?;
        }
        Ok(snap)
    }

    /// Reads and checks the section table: at most [`MAX_SECTIONS`] entries, each kind once,
    /// sections back to back from the end of the table (each at the next multiple of 8) to
    /// the end of the body; every kind 2.0 requires present, the fields section exactly with
    /// its feature bit, other kinds only with a compatible feature bit this reader does not
    /// know.
    fn section_table(&self) -> Result<Sections> {
        const WHAT: &str = "snapshot section table";
        let head = SNAPSHOT_HEADER_LEN;
        let w = self.at(head..head + SECTION_TABLE_HEAD)?;
        let (k, reserved) = (le::u32_at(w, 0), le::u32_at(w, 4));
        if k > MAX_SECTIONS || reserved != 0 {
            bail!(
                WHAT,
                "{k} sections (at most {MAX_SECTIONS}) or a reserved field set"
            );
        }
        let start = head + SECTION_TABLE_HEAD;
        let end = start + k as usize * SECTION_ENTRY_LEN;
        let t = self.at(start..end)?.to_vec();
        let mut s = Sections::default();
        let mut at = le::align8(end as u64);
        let unknown_compat = self.h.compat & !features::KNOWN_COMPAT != 0;
        for (i, e) in t.chunks_exact(SECTION_ENTRY_LEN).enumerate() {
            let (kind, off, len) = (le::u32_at(e, 0), le::u64_at(e, 8), le::u64_at(e, 16));
            if le::u32_at(e, 4) != 0 {
                bail!(WHAT, "entry {i}: reserved field set");
            }
            let r_end = off.checked_add(len).filter(|&x| x <= self.h.body_end);
            let Some(r_end) = r_end.filter(|_| off == at) else {
                bail!(
                    WHAT,
                    "section {i} (kind {kind}) at {off}+{len}: sections lie back to back \
                     from {at}, each at a multiple of 8, within the body"
                );
            };
            let r = off as usize..r_end as usize;
            match SectionKind::from_u32(kind) {
                Some(sk) => {
                    let slot = &mut s.at[sk as usize - 1];
                    if slot.is_some() {
                        bail!(WHAT, "{} appears twice", sk.name());
                    }
                    *slot = Some(r.clone());
                }
                None if unknown_compat => {}
                None => {
                    bail!(
                        WHAT,
                        "section of unknown kind {kind} without a compatible feature bit \
                         that could bring it"
                    )
                }
            }
            s.all.push((kind, r));
            at = le::align8(r_end);
        }
        let last = s
            .all
            .last()
            .map_or(le::align8(end as u64), |(_, r)| r.end as u64);
        if last != self.h.body_end {
            bail!(
                WHAT,
                "sections end at {last}, the body at {}",
                self.h.body_end
            );
        }
        for (k, _) in KINDS {
            let present = s.at[k as usize - 1].is_some();
            let wanted = match k {
                SectionKind::Fields => self.h.has_fields(),
                SectionKind::Deletions => self.h.has_deletions(),
                SectionKind::Revisions => self.h.has_revisions(),
                _ => true,
            };
            if present != wanted {
                return Err(FormatError::invalid(
                    WHAT,
                    match present {
                        false => format!("required section {} is missing", k.name()),
                        true => format!("{} is present without its feature bit", k.name()),
                    },
                ));
            }
        }
        Ok(s)
    }

    /// The first `len` bytes of section `k` (its header), which must be there.
    fn section_head(&self, k: SectionKind, len: usize) -> Result<&[u8]> {
        let r = self.s.get(k);
        let h = self.at(r.start..(r.start + len).min(r.end))?;
        if h.len() < len {
            return Err(FormatError::truncated(k.name(), len as u64, h.len() as u64));
        }
        Ok(h)
    }

    /// Where section `k` lies, which must be exactly `len` bytes long.
    fn sized(&self, k: SectionKind, len: usize) -> Result<Range<usize>> {
        let r = self.s.get(k);
        if r.len() != len {
            bail!(k.name(), "{} bytes, expected {len}", r.len());
        }
        Ok(r)
    }

    /// Reads and checks the chunk table: first samples rising from 0 to at most N, records
    /// ending after the chunk header and before the trailer (at the header, with nothing
    /// counted, in an empty chunk).
    fn chunk_table(&self) -> Result<Vec<ChunkEntry>> {
        let c = self.h.chunks as usize;
        let b = self.at(self.sized(SectionKind::Chunks, c * CHUNK_ENTRY_LEN)?)?;
        let mut v: Vec<ChunkEntry> = b
            .chunks_exact(CHUNK_ENTRY_LEN)
            .enumerate()
            .map(|(i, e)| ChunkEntry {
                chunk_id: i as u32,
                ..ChunkEntry::decode(e)
            })
            .collect();
        let n = self.h.samples;
        for i in 0..c {
            let next = v.get(i + 1).map_or(n, |e| e.first_sample);
            let e = &mut v[i];
            let first_ok = if i == 0 { e.first_sample == 0 } else { true };
            let min_end = crate::CHUNK_HEADER_LEN as u64;
            let trailer = crate::CHUNK_TRAILER_LEN as u64;
            // An empty chunk's records end where they start, and it has nothing to count.
            let empty_ok = next != e.first_sample
                || (e.records_end == min_end && e.orig_bytes == 0 && e.compressed == 0);
            if !first_ok
                || !empty_ok
                || next < e.first_sample
                || next > n
                || e.records_end < min_end
                || e.records_end.saturating_add(trailer) > e.file_size
            {
                bail!(
                    SectionKind::Chunks.name(),
                    "chunk {i}: samples from {} to {next} of {n}, records ending at {} of a \
                     {}-byte file",
                    e.first_sample,
                    e.records_end,
                    e.file_size
                );
            }
            e.sample_count = next - e.first_sample;
        }
        if c == 0 && n != 0 {
            bail!(SectionKind::Chunks.name(), "no chunks for {n} samples");
        }
        Ok(v)
    }

    /// Checks the class counts' offsets: C + 1 of them, rising from 0 to the pairs' length.
    fn check_class_counts_index(&self) -> Result<()> {
        let words = (self.h.chunks as usize + 1) * 8;
        let b = self.section_head(SectionKind::ClassCounts, words)?;
        let offs: Vec<u64> = b.chunks_exact(8).map(|w| le::u64_at(w, 0)).collect();
        let pairs = (self.s.get(SectionKind::ClassCounts).len() - words) as u64;
        if offs[0] != 0 || offs[offs.len() - 1] != pairs || offs.windows(2).any(|w| w[0] > w[1]) {
            bail!(
                SectionKind::ClassCounts.name(),
                "offsets do not rise from 0 to the {pairs} bytes of the counts"
            );
        }
        Ok(())
    }

    /// Reads and checks the deletions section (O(deleted)): a count D of at least 1, then D
    /// entries (sample u32, generation u32), samples rising below N, generations from 1 to
    /// the lineage's.
    fn deletions_section(&self) -> Result<(Arc<[u64]>, Vec<u32>)> {
        const WHAT: &str = "snapshot deletions";
        let r = self.s.get(SectionKind::Deletions);
        let d = le::u64_at(self.section_head(SectionKind::Deletions, 8)?, 0);
        if d == 0 || d > self.h.samples || r.len() as u64 != 8 + 8 * d {
            bail!(
                WHAT,
                "{d} deletions of {} samples in {} bytes",
                self.h.samples,
                r.len()
            );
        }
        let b = self.at(r.start + 8..r.end)?;
        let (mut ids, mut gens) = (
            Vec::with_capacity(d as usize),
            Vec::with_capacity(d as usize),
        );
        for e in b.chunks_exact(8) {
            let (id, g) = (le::u32_at(e, 0) as u64, le::u32_at(e, 4));
            if ids.last().is_some_and(|&p| p >= id) || id >= self.h.samples {
                bail!(
                    WHAT,
                    "sample {id}: samples rise, each below {}",
                    self.h.samples
                );
            }
            if g == 0 || g as u64 > self.lineage.generation {
                bail!(
                    WHAT,
                    "sample {id} deleted by generation {g}, the snapshot is generation {}",
                    self.lineage.generation
                );
            }
            ids.push(id);
            gens.push(g);
        }
        Ok((ids.into(), gens))
    }

    /// The deleted samples' ids, rising (none without DELETIONS).
    pub fn deleted(&self) -> &Arc<[u64]> {
        &self.deleted
    }

    /// The generation that deleted sample `id`, `None` if it was not deleted.
    pub fn deleted_by(&self, id: u64) -> Option<u64> {
        let k = self.deleted.binary_search(&id).ok()?;
        Some(self.deleted_in[k] as u64)
    }

    /// Per chunk whose file keeps deleted samples' records (not removed by compaction): (chunk
    /// id, such records, bytes they take in its file), rising by chunk. O(deleted).
    pub fn dead_records(&self) -> Result<Vec<(u32, u64, u64)>> {
        let mut out: Vec<(u32, u64, u64)> = Vec::new();
        for &id in self.deleted.iter() {
            let e = self.stored_sample(id)?;
            if e.flags & crate::FLAG_REMOVED != 0 {
                continue;
            }
            match out.last_mut() {
                Some(l) if l.0 == e.chunk => (l.1, l.2) = (l.1 + 1, l.2 + e.stored_len),
                _ => out.push((e.chunk, 1, e.stored_len)),
            }
        }
        Ok(out)
    }

    /// Chunk `c`'s revision: how many times it was compacted (0 for a chunk as packed).
    pub fn revision(&self, c: u32) -> u32 {
        self.revisions.get(c as usize).copied().unwrap_or(0)
    }

    /// Every chunk's revision, by id (empty when none was compacted).
    pub fn revisions(&self) -> &[u32] {
        &self.revisions
    }

    /// The file name of chunk `c` at its revision.
    pub fn chunk_file_name(&self, c: u32) -> String {
        crate::chunk_file_name_at(c, self.revision(c))
    }

    /// Samples not deleted: those the namespace holds and epochs deliver.
    pub fn live_count(&self) -> u64 {
        self.h.samples - self.deleted.len() as u64
    }

    /// Checks that sample `id` exists and was not deleted.
    fn check_live(&self, id: u64) -> Result<()> {
        self.check_id(id)?;
        if let Some(g) = self.deleted_by(id) {
            bail!("sample id", "sample {id} was deleted (by generation {g})");
        }
        Ok(())
    }

    /// Checks the fields' name and type tables: as many types as names, names valid, sorted,
    /// distinct.
    fn check_field_tables(&self) -> Result<()> {
        let names = self.field_names()?;
        let types = self.field_types()?;
        let f = self.fields.as_ref().expect("fields");
        if names.len() as u64 != f.name_count || types.len() != names.len() {
            bail!(
                SectionKind::Fields.name(),
                "{} names and {} types, the header says {}",
                names.len(),
                types.len(),
                f.name_count
            );
        }
        crate::check_sorted("snapshot field names", &names, crate::check_field_name)
    }

    /// Makes every block of `ranges` present (a pager fetches them together) and checked,
    /// once each: what a reader calls before a run of lookups.
    pub fn prefetch(&self, ranges: &[Range<usize>]) -> Result<()> {
        let mut missing: Vec<u64> = Vec::new();
        for r in ranges {
            let bs = self.blocks.blocks_of(&(r.start as u64..r.end as u64));
            missing.extend(bs.filter(|&b| !self.blocks.is_checked(b)));
        }
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        if let Some(p) = &self.pager {
            let mut runs: Vec<Range<u64>> = Vec::new();
            for &b in &missing {
                let r = self.blocks.block(b);
                match runs.last_mut() {
                    Some(last) if last.end == r.start => last.end = r.end,
                    _ => runs.push(r),
                }
            }
            p.need_all(&runs)?;
        }
        let b = self.bytes();
        for blk in missing {
            let r = self.blocks.block(blk);
            self.blocks
                .check(blk, &b[r.start as usize..r.end as usize], &|| {
                    self.sections_in(&r)
                })?;
        }
        Ok(())
    }

    /// The names of the sections (or the section table) that bytes `r` overlap.
    fn sections_in(&self, r: &Range<u64>) -> String {
        let table_end = (SNAPSHOT_HEADER_LEN + SECTION_TABLE_HEAD) as u64
            + self.s.all.len() as u64 * SECTION_ENTRY_LEN as u64;
        let mut names: Vec<String> = Vec::new();
        if r.start < table_end.max(SNAPSHOT_HEADER_LEN as u64 + 8) {
            names.push("the section table".into());
        }
        for (k, s) in &self.s.all {
            if (s.start as u64) < r.end && (s.end as u64) > r.start {
                names.push(
                    SectionKind::from_u32(*k).map_or(format!("section kind {k}"), |k| {
                        k.name().trim_start_matches("snapshot ").to_string()
                    }),
                );
            }
        }
        match names.is_empty() {
            true => "padding".into(),
            false => format!("holding {}", names.join(", ")),
        }
    }

    /// Bytes `r` of the body, every block they touch checked first.
    pub(crate) fn at(&self, r: Range<usize>) -> Result<&[u8]> {
        let end = r.end.min(self.bytes().len());
        if r.start > end {
            bail!("snapshot", "range {}..{} past the end", r.start, r.end);
        }
        self.prefetch(std::slice::from_ref(&(r.start..end)))?;
        Ok(&self.bytes()[r.start..end])
    }

    /// The byte container the snapshot was opened over.
    pub fn bytes_container(&self) -> &B {
        &self.bytes
    }

    /// The underlying bytes (unchecked: use the accessors).
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    /// The decoded header.
    pub fn header(&self) -> &SnapshotHeader {
        &self.h
    }

    /// The block CRCs and which blocks were checked.
    pub fn blocks(&self) -> &Blocks {
        &self.blocks
    }

    /// True if a pager fetches the snapshot's bytes.
    pub fn is_paged(&self) -> bool {
        self.pager.is_some()
    }

    /// `(major, minor)` format version of this file: (2, 0).
    pub fn version(&self) -> (u16, u16) {
        (crate::SNAPSHOT_MAJOR, 0)
    }

    /// The dataset id every chunk must carry.
    pub fn dataset_id(&self) -> [u8; 16] {
        self.h.dataset_id
    }

    /// The content digest (128 bits, from the header): with the dataset id, it identifies this
    /// snapshot's content. Opening trusts it as the header CRC covers it; `verify` recomputes
    /// it ([`Snapshot::check_digest`]).
    pub fn content_digest(&self) -> [u8; 16] {
        self.h.digest
    }

    /// The snapshot's generation and the snapshot it extends.
    pub fn lineage(&self) -> Lineage {
        self.lineage
    }

    /// Number of samples.
    pub fn sample_count(&self) -> u64 {
        self.h.samples
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> u64 {
        self.h.chunks as u64
    }

    /// Number of namespace entries: files and directories.
    pub fn entry_count(&self) -> u64 {
        self.ns.entries
    }

    /// Number of directories.
    pub fn dir_count(&self) -> u64 {
        self.ns.entries - self.live_count()
    }

    /// True if the snapshot records each file's and directory's mode and mtime.
    pub fn has_attrs(&self) -> bool {
        self.h.has_attrs()
    }

    /// Checks that sample `id` exists.
    fn check_id(&self, id: u64) -> Result<()> {
        if id >= self.h.samples {
            bail!(
                "sample id",
                "{id} out of range (dataset has {} samples)",
                self.h.samples
            );
        }
        Ok(())
    }

    /// Chunk table entry `index`.
    pub fn chunk(&self, index: u64) -> Result<ChunkEntry> {
        self.chunks.get(index as usize).copied().ok_or_else(|| {
            invalid!(
                "chunk index",
                "{index} out of range (dataset has {} chunks)",
                self.h.chunks
            )
        })
    }

    /// Every chunk table entry.
    pub fn chunks(&self) -> &[ChunkEntry] {
        &self.chunks
    }

    /// The chunk holding sample `id`.
    pub fn chunk_of(&self, id: u64) -> Result<&ChunkEntry> {
        self.check_id(id)?;
        let i = self.chunks.partition_point(|c| c.first_sample <= id) - 1;
        Ok(&self.chunks[i])
    }

    /// Record entry `id` as stored.
    pub fn record(&self, id: u64) -> Result<RecordEntry> {
        self.check_id(id)?;
        let at = self.s.get(SectionKind::Records).start + id as usize * RECORD_LEN;
        Ok(RecordEntry::decode(self.at(at..at + RECORD_LEN)?))
    }

    /// Sample `id`: its chunk, where its record lies and how to check it. The original
    /// length of a compressed record is its namespace size (read from the namespace); a raw
    /// record's is its stored length.
    pub fn sample(&self, id: u64) -> Result<SampleEntry> {
        self.check_live(id)?;
        let e = self.stored_sample(id)?;
        if e.flags & crate::FLAG_REMOVED != 0 {
            bail!(
                "snapshot record table",
                "sample {id}: its record is marked removed, but it is not deleted"
            );
        }
        Ok(e)
    }

    /// [`Snapshot::sample`] of any sample, a deleted one included (whose original length,
    /// if compressed, is unknown: 0).
    fn stored_sample(&self, id: u64) -> Result<SampleEntry> {
        let c = *self.chunk_of(id)?;
        let r = self.record(id)?;
        let end = match id + 1 < c.samples().end {
            true => self.record(id + 1)?.offset,
            false => c.records_end,
        };
        const WHAT: &str = "snapshot record table";
        let head = crate::CHUNK_HEADER_LEN as u64;
        let first_ok = id != c.first_sample || r.offset == head;
        if !first_ok || end < r.offset || end > c.records_end || r.offset < head {
            bail!(
                WHAT,
                "sample {id}: record at {}..{end} of chunk {} (records lie back to back from \
                 64 to its records_end {})",
                r.offset,
                c.chunk_id,
                c.records_end
            );
        }
        if r.label != NO_LABEL && r.label as u64 >= self.class_count {
            bail!(
                WHAT,
                "sample {id}: label {} of {} classes",
                r.label,
                self.class_count
            );
        }
        if (r.flags as u32 & crate::FLAG_FIELDS != 0) != self.h.has_fields() {
            bail!(
                WHAT,
                "sample {id}: flags {:#x}: the field-group bit is set exactly when the \
                 snapshot has fields",
                r.flags
            );
        }
        let mut e = SampleEntry {
            chunk: c.chunk_id,
            label: r.label,
            offset: r.offset,
            stored_len: end - r.offset,
            orig_len: end - r.offset,
            crc32: r.crc32,
            flags: r.flags as u32,
        };
        let code = SampleEntry {
            flags: e.flags & !crate::FLAG_REMOVED,
            ..e
        };
        if code.compression()? != Compression::None {
            e.orig_len = match self.deleted_by(id) {
                None => self.stat(id)?.size,
                Some(_) => 0,
            };
        }
        Ok(e)
    }

    /// Everything the snapshot records about chunk `index`: its table entry, and the sample
    /// entries, paths, fields and attributes of its records (what the chunk's footer holds
    /// but its directories: those are the snapshot's, [`Snapshot::dirs`]). A deleted sample
    /// has its record entry, an empty path and default attributes.
    pub fn chunk_summary(&self, index: u64) -> Result<ChunkSummary> {
        self.summary_with(index, &mut |id| {
            let e = self.file_entry(id)?;
            Ok((e.path, e.attrs.unwrap_or_default()))
        })
    }

    /// Every chunk's [`Snapshot::chunk_summary`], from one walk of the namespace in path order
    /// instead of a lookup per sample: what rewriting the whole snapshot (an append, a deletion,
    /// a compaction) reads. Holds every path.
    pub fn chunk_summaries(&self) -> Result<Vec<ChunkSummary>> {
        Ok(self.chunk_summaries_and_order()?.0)
    }

    /// [`Snapshot::chunk_summaries`], and the ids of the samples in path order (the namespace's
    /// order: [`SnapshotBuilder::path_order_hint`] of a rewrite that keeps every path).
    pub fn chunk_summaries_and_order(&self) -> Result<(Vec<ChunkSummary>, Vec<u32>)> {
        let n = self.h.samples as usize;
        let mut files: Vec<(Vec<u8>, FileAttrs)> = vec![Default::default(); n];
        let mut order = Vec::with_capacity(self.live_count() as usize);
        self.prefetch_namespace()?;
        for p in 0..self.page_index()?.len() {
            for e in self.page(p)?.iter() {
                if let Some(slot) = e.id.and_then(|id| files.get_mut(id as usize)) {
                    *slot = (e.path.clone(), e.attrs.unwrap_or_default());
                    order.push(e.id.unwrap_or_default() as u32);
                }
            }
        }
        let summaries = (0..self.chunk_count())
            .map(|c| {
                self.summary_with(c, &mut |id| {
                    let f = std::mem::take(&mut files[id as usize]);
                    if f.0.is_empty() {
                        // Not listed: the id table says why (a damaged namespace).
                        self.file_entry(id)?;
                    }
                    Ok(f)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((summaries, order))
    }

    /// [`Snapshot::chunk_summary`] with each sample's path and attributes from `file`.
    fn summary_with(
        &self,
        index: u64,
        file: &mut dyn FnMut(u64) -> Result<(Vec<u8>, FileAttrs)>,
    ) -> Result<ChunkSummary> {
        let c = self.chunk(index)?;
        let (mut entries, mut paths, mut attrs) = (Vec::new(), Vec::new(), Vec::new());
        for id in c.samples() {
            entries.push(self.stored_sample(id)?);
            if self.deleted_by(id).is_some() {
                paths.push(Vec::new());
                attrs.push(FileAttrs::default());
                continue;
            }
            let (path, a) = file(id)?;
            paths.push(path);
            attrs.push(a);
        }
        let fields = match self.has_fields() {
            false => None,
            true => Some(ChunkFields {
                names: self
                    .field_names()?
                    .into_iter()
                    .map(<[u8]>::to_vec)
                    .collect(),
                types: self
                    .field_types()?
                    .into_iter()
                    .map(|t| t.descriptor())
                    .collect(),
                records: c
                    .samples()
                    .map(|id| self.field_entries(id))
                    .collect::<Result<_>>()?,
            }),
        };
        Ok(ChunkSummary {
            entries,
            paths,
            fields,
            attrs: self.has_attrs().then_some(attrs),
            ..ChunkSummary::bare(c.chunk_id, c.file_size, c.file_crc, c.digest)
        })
    }

    fn classes(&self) -> Result<StringTable<'_>> {
        StringTable::parse(
            self.at(self.s.get(SectionKind::Classes))?,
            "snapshot classes",
        )
    }

    /// Number of class names.
    pub fn class_count(&self) -> u64 {
        self.class_count
    }

    /// Class name `label`.
    pub fn class_name(&self, label: u32) -> Result<&[u8]> {
        self.classes()?.get(label as u64)
    }

    /// How many samples of chunk `index` carry each class: `(class, count)`, classes rising,
    /// counts above 0 (the chunk's other samples have no label).
    pub fn class_counts(&self, index: u64) -> Result<Vec<(u32, u64)>> {
        const WHAT: &str = "snapshot class counts";
        let c = self.chunk(index)?;
        let r = self.s.get(SectionKind::ClassCounts);
        let words = (self.h.chunks as usize + 1) * 8;
        let w = self.at(r.start + index as usize * 8..r.start + index as usize * 8 + 16)?;
        let (a, e) = (le::u64_at(w, 0) as usize, le::u64_at(w, 8) as usize);
        let b = self.at(r.start + words + a..r.start + words + e)?;
        let (mut at, mut out, mut next, mut total) = (0usize, Vec::new(), 0u64, 0u64);
        while at < b.len() {
            let (Some(d), Some(n)) = (
                namespace::get_varint(b, &mut at),
                namespace::get_varint(b, &mut at),
            ) else {
                bail!(WHAT, "chunk {index}: cut short");
            };
            let class = next.checked_add(d).filter(|&k| k < self.class_count);
            total = total.saturating_add(n);
            let Some(class) = class.filter(|_| n > 0 && total <= c.sample_count) else {
                bail!(
                    WHAT,
                    "chunk {index}: a class beyond the {} classes, a zero count or more \
                     labelled samples than the chunk's {}",
                    self.class_count,
                    c.sample_count
                );
            };
            out.push((class as u32, n));
            next = class + 1;
        }
        Ok(out)
    }
}

mod lookup;

#[cfg(test)]
mod tests;
