//! Samples with named fields (kinds 11 to 13).

use std::ops::Range;

use crate::error::{FormatError, Result};
use crate::le;
use crate::{FieldEntry, FIELD_ENTRY_LEN};

use super::*;

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// True if the dataset's samples have named fields (format 1.3).
    pub fn has_fields(&self) -> bool {
        self.l.fields.is_some()
    }

    /// The field names of the dataset (sorted by bytes; empty without fields).
    pub fn field_names(&self) -> Result<Vec<&[u8]>> {
        let Some(f) = &self.l.fields else {
            return Ok(Vec::new());
        };
        self.table(&f.names, "snapshot field names")?
            .iter()
            .collect()
    }

    /// The fields of sample `id`, in record order (empty for a sample of a dataset without
    /// fields).
    pub fn fields(&self, id: u64) -> Result<Vec<SampleField<'_>>> {
        let Some(f) = &self.l.fields else {
            if id >= self.l.samples {
                return Err(FormatError::invalid(
                    "sample id",
                    format!("{id} out of range (dataset has {} samples)", self.l.samples),
                ));
            }
            return Ok(Vec::new());
        };
        let range = self.field_range(f, id)?;
        let names = self.table(&f.names, "snapshot field names")?;
        let mut out = Vec::with_capacity(range.len());
        let mut offset = 0u64;
        for k in range {
            let at = f.table.start + k * FIELD_ENTRY_LEN;
            let e = FieldEntry::decode(self.at(at..at + FIELD_ENTRY_LEN)?)?;
            out.push(SampleField {
                name: names.get(e.name as u64)?,
                offset,
                len: e.len,
                crc32: e.crc32,
            });
            offset = offset.saturating_add(e.len);
        }
        Ok(out)
    }

    /// Number of field entries of all samples (0 without fields).
    pub fn field_entry_count(&self) -> u64 {
        self.l.fields.as_ref().map_or(0, |f| f.entries)
    }

    /// The index of sample `id`'s first field among all field entries.
    pub fn field_first(&self, id: u64) -> Result<u64> {
        let Some(f) = &self.l.fields else {
            return Err(FormatError::invalid(
                "snapshot",
                "the samples have no fields",
            ));
        };
        Ok(self.field_range(f, id)?.start as u64)
    }

    /// The sample that field entry `e` belongs to and its position among that sample's fields
    /// (a binary search of the field index).
    pub fn field_owner(&self, e: u64) -> Result<(u64, usize)> {
        let Some(f) = &self.l.fields else {
            return Err(FormatError::invalid(
                "snapshot",
                "the samples have no fields",
            ));
        };
        if e >= f.entries {
            return Err(FormatError::invalid(
                "field entry",
                format!("{e} out of range ({} fields)", f.entries),
            ));
        }
        let at = |i: u64| -> Result<u64> {
            let o = f.index.start + i as usize * 8;
            Ok(le::u64_at(self.at(o..o + 8)?, 0))
        };
        // The last sample whose first field is at or before e.
        let (mut lo, mut hi) = (0u64, self.l.samples);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if at(mid)? <= e {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let range = self.field_range(f, lo)?;
        if !range.contains(&(e as usize)) {
            return Err(FormatError::invalid(
                "snapshot field index",
                format!("field {e} belongs to no sample"),
            ));
        }
        Ok((lo, e as usize - range.start))
    }

    /// The field entries of sample `id` (name indexes into [`Snapshot::field_names`]).
    pub fn field_entries(&self, id: u64) -> Result<Vec<FieldEntry>> {
        let Some(f) = &self.l.fields else {
            return Ok(Vec::new());
        };
        self.field_range(f, id)?
            .map(|k| {
                let at = f.table.start + k * FIELD_ENTRY_LEN;
                let e = FieldEntry::decode(self.at(at..at + FIELD_ENTRY_LEN)?)?;
                if e.name as u64 >= f.name_count {
                    return Err(FormatError::invalid(
                        "snapshot fields",
                        format!("sample {id} names field {} of {}", e.name, f.name_count),
                    ));
                }
                Ok(e)
            })
            .collect()
    }

    pub(super) fn field_range(&self, f: &FieldsLayout, id: u64) -> Result<Range<usize>> {
        if id >= self.l.samples {
            return Err(FormatError::invalid(
                "sample id",
                format!("{id} out of range (dataset has {} samples)", self.l.samples),
            ));
        }
        let at = f.index.start + id as usize * 8;
        let w = self.at(at..at + 16)?;
        let (first, end) = (le::u64_at(w, 0), le::u64_at(w, 8));
        if first >= end || end > f.entries {
            return Err(FormatError::invalid(
                "snapshot field index",
                format!("sample {id} has fields {first}..{end} of {}", f.entries),
            ));
        }
        Ok(first as usize..end as usize)
    }
}
