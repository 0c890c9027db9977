//! Opening a snapshot: the header, the section table, and where each section is, checked in
//! time that does not grow with the sample count.

use std::ops::Range;

use super::pages::PageEntries;
use crate::blocks::BlockIndex;
use crate::error::{check_crc, FormatError, Result};
use crate::le;
use crate::strtab::StringTable;
use crate::FIELD_ENTRY_LEN;
use crate::{MAX_SAMPLES, SAMPLE_ENTRY_LEN};

use super::*;

/// Where a snapshot's fields sections are (kinds 11, 12, 13).
#[derive(Clone, Debug)]
pub(super) struct FieldsLayout {
    pub(super) names: Range<usize>,
    pub(super) index: Range<usize>,
    pub(super) table: Range<usize>,
    pub(super) name_count: u64,
    pub(super) entries: u64,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Section {
    pub(super) kind: u32,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) crc: u32,
}

#[derive(Clone, Debug)]
pub(super) struct Layout {
    pub(super) major: u16,
    pub(super) minor: u16,
    pub(super) dataset_id: [u8; 16],
    pub(super) samples: u64,
    pub(super) chunks: u64,
    pub(super) sections: Vec<Section>,
    pub(super) chunk_tab: Range<usize>,
    pub(super) sample_tab: Range<usize>,
    pub(super) paths: Range<usize>,
    pub(super) hash: Range<usize>,
    pub(super) hash_cap: u64,
    pub(super) order: Range<usize>,
    pub(super) classes: Range<usize>,
    pub(super) lineage: Lineage,
    /// Kind 8, if present.
    pub(super) attrs: Option<Range<usize>>,
    /// Kinds 9 and 10, if present, and the number of directories.
    pub(super) dirs: Option<(Range<usize>, Range<usize>)>,
    pub(super) dir_count: u64,
    /// Kinds 11 to 13, if present.
    pub(super) fields: Option<FieldsLayout>,
    /// Kinds 14 and 15, if present.
    pub(super) blocks: Option<BlockIndex>,
    /// Kinds 16 and 17 (path pages and their index), or 18 and 19 (listing pages), if
    /// present.
    pub(super) pages: Option<PagesLayout>,
}

/// Where a snapshot's pages and their index are, and what their entries carry.
#[derive(Clone, Debug)]
pub(super) struct PagesLayout {
    pub(super) pages: Range<usize>,
    pub(super) index: Range<usize>,
    pub(super) entries: PageEntries,
}

/// What [`Snapshot`]'s checks call before reading a range of the bytes (a pager's `need`).
pub(super) type Need<'a> = &'a dyn Fn(Range<usize>) -> Result<()>;

/// Makes the parts of string table `r` that [`StringTable::parse`] reads present: the count,
/// the first offset and the last.
pub(super) fn need_table(b: &[u8], need: Need, r: &Range<usize>) -> Result<()> {
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

impl<B: AsRef<[u8]>> Snapshot<B> {
    pub(super) fn layout(b: &[u8], need: Need) -> Result<Layout> {
        pub(super) const WHAT: &str = "snapshot header";
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
}

/// The capacity of the path index at `hash` in snapshot `b` of `samples` samples: a power of
/// two above `samples`, and the section sized for it.
pub(super) fn path_index_capacity(b: &[u8], hash: &Range<usize>, samples: u64) -> Result<u64> {
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
pub(super) struct Optional {
    lineage: Lineage,
    attrs: Option<Range<usize>>,
    dirs: Option<(Range<usize>, Range<usize>)>,
    dir_count: u64,
}

pub(super) fn expect_len(what: &'static str, r: &Range<usize>, want: u64) -> Result<()> {
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
pub(super) fn optional_sections(
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
pub(super) fn fields_sections(
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
pub(super) fn block_sections(
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
pub(super) fn check_chunk_ranges(tab: &[u8], samples: u64) -> Result<()> {
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

/// Kinds 16 and 17, or 18 and 19, if present: each pair both or neither, at most one pair,
/// the index sized for the pages it declares (O(1); the index itself is checked when first
/// used). Listing pages' entries carry mode and mtime when the snapshot has kind 8 (`attrs`).
pub(super) fn page_sections(
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
    super::pages::declared_pages(&b[index.clone()], samples, entries)?;
    Ok(Some(PagesLayout {
        pages,
        index,
        entries,
    }))
}
