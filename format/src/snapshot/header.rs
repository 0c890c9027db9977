//! The snapshot header and the one integrity scheme: fixed blocks over the body, their CRC-32s
//! in a table at the end of the file, the table's CRC in the header, the header's own CRC.
//!
//! Every reader applies it the same way: before it uses any byte of the body it checks the
//! CRC of each block that byte lies in (once per block). A reader holding the whole file and
//! one fetching it in ranged reads differ only in where the bytes come from.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{bail, check_crc, need, FormatError, Result};
use crate::le::{self, Le};
use crate::{SNAPSHOT_MAGIC, SNAPSHOT_MAJOR};

/// Length of the snapshot header; the body follows it.
pub const SNAPSHOT_HEADER_LEN: usize = 96;
/// Header bytes `0..DIGEST_PREFIX` start what the content digest covers (then the body and
/// the block CRC table).
pub const DIGEST_PREFIX: usize = 56;
/// log2 of the block size writers use (64 KiB).
pub const BLOCK_SHIFT: u8 = 16;
/// Smallest and largest log2 of a block size readers accept (4 KiB to 16 MiB).
pub const BLOCK_SHIFTS: std::ops::RangeInclusive<u8> = 12..=24;

/// Feature bits: what a snapshot holds beyond the base format.
pub mod features {
    /// Incompatible: every namespace entry carries mode and mtime.
    pub const ATTRS: u32 = 1 << 0;
    /// Incompatible: every sample is a field group; the fields section is present.
    pub const FIELDS: u32 = 1 << 1;
    /// Incompatible: samples were deleted; the deletions section lists them, and the
    /// namespace holds the others only.
    pub const DELETIONS: u32 = 1 << 2;
    /// Incompatible: some chunks were compacted; the revisions section names their files.
    pub const REVISIONS: u32 = 1 << 3;
    /// The incompatible bits this crate knows.
    pub const KNOWN_INCOMPAT: u32 = ATTRS | FIELDS | DELETIONS | REVISIONS;
    /// The compatible bits this crate knows (none yet).
    pub const KNOWN_COMPAT: u32 = 0;
}

/// The 96-byte snapshot header, decoded and checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// The dataset id every chunk must carry.
    pub dataset_id: [u8; 16],
    /// Number of samples.
    pub samples: u64,
    /// Number of chunks.
    pub chunks: u32,
    /// End of the body: where the block CRC table starts.
    pub body_end: u64,
    /// log2 of the block size.
    pub block_shift: u8,
    /// Incompatible feature bits ([`features`]).
    pub incompat: u32,
    /// Compatible feature bits.
    pub compat: u32,
    /// The content digest: the first 16 bytes of SHA-256 over header bytes 0..56, the body
    /// and the block CRC table. With the dataset id, what identifies the snapshot's content.
    pub digest: [u8; 16],
    /// CRC-32 of the block CRC table.
    pub table_crc: u32,
}

le::layout!(SnapshotHeader, SNAPSHOT_HEADER_LEN, encode_fields, decode_fields, {
    block_shift @ 10, incompat @ 12, dataset_id @ 16, samples @ 32, body_end @ 40, compat @ 48,
    chunks @ 52, digest @ 56, table_crc @ 88,
});

impl SnapshotHeader {
    /// Encodes the header (magic, major version, the fields, and its CRC).
    pub fn encode(&self) -> [u8; SNAPSHOT_HEADER_LEN] {
        let mut h = self.encode_fields();
        h[0..8].copy_from_slice(&SNAPSHOT_MAGIC);
        SNAPSHOT_MAJOR.put(&mut h, 8);
        crc32fast::hash(&h[0..92]).put(&mut h, 92);
        h
    }

    /// Decodes and checks a header: magic, major version, CRC, reserved byte, block size,
    /// limits, and that no incompatible feature bit is unknown.
    pub fn decode(b: &[u8]) -> Result<SnapshotHeader> {
        const WHAT: &str = "snapshot header";
        need(WHAT, b, SNAPSHOT_HEADER_LEN)?;
        if b[0..8] != SNAPSHOT_MAGIC {
            return Err(FormatError::bad_magic(WHAT, &SNAPSHOT_MAGIC, &b[0..8]));
        }
        let major = le::u16_at(b, 8);
        if major != SNAPSHOT_MAJOR {
            let hint = if major == 1 {
                ": a granary 0.1 dataset; `granary upgrade DATASET` rewrites its snapshot as 2.0"
            } else {
                ""
            };
            bail!(
                WHAT,
                "format version {major} is not supported by this reader (it reads version \
                 {SNAPSHOT_MAJOR}){hint}"
            );
        }
        check_crc(WHAT, le::u32_at(b, 92), &b[0..92])?;
        let h = SnapshotHeader::decode_fields(b);
        if b[11] != 0 || b[72..88].iter().any(|&x| x != 0) {
            bail!(WHAT, "reserved byte 11 or bytes 72..88 are not zero");
        }
        if !BLOCK_SHIFTS.contains(&h.block_shift) {
            bail!(
                WHAT,
                "block size 2^{} outside 2^{}..=2^{}",
                h.block_shift,
                BLOCK_SHIFTS.start(),
                BLOCK_SHIFTS.end()
            );
        }
        let unknown = h.incompat & !features::KNOWN_INCOMPAT;
        if unknown != 0 {
            bail!(
                WHAT,
                "incompatible feature bits {unknown:#x} are unknown to this reader (a newer \
                 granary wrote it)"
            );
        }
        if h.has_attrs() && h.has_fields() {
            bail!(
                WHAT,
                "feature bits ATTRS and FIELDS together (field groups record no attributes)"
            );
        }
        if h.samples > crate::MAX_SAMPLES
            || h.body_end < SNAPSHOT_HEADER_LEN as u64 + 8
            || h.body_end > 1 << 56
        {
            bail!(
                WHAT,
                "{} samples, body ending at {}: beyond the format's limits",
                h.samples,
                h.body_end
            );
        }
        Ok(h)
    }

