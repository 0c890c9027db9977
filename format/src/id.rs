//! The dataset id (16 random bytes in every snapshot and chunk header), written as 32
//! lowercase hex digits wherever it names something: tier directories, cached snapshots,
//! upload staging, a peer's URL path, `granary info`.

use std::fmt;
use std::str::FromStr;

/// A dataset's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DatasetId(pub [u8; 16]);

impl fmt::Display for DatasetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for DatasetId {
    type Err = String;

    /// Exactly 32 hex digits (either case).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a dataset id (32 hex digits)");
        let b = s.as_bytes();
        if b.len() != 32 {
            return Err(bad());
        }
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut id = [0u8; 16];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            id[i] = (digit(pair[0]).ok_or_else(bad)? << 4) | digit(pair[1]).ok_or_else(bad)?;
        }
        Ok(DatasetId(id))
    }
}

impl From<[u8; 16]> for DatasetId {
    fn from(id: [u8; 16]) -> Self {
        DatasetId(id)
    }
}

/// 16 bytes (a dataset id or a content digest) as 32 lowercase hex digits.
pub fn hex16(b: &[u8; 16]) -> String {
    DatasetId(*b).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_as_hex_and_parse_back() {
        let id = DatasetId([0xab; 16]);
        assert_eq!(id.to_string(), "ab".repeat(16));
        assert_eq!(id.to_string().parse::<DatasetId>(), Ok(id));
        assert_eq!("AB".repeat(16).parse::<DatasetId>(), Ok(id));
        for bad in [
            "",
            "ab",
            &"ab".repeat(17),
            &"zz".repeat(16),
            "é".repeat(16).as_str(),
        ] {
            assert!(bad.parse::<DatasetId>().is_err(), "{bad}");
        }
    }
}
