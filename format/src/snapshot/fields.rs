//! The fields section (feature FIELDS): field names and their types, each sample's fields.
//!
//! Layout and type descriptors: SPEC.md §6.5.

use std::ops::Range;

use super::{SampleField, Snapshot};
use crate::error::{bail, invalid, FormatError, Result};
use crate::le;
use crate::strtab::StringTable;
use crate::FieldEntry;

/// Length of the fields section's header.
pub const FIELDS_HEADER_LEN: usize = 32;
/// Length of one field entry in the snapshot.
pub const SNAP_FIELD_LEN: usize = 16;

const WHAT: &str = "snapshot fields";

/// What a field's bytes are, as its type descriptor says. Readers decode on request; the
/// stored bytes are what `cat` and the mount serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// `bytes`: raw bytes.
    Bytes,
    /// `str`: UTF-8 text.
    Str,
    /// `json`: a UTF-8 JSON document.
    Json,
    /// `int`: a signed 64-bit integer, 8 bytes little-endian.
    Int,
    /// `ndarray:DTYPE:D0,D1,...`: the C-order little-endian elements of an array of that
    /// element type and shape (`ndarray:DTYPE:` is a 0-dimensional array).
    Ndarray {
        /// The element type: `bool`, `int8`..`int64`, `uint8`..`uint64`, `float16`,
        /// `float32`, `float64`.
        dtype: String,
        /// The shape.
        shape: Vec<u64>,
    },
    /// `npy`: a NumPy `.npy` file (any element type and shape, per sample).
    Npy,
    /// `image:CODEC`: an encoded image (`jpeg`, `png`, `webp`, ...), decoded only on request.
    Image(String),
}

/// Element types an `ndarray` descriptor may name, with their sizes in bytes.
pub const DTYPES: [(&str, u64); 12] = [
    ("bool", 1),
    ("int8", 1),
    ("int16", 2),
    ("int32", 4),
    ("int64", 8),
    ("uint8", 1),
    ("uint16", 2),
    ("uint32", 4),
    ("uint64", 8),
    ("float16", 2),
    ("float32", 4),
    ("float64", 8),
];

/// The types whose descriptor is one word.
const WORDS: [(&str, FieldType); 5] = [
    ("bytes", FieldType::Bytes),
    ("str", FieldType::Str),
    ("json", FieldType::Json),
    ("int", FieldType::Int),
    ("npy", FieldType::Npy),
];

impl FieldType {
    /// Parses a type descriptor.
    pub fn parse(d: &str) -> std::result::Result<FieldType, String> {
        let bad = || Err(format!("unknown field type {d:?}"));
        if let Some((_, t)) = WORDS.iter().find(|(w, _)| *w == d) {
            return Ok(t.clone());
        }
        if let Some(codec) = d.strip_prefix("image:") {
            let ok = !codec.is_empty()
                && codec.len() <= 16
                && codec
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            return match ok {
                true => Ok(FieldType::Image(codec.to_string())),
                false => bad(),
            };
        }
        let Some((dtype, shape)) = d.strip_prefix("ndarray:").and_then(|r| r.split_once(':'))
        else {
            return bad();
        };
        if !DTYPES.iter().any(|(n, _)| *n == dtype) {
            return Err(format!("unknown element type {dtype:?} in {d:?}"));
        }
        let shape: Vec<u64> = match shape {
            "" => Vec::new(),
            s => s
                .split(',')
                .map(|x| match x.parse::<u64>() {
                    Ok(v) if x == v.to_string() => Ok(v),
                    _ => Err(format!("bad dimension {x:?} in {d:?}")),
                })
                .collect::<std::result::Result<_, _>>()?,
        };
        if shape.len() > 32 {
            return Err(format!("more than 32 dimensions in {d:?}"));
        }
        let t = FieldType::Ndarray {
            dtype: dtype.to_string(),
            shape,
        };
        // Its values have one length, which a u64 holds.
        match t.fixed_len() {
            Some(_) => Ok(t),
            None => Err(format!("{d:?} describes values of 2^64 bytes or more")),
        }
    }

