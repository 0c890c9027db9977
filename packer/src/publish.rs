//! Everything the packer writes into a dataset goes through the store's write side
//! ([`granary_store::write::AtomicFile`]): chunk files (built as every chunk file is, by
//! [`granary_store::chunk_file::ChunkFile`]: [`write_chunk`] for `pack` and the writer API),
//! snapshots, parts, state files, and the final publish of the work directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};

use granary_format::{chunk_file_name, ChunkSummary, ChunkWriter, SnapshotBuilder};
use granary_store::chunk_file::{ChunkFile, Records};
use granary_store::write::{AtomicFile, Durability, Pending};

use crate::{lock, output, upload, IoAt, PackError};

/// The field types of a chunk without named fields.
pub(crate) static NO_TYPES: BTreeMap<Vec<u8>, String> = BTreeMap::new();

/// Writes chunk `id` of dataset `dataset_id` into `dir` ([`ChunkFile`]): its header, the
/// records `append` appends (of kind `records`, with field types `types`), and its footer
/// with the class table `classes`. The file is written past the page cache where the file
/// system allows ([`AtomicFile::direct`]; a [`ChunkWriter::append_run`] of a run that starts
/// a header's length past a block boundary of memory goes to the device from where it is)
/// and fsynced before it takes its name; the caller syncs the directory once for many
/// chunks. Nothing is left under either name on failure.
pub(crate) fn write_chunk(
    dir: &Path,
    (dataset_id, id): ([u8; 16], u32),
    classes: &[Vec<u8>],
    (records, types): (Records, &BTreeMap<Vec<u8>, String>),
    append: impl FnOnce(&mut ChunkWriter<AtomicFile>) -> std::io::Result<()>,
) -> Result<ChunkSummary, PackError> {
    let path = dir.join(chunk_file_name(id));
    let file = AtomicFile::direct(&path, Durability::File).at("creating", &path)?;
    let tmp = file.tmp_path().to_path_buf();
    let io = |e| PackError::io("writing", &tmp, e);
    let mut f = ChunkFile::create(file, dataset_id, id, records).map_err(io)?;
    append(f.records()).map_err(io)?;
    f.publish(classes, types).map_err(io)
}

/// The most chunks written at once: each chunk writer is one thread's copies into the page
/// cache and CRCs, and waits for its chunk's fsync; past four, on two cores, more threads only
/// hold more chunks in memory.
pub(crate) const MAX_CHUNK_WRITERS: usize = 4;

/// The caller's side of [`write_in_parallel`]: where it hands each chunk to write.
pub(crate) struct Feed<'a, J> {
    tx: SyncSender<J>,
    failed: &'a Mutex<Option<PackError>>,
}

impl<J> Feed<'_, J> {
    /// Hands `job` to a chunk writer, waiting while every writer is busy and one job waits.
    /// False once a chunk could not be written (that failure is the result of
    /// [`write_in_parallel`]): the caller stops making chunks.
    pub(crate) fn send(&self, job: J) -> bool {
        !self.stopped() && self.tx.send(job).is_ok()
    }

    /// True once a chunk could not be written.
    pub(crate) fn stopped(&self) -> bool {
        lock(self.failed).is_some()
    }
}

