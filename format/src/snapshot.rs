//! The metadata snapshot: header, section table, and checksummed sections used in place.

use std::ops::Range;
use std::sync::Arc;

use crate::blocks::{encode_block_sections, BlockHasher, BlockIndex, Pager, BLOCK_SIZE};
use crate::error::{check_crc, check_magic_version, FormatError, Result};
use crate::pages::{encode_pages, FileStat, PageEntries, PageIndex, PathEntry};
use crate::strtab::{encode_string_table, StringTable};
use crate::{le, path_hash, ChunkSummary, SampleEntry, CHUNK_HEADER_LEN, CHUNK_TRAILER_LEN};
use crate::{ChunkFields, FieldEntry, FIELD_ENTRY_LEN};
use crate::{
    BLOCKS_MINOR, FORMAT_MAJOR, LISTING_MINOR, MAX_SAMPLES, NO_LABEL, PAGES_MINOR,
    SAMPLE_ENTRY_LEN, SNAPSHOT_MAGIC,
};

/// Length of the snapshot header; the section table follows it.
pub const SNAPSHOT_HEADER_LEN: usize = 64;
/// Length of one section table entry.
pub const SECTION_ENTRY_LEN: usize = 32;
/// Length of one chunk table entry.
pub const CHUNK_ENTRY_LEN: usize = 40;
const MAX_SECTIONS: u32 = 1024;

/// Section kinds of format v1. Readers ignore kinds they do not know (added by minor versions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    /// Chunk table: `chunk_count` × 40-byte entries.
    Chunks = 1,
    /// Sample table: `sample_count` × 40-byte [`SampleEntry`]s, in chunk order.
    Samples = 2,
    /// Path of each sample (string table, `sample_count` items).
    Paths = 3,
    /// Open-addressing hash index from path to sample id.
    PathHash = 4,
    /// Sample ids (u32) sorted by path bytes.
    PathOrder = 5,
    /// Class names (string table); labels index it.
    Classes = 6,
    /// Optional (format 1.1): the snapshot's generation and the snapshot it extends.
    Lineage = 7,
    /// Optional (format 1.2): each sample's file mode and mtime ([`FileAttrs`], 16 bytes per
    /// sample, in sample order).
    FileAttrs = 8,
    /// Optional (format 1.2, with kind 10): the directories of the packed tree (string table,
    /// sorted by bytes), empty ones included.
    Dirs = 9,
    /// Optional (format 1.2, with kind 9): each directory's mode and mtime (16 bytes each).
    DirAttrs = 10,
    /// Optional (format 1.3, with kinds 12 and 13): the field names (string table, sorted).
    FieldNames = 11,
    /// Optional (format 1.3): `sample_count + 1` u64s, the first field entry of each sample.
    FieldIndex = 12,
    /// Optional (format 1.3): the field entries ([`FieldEntry`], 24 bytes each).
    Fields = 13,
    /// Format 1.4 (with kind 15): a CRC-32 per block of the snapshot ([`crate::BlockIndex`]).
    BlockCrcs = 14,
    /// Format 1.4 (with kind 14): the block size, the covered range and the CRCs of kind 14's
    /// own blocks.
    BlockIndex = 15,
    /// Format 1.5 (with kind 17): the path order's paths and sample ids, front-coded in pages
    /// ([`crate::PageIndex`]).
    PathPages = 16,
    /// Format 1.5 (with kind 16): every page's offset, first position and first path.
    PathPageIndex = 17,
    /// Format 1.6 (with kind 19, instead of kinds 16 and 17): kind 16's pages whose entries
    /// also carry each file's size, and mode and mtime when kind 8 is present
    /// ([`crate::FileStat`]).
    ListingPages = 18,
    /// Format 1.6 (with kind 18): kind 17's index, of kind 18.
    ListingPageIndex = 19,
}

/// One field of a sample, as the snapshot describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleField<'a> {
    /// The field's name.
    pub name: &'a [u8],
    /// Its offset inside the sample's record (fields lie back to back).
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// CRC-32 of its bytes.
    pub crc32: u32,
}

/// Where a snapshot's fields sections are (kinds 11, 12, 13).
#[derive(Clone, Debug)]
struct FieldsLayout {
    names: Range<usize>,
    index: Range<usize>,
    table: Range<usize>,
    name_count: u64,
    entries: u64,
}

/// Length of a [`FileAttrs`] entry (kinds 8 and 10).
pub const ATTRS_LEN: usize = 16;

/// A file's or directory's permission bits and modification time, as packed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileAttrs {
    /// Permission bits, `st_mode & 0o7777` (set-id and sticky bits included).
    pub mode: u32,
    /// Modification time, nanoseconds since 1970-01-01 UTC (negative before).
    pub mtime_ns: i64,
}

impl FileAttrs {
    /// The 16-byte entry: `mode: u32`, reserved `u32` (zero), `mtime_ns: i64`.
    pub fn encode(&self) -> [u8; ATTRS_LEN] {
        let mut b = [0u8; ATTRS_LEN];
        b[0..4].copy_from_slice(&self.mode.to_le_bytes());
        b[8..16].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b
    }

    /// The modification time as a [`std::time::SystemTime`].
    pub fn modified(&self) -> std::time::SystemTime {
        let d = std::time::Duration::from_nanos(self.mtime_ns.unsigned_abs());
        if self.mtime_ns >= 0 {
            std::time::UNIX_EPOCH + d
        } else {
            std::time::UNIX_EPOCH - d
        }
    }

    /// Decodes an entry; a mode beyond `0o7777` or a non-zero reserved field is invalid.
    pub fn decode(b: &[u8]) -> Result<FileAttrs> {
        let mode = le::u32_at(b, 0);
        if mode > 0o7777 || le::u32_at(b, 4) != 0 {
            return Err(FormatError::invalid(
                "file attributes",
                format!("mode {mode:o} beyond 7777, or a reserved field set"),
            ));
        }
        Ok(FileAttrs {
            mode,
            mtime_ns: le::u64_at(b, 8) as i64,
        })
    }
}

/// Length of the lineage section (kind 7).
pub const LINEAGE_LEN: usize = 16;

/// Which generation of a dataset a snapshot is: `granary append` publishes generation `g + 1`
/// over every chunk of generation `g`, plus new ones. A snapshot without a lineage section is
/// generation 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    /// 0 for a pack (or a merge of shards), +1 for each append.
    pub generation: u64,
    /// `header_crc` of the snapshot this one extends (0 for generation 0).
    pub parent: u32,
}

impl Lineage {
    /// The lineage section (kind 7): generation `u64`, parent `u32`, reserved `u32` (zero).
    fn encode(&self) -> [u8; LINEAGE_LEN] {
        let mut b = [0u8; LINEAGE_LEN];
        b[0..8].copy_from_slice(&self.generation.to_le_bytes());
        b[8..12].copy_from_slice(&self.parent.to_le_bytes());
        b
    }
}

/// One entry of the chunk table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Chunk id (equals the entry's index in v1).
    pub chunk_id: u32,
    /// Length of the chunk file in bytes.
    pub file_size: u64,
    /// Id of the first sample stored in the chunk.
    pub first_sample: u64,
    /// Number of samples stored in the chunk.
    pub sample_count: u64,
    /// CRC-32 of the whole chunk file.
    pub file_crc: u32,
}

