//! Path pages (format 1.5, snapshot kinds 16 and 17): the path order's paths with their
//! sample ids, front-coded, in pages of at most [`PAGE_TARGET`] bytes (a page holds at least
//! one entry), and an index of every page's offset, first position and first path. Listing
//! pages (format 1.6, kinds 18 and 19) are the same pages whose entries also carry what a
//! listing shows of each file: its size and, when the snapshot records them, its mode and
//! mtime ([`FileStat`]).
//!
//! Paths are stored by sample id (kind 3), and sample ids are mixed across directories, so a
//! search of the path order (kind 5) through kind 3 reads a scattered path at every step, and
//! a directory's paths are scattered over the whole table. A reader that fetches the snapshot
//! in pieces instead takes the index whole (about 40 bytes per page), finds the page that can
//! hold a key in it, and reads one page; a directory's paths are contiguous pages.

use std::ops::Range;

use super::types::FileAttrs;
use crate::error::{FormatError, Result};
use crate::le;
use crate::strtab::{encode_string_table, StringTable};

/// A writer closes a page before an entry that would take it past this many bytes.
pub const PAGE_TARGET: usize = 64 * 1024;

const PAGES: &str = "snapshot path pages";
const INDEX: &str = "snapshot path page index";
const LISTING: &str = "snapshot listing pages";
const LISTING_INDEX: &str = "snapshot listing page index";

/// What a page's entries carry besides the path and the sample id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageEntries {
    /// Kind 16 (format 1.5): nothing more.
    Paths,
    /// Kind 18 (format 1.6) in a snapshot without file attributes: the file's size.
    Sizes,
    /// Kind 18 in a snapshot with file attributes (kind 8): size, mode and mtime.
    SizesAndAttrs,
}

/// What a listing shows of a file: its size (the original length of its sample) and, when
/// the snapshot records them, its mode and mtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    /// The sample's original length.
    pub size: u64,
    /// Mode and mtime as packed (format 1.2 snapshots that record them).
    pub attrs: Option<FileAttrs>,
}

/// One position of the path order, as a page holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathEntry {
    /// The sample at this position.
    pub id: u64,
    /// Its path.
    pub path: Vec<u8>,
    /// Its size, mode and mtime, when the snapshot's pages carry them (listing pages, format
    /// 1.6); `None` otherwise.
    pub stat: Option<FileStat>,
}

/// `v` zigzag-encoded: small magnitudes of either sign become small unsigned numbers.
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Appends `v` as unsigned LEB128.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads an unsigned LEB128 of at most 10 bytes (`None` past the end or on overflow).
fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at)?;
        *at += 1;
        let bits = u64::from(byte & 0x7f);
        if i == 9 && byte > 1 {
            return None;
        }
        v |= bits << (7 * i);
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

fn shared_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One entry: the bytes it shares with the previous path, the rest, the sample id, and the
/// file's stat if there is one (its mtime relative to `prev_mtime`, the previous entry's in
/// the page, or 0).
fn encode_entry(
    shared: usize,
    path: &[u8],
    id: u32,
    stat: Option<FileStat>,
    prev_mtime: i64,
) -> Vec<u8> {
    let mut e = Vec::with_capacity(path.len() - shared + 24);
    put_varint(&mut e, shared as u64);
    put_varint(&mut e, (path.len() - shared) as u64);
    e.extend_from_slice(&path[shared..]);
    e.extend_from_slice(&id.to_le_bytes());
    if let Some(s) = stat {
        put_varint(&mut e, s.size);
        if let Some(a) = s.attrs {
            put_varint(&mut e, u64::from(a.mode));
            put_varint(&mut e, zigzag(a.mtime_ns.wrapping_sub(prev_mtime)));
        }
    }
    e
}

