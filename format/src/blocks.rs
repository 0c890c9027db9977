//! Block checksums (format 1.4, section kinds 14 and 15): a CRC-32 per block of the snapshot,
//! so that a reader holding only some of its bytes (fetched with ranged reads from an object
//! store) can check each block it fetches without the rest of its section.
//!
//! Kind 14 holds one CRC-32 per `block_size` bytes of the *covered* range: every byte from the
//! end of the section table to the start of kind 14 itself (all other sections and their
//! padding). Kind 15, small and read whole, holds the block size, the covered range and one
//! CRC-32 per `block_size` bytes of kind 14, so that kind 14 can itself be read in pieces.
//! The header CRC covers the section table, which covers kind 15's CRC: one chain of trust
//! from the 64-byte header down to every block.

use std::ops::Range;

use crate::error::{FormatError, Result};
use crate::le;

/// Block size the writer uses (64 KiB).
pub const BLOCK_SIZE: u32 = 64 << 10;
/// Smallest block size a reader accepts.
pub const MIN_BLOCK_SIZE: u32 = 4 << 10;
/// Largest block size a reader accepts.
pub const MAX_BLOCK_SIZE: u32 = 16 << 20;
/// Length of kind 15's header: `block_size: u32`, reserved `u32`, `start: u64`, `end: u64`.
pub const BLOCK_INDEX_HEADER_LEN: usize = 24;

/// What a reader that fetches a snapshot in pieces provides: `need(range)` makes the bytes of
/// `range` (snapshot file offsets) present and checked in the container the snapshot reads, or
/// fails. A local container needs no pager.
pub trait Pager: Send + Sync {
    /// Makes `range` readable; ranges past the end are clamped by the caller.
    fn need(&self, range: Range<u64>) -> Result<()>;

    /// Makes every range of `ranges` readable; a pager may fetch them concurrently.
    fn need_all(&self, ranges: &[Range<u64>]) -> Result<()> {
        ranges.iter().try_for_each(|r| self.need(r.clone()))
    }
}

/// The block checksum layout of a snapshot (what kind 15 says, checked against the section
/// table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockIndex {
    /// Bytes per block (a power of two).
    pub block_size: u64,
    /// The covered range: the end of the section table to the start of kind 14.
    pub covered: Range<u64>,
    /// Where kind 14 (one CRC per covered block) lies in the file.
    pub crcs: Range<u64>,
    /// The CRC of each `block_size` piece of kind 14 (kind 15's table).
    pub pages: Vec<u32>,
}

impl BlockIndex {
    /// Parses kind 15 (`index`, whole) given where kind 14 lies and where the section table
    /// ends; checks every size and that the ranges agree.
    pub fn parse(index: &[u8], crcs: Range<u64>, table_end: u64) -> Result<BlockIndex> {
        const WHAT: &str = "snapshot block index";
        if index.len() < BLOCK_INDEX_HEADER_LEN {
            return Err(FormatError::truncated(
                WHAT,
                BLOCK_INDEX_HEADER_LEN as u64,
                index.len() as u64,
            ));
        }
        let bs = le::u32_at(index, 0);
        if !bs.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
            return Err(FormatError::invalid(
                WHAT,
                format!(
                    "block size {bs} is not a power of two in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}"
                ),
            ));
        }
        if le::u32_at(index, 4) != 0 {
            return Err(FormatError::invalid(WHAT, "reserved field is not zero"));
        }
        let bs = bs as u64;
        let covered = le::u64_at(index, 8)..le::u64_at(index, 16);
        if covered.start != table_end || covered.end != crcs.start {
            return Err(FormatError::invalid(
                WHAT,
                format!(
                    "covers {}..{}, expected {table_end}..{} (section table to block checksums)",
                    covered.start, covered.end, crcs.start
                ),
            ));
        }
        let blocks = (covered.end - covered.start).div_ceil(bs);
        if crcs.end - crcs.start != blocks * 4 {
            return Err(FormatError::invalid(
                "snapshot block checksums",
                format!(
                    "section is {} bytes, expected {} for {blocks} blocks",
                    crcs.end - crcs.start,
                    blocks * 4
                ),
            ));
        }
        let pages = (crcs.end - crcs.start).div_ceil(bs);
        if (index.len() - BLOCK_INDEX_HEADER_LEN) as u64 != pages * 4 {
            return Err(FormatError::invalid(
                WHAT,
                format!(
                    "section is {} bytes, expected {}",
                    index.len(),
                    BLOCK_INDEX_HEADER_LEN as u64 + pages * 4
                ),
            ));
        }
        let pages = index[BLOCK_INDEX_HEADER_LEN..]
            .chunks_exact(4)
            .map(|c| le::u32_at(c, 0))
            .collect();
        Ok(BlockIndex {
            block_size: bs,
            covered,
            crcs,
            pages,
        })
    }

    /// Number of covered blocks.
    pub fn block_count(&self) -> u64 {
        (self.covered.end - self.covered.start).div_ceil(self.block_size)
    }

    /// The file range of covered block `b`.
    pub fn block(&self, b: u64) -> Range<u64> {
        let start = self.covered.start + b * self.block_size;
        start..(start + self.block_size).min(self.covered.end)
    }

    /// The covered blocks that `range` touches (empty if it touches none).
    pub fn blocks_of(&self, range: &Range<u64>) -> Range<u64> {
        let (s, e) = (
            range.start.max(self.covered.start),
            range.end.min(self.covered.end),
        );
        if s >= e {
            return 0..0;
        }
        let c = self.covered.start;
        (s - c) / self.block_size..(e - c).div_ceil(self.block_size)
    }

    /// The file range of page `p` of kind 14 (the piece kind 15's entry `p` covers).
    pub fn page(&self, p: u64) -> Range<u64> {
        let start = self.crcs.start + p * self.block_size;
        start..(start + self.block_size).min(self.crcs.end)
    }

    /// The page of kind 14 holding block `b`'s CRC, and the CRC's offset within that page.
    pub fn crc_at(&self, b: u64) -> (u64, usize) {
        let at = b * 4;
        (at / self.block_size, (at % self.block_size) as usize)
    }

    /// The pages of kind 14 that `range` touches.
    pub fn pages_of(&self, range: &Range<u64>) -> Range<u64> {
        let (s, e) = (
            range.start.max(self.crcs.start),
            range.end.min(self.crcs.end),
        );
        if s >= e {
            return 0..0;
        }
        let c = self.crcs.start;
        (s - c) / self.block_size..(e - c).div_ceil(self.block_size)
    }

    /// Checks every block and every page of a whole snapshot `b` (O(size)); the first problem.
    pub fn check(&self, b: &[u8]) -> Result<()> {
        let crcs = &b[self.crcs.start as usize..self.crcs.end as usize];
        for p in 0..self.pages.len() as u64 {
            let r = self.page(p);
            check_block(
                "snapshot block checksums",
                p,
                self.pages[p as usize],
                &b[r.start as usize..r.end as usize],
            )?;
        }
        for blk in 0..self.block_count() {
            let r = self.block(blk);
            check_block(
                "snapshot",
                blk,
                le::u32_at(crcs, blk as usize * 4),
                &b[r.start as usize..r.end as usize],
            )?;
        }
        Ok(())
    }
}