    /// The descriptor (what [`FieldType::parse`] reads back).
    pub fn descriptor(&self) -> String {
        match self {
            FieldType::Image(c) => format!("image:{c}"),
            FieldType::Ndarray { dtype, shape } => {
                let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
                format!("ndarray:{dtype}:{}", dims.join(","))
            }
            t => WORDS.iter().find(|(_, w)| w == t).expect("a word").0.into(),
        }
    }

    /// The length every value of this type has, if it is fixed (`int`, `ndarray`).
    pub fn fixed_len(&self) -> Option<u64> {
        match self {
            FieldType::Int => Some(8),
            FieldType::Ndarray { dtype, shape } => {
                let item = DTYPES.iter().find(|(n, _)| n == dtype)?.1;
                match shape.contains(&0) {
                    true => Some(0),
                    false => shape.iter().try_fold(item, |acc, &d| acc.checked_mul(d)),
                }
            }
            _ => None,
        }
    }

    /// Checks a value's bytes against the type: the fixed length, UTF-8 text.
    pub fn check_value(&self, b: &[u8]) -> std::result::Result<(), String> {
        if let Some(n) = self.fixed_len() {
            if b.len() as u64 != n {
                return Err(format!(
                    "{} bytes for {}, expected {n}",
                    b.len(),
                    self.descriptor()
                ));
            }
        }
        if matches!(self, FieldType::Str | FieldType::Json) && std::str::from_utf8(b).is_err() {
            return Err(format!("{} value is not UTF-8", self.descriptor()));
        }
        Ok(())
    }
}

/// Where the fields section's parts lie in the file (checked at open).
#[derive(Clone, Debug)]
pub(crate) struct FieldsLayout {
    pub(crate) names: Range<usize>,
    pub(crate) types: Range<usize>,
    pub(crate) index: Range<usize>,
    pub(crate) entries: Range<usize>,
    pub(crate) name_count: u64,
    pub(crate) entry_count: u64,
}

impl FieldsLayout {
    /// Checks the header `h` of a fields section lying at `section` for `samples` samples.
    pub(crate) fn parse(h: &[u8], section: Range<usize>, samples: u64) -> Result<FieldsLayout> {
        let [k, m, nl, tl] = le::words(h);
        let len = section.len() as u64;
        let tables = (FIELDS_HEADER_LEN as u64)
            .checked_add(nl)
            .and_then(|x| x.checked_add(tl))
            .filter(|&x| x <= len);
        let index = tables.map(le::align8);
        let total = index
            .and_then(|i| samples.checked_add(1)?.checked_mul(8)?.checked_add(i))
            .and_then(|x| x.checked_add(m.checked_mul(SNAP_FIELD_LEN as u64)?));
        if total != Some(len) || k > u32::MAX as u64 || m < samples {
            bail!(
                WHAT,
                "{k} names, {m} entries, tables of {nl} + {tl} bytes do not make the \
                 section's {len} bytes for {samples} samples"
            );
        }
        let (index, at) = (index.expect("checked") as usize, section.start);
        let entries_at = at + index + 8 * (samples as usize + 1);
        Ok(FieldsLayout {
            names: at + FIELDS_HEADER_LEN..at + FIELDS_HEADER_LEN + nl as usize,
            types: at + FIELDS_HEADER_LEN + nl as usize
                ..at + FIELDS_HEADER_LEN + (nl + tl) as usize,
            index: at + index..entries_at,
            entries: entries_at..section.end,
            name_count: k,
            entry_count: m,
        })
    }
}