/// Encodes the entries `(path, sample id, stat)` of the path order, in order, into pages:
/// calls `page` with each page's bytes. Returns the page index (kind 17 or 19) for a kind 16
/// or 18 that is those pages back to back. The entries carry a stat in listing pages (kind
/// 18) and none in path pages (kind 16); within one snapshot they all carry the same parts.
pub fn encode_pages<'a>(
    entries: impl Iterator<Item = (&'a [u8], u32, Option<FileStat>)>,
    mut page: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<Vec<u8>> {
    let (mut offsets, mut firsts, mut first_paths) =
        (vec![0u64], vec![0u64], Vec::<Vec<u8>>::new());
    let (mut buf, mut prev) = (Vec::new(), Vec::<u8>::new());
    let (mut pos, mut prev_mtime) = (0u64, 0i64);
    let mut close = |buf: &mut Vec<u8>, pos: u64| {
        page(buf)?;
        offsets.push(offsets.last().expect("from 0") + buf.len() as u64);
        firsts.push(pos);
        buf.clear();
        std::io::Result::Ok(())
    };
    for (path, id, stat) in entries {
        let mut entry = encode_entry(shared_prefix(&prev, path), path, id, stat, prev_mtime);
        if !buf.is_empty() && buf.len() + entry.len() > PAGE_TARGET {
            close(&mut buf, pos)?;
            entry = encode_entry(0, path, id, stat, 0);
        }
        prev_mtime = stat.and_then(|s| s.attrs).map_or(0, |a| a.mtime_ns);
        if buf.is_empty() {
            first_paths.push(path.to_vec());
        }
        buf.extend_from_slice(&entry);
        prev.clear();
        prev.extend_from_slice(path);
        pos += 1;
    }
    if !buf.is_empty() {
        close(&mut buf, pos)?;
    }
    let pages = first_paths.len() as u64;
    let mut out = Vec::with_capacity(8 + 16 * (pages as usize + 1));
    out.extend_from_slice(&pages.to_le_bytes());
    for v in offsets.iter().chain(&firsts) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&encode_string_table(first_paths.iter()));
    Ok(out)
}

/// Kind 17 (or 19), checked: every page's bytes in kind 16 (or 18), positions and first path.
#[derive(Clone, Debug)]
pub struct PageIndex {
    entries: PageEntries,
    offsets: Vec<u64>,
    firsts: Vec<u64>,
    /// The first paths back to back; page `p`'s is `first_blob[ends[p]..ends[p + 1]]`.
    first_blob: Vec<u8>,
    ends: Vec<usize>,
}

impl PageEntries {
    /// The names of the pages' section and of their index, for errors.
    pub(crate) fn names(self) -> (&'static str, &'static str) {
        match self {
            PageEntries::Paths => (PAGES, INDEX),
            _ => (LISTING, LISTING_INDEX),
        }
    }
}

/// The page count kind 17 (or 19) declares, and the length it must then have at least (its
/// fixed part and an empty string table): what opening a snapshot checks in O(1).
pub fn declared_pages(b: &[u8], samples: u64, entries: PageEntries) -> Result<u64> {
    let index = entries.names().1;
    if b.len() < 8 {
        return Err(FormatError::truncated(index, 8, b.len() as u64));
    }
    let p = le::u64_at(b, 0);
    let fixed = p
        .checked_add(1)
        .and_then(|x| x.checked_mul(16))
        .and_then(|x| x.checked_add(8 + 16));
    if p > samples || (p == 0) != (samples == 0) || fixed.is_none_or(|f| f > b.len() as u64) {
        return Err(FormatError::invalid(
            index,
            format!("{p} pages for {samples} samples in {} bytes", b.len()),
        ));
    }
    Ok(p)
}

