//! A pack's pipeline: reader threads read a chunk's files into one buffer (reused for later
//! chunks) and encode them where they lie; writer threads write earlier chunks from those
//! buffers.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;

use granary_format::ChunkSummary;
use indicatif::ProgressBar;
use rayon::prelude::*;

use crate::publish::{write_chunk, ChunkRecord, Contents};
use crate::{encode, slimmed, upload, PackError, PackOptions, Place, Plan, Skipped};

/// What writing chunks needs: the options, the source, where chunks go, and the plan.
pub(crate) struct Build<'a> {
    pub opts: &'a PackOptions,
    pub src: &'a Path,
    pub place: &'a Place,
    pub plan: &'a Plan,
}

/// Chunk data a pack holds at most in its buffers, unless three chunks are more: it decides
/// how many chunks are written at once (one chunk is being read, one waits, the rest are being
/// written).
const PACK_BUFFERS: u64 = 256 << 20;

/// Chunks written at once, up to four: one writer thread bounded a pack from and to fast
/// storage (writing into the page cache costs the kernel more CPU than reading out of it), and
/// on a disk each writer waits for its chunk's fsync while the others copy. 20,000 files,
/// 7 alternated runs: tmpfs 1.42 s with one writer, 1.10 s with two, the same with four;
/// disk (fsynced) 1.85–2.04 s with two, 1.60–1.67 s with four.
fn writer_threads(chunk_size: u64) -> usize {
    let fit = PACK_BUFFERS / chunk_size.max(1);
    usize::try_from(fit.saturating_sub(2).clamp(1, 4)).unwrap_or(1)
}

/// A chunk's files as read: `arena` holds each file's bytes back to back in the plan's order
/// (`files[k]` at `at`), and each record read says how it is encoded (a file that could not be
/// read and is skipped has no record; its bytes in the arena are not used).
struct ReadChunk {
    c: usize,
    arena: Vec<u8>,
    recs: Vec<ReadRecord>,
}

struct ReadRecord {
    k: usize,
    at: usize,
    len: usize,
    enc: encode::Encoding,
}