/// Encodes the fields section: `names` sorted and distinct, their type descriptors, where
/// each sample's entries end (in sample order) and the entries (names index `names`).
pub(crate) fn encode_fields(
    names: &[Vec<u8>],
    types: &[String],
    ends: &[u64],
    entries: &[FieldEntry],
) -> Vec<u8> {
    let nt = crate::encode_string_table(names.iter());
    let tt = crate::encode_string_table(types.iter());
    let mut out = Vec::new();
    let lens = [names.len(), entries.len(), nt.len(), tt.len()];
    le::put_words(&mut out, &lens.map(|n| n as u64));
    out.extend_from_slice(&nt);
    out.extend_from_slice(&tt);
    out.resize(le::align8(out.len() as u64) as usize, 0);
    le::put_words(&mut out, &[0]);
    le::put_words(&mut out, ends);
    out.extend(entries.iter().flat_map(FieldEntry::encode_snap));
    out
}

impl<B: AsRef<[u8]>> Snapshot<B> {
    /// True if the samples have named fields (feature FIELDS).
    pub fn has_fields(&self) -> bool {
        self.fields.is_some()
    }

    fn fl(&self) -> Result<&FieldsLayout> {
        self.fields
            .as_ref()
            .ok_or_else(|| invalid!(WHAT, "the snapshot's samples have no fields"))
    }

    /// The field names, sorted (empty without fields).
    pub fn field_names(&self) -> Result<Vec<&[u8]>> {
        let Some(f) = &self.fields else {
            return Ok(Vec::new());
        };
        let t = StringTable::parse(self.at(f.names.clone())?, WHAT)?;
        t.iter().collect()
    }

    /// Each field name's type, name by name (empty without fields).
    pub fn field_types(&self) -> Result<Vec<FieldType>> {
        let Some(f) = &self.fields else {
            return Ok(Vec::new());
        };
        let t = StringTable::parse(self.at(f.types.clone())?, WHAT)?;
        t.iter()
            .map(|d| {
                let d = d?;
                let s = std::str::from_utf8(d)
                    .map_err(|_| invalid!(WHAT, "a type descriptor is not UTF-8"))?;
                FieldType::parse(s).map_err(|e| FormatError::invalid(WHAT, e))
            })
            .collect()
    }

    /// Number of field entries (0 without fields).
    pub fn field_entry_count(&self) -> u64 {
        self.fields.as_ref().map_or(0, |f| f.entry_count)
    }

    /// Sample `id`'s field entries: `index[id]..index[id + 1]`, checked against the entry
    /// count.
    pub fn field_range(&self, id: u64) -> Result<Range<u64>> {
        let f = self.fl()?;
        if id >= self.sample_count() {
            bail!(WHAT, "sample {id} out of range");
        }
        let at = f.index.start + id as usize * 8;
        let w = self.at(at..at + 16)?;
        let (a, b) = (le::u64_at(w, 0), le::u64_at(w, 8));
        if a >= b || b > f.entry_count || (id == 0 && a != 0) {
            bail!(WHAT, "sample {id}'s fields {a}..{b} of {}", f.entry_count);
        }
        Ok(a..b)
    }

    /// The index of sample `id`'s first field among all field entries.
    pub fn field_first(&self, id: u64) -> Result<u64> {
        Ok(self.field_range(id)?.start)
    }

