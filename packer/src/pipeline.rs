//! A pack's pipeline: reader threads read a chunk's files into one buffer (reused for later
//! chunks) and encode them where they lie; writer threads write earlier chunks from those
//! buffers.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use granary_format::ChunkSummary;
use indicatif::ProgressBar;
use rayon::prelude::*;

use granary_format::{Compression, RunRecord, CHUNK_HEADER_LEN};
use granary_store::buf::AlignedBuf;

use crate::publish::{write_chunk, write_in_parallel, MAX_CHUNK_WRITERS, NO_TYPES};
use crate::{encode, upload, PackError, PackOptions, Place, Plan, Skipped};
use granary_store::chunk_file::Records;

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

/// Chunks written at once, up to [`MAX_CHUNK_WRITERS`]: one writer thread bounds a pack from and
/// to fast storage (writing into the page cache costs the kernel more CPU than reading out of
/// it), and on a disk each writer waits for its chunk's fsync while the others copy.
fn writer_threads(chunk_size: u64) -> usize {
    let fit = PACK_BUFFERS / chunk_size.max(1);
    usize::try_from(fit.saturating_sub(2).clamp(1, MAX_CHUNK_WRITERS as u64)).unwrap_or(1)
}

/// A chunk's files as read: `arena` holds each file's bytes back to back in the plan's order
/// (`files[k]` at `at`), from [`CHUNK_HEADER_LEN`] on, where they lie in the chunk file; each
/// record read says how it is encoded (a file that could not be read and is skipped has no
/// record; its bytes in the arena are not used).
struct ReadChunk {
    c: usize,
    arena: AlignedBuf,
    recs: Vec<ReadRecord>,
}

struct ReadRecord {
    k: usize,
    at: usize,
    len: usize,
    enc: encode::Encoding,
}

/// Reads, encodes and writes the plan's chunks `todo` (reading with `opts.io_threads`,
/// writing with [`writer_threads`] threads of their own); each written chunk is handed to
/// `sink`. Returns the written chunks' slim summaries (see [`write_in_parallel`]).
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
        .map_err(|e| usage!("cannot start reader threads: {e}"))?;
    // Arenas of written chunks, back to the reading side.
    let (back_tx, back_rx) = std::sync::mpsc::channel::<AlignedBuf>();
    let threads = writer_threads(b.opts.output.chunk_size);
    let write = |chunk: ReadChunk| write_read_chunk(b, chunk, &back_tx);
    let ((), written) = write_in_parallel(threads, sink, write, |feed| {
        for &c in todo {
            if feed.stopped() {
                break; // the writers' error is the result
            }
            let arena = back_rx.try_recv().ok();
            let chunk = read_chunk(b, (&pool, pb), c, arena, skipped)?;
            *files_done += chunk.recs.len() as u64;
            pb.set_message(format!("{} files", *files_done));
            if !feed.send(chunk) {
                break;
            }
        }
        Ok(())
    })?;
    Ok(written)
}

/// Writes a chunk as read into its chunk file, then hands its arena back to the reading side
/// (on `back`).
///
/// The records' stored bytes are made one run in the arena, where they lie in the chunk file:
/// files stored as they are stay where they were read (unless a skipped or compressed file
/// before them moves them down), compressed ones are copied in. The run so goes from the
/// arena to the device with no copy where the chunk is written with `O_DIRECT`.
fn write_read_chunk(
    b: &Build<'_>,
    ReadChunk { c, mut arena, recs }: ReadChunk,
    back: &std::sync::mpsc::Sender<AlignedBuf>,
) -> Result<ChunkSummary, PackError> {
    let (plan, place) = (b.plan, b.place);
    // Modes, mtimes and directories go into the chunks (unless --no-metadata).
    let with_attrs = !b.opts.no_metadata;
    let files = plan.chunk_files(c);
    let bytes = arena.as_mut_slice();
    let mut end = CHUNK_HEADER_LEN;
    let mut run = Vec::with_capacity(recs.len());
    for r in &recs {
        let (stored_len, compression) = match &r.enc.compressed {
            Some(z) => {
                bytes[end..end + z.len()].copy_from_slice(z);
                (z.len(), Compression::Zstd)
            }
            None => {
                if r.at != end {
                    bytes.copy_within(r.at..r.at + r.len, end);
                }
                (r.len, Compression::None)
            }
        };
        let i = files[r.k] as usize;
        run.push(RunRecord {
            path: plan.files.path(i),
            stored_len: stored_len as u64,
            compression,
            orig_len: r.len as u64,
            crc32: r.enc.crc32,
            label: plan.files.meta[i].label,
            attrs: with_attrs.then(|| plan.files.attrs(i)),
        });
        end += stored_len;
    }
    let records = match with_attrs {
        true => Records::Attrs(plan.chunk_dirs(c)),
        false => Records::Plain,
    };
    let at = (plan.dataset_id, place.ids.id(c));
    let body = &arena.as_slice()[CHUNK_HEADER_LEN..end];
    let contents = (records, &NO_TYPES);
    let s = write_chunk(&place.chunks, at, &plan.classes, contents, |w| {
        w.append_run(body, run)
    })?;
    // An arena much larger than a chunk (a chunk of one huge file) is not kept.
    if arena.as_slice().len() as u64 <= b.opts.output.chunk_size.saturating_mul(2) {
        let _ = back.send(arena); // the reading side may have finished
    }
    Ok(s)
}