impl ChunkEntry {
    fn encode(&self) -> [u8; CHUNK_ENTRY_LEN] {
        let mut b = [0u8; CHUNK_ENTRY_LEN];
        b[0..4].copy_from_slice(&self.chunk_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.file_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_sample.to_le_bytes());
        b[24..32].copy_from_slice(&self.sample_count.to_le_bytes());
        b[32..36].copy_from_slice(&self.file_crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Self {
        ChunkEntry {
            chunk_id: le::u32_at(b, 0),
            file_size: le::u64_at(b, 8),
            first_sample: le::u64_at(b, 16),
            sample_count: le::u64_at(b, 24),
            file_crc: le::u32_at(b, 32),
        }
    }

    /// The sample ids stored in this chunk.
    pub fn samples(&self) -> Range<u64> {
        self.first_sample..self.first_sample.saturating_add(self.sample_count)
    }
}

#[derive(Clone, Copy, Debug)]
struct Section {
    kind: u32,
    offset: u64,
    len: u64,
    crc: u32,
}

#[derive(Clone, Debug)]
struct Layout {
    major: u16,
    minor: u16,
    dataset_id: [u8; 16],
    samples: u64,
    chunks: u64,
    sections: Vec<Section>,
    chunk_tab: Range<usize>,
    sample_tab: Range<usize>,
    paths: Range<usize>,
    hash: Range<usize>,
    hash_cap: u64,
    order: Range<usize>,
    classes: Range<usize>,
    lineage: Lineage,
    /// Kind 8, if present.
    attrs: Option<Range<usize>>,
    /// Kinds 9 and 10, if present, and the number of directories.
    dirs: Option<(Range<usize>, Range<usize>)>,
    dir_count: u64,
    /// Kinds 11 to 13, if present.
    fields: Option<FieldsLayout>,
    /// Kinds 14 and 15, if present.
    blocks: Option<BlockIndex>,
    /// Kinds 16 and 17 (path pages and their index), or 18 and 19 (listing pages), if
    /// present.
    pages: Option<PagesLayout>,
}

/// Where a snapshot's pages and their index are, and what their entries carry.
#[derive(Clone, Debug)]
struct PagesLayout {
    pages: Range<usize>,
    index: Range<usize>,
    entries: PageEntries,
}

/// What [`Snapshot`]'s checks call before reading a range of the bytes (a pager's `need`).
type Need<'a> = &'a dyn Fn(Range<usize>) -> Result<()>;

/// Makes the parts of string table `r` that [`StringTable::parse`] reads present: the count,
/// the first offset and the last.
fn need_table(b: &[u8], need: Need, r: &Range<usize>) -> Result<()> {
    need(r.start..(r.start + 16).min(r.end))?;
    if r.len() >= 16 {
        let count = le::u64_at(b, r.start);
        if let Some(w) = count.checked_mul(8).and_then(|x| x.checked_add(8)) {
            if w.saturating_add(8) <= r.len() as u64 {
                let w = r.start + w as usize;
                need(w..w + 8)?;
            }
        }
    }
    Ok(())
}

/// A snapshot used in place over any byte container (a memory map, a `Vec`).
///
/// [`Snapshot::open`] checks the header, the section table, the section sizes (O(1) in the
/// number of samples) and that the chunk table's sample ranges tile the sample table
/// (O(chunks)). Accessors bounds-check what they read and return errors, never panic.
/// [`Snapshot::check_sections`] and [`Snapshot::check_structure`] are the full O(n) checks.
pub struct Snapshot<B> {
    bytes: B,
    l: Layout,
    pager: Option<std::sync::Arc<dyn Pager>>,
    /// Kind 17, parsed and checked on first use.
    page_index: std::sync::OnceLock<PageIndex>,
    /// The pages decoded last, the most recent last (a listing and the lookups that follow
    /// it read the same few pages over and over).
    decoded: std::sync::Mutex<Vec<(usize, Arc<Page>)>>,
}

/// A decoded page: each position's sample id, path and (listing pages) stat, in path order.
type Page = Vec<PathEntry>;

/// Decoded pages a snapshot keeps.
const DECODED_PAGES: usize = 4;

/// What identifies a snapshot's content, read from its 64-byte header alone: the dataset id
/// and the header's CRC (which covers the counts and the section table's CRC, and through it
/// every section's CRC). Checks magic, version and the header CRC. A reader that fetches
/// snapshots over a network keys its local copies by this, so one small ranged read tells
/// whether a copy is current.
pub fn snapshot_key(header: &[u8]) -> Result<([u8; 16], u32)> {
    const WHAT: &str = "snapshot header";
    if header.len() < SNAPSHOT_HEADER_LEN {
        return Err(FormatError::truncated(
            WHAT,
            SNAPSHOT_HEADER_LEN as u64,
            header.len() as u64,
        ));
    }
    check_magic_version(WHAT, &SNAPSHOT_MAGIC, header)?;
    check_crc(WHAT, le::u32_at(header, 60), &header[0..60])?;
    Ok((le::id_at(header, 16), le::u32_at(header, 60)))
}

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// Opens a snapshot: checks magic, version, header CRC, section table CRC, that every
    /// required section is present once, in bounds, and sized for the counts in the header, and
    /// that the chunk table is consistent with the sample table (ids dense, ranges contiguous,
    /// covering every sample).
    pub fn open(bytes: B) -> Result<Self> {
        let l = Self::layout(bytes.as_ref(), &|_| Ok(()))?;
        Ok(Snapshot {
            bytes,
            l,
            pager: None,
            page_index: Default::default(),
            decoded: Default::default(),
        })
    }

    /// Opens a snapshot of which `bytes` holds only what `pager` has made present (the rest
    /// reads as zeros until then): every read, at open and after, first asks the pager for
    /// its range. Same checks as [`Snapshot::open`]; only the ranges they read are fetched.
    pub fn open_paged(bytes: B, pager: std::sync::Arc<dyn Pager>) -> Result<Self> {
        let len = bytes.as_ref().len();
        let need = |r: Range<usize>| pager.need(r.start as u64..r.end.min(len) as u64);
        let l = Self::layout(bytes.as_ref(), &need)?;
        Ok(Snapshot {
            bytes,
            l,
            pager: Some(pager),
            page_index: Default::default(),
            decoded: Default::default(),
        })
    }

    /// Makes `r` present (a no-op for a snapshot held whole).
    fn need(&self, r: Range<usize>) -> Result<()> {
        match &self.pager {
            None => Ok(()),
            Some(p) => p.need(r.start as u64..r.end.min(self.b().len()) as u64),
        }
    }

    /// Makes all of `r` present and returns it.
    fn at(&self, r: Range<usize>) -> Result<&[u8]> {
        self.need(r.clone())?;
        Ok(&self.b()[r])
    }

    /// String table `r`, the parts `parse` reads made present.
    fn table(&self, r: &Range<usize>, what: &'static str) -> Result<StringTable<'_>> {
        if self.pager.is_some() {
            need_table(self.b(), &|x| self.need(x), r)?;
        }
        StringTable::parse(&self.b()[r.clone()], what)
    }

    /// Item `i` of string table `r`, its offsets and bytes made present.
    fn table_item(&self, r: &Range<usize>, what: &'static str, i: u64) -> Result<&[u8]> {
        let t = self.table(r, what)?;
        if self.pager.is_some() && i < t.len() {
            let w = r.start + 8 + i as usize * 8;
            self.need(w..w + 16)?;
            let blob = r.start + 16 + t.len() as usize * 8;
            let (a, e) = (le::u64_at(self.b(), w), le::u64_at(self.b(), w + 8));
            if a <= e && e <= (r.end - blob) as u64 {
                self.need(blob + a as usize..blob + e as usize)?;
            }
        }
        t.get(i)
    }

    /// True when the snapshot's bytes are fetched in pieces ([`Snapshot::open_paged`]).
    pub fn is_paged(&self) -> bool {
        self.pager.is_some()
    }

    /// The block checksum layout (format 1.4), if the snapshot has one.
    pub fn block_index(&self) -> Option<&BlockIndex> {
        self.l.blocks.as_ref()
    }

    /// Makes sample `ids`' entries present with as few fetches as the pager can (one ranged
    /// read for a chunk's samples); a no-op for a snapshot held whole.
    pub fn prefetch_samples(&self, ids: Range<u64>) -> Result<()> {
        self.prefetch_sample_runs(&[ids])
    }

    /// Makes every path, the path order and the fields present at once (what a full listing
    /// or a mount's directory tree reads): for a paged snapshot, large concurrent fetches
    /// instead of a block at a time as paths are read; nothing for a snapshot held whole.
    pub fn prefetch_paths(&self) -> Result<()> {
        let Some(p) = &self.pager else {
            return Ok(());
        };
        let r = |x: &Range<usize>| x.start as u64..x.end as u64;
        let mut v = vec![r(&self.l.paths), r(&self.l.order)];
        if let Some(f) = &self.l.fields {
            v.extend([r(&f.index), r(&f.table)]);
        }
        p.need_all(&v)
    }

    /// [`Snapshot::prefetch_samples`] of several runs of ids at once (a pager may fetch them
    /// concurrently).
    pub fn prefetch_sample_runs(&self, runs: &[Range<u64>]) -> Result<()> {
        let Some(p) = &self.pager else {
            return Ok(());
        };
        let (s, n) = (self.l.sample_tab.start as u64, self.l.samples);
        let ranges: Vec<Range<u64>> = runs
            .iter()
            .map(|ids| {
                let (a, b) = (ids.start.min(n), ids.end.min(n));
                s + a * SAMPLE_ENTRY_LEN as u64..s + b * SAMPLE_ENTRY_LEN as u64
            })
            .collect();
        p.need_all(&ranges)
    }

    fn layout(b: &[u8], need: Need) -> Result<Layout> {
        const WHAT: &str = "snapshot header";
        need(0..SNAPSHOT_HEADER_LEN.min(b.len()))?;
        snapshot_key(b)?; // length, magic, version, header CRC
        let header_len = le::u32_at(b, 12);
        if header_len as usize != SNAPSHOT_HEADER_LEN || le::u32_at(b, 56) != 0 {
            return Err(FormatError::invalid(
                WHAT,
                "unexpected header length or flags",
            ));
        }
        let samples = le::u64_at(b, 32);
        let chunks = le::u64_at(b, 40);
        let nsec = le::u32_at(b, 48);
        if samples > MAX_SAMPLES || chunks > u32::MAX as u64 || nsec > MAX_SECTIONS {
            return Err(FormatError::invalid(
                WHAT,
                format!("{samples} samples, {chunks} chunks, {nsec} sections exceed v1 limits"),
            ));
        }
        let tab_end = SNAPSHOT_HEADER_LEN + nsec as usize * SECTION_ENTRY_LEN;
        if b.len() < tab_end {
            return Err(FormatError::truncated(
                "snapshot section table",
                tab_end as u64,
                b.len() as u64,
            ));
        }
        need(SNAPSHOT_HEADER_LEN..tab_end)?;
        check_crc(
            "snapshot section table",
            le::u32_at(b, 52),
            &b[SNAPSHOT_HEADER_LEN..tab_end],
        )?;
        let mut sections = Vec::with_capacity(nsec as usize);
        let mut found: [Option<Range<usize>>; 19] = Default::default();
        for i in 0..nsec as usize {
            let e = &b[SNAPSHOT_HEADER_LEN + i * SECTION_ENTRY_LEN..][..SECTION_ENTRY_LEN];
            let s = Section {
                kind: le::u32_at(e, 0),
                offset: le::u64_at(e, 8),
                len: le::u64_at(e, 16),
                crc: le::u32_at(e, 24),
            };
            let end = s.offset.checked_add(s.len);
            if s.offset < tab_end as u64 || end.is_none_or(|e| e > b.len() as u64) {
                return Err(FormatError::invalid(
                    "snapshot section table",
                    format!(
                        "section {i} (kind {}) at {}+{} lies outside the {}-byte file",
                        s.kind,
                        s.offset,
                        s.len,
                        b.len()
                    ),
                ));
            }
            if (1..=19).contains(&s.kind) {
                let slot = &mut found[s.kind as usize - 1];
                if slot.is_some() {
                    return Err(FormatError::invalid(
                        "snapshot section table",
                        format!("section kind {} appears twice", s.kind),
                    ));
                }
                *slot = Some(s.offset as usize..(s.offset + s.len) as usize);
            }
            sections.push(s);
        }
        let mut get = |k: SectionKind| {
            found[k as usize - 1].take().ok_or_else(|| {
                FormatError::invalid(
                    "snapshot section table",
                    format!("required section {k:?} is missing"),
                )
            })
        };
        let (chunk_tab, sample_tab, paths, hash, order, classes) = (
            get(SectionKind::Chunks)?,
            get(SectionKind::Samples)?,
            get(SectionKind::Paths)?,
            get(SectionKind::PathHash)?,
            get(SectionKind::PathOrder)?,
            get(SectionKind::Classes)?,
        );
        expect_len(
            "snapshot chunk table",
            &chunk_tab,
            chunks * CHUNK_ENTRY_LEN as u64,
        )?;
        expect_len(
            "snapshot sample table",
            &sample_tab,
            samples * SAMPLE_ENTRY_LEN as u64,
        )?;
        expect_len("snapshot path order", &order, samples * 4)?;
        let blocks = block_sections(b, need, &mut found, &sections, tab_end)?;
        need(hash.start..(hash.start + 8).min(hash.end))?;
        let hash_cap = path_index_capacity(b, &hash, samples)?;
        need_table(b, need, &paths)?;
        let pt = StringTable::parse(&b[paths.clone()], "snapshot paths")?;
        if pt.len() != samples {
            return Err(FormatError::invalid(
                "snapshot paths",
                format!("{} paths for {samples} samples", pt.len()),
            ));
        }
        need(classes.clone())?;
        StringTable::parse(&b[classes.clone()], "snapshot classes")?;
        let Optional {
            lineage,
            attrs,
            dirs,
            dir_count,
        } = optional_sections(b, need, &mut found, samples)?;
        let fields = fields_sections(b, need, &mut found, samples)?;
        let pages = page_sections(b, need, &mut found, samples, attrs.is_some())?;
        need(chunk_tab.clone())?;
        check_chunk_ranges(&b[chunk_tab.clone()], samples)?;
        Ok(Layout {
            major: le::u16_at(b, 8),
            minor: le::u16_at(b, 10),
            dataset_id: le::id_at(b, 16),
            samples,
            chunks,
            sections,
            chunk_tab,
            sample_tab,
            paths,
            hash,
            hash_cap,
            order,
            classes,
            lineage,
            attrs,
            dirs,
            dir_count,
            fields,
            blocks,
            pages,
        })
    }

    fn b(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    /// The byte container the snapshot was opened over.
    pub fn bytes_container(&self) -> &B {
        &self.bytes
    }

    /// The underlying bytes.
    pub fn bytes(&self) -> &[u8] {
        self.b()
    }

    /// `(major, minor)` format version of this file.
    pub fn version(&self) -> (u16, u16) {
        (self.l.major, self.l.minor)
    }

    /// The dataset id every chunk must carry.
    pub fn dataset_id(&self) -> [u8; 16] {
        self.l.dataset_id
    }

    /// The snapshot's generation (appends) and the snapshot it extends.
    pub fn lineage(&self) -> Lineage {
        self.l.lineage
    }

    /// True if the dataset's samples have named fields (format 1.3).
    pub fn has_fields(&self) -> bool {
        self.l.fields.is_some()
    }

    /// The field names of the dataset (sorted by bytes; empty without fields).
    pub fn field_names(&self) -> Result<Vec<&[u8]>> {
        let Some(f) = &self.l.fields else {
            return Ok(Vec::new());
        };
        self.table(&f.names, "snapshot field names")?
            .iter()
            .collect()
    }

    /// The fields of sample `id`, in record order (empty for a sample of a dataset without
    /// fields).
    pub fn fields(&self, id: u64) -> Result<Vec<SampleField<'_>>> {
        let Some(f) = &self.l.fields else {
            if id >= self.l.samples {
                return Err(FormatError::invalid(
                    "sample id",
                    format!("{id} out of range (dataset has {} samples)", self.l.samples),
                ));
            }
            return Ok(Vec::new());
        };
        let range = self.field_range(f, id)?;
        let names = self.table(&f.names, "snapshot field names")?;
        let mut out = Vec::with_capacity(range.len());
        let mut offset = 0u64;
        for k in range {
            let at = f.table.start + k * FIELD_ENTRY_LEN;
            let e = FieldEntry::decode(self.at(at..at + FIELD_ENTRY_LEN)?)?;
            out.push(SampleField {
                name: names.get(e.name as u64)?,
                offset,
                len: e.len,
                crc32: e.crc32,
            });
            offset = offset.saturating_add(e.len);
        }
        Ok(out)
    }

    /// Number of field entries of all samples (0 without fields).
    pub fn field_entry_count(&self) -> u64 {
        self.l.fields.as_ref().map_or(0, |f| f.entries)
    }

    /// The index of sample `id`'s first field among all field entries.
    pub fn field_first(&self, id: u64) -> Result<u64> {
        let Some(f) = &self.l.fields else {
            return Err(FormatError::invalid(
                "snapshot",
                "the samples have no fields",
            ));
        };
        Ok(self.field_range(f, id)?.start as u64)
    }

    /// The sample that field entry `e` belongs to and its position among that sample's fields
    /// (a binary search of the field index).
    pub fn field_owner(&self, e: u64) -> Result<(u64, usize)> {
        let Some(f) = &self.l.fields else {
            return Err(FormatError::invalid(
                "snapshot",
                "the samples have no fields",
            ));
        };
        if e >= f.entries {
            return Err(FormatError::invalid(
                "field entry",
                format!("{e} out of range ({} fields)", f.entries),
            ));
        }
        let at = |i: u64| -> Result<u64> {
            let o = f.index.start + i as usize * 8;
            Ok(le::u64_at(self.at(o..o + 8)?, 0))
        };
        // The last sample whose first field is at or before e.
        let (mut lo, mut hi) = (0u64, self.l.samples);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if at(mid)? <= e {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let range = self.field_range(f, lo)?;
        if !range.contains(&(e as usize)) {
            return Err(FormatError::invalid(
                "snapshot field index",
                format!("field {e} belongs to no sample"),
            ));
        }
        Ok((lo, e as usize - range.start))
    }

    /// The field entries of sample `id` (name indexes into [`Snapshot::field_names`]).
    pub fn field_entries(&self, id: u64) -> Result<Vec<FieldEntry>> {
        let Some(f) = &self.l.fields else {
            return Ok(Vec::new());
        };
        self.field_range(f, id)?
            .map(|k| {
                let at = f.table.start + k * FIELD_ENTRY_LEN;
                let e = FieldEntry::decode(self.at(at..at + FIELD_ENTRY_LEN)?)?;
                if e.name as u64 >= f.name_count {
                    return Err(FormatError::invalid(
                        "snapshot fields",
                        format!("sample {id} names field {} of {}", e.name, f.name_count),
                    ));
                }
                Ok(e)
            })
            .collect()
    }

    fn field_range(&self, f: &FieldsLayout, id: u64) -> Result<Range<usize>> {
        if id >= self.l.samples {
            return Err(FormatError::invalid(
                "sample id",
                format!("{id} out of range (dataset has {} samples)", self.l.samples),
            ));
        }
        let at = f.index.start + id as usize * 8;
        let w = self.at(at..at + 16)?;
        let (first, end) = (le::u64_at(w, 0), le::u64_at(w, 8));
        if first >= end || end > f.entries {
            return Err(FormatError::invalid(
                "snapshot field index",
                format!("sample {id} has fields {first}..{end} of {}", f.entries),
            ));
        }
        Ok(first as usize..end as usize)
    }

    /// True if the snapshot records each file's mode and mtime (format 1.2).
    pub fn has_attrs(&self) -> bool {
        self.l.attrs.is_some()
    }

    /// Sample `id`'s file mode and mtime as packed; `None` if the snapshot does not record
    /// them.
    pub fn attrs(&self, id: u64) -> Result<Option<FileAttrs>> {
        let Some(r) = &self.l.attrs else {
            return Ok(None);
        };
        if id >= self.l.samples {
            return Err(FormatError::invalid(
                "sample id",
                format!("{id} out of range (dataset has {} samples)", self.l.samples),
            ));
        }
        let at = r.start + id as usize * ATTRS_LEN;
        FileAttrs::decode(self.at(at..at + ATTRS_LEN)?).map(Some)
    }

    /// Number of directories recorded (format 1.2; 0 without the section).
    pub fn dir_count(&self) -> u64 {
        self.l.dir_count
    }

    /// Directory `i` (in path order) and its mode and mtime.
    pub fn dir(&self, i: u64) -> Result<(&[u8], FileAttrs)> {
        let Some((names, attrs)) = &self.l.dirs else {
            return Err(FormatError::invalid(
                "directory",
                "the snapshot records none",
            ));
        };
        let path = self.table_item(names, "snapshot directories", i)?;
        let at = attrs.start + i as usize * ATTRS_LEN;
        Ok((path, FileAttrs::decode(self.at(at..at + ATTRS_LEN)?)?))
    }

    /// The header CRC: with the dataset id, it identifies this snapshot's content (see
    /// [`snapshot_key`]).
    pub fn header_crc(&self) -> u32 {
        le::u32_at(self.b(), 60)
    }

    /// Everything the snapshot records about chunk `index`: its table entry, and the sample
    /// entries and paths of its records (what the chunk's footer holds).
    pub fn chunk_summary(&self, index: u64) -> Result<ChunkSummary> {
        let c = self.chunk(index)?;
        let mut entries = Vec::with_capacity(c.sample_count as usize);
        let mut paths = Vec::with_capacity(c.sample_count as usize);
        for id in c.samples() {
            entries.push(self.sample(id)?);
            paths.push(self.path(id)?.to_vec());
        }
        let fields = match self.has_fields() {
            false => None,
            true => Some(ChunkFields {
                names: self
                    .field_names()?
                    .into_iter()
                    .map(<[u8]>::to_vec)
                    .collect(),
                records: c
                    .samples()
                    .map(|id| self.field_entries(id))
                    .collect::<Result<_>>()?,
            }),
        };
        Ok(ChunkSummary {
            chunk_id: c.chunk_id,
            file_size: c.file_size,
            file_crc: c.file_crc,
            entries,
            paths,
            fields,
        })
    }

    /// Number of samples.
    pub fn sample_count(&self) -> u64 {
        self.l.samples
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> u64 {
        self.l.chunks
    }

    /// Sample entry `id`.
    pub fn sample(&self, id: u64) -> Result<SampleEntry> {
        if id >= self.l.samples {
            return Err(FormatError::invalid(
                "sample id",
                format!("{id} out of range (dataset has {} samples)", self.l.samples),
            ));
        }
        let at = self.l.sample_tab.start + id as usize * SAMPLE_ENTRY_LEN;
        Ok(SampleEntry::decode(self.at(at..at + SAMPLE_ENTRY_LEN)?))
    }

    /// Chunk table entry `index`.
    pub fn chunk(&self, index: u64) -> Result<ChunkEntry> {
        if index >= self.l.chunks {
            return Err(FormatError::invalid(
                "chunk index",
                format!(
                    "{index} out of range (dataset has {} chunks)",
                    self.l.chunks
                ),
            ));
        }
        let at = self.l.chunk_tab.start + index as usize * CHUNK_ENTRY_LEN;
        Ok(ChunkEntry::decode(self.at(at..at + CHUNK_ENTRY_LEN)?))
    }

    fn paths(&self) -> Result<StringTable<'_>> {
        // Parsed successfully in `open`; parsed again (a few bounds checks) rather than
        // trusted, since a mapped file can still change under the map (cut short by another
        // process: it then reads as zeros).
        StringTable::parse(&self.b()[self.l.paths.clone()], "snapshot paths")
    }

    fn classes(&self) -> Result<StringTable<'_>> {
        StringTable::parse(&self.b()[self.l.classes.clone()], "snapshot classes")
    }

    /// Path of sample `id` (raw bytes, relative, `/`-separated).
    pub fn path(&self, id: u64) -> Result<&[u8]> {
        self.table_item(&self.l.paths, "snapshot paths", id)
    }

    /// Number of class names.
    pub fn class_count(&self) -> u64 {
        self.classes().map_or(0, |t| t.len())
    }

    /// Class name `label`.
    pub fn class_name(&self, label: u32) -> Result<&[u8]> {
        self.classes()?.get(label as u64)
    }

    /// Sample id whose path is exactly `path`, using the hash index (O(1) expected).
    pub fn lookup(&self, path: &[u8]) -> Result<Option<u64>> {
        if let (Some(_), Some(ix)) = (&self.pager, self.page_index.get()) {
            // Read in blocks, once a search or a listing has read the page index: one page
            // (likely held already, a listing's), instead of a slot of the hash index and the
            // candidate's path by id, each somewhere else in the snapshot.
            return self.lookup_in_pages(ix, path);
        }
        let h = path_hash(path);
        let tag = (h >> 32) as u32;
        let mask = self.l.hash_cap - 1;
        let slots = self.l.hash.start + 8;
        let mut i = h & mask;
        for _ in 0..self.l.hash_cap {
            let s = self.at(slots + i as usize * 8..slots + i as usize * 8 + 8)?;
            let id1 = le::u32_at(s, 0);
            if id1 == 0 {
                return Ok(None);
            }
            if le::u32_at(s, 4) == tag && self.path((id1 - 1) as u64)? == path {
                return Ok(Some((id1 - 1) as u64));
            }
            i = (i + 1) & mask;
        }
        Ok(None)
    }

    /// The sample id at position `pos` of the path-sorted order.
    pub fn sorted_id(&self, pos: u64) -> Result<u64> {
        if pos >= self.l.samples {
            return Err(FormatError::invalid(
                "path order",
                format!("{pos} out of range"),
            ));
        }
        let at = self.l.order.start + pos as usize * 4;
        let id = le::u32_at(self.at(at..at + 4)?, 0) as u64;
        if id >= self.l.samples {
            return Err(FormatError::invalid(
                "snapshot path order",
                format!("position {pos} holds sample id {id}, out of range"),
            ));
        }
        Ok(id)
    }

    /// Positions in the path-sorted order of every path starting with `prefix`: a binary
    /// search for the first, then [`Snapshot::prefix_end`] from there.
    pub fn prefix_range(&self, prefix: &[u8]) -> Result<Range<u64>> {
        let start = self.lower_bound(prefix)?;
        Ok(start..self.prefix_end(prefix, start)?)
    }

    /// The first position in the path order whose path is not less than `key`
    /// (`sample_count()` if there is none). With path pages (format 1.5): the index, then one
    /// page; otherwise a binary search of the path order.
    pub fn lower_bound(&self, key: &[u8]) -> Result<u64> {
        let Some(ix) = self.page_index()? else {
            return self.first_false(0, self.l.samples, |p| p < key);
        };
        if ix.is_empty() {
            return Ok(0);
        }
        let p = ix.page_for(key);
        let page = self.page(ix, p)?;
        Ok(ix.positions(p).start + page.partition_point(|e| e.path.as_slice() < key) as u64)
    }

    /// The sample whose path is `key`, from the path pages.
    fn lookup_in_pages(&self, ix: &PageIndex, key: &[u8]) -> Result<Option<u64>> {
        Ok(self.page_entry(ix, key)?.map(|e| e.id))
    }

    /// The page entry whose path is `key`.
    fn page_entry(&self, ix: &PageIndex, key: &[u8]) -> Result<Option<PathEntry>> {
        if ix.is_empty() {
            return Ok(None);
        }
        let page = self.page(ix, ix.page_for(key))?;
        Ok(page
            .binary_search_by(|e| e.path.as_slice().cmp(key))
            .ok()
            .map(|i| page[i].clone()))
    }

    /// Whether the snapshot's pages carry each file's size (and mode and mtime when
    /// recorded): listing pages, format 1.6. A listing then shows them from the pages
    /// ([`Snapshot::sorted_paths`]) without reading the sample table.
    pub fn pages_carry_stats(&self) -> bool {
        self.l
            .pages
            .as_ref()
            .is_some_and(|p| p.entries != PageEntries::Paths)
    }

    /// The sample whose path is `path`, with its size and mode and mtime. Read in blocks,
    /// with listing pages: the page index (read once) and one page, usually decoded already
    /// (a listing's); otherwise [`Snapshot::lookup`] and the sample's entries (held whole: a
    /// hash probe and two entries, cheaper than decoding a page for each random lookup).
    pub fn lookup_stat(&self, path: &[u8]) -> Result<Option<(u64, FileStat)>> {
        if self.pager.is_some() && self.pages_carry_stats() {
            if let Some(ix) = self.page_index()? {
                return Ok(self
                    .page_entry(ix, path)?
                    .map(|e| (e.id, e.stat.expect("listing pages carry stats"))));
            }
        }
        let Some(id) = self.lookup(path)? else {
            return Ok(None);
        };
        Ok(Some((id, self.stat(id)?)))
    }

    /// Sample `id`'s size and (when recorded) mode and mtime, from the sample table and kind 8.
    pub fn stat(&self, id: u64) -> Result<FileStat> {
        Ok(FileStat {
            size: self.sample(id)?.orig_len,
            attrs: self.attrs(id)?,
        })
    }

    /// Kind 17 (or 19), parsed and checked once (its bytes fetched whole), if the snapshot
    /// has pages.
    pub fn page_index(&self) -> Result<Option<&PageIndex>> {
        let Some(pl) = &self.l.pages else {
            return Ok(None);
        };
        if let Some(ix) = self.page_index.get() {
            return Ok(Some(ix));
        }
        let b = self.at(pl.index.clone())?;
        let ix = PageIndex::parse(b, pl.pages.len() as u64, self.l.samples, pl.entries)?;
        Ok(Some(self.page_index.get_or_init(|| ix)))
    }

    /// Page `p`'s entries (sample id, path), decoded and checked.
    fn page(&self, ix: &PageIndex, p: usize) -> Result<Arc<Page>> {
        let mut kept = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = kept.iter().position(|k| k.0 == p) {
            let k = kept.remove(i);
            kept.push(k.clone());
            return Ok(k.1);
        }
        drop(kept);
        let page = Arc::new(ix.decode(p, self.page_bytes(ix, p)?, self.l.samples)?);
        let mut kept = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= DECODED_PAGES {
            kept.remove(0);
        }
        kept.push((p, page.clone()));
        Ok(page)
    }

    /// Page `p`'s bytes, made present.
    fn page_bytes(&self, ix: &PageIndex, p: usize) -> Result<&[u8]> {
        let start = self.l.pages.as_ref().map_or(0, |pl| pl.pages.start);
        let r = ix.bytes(p);
        self.at(start + r.start as usize..start + r.end as usize)
    }

    /// The sample ids and paths at `positions` of the path order (clamped to it), and with
    /// listing pages (format 1.6) each file's stat. With pages: the pages holding them,
    /// fetched together; otherwise each position's id and path (fetched together first when
    /// the snapshot is read in blocks).
    pub fn sorted_paths(&self, positions: Range<u64>) -> Result<Vec<PathEntry>> {
        let n = self.l.samples;
        let (a, b) = (positions.start.min(n), positions.end.min(n));
        if a >= b {
            return Ok(Vec::new());
        }
        let Some(ix) = self.page_index()? else {
            self.prefetch_sorted_paths(a..b)?;
            return (a..b)
                .map(|pos| {
                    let id = self.sorted_id(pos)?;
                    Ok(PathEntry {
                        id,
                        path: self.path(id)?.to_vec(),
                        stat: None,
                    })
                })
                .collect();
        };
        let pages = ix.page_of(a)..ix.page_of(b - 1) + 1;
        if let (Some(pg), Some(pl)) = (&self.pager, &self.l.pages) {
            let r = pl.pages.start as u64;
            let (s, e) = (ix.bytes(pages.start).start, ix.bytes(pages.end - 1).end);
            pg.need(r + s..r + e)?;
        }
        let mut out = Vec::with_capacity((b - a) as usize);
        for p in pages {
            let at = ix.positions(p).start;
            let entries = self.page(ix, p)?;
            let (from, to) = (a.max(at) - at, b.min(ix.positions(p).end) - at);
            out.extend_from_slice(&entries[from as usize..to as usize]);
        }
        Ok(out)
    }

    /// The end of the run of paths starting with `prefix` that begins at position `from`:
    /// the first position from `from` on whose path does not start with `prefix` (`from`
    /// itself if its path does not). Gallops from `from`, then bisects: O(log run) paths
    /// read, most of them near `from`.
    pub fn prefix_end(&self, prefix: &[u8], from: u64) -> Result<u64> {
        let n = self.l.samples;
        if self.l.pages.is_some() {
            // Two searches of the pages: where the prefix's run starts and where the paths
            // greater than all of it start.
            let (start, end) = (
                self.lower_bound(prefix)?,
                match prefix_successor(prefix) {
                    Some(s) => self.lower_bound(&s)?,
                    None => n,
                },
            );
            return Ok(if (start..end).contains(&from) {
                end
            } else {
                from.min(n)
            });
        }
        let has =
            |pos: u64| -> Result<bool> { Ok(self.path(self.sorted_id(pos)?)?.starts_with(prefix)) };
        if from >= n || !has(from)? {
            return Ok(from.min(n));
        }
        // `lo` holds the prefix; `hi` does not (or is the end).
        let (mut lo, mut step) = (from, 1u64);
        let hi = loop {
            let probe = lo.saturating_add(step);
            if probe >= n {
                break n;
            }
            if !has(probe)? {
                break probe;
            }
            lo = probe;
            step = step.saturating_mul(2);
        };
        self.first_false(lo + 1, hi, |p| p.starts_with(prefix))
    }

    /// The first position in `lo..hi` of the path order whose path fails `holds` (`hi` if
    /// none), for a `holds` true on a prefix of the order: a binary search. (Searching with
    /// several probes fetched together per round took more time on the S3 test server, not
    /// less: 117 GETs in 2.9-4.1 s against 55 GETs in 1.7 s at 10 M samples.)
    fn first_false(&self, mut lo: u64, mut hi: u64, holds: impl Fn(&[u8]) -> bool) -> Result<u64> {
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if holds(self.path(self.sorted_id(mid)?)?) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// Makes the sample entries (and file attributes, if recorded) of `ids` present at once,
    /// as attributes of a listing's files read them. Paged, when there are at least one id
    /// for every 4 blocks of the sample table (entries are by id, so a directory's are
    /// scattered and the listing would touch most blocks anyway) the tables are fetched
    /// whole, in large GETs; otherwise each entry's block, together. Ids past the end are
    /// left out (their reads report them).
    pub fn prefetch_samples_at(&self, ids: &[u64]) -> Result<()> {
        let (Some(p), Some(bi)) = (&self.pager, &self.l.blocks) else {
            return Ok(());
        };
        let r = |x: &Range<usize>| x.start as u64..x.end as u64;
        let blocks = (self.l.sample_tab.len() as u64).div_ceil(bi.block_size);
        if (ids.len() as u64).saturating_mul(4) >= blocks {
            let mut v = vec![r(&self.l.sample_tab)];
            v.extend(self.l.attrs.as_ref().map(r));
            return p.need_all(&v);
        }
        let mut v = Vec::with_capacity(ids.len() * 2);
        for &id in ids.iter().filter(|&&id| id < self.l.samples) {
            let s = self.l.sample_tab.start as u64 + id * SAMPLE_ENTRY_LEN as u64;
            v.push(s..s + SAMPLE_ENTRY_LEN as u64);
            if let Some(a) = &self.l.attrs {
                let s = a.start as u64 + id * ATTRS_LEN as u64;
                v.push(s..s + ATTRS_LEN as u64);
            }
        }
        p.need_all(&v)
    }

    /// Before a listing of `positions` of the path order: if the snapshot is paged and the
    /// listing would touch most blocks of the paths anyway (a position for every 4 blocks or
    /// more: paths are stored by sample id, so one directory's are scattered), fetches every
    /// path and the path order at once, in large GETs ([`Snapshot::prefetch_paths`]). Returns
    /// whether it did.
    pub fn prefetch_for_listing(&self, positions: Range<u64>) -> Result<bool> {
        let Some(bi) = self.l.blocks.as_ref().filter(|_| self.pager.is_some()) else {
            return Ok(false);
        };
        if self.l.pages.is_some() {
            // A listing reads contiguous pages instead.
            return Ok(false);
        }
        let blocks = (self.l.paths.len() as u64).div_ceil(bi.block_size);
        let whole = (positions.end.saturating_sub(positions.start)).saturating_mul(4) >= blocks;
        if whole {
            self.prefetch_paths()?;
        }
        Ok(whole)
    }

    /// Makes the paths at positions `positions` of the path order present at once (what a
    /// listing of those positions reads): the order's entries, then the paths' offsets, then
    /// their bytes, each step's pieces fetched together. Nothing for a snapshot held whole.
    fn prefetch_sorted_paths(&self, positions: Range<u64>) -> Result<()> {
        let Some(p) = &self.pager else {
            return Ok(());
        };
        let n = self.l.samples;
        let (a, b) = (positions.start.min(n), positions.end.min(n));
        if a >= b {
            return Ok(());
        }
        let order = self.l.order.start as u64;
        p.need(order + a * 4..order + b * 4)?;
        let t = self.table(&self.l.paths, "snapshot paths")?;
        let r = &self.l.paths;
        let ids: Vec<u64> = (a..b)
            .map(|pos| self.sorted_id(pos))
            .collect::<Result<_>>()?;
        let offsets: Vec<Range<u64>> = ids
            .iter()
            .filter(|&&id| id < t.len())
            .map(|&id| {
                let w = (r.start + 8) as u64 + id * 8;
                w..w + 16
            })
            .collect();
        p.need_all(&offsets)?;
        let blob = (r.start + 16) as u64 + t.len() * 8;
        let bytes: Vec<Range<u64>> = offsets
            .iter()
            .filter_map(|w| {
                let (s, e) = (
                    le::u64_at(self.b(), w.start as usize),
                    le::u64_at(self.b(), w.start as usize + 8),
                );
                (s <= e && e <= (r.end as u64).saturating_sub(blob)).then(|| blob + s..blob + e)
            })
            .collect();
        p.need_all(&bytes)
    }

    /// Checks the CRC of every section (known or not) and that every byte outside the header,
    /// the section table and the sections (alignment padding) is zero. Returns every problem.
    pub fn check_sections(&self) -> Vec<FormatError> {
        if let Err(e) = self.need(0..self.b().len()) {
            return vec![e];
        }
        let mut errs: Vec<FormatError> = self
            .l
            .sections
            .iter()
            .filter_map(|s| {
                let data = &self.b()[s.offset as usize..(s.offset + s.len) as usize];
                check_crc(section_name(s.kind), s.crc, data).err()
            })
            .collect();
        let mut covered: Vec<(u64, u64)> = self
            .l
            .sections
            .iter()
            .map(|s| (s.offset, s.offset + s.len))
            .collect();
        covered.sort_unstable();
        let mut at = (SNAPSHOT_HEADER_LEN + self.l.sections.len() * SECTION_ENTRY_LEN) as u64;
        covered.push((self.b().len() as u64, self.b().len() as u64));
        for (start, end) in covered {
            if start < at {
                errs.push(FormatError::invalid(
                    "snapshot section table",
                    format!("sections overlap at byte {start}"),
                ));
            } else if let Some(p) = self.b()[at as usize..start as usize]
                .iter()
                .position(|&x| x != 0)
            {
                errs.push(FormatError::invalid(
                    "snapshot padding",
                    format!("non-zero byte at offset {}", at + p as u64),
                ));
            }
            at = at.max(end);
        }
        if let Some(e) = self.l.blocks.as_ref().and_then(|b| b.check(self.b()).err()) {
            errs.push(e);
        }
        errs
    }

    /// Full structural check (O(n)): chunk ids dense, sample ranges contiguous and covering,
    /// records back to back inside their chunk, valid compression, labels and paths, a unique
    /// path per sample found by the index, and a sorted path order. At most `limit` problems
    /// are returned.
    pub fn check_structure(&self, limit: usize) -> Vec<FormatError> {
        if let Err(e) = self.need(0..self.b().len()) {
            return vec![e];
        }
        let mut errs = Vec::new();
        let mut push = |e: FormatError| {
            if errs.len() < limit {
                errs.push(e)
            }
        };
        let classes = self.class_count();
        if let Err(e) = self.classes().and_then(|t| t.validate()) {
            push(e);
        }
        if let Err(e) = self.paths().and_then(|t| t.validate()) {
            push(e);
            return errs;
        }
        let mut next_sample = 0u64;
        for c in 0..self.l.chunks {
            let ce = match self.chunk(c) {
                Ok(ce) => ce,
                Err(e) => {
                    push(e);
                    continue;
                }
            };
            let what = || format!("snapshot chunk table entry {c}");
            if ce.chunk_id as u64 != c {
                push(FormatError::invalid(
                    what(),
                    format!("has chunk id {}", ce.chunk_id),
                ));
            }
            if ce.first_sample != next_sample {
                push(FormatError::invalid(
                    what(),
                    format!(
                        "starts at sample {}, expected {next_sample}",
                        ce.first_sample
                    ),
                ));
            }
            next_sample = ce.first_sample.saturating_add(ce.sample_count);
            let records_end = ce.file_size.saturating_sub(CHUNK_TRAILER_LEN as u64);
            let mut expect_off = CHUNK_HEADER_LEN as u64;
            for id in ce.samples() {
                let Ok(e) = self.sample(id) else {
                    push(FormatError::invalid(
                        what(),
                        format!("sample {id} out of range"),
                    ));
                    break;
                };
                let swhat = || format!("snapshot sample {id}");
                if e.chunk != ce.chunk_id {
                    push(FormatError::invalid(
                        swhat(),
                        format!("names chunk {}", e.chunk),
                    ));
                }
                if let Err(err) = e.compression().and_then(|_| e.check_lengths()) {
                    push(FormatError::invalid(swhat(), err.to_string()));
                }
                if e.offset != expect_off
                    || e.offset
                        .checked_add(e.stored_len)
                        .is_none_or(|end| end > records_end)
                {
                    push(FormatError::invalid(
                        swhat(),
                        format!(
                            "record at {}+{} is not where chunk {} expects it ({expect_off})",
                            e.offset, e.stored_len, ce.chunk_id
                        ),
                    ));
                }
                expect_off = e.offset.saturating_add(e.stored_len);
                if e.label != NO_LABEL && e.label as u64 >= classes {
                    push(FormatError::invalid(
                        swhat(),
                        format!("label {} but only {classes} classes", e.label),
                    ));
                }
            }
        }
        if next_sample != self.l.samples {
            push(FormatError::invalid(
                "snapshot chunk table",
                format!(
                    "chunks cover {next_sample} samples, header says {}",
                    self.l.samples
                ),
            ));
        }
        let mut prev: Option<&[u8]> = None;
        let mut seen = vec![false; self.l.samples as usize];
        for pos in 0..self.l.samples {
            let id = match self.sorted_id(pos) {
                Ok(id) => id,
                Err(e) => {
                    push(e);
                    continue;
                }
            };
            if std::mem::replace(&mut seen[id as usize], true) {
                push(FormatError::invalid(
                    "snapshot path order",
                    format!("sample {id} listed twice"),
                ));
            }
            let Ok(p) = self.path(id) else { continue };
            if let Err(why) = crate::check_relative_path(p) {
                push(FormatError::invalid(
                    format!("snapshot path of sample {id}"),
                    format!("{why}: {}", String::from_utf8_lossy(p)),
                ));
            }
            if prev.is_some_and(|q| q >= p) {
                push(FormatError::invalid(
                    "snapshot path order",
                    format!("not strictly sorted at position {pos} (sample {id})"),
                ));
            }
            prev = Some(p);
            match self.lookup(p) {
                Ok(Some(found)) if found == id => {}
                Ok(other) => push(FormatError::invalid(
                    "snapshot path index",
                    format!("path of sample {id} resolves to {other:?}"),
                )),
                Err(e) => push(e),
            }
        }
        self.check_optional(&mut push);
        self.check_pages(&mut push);
        errs
    }

    /// [`Snapshot::check_structure`] for the pages (format 1.5 and 1.6): the index and every
    /// page check, and together the pages list exactly the path order's ids and paths (and,
    /// listing pages, each sample's size, mode and mtime).
    fn check_pages(&self, push: &mut impl FnMut(FormatError)) {
        let ix = match self.page_index() {
            Ok(Some(ix)) => ix,
            Ok(None) => return,
            Err(e) => return push(e),
        };
        for p in 0..ix.len() {
            let b = match self.page_bytes(ix, p) {
                Ok(b) => b,
                Err(e) => return push(e),
            };
            let mut pos = ix.positions(p).start;
            let mut wrong = None;
            let walked = ix.walk(p, b, self.l.samples, |id, path, stat| {
                let want = self.sorted_id(pos).and_then(|i| Ok((i, self.path(i)?)));
                let stat_ok = stat.is_none_or(|s| self.stat(id).is_ok_and(|t| t == s));
                if !want.is_ok_and(|w| w.0 == id && w.1 == path) || !stat_ok {
                    wrong = Some((pos, id));
                    return false;
                }
                pos += 1;
                true
            });
            match (walked, wrong) {
                (Err(e), _) => push(e),
                (_, Some((pos, id))) => push(FormatError::invalid(
                    ix.entries().names().0,
                    format!(
                        "position {pos} holds sample {id}, not the path order's, \
                         or not that sample's size, mode or mtime"
                    ),
                )),
                _ => {}
            }
        }
    }

    /// [`Snapshot::check_structure`] for the fields (format 1.3): names valid, sorted and
    /// distinct; every sample a field group whose fields decode, name known names, each once,
    /// and add up to its record; keys valid for fields.
    fn check_fields(&self, push: &mut impl FnMut(FormatError)) {
        let Some(f) = &self.l.fields else {
            for id in 0..self.l.samples {
                if self.sample(id).is_ok_and(|e| e.has_fields()) {
                    push(FormatError::invalid(
                        format!("snapshot sample {id}"),
                        "is a field group, but the snapshot has no fields sections",
                    ));
                }
            }
            return;
        };
        let names = match self.field_names() {
            Ok(n) => n,
            Err(e) => return push(e),
        };
        for (i, n) in names.iter().enumerate() {
            if let Err(why) = crate::check_field_name(n) {
                push(FormatError::invalid(
                    format!("snapshot field name {i}"),
                    why,
                ));
            }
            if i > 0 && names[i - 1] >= *n {
                push(FormatError::invalid(
                    "snapshot field names",
                    "not sorted and distinct",
                ));
            }
        }
        if le::u64_at(self.b(), f.index.start) != 0 {
            push(FormatError::invalid(
                "snapshot field index",
                "does not start at 0",
            ));
        }
        for id in 0..self.l.samples {
            let what = || format!("snapshot sample {id}");
            let (Ok(e), Ok(fields)) = (self.sample(id), self.field_entries(id)) else {
                push(FormatError::invalid(what(), "its fields cannot be read"));
                continue;
            };
            if let Err(err) = crate::chunk::check_group(&e, &fields) {
                push(FormatError::invalid(what(), err.to_string()));
            }
            let mut seen: Vec<u32> = fields.iter().map(|f| f.name).collect();
            seen.sort_unstable();
            if seen.windows(2).any(|w| w[0] == w[1])
                || seen.last().is_some_and(|&n| n as usize >= names.len())
            {
                push(FormatError::invalid(
                    what(),
                    "names a field twice or an unknown field",
                ));
            }
            if let Ok(p) = self.path(id) {
                if let Err(why) = crate::check_field_key(p) {
                    push(FormatError::invalid(what(), why));
                }
            }
        }
    }

    /// [`Snapshot::check_structure`] for the optional sections: every file attribute decodes;
    /// directories are valid paths, strictly sorted, none a sample's path.
    fn check_optional(&self, push: &mut impl FnMut(FormatError)) {
        self.check_fields(push);
        if self.has_attrs() {
            for id in 0..self.l.samples {
                if let Err(e) = self.attrs(id) {
                    push(FormatError::invalid(
                        format!("attributes of sample {id}"),
                        e.to_string(),
                    ));
                }
            }
        }
        if let Some((names, _)) = &self.l.dirs {
            match StringTable::parse(&self.b()[names.clone()], "snapshot directories")
                .and_then(|t| t.validate())
            {
                Err(e) => push(e),
                Ok(()) => {
                    let mut prev: Option<&[u8]> = None;
                    for i in 0..self.l.dir_count {
                        match self.dir(i) {
                            Err(e) => push(e),
                            Ok((d, _)) => {
                                if let Err(why) = crate::check_relative_path(d) {
                                    push(FormatError::invalid(
                                        format!("snapshot directory {i}"),
                                        format!("{why}: {}", String::from_utf8_lossy(d)),
                                    ));
                                }
                                if prev.is_some_and(|q| q >= d) {
                                    push(FormatError::invalid(
                                        "snapshot directories",
                                        format!("not strictly sorted at {i}"),
                                    ));
                                }
                                if let Ok(Some(id)) = self.lookup(d) {
                                    push(FormatError::invalid(
                                        format!("snapshot directory {i}"),
                                        format!("is also the path of sample {id}"),
                                    ));
                                }
                                prev = Some(d);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The capacity of the path index at `hash` in snapshot `b` of `samples` samples: a power of
/// two above `samples`, and the section sized for it.
fn path_index_capacity(b: &[u8], hash: &Range<usize>, samples: u64) -> Result<u64> {
    if hash.len() < 8 {
        return Err(FormatError::truncated(
            "snapshot path index",
            8,
            hash.len() as u64,
        ));
    }
    let cap = le::u64_at(b, hash.start);
    if !cap.is_power_of_two() || cap < samples.saturating_add(1) {
        return Err(FormatError::invalid(
            "snapshot path index",
            format!("capacity {cap} is not a power of two above {samples}"),
        ));
    }
    let want = cap
        .checked_mul(8)
        .and_then(|x| x.checked_add(8))
        .unwrap_or(u64::MAX);
    expect_len("snapshot path index", hash, want)?;
    Ok(cap)
}

/// What a snapshot's optional sections say (kinds 7 to 10), checked for size.
struct Optional {
    lineage: Lineage,
    attrs: Option<Range<usize>>,
    dirs: Option<(Range<usize>, Range<usize>)>,
    dir_count: u64,
}

fn expect_len(what: &'static str, r: &Range<usize>, want: u64) -> Result<()> {
    if r.len() as u64 != want {
        return Err(FormatError::invalid(
            what,
            format!("section is {} bytes, expected {want}", r.len()),
        ));
    }
    Ok(())
}

/// The optional sections among `found` (indexed by kind - 1) of snapshot `b` of `samples`
/// samples: sizes checked (O(1)), the lineage decoded.
fn optional_sections(
    b: &[u8],
    need: Need,
    found: &mut [Option<Range<usize>>],
    samples: u64,
) -> Result<Optional> {
    let lineage = match found[SectionKind::Lineage as usize - 1].take() {
        None => Lineage::default(),
        Some(r) => {
            expect_len("snapshot lineage", &r, LINEAGE_LEN as u64)?;
            need(r.clone())?;
            let l = &b[r];
            if le::u32_at(l, 12) != 0 {
                return Err(FormatError::invalid(
                    "snapshot lineage",
                    "reserved field is not zero",
                ));
            }
            Lineage {
                generation: le::u64_at(l, 0),
                parent: le::u32_at(l, 8),
            }
        }
    };
    let attrs = found[SectionKind::FileAttrs as usize - 1].take();
    if let Some(r) = &attrs {
        expect_len("snapshot file attributes", r, samples * ATTRS_LEN as u64)?;
    }
    let (dirs, dir_count) = match (
        found[SectionKind::Dirs as usize - 1].take(),
        found[SectionKind::DirAttrs as usize - 1].take(),
    ) {
        (None, None) => (None, 0),
        (Some(names), Some(da)) => {
            need_table(b, need, &names)?;
            let n = StringTable::parse(&b[names.clone()], "snapshot directories")?.len();
            expect_len(
                "snapshot directory attributes",
                &da,
                n.saturating_mul(ATTRS_LEN as u64),
            )?;
            (Some((names, da)), n)
        }
        _ => {
            return Err(FormatError::invalid(
                "snapshot section table",
                "the directories (kind 9) and their attributes (kind 10) come together",
            ))
        }
    };
    Ok(Optional {
        lineage,
        attrs,
        dirs,
        dir_count,
    })
}

/// The fields sections (kinds 11 to 13, all or none) of snapshot `b` of `samples` samples:
/// sizes checked, and the index's ends (O(1)).
fn fields_sections(
    b: &[u8],
    need: Need,
    found: &mut [Option<Range<usize>>],
    samples: u64,
) -> Result<Option<FieldsLayout>> {
    let (names, index, table) = match (
        found[SectionKind::FieldNames as usize - 1].take(),
        found[SectionKind::FieldIndex as usize - 1].take(),
        found[SectionKind::Fields as usize - 1].take(),
    ) {
        (None, None, None) => return Ok(None),
        (Some(n), Some(i), Some(t)) => (n, i, t),
        _ => {
            return Err(FormatError::invalid(
                "snapshot section table",
                "the field names, field index and fields (kinds 11, 12, 13) come together",
            ))
        }
    };
    need(names.clone())?;
    let name_count = StringTable::parse(&b[names.clone()], "snapshot field names")?.len();
    expect_len(
        "snapshot field index",
        &index,
        samples.saturating_add(1).saturating_mul(8),
    )?;
    if table.len() % FIELD_ENTRY_LEN != 0 {
        return Err(FormatError::invalid(
            "snapshot fields",
            format!(
                "section is {} bytes, not a multiple of {FIELD_ENTRY_LEN}",
                table.len()
            ),
        ));
    }
    let entries = (table.len() / FIELD_ENTRY_LEN) as u64;
    need(index.start..index.start + 8)?;
    need(index.end - 8..index.end)?;
    let last = le::u64_at(b, index.end - 8);
    if le::u64_at(b, index.start) != 0 || last != entries {
        return Err(FormatError::invalid(
            "snapshot field index",
            format!("runs to {last}, but there are {entries} fields"),
        ));
    }
    Ok(Some(FieldsLayout {
        names,
        index,
        table,
        name_count,
        entries,
    }))
}

/// The block checksum sections (kinds 14 and 15, both or neither, the last two sections of
/// the file): kind 15 read whole and checked against the section table (O(size of kind 15)).
fn block_sections(
    b: &[u8],
    need: Need,
    found: &mut [Option<Range<usize>>],
    sections: &[Section],
    table_end: usize,
) -> Result<Option<BlockIndex>> {
    let (crcs, index) = match (
        found[SectionKind::BlockCrcs as usize - 1].take(),
        found[SectionKind::BlockIndex as usize - 1].take(),
    ) {
        (None, None) => return Ok(None),
        (Some(c), Some(i)) => (c, i),
        _ => {
            return Err(FormatError::invalid(
                "snapshot section table",
                "the block checksums and their index (kinds 14 and 15) come together",
            ))
        }
    };
    let others_end = sections
        .iter()
        .filter(|s| {
            s.kind != SectionKind::BlockCrcs as u32 && s.kind != SectionKind::BlockIndex as u32
        })
        .map(|s| s.offset + s.len)
        .max()
        .unwrap_or(0);
    if (crcs.start as u64) < others_end || index.start < crcs.end {
        return Err(FormatError::invalid(
            "snapshot section table",
            "the block checksums and their index (kinds 14, 15) must be the last sections, in that order",
        ));
    }
    need(index.clone())?;
    let crc = sections
        .iter()
        .find(|s| s.kind == SectionKind::BlockIndex as u32)
        .map_or(0, |s| s.crc);
    check_crc("snapshot block index", crc, &b[index.clone()])?;
    BlockIndex::parse(
        &b[index],
        crcs.start as u64..crcs.end as u64,
        table_end as u64,
    )
    .map(Some)
}

/// The chunk table's promise that every plan and reader relies on, checked at open in O(chunks)
/// whatever the section CRCs say: entry `i` is chunk `i`, and the chunks' sample ranges are
/// contiguous from sample 0 and cover exactly the `samples` of the header (so no count read
/// from the table can exceed the sample table, which is sized for the file).
fn check_chunk_ranges(tab: &[u8], samples: u64) -> Result<()> {
    let mut next = 0u64;
    for (i, e) in tab.chunks_exact(CHUNK_ENTRY_LEN).enumerate() {
        let ce = ChunkEntry::decode(e);
        let what = || format!("snapshot chunk table entry {i}");
        if ce.chunk_id as usize != i {
            return Err(FormatError::invalid(
                what(),
                format!("has chunk id {}", ce.chunk_id),
            ));
        }
        if ce.first_sample != next {
            return Err(FormatError::invalid(
                what(),
                format!("starts at sample {}, expected {next}", ce.first_sample),
            ));
        }
        next = match ce.first_sample.checked_add(ce.sample_count) {
            Some(end) if end <= samples => end,
            _ => {
                return Err(FormatError::invalid(
                    what(),
                    format!(
                        "holds samples {}+{}, beyond the {samples} samples of the header",
                        ce.first_sample, ce.sample_count
                    ),
                ))
            }
        };
    }
    if next != samples {
        return Err(FormatError::invalid(
            "snapshot chunk table",
            format!("chunks cover {next} samples, header says {samples}"),
        ));
    }
    Ok(())
}

/// The snapshot header for `dataset_id` at minor version `minor`, with (samples, chunks,
/// sections) `counts` and section table `table`.
fn snapshot_header(
    dataset_id: [u8; 16],
    minor: u16,
    counts: (u64, u64, u32),
    table: &[u8],
) -> [u8; SNAPSHOT_HEADER_LEN] {
    let mut h = [0u8; SNAPSHOT_HEADER_LEN];
    h[0..8].copy_from_slice(&SNAPSHOT_MAGIC);
    h[8..10].copy_from_slice(&FORMAT_MAJOR.to_le_bytes());
    h[10..12].copy_from_slice(&minor.to_le_bytes());
    h[12..16].copy_from_slice(&(SNAPSHOT_HEADER_LEN as u32).to_le_bytes());
    h[16..32].copy_from_slice(&dataset_id);
    h[32..40].copy_from_slice(&counts.0.to_le_bytes());
    h[40..48].copy_from_slice(&counts.1.to_le_bytes());
    h[48..52].copy_from_slice(&counts.2.to_le_bytes());
    h[52..56].copy_from_slice(&crc32fast::hash(table).to_le_bytes());
    let crc = crc32fast::hash(&h[0..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The least byte string greater than every string starting with `prefix` (`None` when
/// there is none: `prefix` empty or all 0xff).
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let keep = prefix.iter().rposition(|&b| b != 0xff)?;
    let mut s = prefix[..=keep].to_vec();
    s[keep] += 1;
    Some(s)
}

/// Kinds 16 and 17, or 18 and 19, if present: each pair both or neither, at most one pair,
/// the index sized for the pages it declares (O(1); the index itself is checked when first
/// used). Listing pages' entries carry mode and mtime when the snapshot has kind 8 (`attrs`).
fn page_sections(
    b: &[u8],
    need: Need,
    found: &mut [Option<Range<usize>>],
    samples: u64,
    attrs: bool,
) -> Result<Option<PagesLayout>> {
    let mut take = |pages: SectionKind, index: SectionKind| match (
        found[pages as usize - 1].take(),
        found[index as usize - 1].take(),
    ) {
        (None, None) => Ok(None),
        (Some(pages), Some(index)) => Ok(Some((pages, index))),
        _ => Err(FormatError::invalid(
            "snapshot section table",
            format!(
                "pages and their index (kinds {} and {}) come together",
                pages as u32, index as u32
            ),
        )),
    };
    let paths = take(SectionKind::PathPages, SectionKind::PathPageIndex)?;
    let listing = take(SectionKind::ListingPages, SectionKind::ListingPageIndex)?;
    let (pages, index, entries) = match (paths, listing) {
        (None, None) => return Ok(None),
        (Some((p, i)), None) => (p, i, PageEntries::Paths),
        (None, Some((p, i))) => (
            p,
            i,
            match attrs {
                true => PageEntries::SizesAndAttrs,
                false => PageEntries::Sizes,
            },
        ),
        (Some(_), Some(_)) => {
            return Err(FormatError::invalid(
                "snapshot section table",
                "both path pages (kinds 16, 17) and listing pages (kinds 18, 19)",
            ))
        }
    };
    need(index.start..(index.start + 8).min(index.end))?;
    crate::pages::declared_pages(&b[index.clone()], samples, entries)?;
    Ok(Some(PagesLayout {
        pages,
        index,
        entries,
    }))
}

fn section_name(kind: u32) -> String {
    match kind {
        1 => "snapshot chunk table".into(),
        2 => "snapshot sample table".into(),
        3 => "snapshot paths".into(),
        4 => "snapshot path index".into(),
        5 => "snapshot path order".into(),
        6 => "snapshot classes".into(),
        7 => "snapshot lineage".into(),
        8 => "snapshot file attributes".into(),
        9 => "snapshot directories".into(),
        10 => "snapshot directory attributes".into(),
        11 => "snapshot field names".into(),
        12 => "snapshot field index".into(),
        13 => "snapshot fields".into(),
        14 => "snapshot block checksums".into(),
        15 => "snapshot block index".into(),
        16 => "snapshot path pages".into(),
        17 => "snapshot path page index".into(),
        18 => "snapshot listing pages".into(),
        19 => "snapshot listing page index".into(),
        k => format!("snapshot section of kind {k}"),
    }
}

/// Hands `items` to `f` in pieces of about 64 KiB (a section written without being assembled
/// in memory first).
fn in_pieces<T: AsRef<[u8]>>(
    f: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    items: impl Iterator<Item = T>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64 << 10);
    for item in items {
        buf.extend_from_slice(item.as_ref());
        if buf.len() >= 64 << 10 {
            f(&buf)?;
            buf.clear();
        }
    }
    f(&buf)
}

/// A section table entry.
fn section_entry(kind: SectionKind, at: u64, len: u64, crc: u32) -> [u8; SECTION_ENTRY_LEN] {
    let mut e = [0u8; SECTION_ENTRY_LEN];
    e[0..4].copy_from_slice(&(kind as u32).to_le_bytes());
    e[8..16].copy_from_slice(&at.to_le_bytes());
    e[16..24].copy_from_slice(&len.to_le_bytes());
    e[24..28].copy_from_slice(&crc.to_le_bytes());
    e
}

/// Writes the zeros that bring `pos` to a multiple of 8.
fn pad8(w: &mut impl std::io::Write, pos: &mut u64) -> std::io::Result<()> {
    let pad = le::align8(*pos) - *pos;
    w.write_all(&[0u8; 8][..pad as usize])?;
    *pos += pad;
    Ok(())
}

/// Builds a snapshot from finished chunks, in chunk id order.
///
/// Memory: the builder keeps every path (the path index needs them all) and, unless they are
/// spooled to a file ([`SnapshotBuilder::spool_samples`]), every sample entry (spooled, their
/// original lengths: 8 bytes a sample, for the listing pages).
pub struct SnapshotBuilder {
    dataset_id: [u8; 16],
    classes: Vec<Vec<u8>>,
    chunks: Vec<ChunkEntry>,
    /// Sample entries, when they are not spooled.
    samples: Vec<SampleEntry>,
    /// Encoded sample entries, in order, when they are spooled to a file.
    spool: Option<std::io::BufWriter<std::fs::File>>,
    sample_count: u64,
    path_blob: Vec<u8>,
    path_ends: Vec<u64>,
    lineage: Lineage,
    /// File attributes in sample order (all samples' or none).
    attrs: Vec<FileAttrs>,
    /// Directories and their attributes.
    dirs: Vec<(Vec<u8>, FileAttrs)>,
    /// Whether the samples so far have fields (all or none do), once known.
    with_fields: Option<bool>,
    /// Field names in the order first seen, and their ids.
    field_ids: std::collections::HashMap<Vec<u8>, u32>,
    field_names: Vec<Vec<u8>>,
    /// Field entries (names as ids of `field_names`) and each sample's count.
    field_entries: Vec<FieldEntry>,
    field_counts: Vec<u32>,
    /// Original lengths of the samples, in order, when their entries are spooled (listing
    /// pages carry them in path order).
    spooled_sizes: Vec<u64>,
    /// Which pages to write.
    pages: BuiltPages,
}

/// The pages a [`SnapshotBuilder`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BuiltPages {
    /// None: format 1.4.
    None,
    /// Path pages (kinds 16, 17): format 1.5.
    Paths,
    /// Listing pages (kinds 18, 19): format 1.6.
    Listing,
}

impl SnapshotBuilder {
    /// A builder for dataset `dataset_id` with the given class names.
    pub fn new(dataset_id: [u8; 16], classes: Vec<Vec<u8>>) -> Self {
        SnapshotBuilder {
            dataset_id,
            classes,
            chunks: Vec::new(),
            samples: Vec::new(),
            spool: None,
            sample_count: 0,
            path_blob: Vec::new(),
            path_ends: Vec::new(),
            lineage: Lineage::default(),
            attrs: Vec::new(),
            dirs: Vec::new(),
            with_fields: None,
            field_ids: std::collections::HashMap::new(),
            field_names: Vec::new(),
            field_entries: Vec::new(),
            field_counts: Vec::new(),
            spooled_sizes: Vec::new(),
            pages: BuiltPages::Listing,
        }
    }

    /// Writes the snapshot without pages, as format 1.4 did: what tests of readers of older
    /// snapshots build.
    pub fn without_path_pages(&mut self) {
        self.pages = BuiltPages::None;
    }

    /// Writes path pages without sizes, modes and mtimes (kinds 16 and 17), as format 1.5
    /// did: what tests of readers of older snapshots build.
    pub fn with_plain_path_pages(&mut self) {
        self.pages = BuiltPages::Paths;
    }

    /// Adds the attributes of the next samples, in sample order. Either every sample gets
    /// attributes (the snapshot is then format 1.2, with kind 8) or none does.
    pub fn push_attrs(&mut self, a: &[FileAttrs]) {
        self.attrs.extend_from_slice(a);
    }

    /// Records the directories of the packed tree (any order; each path once), empty ones
    /// included: the snapshot is then format 1.2, with kinds 9 and 10.
    pub fn dirs(&mut self, dirs: Vec<(Vec<u8>, FileAttrs)>) {
        self.dirs = dirs;
    }

    /// Records the snapshot's lineage. A generation above 0 adds the lineage section and makes
    /// the file format 1.1 (1.0 readers ignore the section).
    pub fn lineage(&mut self, l: Lineage) {
        self.lineage = l;
    }

    /// Keeps the sample table (40 bytes per sample) in `file` instead of in memory: what a
    /// pack of many millions of files uses to stay small. `file` must be empty, readable and
    /// writable (an unnamed temporary file is best). Call before the first chunk.
    pub fn spool_samples(&mut self, file: std::fs::File) -> Result<()> {
        if self.sample_count > 0 {
            return Err(FormatError::invalid(
                "snapshot builder",
                "samples can be spooled only before the first chunk",
            ));
        }
        self.spool = Some(std::io::BufWriter::with_capacity(1 << 20, file));
        Ok(())
    }

    /// Adds the next chunk. Chunks must arrive with ids 0, 1, 2, ...
    pub fn push_chunk(&mut self, c: &ChunkSummary) -> Result<()> {
        if c.chunk_id as usize != self.chunks.len() {
            return Err(FormatError::invalid(
                "snapshot builder",
                format!(
                    "chunk {} added where chunk {} belongs",
                    c.chunk_id,
                    self.chunks.len()
                ),
            ));
        }
        if c.entries.len() != c.paths.len()
            || c.fields
                .as_ref()
                .is_some_and(|f| f.records.len() != c.entries.len())
        {
            return Err(FormatError::invalid(
                "snapshot builder",
                "entries, paths and fields differ",
            ));
        }
        if !c.entries.is_empty() {
            let has = c.fields.is_some();
            if *self.with_fields.get_or_insert(has) != has {
                return Err(FormatError::invalid(
                    "snapshot builder",
                    format!(
                        "chunk {} {} fields but earlier ones {}: a dataset's samples all have fields or none do",
                        c.chunk_id,
                        if has { "has" } else { "has no" },
                        if has { "had none" } else { "had" },
                    ),
                ));
            }
        }
        if let Some(f) = &c.fields {
            for r in &f.records {
                for e in r {
                    let name = f.names.get(e.name as usize).ok_or_else(|| {
                        FormatError::invalid("snapshot builder", "a field names no known name")
                    })?;
                    let next = self.field_names.len() as u32;
                    let id = *self.field_ids.entry(name.clone()).or_insert(next);
                    if id == next {
                        self.field_names.push(name.clone());
                    }
                    self.field_entries.push(FieldEntry { name: id, ..*e });
                }
                self.field_counts.push(r.len() as u32);
            }
        }
        self.chunks.push(ChunkEntry {
            chunk_id: c.chunk_id,
            file_size: c.file_size,
            first_sample: self.sample_count,
            sample_count: c.entries.len() as u64,
            file_crc: c.file_crc,
        });
        for (e, p) in c.entries.iter().zip(&c.paths) {
            crate::check_relative_path(p).map_err(|why| {
                FormatError::invalid(
                    format!("path {}", String::from_utf8_lossy(p)),
                    why.to_string(),
                )
            })?;
            match &mut self.spool {
                None => self.samples.push(*e),
                Some(w) => {
                    use std::io::Write;
                    w.write_all(&e.encode()).map_err(|e| {
                        FormatError::invalid(
                            "snapshot builder",
                            format!("spooling sample entries: {e}"),
                        )
                    })?;
                    self.spooled_sizes.push(e.orig_len);
                }
            }
            self.sample_count += 1;
            self.path_blob.extend_from_slice(p);
            self.path_ends.push(self.path_blob.len() as u64);
        }
        if self.sample_count > MAX_SAMPLES {
            return Err(FormatError::invalid(
                "snapshot builder",
                format!("more than {MAX_SAMPLES} samples"),
            ));
        }
        Ok(())
    }

    /// Sample `i`'s size, mode and mtime, as listing pages carry them.
    fn stat(&self, i: usize) -> FileStat {
        // Spooled entries are not in `samples` (and `spool` is taken by the time the pages
        // are written).
        let size = match self.spooled_sizes.get(i) {
            Some(&size) => size,
            None => self.samples[i].orig_len,
        };
        FileStat {
            size,
            attrs: self.attrs.get(i).copied(),
        }
    }

    fn path(&self, i: usize) -> &[u8] {
        let start = if i == 0 {
            0
        } else {
            self.path_ends[i - 1] as usize
        };
        &self.path_blob[start..self.path_ends[i] as usize]
    }

    /// Checks the attributes (one per sample or none, modes within `0o7777`) and sorts and
    /// checks the directories (valid paths, each once), for `n` samples.
    fn check_metadata(&mut self, n: usize) -> Result<()> {
        if !self.attrs.is_empty() && self.attrs.len() != n {
            return Err(FormatError::invalid(
                "snapshot builder",
                format!("attributes for {} of {n} samples", self.attrs.len()),
            ));
        }
        if let Some(a) = self
            .attrs
            .iter()
            .chain(self.dirs.iter().map(|d| &d.1))
            .find(|a| a.mode > 0o7777)
        {
            return Err(FormatError::invalid(
                "snapshot builder",
                format!("mode {:o} beyond 7777", a.mode),
            ));
        }
        self.dirs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (i, (d, _)) in self.dirs.iter().enumerate() {
            crate::check_relative_path(d).map_err(|why| {
                FormatError::invalid(
                    format!("directory {}", String::from_utf8_lossy(d)),
                    why.to_string(),
                )
            })?;
            if i > 0 && self.dirs[i - 1].0 == *d {
                return Err(FormatError::invalid(
                    "snapshot builder",
                    format!("directory {} listed twice", String::from_utf8_lossy(d)),
                ));
            }
        }
        Ok(())
    }

    /// The sections to write before the block checksums (kinds 14 and 15, always written since
    /// format 1.4; older readers skip what they do not know).
    fn kinds(&self) -> Vec<SectionKind> {
        let mut kinds = vec![
            SectionKind::Chunks,
            SectionKind::Samples,
            SectionKind::Paths,
            SectionKind::PathHash,
            SectionKind::PathOrder,
            SectionKind::Classes,
        ];
        if self.lineage.generation > 0 {
            kinds.push(SectionKind::Lineage);
        }
        if !self.attrs.is_empty() {
            kinds.push(SectionKind::FileAttrs);
        }
        if !self.dirs.is_empty() {
            kinds.extend([SectionKind::Dirs, SectionKind::DirAttrs]);
        }
        if self.with_fields == Some(true) {
            kinds.extend([
                SectionKind::FieldNames,
                SectionKind::FieldIndex,
                SectionKind::Fields,
            ]);
        }
        match self.pages {
            BuiltPages::None => {}
            BuiltPages::Paths => kinds.extend([SectionKind::PathPages, SectionKind::PathPageIndex]),
            BuiltPages::Listing => {
                kinds.extend([SectionKind::ListingPages, SectionKind::ListingPageIndex])
            }
        }
        kinds
    }

    /// The minor version written: that of the pages written (older versions' sections are
    /// written only when needed, and readers of those versions ignore the newer ones).
    fn minor(&self) -> u16 {
        match self.pages {
            BuiltPages::None => BLOCKS_MINOR,
            BuiltPages::Paths => PAGES_MINOR,
            BuiltPages::Listing => LISTING_MINOR,
        }
    }

    /// Serializes the snapshot. Fails if two samples share a path.
    pub fn build(self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)
            .map_err(|e| FormatError::invalid("snapshot builder", e.to_string()))?;
        Ok(out)
    }

    /// Sample ids sorted by path; fails on a path found twice.
    fn path_order(&self) -> Result<Vec<u32>> {
        let n = self.sample_count as usize;
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by(|&a, &b| self.path(a as usize).cmp(self.path(b as usize)));
        if let Some(w) = order
            .windows(2)
            .find(|w| self.path(w[0] as usize) == self.path(w[1] as usize))
        {
            return Err(FormatError::invalid(
                "snapshot builder",
                format!(
                    "duplicate path {}",
                    String::from_utf8_lossy(self.path(w[0] as usize))
                ),
            ));
        }
        Ok(order)
    }

    /// The path index (kind 4): its capacity and slots.
    fn path_index(&self) -> (u64, Vec<u8>) {
        let n = self.sample_count as usize;
        let cap = ((n as u64 + 1) * 2).next_power_of_two().max(8);
        let mut slots = vec![0u8; cap as usize * 8];
        for i in 0..n {
            let h = path_hash(self.path(i));
            let mut s = (h & (cap - 1)) as usize;
            while slots[s * 8..s * 8 + 4] != [0; 4] {
                s = (s + 1) & (cap as usize - 1);
            }
            slots[s * 8..s * 8 + 4].copy_from_slice(&(i as u32 + 1).to_le_bytes());
            slots[s * 8 + 4..s * 8 + 8].copy_from_slice(&((h >> 32) as u32).to_le_bytes());
        }
        (cap, slots)
    }

    /// The field names sorted (kind 11, encoded), and each name's new id by its old one.
    fn sorted_field_names(&self) -> (Vec<u8>, Vec<u32>) {
        let mut sorted: Vec<(&Vec<u8>, u32)> = self
            .field_names
            .iter()
            .enumerate()
            .map(|(i, n)| (n, i as u32))
            .collect();
        sorted.sort_unstable();
        let mut rename = vec![0u32; sorted.len()];
        for (new, (_, old)) in sorted.iter().enumerate() {
            rename[*old as usize] = new as u32;
        }
        (encode_string_table(sorted.iter().map(|(n, _)| n)), rename)
    }

    /// Writes the snapshot to `w` section by section, without a second copy of any section in
    /// memory (what a pack of many millions of files needs): besides the builder's own tables,
    /// only the sorted path order and the path index's slots are held. Returns its length.
    /// Fails (before writing anything) if two samples share a path.
    pub fn write_to(mut self, w: &mut impl std::io::Write) -> std::io::Result<u64> {
        let invalid = |e: FormatError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let n = self.sample_count as usize;
        let spool = match self.spool.take() {
            Some(b) => Some(b.into_inner().map_err(|e| e.into_error())?),
            None => None,
        };
        let order = self.path_order().map_err(invalid)?;
        let (cap, slots) = self.path_index();
        self.check_metadata(n).map_err(invalid)?;
        let dir_names = encode_string_table(self.dirs.iter().map(|d| &d.0));
        let (field_names, rename) = self.sorted_field_names();
        let classes = encode_string_table(self.classes.iter());
        let (me, listing) = (&self, self.pages == BuiltPages::Listing);
        let sorted = || {
            order.iter().map(move |&i| {
                let stat = listing.then(|| me.stat(i as usize));
                (me.path(i as usize), i, stat)
            })
        };
        // The pages are encoded again as they are written (twice): only their index is held.
        let page_index = encode_pages(sorted(), |_| Ok(()))?;
        let lineage = self.lineage.encode();

        // Each section as the pieces it is written from: computed twice (CRC, then write)
        // instead of being assembled into a buffer.
        let emit = |kind: SectionKind, f: &mut dyn FnMut(&[u8]) -> std::io::Result<()>| match kind {
            SectionKind::Chunks => self.chunks.iter().try_for_each(|c| f(&c.encode())),
            SectionKind::Samples => match &spool {
                Some(file) => {
                    use std::os::unix::fs::FileExt;
                    let total = n as u64 * SAMPLE_ENTRY_LEN as u64;
                    let mut buf = vec![0u8; 1 << 20];
                    let mut at = 0u64;
                    while at < total {
                        let k = (total - at).min(buf.len() as u64) as usize;
                        file.read_exact_at(&mut buf[..k], at)?;
                        f(&buf[..k])?;
                        at += k as u64;
                    }
                    Ok(())
                }
                None => self.samples.iter().try_for_each(|e| f(&e.encode())),
            },
            SectionKind::Paths => {
                f(&(n as u64).to_le_bytes())?;
                f(&0u64.to_le_bytes())?;
                in_pieces(f, self.path_ends.iter().map(|e| e.to_le_bytes()))?;
                f(&self.path_blob)
            }
            SectionKind::PathHash => {
                f(&cap.to_le_bytes())?;
                f(&slots)
            }
            SectionKind::PathOrder => in_pieces(f, order.iter().map(|i| i.to_le_bytes())),
            SectionKind::Classes => f(&classes),
            SectionKind::Lineage => f(&lineage),
            SectionKind::FileAttrs => in_pieces(f, self.attrs.iter().map(FileAttrs::encode)),
            SectionKind::Dirs => f(&dir_names),
            SectionKind::DirAttrs => self.dirs.iter().try_for_each(|(_, a)| f(&a.encode())),
            SectionKind::FieldNames => f(&field_names),
            SectionKind::FieldIndex => {
                let ends = self.field_counts.iter().scan(0u64, |at, &c| {
                    *at += c as u64;
                    Some(*at)
                });
                in_pieces(f, std::iter::once(0u64).chain(ends).map(u64::to_le_bytes))
            }
            SectionKind::Fields => in_pieces(
                f,
                self.field_entries.iter().map(|e| {
                    FieldEntry {
                        name: rename[e.name as usize],
                        ..*e
                    }
                    .encode()
                }),
            ),
            SectionKind::PathPages | SectionKind::ListingPages => {
                encode_pages(sorted(), |b| f(b)).map(drop)
            }
            SectionKind::PathPageIndex | SectionKind::ListingPageIndex => f(&page_index),
            // Computed from the bytes of all others, below.
            SectionKind::BlockCrcs | SectionKind::BlockIndex => unreachable!("not in kinds()"),
        };
        let kinds = self.kinds();
        let minor = self.minor();
        let nsec = kinds.len() + 2;
        let table_end = (SNAPSHOT_HEADER_LEN + nsec * SECTION_ENTRY_LEN) as u64;
        let mut table = vec![0u8; nsec * SECTION_ENTRY_LEN];
        let mut entry = |i: usize, kind: SectionKind, at: u64, len: u64, crc: u32| {
            table[i * SECTION_ENTRY_LEN..][..SECTION_ENTRY_LEN]
                .copy_from_slice(&section_entry(kind, at, len, crc));
        };
        // First pass: each section's CRC and length, and the CRC of every block of the bytes
        // from the section table's end to the block checksums (padding included).
        let mut blocks = BlockHasher::new(BLOCK_SIZE as u64);
        let mut at = table_end;
        for (i, &kind) in kinds.iter().enumerate() {
            blocks.pad8(&mut at);
            let (mut crc, mut len) = (crc32fast::Hasher::new(), 0u64);
            emit(kind, &mut |b| {
                crc.update(b);
                blocks.feed(b);
                len += b.len() as u64;
                Ok(())
            })?;
            entry(i, kind, at, len, crc.finalize());
            at += len;
        }
        blocks.pad8(&mut at);
        let (k14, k15) = encode_block_sections(BLOCK_SIZE, table_end..at, &blocks.finish());
        let k15_at = le::align8(at + k14.len() as u64);
        let i = kinds.len();
        entry(
            i,
            SectionKind::BlockCrcs,
            at,
            k14.len() as u64,
            crc32fast::hash(&k14),
        );
        let k15_crc = crc32fast::hash(&k15);
        entry(
            i + 1,
            SectionKind::BlockIndex,
            k15_at,
            k15.len() as u64,
            k15_crc,
        );
        let counts = (n as u64, self.chunks.len() as u64, nsec as u32);
        w.write_all(&snapshot_header(self.dataset_id, minor, counts, &table))?;
        w.write_all(&table)?;
        let mut pos = table_end;
        for &kind in &kinds {
            pad8(w, &mut pos)?;
            emit(kind, &mut |b| {
                pos += b.len() as u64;
                w.write_all(b)
            })?;
        }
        for b in [&k14, &k15] {
            pad8(w, &mut pos)?;
            w.write_all(b)?;
            pos += b.len() as u64;
        }
        Ok(pos)
    }
}

#[cfg(test)]
mod tests;
