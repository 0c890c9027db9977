//! Reading a format 1.x snapshot whole, for `granary upgrade` only: readers of datasets read
//! 2.0 alone. Everything a 1.x snapshot recorded is decoded into what
//! [`crate::SnapshotBuilder`] takes (chunk summaries, attributes, directories, lineage), after
//! the header CRC, the section table's CRC and every section's CRC are checked.
//!
//! The 1.x layout, in brief: a 64-byte header (magic, major 1, minor, header length 64,
//! dataset id, sample count, chunk count, section count, section table CRC, flags, header
//! CRC), a table of 32-byte section entries (kind, offset, length, CRC), sections: 1 chunk
//! table (40-byte entries), 2 sample table (40-byte entries), 3 paths, 6 classes (string
//! tables), 7 lineage, 8 file attributes and 10 directory attributes (16 bytes each), 9
//! directories (string table), 11 field names, 12 field index (u64s), 13 field entries
//! (24 bytes). Kinds 4, 5 and 14-19 are indexes of the others and are not needed.

use crate::error::{bail, check_crc, invalid, need, Result};
use crate::le;
use crate::strtab::StringTable;
use crate::{
    ChunkFields, ChunkSummary, FieldEntry, FileAttrs, Lineage, SampleEntry, FIELD_ENTRY_LEN,
    SAMPLE_ENTRY_LEN, SNAPSHOT_MAGIC,
};

const WHAT: &str = "format 1.x snapshot";

/// A 1.x snapshot's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegacySnapshot {
    /// `(major, minor)`: 1 and the file's minor version.
    pub version: (u16, u16),
    /// The dataset id.
    pub dataset_id: [u8; 16],
    /// The class names.
    pub classes: Vec<Vec<u8>>,
    /// Every chunk, with its samples' entries, paths, fields and (if the snapshot recorded
    /// them) modes and mtimes.
    pub chunks: Vec<ChunkSummary>,
    /// Whether the snapshot recorded modes and mtimes.
    pub attrs: bool,
    /// The recorded directories and their attributes.
    pub dirs: Vec<(Vec<u8>, FileAttrs)>,
    /// The generation (0 without a lineage section).
    pub lineage: Lineage,
}

/// True if `header` (at least 10 bytes) starts a 1.x snapshot.
pub fn is_legacy_snapshot(header: &[u8]) -> bool {
    header.len() >= 10 && header[0..8] == SNAPSHOT_MAGIC && le::u16_at(header, 8) == 1
}

/// The sample and chunk counts of a 1.x snapshot and its sections by kind, after the header
/// CRC, the section table's CRC and every section's CRC are checked.
type LegacySections<'b> = (u64, u64, [Option<&'b [u8]>; 20]);

fn legacy_sections(b: &[u8]) -> Result<LegacySections<'_>> {
    need(WHAT, b, 64)?;
    if !is_legacy_snapshot(b) {
        bail!(
            WHAT,
            "not a format 1.x snapshot (magic or major version differ)"
        );
    }
    check_crc(WHAT, le::u32_at(b, 60), &b[0..60])?;
    let (n, c, k) = (
        le::u64_at(b, 32),
        le::u64_at(b, 40),
        le::u32_at(b, 48) as usize,
    );
    if k > 1024 || n > crate::MAX_SAMPLES || c > u32::MAX as u64 {
        bail!(WHAT, "{n} samples, {c} chunks, {k} sections");
    }
    let table_end = 64 + 32 * k;
    need(WHAT, b, table_end)?;
    check_crc(
        "format 1.x section table",
        le::u32_at(b, 52),
        &b[64..table_end],
    )?;
    let mut sections: [Option<&[u8]>; 20] = Default::default();
    for e in b[64..table_end].chunks_exact(32) {
        let (kind, off, len) = (le::u32_at(e, 0), le::u64_at(e, 8), le::u64_at(e, 16));
        let end = off.checked_add(len).filter(|&x| x <= b.len() as u64);
        let Some(end) = end else {
            bail!(WHAT, "section of kind {kind} lies outside the file");
        };
        let s = &b[off as usize..end as usize];
        check_crc(
            format!("format 1.x section of kind {kind}"),
            le::u32_at(e, 24),
            s,
        )?;
        if (1..20).contains(&kind) {
            sections[kind as usize] = Some(s);
        }
    }
    Ok((n, c, sections))
}

