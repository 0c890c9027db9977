//! Writing a snapshot: [`SnapshotBuilder`].

use super::pages::{encode_pages, FileStat};
use crate::blocks::{encode_block_sections, BlockHasher, BLOCK_SIZE};
use crate::error::{FormatError, Result};
use crate::strtab::encode_string_table;
use crate::FieldEntry;
use crate::{le, path_hash, ChunkSummary, SampleEntry};
#[cfg(any(test, feature = "test-support"))]
use crate::{BLOCKS_MINOR, PAGES_MINOR};
use crate::{FORMAT_MAJOR, LISTING_MINOR, MAX_SAMPLES, SAMPLE_ENTRY_LEN, SNAPSHOT_MAGIC};

use super::*;

/// The snapshot header for `dataset_id` at minor version `minor`, with (samples, chunks,
/// sections) `counts` and section table `table`.
pub(super) fn snapshot_header(
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

/// Hands `items` to `f` in pieces of about 64 KiB (a section written without being assembled
/// in memory first).
pub(super) fn in_pieces<T: AsRef<[u8]>>(
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
pub(super) fn section_entry(
    kind: SectionKind,
    at: u64,
    len: u64,
    crc: u32,
) -> [u8; SECTION_ENTRY_LEN] {
    let mut e = [0u8; SECTION_ENTRY_LEN];
    e[0..4].copy_from_slice(&(kind as u32).to_le_bytes());
    e[8..16].copy_from_slice(&at.to_le_bytes());
    e[16..24].copy_from_slice(&len.to_le_bytes());
    e[24..28].copy_from_slice(&crc.to_le_bytes());
    e
}

/// Writes the zeros that bring `pos` to a multiple of 8.
pub(super) fn pad8(w: &mut impl std::io::Write, pos: &mut u64) -> std::io::Result<()> {
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
    /// None: format 1.4 (written for tests of readers of older snapshots only).
    #[cfg(any(test, feature = "test-support"))]
    None,
    /// Path pages (kinds 16, 17): format 1.5 (likewise).
    #[cfg(any(test, feature = "test-support"))]
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
    #[cfg(any(test, feature = "test-support"))]
    pub fn without_path_pages(&mut self) {
        self.pages = BuiltPages::None;
    }

    /// Writes path pages without sizes, modes and mtimes (kinds 16 and 17), as format 1.5
    /// did: what tests of readers of older snapshots build.
    #[cfg(any(test, feature = "test-support"))]
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
            #[cfg(any(test, feature = "test-support"))]
            BuiltPages::None => {}
            #[cfg(any(test, feature = "test-support"))]
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
            #[cfg(any(test, feature = "test-support"))]
            BuiltPages::None => BLOCKS_MINOR,
            #[cfg(any(test, feature = "test-support"))]
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
