//! The namespace: every file and directory of the dataset, in path order, front-coded in
//! pages; an index of the pages; an id table from sample id to position.
//!
//! Layout, entries, pages and restarts: SPEC.md §6.7.

use std::ops::Range;

use super::types::FileAttrs;
use crate::error::{bail, invalid, Result};
use crate::le;
use crate::strtab::{encode_string_table, StringTable};

/// A writer closes a page before an entry that would take it (with its restart table) past
/// this many bytes.
pub const PAGE_TARGET: usize = 4096;
/// Every this many entries of a page, an entry is a **restart**: it shares nothing with the
/// one before and its mtime delta counts from 0, so decoding can start there.
pub const RESTART_INTERVAL: usize = 16;
/// Length of the namespace section's header.
pub const NS_HEADER_LEN: usize = 40;

const NS: &str = "snapshot namespace";

/// One entry of the namespace: a file (with the sample that holds it) or a directory, its path
/// owned ([`NsEntry`]) or borrowed from a page walk ([`EntryView`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<P> {
    /// The path (raw bytes, relative, `/`-separated).
    pub path: P,
    /// The sample holding the file; `None` for a directory.
    pub id: Option<u64>,
    /// The file's size (its sample's original length); 0 for a directory.
    pub size: u64,
    /// Mode and mtime, when the snapshot records them (feature ATTRS).
    pub attrs: Option<FileAttrs>,
}

/// An entry, owned.
pub type NsEntry = Entry<Vec<u8>>;
/// An entry as a page walk meets it: its path borrowed from the walk.
pub type EntryView<'a> = Entry<&'a [u8]>;

impl<P: AsRef<[u8]>> Entry<P> {
    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.id.is_none()
    }

    /// Its size and attributes.
    pub fn stat(&self) -> FileStat {
        FileStat {
            size: self.size,
            attrs: self.attrs,
        }
    }

    fn with_path<Q>(&self, path: Q) -> Entry<Q> {
        Entry {
            path,
            id: self.id,
            size: self.size,
            attrs: self.attrs,
        }
    }

    /// The entry with its path borrowed.
    pub fn view(&self) -> EntryView<'_> {
        self.with_path(self.path.as_ref())
    }

    /// The entry, owned.
    pub fn to_entry(&self) -> NsEntry {
        self.with_path(self.path.as_ref().to_vec())
    }
}

/// What a listing shows of a file: its size and, when recorded, its mode and mtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    /// The sample's original length.
    pub size: u64,
    /// Mode and mtime as packed, when the snapshot records them.
    pub attrs: Option<FileAttrs>,
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Appends `v` as unsigned LEB128.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads an unsigned LEB128 of at most 10 bytes in its shortest form (`None` past the end, on
/// overflow, or for an overlong encoding: a last byte of 0 after the first).
pub(crate) fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at)?;
        *at += 1;
        if i == 9 && byte > 1 {
            return None;
        }
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return (i == 0 || byte != 0).then_some(v);
        }
    }
    None
}

fn shared_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Encodes the namespace section from its entries, in path order: its head (header, page
/// index, id table) in memory, its pages handed to a sink as they close (they are the
/// section's tail, and most of its bytes).
pub(crate) struct NsWriter<'a> {
    attrs: bool,
    /// Where each closed page goes, and the bytes handed to it so far.
    sink: &'a mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    pages_len: u64,
    page: Vec<u8>,
    offsets: Vec<u64>,
    firsts: Vec<u64>,
    first_paths: Vec<Vec<u8>>,
    prev: Vec<u8>,
    prev_mtime: i64,
    pos: u64,
    /// Offsets of the current page's restarts, and how many entries it holds.
    restarts: Vec<u32>,
    in_page: usize,
    /// Position of each sample id (`u32::MAX`: not seen yet).
    idtab: Vec<u32>,
}

