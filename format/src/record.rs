//! Decoding and checking records, and checking whole chunk files.

use std::borrow::Cow;

use crate::chunk::{decode_footer, ChunkFooter, ChunkHeader, Trailer, CHUNK_TRAILER_LEN};
use crate::error::{bail, check_crc, invalid, need, FormatError, Result};
use crate::{Compression, SampleEntry};

/// Largest ratio of original to stored length accepted for a zstd record (zstd cannot expand
/// data by more than about 43,700× per block); bounds what a hostile entry can make us allocate.
pub const MAX_ZSTD_RATIO: u64 = 65_536;

/// The first four bytes of a zstd frame (RFC 8878 magic number 0xFD2FB528, little-endian).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Decodes a record's stored bytes into its original bytes and checks length and CRC-32.
/// Raw records are returned borrowed (no copy).
pub fn decode_record<'a>(entry: &SampleEntry, stored: &'a [u8]) -> Result<Cow<'a, [u8]>> {
    if stored.len() as u64 != entry.stored_len {
        return Err(FormatError::truncated(
            "record",
            entry.stored_len,
            stored.len() as u64,
        ));
    }
    entry.check_lengths()?;
    let data: Cow<'a, [u8]> = match entry.compression()? {
        Compression::None => Cow::Borrowed(stored),
        Compression::Zstd => {
            let bound = entry
                .stored_len
                .saturating_mul(MAX_ZSTD_RATIO)
                .saturating_add(4096);
            if entry.orig_len > bound || entry.orig_len > usize::MAX as u64 / 2 {
                bail!(
                    "record",
                    "claims {} original bytes from {} stored bytes",
                    entry.orig_len,
                    entry.stored_len
                );
            }
            // Exactly one zstd frame (no skippable frame, no second frame, no trailing bytes):
            // the decoder would otherwise take what follows the frame as more content.
            let one_frame = stored.starts_with(&ZSTD_MAGIC)
                && zstd::zstd_safe::find_frame_compressed_size(stored).ok() == Some(stored.len());
            if !one_frame {
                bail!("record", "stored bytes are not exactly one zstd frame");
            }
            match zstd::zstd_safe::get_frame_content_size(stored) {
                Ok(Some(n)) if n == entry.orig_len => {}
                other => {
                    let declared = match other {
                        Ok(Some(n)) => format!("a content size of {n}"),
                        Ok(None) => "no content size".to_string(),
                        Err(_) => "an unreadable content size".to_string(),
                    };
                    bail!(
                        "record",
                        "zstd frame declares {declared}, its namespace entry says {}",
                        entry.orig_len
                    );
                }
            }
            let out = zstd::bulk::decompress(stored, entry.orig_len as usize)
                .map_err(|e| invalid!("record", "zstd: {e}"))?;
            Cow::Owned(out)
        }
    };
    if data.len() as u64 != entry.orig_len {
        bail!(
            "record",
            "decodes to {} bytes, expected {}",
            data.len(),
            entry.orig_len
        );
    }
    check_crc("record", entry.crc32, &data)?;
    Ok(data)
}

/// Checks the CRC-32 of each field of a field group's record bytes `data` (raw, back to back).
pub fn check_fields(fields: &[crate::FieldEntry], data: &[u8]) -> Result<()> {
    let mut at = 0usize;
    for (k, f) in fields.iter().enumerate() {
        let end = at
            .checked_add(usize::try_from(f.len).unwrap_or(usize::MAX))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| invalid!("field", "field {k} lies past its record"))?;
        let actual = crc32fast::hash(&data[at..end]);
        if actual != f.crc32 {
            return Err(FormatError::ChecksumMismatch {
                what: format!("field {k}"),
                expected: f.crc32,
                actual,
            });
        }
        at = end;
    }
    Ok(())
}

/// A chunk file's digest, its identity: the first 16 bytes of SHA-256 over the whole file.
pub fn chunk_digest(bytes: &[u8]) -> [u8; 16] {
    let mut d = crate::ContentDigest::new();
    d.update(bytes);
    d.finish()
}

/// The result of checking a whole chunk file.
#[derive(Debug)]
pub struct ChunkCheck {
    /// The decoded footer.
    pub footer: ChunkFooter,
    /// CRC-32 of the whole file.
    pub file_crc: u32,
    /// The chunk's digest: SHA-256 of the whole file, its first 16 bytes.
    pub digest: [u8; 16],
    /// Records that failed to decode or check: (index in footer, error).
    pub bad_records: Vec<(usize, FormatError)>,
}

