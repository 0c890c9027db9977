//! String tables: `count: u64`, `offsets: (count + 1) × u64`, then the concatenated bytes.
//! Item `i` is `bytes[offsets[i]..offsets[i + 1]]`; `offsets[0] == 0` and
//! `offsets[count] == bytes.len()`.

use crate::error::{bail, invalid, need, Result};
use crate::le;

/// Encodes `items` as a string table.
pub fn encode_string_table<I, S>(items: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    I::IntoIter: ExactSizeIterator + Clone,
    S: AsRef<[u8]>,
{
    let items = items.into_iter();
    let count = items.len() as u64;
    let blob_len: usize = items.clone().map(|s| s.as_ref().len()).sum();
    let mut out = Vec::with_capacity(8 + 8 * (items.len() + 1) + blob_len);
    out.extend_from_slice(&count.to_le_bytes());
    let mut off = 0u64;
    out.extend_from_slice(&off.to_le_bytes());
    for s in items.clone() {
        off += s.as_ref().len() as u64;
        out.extend_from_slice(&off.to_le_bytes());
    }
    for s in items {
        out.extend_from_slice(s.as_ref());
    }
    out
}

/// A validated view of an encoded string table. Construction is O(1); item access checks the
/// two offsets it uses.
#[derive(Clone, Copy, Debug)]
pub struct StringTable<'a> {
    count: u64,
    offsets: &'a [u8],
    blob: &'a [u8],
    what: &'static str,
}

impl<'a> StringTable<'a> {
    /// Parses the table header of `bytes`; `what` names the table in errors.
    pub fn parse(bytes: &'a [u8], what: &'static str) -> Result<Self> {
        need(what, bytes, 16)?;
        let count = le::u64_at(bytes, 0);
        let off_len = count
            .checked_add(1)
            .and_then(|n| n.checked_mul(8))
            .filter(|&n| n <= bytes.len() as u64 - 8)
            .ok_or_else(|| invalid!(what, "{count} items do not fit in {} bytes", bytes.len()))?
            as usize;
        let offsets = &bytes[8..8 + off_len];
        let blob = &bytes[8 + off_len..];
        let t = StringTable {
            count,
            offsets,
            blob,
            what,
        };
        if t.offset(0) != 0 || t.offset(count as usize) != blob.len() as u64 {
            bail!(
                what,
                "offsets span {}..{} but the table holds {} bytes",
                t.offset(0),
                t.offset(count as usize),
                blob.len()
            );
        }
        Ok(t)
    }

    fn offset(&self, i: usize) -> u64 {
        le::u64_at(self.offsets, i * 8)
    }

    /// Number of items.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// The table's length in bytes (its count, offsets and items).
    pub fn encoded_len(&self) -> u64 {
        8 + self.offsets.len() as u64 + self.blob.len() as u64
    }

    /// True when the table holds no items.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Item `i`, or an error if `i` is out of range or its offsets are damaged.
    pub fn get(&self, i: u64) -> Result<&'a [u8]> {
        if i >= self.count {
            bail!(
                self.what,
                "item {i} out of range (table has {})",
                self.count
            );
        }
        let (a, b) = (self.offset(i as usize), self.offset(i as usize + 1));
        if a > b || b > self.blob.len() as u64 {
            bail!(self.what, "item {i} has damaged offsets {a}..{b}");
        }
        Ok(&self.blob[a as usize..b as usize])
    }

    /// Checks every offset (O(n)).
    pub fn validate(&self) -> Result<()> {
        let mut prev = 0;
        for i in 1..=self.count as usize {
            let o = self.offset(i);
            if o < prev {
                bail!(self.what, "offsets decrease at item {}", i - 1);
            }
            prev = o;
        }
        Ok(())
    }

    /// All items in order (call [`validate`](Self::validate) first for error-free iteration).
    pub fn iter(&self) -> impl Iterator<Item = Result<&'a [u8]>> + '_ {
        (0..self.count).map(move |i| self.get(i))
    }

    /// All items, owned.
    pub fn to_vecs(&self) -> Result<Vec<Vec<u8>>> {
        self.iter().map(|x| x.map(<[u8]>::to_vec)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let items: Vec<&[u8]> = vec![b"", b"abc", b"\xff", b"de"];
        let enc = encode_string_table(items.iter());
        let t = StringTable::parse(&enc, "t").unwrap();
        t.validate().unwrap();
        assert_eq!(t.len(), 4);
        let got: Vec<&[u8]> = t.iter().map(|r| r.unwrap()).collect();
        assert_eq!(got, items);
        assert!(t.get(4).is_err());
    }

    #[test]
    fn rejects_damage_without_panicking() {
        let enc = encode_string_table([b"hello".as_slice(), b"world"]);
        for cut in 0..enc.len() {
            let _ = StringTable::parse(&enc[..cut], "t").map(|t| {
                let _ = t.validate();
                t.iter().for_each(drop)
            });
        }
        for pos in 0..enc.len() {
            for bit in [0x01u8, 0x80] {
                let mut d = enc.clone();
                d[pos] ^= bit;
                if let Ok(t) = StringTable::parse(&d, "t") {
                    let _ = t.validate();
                    t.iter().for_each(drop);
                }
            }
        }
        let mut huge = enc.clone();
        huge[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(StringTable::parse(&huge, "t").is_err());
    }
}
