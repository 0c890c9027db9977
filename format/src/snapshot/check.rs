//! Verifying a snapshot completely: every block, every padding byte, every rule SPEC.md
//! states about the sections (the O(n) checks [`Snapshot::open`] leaves out).

use std::collections::HashSet;

use super::{ContentDigest, Snapshot, SECTION_ENTRY_LEN, SECTION_TABLE_HEAD, SNAPSHOT_HEADER_LEN};
use crate::error::{bail, invalid, FormatError, Result};
use crate::{Compression, NO_LABEL};

/// Collects errors up to a limit.
struct Errors {
    v: Vec<FormatError>,
    limit: usize,
}

impl Errors {
    fn push(&mut self, e: FormatError) -> bool {
        if self.v.len() < self.limit {
            self.v.push(e);
        }
        self.v.len() < self.limit
    }

    fn full(&self) -> bool {
        self.v.len() >= self.limit
    }
}

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// Checks every block's CRC, that the padding between sections and inside them is zero,
    /// and the content digest. Returns every problem found (empty: intact).
    pub fn check_blocks(&self) -> Vec<FormatError> {
        let mut out = Vec::new();
        for b in 0..self.blocks.count() {
            let r = self.blocks.block(b);
            if let Err(e) = self.at(r.start as usize..r.end as usize) {
                out.push(e);
            }
        }
        if !out.is_empty() {
            return out;
        }
        let table_end =
            SNAPSHOT_HEADER_LEN + SECTION_TABLE_HEAD + self.s.all.len() * SECTION_ENTRY_LEN;
        let mut gaps = Vec::new();
        let mut prev = table_end;
        for (_, r) in &self.s.all {
            gaps.push(prev..r.start);
            prev = r.end;
        }
        // The padding inside sections: after the namespace's first paths and its id table,
        // after the fields' type table.
        gaps.push(self.ns.index.end..self.ns.idtab.start);
        gaps.push(self.ns.idtab.end..self.ns.area.start);
        if let Some(f) = &self.fields {
            gaps.push(f.types.end..f.index.start);
        }
        for g in gaps {
            match self.at(g.clone()) {
                Ok(b) if b.iter().all(|&x| x == 0) => {}
                Ok(_) => out.push(invalid!(
                    "snapshot",
                    "padding at {}..{} is not zero",
                    g.start,
                    g.end
                )),
                Err(e) => out.push(e),
            }
        }
        if out.is_empty() {
            if let Err(e) = self.check_digest() {
                out.push(e);
            }
        }
        out
    }

    /// Recomputes the content digest over the whole file (every block made present first) and
    /// compares it with the header's: what a plain open trusts.
    pub fn check_digest(&self) -> Result<()> {
        let len = self.h.file_len() as usize;
        let b = self.at(0..len)?;
        let actual = ContentDigest::of_file(b);
        if actual != self.h.digest {
            bail!(
                "snapshot",
                "content digest {} in the header, {} computed from the file: a writer \
                 named this snapshot's content wrongly",
                crate::hex16(&self.h.digest),
                crate::hex16(&actual)
            );
        }
        Ok(())
    }

    /// Checks every rule about the sections' contents, O(n): records back to back inside
    /// their chunks, flags and labels; the chunk table's sums and class counts; every
    /// namespace page, the order of all entries, every ancestor a directory, the id table the
    /// inverse of the files' tags, sizes equal to raw records' lengths; with fields, every
    /// sample a field group whose fields add up to its record. Stops after `limit` problems.
    pub fn check_structure(&self, limit: usize) -> Vec<FormatError> {
        let mut errs = Errors {
            v: Vec::new(),
            limit: limit.max(1),
        };
        let sizes = match self.check_namespace(&mut errs) {
            Ok(s) => s,
            Err(e) => {
                errs.push(e);
                return errs.v;
            }
        };
        if !errs.full() {
            if let Err(e) = self.check_records(&sizes, &mut errs) {
                errs.push(e);
            }
        }
        errs.v
    }

    /// Walks the namespace; returns each sample's size (from its entry).
    fn check_namespace(&self, errs: &mut Errors) -> Result<Vec<u64>> {
        const NS: &str = "snapshot namespace";
        let n = self.sample_count() as usize;
        let ix = self.page_index()?;
        let mut sizes = vec![u64::MAX; n];
        let mut dirs: HashSet<Vec<u8>> = HashSet::new();
        let mut prev: Option<Vec<u8>> = None;
        let mut pos = 0u64;
        let fields = self.has_fields();
        for p in 0..ix.len() {
            let page = self.page(p)?;
            for e in page.iter() {
                let what = || String::from_utf8_lossy(&e.path).into_owned();
                if prev.as_ref().is_some_and(|q| *q >= e.path) {
                    errs.push(invalid!(
                        NS,
                        "{} does not follow the entry before it",
                        what()
                    ));
                }
                let valid = match (fields, e.id) {
                    (true, Some(_)) => crate::check_field_key(&e.path),
                    _ => crate::check_relative_path(&e.path),
                };
                if let Err(why) = valid {
                    errs.push(invalid!(NS, "{}: {why}", what()));
                }
                if let Some(i) = e.path.iter().rposition(|&b| b == b'/') {
                    if !dirs.contains(&e.path[..i]) {
                        errs.push(invalid!(
                            NS,
                            "{}: its directory is not an entry before it",
                            what()
                        ));
                    }
                }
                match e.id {
                    None => {
                        // With fields, a directory is never a field file `KEY.NAME` too.
                        let clash = crate::split_field_path(&e.path)
                            .filter(|_| fields)
                            .and_then(|(key, name)| {
                                let id = self.lookup(key).ok()??;
                                let f = self.fields(id).ok()?;
                                f.iter().any(|f| f.name == name).then_some(())
                            });
                        if clash.is_some() {
                            errs.push(invalid!(
                                NS,
                                "{}: a directory and a sample's field file",
                                what()
                            ));
                        }
                        dirs.insert(e.path.clone());
                    }
                    Some(id) => {
                        if sizes[id as usize] != u64::MAX {
                            errs.push(invalid!(NS, "sample {id} is listed twice ({})", what()));
                        }
                        sizes[id as usize] = e.size;
                        if self.position(id)? != pos {
                            errs.push(invalid!(
                                NS,
                                "id table: sample {id} is not at position {pos}, where {} is",
                                what()
                            ));
                        }
                    }
                }
                if errs.full() {
                    return Ok(sizes);
                }
                prev = Some(e.path.clone());
                pos += 1;
            }
        }
        let missing = (0..n as u64)
            .find(|&id| (sizes[id as usize] == u64::MAX) != self.deleted_by(id).is_some());
        if let Some(id) = missing {
            errs.push(match self.deleted_by(id) {
                None => invalid!(NS, "sample {id} has no entry"),
                Some(_) => invalid!(NS, "sample {id} was deleted but has an entry"),
            });
        }
        for &id in self.deleted().iter() {
            let at = self.ns.idtab.start + id as usize * 4;
            let slot = crate::le::u32_at(self.at(at..at + 4)?, 0);
            if slot != u32::MAX {
                errs.push(invalid!(
                    NS,
                    "id table: deleted sample {id} has slot {slot}, not 0xFFFFFFFF"
                ));
                break;
            }
        }
        Ok(sizes)
    }

    /// Checks every record, each chunk's sums and class counts, and the fields.
    fn check_records(&self, sizes: &[u64], errs: &mut Errors) -> Result<()> {
        let mut all_fields = 0u64;
        for c in self.chunks() {
            let (mut orig, mut compressed) = (0u64, 0u32);
            let mut labels = std::collections::BTreeMap::<u32, u64>::new();
            for id in c.samples() {
                if self.deleted_by(id).is_some() {
                    // Its record may still be there (until compaction), its entries too: it
                    // counts in no sum. Removed by compaction, it is empty.
                    let r = self.stored_sample(id)?;
                    if r.flags & crate::FLAG_REMOVED != 0 && r.stored_len != 0 {
                        errs.push(invalid!(
                            "snapshot record table",
                            "deleted sample {id}: removed, but its record has {} bytes",
                            r.stored_len
                        ));
                    }
                    if self.has_fields() {
                        all_fields += self.field_entries(id)?.len() as u64;
                    }
                    continue;
                }
                let e = match self.sample(id) {
                    Ok(e) => e,
                    Err(e) => {
                        if !errs.push(e) {
                            return Ok(());
                        }
                        continue;
                    }
                };
                let comp = e.compression()?;
                let size = sizes.get(id as usize).copied().unwrap_or(0);
                if comp == Compression::None && e.stored_len != size {
                    errs.push(invalid!(
                        "snapshot record table",
                        "sample {id}: raw record of {} bytes, its file {size} bytes",
                        e.stored_len
                    ));
                }
                if self.has_fields() {
                    let f = self.field_entries(id)?;
                    all_fields += f.len() as u64;
                    let names: HashSet<u32> = f.iter().map(|x| x.name).collect();
                    let total = f.iter().try_fold(0u64, |a, x| a.checked_add(x.len));
                    if names.len() != f.len() || total != Some(e.orig_len) {
                        errs.push(invalid!(
                            "snapshot fields",
                            "sample {id}: a field name twice, or fields that do not add up \
                             to its {} bytes",
                            e.orig_len
                        ));
                    }
                }
                orig = orig.wrapping_add(size);
                compressed += (comp != Compression::None) as u32;
                if e.label != NO_LABEL {
                    *labels.entry(e.label).or_default() += 1;
                }
            }
            let counts: Vec<(u32, u64)> = labels.into_iter().collect();
            if orig != c.orig_bytes || compressed != c.compressed {
                errs.push(invalid!(
                    "snapshot chunk table",
                    "chunk {}: {} original bytes and {} compressed records listed, its \
                     samples have {orig} and {compressed}",
                    c.chunk_id,
                    c.orig_bytes,
                    c.compressed
                ));
            }
            match self.class_counts(c.chunk_id as u64) {
                Ok(v) if v == counts => {}
                Ok(_) => {
                    errs.push(invalid!(
                        "snapshot class counts",
                        "chunk {}: counts differ from its samples' labels",
                        c.chunk_id
                    ));
                }
                Err(e) => {
                    errs.push(e);
                }
            }
            if errs.full() {
                return Ok(());
            }
        }
        if self.has_fields() && all_fields != self.field_entry_count() {
            errs.push(invalid!(
                "snapshot fields",
                "samples use {all_fields} of the {} field entries",
                self.field_entry_count()
            ));
        }
        Ok(())
    }
}
