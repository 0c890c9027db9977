//! The metadata snapshot: header, section table, and checksummed sections used in place.

mod builder;
mod check;
mod fields;
mod layout;
mod pager;
pub(crate) mod pages;
mod paths;
mod types;

use std::ops::Range;
use std::sync::Arc;

use self::pages::{PageIndex, PathEntry};
use crate::blocks::Pager;
use crate::error::{check_crc, check_magic_version, FormatError, Result};
use crate::strtab::StringTable;
use crate::ChunkFields;
use crate::{le, ChunkSummary, SampleEntry};
use crate::{SAMPLE_ENTRY_LEN, SNAPSHOT_MAGIC};

pub use builder::SnapshotBuilder;
use layout::{need_table, FieldsLayout, Layout};
pub use types::{ChunkEntry, FileAttrs, Lineage, SampleField, ATTRS_LEN, LINEAGE_LEN};

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

#[cfg(test)]
mod tests;
