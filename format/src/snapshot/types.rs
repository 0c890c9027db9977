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

impl FileAttrs {
    /// The attributes a writer gives a directory its source does not describe.
    pub const DIR_DEFAULT: FileAttrs = FileAttrs {
        mode: 0o755,
        mtime_ns: 0,
    };

    /// The 16-byte form: `mode: u32`, reserved `u32` (zero), `mtime_ns: i64`.
    pub fn encode(&self) -> [u8; ATTRS_LEN] {
        let mut b = [0u8; ATTRS_LEN];
        b[0..4].copy_from_slice(&self.mode.to_le_bytes());
        b[8..16].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b
    }

    /// Decodes the 16-byte form; a mode beyond `0o7777` or a non-zero reserved field is
    /// invalid.
    pub fn decode(b: &[u8]) -> Result<FileAttrs> {
        let mode = le::u32_at(b, 0);
        if mode > 0o7777 || le::u32_at(b, 4) != 0 {
            bail!(
                "file attributes",
                "mode {mode:o} beyond 7777, or a reserved field set"
            );
        }
        Ok(FileAttrs {
            mode,
            mtime_ns: le::u64_at(b, 8) as i64,
        })
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

impl Lineage {
    /// The lineage section: generation `u64`, parent (16 bytes).
    pub(crate) fn encode(&self) -> [u8; LINEAGE_LEN] {
        let mut b = [0u8; LINEAGE_LEN];
        b[0..8].copy_from_slice(&self.generation.to_le_bytes());
        b[8..24].copy_from_slice(&self.parent);
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Lineage> {
        let l = Lineage {
            generation: le::u64_at(b, 0),
            parent: le::id_at(b, 8),
        };
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

impl ChunkEntry {
    /// The 56-byte form: `file_size`, `first_sample`, `records_end`, `orig_bytes` (u64 each),
    /// `compressed`, `file_crc` (u32 each), `digest` (16 bytes).
    pub(crate) fn encode(&self) -> [u8; CHUNK_ENTRY_LEN] {
        let mut b = [0u8; CHUNK_ENTRY_LEN];
        b[0..8].copy_from_slice(&self.file_size.to_le_bytes());
        b[8..16].copy_from_slice(&self.first_sample.to_le_bytes());
        b[16..24].copy_from_slice(&self.records_end.to_le_bytes());
        b[24..32].copy_from_slice(&self.orig_bytes.to_le_bytes());
        b[32..36].copy_from_slice(&self.compressed.to_le_bytes());
        b[36..40].copy_from_slice(&self.file_crc.to_le_bytes());
        b[40..56].copy_from_slice(&self.digest);
        b
    }

    /// Decodes entry `chunk_id` (its `sample_count` is filled in from the next entry).
    pub(crate) fn decode(chunk_id: u32, b: &[u8]) -> Self {
        ChunkEntry {
            chunk_id,
            file_size: le::u64_at(b, 0),
            first_sample: le::u64_at(b, 8),
            sample_count: 0,
            records_end: le::u64_at(b, 16),
            orig_bytes: le::u64_at(b, 24),
            compressed: le::u32_at(b, 32),
            file_crc: le::u32_at(b, 36),
            digest: le::id_at(b, 40),
        }
    }

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl RecordEntry {
    /// The 16-byte form: `offset` as a 48-bit integer, `flags: u16`, `crc32: u32`,
    /// `label: u32`.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0..6].copy_from_slice(&self.offset.to_le_bytes()[..6]);
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.crc32.to_le_bytes());
        b[12..16].copy_from_slice(&self.label.to_le_bytes());
        b
    }

    /// Decodes an entry from exactly [`RECORD_LEN`] bytes (no semantic checks).
    pub fn decode(b: &[u8]) -> Self {
        let mut o = [0u8; 8];
        o[..6].copy_from_slice(&b[0..6]);
        RecordEntry {
            offset: u64::from_le_bytes(o),
            flags: le::u16_at(b, 6),
            crc32: le::u32_at(b, 8),
            label: le::u32_at(b, 12),
        }
    }
}
