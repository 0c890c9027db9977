//! Snapshots read in blocks: what a reader asks the pager to fetch before it reads.

use std::ops::Range;

use crate::blocks::BlockIndex;
use crate::error::Result;
use crate::le;
use crate::SAMPLE_ENTRY_LEN;

use super::*;

impl<B: AsRef<[u8]>> Snapshot<B> {
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
    pub(super) fn prefetch_sorted_paths(&self, positions: Range<u64>) -> Result<()> {
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
}