/// Writes chunks on `threads` threads (1 to [`MAX_CHUNK_WRITERS`]) while `feed` makes them:
/// every job `feed` sends becomes a chunk file by `write`, and each chunk written goes to
/// `sink` (uploaded, where the run uploads). Used by `pack` (jobs: files read), the writer's
/// gather (records read from spill logs) and its direct finish (chunks filled as samples came).
///
/// Returns what `feed` returned and the written chunks' summaries in id order, slim (only id,
/// size and CRC: memory does not grow with the samples; `Totals::full` reads the rest back).
/// The first chunk that could not be written (a writer that panicked included) is the error,
/// before `feed`'s own (which usually only saw the writers stop); after it, jobs still sent
/// are dropped unwritten and `feed` is told to stop.
pub(crate) fn write_in_parallel<J: Send, T>(
    threads: usize,
    sink: &upload::Sink<'_>,
    write: impl Fn(J) -> Result<ChunkSummary, PackError> + Sync,
    feed: impl FnOnce(&Feed<'_, J>) -> Result<T, PackError>,
) -> Result<(T, Vec<ChunkSummary>), PackError> {
    let failed: Mutex<Option<PackError>> = Mutex::new(None);
    let done: Mutex<Vec<ChunkSummary>> = Mutex::new(Vec::new());
    // At most one job waits: a pack holds one chunk being read, one waiting and one per writer.
    let (tx, rx) = sync_channel::<J>(1);
    // Each writer holds the receiver: were every writer gone, sending fails instead of waiting
    // for ever.
    let rx = Arc::new(Mutex::new(rx));
    let fed = std::thread::scope(|scope| {
        // Each writer writes jobs until the channel closes, keeping the first failure and
        // draining (not writing) the jobs after it, so the feed never waits on a stopped one.
        for _ in 0..threads.clamp(1, MAX_CHUNK_WRITERS) {
            let (rx, failed, done, write) = (Arc::clone(&rx), &failed, &done, &write);
            scope.spawn(move || {
                // (The queue's lock is held only while taking a job.)
                loop {
                    let Ok(job) = lock(&rx).recv() else { return };
                    if lock(failed).is_some() {
                        continue;
                    }
                    let written = catch_unwind(AssertUnwindSafe(|| write(job)));
                    let written = written.unwrap_or_else(|panic| {
                        let why = granary_store::panic_message(&*panic);
                        Err(usage!("a chunk writer thread panicked: {why}"))
                    });
                    match written.and_then(|s| sink.finished(&s).map(|()| crate::slimmed(&s))) {
                        Ok(s) => lock(done).push(s),
                        Err(e) => _ = lock(failed).get_or_insert(e),
                    }
                }
            });
        }
        drop(rx);
        let feed_side = Feed {
            tx,
            failed: &failed,
        };
        let fed = feed(&feed_side);
        drop(feed_side); // closes the channel: the writers finish what is sent and return
        fed
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
        return Err(e);
    }
    let mut done = done.into_inner().unwrap_or_else(PoisonError::into_inner);
    done.sort_unstable_by_key(|s| s.chunk_id);
    Ok((fed?, done))
}

/// A snapshot builder that keeps its record table in an unnamed temporary file in `dir`
/// instead of in memory (40 bytes per sample less at the peak of a pack, append or merge).
pub(crate) fn spooled_builder(
    dir: &Path,
    dataset_id: [u8; 16],
    classes: Vec<Vec<u8>>,
) -> Result<SnapshotBuilder, PackError> {
    let f = tempfile::tempfile_in(dir).at("creating a temporary file in", dir)?;
    let mut b = SnapshotBuilder::new(dataset_id, classes);
    b.spool_samples(f)?;
    Ok(b)
}

/// Moves the finished work directory to `out`, replacing an existing `out` (only reached with
/// `--force`, and only if it is a granary dataset) in one step: the two directories are
/// exchanged (`renameat2(RENAME_EXCHANGE)`), so that `out` holds the old dataset or the new
/// one at every moment, then the old one is moved to a name of its own and removed. Where
/// the file system cannot exchange, the old one is first moved aside (a moment without `out`).
pub(crate) fn publish_dataset(work: &Path, out: &Path) -> Result<(), PackError> {
    use granary_store::write::crash_point;
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut old_prefix = std::ffi::OsString::from(".");
    old_prefix.push(out.file_name().unwrap_or_default());
    old_prefix.push(".old-");
    // Datasets replaced by a publish that was killed before it removed them (publishes of
    // `out` take turns: the caller holds the build's lock).
    if let Ok(rd) = std::fs::read_dir(parent) {
        let prefix = old_prefix.as_encoded_bytes();
        for e in rd.flatten() {
            if e.file_name().as_encoded_bytes().starts_with(prefix) {
                let stale = e.path();
                if output::check_replaceable(&stale, output::Kind::Dataset).is_ok() {
                    crash_point("remove", &stale);
                    std::fs::remove_dir_all(&stale).at("removing", &stale)?;
                }
            }
        }
    }
    if std::fs::symlink_metadata(out).is_ok() {
        // Checked at the start too; something may have appeared there since.
        output::check_replaceable(out, output::Kind::Dataset)?;
        let mut old_name = old_prefix;
        old_name.push(std::process::id().to_string());
        let old = parent.join(old_name);
        crash_point("exchange", out);
        let cwd = rustix::fs::CWD;
        match rustix::fs::renameat_with(cwd, work, cwd, out, rustix::fs::RenameFlags::EXCHANGE) {
            Ok(()) => {
                // The old dataset is where the build was.
                crash_point("rename", work);
                std::fs::rename(work, &old).at("moving aside", work)?;
            }
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
                std::fs::rename(out, &old).at("moving aside", out)?;
                crash_point("rename", work);
                std::fs::rename(work, out).at("renaming", work)?;
            }
            Err(e) => return Err(PackError::io("exchanging with", out, e.into())),
        }
        sync_dir(parent)?;
        crash_point("remove", &old);
        std::fs::remove_dir_all(&old).at("removing", &old)?;
    } else {
        crash_point("rename", work);
        std::fs::rename(work, out).at("renaming", work)?;
        sync_dir(parent)?;
    }
    Ok(())
}

/// Streams the snapshot `b` builds to `path` with the extension `tmp`, fsynced, and returns
/// it not yet renamed (dropping it removes it) with its length. A builder that cannot build
/// (two samples share a path) fails before a byte is written, as [`PackError::Usage`].
pub(crate) fn write_snapshot_pending(
    path: &Path,
    b: SnapshotBuilder,
) -> Result<(Pending, u64), PackError> {
    let mut f = AtomicFile::create(path, Durability::FileAndDir).at("creating", path)?;
    let tmp = f.tmp_path().to_path_buf();
    let len = b.write_to(&mut f).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => PackError::Usage(e.to_string()),
        _ => PackError::io("writing", &tmp, e),
    })?;
    let pending = f.finish().at("writing", &tmp)?;
    Ok((pending, len))
}