/// Checks a whole chunk file in memory: header (magic, version, CRC, dataset id, chunk id),
/// trailer, footer, and every record's length and CRC. Structural damage is an `Err`; damaged
/// records are listed in [`ChunkCheck::bad_records`].
pub fn check_chunk(bytes: &[u8], dataset_id: &[u8; 16], chunk_id: u32) -> Result<ChunkCheck> {
    let header = ChunkHeader::decode(bytes)?;
    if &header.dataset_id != dataset_id {
        bail!(
            "chunk header",
            "belongs to another dataset (dataset id differs)"
        );
    }
    if header.chunk_id != chunk_id {
        bail!(
            "chunk header",
            "holds chunk id {}, expected {chunk_id}",
            header.chunk_id
        );
    }
    need(
        "chunk file",
        bytes,
        crate::CHUNK_HEADER_LEN + CHUNK_TRAILER_LEN,
    )?;
    let t = Trailer::decode(
        &bytes[bytes.len() - CHUNK_TRAILER_LEN..],
        bytes.len() as u64,
    )?;
    let body = &bytes[t.footer_offset as usize..(t.footer_offset + t.footer_len) as usize];
    let footer = decode_footer(body, &t, &header)?;
    if header.fields != footer.fields.is_some() {
        bail!(
            "chunk header",
            "its feature bits and the footer disagree on a fields block"
        );
    }
    let bad_records = footer
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let stored = &bytes[e.offset as usize..(e.offset + e.stored_len) as usize];
            let fields = footer.fields.as_ref().map(|f| &f.records[i][..]);
            decode_record(e, stored)
                .and_then(|_| check_fields(fields.unwrap_or(&[]), stored))
                .err()
                .map(|err| (i, err))
        })
        .collect();
    Ok(ChunkCheck {
        footer,
        file_crc: crc32fast::hash(bytes),
        digest: chunk_digest(bytes),
        bad_records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChunkWriter;

    #[test]
    fn zstd_and_raw_records_decode_and_damage_is_caught() {
        let orig = b"abcabcabcabcabcabcabcabcabcabcabcabcabcabc".repeat(10);
        let z = zstd::bulk::compress(&orig, 3).unwrap();
        let mut w = ChunkWriter::new(Vec::new(), [1; 16], 0).unwrap();
        let crc = crate::crc32(&orig);
        w.append(b"z", &z, Compression::Zstd, orig.len() as u64, crc, 0)
            .unwrap();
        w.append(b"r", &orig, Compression::None, orig.len() as u64, crc, 0)
            .unwrap();
        let (bytes, s) = w.finish(&[b"class0"]).unwrap();
        let c = check_chunk(&bytes, &[1; 16], 0).unwrap();
        assert!(c.bad_records.is_empty());
        assert_eq!((c.file_crc, c.digest), (s.file_crc, s.digest));
        assert!(check_chunk(&bytes, &[2; 16], 0).is_err());
        assert!(check_chunk(&bytes, &[1; 16], 1).is_err());
        // Flip every byte of both records: each flip is either reported or (for bits zstd
        // ignores) still decodes to the original bytes; the whole-file CRC changes either way.
        let end = s.entries[1].offset + s.entries[1].stored_len;
        for pos in 64..end as usize {
            let mut d = bytes.clone();
            d[pos] ^= 0x10;
            let c = check_chunk(&d, &[1; 16], 0).unwrap();
            assert_ne!(c.file_crc, s.file_crc);
            assert_ne!(c.digest, s.digest);
            if c.bad_records.is_empty() {
                for e in &c.footer.entries {
                    let got = decode_record(e, &d[e.offset as usize..][..e.stored_len as usize]);
                    assert_eq!(got.unwrap().as_ref(), &orig[..], "flip at {pos}");
                }
            } else {
                assert_eq!(c.bad_records.len(), 1, "flip at {pos}");
            }
        }
    }

    #[test]
    fn a_zstd_record_is_exactly_one_frame() {
        let orig = b"one frame, one frame, one frame".repeat(4);
        let z = zstd::bulk::compress(&orig, 3).unwrap();
        let entry = |stored: &[u8]| SampleEntry {
            chunk: 0,
            label: 0,
            offset: 64,
            stored_len: stored.len() as u64,
            orig_len: orig.len() as u64,
            crc32: crate::crc32(&orig),
            flags: 1,
        };
        assert_eq!(decode_record(&entry(&z), &z).unwrap().as_ref(), &orig[..]);
        // A second (empty) frame, trailing bytes, a skippable frame in front: all decode to
        // the same bytes or fail in the decoder; every one is refused as a record.
        let empty = zstd::bulk::compress(b"", 3).unwrap();
        let mut skippable = vec![0x50, 0x2A, 0x4D, 0x18, 2, 0, 0, 0, 7, 7];
        skippable.extend_from_slice(&z);
        for bad in [
            [&z[..], &empty].concat(),
            [&z[..], b"\0"].concat(),
            skippable,
        ] {
            let e = decode_record(&entry(&bad), &bad).unwrap_err().to_string();
            assert!(e.contains("one zstd frame"), "{e}");
        }
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocating() {
        let z = zstd::bulk::compress(b"hello", 3).unwrap();
        let e = SampleEntry {
            chunk: 0,
            label: 0,
            offset: 64,
            stored_len: z.len() as u64,
            orig_len: u64::MAX / 4,
            crc32: 0,
            flags: 1,
        };
        assert!(decode_record(&e, &z).is_err());
        let e = SampleEntry { orig_len: 6, ..e };
        assert!(decode_record(&e, &z).is_err());
    }
}
