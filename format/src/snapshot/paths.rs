//! Paths: lookups through the hash index, the path order, and path or listing pages.

use std::ops::Range;
use std::sync::Arc;

use super::pages::{FileStat, PageEntries, PageIndex, PathEntry};
use crate::error::{FormatError, Result};
use crate::{le, path_hash};

use super::*;

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// Sample id whose path is exactly `path`, using the hash index (O(1) expected).
    pub fn lookup(&self, path: &[u8]) -> Result<Option<u64>> {
        if let (Some(_), Some(ix)) = (&self.pager, self.page_index.get()) {
            // Read in blocks, once a search or a listing has read the page index: one page
            // (likely held already, a listing's), instead of a slot of the hash index and the
            // candidate's path by id, each somewhere else in the snapshot.
            return self.lookup_in_pages(ix, path);
        }
        let h = path_hash(path);
        let tag = (h >> 32) as u32;
        let mask = self.l.hash_cap - 1;
        let slots = self.l.hash.start + 8;
        let mut i = h & mask;
        for _ in 0..self.l.hash_cap {
            let s = self.at(slots + i as usize * 8..slots + i as usize * 8 + 8)?;
            let id1 = le::u32_at(s, 0);
            if id1 == 0 {
                return Ok(None);
            }
            if le::u32_at(s, 4) == tag && self.path((id1 - 1) as u64)? == path {
                return Ok(Some((id1 - 1) as u64));
            }
            i = (i + 1) & mask;
        }
        Ok(None)
    }

    /// The sample id at position `pos` of the path-sorted order.
    pub fn sorted_id(&self, pos: u64) -> Result<u64> {
        if pos >= self.l.samples {
            return Err(FormatError::invalid(
                "path order",
                format!("{pos} out of range"),
            ));
        }
        let at = self.l.order.start + pos as usize * 4;
        let id = le::u32_at(self.at(at..at + 4)?, 0) as u64;
        if id >= self.l.samples {
            return Err(FormatError::invalid(
                "snapshot path order",
                format!("position {pos} holds sample id {id}, out of range"),
            ));
        }
        Ok(id)
    }

    /// Positions in the path-sorted order of every path starting with `prefix`: a binary
    /// search for the first, then [`Snapshot::prefix_end`] from there.
    pub fn prefix_range(&self, prefix: &[u8]) -> Result<Range<u64>> {
        let start = self.lower_bound(prefix)?;
        Ok(start..self.prefix_end(prefix, start)?)
    }

    /// The first position in the path order whose path is not less than `key`
    /// (`sample_count()` if there is none). With path pages (format 1.5): the index, then one
    /// page; otherwise a binary search of the path order.
    pub fn lower_bound(&self, key: &[u8]) -> Result<u64> {
        let Some(ix) = self.page_index()? else {
            return self.first_false(0, self.l.samples, |p| p < key);
        };
        if ix.is_empty() {
            return Ok(0);
        }
        let p = ix.page_for(key);
        let page = self.page(ix, p)?;
        Ok(ix.positions(p).start + page.partition_point(|e| e.path.as_slice() < key) as u64)
    }

    /// The sample whose path is `key`, from the path pages.
    pub(super) fn lookup_in_pages(&self, ix: &PageIndex, key: &[u8]) -> Result<Option<u64>> {
        Ok(self.page_entry(ix, key)?.map(|e| e.id))
    }

    /// The page entry whose path is `key`.
    pub(super) fn page_entry(&self, ix: &PageIndex, key: &[u8]) -> Result<Option<PathEntry>> {
        if ix.is_empty() {
            return Ok(None);
        }
        let page = self.page(ix, ix.page_for(key))?;
        Ok(page
            .binary_search_by(|e| e.path.as_slice().cmp(key))
            .ok()
            .map(|i| page[i].clone()))
    }

    /// Whether the snapshot's pages carry each file's size (and mode and mtime when
    /// recorded): listing pages, format 1.6. A listing then shows them from the pages
    /// ([`Snapshot::sorted_paths`]) without reading the sample table.
    pub fn pages_carry_stats(&self) -> bool {
        self.l
            .pages
            .as_ref()
            .is_some_and(|p| p.entries != PageEntries::Paths)
    }

    /// The sample whose path is `path`, with its size and mode and mtime. Read in blocks,
    /// with listing pages: the page index (read once) and one page, usually decoded already
    /// (a listing's); otherwise [`Snapshot::lookup`] and the sample's entries (held whole: a
    /// hash probe and two entries, cheaper than decoding a page for each random lookup).
    pub fn lookup_stat(&self, path: &[u8]) -> Result<Option<(u64, FileStat)>> {
        if self.pager.is_some() && self.pages_carry_stats() {
            if let Some(ix) = self.page_index()? {
                return Ok(self
                    .page_entry(ix, path)?
                    .map(|e| (e.id, e.stat.expect("listing pages carry stats"))));
            }
        }
        let Some(id) = self.lookup(path)? else {
            return Ok(None);
        };
        Ok(Some((id, self.stat(id)?)))
    }

    /// Sample `id`'s size and (when recorded) mode and mtime, from the sample table and kind 8.
    pub fn stat(&self, id: u64) -> Result<FileStat> {
        Ok(FileStat {
            size: self.sample(id)?.orig_len,
            attrs: self.attrs(id)?,
        })
    }

    /// Kind 17 (or 19), parsed and checked once (its bytes fetched whole), if the snapshot
    /// has pages.
    pub fn page_index(&self) -> Result<Option<&PageIndex>> {
        let Some(pl) = &self.l.pages else {
            return Ok(None);
        };
        if let Some(ix) = self.page_index.get() {
            return Ok(Some(ix));
        }
        let b = self.at(pl.index.clone())?;
        let ix = PageIndex::parse(b, pl.pages.len() as u64, self.l.samples, pl.entries)?;
        Ok(Some(self.page_index.get_or_init(|| ix)))
    }

    /// Page `p`'s entries (sample id, path), decoded and checked.
    pub(super) fn page(&self, ix: &PageIndex, p: usize) -> Result<Arc<Page>> {
        let mut kept = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = kept.iter().position(|k| k.0 == p) {
            let k = kept.remove(i);
            kept.push(k.clone());
            return Ok(k.1);
        }
        drop(kept);
        let page = Arc::new(ix.decode(p, self.page_bytes(ix, p)?, self.l.samples)?);
        let mut kept = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= DECODED_PAGES {
            kept.remove(0);
        }
        kept.push((p, page.clone()));
        Ok(page)
    }

    /// Page `p`'s bytes, made present.
    pub(super) fn page_bytes(&self, ix: &PageIndex, p: usize) -> Result<&[u8]> {
        let start = self.l.pages.as_ref().map_or(0, |pl| pl.pages.start);
        let r = ix.bytes(p);
        self.at(start + r.start as usize..start + r.end as usize)
    }

    /// The sample ids and paths at `positions` of the path order (clamped to it), and with
    /// listing pages (format 1.6) each file's stat. With pages: the pages holding them,
    /// fetched together; otherwise each position's id and path (fetched together first when
    /// the snapshot is read in blocks).
    pub fn sorted_paths(&self, positions: Range<u64>) -> Result<Vec<PathEntry>> {
        let n = self.l.samples;
        let (a, b) = (positions.start.min(n), positions.end.min(n));
        if a >= b {
            return Ok(Vec::new());
        }
        let Some(ix) = self.page_index()? else {
            self.prefetch_sorted_paths(a..b)?;
            return (a..b)
                .map(|pos| {
                    let id = self.sorted_id(pos)?;
                    Ok(PathEntry {
                        id,
                        path: self.path(id)?.to_vec(),
                        stat: None,
                    })
                })
                .collect();
        };
        let pages = ix.page_of(a)..ix.page_of(b - 1) + 1;
        if let (Some(pg), Some(pl)) = (&self.pager, &self.l.pages) {
            let r = pl.pages.start as u64;
            let (s, e) = (ix.bytes(pages.start).start, ix.bytes(pages.end - 1).end);
            pg.need(r + s..r + e)?;
        }
        let mut out = Vec::with_capacity((b - a) as usize);
        for p in pages {
            let at = ix.positions(p).start;
            let entries = self.page(ix, p)?;
            let (from, to) = (a.max(at) - at, b.min(ix.positions(p).end) - at);
            out.extend_from_slice(&entries[from as usize..to as usize]);
        }
        Ok(out)
    }

    /// The end of the run of paths starting with `prefix` that begins at position `from`:
    /// the first position from `from` on whose path does not start with `prefix` (`from`
    /// itself if its path does not). Gallops from `from`, then bisects: O(log run) paths
    /// read, most of them near `from`.
    pub fn prefix_end(&self, prefix: &[u8], from: u64) -> Result<u64> {
        let n = self.l.samples;
        if self.l.pages.is_some() {
            // Two searches of the pages: where the prefix's run starts and where the paths
            // greater than all of it start.
            let (start, end) = (
                self.lower_bound(prefix)?,
                match prefix_successor(prefix) {
                    Some(s) => self.lower_bound(&s)?,
                    None => n,
                },
            );
            return Ok(if (start..end).contains(&from) {
                end
            } else {
                from.min(n)
            });
        }
        let has =
            |pos: u64| -> Result<bool> { Ok(self.path(self.sorted_id(pos)?)?.starts_with(prefix)) };
        if from >= n || !has(from)? {
            return Ok(from.min(n));
        }
        // `lo` holds the prefix; `hi` does not (or is the end).
        let (mut lo, mut step) = (from, 1u64);
        let hi = loop {
            let probe = lo.saturating_add(step);
            if probe >= n {
                break n;
            }
            if !has(probe)? {
                break probe;
            }
            lo = probe;
            step = step.saturating_mul(2);
        };
        self.first_false(lo + 1, hi, |p| p.starts_with(prefix))
    }

    /// The first position in `lo..hi` of the path order whose path fails `holds` (`hi` if
    /// none), for a `holds` true on a prefix of the order: a binary search. (Searching with
    /// several probes fetched together per round took more time on the S3 test server, not
    /// less: 117 GETs in 2.9-4.1 s against 55 GETs in 1.7 s at 10 M samples.)
    pub(super) fn first_false(
        &self,
        mut lo: u64,
        mut hi: u64,
        holds: impl Fn(&[u8]) -> bool,
    ) -> Result<u64> {
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if holds(self.path(self.sorted_id(mid)?)?) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

/// The least byte string greater than every string starting with `prefix` (`None` when
/// there is none: `prefix` empty or all 0xff).
pub(super) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let keep = prefix.iter().rposition(|&b| b != 0xff)?;
    let mut s = prefix[..=keep].to_vec();
    s[keep] += 1;
    Some(s)
}
