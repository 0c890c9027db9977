//! What a stream's reads feed its tier with ([`TierFeed`]): the reader says what it consumed -
//! a chunk read whole, ranges of a chunk - and the tier decides what to keep: whole chunks
//! offered to admission with their importance ([`chunk_importance`], the one formula), or, with
//! hot chunks, the records that belong in them, harvested and re-packed. The reader never
//! scores, offers or harvests; it asks the feed where hot chunks hold a window's samples.

use std::sync::Arc;

use granary_format::{ChunkEntry, SampleEntry};

use super::{chunk_importance, Admission, HotChunks, Importance, Job};
use crate::engine::Completed;
use crate::seam::Source;

/// A stream's feed into the stack's tier (see the module): made by
/// [`crate::StoreStack::tier_feed`], finished at the end of the epoch.
pub struct TierFeed {
    admission: Admission,
    hot: Option<HotChunks>,
    importance: Option<Arc<dyn Importance>>,
    chunks: Arc<[ChunkEntry]>,
}

impl TierFeed {
    pub(crate) fn new(
        admission: Admission,
        hot: Option<HotChunks>,
        importance: Option<Arc<dyn Importance>>,
        chunks: Arc<[ChunkEntry]>,
    ) -> TierFeed {
        TierFeed {
            admission,
            hot,
            importance,
            chunks,
        }
    }

    /// Whether the tier's hot chunks serve samples (a window's chunks are then read in ranges
    /// around what they hold).
    pub fn has_hot(&self) -> bool {
        self.hot.is_some()
    }

    /// Per sample of `ids`: the hot chunk that holds it and the record's offset there, if any
    /// (hot chunks admitted or evicted by any process are picked up first).
    pub fn hot_samples(&mut self, ids: &[u64]) -> Vec<Option<(Source, u64)>> {
        match self.hot.as_mut() {
            Some(h) => {
                h.refresh();
                ids.iter().map(|&id| h.locate(id)).collect()
            }
            None => vec![None; ids.len()],
        }
    }

    /// Chunk `chunk` was read whole into `read`: offered for admission, or (with hot chunks)
    /// its records that belong in them harvested. Bytes from a copy are not offered again.
    pub fn consumed_whole(&mut self, chunk: u32, read: &Arc<Completed>) {
        let Some(ce) = self.taken(chunk, read) else {
            return;
        };
        match self.hot.as_mut() {
            Some(h) => {
                let bytes = read.data();
                for id in ce.samples() {
                    h.harvest(id, |e| record(bytes, e, 0), &self.admission);
                }
            }
            None => {
                let score = chunk_importance(&ce, self.importance.as_deref());
                self.admission.offer(Job::Chunk(ce, read.clone(), score));
            }
        }
    }

    /// Ranges of chunk `chunk` were read: `(offset in the chunk, read)`, sorted by offset. With
    /// hot chunks, every record inside them may belong in one, drawn or not (without, ranges
    /// feed nothing: only whole chunks are admitted).
    pub fn consumed_ranges(&mut self, chunk: u32, ranges: &[(u64, &Arc<Completed>)]) {
        let (Some(h), Some(ce)) = (self.hot.as_mut(), self.chunks.get(chunk as usize)) else {
            return;
        };
        for id in ce.samples() {
            h.harvest(
                id,
                |e| {
                    let k = ranges.partition_point(|&(start, _)| start <= e.offset);
                    let &(start, read) = ranges.get(k.checked_sub(1)?)?;
                    self.admission
                        .takes(read)
                        .then(|| record(read.data(), e, start))
                        .flatten()
                },
                &self.admission,
            );
        }
    }

    /// The end of the epoch: records still waiting go to the tier, and admission finishes.
    pub fn finish(mut self) {
        if let Some(h) = self.hot.as_mut() {
            h.flush(&self.admission);
        }
        self.admission.finish();
    }

    /// Chunk `chunk`'s entry when `read`'s bytes are worth offering.
    fn taken(&self, chunk: u32, read: &Completed) -> Option<ChunkEntry> {
        self.admission
            .takes(read)
            .then(|| self.chunks.get(chunk as usize).cloned())
            .flatten()
    }
}

/// Record `e`'s stored bytes in `bytes`, which begin at offset `start` of its chunk.
fn record<'a>(bytes: &'a [u8], e: &SampleEntry, start: u64) -> Option<&'a [u8]> {
    let at = e.offset.checked_sub(start)? as usize;
    bytes.get(at..at + e.stored_len as usize)
}