/// Checks block (or page) `n` of `what` against its stored CRC.
pub fn check_block(what: &str, n: u64, expected: u32, data: &[u8]) -> Result<()> {
    let actual = crc32fast::hash(data);
    if actual != expected {
        return Err(FormatError::ChecksumMismatch {
            what: format!("{what} block {n}"),
            expected,
            actual,
        });
    }
    Ok(())
}

/// Computes block CRCs over a byte stream fed in order (what the writer uses).
pub(crate) struct BlockHasher {
    bs: u64,
    filled: u64,
    cur: crc32fast::Hasher,
    out: Vec<u32>,
}

impl BlockHasher {
    pub(crate) fn new(bs: u64) -> Self {
        BlockHasher {
            bs,
            filled: 0,
            cur: crc32fast::Hasher::new(),
            out: Vec::new(),
        }
    }

    pub(crate) fn feed(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let k = ((self.bs - self.filled) as usize).min(b.len());
            self.cur.update(&b[..k]);
            self.filled += k as u64;
            b = &b[k..];
            if self.filled == self.bs {
                let h = std::mem::replace(&mut self.cur, crc32fast::Hasher::new());
                self.out.push(h.finalize());
                self.filled = 0;
            }
        }
    }

    /// Feeds the zeros (alignment padding) that bring file offset `at` to a multiple of 8.
    pub(crate) fn pad8(&mut self, at: &mut u64) {
        let pad = crate::le::align8(*at) - *at;
        self.feed(&[0u8; 8][..pad as usize]);
        *at += pad;
    }

    pub(crate) fn finish(mut self) -> Vec<u32> {
        if self.filled > 0 {
            self.out.push(self.cur.finalize());
        }
        self.out
    }
}

/// Kinds 14 and 15 for covered range `covered` whose block CRCs are `crcs`.
pub(crate) fn encode_block_sections(
    bs: u32,
    covered: Range<u64>,
    crcs: &[u32],
) -> (Vec<u8>, Vec<u8>) {
    let k14: Vec<u8> = crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    let mut k15 = Vec::with_capacity(BLOCK_INDEX_HEADER_LEN + k14.len().div_ceil(bs as usize) * 4);
    k15.extend_from_slice(&bs.to_le_bytes());
    k15.extend_from_slice(&0u32.to_le_bytes());
    k15.extend_from_slice(&covered.start.to_le_bytes());
    k15.extend_from_slice(&covered.end.to_le_bytes());
    for page in k14.chunks(bs as usize) {
        k15.extend_from_slice(&crc32fast::hash(page).to_le_bytes());
    }
    (k14, k15)
}
