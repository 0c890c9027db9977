//! The namespace read: lookups, listings, paths and stats by sample id.
//!
//! A lookup or a listing takes the page index (parsed once, O(pages)), finds the page that
//! can hold a key by bisection of the pages' first paths, and decodes that page (kept among
//! the last few decoded). A path by sample id goes through the id table.

use std::ops::Range;
use std::sync::Arc;

use super::namespace::{
    prefix_successor, EntryView, FileStat, NsEntry, PageIndex, RESTART_INTERVAL,
};
use super::{SectionKind, Snapshot, DECODED_PAGES};
use crate::error::{bail, invalid, Result};
use crate::le;

const NS: &str = "snapshot namespace";

/// Where a walk through a page starts.
#[derive(Clone, Copy)]
enum From<'a> {
    /// At the entry with this index in the page.
    Index(usize),
    /// At the first entry whose path is not less than this key.
    Key(&'a [u8]),
}

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// The page index, parsed and checked on first use.
    pub fn page_index(&self) -> Result<&PageIndex> {
        if let Some(ix) = self.page_index.get() {
            return Ok(ix);
        }
        let b = self.at(self.ns.index.clone())?;
        let ix = PageIndex::parse(b, &self.ns, self.h.samples, self.h.has_attrs())?;
        Ok(self.page_index.get_or_init(|| ix))
    }

    /// Page `p`, decoded and checked (kept among the last [`DECODED_PAGES`] decoded).
    pub fn page(&self, p: usize) -> Result<Arc<Vec<NsEntry>>> {
        let ix = self.page_index()?;
        if let Some(page) = self.kept(p) {
            return Ok(page);
        }
        let page = Arc::new(ix.decode(p, self.page_bytes(ix, p)?)?);
        let mut d = self.decoded.lock().expect("decoded pages");
        if d.len() >= DECODED_PAGES {
            d.remove(0);
        }
        d.push((p, page.clone()));
        Ok(page)
    }

    /// Page `p` as decoded, if it is kept.
    fn kept(&self, p: usize) -> Option<Arc<Vec<NsEntry>>> {
        let d = self.decoded.lock().expect("decoded pages");
        d.iter()
            .find(|(q, _)| *q == p)
            .map(|(_, page)| page.clone())
    }

    /// Page `p`'s bytes.
    fn page_bytes(&self, ix: &PageIndex, p: usize) -> Result<&[u8]> {
        let (r, a) = (ix.bytes(p), self.ns.area.start);
        self.at(a + r.start as usize..a + r.end as usize)
    }

    /// Walks page `p`'s entries in order from where `from` says (from the decoded copy if one
    /// is kept, else from its bytes, starting at the restart before it, without decoding the
    /// rest of the page) until `f` returns something; `f` gets each entry's index in the page.
    fn scan<T>(
        &self,
        p: usize,
        from: From<'_>,
        mut f: impl FnMut(usize, &EntryView<'_>) -> Option<T>,
    ) -> Result<Option<T>> {
        if let Some(page) = self.kept(p) {
            let start = match from {
                From::Index(i) => i,
                From::Key(key) => page.partition_point(|e| e.path.as_slice() < key),
            };
            let mut entries = page.iter().enumerate().skip(start);
            return Ok(entries.find_map(|(i, e)| f(i, &e.view())));
        }
        let ix = self.page_index()?;
        let restarts = ix.restarts(p, self.page_bytes(ix, p)?)?;
        let k = match from {
            From::Index(i) => i / RESTART_INTERVAL,
            From::Key(key) => {
                // The last restart whose path is not greater than the key (restart 0's is the
                // page's first path, which is not, or the page would not have been chosen).
                let (mut lo, mut hi) = (0usize, restarts.len());
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    match ix.restart_path(p, restarts.entries, restarts.get(mid))? <= key {
                        true => lo = mid,
                        false => hi = mid,
                    }
                }
                lo
            }
        };
        let (mut out, mut i) = (None, k * RESTART_INTERVAL);
        ix.walk(p, &restarts, k, &mut |e| {
            out = f(i, e);
            i += 1;
            out.is_none()
        })?;
        Ok(out)
    }

    /// The first position whose path is not less than `key` (the entry count if none is).
    pub fn lower_bound(&self, key: &[u8]) -> Result<u64> {
        let ix = self.page_index()?;
        if ix.is_empty() {
            return Ok(0);
        }
        let p = ix.page_for(key);
        let at = self.scan(p, From::Key(key), |i, e| {
            (e.path >= key).then_some(i as u64)
        })?;
        let r = ix.positions(p);
        Ok(at.map_or(r.end, |i| r.start + i))
    }

    /// The entry whose path is exactly `path`, and its position. A file's tag is checked
    /// against the id table (which must lead back to this position), so that a tag naming
    /// another sample is an error rather than that sample's bytes under this path.
    pub fn find(&self, path: &[u8]) -> Result<Option<(u64, NsEntry)>> {
        let ix = self.page_index()?;
        if ix.is_empty() {
            return Ok(None);
        }
        let p = ix.page_for(path);
        let first = ix.positions(p).start;
        let hit = self.scan(p, From::Key(path), |i, e| match e.path.cmp(path) {
            std::cmp::Ordering::Less => None,
            std::cmp::Ordering::Equal => Some(Some((first + i as u64, e.to_entry()))),
            std::cmp::Ordering::Greater => Some(None),
        })?;
        if let Some((pos, NsEntry { id: Some(id), .. })) = &hit.as_ref().and_then(|h| h.as_ref()) {
            let back = self.position(*id)?;
            if back != *pos {
                bail!(
                    NS,
                    "the entry at position {pos} is tagged sample {id}, whose id table entry \
                     is position {back}: the tag or the id table is wrong"
                );
            }
        }
        Ok(hit.flatten())
    }

    /// The sample whose file is exactly `path` (`None` for a directory or no entry).
    pub fn lookup(&self, path: &[u8]) -> Result<Option<u64>> {
        Ok(self.find(path)?.and_then(|(_, e)| e.id))
    }

    /// The sample whose file is `path`, with its size and mode and mtime.
    pub fn lookup_stat(&self, path: &[u8]) -> Result<Option<(u64, FileStat)>> {
        Ok(self.find(path)?.and_then(|(_, e)| Some((e.id?, e.stat()))))
    }

    /// The entries at `positions` (clamped to the entry count), in path order.
    pub fn entries(&self, positions: Range<u64>) -> Result<Vec<NsEntry>> {
        let end = positions.end.min(self.ns.entries);
        let mut out = Vec::with_capacity(end.saturating_sub(positions.start) as usize);
        let mut pos = positions.start;
        let ix = self.page_index()?;
        if pos < end {
            // Every page of the run fetched at once.
            let (p0, p1) = (ix.page_of(pos), ix.page_of(end - 1));
            let a = self.ns.area.start;
            let run = a + ix.bytes(p0).start as usize..a + ix.bytes(p1).end as usize;
            self.prefetch(std::slice::from_ref(&run))?;
        }
        while pos < end {
            let p = ix.page_of(pos);
            let page = self.page(p)?;
            let first = ix.positions(p).start;
            let take = (end.min(ix.positions(p).end) - pos) as usize;
            let from = (pos - first) as usize;
            out.extend_from_slice(&page[from..from + take]);
            pos += take as u64;
        }
        Ok(out)
    }

    /// The entry at position `pos`.
    pub fn entry(&self, pos: u64) -> Result<NsEntry> {
        if pos >= self.ns.entries {
            bail!(NS, "position {pos} of {}", self.ns.entries);
        }
        let ix = self.page_index()?;
        let p = ix.page_of(pos);
        let want = (pos - ix.positions(p).start) as usize;
        self.scan(p, From::Index(want), |i, e| {
            (i == want).then(|| e.to_entry())
        })?
        .ok_or_else(|| invalid!(NS, "position {pos} is missing"))
    }

    /// The positions of the entries whose paths start with `prefix`.
    pub fn prefix_range(&self, prefix: &[u8]) -> Result<Range<u64>> {
        let start = self.lower_bound(prefix)?;
        let end = match prefix_successor(prefix) {
            Some(s) => self.lower_bound(&s)?,
            None => self.ns.entries,
        };
        Ok(start..end.max(start))
    }

    /// Sample `id`'s position in the namespace (from the id table).
    pub fn position(&self, id: u64) -> Result<u64> {
        self.check_live(id)?;
        let at = self.ns.idtab.start + id as usize * 4;
        let pos = le::u32_at(self.at(at..at + 4)?, 0) as u64;
        if pos >= self.ns.entries {
            bail!(
                NS,
                "id table: sample {id} at position {pos} of {}",
                self.ns.entries
            );
        }
        Ok(pos)
    }

    /// Sample `id`'s namespace entry (its path, size and attributes), checked to be its own.
    pub fn file_entry(&self, id: u64) -> Result<NsEntry> {
        let pos = self.position(id)?;
        let e = self.entry(pos)?;
        if e.id != Some(id) {
            bail!(
                NS,
                "id table: sample {id} at position {pos}, which holds {}",
                match e.id {
                    Some(o) => format!("sample {o}"),
                    None => "a directory".into(),
                }
            );
        }
        Ok(e)
    }

    /// Path of sample `id`.
    pub fn path(&self, id: u64) -> Result<Vec<u8>> {
        Ok(self.file_entry(id)?.path)
    }

    /// Sample `id`'s size and (when recorded) mode and mtime.
    pub fn stat(&self, id: u64) -> Result<FileStat> {
        Ok(self.file_entry(id)?.stat())
    }

    /// Sample `id`'s mode and mtime; `None` if the snapshot does not record them.
    pub fn attrs(&self, id: u64) -> Result<Option<super::FileAttrs>> {
        match self.has_attrs() {
            false => Ok(None),
            true => Ok(self.file_entry(id)?.attrs),
        }
    }

    /// Every directory, in path order, with its attributes (reads the whole namespace).
    pub fn dirs(&self) -> Result<Vec<NsEntry>> {
        // The count is the header's: reserve no more than the namespace could hold (an entry
        // takes at least one byte), so that a hostile count is not an allocation.
        let ns = self.s.get(SectionKind::Namespace).len();
        let mut out = Vec::with_capacity((self.dir_count() as usize).min(ns));
        if self.dir_count() == 0 {
            return Ok(out);
        }
        self.prefetch_namespace()?;
        let ix = self.page_index()?;
        for p in 0..ix.len() {
            out.extend(self.page(p)?.iter().filter(|e| e.is_dir()).cloned());
        }
        Ok(out)
    }

    /// Fetches the whole namespace at once (a reader about to walk all of it).
    pub fn prefetch_namespace(&self) -> Result<()> {
        let s = self.s.get(SectionKind::Namespace);
        self.prefetch(&[s])
    }

    /// Fetches the record entries of samples `ids` at once (a reader about to read them).
    pub fn prefetch_records(&self, ids: Range<u64>) -> Result<()> {
        let r = self.s.get(SectionKind::Records);
        let end = ids.end.min(self.h.samples);
        if ids.start >= end {
            return Ok(());
        }
        // One more: a record's length is where the next one starts.
        let end = (end + 1).min(self.h.samples);
        let at = |i: u64| r.start + i as usize * super::RECORD_LEN;
        self.prefetch(std::slice::from_ref(&(at(ids.start)..at(end))))
    }
}
