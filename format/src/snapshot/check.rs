//! The full checks: every section's CRC, and the structure of every table.

use crate::error::{check_crc, FormatError};
use crate::strtab::StringTable;
use crate::NO_LABEL;
use crate::{le, CHUNK_HEADER_LEN, CHUNK_TRAILER_LEN};

use super::*;

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// Checks the CRC of every section (known or not) and that every byte outside the header,
    /// the section table and the sections (alignment padding) is zero. Returns every problem.
    pub fn check_sections(&self) -> Vec<FormatError> {
        if let Err(e) = self.need(0..self.b().len()) {
            return vec![e];
        }
        let mut errs: Vec<FormatError> = self
            .l
            .sections
            .iter()
            .filter_map(|s| {
                let data = &self.b()[s.offset as usize..(s.offset + s.len) as usize];
                check_crc(section_name(s.kind), s.crc, data).err()
            })
            .collect();
        let mut covered: Vec<(u64, u64)> = self
            .l
            .sections
            .iter()
            .map(|s| (s.offset, s.offset + s.len))
            .collect();
        covered.sort_unstable();
        let mut at = (SNAPSHOT_HEADER_LEN + self.l.sections.len() * SECTION_ENTRY_LEN) as u64;
        covered.push((self.b().len() as u64, self.b().len() as u64));
        for (start, end) in covered {
            if start < at {
                errs.push(FormatError::invalid(
                    "snapshot section table",
                    format!("sections overlap at byte {start}"),
                ));
            } else if let Some(p) = self.b()[at as usize..start as usize]
                .iter()
                .position(|&x| x != 0)
            {
                errs.push(FormatError::invalid(
                    "snapshot padding",
                    format!("non-zero byte at offset {}", at + p as u64),
                ));
            }
            at = at.max(end);
        }
        if let Some(e) = self.l.blocks.as_ref().and_then(|b| b.check(self.b()).err()) {
            errs.push(e);
        }
        errs
    }

    /// Full structural check (O(n)): chunk ids dense, sample ranges contiguous and covering,
    /// records back to back inside their chunk, valid compression, labels and paths, a unique
    /// path per sample found by the index, and a sorted path order. At most `limit` problems
    /// are returned.
    pub fn check_structure(&self, limit: usize) -> Vec<FormatError> {
        if let Err(e) = self.need(0..self.b().len()) {
            return vec![e];
        }
        let mut errs = Vec::new();
        let mut push = |e: FormatError| {
            if errs.len() < limit {
                errs.push(e)
            }
        };
        let classes = self.class_count();
        if let Err(e) = self.classes().and_then(|t| t.validate()) {
            push(e);
        }
        if let Err(e) = self.paths().and_then(|t| t.validate()) {
            push(e);
            return errs;
        }
        let mut next_sample = 0u64;
        for c in 0..self.l.chunks {
            let ce = match self.chunk(c) {
                Ok(ce) => ce,
                Err(e) => {
                    push(e);
                    continue;
                }
            };
            let what = || format!("snapshot chunk table entry {c}");
            if ce.chunk_id as u64 != c {
                push(FormatError::invalid(
                    what(),
                    format!("has chunk id {}", ce.chunk_id),
                ));
            }
            if ce.first_sample != next_sample {
                push(FormatError::invalid(
                    what(),
                    format!(
                        "starts at sample {}, expected {next_sample}",
                        ce.first_sample
                    ),
                ));
            }
            next_sample = ce.first_sample.saturating_add(ce.sample_count);
            let records_end = ce.file_size.saturating_sub(CHUNK_TRAILER_LEN as u64);
            let mut expect_off = CHUNK_HEADER_LEN as u64;
            for id in ce.samples() {
                let Ok(e) = self.sample(id) else {
                    push(FormatError::invalid(
                        what(),
                        format!("sample {id} out of range"),
                    ));
                    break;
                };
                let swhat = || format!("snapshot sample {id}");
                if e.chunk != ce.chunk_id {
                    push(FormatError::invalid(
                        swhat(),
                        format!("names chunk {}", e.chunk),
                    ));
                }
                if let Err(err) = e.compression().and_then(|_| e.check_lengths()) {
                    push(FormatError::invalid(swhat(), err.to_string()));
                }
                if e.offset != expect_off
                    || e.offset
                        .checked_add(e.stored_len)
                        .is_none_or(|end| end > records_end)
                {
                    push(FormatError::invalid(
                        swhat(),
                        format!(
                            "record at {}+{} is not where chunk {} expects it ({expect_off})",
                            e.offset, e.stored_len, ce.chunk_id
                        ),
                    ));
                }
                expect_off = e.offset.saturating_add(e.stored_len);
                if e.label != NO_LABEL && e.label as u64 >= classes {
                    push(FormatError::invalid(
                        swhat(),
                        format!("label {} but only {classes} classes", e.label),
                    ));
                }
            }
        }
        if next_sample != self.l.samples {
            push(FormatError::invalid(
                "snapshot chunk table",
                format!(
                    "chunks cover {next_sample} samples, header says {}",
                    self.l.samples
                ),
            ));
        }
        let mut prev: Option<&[u8]> = None;
        let mut seen = vec![false; self.l.samples as usize];
        for pos in 0..self.l.samples {
            let id = match self.sorted_id(pos) {
                Ok(id) => id,
                Err(e) => {
                    push(e);
                    continue;
                }
            };
            if std::mem::replace(&mut seen[id as usize], true) {
                push(FormatError::invalid(
                    "snapshot path order",
                    format!("sample {id} listed twice"),
                ));
            }
            let Ok(p) = self.path(id) else { continue };
            if let Err(why) = crate::check_relative_path(p) {
                push(FormatError::invalid(
                    format!("snapshot path of sample {id}"),
                    format!("{why}: {}", String::from_utf8_lossy(p)),
                ));
            }
            if prev.is_some_and(|q| q >= p) {
                push(FormatError::invalid(
                    "snapshot path order",
                    format!("not strictly sorted at position {pos} (sample {id})"),
                ));
            }
            prev = Some(p);
            match self.lookup(p) {
                Ok(Some(found)) if found == id => {}
                Ok(other) => push(FormatError::invalid(
                    "snapshot path index",
                    format!("path of sample {id} resolves to {other:?}"),
                )),
                Err(e) => push(e),
            }
        }
        self.check_optional(&mut push);
        self.check_pages(&mut push);
        errs
    }

    /// [`Snapshot::check_structure`] for the pages (format 1.5 and 1.6): the index and every
    /// page check, and together the pages list exactly the path order's ids and paths (and,
    /// listing pages, each sample's size, mode and mtime).
    pub(super) fn check_pages(&self, push: &mut impl FnMut(FormatError)) {
        let ix = match self.page_index() {
            Ok(Some(ix)) => ix,
            Ok(None) => return,
            Err(e) => return push(e),
        };
        for p in 0..ix.len() {
            let b = match self.page_bytes(ix, p) {
                Ok(b) => b,
                Err(e) => return push(e),
            };
            let mut pos = ix.positions(p).start;
            let mut wrong = None;
            let walked = ix.walk(p, b, self.l.samples, |id, path, stat| {
                let want = self.sorted_id(pos).and_then(|i| Ok((i, self.path(i)?)));
                let stat_ok = stat.is_none_or(|s| self.stat(id).is_ok_and(|t| t == s));
                if !want.is_ok_and(|w| w.0 == id && w.1 == path) || !stat_ok {
                    wrong = Some((pos, id));
                    return false;
                }
                pos += 1;
                true
            });
            match (walked, wrong) {
                (Err(e), _) => push(e),
                (_, Some((pos, id))) => push(FormatError::invalid(
                    ix.entries().names().0,
                    format!(
                        "position {pos} holds sample {id}, not the path order's, \
                         or not that sample's size, mode or mtime"
                    ),
                )),
                _ => {}
            }
        }
    }

    /// [`Snapshot::check_structure`] for the fields (format 1.3): names valid, sorted and
    /// distinct; every sample a field group whose fields decode, name known names, each once,
    /// and add up to its record; keys valid for fields.
    pub(super) fn check_fields(&self, push: &mut impl FnMut(FormatError)) {
        let Some(f) = &self.l.fields else {
            for id in 0..self.l.samples {
                if self.sample(id).is_ok_and(|e| e.has_fields()) {
                    push(FormatError::invalid(
                        format!("snapshot sample {id}"),
                        "is a field group, but the snapshot has no fields sections",
                    ));
                }
            }
            return;
        };
        let names = match self.field_names() {
            Ok(n) => n,
            Err(e) => return push(e),
        };
        for (i, n) in names.iter().enumerate() {
            if let Err(why) = crate::check_field_name(n) {
                push(FormatError::invalid(
                    format!("snapshot field name {i}"),
                    why,
                ));
            }
            if i > 0 && names[i - 1] >= *n {
                push(FormatError::invalid(
                    "snapshot field names",
                    "not sorted and distinct",
                ));
            }
        }
        if le::u64_at(self.b(), f.index.start) != 0 {
            push(FormatError::invalid(
                "snapshot field index",
                "does not start at 0",
            ));
        }
        for id in 0..self.l.samples {
            let what = || format!("snapshot sample {id}");
            let (Ok(e), Ok(fields)) = (self.sample(id), self.field_entries(id)) else {
                push(FormatError::invalid(what(), "its fields cannot be read"));
                continue;
            };
            if let Err(err) = crate::chunk::check_group(&e, &fields) {
                push(FormatError::invalid(what(), err.to_string()));
            }
            let mut seen: Vec<u32> = fields.iter().map(|f| f.name).collect();
            seen.sort_unstable();
            if seen.windows(2).any(|w| w[0] == w[1])
                || seen.last().is_some_and(|&n| n as usize >= names.len())
            {
                push(FormatError::invalid(
                    what(),
                    "names a field twice or an unknown field",
                ));
            }
            if let Ok(p) = self.path(id) {
                if let Err(why) = crate::check_field_key(p) {
                    push(FormatError::invalid(what(), why));
                }
            }
        }
    }

    /// [`Snapshot::check_structure`] for the optional sections: every file attribute decodes;
    /// directories are valid paths, strictly sorted, none a sample's path.
    pub(super) fn check_optional(&self, push: &mut impl FnMut(FormatError)) {
        self.check_fields(push);
        if self.has_attrs() {
            for id in 0..self.l.samples {
                if let Err(e) = self.attrs(id) {
                    push(FormatError::invalid(
                        format!("attributes of sample {id}"),
                        e.to_string(),
                    ));
                }
            }
        }
        if let Some((names, _)) = &self.l.dirs {
            match StringTable::parse(&self.b()[names.clone()], "snapshot directories")
                .and_then(|t| t.validate())
            {
                Err(e) => push(e),
                Ok(()) => {
                    let mut prev: Option<&[u8]> = None;
                    for i in 0..self.l.dir_count {
                        match self.dir(i) {
                            Err(e) => push(e),
                            Ok((d, _)) => {
                                if let Err(why) = crate::check_relative_path(d) {
                                    push(FormatError::invalid(
                                        format!("snapshot directory {i}"),
                                        format!("{why}: {}", String::from_utf8_lossy(d)),
                                    ));
                                }
                                if prev.is_some_and(|q| q >= d) {
                                    push(FormatError::invalid(
                                        "snapshot directories",
                                        format!("not strictly sorted at {i}"),
                                    ));
                                }
                                if let Ok(Some(id)) = self.lookup(d) {
                                    push(FormatError::invalid(
                                        format!("snapshot directory {i}"),
                                        format!("is also the path of sample {id}"),
                                    ));
                                }
                                prev = Some(d);
                            }
                        }
                    }
                }
            }
        }
    }
}
