//! Verified reads: what a read's bytes must be ([`Expect`]), and the one place where bytes
//! from a copy (this node's tier, another node's, a hot chunk) are checked against it and,
//! when they fail, given up for the layer below ([`crate::ChunkSource::fall_back`]) and read
//! again there: by the engine for every batch, by [`read_into`] for random reads. Bytes from
//! the dataset's own storage are not checked here: the reader checks each record as it
//! decodes it.

use std::sync::Arc;

use granary_format::{decode_record, ChunkHeader, DatasetId, SampleEntry, CHUNK_HEADER_LEN};

use super::{Completed, Request};
use crate::error::{Result, StoreError};
use crate::seam::{BytesFrom, ChunkStore, RangeRead, Source};

/// What the bytes of a read must be. The default expects nothing (no check).
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// The read starts at a chunk's header, which must be this dataset's header of this chunk.
    pub header: Option<(DatasetId, u32)>,
    /// The read is a whole chunk file, whose CRC-32 the snapshot records.
    pub file_crc: Option<u32>,
    /// Records in the read: (offset in the read's bytes, the record's entry); each must decode
    /// and pass its CRC.
    pub records: Arc<[(u64, SampleEntry)]>,
    /// For a read of a hot chunk (records the tier re-packed): where the same bytes are in the
    /// dataset's chunk, read there when the hot chunk fails.
    pub relocate: Option<Relocate>,
}

/// Where a hot chunk's record is in its own chunk: opened in `store` (the top of the reader's
/// stack), at `offset` of chunk `chunk`.
#[derive(Clone, Debug)]
pub struct Relocate {
    pub store: Arc<dyn ChunkStore>,
    pub chunk: u32,
    pub offset: u64,
}

impl Expect {
    /// Why `bytes` are not what this expects, or `None` if they are.
    pub fn fails(&self, bytes: &[u8]) -> Option<String> {
        if let Some((dataset, chunk)) = self.header {
            let head = bytes.get(..CHUNK_HEADER_LEN).unwrap_or(bytes);
            match ChunkHeader::decode(head) {
                Err(e) => return Some(format!("its chunk header is not valid: {e}")),
                Ok(h) if h.dataset_id != dataset.0 => {
                    return Some("its chunk header names another dataset".into())
                }
                Ok(h) if h.chunk_id != chunk => {
                    return Some(format!("its header holds chunk {}", h.chunk_id))
                }
                Ok(_) => {}
            }
        }
        if let Some(crc) = self.file_crc {
            if crc32fast::hash(bytes) != crc {
                return Some("its bytes do not match the snapshot's CRC".into());
            }
        }
        let bad = self.records.iter().find(|(at, e)| {
            let rec = bytes.get(*at as usize..(*at + e.stored_len) as usize);
            rec.is_none_or(|rec| decode_record(e, rec).is_err())
        });
        bad.map(|_| "a record's CRC does not match".into())
    }
}

/// A batch the engine read (`read`), settled: every request whose bytes came from a copy and
/// fail what it expects, or whose read failed, is read again below the copy (the layer gives
/// the copy up, logged once with its path) until its bytes pass or come from the dataset's
/// own storage. A failed batch with no copy in it is the batch's error.
pub fn settle(reqs: &[Request], read: Result<Vec<Completed>>) -> Result<Vec<Completed>> {
    let bufs = match read {
        Ok(bufs) => bufs,
        Err(e) if !reqs.iter().any(|r| r.source.bytes_from().is_copy()) => return Err(e),
        // A copy may be the cause: each request is read again alone.
        Err(e) => {
            log::debug!("a batch with tier or peer copies failed ({e}); read again one by one");
            return reqs.iter().map(|r| reread(r, None)).collect();
        }
    };
    bufs.into_iter()
        .zip(reqs)
        .map(
            |(b, r)| match b.from().is_copy().then(|| r.expect.fails(b.data())) {
                Some(Some(why)) => reread(r, Some((why, b.from()))),
                _ => Ok(b),
            },
        )
        .collect()
}

/// `r` read again alone into a buffer of its own, verified (`failed`: why the bytes its source
/// served failed, and where they came from).
fn reread(r: &Request, failed: Option<(String, BytesFrom)>) -> Result<Completed> {
    let mut buf = vec![0u8; r.len];
    let from = checked(&r.source, r.offset, &mut buf, &r.expect, failed)?;
    let (bytes, skip, len) = (super::Bytes::Owned(buf), 0, r.len);
    Ok(Completed {
        bytes,
        skip,
        len,
        from,
    })
}

/// Reads `buf.len()` bytes at `offset` of `source` into `buf`: checked as `expect` says while
/// they come from a copy, and the copy given up for the layer below it while they fail (a hot
/// chunk's record is read from its own chunk, [`Relocate`]). Returns where the bytes came
/// from. Bytes from the dataset's own storage are the caller's to check (it decodes them).
pub fn read_into(
    source: &Source,
    offset: u64,
    buf: &mut [u8],
    expect: &Expect,
) -> Result<BytesFrom> {
    checked(source, offset, buf, expect, None)
}

/// [`read_into`], after the bytes `source` served failed (`failed`: why, and where they came
/// from), which gives the source up first.
fn checked(
    source: &Source,
    offset: u64,
    buf: &mut [u8],
    expect: &Expect,
    mut failed: Option<(String, BytesFrom)>,
) -> Result<BytesFrom> {
    // Each layer gives up at most once per read: tier, peers, origin.
    for _ in 0..4 {
        if let Some((why, served)) = failed.take() {
            if !source.fall_back(&why, served)? {
                return match &expect.relocate {
                    Some(to) => {
                        let moved = Expect {
                            relocate: None,
                            ..expect.clone()
                        };
                        let source = to.store.open_chunk(to.chunk)?;
                        checked(&source, to.offset, buf, &moved, None)
                    }
                    None => Err(StoreError::damaged(source.location(), why)),
                };
            }
        }
        let need = buf.len();
        let read = source.read_ranges(&mut [RangeRead { offset, buf, need }]);
        let from = source.bytes_from();
        match read {
            Ok(()) if !from.is_copy() => return Ok(from),
            Ok(()) => match expect.fails(buf) {
                None => return Ok(from),
                Some(why) => failed = Some((why, from)),
            },
            Err(e) if from.is_copy() => failed = Some((e.to_string(), from)),
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::damaged(
        source.location(),
        "every layer's copy of these bytes failed",
    ))
}
