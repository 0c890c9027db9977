//! The snapshot's fixed-width records: chunk entries, record entries, lineage, file
//! attributes, sample fields.

use std::ops::Range;

use crate::error::{bail, Result};
use crate::le;

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

/// A file's or directory's permission bits and modification time, as packed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileAttrs {
    /// Permission bits, `st_mode & 0o7777` (set-id and sticky bits included).
    pub mode: u32,
    /// Modification time, nanoseconds since 1970-01-01 UTC (negative before).
    pub mtime_ns: i64,
}

/// Length of a [`FileAttrs`] entry in node-local files (pack plans, legacy snapshots).
pub const ATTRS_LEN: usize = 16;

// The 16-byte form: `mode: u32`, reserved `u32` (zero), `mtime_ns: i64`.
le::layout!(FileAttrs, ATTRS_LEN, pub encode, decode_raw, { mode @ 0, mtime_ns @ 8 });

impl FileAttrs {
    /// The attributes a writer gives a directory its source does not describe.
    pub const DIR_DEFAULT: FileAttrs = FileAttrs {
        mode: 0o755,
        mtime_ns: 0,
    };

    /// Decodes the 16-byte form; a mode beyond `0o7777` or a non-zero reserved field is
    /// invalid.
    pub fn decode(b: &[u8]) -> Result<FileAttrs> {
        let a = Self::decode_raw(b);
        if a.mode > 0o7777 || le::u32_at(b, 4) != 0 {
            bail!(
                "file attributes",
                "mode {:o} beyond 7777, or a reserved field set",
                a.mode
            );
        }
        Ok(a)
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
}

/// Length of the lineage section.
pub const LINEAGE_LEN: usize = 24;

/// Which generation of a dataset a snapshot is: `granary append` publishes generation `g + 1`
/// over every chunk of generation `g`, plus new ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    /// 0 for a pack (or a merge of shards), +1 for each append.
    pub generation: u64,
    /// The content digest of the snapshot this one extends: zero at generation 0, and where
    /// it is not known (a snapshot upgraded from 1.x, whose lineage named a CRC only).
    pub parent: [u8; 16],
}

// The lineage section: generation `u64`, parent (16 bytes).
le::layout!(Lineage, LINEAGE_LEN, pub(crate) encode, decode_raw, { generation @ 0, parent @ 8 });

impl Lineage {
    pub(crate) fn decode(b: &[u8]) -> Result<Lineage> {
        let l = Lineage::decode_raw(b);
        if l.generation == 0 && l.parent != [0; 16] {
            bail!(
                "snapshot lineage",
                "generation 0 names a parent ({}); a packed dataset has none",
                crate::hex16(&l.parent)
            );
        }
        Ok(l)
    }

    /// Whether the parent is recorded.
    pub fn has_parent(&self) -> bool {
        self.parent != [0; 16]
    }
}

/// Length of one chunk table entry.
pub const CHUNK_ENTRY_LEN: usize = 56;

/// One entry of the chunk table: the chunk file, its samples and what `info` and `plan`
/// report about them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Chunk id (the entry's index).
    pub chunk_id: u32,
    /// Length of the chunk file in bytes.
    pub file_size: u64,
    /// Id of the first sample stored in the chunk.
    pub first_sample: u64,
    /// Number of samples stored in the chunk (from the next entry's `first_sample`).
    pub sample_count: u64,
    /// Where the chunk's records end and its footer starts.
    pub records_end: u64,
    /// The original sizes of its samples, added up.
    pub orig_bytes: u64,
    /// How many of its records are compressed.
    pub compressed: u32,
    /// CRC-32 of the whole chunk file.
    pub file_crc: u32,
    /// The chunk's identity: the first 16 bytes of SHA-256 over the whole chunk file. What
    /// keys a copy of the chunk (in a tier, at a peer); the CRC-32 checks the copy's bytes.
    pub digest: [u8; 16],
}

// The 56-byte form (`chunk_id` is the entry's index; `sample_count` comes from the next entry).
le::layout!(ChunkEntry, CHUNK_ENTRY_LEN, pub(crate) encode, pub(crate) decode, {
    file_size @ 0, first_sample @ 8, records_end @ 16, orig_bytes @ 24, compressed @ 32,
    file_crc @ 36, digest @ 40,
});

impl ChunkEntry {
    /// The sample ids stored in this chunk.
    pub fn samples(&self) -> Range<u64> {
        self.first_sample..self.first_sample.saturating_add(self.sample_count)
    }

    /// The bytes its records take (between the chunk header and the footer).
    pub fn stored_bytes(&self) -> u64 {
        self.records_end
            .saturating_sub(crate::CHUNK_HEADER_LEN as u64)
    }
}

/// Length of one record entry.
pub const RECORD_LEN: usize = 16;

/// Largest record offset a record entry holds (48 bits).
pub const MAX_RECORD_OFFSET: u64 = (1 << 48) - 1;

/// One record entry as stored: where the record starts in its chunk, its flags (compression
/// code, field group), the CRC-32 of its original bytes and its label. Its length is where
/// the next record of its chunk starts (or the chunk's `records_end`) minus its offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordEntry {
    /// Offset of the stored record in its chunk file.
    pub offset: u64,
    /// Bits 0–3: compression code; bit 4: field group; others zero.
    pub flags: u16,
    /// CRC-32 of the original bytes.
    pub crc32: u32,
    /// Class index, or [`crate::NO_LABEL`].
    pub label: u32,
}

// The 16-byte form: `offset` as a 48-bit integer, `flags: u16`, `crc32: u32`, `label: u32`
// (the offset's 8 bytes go first, then `flags` over its two top bytes, which are zero).
le::layout!(RecordEntry, RECORD_LEN, pub encode, decode_raw, {
    offset @ 0, flags @ 6, crc32 @ 8, label @ 12,
});

impl RecordEntry {
    /// Decodes an entry from exactly [`RECORD_LEN`] bytes (no semantic checks).
    pub fn decode(b: &[u8]) -> Self {
        let r = Self::decode_raw(b);
        RecordEntry {
            offset: r.offset & MAX_RECORD_OFFSET,
            ..r
        }
    }
}