impl PageIndex {
    /// Parses and checks kind 17 or 19 (`b`) for a kind 16 or 18 of `pages_len` bytes whose
    /// entries carry `entries`, and `samples` samples: offsets from 0 rising to `pages_len`,
    /// first positions from 0 rising to `samples`, one first path per page, rising. O(pages).
    pub fn parse(
        b: &[u8],
        pages_len: u64,
        samples: u64,
        entries: PageEntries,
    ) -> Result<PageIndex> {
        let index = entries.names().1;
        let p = declared_pages(b, samples, entries)? as usize;
        let word = |i: usize| le::u64_at(b, 8 + 8 * i);
        let offsets: Vec<u64> = (0..=p).map(word).collect();
        let firsts: Vec<u64> = (p + 1..=2 * p + 1).map(word).collect();
        let rising =
            |v: &[u64], end: u64| v[0] == 0 && v[p] == end && v.windows(2).all(|w| w[0] < w[1]);
        if !rising(&offsets, pages_len) {
            return Err(FormatError::invalid(
                index,
                format!("page offsets do not rise from 0 to the {pages_len} bytes of the pages"),
            ));
        }
        if !rising(&firsts, samples) {
            return Err(FormatError::invalid(
                index,
                format!("first positions do not rise from 0 to {samples}"),
            ));
        }
        let t = StringTable::parse(&b[8 + 16 * (p + 1)..], index)?;
        if t.len() != p as u64 {
            return Err(FormatError::invalid(
                index,
                format!("{} first paths for {p} pages", t.len()),
            ));
        }
        let (mut first_blob, mut ends) = (Vec::new(), vec![0usize]);
        for i in 0..p as u64 {
            let path = t.get(i)?;
            if i > 0 && path <= &first_blob[ends[i as usize - 1]..] {
                return Err(FormatError::invalid(
                    index,
                    format!("first path of page {i} does not follow the previous page's"),
                ));
            }
            first_blob.extend_from_slice(path);
            ends.push(first_blob.len());
        }
        Ok(PageIndex {
            entries,
            offsets,
            firsts,
            first_blob,
            ends,
        })
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.ends.len() - 1
    }

    /// True when there are no pages (no samples).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Page `p`'s bytes within kind 16.
    pub fn bytes(&self, p: usize) -> Range<u64> {
        self.offsets[p]..self.offsets[p + 1]
    }

    /// The positions of the path order page `p` holds.
    pub fn positions(&self, p: usize) -> Range<u64> {
        self.firsts[p]..self.firsts[p + 1]
    }

    /// Page `p`'s first path.
    pub fn first_path(&self, p: usize) -> &[u8] {
        &self.first_blob[self.ends[p]..self.ends[p + 1]]
    }

    /// The page holding position `pos` (< the sample count).
    pub fn page_of(&self, pos: u64) -> usize {
        self.firsts.partition_point(|&f| f <= pos) - 1
    }

