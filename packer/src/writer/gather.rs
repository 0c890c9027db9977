//! The gather pass: each spill log read back in a seeded order, cut into chunks, and the
//! snapshot (or the shard's part) written and published.

use std::collections::HashMap;

use granary_format::{ChunkSummary, SNAPSHOT_FILE};

use crate::run::{End, Totals};
use crate::{hex_id, output, shared_key_of, upload, IoAt, PackError, PackSummary};
use granary_store::chunk_file::Records;

use super::*;
use crate::publish::{write_chunk, write_in_parallel, Feed};

impl Writer {
    /// Builds the chunks and the snapshot (or the shard's part) and publishes the dataset.
    /// On failure the spill logs stay, for `resume`.
    pub fn finish(mut self) -> Result<PackSummary, PackError> {
        if self.finished {
            return Err(usage!("the writer is closed already"));
        }
        self.finished = true;
        // With an expected count but fewer samples than it takes to size the chunks: now.
        self.start_direct()?;
        self.drain(false)?;
        if !self.resumed.is_empty() {
            self.warnings.push(format!(
                "{} samples of the interrupted writer were not written again; they are in the dataset",
                self.resumed.len()
            ));
        }
        if self.samples == 0 && self.opts.output.shard.is_none() {
            // Nothing to lose: leave nothing behind either.
            clear_spill(&self.spill)?;
            let _ = std::fs::remove_dir(&self.spill);
            return Err(usage!(
                "no samples were written: {} not created",
                self.opts.output.out.display()
            ));
        }
        let classes = self.classes();
        let class_of: HashMap<Vec<u8>, u32> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), i as u32))
            .collect();
        if self.shared.direct.get().is_none() {
            self.clear_outputs()?;
        }
        let gather = |sink: &upload::Sink<'_>| match self.shared.direct.get() {
            Some(d) => d.finish(&classes, &class_of, &self.types, self.opts.threads, sink),
            None => self.gather(&classes, &class_of, sink),
        };
        let dest = self.opts.output.destination.as_deref();
        let gathered = upload::with_sink(dest, &self.layout.chunks, Vec::new(), &|_| {}, gather)?;
        self.warn_if_oversized(&gathered);
        let chunks = gathered.len() as u64;
        let o = &self.opts.output;
        let mut t = Totals::new(&self.layout.chunks, o.destination.is_some(), &gathered);
        let key = shared_key_of(&self.opts.settings(&[0; 16]));
        let end = End::of(o, key, &self.remote_found);
        let action = if o.shard.is_some() { "shard" } else { "write" };
        let at = (self.layout.work.as_path(), None);
        t.end((self.dataset_id, &classes), gathered, at, end)?;
        let summary = PackSummary {
            out: o.out.clone(),
            dataset_id: hex_id(&self.dataset_id),
            shard: o.shard.map(|s| s.to_string()),
            action,
            classes: classes.len() as u64,
            chunks,
            warnings: std::mem::take(&mut self.warnings),
            ..t.summary(self.t0.elapsed().as_secs_f64())
        };
        let spill = &self.spill;
        // Uploaded, the staging directory (spill logs, upload markers) went with the publish.
        if self.opts.output.destination.is_none() {
            clear_spill(spill)?;
            if self.opts.output.shard.is_none() {
                std::fs::remove_dir(spill).at("removing", spill)?;
            }
        }
        Ok(summary)
    }

    /// A warning when the expected count was far below what was written: the chunks came out
    /// larger than the chunk size by as much.
    fn warn_if_oversized(&mut self, chunks: &[ChunkSummary]) {
        let Some(expected) = self.opts.expected else {
            return;
        };
        let bytes: u64 = chunks.iter().map(|c| c.file_size).sum();
        let mean = bytes / chunks.len().max(1) as u64;
        if self.samples > expected.saturating_mul(3) / 2 && mean > self.opts.output.chunk_size {
            self.warnings.push(format!(
                "{} samples were written where {expected} were expected: the chunks average {} MiB \
                 against the chunk size of {} MiB (give the expected count as it is)",
                self.samples,
                mean >> 20,
                self.opts.output.chunk_size >> 20
            ));
        }
    }

    /// Removes what an interrupted `finish` may have left (chunks, snapshot), so the layout
    /// is made anew.
    pub(super) fn clear_outputs(&self) -> Result<(), PackError> {
        let dir = &self.layout.chunks;
        std::fs::create_dir_all(dir).at("creating", dir)?;
        if self.opts.output.destination.is_none() && self.opts.output.shard.is_none() {
            // The build directory of a whole dataset: only what a build writes, then nothing.
            output::check_replaceable(dir, output::Kind::Build)?;
            return output::empty_dir(dir);
        }
        // The run's chunks; of a whole dataset's upload, its snapshot and markers too.
        let whole = self.opts.output.shard.is_none();
        output::remove_files_where(dir, |name, is_file| {
            let ours = self.layout.owns(name)
                || whole
                    && (output::final_name(name) == SNAPSHOT_FILE
                        || name == "snapshot.tmp"
                        || upload::parse_sent_name(name).is_some());
            ours && is_file
        })
    }

    /// The second pass: every spill log in turn, its records in their seeded order, cut into
    /// chunks. Returns each chunk's summary (slim where the chunk stays on local disk).
    pub(super) fn gather(
        &self,
        classes: &[Vec<u8>],
        class_of: &HashMap<Vec<u8>, u32>,
        sink: &upload::Sink<'_>,
    ) -> Result<Vec<ChunkSummary>, PackError> {
        let pb = crate::progress_bar(
            self.opts.output.progress,
            Some(self.opts.buckets as u64),
            "{spinner} writing chunks [{bar:30}] {pos}/{len} logs {msg}",
        );
        // The layout, cut here in order, does not depend on which chunk writer finishes first.
        let write = |(id, recs): (u32, Vec<SpillRecord>)| {
            let records = match self.with_fields == Some(true) {
                true => Records::Fields,
                false => Records::Plain,
            };
            let (dir, contents) = (&self.layout.chunks, (records, &self.types));
            write_chunk(dir, (self.dataset_id, id), classes, contents, |w| {
                recs.iter().try_for_each(|r| r.append_to(w, r.label))
            })
        };
        let ((), done) = write_in_parallel(self.opts.threads, sink, write, |feed| {
            let mut asm = Assembler {
                w: self,
                current: Vec::new(),
                bytes: 0,
                chunks: 0,
                feed,
            };
            // Every record, log by log in seeded order, to the assembler.
            for b in 0..self.opts.buckets {
                let p = self.spill.join(log_name(b));
                let (f, mut recs) = read_log(&p, self.opts.output.seed, self.opts.gather_memory)?;
                let held = std::mem::take(&mut *lock(&self.shared.held[b as usize]));
                recs.extend(
                    held.into_iter()
                        .map(|r| (order_of(&r.key, self.opts.output.seed), Rec::Mem(r))),
                );
                recs.sort_unstable_by_key(|(o, _)| *o);
                for (_, rec) in recs {
                    let mut rec = match rec {
                        Rec::Mem(r) => r,
                        Rec::Disk(off, n) => read_record(&f, &p, off, n)?,
                    };
                    if !rec.label_name.is_empty() {
                        rec.label = *class_of.get(&rec.label_name).ok_or_else(|| {
                            usage!(
                                "{}: class {:?} of key {:?} is not in the class table",
                                p.display(),
                                String::from_utf8_lossy(&rec.label_name),
                                String::from_utf8_lossy(&rec.key)
                            )
                        })?;
                    }
                    asm.push(rec)?;
                }
                pb.inc(1);
                pb.set_message(format!("{} chunks", asm.chunks));
            }
            asm.close()
        })?;
        Ok(done)
    }
}