impl<'a> NsWriter<'a> {
    /// A writer for `samples` samples, pages to `sink`; `attrs`: every entry carries mode and
    /// mtime.
    pub(crate) fn new(
        samples: u64,
        attrs: bool,
        sink: &'a mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> NsWriter<'a> {
        NsWriter {
            attrs,
            sink,
            pages_len: 0,
            page: Vec::new(),
            offsets: vec![0],
            firsts: vec![0],
            first_paths: Vec::new(),
            prev: Vec::new(),
            prev_mtime: 0,
            pos: 0,
            restarts: Vec::new(),
            in_page: 0,
            idtab: vec![u32::MAX; samples as usize],
        }
    }

    fn encode(&self, shared: usize, e: &EntryView, prev_mtime: i64) -> Vec<u8> {
        let path = e.path;
        let mut b = Vec::with_capacity(path.len() - shared + 16);
        put_varint(&mut b, shared as u64);
        put_varint(&mut b, (path.len() - shared) as u64);
        b.extend_from_slice(&path[shared..]);
        match e.id {
            None => put_varint(&mut b, 0),
            Some(id) => {
                put_varint(&mut b, id + 1);
                put_varint(&mut b, e.size);
            }
        }
        if self.attrs {
            let a = e.attrs.unwrap_or_default();
            put_varint(&mut b, u64::from(a.mode));
            put_varint(&mut b, zigzag(a.mtime_ns.wrapping_sub(prev_mtime)));
        }
        b
    }

    fn close_page(&mut self) -> Result<()> {
        let table = self.restarts.iter().flat_map(|r| r.to_le_bytes());
        self.page.extend(table);
        self.page
            .extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        (self.sink)(&self.page).map_err(|e| invalid!(NS, "writing a page: {e}"))?;
        self.pages_len += self.page.len() as u64;
        self.offsets.push(self.pages_len);
        self.firsts.push(self.pos);
        self.page.clear();
        self.restarts.clear();
        self.in_page = 0;
        Ok(())
    }

    /// Adds the next entry (paths strictly rising; the caller checks).
    pub(crate) fn push(&mut self, e: EntryView) -> Result<()> {
        let path = e.path;
        if self.pos >= u32::MAX as u64 {
            bail!(NS, "more than 2^32 - 1 entries");
        }
        let restart = self.in_page.is_multiple_of(RESTART_INTERVAL);
        let mut b = match restart {
            true => self.encode(0, &e, 0),
            false => self.encode(shared_prefix(&self.prev, path), &e, self.prev_mtime),
        };
        let trailer = 4 * (self.restarts.len() + restart as usize + 1);
        if self.in_page > 0 && self.page.len() + b.len() + trailer > PAGE_TARGET {
            self.close_page()?;
            b = self.encode(0, &e, 0);
        }
        if self.in_page == 0 {
            self.first_paths.push(path.to_vec());
        }
        if self.in_page.is_multiple_of(RESTART_INTERVAL) {
            self.restarts.push(self.page.len() as u32);
        }
        self.page.extend_from_slice(&b);
        self.in_page += 1;
        self.prev.clear();
        self.prev.extend_from_slice(path);
        self.prev_mtime = e.attrs.unwrap_or_default().mtime_ns;
        if let Some(id) = e.id {
            self.idtab[id as usize] = self.pos as u32;
        }
        self.pos += 1;
        Ok(())
    }

    /// The section's head; its pages (handed to the sink) follow it.
    pub(crate) fn finish(mut self) -> Result<Vec<u8>> {
        if self.in_page > 0 {
            self.close_page()?;
        }
        let p = self.first_paths.len() as u64;
        let fp = encode_string_table(self.first_paths.iter());
        let mut out = Vec::with_capacity(
            NS_HEADER_LEN + 16 * (p as usize + 1) + fp.len() + 4 * self.idtab.len() + 16,
        );
        le::put_words(&mut out, &[self.pos, p, fp.len() as u64, self.pages_len, 0]);
        le::put_words(&mut out, &self.offsets);
        le::put_words(&mut out, &self.firsts);
        out.extend_from_slice(&fp);
        out.resize(le::align8(out.len() as u64) as usize, 0);
        for v in &self.idtab {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.resize(le::align8(out.len() as u64) as usize, 0);
        Ok(out)
    }
}

/// Where the namespace's parts lie in the file, from its header (checked in O(1)).
#[derive(Clone, Debug, Default)]
pub(crate) struct NsLayout {
    pub(crate) entries: u64,
    pub(crate) pages: u64,
    /// Offsets, firsts and first paths.
    pub(crate) index: Range<usize>,
    pub(crate) idtab: Range<usize>,
    pub(crate) area: Range<usize>,
}

impl NsLayout {
    /// Checks the header `h` of a namespace section lying at `section` for `samples` samples,
    /// `live` of them not deleted (the entries name those; the id table has a slot for each).
    pub(crate) fn parse(
        h: &[u8],
        section: Range<usize>,
        (samples, live): (u64, u64),
    ) -> Result<NsLayout> {
        let [e, p, fpl, pl, reserved] = le::words(h);
        if reserved != 0 {
            bail!(NS, "reserved header field is not zero");
        }
        if e < live || e >= u32::MAX as u64 || p > e || (p == 0) != (e == 0) {
            bail!(NS, "{e} entries in {p} pages for {live} samples");
        }
        let len = section.len() as u64;
        let index_end = 16u64
            .checked_mul(p + 1)
            .and_then(|x| x.checked_add(NS_HEADER_LEN as u64))
            .and_then(|x| x.checked_add(fpl));
        let Some(index_end) = index_end.filter(|&x| x <= len) else {
            bail!(NS, "index of {p} pages does not fit in {len} bytes");
        };
        let idtab = le::align8(index_end);
        let area = le::align8(idtab + 4 * samples);
        if area.checked_add(pl) != Some(len) {
            bail!(
                NS,
                "{len} bytes, but its parts take {}",
                area.saturating_add(pl)
            );
        }
        let at = |x: u64| section.start + x as usize;
        Ok(NsLayout {
            entries: e,
            pages: p,
            index: at(NS_HEADER_LEN as u64)..at(index_end),
            idtab: at(idtab)..at(idtab + 4 * samples),
            area: at(area)..section.end,
        })
    }
}

/// The page index, parsed and checked: every page's bytes, positions and first path.
#[derive(Clone, Debug)]
pub struct PageIndex {
    offsets: Vec<u64>,
    firsts: Vec<u64>,
    first_blob: Vec<u8>,
    ends: Vec<usize>,
    samples: u64,
    attrs: bool,
}

impl PageIndex {
    /// Parses the index bytes `b` (offsets, firsts, first paths) of namespace `l`: offsets
    /// rising from 0 to the pages' length, firsts rising from 0 to the entry count, one first
    /// path per page, rising. O(pages).
    pub(crate) fn parse(b: &[u8], l: &NsLayout, samples: u64, attrs: bool) -> Result<PageIndex> {
        let p = l.pages as usize;
        let word = |i: usize| le::u64_at(b, 8 * i);
        let offsets: Vec<u64> = (0..=p).map(word).collect();
        let firsts: Vec<u64> = (p + 1..=2 * p + 1).map(word).collect();
        let rising =
            |v: &[u64], end: u64| v[0] == 0 && v[p] == end && v.windows(2).all(|w| w[0] < w[1]);
        if !rising(&offsets, l.area.len() as u64) {
            bail!(
                NS,
                "page offsets do not rise from 0 to the length of the pages"
            );
        }
        if !rising(&firsts, l.entries) {
            bail!(NS, "page positions do not rise from 0 to {}", l.entries);
        }
        let t = StringTable::parse(&b[16 * (p + 1)..], NS)?;
        if t.len() != p as u64 || t.encoded_len() != (b.len() - 16 * (p + 1)) as u64 {
            bail!(
                NS,
                "{} first paths for {p} pages, or a table of another length",
                t.len()
            );
        }
        let (mut first_blob, mut ends) = (Vec::new(), vec![0usize]);
        for i in 0..p as u64 {
            let path = t.get(i)?;
            if i > 0 && path <= &first_blob[ends[i as usize - 1]..] {
                bail!(
                    NS,
                    "first path of page {i} does not follow the previous page's"
                );
            }
            first_blob.extend_from_slice(path);
            ends.push(first_blob.len());
        }
        Ok(PageIndex {
            offsets,
            firsts,
            first_blob,
            ends,
            samples,
            attrs,
        })
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.ends.len() - 1
    }

    /// True when there are no pages (an empty namespace).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Page `p`'s bytes within the pages.
    pub fn bytes(&self, p: usize) -> Range<u64> {
        self.offsets[p]..self.offsets[p + 1]
    }

    /// The positions page `p` holds.
    pub fn positions(&self, p: usize) -> Range<u64> {
        self.firsts[p]..self.firsts[p + 1]
    }

    /// Page `p`'s first path.
    pub fn first_path(&self, p: usize) -> &[u8] {
        &self.first_blob[self.ends[p]..self.ends[p + 1]]
    }

    /// The page holding position `pos` (below the entry count).
    pub fn page_of(&self, pos: u64) -> usize {
        self.firsts.partition_point(|&f| f <= pos) - 1
    }

    /// The last page whose first path is not greater than `key` (page 0 if none is).
    pub fn page_for(&self, key: &[u8]) -> usize {
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

    /// Decodes page `p` from its bytes `b`, checked ([`PageIndex::walk`]).
    pub fn decode(&self, p: usize, b: &[u8]) -> Result<Vec<NsEntry>> {
        let n = self.positions(p).end - self.positions(p).start;
        let mut out = Vec::with_capacity(n as usize);
        self.walk(p, &self.restarts(p, b)?, 0, &mut |e| {
            out.push(e.to_entry());
            true
        })?;
        Ok(out)
    }

    /// Page `p`'s restart table, checked against its bytes `b` (O(1)): as many restarts as it
    /// has groups of [`RESTART_INTERVAL`] entries; the first at 0 and the last inside the
    /// entries (that they rise is checked as the entries are walked past them).
    pub fn restarts<'b>(&self, p: usize, b: &'b [u8]) -> Result<Restarts<'b>> {
        let count = (self.positions(p).end - self.positions(p).start) as usize;
        let want = count.div_ceil(RESTART_INTERVAL);
        if b.len() < 4 || le::u32_at(b, b.len() - 4) as usize != want {
            bail!(NS, "page {p}: no restart table for {count} entries");
        }
        let Some(end) = b.len().checked_sub(4 + 4 * want) else {
            bail!(NS, "page {p}: restart table longer than the page");
        };
        let r = Restarts {
            entries: &b[..end],
            table: &b[end..b.len() - 4],
        };
        if want == 0 || r.get(0) != 0 || r.get(want - 1) as usize >= end {
            bail!(
                NS,
                "page {p}: restart offsets do not start at 0 inside the entries"
            );
        }
        Ok(r)
    }

    /// The path of the restart at `at` in page `p`'s entries (it shares nothing with the
    /// entry before it).
    pub fn restart_path<'b>(&self, p: usize, entries: &'b [u8], at: u32) -> Result<&'b [u8]> {
        let bad = || invalid!(NS, "page {p}: restart at {at} is damaged");
        let mut i = at as usize;
        let (Some(0), Some(len)) = (get_varint(entries, &mut i), get_varint(entries, &mut i))
        else {
            return Err(bad());
        };
        let end = (i as u64)
            .checked_add(len)
            .filter(|&e| e <= entries.len() as u64);
        end.map(|e| &entries[i..e as usize]).ok_or_else(bad)
    }

    /// Calls `f` with page `p`'s entries in order from restart `k` (entry `k` ×
    /// [`RESTART_INTERVAL`]) until it returns false, checking each: the first with the index's
    /// first path, every restart sharing nothing and where the restart table says, every path
    /// greater than the one before, tags naming samples that exist, modes within `0o7777`;
    /// reaching the end, that the entries fill the page up to its restart table and are as
    /// many as its positions.
    pub fn walk(
        &self,
        p: usize,
        restarts: &Restarts<'_>,
        k: usize,
        f: &mut dyn FnMut(&EntryView<'_>) -> bool,
    ) -> Result<()> {
        let count = self.positions(p).end - self.positions(p).start;
        if k >= restarts.len() {
            bail!(NS, "page {p}: restart {k} of {}", restarts.len());
        }
        let start = restarts.get(k);
        let b = restarts.entries;
        let (mut at, mut seen) = (start as usize, (k * RESTART_INTERVAL) as u64);
        let (mut path, mut mtime) = (Vec::<u8>::new(), 0i64);
        let first = seen;
        while at < b.len() {
            let restart = (seen as usize).is_multiple_of(RESTART_INTERVAL);
            let r = seen as usize / RESTART_INTERVAL;
            if restart && (r >= restarts.len() || restarts.get(r) != at as u32) {
                bail!(
                    NS,
                    "page {p}: entry {seen} is not where the restart table says"
                );
            }
            let (Some(shared), Some(len)) = (get_varint(b, &mut at), get_varint(b, &mut at)) else {
                bail!(NS, "page {p}: entry {seen} is cut short");
            };
            let end = (at as u64)
                .checked_add(len)
                .filter(|&e| e <= b.len() as u64);
            let Some(end) = end.filter(|_| shared <= path.len() as u64 && !(restart && shared > 0))
            else {
                bail!(NS, "page {p}: entry {seen} does not fit");
            };
            let suffix = &b[at..end as usize];
            let rises = seen == first || {
                let old = &path[shared as usize..];
                match restart {
                    false => suffix > old,
                    true => suffix > &path[..],
                }
            };
            if (seen == 0 && suffix != self.first_path(p)) || !rises {
                bail!(NS, "page {p}: entry {seen} does not follow the one before");
            }
            if restart {
                mtime = 0;
            }
            path.truncate(shared as usize);
            path.extend_from_slice(suffix);
            at = end as usize;
            let Some(tail) = self.rest(b, &mut at, &mut mtime) else {
                bail!(
                    NS,
                    "page {p}: entry {seen} ({}) is cut short, names a sample that does not \
                     exist or has a mode beyond 7777",
                    String::from_utf8_lossy(&path)
                );
            };
            seen += 1;
            let e = EntryView {
                path: &path,
                ..tail
            };
            if !f(&e) {
                return Ok(());
            }
        }
        if seen != count {
            bail!(NS, "page {p}: {seen} entries for {count} positions");
        }
        Ok(())
    }

    /// The rest of an entry after its path: tag, size, attributes.
    fn rest(&self, b: &[u8], at: &mut usize, mtime: &mut i64) -> Option<EntryView<'static>> {
        let tag = get_varint(b, at)?;
        let (id, size) = match tag {
            0 => (None, 0),
            t if t <= self.samples => (Some(t - 1), get_varint(b, at)?),
            _ => return None,
        };
        let attrs = match self.attrs {
            false => None,
            true => {
                let mode = u32::try_from(get_varint(b, at)?)
                    .ok()
                    .filter(|&m| m <= 0o7777)?;
                *mtime = mtime.wrapping_add(unzigzag(get_varint(b, at)?));
                Some(FileAttrs {
                    mode,
                    mtime_ns: *mtime,
                })
            }
        };
        Some(EntryView {
            path: &[],
            id,
            size,
            attrs,
        })
    }
}

