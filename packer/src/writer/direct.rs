//! Samples straight into chunks, when the caller says how many samples to expect.
//!
//! Given the expected number of samples N, the writer holds the first samples (up to
//! [`PROBE_BYTES`] or [`PROBE_SAMPLES`]) to learn their mean stored size s, opens
//! K = ⌈N·s / chunk size⌉ chunk slots (at least ⌈N / chunk files⌉), and appends every sample
//! to the slot a seeded hash of its key picks: each chunk is a uniform random subset of the
//! stream, as with the spill logs, but the bytes reach local disk once, as they come. Within a
//! chunk, samples stay in the order they came; the layout so depends on that order and on the
//! probe, not only on the set of samples and the seed. A count far off changes the chunks'
//! size, not their mixing (the finish warns); a slot that gets no sample makes no chunk.
//!
//! Chunk files are built under a temporary name ([`ChunkFile`]), each slot buffering up to
//! [`SLOT_BUFFER`] bytes, which [`APPEND_THREADS`] threads write in the background
//! ([`granary_store::append`]: no descriptor is held per slot); `finish` writes each footer
//! (the class table is known only then), fsyncs and names the file. Nothing resumes: an
//! interrupted writer with an expected count starts over.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use granary_format::{chunk_file_name, ChunkSummary, NO_LABEL};
use granary_store::append::{Appender, Appends};
use granary_store::chunk_file::{ChunkFile, Records};
use granary_store::write::{Durability, Seal};

use super::spill::SpillRecord;
use crate::publish::write_in_parallel;
use crate::{lock, upload, Ids, IoAt, PackError};

/// Stored bytes of the first samples held to learn their mean size.
pub(super) const PROBE_BYTES: u64 = 64 << 20;
/// The most samples held to learn their mean size.
pub(super) const PROBE_SAMPLES: usize = 4096;
/// The most chunk slots (a count wildly off, or tiny chunks, must not make millions of files).
pub(super) const MAX_SLOTS: u64 = 1 << 20;
/// Bytes a slot buffers before appending them to its file.
pub(super) const SLOT_BUFFER: usize = 1 << 20;
/// All slots' buffers together stay below this (a slot buffers at least 16 KiB).
const BUFFERS: usize = 64 << 20;
/// Threads writing full slot buffers (each waits for the device: a direct write returns when
/// it is done).
const APPEND_THREADS: usize = 4;
/// Full slot buffers queued or being written, beyond those being filled.
const APPENDS_IN_FLIGHT: usize = 8;

/// The chunk slots samples go to, shared by the writer's threads.
pub(super) struct Direct {
    dir: PathBuf,
    dataset_id: [u8; 16],
    ids: Ids,
    fields: bool,
    /// Each slot's chunk, made on its first sample.
    slots: Vec<Mutex<Option<ChunkFile<Appender>>>>,
    /// Chunks made so far (the next one's index among the dataset's chunks).
    made: Mutex<usize>,
    /// Provisional class indexes of labels given by name, in the order first seen (the
    /// class table, sorted, is known only at `finish`).
    names: Mutex<HashMap<Vec<u8>, u32>>,
    /// Writes the slots' full buffers.
    appends: Appends,
}

/// The number of chunk slots for `expected` samples of `mean` stored bytes.
pub(super) fn slots_for(expected: u64, mean: f64, chunk_size: u64, chunk_files: u64) -> u64 {
    let by_bytes = (expected as f64 * mean / chunk_size.max(1) as f64).ceil() as u64;
    let by_files = expected.div_ceil(chunk_files.max(1));
    by_bytes.max(by_files).clamp(1, MAX_SLOTS)
}

impl Direct {
    pub(super) fn new(
        dir: &Path,
        dataset_id: [u8; 16],
        ids: Ids,
        fields: bool,
        slots: u64,
    ) -> Result<Direct, PackError> {
        let buffer = (BUFFERS / slots as usize).clamp(16 << 10, SLOT_BUFFER);
        let appends = Appends::new(buffer, APPEND_THREADS, APPENDS_IN_FLIGHT)
            .map_err(|e| usage!("cannot start the writer's threads: {e}"))?;
        Ok(Direct {
            dir: dir.to_path_buf(),
            dataset_id,
            ids,
            fields,
            slots: (0..slots).map(|_| Mutex::default()).collect(),
            made: Mutex::new(0),
            names: Mutex::default(),
            appends,
        })
    }

    pub(super) fn slots(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Appends an encoded sample to chunk slot `slot`.
    pub(super) fn append(&self, slot: u32, mut rec: SpillRecord) -> Result<(), PackError> {
        let label = match rec.label_name.is_empty() {
            true => rec.label,
            false => {
                let mut names = lock(&self.names);
                let next = names.len() as u32;
                *names
                    .entry(std::mem::take(&mut rec.label_name))
                    .or_insert(next)
            }
        };
        let mut s = lock(&self.slots[slot as usize]);
        if s.is_none() {
            *s = Some(self.make_chunk()?);
        }
        let f = s.as_mut().expect("made above");
        let r = rec.append_to(f.records(), label);
        r.at("writing", f.tmp_path())
    }

    fn make_chunk(&self) -> Result<ChunkFile<Appender>, PackError> {
        let mut made = lock(&self.made);
        self.ids.check(*made + 1)?;
        let id = self.ids.id(*made);
        let path = self.dir.join(chunk_file_name(id));
        let out = Appender::create(&path, Durability::File, &self.appends).at("creating", &path)?;
        let records = match self.fields {
            true => Records::Fields,
            false => Records::Plain,
        };
        let tmp = out.tmp_path().to_path_buf();
        let f = ChunkFile::create(out, self.dataset_id, id, records).at("writing", &tmp)?;
        *made += 1;
        Ok(f)
    }

    /// Finishes every chunk: footer with the class table, fsync, its name. Chunks are
    /// finished on up to `threads` threads; each goes to `sink` once named. Returns the
    /// chunks' slim summaries in id order.
    pub(super) fn finish(
        &self,
        classes: &[Vec<u8>],
        class_of: &HashMap<Vec<u8>, u32>,
        types: &std::collections::BTreeMap<Vec<u8>, String>,
        threads: usize,
        sink: &upload::Sink<'_>,
    ) -> Result<Vec<ChunkSummary>, PackError> {
        // Provisional index -> the class table's.
        let names = lock(&self.names);
        let mut remap = vec![NO_LABEL; names.len()];
        for (name, &i) in names.iter() {
            remap[i as usize] = *class_of.get(name).ok_or_else(|| {
                usage!(
                    "class {:?} is not in the class table",
                    String::from_utf8_lossy(name)
                )
            })?;
        }
        let by_name = !names.is_empty();
        drop(names);
        let write = |mut w: ChunkFile<Appender>| {
            if by_name {
                w.records()
                    .map_labels(|l| remap.get(l as usize).copied().unwrap_or(l));
            }
            let tmp = w.tmp_path().to_path_buf();
            w.publish(classes, types).at("writing", &tmp)
        };
        let ((), done) = write_in_parallel(threads, sink, write, |feed| {
            for slot in &self.slots {
                let taken = lock(slot).take();
                if taken.is_some_and(|w| !feed.send(w)) {
                    break; // the failure is the result; `abandon` removes every unnamed chunk
                }
            }
            Ok(())
        })?;
        Ok(done)
    }

    /// Removes the chunks of an unfinished writer still in their slots (nothing resumes from
    /// them; a chunk a failed finish took went with its writer).
    pub(super) fn abandon(&self) {
        for s in &self.slots {
            drop(lock(s).take());
        }
    }
}