    /// The last page whose first path is not greater than `key` (page 0 if none is): the
    /// only page that can hold the first path not less than `key`, unless that is the next
    /// page's first.
    pub fn page_for(&self, key: &[u8]) -> usize {
        // The first page whose first path is greater than `key`, by bisection.
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.first_path(mid) <= key {
                true => lo = mid + 1,
                false => hi = mid,
            }
        }
        lo.saturating_sub(1)
    }

    /// What the entries carry besides path and sample id.
    pub fn entries(&self) -> PageEntries {
        self.entries
    }

    /// Decodes page `p` from its bytes (`b`) and checks it: entries that fill it exactly, as
    /// many as its positions, the first being its first path, rising, ids below `samples`,
    /// modes within `0o7777`.
    pub fn decode(&self, p: usize, b: &[u8], samples: u64) -> Result<Vec<PathEntry>> {
        let mut out =
            Vec::with_capacity((self.positions(p).end - self.positions(p).start) as usize);
        self.walk(p, b, samples, |id, path, stat| {
            out.push(PathEntry {
                id,
                path: path.to_vec(),
                stat,
            });
            true
        })?;
        Ok(out)
    }

    /// The stat that follows an entry's sample id at `at` in `b`, if the entries carry one
    /// (`None` inside: cut short or a mode beyond `0o7777`).
    fn stat_at(&self, b: &[u8], at: &mut usize, prev_mtime: i64) -> Option<Option<FileStat>> {
        if self.entries == PageEntries::Paths {
            return Some(None);
        }
        let size = get_varint(b, at)?;
        let attrs = match self.entries {
            PageEntries::SizesAndAttrs => {
                let mode = u32::try_from(get_varint(b, at)?)
                    .ok()
                    .filter(|&m| m <= 0o7777)?;
                let delta = unzigzag(get_varint(b, at)?);
                Some(FileAttrs {
                    mode,
                    mtime_ns: prev_mtime.wrapping_add(delta),
                })
            }
            _ => None,
        };
        Some(Some(FileStat { size, attrs }))
    }

    /// Calls `f` with page `p`'s entries in order until it returns false, checking each (and,
    /// if it reaches the end, that the entries fill the page and are as many as its
    /// positions). Returns how many entries `f` accepted.
    pub fn walk(
        &self,
        p: usize,
        b: &[u8],
        samples: u64,
        mut f: impl FnMut(u64, &[u8], Option<FileStat>) -> bool,
    ) -> Result<u64> {
        let what = self.entries.names().0;
        let bad = |why: String| FormatError::invalid(what, format!("page {p}: {why}"));
        let count = self.positions(p).end - self.positions(p).start;
        let (mut at, mut seen, mut path) = (0usize, 0u64, Vec::<u8>::new());
        let mut mtime = 0i64;
        while at < b.len() {
            let (shared, len) = match (get_varint(b, &mut at), get_varint(b, &mut at)) {
                (Some(s), Some(l)) => (s, l),
                _ => return Err(bad(format!("entry {seen} is cut short"))),
            };
            let end = (at as u64)
                .checked_add(len)
                .filter(|&e| e + 4 <= b.len() as u64);
            let Some(end) = end.filter(|_| shared <= path.len() as u64) else {
                return Err(bad(format!("entry {seen} does not fit")));
            };
            let suffix = &b[at..end as usize];
            // Rising: the new path differs from the previous one first in its suffix, by a
            // greater byte, or extends it.
            let rises = seen == 0 || {
                let rest = &path[shared as usize..];
                suffix > rest
            };
            if (seen == 0 && (shared != 0 || suffix != self.first_path(p))) || !rises {
                return Err(bad(format!("entry {seen} does not follow the previous")));
            }
            path.truncate(shared as usize);
            path.extend_from_slice(suffix);
            let id = u64::from(le::u32_at(b, end as usize));
            at = end as usize + 4;
            if id >= samples {
                return Err(bad(format!("sample id {id} of {samples}")));
            }
            let Some(stat) = self.stat_at(b, &mut at, mtime) else {
                return Err(bad(format!(
                    "entry {seen}'s size, mode or mtime is cut short, or its mode is beyond 7777"
                )));
            };
            mtime = stat.and_then(|s| s.attrs).map_or(0, |a| a.mtime_ns);
            if !f(id, &path, stat) {
                return Ok(seen);
            }
            seen += 1;
        }
        if seen != count {
            return Err(bad(format!("{seen} entries for {count} positions")));
        }
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(n: usize) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0..n)
            .map(|i| format!("class_{:04}/{:07}.jpg", i % 97, i).into_bytes())
            .collect();
        v.sort();
        v
    }

    /// The stat of the entry at position `i` for pages carrying `entries`.
    fn stat(i: usize, entries: PageEntries) -> Option<FileStat> {
        let attrs = FileAttrs {
            mode: 0o640 + (i as u32 % 7),
            // Rising, falling and extreme mtimes (deltas that wrap).
            mtime_ns: match i % 5 {
                0 => i64::MIN + i as i64,
                1 => i64::MAX - i as i64,
                _ => 1_700_000_000_000_000_000 - (i as i64 * 7_919_000_113),
            },
        };
        let size = (i as u64).wrapping_mul(0x9e37_79b9) >> (i % 40);
        match entries {
            PageEntries::Paths => None,
            PageEntries::Sizes => Some(FileStat { size, attrs: None }),
            PageEntries::SizesAndAttrs => Some(FileStat {
                size,
                attrs: Some(attrs),
            }),
        }
    }

    const ALL: [PageEntries; 3] = [
        PageEntries::Paths,
        PageEntries::Sizes,
        PageEntries::SizesAndAttrs,
    ];

    fn build(ps: &[Vec<u8>], entries: PageEntries) -> (Vec<u8>, Vec<u8>) {
        let mut pages = Vec::new();
        let index = encode_pages(
            ps.iter()
                .enumerate()
                .map(|(i, p)| (p.as_slice(), (ps.len() - 1 - i) as u32, stat(i, entries))),
            |b| {
                pages.extend_from_slice(b);
                Ok(())
            },
        )
        .unwrap();
        (pages, index)
    }

    #[test]
    fn pages_round_trip_and_find_keys() {
        for (n, entries) in [0usize, 1, 2, 5000, 20_000]
            .into_iter()
            .flat_map(|n| ALL.map(|e| (n, e)))
        {
            let ps = paths(n);
            let (pages, index) = build(&ps, entries);
            let ix = PageIndex::parse(&index, pages.len() as u64, n as u64, entries).unwrap();
            assert_eq!(ix.is_empty(), n == 0);
            if n == 20_000 {
                assert!(ix.len() > 3, "{} pages", ix.len());
            }
            let mut all = Vec::new();
            for p in 0..ix.len() {
                let r = ix.bytes(p);
                assert!(r.end - r.start <= PAGE_TARGET as u64);
                all.extend(
                    ix.decode(p, &pages[r.start as usize..r.end as usize], n as u64)
                        .unwrap(),
                );
            }
            let want: Vec<PathEntry> = ps
                .iter()
                .enumerate()
                .map(|(i, p)| PathEntry {
                    id: (n - 1 - i) as u64,
                    path: p.clone(),
                    stat: stat(i, entries),
                })
                .collect();
            assert_eq!(all, want, "{entries:?}");
            for (i, p) in ps.iter().enumerate().step_by(331) {
                let page = ix.page_for(p);
                assert!(ix.positions(page).contains(&(i as u64)));
                assert_eq!(ix.page_of(i as u64), page);
            }
        }
    }

    #[test]
    fn damaged_pages_and_indexes_are_refused() {
        let ps = paths(20_000);
        let n = 20_000;
        for entries in ALL {
            let (pages, index) = build(&ps, entries);
            let ix = PageIndex::parse(&index, pages.len() as u64, n, entries).unwrap();
            // Wrong lengths and counts.
            assert!(PageIndex::parse(&index, pages.len() as u64 + 1, n, entries).is_err());
            assert!(PageIndex::parse(&index, pages.len() as u64, 3, entries).is_err());
            let cut = &index[..index.len() - 1];
            assert!(PageIndex::parse(cut, pages.len() as u64, n, entries).is_err());
            // A flipped byte of a page is refused, or decodes to other entries (the section
            // CRC and the block CRCs are what catch that).
            let r = ix.bytes(1);
            let page = &pages[r.start as usize..r.end as usize];
            for i in 0..page.len().min(300) {
                let mut bad = page.to_vec();
                bad[i] ^= 0x41;
                if let Ok(v) = ix.decode(1, &bad, n) {
                    assert_ne!(v, ix.decode(1, page, n).unwrap(), "byte {i}");
                }
            }
            for cut in [0, 1, page.len() / 2, page.len() - 1] {
                assert!(ix.decode(1, &page[..cut], n).is_err(), "cut at {cut}");
            }
            // A page read as another one does not pass.
            assert!(ix.decode(2, page, n).is_err());
            // Ids past the sample count.
            assert!(ix.decode(1, page, 100).is_err());
            // Pages read as carrying other parts than they do do not pass.
            for other in ALL.into_iter().filter(|&o| o != entries) {
                let ox = PageIndex::parse(&index, pages.len() as u64, n, other).unwrap();
                assert!(ox.decode(1, page, n).is_err(), "{entries:?} as {other:?}");
            }
        }
        // A mode beyond 7777 is refused.
        let stat = FileStat {
            size: 1,
            attrs: Some(FileAttrs {
                mode: 0o10000,
                mtime_ns: 0,
            }),
        };
        let mut pages = Vec::new();
        let index = encode_pages([(&b"a"[..], 0, Some(stat))].into_iter(), |b| {
            pages.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        let ix =
            PageIndex::parse(&index, pages.len() as u64, 1, PageEntries::SizesAndAttrs).unwrap();
        assert!(ix.decode(0, &pages, 1).is_err());
    }

    #[test]
    fn zigzag_round_trips() {
        for v in [0i64, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
    }

    #[test]
    fn varints_round_trip_and_refuse_overflow() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut at = 0;
            assert_eq!(get_varint(&b, &mut at), Some(v));
            assert_eq!(at, b.len());
        }
        let mut at = 0;
        assert_eq!(get_varint(&[0xff; 10], &mut at), None);
        let mut at = 0;
        assert_eq!(get_varint(&[0x80, 0x80], &mut at), None);
    }
}