/// Decodes and checks a whole 1.x snapshot.
pub fn read_legacy_snapshot(b: &[u8]) -> Result<LegacySnapshot> {
    let (n, c, sections) = legacy_sections(b)?;
    let need =
        |kind: usize| sections[kind].ok_or_else(|| invalid!(WHAT, "no section of kind {kind}"));
    let strings =
        |kind: usize| -> Result<Vec<Vec<u8>>> { StringTable::parse(need(kind)?, WHAT)?.to_vecs() };
    let (chunk_tab, sample_tab) = (need(1)?, need(2)?);
    if chunk_tab.len() as u64 != 40 * c || sample_tab.len() as u64 != SAMPLE_ENTRY_LEN as u64 * n {
        bail!(WHAT, "chunk or sample table sized for other counts");
    }
    let paths = strings(3)?;
    if paths.len() as u64 != n {
        bail!(WHAT, "{} paths for {n} samples", paths.len());
    }
    let attrs_of = |s: &[u8], count: usize| -> Result<Vec<FileAttrs>> {
        if s.len() != 16 * count {
            bail!(WHAT, "attribute section sized for another count");
        }
        s.chunks_exact(16).map(FileAttrs::decode).collect()
    };
    let attrs = sections[8].map(|s| attrs_of(s, n as usize)).transpose()?;
    let dirs = match sections[9] {
        None => Vec::new(),
        Some(_) => {
            let names = strings(9)?;
            let a = attrs_of(need(10)?, names.len())?;
            names.into_iter().zip(a).collect()
        }
    };
    let lineage = match sections[7] {
        None => Lineage::default(),
        // A 1.x lineage names its parent by a header CRC, which 2.0 does not record (its
        // parents are named by a content digest): the generation is kept, the parent unknown.
        Some(s) if s.len() == 16 => Lineage {
            generation: le::u64_at(s, 0),
            parent: [0; 16],
        },
        Some(_) => bail!(WHAT, "lineage section is not 16 bytes"),
    };
    let fields = match sections[11] {
        None => None,
        Some(_) => Some((strings(11)?, need(12)?, need(13)?)),
    };
    let mut chunks = Vec::with_capacity(c as usize);
    let mut next = 0u64;
    for (i, e) in chunk_tab.chunks_exact(40).enumerate() {
        let (first, count) = (le::u64_at(e, 16), le::u64_at(e, 24));
        if le::u32_at(e, 0) as usize != i || first != next || first + count > n {
            bail!(WHAT, "chunk {i}'s entry does not follow the one before");
        }
        next += count;
        let ids = first as usize..(first + count) as usize;
        let entries: Vec<SampleEntry> = ids
            .clone()
            .map(|s| SampleEntry::decode(&sample_tab[s * SAMPLE_ENTRY_LEN..][..SAMPLE_ENTRY_LEN]))
            .collect();
        let fields = match &fields {
            None => None,
            Some((names, index, table)) => Some(ChunkFields {
                names: names.clone(),
                types: Vec::new(),
                records: ids
                    .clone()
                    .map(|s| sample_fields(index, table, s))
                    .collect::<Result<_>>()?,
            }),
        };
        chunks.push(ChunkSummary {
            entries,
            paths: paths[ids.clone()].to_vec(),
            fields,
            attrs: attrs.as_ref().map(|a| a[ids].to_vec()),
            // 1.x recorded no digest: `granary upgrade` hashes each chunk file for it.
            ..ChunkSummary::bare(i as u32, le::u64_at(e, 8), le::u32_at(e, 32), [0; 16])
        });
    }
    if next != n {
        bail!(WHAT, "chunks hold {next} of {n} samples");
    }
    Ok(LegacySnapshot {
        version: (1, le::u16_at(b, 10)),
        dataset_id: le::id_at(b, 16),
        classes: strings(6)?,
        chunks,
        attrs: attrs.is_some(),
        dirs,
        lineage,
    })
}

/// Sample `s`'s field entries from a 1.x field index and table.
fn sample_fields(index: &[u8], table: &[u8], s: usize) -> Result<Vec<FieldEntry>> {
    if index.len() < (s + 2) * 8 {
        bail!(WHAT, "field index too short");
    }
    let (a, e) = (le::u64_at(index, s * 8), le::u64_at(index, s * 8 + 8));
    let fits = a <= e && e.checked_mul(FIELD_ENTRY_LEN as u64) <= Some(table.len() as u64);
    if !fits {
        bail!(
            WHAT,
            "sample {s}'s field entries {a}..{e} lie outside the table"
        );
    }
    (a..e)
        .map(|i| FieldEntry::decode(&table[i as usize * FIELD_ENTRY_LEN..][..FIELD_ENTRY_LEN]))
        .collect()
}