/// Reads, encodes and writes the plan's chunks `todo` (reading with `opts.io_threads`,
/// writing with [`writer_threads`] threads of their own); each written chunk is handed to `sink`.
///
/// A chunk's files are read into one buffer (the arena), which goes back to the reading side
/// once the chunk is written: no allocation and no fresh zeroed pages per file, and a record
/// stored as it is goes from the arena to the chunk file without another copy.
pub(crate) fn write_chunks(
    b: &Build<'_>,
    todo: &[usize],
    pb: &ProgressBar,
    files_done: &mut u64,
    skipped: &mut Vec<Skipped>,
    sink: &upload::Sink<'_>,
) -> Result<Vec<ChunkSummary>, PackError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(b.opts.io_threads.max(1))
        .thread_name(|i| format!("granary-read-{i}"))
        .build()
        .map_err(|e| PackError::Usage(format!("cannot start reader threads: {e}")))?;
    // One chunk in the channel, one being written by each writer, one being read: at most
    // max(PACK_BUFFERS, 3 chunks) of data.
    let (tx, rx) = sync_channel::<ReadChunk>(1);
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    // Each writer holds the receiver: when the last one stops (failed or panicked), sending
    // fails instead of waiting for ever.
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    // Set by a writer that failed: nothing more is read (its error is reported below).
    let failed = AtomicBool::new(false);
    let out = ChunkOut {
        b,
        sink,
        back: back_tx,
    };
    std::thread::scope(|scope| {
        let writers: Vec<_> = (0..writer_threads(b.opts.output.chunk_size))
            .map(|_| {
                let (rx, out, failed) = (rx.clone(), &out, &failed);
                scope.spawn(move || out.write_all(&rx, failed))
            })
            .collect();
        drop(rx);
        let mut failure = None;
        for &c in todo {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            let arena = back_rx.try_recv().unwrap_or_default();
            let chunk = read_chunk(b, &pool, pb, c, arena).and_then(|r| r.accept(b, c, skipped));
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            *files_done += chunk.recs.len() as u64;
            pb.set_message(format!("{} files", *files_done));
            if tx.send(chunk).is_err() {
                break; // the writers failed; their error is reported below
            }
        }
        drop(tx);
        let mut written = Ok(Vec::new());
        for w in writers {
            let r = w
                .join()
                .map_err(|_| PackError::Usage("chunk writer thread panicked".into()))?;
            written = match (written, r) {
                (Ok(mut all), Ok(w)) => {
                    all.extend(w);
                    Ok(all)
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        match (failure, written) {
            (_, Err(e)) | (Some(e), _) => Err(e),
            (None, Ok(w)) => Ok(w),
        }
    })
}

/// The writing side of a pack: chunks as read become chunk files, and their arenas go back.
struct ChunkOut<'a, 'b> {
    b: &'a Build<'b>,
    sink: &'a upload::Sink<'a>,
    back: std::sync::mpsc::Sender<Vec<u8>>,
}

impl ChunkOut<'_, '_> {
    /// One writer thread: writes chunks from `rx` until it closes; on an error sets `failed`
    /// and stops.
    fn write_all(
        &self,
        rx: &std::sync::Mutex<std::sync::mpsc::Receiver<ReadChunk>>,
        failed: &AtomicBool,
    ) -> Result<Vec<ChunkSummary>, PackError> {
        let mut out = Vec::new();
        loop {
            let next = match rx.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => return Ok(out), // another writer panicked: its join says so
            };
            let Ok(chunk) = next else { return Ok(out) };
            match self.write(chunk) {
                Ok(s) => out.push(s),
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
    }

    fn write(&self, ReadChunk { c, arena, recs }: ReadChunk) -> Result<ChunkSummary, PackError> {
        let (plan, place) = (self.b.plan, self.b.place);
        // Modes, mtimes and directories go into the chunks (unless --no-metadata).
        let with_attrs = !self.b.opts.no_metadata;
        let files = plan.chunk_files(c);
        let records = recs.iter().map(|r| {
            let i = files[r.k] as usize;
            ChunkRecord {
                key: plan.files.path(i),
                enc: r.enc.view(&arena[r.at..r.at + r.len]),
                label: plan.files.label[i],
                fields: &[],
                attrs: with_attrs.then(|| plan.files.attrs(i)),
            }
        });
        let contents = Contents::Files(with_attrs.then(|| plan.chunk_dirs(c)));
        let at = (plan.dataset_id, place.ids.id(c));
        let s = write_chunk(&place.chunks, at, &plan.classes, contents, records)?;
        // An arena much larger than a chunk (a chunk of one huge file) is not kept.
        if arena.capacity() as u64 <= self.b.opts.output.chunk_size.saturating_mul(2) {
            let _ = self.back.send(arena); // the reading side may have finished
        }
        self.sink.finished(&s)?;
        // A chunk that stays local is read back from its footer at the end; an uploaded one
        // is not there any more.
        Ok(if self.sink.uploads() { s } else { slimmed(s) })
    }
}

/// A chunk's files read into `arena` (the `k`th file of the chunk at `spans[k]`: offset,
/// length), each with its encoding or why it could not be read, in the plan's order.
struct ReadResults {
    arena: Vec<u8>,
    spans: Vec<(usize, usize)>,
    read: Vec<(usize, Result<encode::Encoding, String>)>,
}

impl ReadResults {
    /// The chunk to write: every record read, in the plan's order; a file that could not be
    /// read is skipped (`--skip-unreadable`: listed in `skipped`) or the pack's error.
    fn accept(
        self,
        b: &Build<'_>,
        c: usize,
        skipped: &mut Vec<Skipped>,
    ) -> Result<ReadChunk, PackError> {
        let files = b.plan.chunk_files(c);
        let mut recs = Vec::with_capacity(self.read.len());
        for (k, r) in self.read {
            let (at, len) = self.spans[k];
            match r {
                Ok(enc) => recs.push(ReadRecord { k, at, len, enc }),
                Err(reason) if b.opts.skip_unreadable => skipped.push(Skipped {
                    path: b.plan.files.path(files[k] as usize).to_vec(),
                    reason,
                }),
                Err(detail) => {
                    let rel = b.plan.files.path(files[k] as usize);
                    return Err(PackError::Source {
                        path: b.src.join(std::ffi::OsStr::from_bytes(rel)),
                        detail,
                    });
                }
            }
        }
        Ok(ReadChunk {
            c,
            arena: self.arena,
            recs,
        })
    }
}

/// Reads chunk `c`'s files into `arena` (grown to fit them) with the reader threads, in inode
/// order (close to on-disk order), and encodes each where it lies.
fn read_chunk(
    b: &Build<'_>,
    pool: &rayon::ThreadPool,
    pb: &ProgressBar,
    c: usize,
    mut arena: Vec<u8>,
) -> Result<ReadResults, PackError> {
    let (files, table) = (b.plan.chunk_files(c), &b.plan.files);
    let mut spans = Vec::with_capacity(files.len());
    let mut total = 0usize;
    for &f in files {
        let i = f as usize;
        let len = usize::try_from(table.size[i])
            .ok()
            .filter(|l| total.checked_add(*l).is_some())
            .ok_or_else(|| PackError::Source {
                path: b.src.join(std::ffi::OsStr::from_bytes(table.path(i))),
                detail: "file too large for this machine's address space".into(),
            })?;
        spans.push((total, len));
        total += len;
    }
    if arena.len() < total {
        arena.try_reserve_exact(total - arena.len()).map_err(|_| {
            PackError::Usage(format!(
                "cannot allocate {total} bytes to read chunk {c}'s files"
            ))
        })?;
        arena.resize(total, 0);
    }
    // Each file's place in the arena, handed to the reader threads in inode order.
    let mut slots: Vec<Option<&mut [u8]>> = Vec::with_capacity(files.len());
    let mut rest = &mut arena[..total];
    for &(_, len) in &spans {
        let (slot, tail) = std::mem::take(&mut rest).split_at_mut(len);
        slots.push(Some(slot));
        rest = tail;
    }
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_unstable_by_key(|&k| table.ino[files[k] as usize]);
    let work: Vec<(usize, &mut [u8])> = order
        .into_iter()
        .map(|k| (k, slots[k].take().expect("each file once")))
        .collect();
    let mode = b.opts.output.compress;
    let mut read: Vec<(usize, Result<encode::Encoding, String>)> = pool.install(|| {
        work.into_par_iter()
            .map(|(k, buf)| {
                let i = files[k] as usize;
                let path = b.src.join(std::ffi::OsStr::from_bytes(table.path(i)));
                let r = encode::read_into(&path, table.mtime_ns[i], buf)
                    .and_then(|()| encode::encode_in_place(buf, mode));
                pb.inc(table.size[i]);
                (k, r)
            })
            .collect()
    });
    read.sort_unstable_by_key(|(k, _)| *k);
    Ok(ReadResults { arena, spans, read })
}