    /// Number of blocks of the body.
    pub fn block_count(&self) -> u64 {
        (self.body_end - SNAPSHOT_HEADER_LEN as u64).div_ceil(1 << self.block_shift)
    }

    /// Where the block CRC table lies.
    pub fn crc_table(&self) -> Range<u64> {
        self.body_end..self.body_end + 4 * self.block_count()
    }

    /// The length the file must have.
    pub fn file_len(&self) -> u64 {
        self.crc_table().end
    }

    /// Whether the snapshot's namespace entries carry mode and mtime.
    pub fn has_attrs(&self) -> bool {
        self.incompat & features::ATTRS != 0
    }

    /// Whether the snapshot's samples are field groups.
    pub fn has_fields(&self) -> bool {
        self.incompat & features::FIELDS != 0
    }

    /// Whether samples were deleted (the deletions section is present).
    pub fn has_deletions(&self) -> bool {
        self.incompat & features::DELETIONS != 0
    }

    /// Whether chunks were compacted (the revisions section is present).
    pub fn has_revisions(&self) -> bool {
        self.incompat & features::REVISIONS != 0
    }
}

/// Computes a snapshot's content digest from the bytes it covers, in file order: header bytes
/// `0..DIGEST_PREFIX`, then the body, then the block CRC table.
#[derive(Clone, Default)]
pub struct ContentDigest(sha2::Sha256);

impl ContentDigest {
    /// Starts a digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the next covered bytes.
    pub fn update(&mut self, b: &[u8]) {
        sha2::Digest::update(&mut self.0, b);
    }

    /// The digest: SHA-256's first 16 bytes.
    pub fn finish(self) -> [u8; 16] {
        let full = sha2::Digest::finalize(self.0);
        full[..16].try_into().expect("SHA-256 has 32 bytes")
    }

    /// The content digest of a whole snapshot file `b` (whose header says where its body ends:
    /// the caller checked the header).
    pub fn of_file(b: &[u8]) -> [u8; 16] {
        let mut d = ContentDigest::new();
        d.update(&b[..DIGEST_PREFIX]);
        d.update(&b[SNAPSHOT_HEADER_LEN.min(b.len())..]);
        d.finish()
    }
}

/// The block CRC table of a snapshot, checked against its header, and which blocks a reader
/// has checked so far.
#[derive(Debug)]
pub struct Blocks {
    shift: u8,
    body_end: u64,
    crcs: Vec<u32>,
    done: Vec<AtomicU64>,
}

impl Blocks {
    /// Parses the CRC table `table` (the bytes [`SnapshotHeader::crc_table`] names) and checks
    /// it against the header's CRC.
    pub fn parse(h: &SnapshotHeader, table: &[u8]) -> Result<Blocks> {
        const WHAT: &str = "snapshot block CRC table";
        let want = 4 * h.block_count();
        if table.len() as u64 != want {
            return Err(FormatError::truncated(WHAT, want, table.len() as u64));
        }
        check_crc(WHAT, h.table_crc, table)?;
        let crcs: Vec<u32> = table.chunks_exact(4).map(|c| le::u32_at(c, 0)).collect();
        let done = (0..crcs.len().div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        Ok(Blocks {
            shift: h.block_shift,
            body_end: h.body_end,
            crcs,
            done,
        })
    }

    /// Number of blocks.
    pub fn count(&self) -> u64 {
        self.crcs.len() as u64
    }

    /// The bytes of block `b`.
    pub fn block(&self, b: u64) -> Range<u64> {
        let start = SNAPSHOT_HEADER_LEN as u64 + (b << self.shift);
        start..(start + (1 << self.shift)).min(self.body_end)
    }

    /// The blocks holding any byte of `r` (clamped to the body).
    pub fn blocks_of(&self, r: &Range<u64>) -> Range<u64> {
        let h = SNAPSHOT_HEADER_LEN as u64;
        let (s, e) = (r.start.max(h), r.end.min(self.body_end));
        if s >= e {
            return 0..0;
        }
        (s - h) >> self.shift..((e - 1 - h) >> self.shift) + 1
    }

    /// Whether block `b` was checked already.
    pub fn is_checked(&self, b: u64) -> bool {
        self.done[(b / 64) as usize].load(Ordering::Acquire) & (1 << (b % 64)) != 0
    }

    /// Checks block `b`'s bytes `data` (the whole block) and remembers it on success.
    /// `section` names what the block holds, for the error.
    pub fn check(&self, b: u64, data: &[u8], section: &dyn Fn() -> String) -> Result<()> {
        let actual = crc32fast::hash(data);
        if actual != self.crcs[b as usize] {
            let r = self.block(b);
            return Err(FormatError::ChecksumMismatch {
                what: format!(
                    "snapshot block {b} (bytes {}..{}, {})",
                    r.start,
                    r.end,
                    section()
                ),
                expected: self.crcs[b as usize],
                actual,
            });
        }
        self.done[(b / 64) as usize].fetch_or(1 << (b % 64), Ordering::Release);
        Ok(())
    }
}

/// What a reader that fetches a snapshot in pieces provides: `need_all(ranges)` makes the
/// bytes of `ranges` (snapshot file offsets, whole blocks) present in the container the
/// snapshot reads, or fails. The snapshot checks every block's CRC itself after.
pub trait Pager: Send + Sync {
    /// Makes every range of `ranges` readable; a pager may fetch them concurrently.
    fn need_all(&self, ranges: &[Range<u64>]) -> Result<()>;
}