/// Cuts records into chunks as they come (ids in order, cut where the next record would pass
/// the chunk size or file count) and hands each chunk to the chunk writers.
pub(super) struct Assembler<'a> {
    pub(super) w: &'a Writer,
    /// The chunk being filled: its records and their stored bytes.
    pub(super) current: Vec<SpillRecord>,
    pub(super) bytes: u64,
    pub(super) chunks: usize,
    pub(super) feed: &'a Feed<'a, (u32, Vec<SpillRecord>)>,
}

impl Assembler<'_> {
    pub(super) fn push(&mut self, rec: SpillRecord) -> Result<(), PackError> {
        let size = rec.enc.stored.len() as u64;
        let full = !self.current.is_empty()
            && (self.current.len() as u64 >= self.w.opts.output.chunk_files
                || self.bytes + size > self.w.opts.output.chunk_size);
        if full {
            self.close()?;
        }
        self.bytes += size;
        self.current.push(rec);
        Ok(())
    }

    /// Hands the current chunk to a chunk writer.
    pub(super) fn close(&mut self) -> Result<(), PackError> {
        if self.current.is_empty() {
            return Ok(());
        }
        self.w.layout.ids.check(self.chunks + 1)?;
        let id = self.w.layout.ids.id(self.chunks);
        self.chunks += 1;
        self.bytes = 0;
        let recs = std::mem::take(&mut self.current);
        match self.feed.send((id, recs)) {
            true => Ok(()),
            // The writers' own error is the result (see `write_in_parallel`).
            false => Err(usage!("the chunk writers stopped")),
        }
    }
}
