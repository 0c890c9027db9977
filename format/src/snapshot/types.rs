//! The snapshot's fixed-width records: sample fields, file attributes, lineage, chunk entries.

use std::ops::Range;

use super::CHUNK_ENTRY_LEN;
use crate::error::{FormatError, Result};
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
    pub(super) fn encode(&self) -> [u8; LINEAGE_LEN] {
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
    pub(super) fn encode(&self) -> [u8; CHUNK_ENTRY_LEN] {
        let mut b = [0u8; CHUNK_ENTRY_LEN];
        b[0..4].copy_from_slice(&self.chunk_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.file_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_sample.to_le_bytes());
        b[24..32].copy_from_slice(&self.sample_count.to_le_bytes());
        b[32..36].copy_from_slice(&self.file_crc.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8]) -> Self {
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
