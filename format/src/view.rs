//! View files: a subset of one dataset's samples, written by `granary view` and usable wherever
//! the dataset is. The body (framed as [`crate::local::VIEW_FILE`]: magic `GRNYVIEW`, version 1,
//! length, CRC-32) is:
//!
//! | size | field |
//! |---:|---|
//! | 16 | dataset id |
//! | 16 | the content digest of the dataset's snapshot when the view was made |
//! | 8 | the dataset's generation (its lineage) then, for messages |
//! | 8 | the dataset's sample count N |
//! | 8 + k | where the dataset is: u64 length k, then UTF-8 (a path, relative to the view file's directory unless absolute, or a URL) |
//! | 8 + d | what was selected, for people: u64 length d, then UTF-8 |
//! | 8 | M, the number of samples selected (at least 1) |
//! | rest | the M sample ids, rising: the first as a varint, then each one's gap to the one before (at least 1) as a varint |
//!
//! A reader refuses a view whose dataset has another id or content digest (the ids could name
//! other samples), ids that do not rise or reach N, and any byte more or less.

use crate::error::{bail, need, FormatError, Result};
use crate::le;
use crate::local::VIEW_FILE;
use crate::snapshot::namespace::{get_varint, put_varint};

/// A decoded view file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewFile {
    pub dataset_id: [u8; 16],
    /// The content digest of the snapshot the view was made of: what it pins.
    pub snapshot: [u8; 16],
    pub generation: u64,
    /// The dataset's sample count.
    pub samples: u64,
    /// Where the dataset is, as given when the view was made.
    pub location: String,
    /// What was selected (the criteria, in words).
    pub description: String,
    /// The selected sample ids, rising.
    pub ids: Vec<u64>,
}

le::layout!(ViewFile, 48, encode_head, decode_head, {
    dataset_id @ 0, snapshot @ 16, generation @ 32, samples @ 40,
});

fn bad(detail: impl Into<String>) -> FormatError {
    FormatError::invalid(VIEW_FILE.what, detail)
}

impl ViewFile {
    /// The framed file (`ids` must rise: [`ViewFile::decode`] refuses what does not).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.location.len() + 2 * self.ids.len());
        b.extend_from_slice(&self.encode_head());
        for s in [&self.location, &self.description] {
            b.extend_from_slice(&(s.len() as u64).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        }
        b.extend_from_slice(&(self.ids.len() as u64).to_le_bytes());
        let mut prev = None;
        for &id in &self.ids {
            put_varint(&mut b, prev.map_or(id, |p: u64| id.wrapping_sub(p)));
            prev = Some(id);
        }
        VIEW_FILE.frame(&b)
    }

    /// Decodes and checks a framed view file (CRC, layout, ids rising and below N, at least
    /// one).
    pub fn decode(bytes: &[u8]) -> Result<ViewFile> {
        let body = VIEW_FILE.unframe(bytes)?;
        need(VIEW_FILE.what, body, 48)?;
        let head = ViewFile::decode_head(body);
        let mut t = le::Take::new(&body[48..], VIEW_FILE.what);
        let mut text = || -> Result<String> {
            String::from_utf8(t.sized()?.to_vec()).map_err(|_| bad("a text field is not UTF-8"))
        };
        let (location, description) = (text()?, text()?);
        let m = t.u64()?;
        let (body, mut at) = (t.rest, 0usize);
        // Every id takes at least one byte: a count the body cannot hold is a lie.
        if m == 0 || m > body.len() as u64 {
            bail!(VIEW_FILE.what, "{m} ids in {} bytes", body.len());
        }
        let mut ids: Vec<u64> = Vec::with_capacity(m as usize);
        for k in 0..m {
            // One encoding per value: a longer one is damage, not another way to say it.
            let v = get_varint(body, &mut at).ok_or_else(|| {
                bad(format!(
                    "id {k} is cut short, or not a varint in its shortest encoding"
                ))
            })?;
            let id = match ids.last() {
                None => v,
                Some(&p) if v >= 1 => p.checked_add(v).ok_or_else(|| bad("ids overflow"))?,
                Some(_) => bail!(VIEW_FILE.what, "id {k} does not rise"),
            };
            if id >= head.samples {
                bail!(
                    VIEW_FILE.what,
                    "id {id} of a dataset of {} samples",
                    head.samples
                );
            }
            ids.push(id);
        }
        if at != body.len() {
            bail!(VIEW_FILE.what, "bytes after the last id");
        }
        Ok(ViewFile {
            location,
            description,
            ids,
            ..head
        })
    }

    /// True if `bytes` start like a view file.
    pub fn is_view(bytes: &[u8]) -> bool {
        bytes.starts_with(&VIEW_FILE.magic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ViewFile {
        ViewFile {
            dataset_id: [9; 16],
            snapshot: [7; 16],
            generation: 2,
            samples: 1000,
            location: "../data/train.granary".into(),
            description: "class cat, dog".into(),
            ids: vec![0, 1, 7, 130, 999],
        }
    }

    #[test]
    fn round_trip_and_every_flip_and_cut_refused() {
        let v = sample();
        let b = v.encode();
        crate::testing::dump_fuzz_seed("view_file", "five-ids", &b);
        assert_eq!(ViewFile::decode(&b).unwrap(), v);
        assert!(ViewFile::is_view(&b));
        for cut in 0..b.len() {
            assert!(ViewFile::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(ViewFile::decode(&d).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn an_overlong_varint_is_refused() {
        let v = ViewFile {
            ids: vec![1],
            ..sample()
        };
        let mut b = v.encode();
        // The one id (1, one byte) written in two bytes, the frame redone around it.
        let body_end = b.len() - 4;
        let mut body = b[24..body_end].to_vec();
        let last = body.len() - 1;
        body[last] = 0x81;
        body.push(0x00);
        b = crate::local::VIEW_FILE.frame(&body);
        let err = ViewFile::decode(&b).unwrap_err().to_string();
        assert!(err.contains("shortest encoding"), "{err}");
    }

    #[test]
    fn ids_must_rise_below_n_and_be_there() {
        for ids in [vec![], vec![3, 3], vec![5, 4], vec![1000]] {
            let v = ViewFile { ids, ..sample() };
            assert!(ViewFile::decode(&v.encode()).is_err(), "{:?}", v.ids);
        }
    }
}