/// Reads chunk `c`'s files into `arena` (a new one where it is missing or too small) with
/// the reader threads, in inode order (close to on-disk order), each where it lies in the
/// chunk file if all are stored as they are, and encodes each where it lies. A file that
/// could not be read is skipped (`--skip-unreadable`: listed in `skipped`) or the pack's
/// error.
fn read_chunk(
    b: &Build<'_>,
    (pool, pb): (&rayon::ThreadPool, &ProgressBar),
    c: usize,
    arena: Option<AlignedBuf>,
    skipped: &mut Vec<Skipped>,
) -> Result<ReadChunk, PackError> {
    let (files, table) = (b.plan.chunk_files(c), &b.plan.files);
    let mut spans = Vec::with_capacity(files.len());
    let mut total = CHUNK_HEADER_LEN;
    for &f in files {
        let i = f as usize;
        let len = usize::try_from(table.meta[i].size)
            .ok()
            .filter(|l| total.checked_add(*l).is_some())
            .ok_or_else(|| PackError::Source {
                path: b.src.join(std::ffi::OsStr::from_bytes(table.path(i))),
                detail: "file too large for this machine's address space".into(),
            })?;
        spans.push((total, len));
        total += len;
    }
    let chunk_size = usize::try_from(b.opts.output.chunk_size).unwrap_or(usize::MAX);
    let mut arena = match arena {
        Some(a) if a.as_slice().len() >= total => a,
        // Room for a whole chunk: a reused arena then fits the chunks that follow. Where
        // that is more than the machine gives (`--chunk-size 1TiB`), room for this chunk's
        // files alone.
        _ => AlignedBuf::try_new(total.max(chunk_size.saturating_add(CHUNK_HEADER_LEN)))
            .or_else(|| AlignedBuf::try_new(total))
            .ok_or_else(|| usage!("cannot allocate {total} bytes to read chunk {c}'s files"))?,
    };
    // Each file's place in the arena, handed to the reader threads in inode order.
    let mut work: Vec<(usize, &mut [u8])> = Vec::with_capacity(files.len());
    let mut rest = &mut arena.as_mut_slice()[CHUNK_HEADER_LEN..total];
    for (k, &(_, len)) in spans.iter().enumerate() {
        let (slot, tail) = std::mem::take(&mut rest).split_at_mut(len);
        work.push((k, slot));
        rest = tail;
    }
    work.sort_unstable_by_key(|(k, _)| table.meta[files[*k] as usize].ino);
    let mode = b.opts.output.compress;
    let mut read: Vec<(usize, Result<encode::Encoding, String>)> = pool.install(|| {
        work.into_par_iter()
            .map(|(k, buf)| {
                let i = files[k] as usize;
                let path = b.src.join(std::ffi::OsStr::from_bytes(table.path(i)));
                let r = encode::read_into(&path, table.meta[i].mtime_ns, buf)
                    .and_then(|()| encode::encode_in_place(buf, mode));
                pb.inc(table.meta[i].size);
                (k, r)
            })
            .collect()
    });
    read.sort_unstable_by_key(|(k, _)| *k);
    let mut recs = Vec::with_capacity(read.len());
    for (k, r) in read {
        let (at, len) = spans[k];
        let rel = || table.path(files[k] as usize);
        match r {
            Ok(enc) => recs.push(ReadRecord { k, at, len, enc }),
            Err(reason) if b.opts.skip_unreadable => skipped.push(Skipped {
                path: rel().to_vec(),
                reason,
            }),
            Err(detail) => {
                let path = b.src.join(std::ffi::OsStr::from_bytes(rel()));
                return Err(PackError::Source { path, detail });
            }
        }
    }
    Ok(ReadChunk { c, arena, recs })
}