/// A page's restart table, over the page's entries.
#[derive(Clone, Copy, Debug)]
pub struct Restarts<'b> {
    /// The page's entries (the page without its restart table).
    pub entries: &'b [u8],
    table: &'b [u8],
}

impl Restarts<'_> {
    /// Number of restarts.
    pub fn len(&self) -> usize {
        self.table.len() / 4
    }

    /// Offset of restart `k` in the entries (below [`Restarts::len`]).
    pub fn get(&self, k: usize) -> u32 {
        le::u32_at(self.table, 4 * k)
    }
}

/// The smallest byte string greater than every string starting with `prefix` (`None` when
/// there is none: `prefix` is all 0xFF bytes, or empty).
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut s = prefix.to_vec();
    while let Some(&last) = s.last() {
        if last == 0xff {
            s.pop();
        } else {
            *s.last_mut().expect("non-empty") += 1;
            return Some(s);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_zigzag_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut at = 0;
            assert_eq!(get_varint(&b, &mut at), Some(v));
            assert_eq!(at, b.len());
        }
        assert_eq!(get_varint(&[0xff; 10], &mut 0), None);
        assert_eq!(get_varint(&[0x80, 0x80], &mut 0), None);
        // Only the shortest form: a value padded with a 0x80 byte and a final 0 is refused.
        assert_eq!(get_varint(&[0x00], &mut 0), Some(0));
        assert_eq!(get_varint(&[0x80, 0x01], &mut 0), Some(128));
        for overlong in [&[0x80, 0x00][..], &[0x81, 0x80, 0x00], &[0xff, 0x00]] {
            assert_eq!(get_varint(overlong, &mut 0), None, "{overlong:?}");
        }
        for v in [0i64, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!((zigzag(-1), zigzag(1)), (1, 2));
    }

    #[test]
    fn prefix_successors() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_successor(b"\xff\xff"), None);
        assert_eq!(prefix_successor(b""), None);
        assert_eq!(prefix_successor(b"a/"), Some(b"a0".to_vec()));
    }
}