    /// The sample that field entry `e` belongs to and its position among that sample's
    /// fields (a bisection of the field index).
    pub fn field_owner(&self, e: u64) -> Result<(u64, usize)> {
        let f = self.fl()?;
        if e >= f.entry_count {
            bail!(
                WHAT,
                "field entry {e} out of range ({} entries)",
                f.entry_count
            );
        }
        let at = |i: u64| -> Result<u64> {
            let o = f.index.start + i as usize * 8;
            Ok(le::u64_at(self.at(o..o + 8)?, 0))
        };
        // The last sample whose first field is at or before e.
        let (mut lo, mut hi) = (0u64, self.sample_count());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match at(mid)? <= e {
                true => lo = mid,
                false => hi = mid,
            }
        }
        let range = self.field_range(lo)?;
        if !range.contains(&e) {
            bail!(WHAT, "field entry {e} belongs to no sample");
        }
        Ok((lo, (e - range.start) as usize))
    }

    /// Sample `id`'s field entries (their names checked against the name count).
    pub fn field_entries(&self, id: u64) -> Result<Vec<FieldEntry>> {
        let (f, r) = (self.fl()?, self.field_range(id)?);
        let at = |e: u64| f.entries.start + e as usize * SNAP_FIELD_LEN;
        let b = self.at(at(r.start)..at(r.end))?;
        r.zip(b.chunks_exact(SNAP_FIELD_LEN))
            .map(|(e, b)| {
                let fe = FieldEntry::decode_snap(b);
                if fe.name as u64 >= f.name_count {
                    bail!(
                        WHAT,
                        "field entry {e} names name {} of {}",
                        fe.name,
                        f.name_count
                    );
                }
                Ok(fe)
            })
            .collect()
    }

    /// Sample `id`'s fields: names, offsets inside its record, lengths and CRCs.
    pub fn fields(&self, id: u64) -> Result<Vec<SampleField<'_>>> {
        let f = self.fl()?;
        let names = StringTable::parse(self.at(f.names.clone())?, WHAT)?;
        let mut offset = 0u64;
        let fields: Vec<SampleField<'_>> = self
            .field_entries(id)?
            .into_iter()
            .map(|e| {
                let s = SampleField {
                    name: names.get(e.name as u64)?,
                    offset,
                    len: e.len,
                    crc32: e.crc32,
                };
                offset = offset
                    .checked_add(e.len)
                    .ok_or_else(|| invalid!(WHAT, "sample {id}'s fields overflow"))?;
                Ok(s)
            })
            .collect::<Result<_>>()?;
        // A name twice would give a reader the choice of which bytes it means (SPEC.md §3).
        for (i, f) in fields.iter().enumerate() {
            if fields[..i].iter().any(|g| g.name == f.name) {
                bail!(
                    WHAT,
                    "sample {id} has field {:?} twice",
                    String::from_utf8_lossy(f.name)
                );
            }
        }
        Ok(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_descriptors_round_trip_and_bad_ones_are_refused() {
        for d in [
            "bytes",
            "str",
            "json",
            "int",
            "npy",
            "image:jpeg",
            "ndarray:uint8:32,32,3",
            "ndarray:float32:",
            "ndarray:bool:0",
        ] {
            assert_eq!(FieldType::parse(d).unwrap().descriptor(), d);
        }
        for d in [
            "",
            "blob",
            "image:",
            "image:JPEG",
            "ndarray:uint8",
            "ndarray:u8:3",
            "ndarray:uint8:3,,3",
            "ndarray:uint8:03",
            "ndarray:uint8:-1",
        ] {
            assert!(FieldType::parse(d).is_err(), "{d}");
        }
        let t = FieldType::parse("ndarray:uint16:2,3").unwrap();
        assert_eq!(t.fixed_len(), Some(12));
        assert!(t.check_value(&[0; 12]).is_ok());
        assert!(t.check_value(&[0; 11]).is_err());
        assert!(FieldType::Str.check_value(b"\xff").is_err());
        assert_eq!(FieldType::Int.fixed_len(), Some(8));
        // Every ndarray type has a length: one that overflows is refused, a 0 dimension is
        // an empty array.
        for huge in [
            "ndarray:uint64:18446744073709551615,2",
            "ndarray:uint8:4294967296,4294967296",
            "ndarray:uint16:9223372036854775808",
        ] {
            assert!(FieldType::parse(huge).is_err(), "{huge}");
        }
        let t = FieldType::parse("ndarray:uint8:4294967296,4294967295").unwrap();
        assert_eq!(t.fixed_len(), Some(u32::MAX as u64 * (1 << 32)));
        for d in [
            "ndarray:float64:3,0,18446744073709551615",
            "ndarray:float64:18446744073709551615,0",
        ] {
            assert_eq!(FieldType::parse(d).unwrap().fixed_len(), Some(0), "{d}");
        }
    }
}