/// Writes `data` to `path` whole: a temporary file, fsync, rename and fsync of the directory.
/// On failure (a full disk, say) the temporary file is removed again.
pub(crate) fn write_file_atomic(path: &Path, data: &[u8]) -> Result<(), PackError> {
    granary_store::write::write_atomic(path, Durability::FileAndDir, |w| w.write_all(data))
        .at("writing", path)
}

/// Fsyncs directory `dir`, so that the renames in it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), PackError> {
    granary_store::write::sync_dir(dir).at("syncing", dir)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Runs `write_in_parallel` with three writers over jobs 0..n, fed by the caller.
    fn run(
        n: u32,
        write: impl Fn(u32) -> Result<ChunkSummary, PackError> + Sync,
    ) -> (Result<Vec<ChunkSummary>, PackError>, u32) {
        let dir = tempfile::tempdir().unwrap();
        let mut sent = 0;
        let r = upload::with_sink(None, dir.path(), Vec::new(), &|_| {}, |sink| {
            write_in_parallel(3, sink, write, |feed| {
                for id in 0..n {
                    if !feed.send(id) {
                        break;
                    }
                    sent += 1;
                }
                Ok(())
            })
        });
        (r.map(|((), done)| done), sent)
    }

    #[test]
    fn every_chunk_is_written_once_and_summaries_come_back_slim_in_id_order() {
        let calls = AtomicUsize::new(0);
        let (done, sent) = run(50, |id| {
            calls.fetch_add(1, Ordering::Relaxed);
            let mut s = ChunkSummary::bare(id, 100 + u64::from(id), id * 7, [3; 16]);
            s.paths.push(b"x".to_vec());
            Ok(s)
        });
        let done = done.unwrap();
        assert_eq!((sent, calls.load(Ordering::Relaxed)), (50, 50));
        let ids: Vec<u32> = done.iter().map(|s| s.chunk_id).collect();
        assert_eq!(ids, (0..50).collect::<Vec<_>>());
        assert!(done
            .iter()
            .all(|s| s.paths.is_empty() && s.file_crc == s.chunk_id * 7));
    }

    #[test]
    fn the_first_failure_is_the_error_and_stops_the_feed() {
        let calls = AtomicUsize::new(0);
        let (done, sent) = run(1000, |id| {
            calls.fetch_add(1, Ordering::Relaxed);
            if id == 5 {
                return Err(PackError::Usage("chunk 5 broke".into()));
            }
            // Each other chunk takes a millisecond: all 1,000 would take a third of a second.
            std::thread::sleep(std::time::Duration::from_millis(1));
            Ok(ChunkSummary::bare(id, 1, 0, [0; 16]))
        });
        let e = done.unwrap_err().to_string();
        assert!(e.contains("chunk 5 broke"), "{e}");
        // The feed was stopped long before the end, and what it sent after is not written.
        assert!(sent < 500, "sent {sent}");
        assert!(calls.load(Ordering::Relaxed) < 500);
    }

    #[test]
    fn a_writer_that_panics_is_an_error_naming_it_not_a_hang() {
        let (done, sent) = run(100, |id| match id {
            3 => panic!("bad record in chunk 3"),
            _ => Ok(ChunkSummary::bare(id, 1, 0, [0; 16])),
        });
        let e = done.unwrap_err().to_string();
        assert!(
            e.contains("panicked") && e.contains("bad record in chunk 3"),
            "{e}"
        );
        assert!(sent >= 4, "sent {sent}");
    }

    #[test]
    fn the_writers_error_comes_before_the_feeds_own() {
        let dir = tempfile::tempdir().unwrap();
        let r = upload::with_sink(None, dir.path(), Vec::new(), &|_| {}, |sink| {
            let write = |_: u32| Err(PackError::Usage("disk full".into()));
            write_in_parallel(2, sink, write, |feed| {
                while feed.send(0) {}
                Err::<(), _>(PackError::Usage("the feed saw the writers stop".into()))
            })
        });
        assert!(r.unwrap_err().to_string().contains("disk full"));
    }
}
