//! Packing into an object store: chunks are built in a local staging directory (the build
//! directory of a local pack), each uploaded as soon as it is written and then replaced there
//! by a small marker (`chunk-N.sent`: the chunk's size, CRC and footer), so local disk holds a
//! few chunks at a time. The snapshot is uploaded last: until it exists, the prefix is not a
//! dataset. `--resume` keeps every chunk whose marker is intact and whose object has the
//! marker's size; the rest are packed and uploaded again.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use granary_format::local::UPLOAD_MARKER;
use granary_format::{
    chunk_file_name, parse_chunk_file_name, ChunkSummary, CHUNK_HEADER_LEN, CHUNK_TRAILER_LEN,
    SNAPSHOT_FILE,
};

use granary_store::object::ObjectUrl;

use crate::plan::Plan;
use crate::IoAt;
use crate::PackError;

/// Size, CRC and a reserved u32 before the chunk's trailer in a marker's body (a node-local
/// file, docs/internals.md, kind `UPLOAD_MARKER`).
const MARKER_FIXED: usize = 8 + 4 + 4 + 16;

/// Name of the marker left in the staging directory for an uploaded chunk.
pub(crate) fn sent_name(c: u32) -> String {
    let name = chunk_file_name(c);
    format!("{}.sent", name.strip_suffix(".gchunk").unwrap_or(&name))
}

/// The chunk id of a marker name (or of its temporary file).
pub(crate) fn parse_sent_name(name: &str) -> Option<u32> {
    let name = granary_store::write::temp_target(name).unwrap_or(name);
    let stem = name
        .strip_suffix(".sent")
        .or_else(|| name.strip_suffix(".tmp"))?;
    parse_chunk_file_name(&format!("{stem}.gchunk"))
}

/// Checks what the destination holds before a pack writes there: nothing, or only what a
/// granary pack writes. A dataset there needs `force` (its snapshot is removed first, so no
/// reader ever opens a mix of old and new chunks); chunks without a snapshot are an
/// interrupted upload and need `resume` or `force`, which also abort the multipart uploads an
/// interrupted pack left open under the prefix (S3; they would be billed until a lifecycle
/// rule removes them). Returns the objects found.
pub(crate) fn check_destination(
    dest: &ObjectUrl,
    force: bool,
    resume: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<(String, u64)>, PackError> {
    if resume || force {
        match dest.open_uploads() {
            Ok(Some(open)) if !open.is_empty() => {
                for u in &open {
                    dest.abort_upload(u)?;
                }
                let names: Vec<&str> = open.iter().map(|u| u.name.as_str()).collect();
                warnings.push(format!(
                    "{}: aborted {} multipart upload(s) left open by an interrupted pack: {}",
                    dest.url(),
                    open.len(),
                    names.join(", ")
                ));
            }
            Ok(_) => {}
            Err(e) => warnings.push(format!(
                "cannot list the multipart uploads open under {} (any left by an interrupted \
                 pack stay until a lifecycle rule removes them): {e}",
                dest.url()
            )),
        }
    }
    let found = dest.list()?;
    if let Some((other, _)) = found
        .iter()
        .find(|(n, _)| n != SNAPSHOT_FILE && parse_chunk_file_name(n).is_none())
    {
        return Err(usage!(
            "{} holds {other}, which granary did not write; pack only into an empty prefix or one \
             holding a granary dataset",
            dest.url()
        ));
    }
    let has_snapshot = found.iter().any(|(n, _)| n == SNAPSHOT_FILE);
    if has_snapshot && !force {
        return Err(usage!(
            "{} already holds a dataset; pass --force to replace it",
            dest.url()
        ));
    }
    if !has_snapshot && !found.is_empty() && !force && !resume {
        return Err(usage!(
            "{} holds chunks of an interrupted upload; pass --resume to continue it or --force to \
             start over",
            dest.url()
        ));
    }
    if has_snapshot {
        dest.delete(SNAPSHOT_FILE)?;
    }
    Ok(found)
}

/// Writes the marker of uploaded chunk `s` (read from its local file, which the caller then
/// removes).
pub(crate) fn write_marker(work: &Path, s: &ChunkSummary) -> Result<(), PackError> {
    let (head, tail, body, _) = crate::read_footer_bytes(work, s.chunk_id, s.file_size)?;
    let (size, crc) = (s.file_size.to_le_bytes(), s.file_crc.to_le_bytes());
    let m = [&size[..], &crc, &[0; 4], &s.digest, &head, &tail, &body].concat();
    crate::write_file_atomic(&work.join(sent_name(s.chunk_id)), &UPLOAD_MARKER.frame(&m))
}

/// The summary of uploaded chunk `c` from its marker, if the marker is intact and describes
/// the chunk the plan asks for.
pub(crate) fn read_marker(work: &Path, plan: &Plan, c: u32) -> Option<ChunkSummary> {
    let m = std::fs::read(work.join(sent_name(c))).ok()?;
    let (size, crc, digest, footer) = decode_marker(&m, c)?;
    if !crate::footer_matches_plan(plan, c as usize, &footer) {
        return None;
    }
    Some(ChunkSummary::from_footer(c, size, crc, digest, footer))
}

/// The full summary of uploaded chunk `slim.chunk_id` (whose entries and paths were dropped to
/// keep memory flat) from its marker, which must agree with `slim`'s size and CRC.
pub(crate) fn marker_summary(work: &Path, slim: ChunkSummary) -> Result<ChunkSummary, PackError> {
    let c = slim.chunk_id;
    let path = work.join(sent_name(c));
    let m = std::fs::read(&path).at("reading back", &path)?;
    match decode_marker(&m, c) {
        Some((size, crc, digest, footer))
            if size == slim.file_size && crc == slim.file_crc && digest == slim.digest =>
        {
            Ok(ChunkSummary::from_footer(c, size, crc, digest, footer))
        }
        _ => Err(PackError::Source {
            path,
            detail: format!(
                "changed since it was written: not the marker of chunk {c} as uploaded"
            ),
        }),
    }
}

/// What an upload marker says of its chunk: size, whole-file CRC, digest and footer.
pub type Marker = (u64, u32, [u8; 16], granary_format::ChunkFooter);

/// Decodes an upload marker of chunk `c`; `None` if it is damaged or inconsistent.
pub fn decode_marker(m: &[u8], c: u32) -> Option<Marker> {
    let content = UPLOAD_MARKER.unframe(m).ok()?;
    let fixed = MARKER_FIXED + CHUNK_HEADER_LEN + CHUNK_TRAILER_LEN;
    if content.len() < fixed || content[12..16] != [0; 4] {
        return None;
    }
    let size = u64::from_le_bytes(content[0..8].try_into().ok()?);
    let crc = u32::from_le_bytes(content[8..12].try_into().ok()?);
    let digest: [u8; 16] = content[16..32].try_into().ok()?;
    let (head, rest) = content[MARKER_FIXED..].split_at(CHUNK_HEADER_LEN);
    let (tail, body) = rest.split_at(CHUNK_TRAILER_LEN);
    let footer = crate::footer_of(c, size, (head, tail, body)).ok()?;
    Some((size, crc, digest, footer))
}

/// Uploads each chunk the writer finished, then leaves its marker and removes the local file.
/// Returns at the first failure (the writer then fails on its next send) or when the writer
/// is done.
pub(crate) fn upload_loop(
    dest: &ObjectUrl,
    work: &Path,
    rx: Receiver<ChunkSummary>,
    uploaded: &AtomicU64,
    on_progress: &(dyn Fn(u64) + Sync),
) -> Result<(), PackError> {
    for s in rx {
        let name = chunk_file_name(s.chunk_id);
        let path = work.join(&name);
        dest.put_file(&name, &path, &|n| {
            let total = uploaded.fetch_add(n, Ordering::Relaxed) + n;
            on_progress(total);
        })
        .map_err(PackError::Destination)?;
        write_marker(work, &s)?;
        std::fs::remove_file(&path).at("removing", &path)?;
    }
    Ok(())
}

/// Where a run's finished chunks go, as both pipelines (`pack`, the writer) hand them over: they
/// stay in the build directory (a local dataset, a shard's part), or each goes to the uploader
/// as soon as it is written ([`with_sink`]).
pub(crate) struct Sink<'a> {
    upload: Option<&'a SyncSender<ChunkSummary>>,
}

impl Sink<'_> {
    /// Hands over finished chunk `s`: to the uploader, if there is one (an error when the
    /// uploader stopped: its own error is the run's).
    pub(crate) fn finished(&self, s: &ChunkSummary) -> Result<(), PackError> {
        match self.upload {
            Some(tx) => tx
                .send(crate::slimmed(s))
                .map_err(|_| PackError::Upload("the upload stopped (its error follows)".into())),
            None => Ok(()),
        }
    }
}

/// Runs `work` with the sink of `dest`: without one, chunks stay in `dir`; with one, an
/// uploader thread sends each chunk of `dir` it is handed (first `first`: verified chunks an
/// interrupted upload left), at most two waiting, while `work` writes, and `progress` is told
/// the bytes uploaded so far. When both fail, the uploader's error is the cause (`work` only
/// saw the channel close).
pub(crate) fn with_sink<T>(
    dest: Option<&ObjectUrl>,
    dir: &Path,
    first: Vec<ChunkSummary>,
    progress: &(dyn Fn(u64) + Sync),
    work: impl FnOnce(&Sink<'_>) -> Result<T, PackError>,
) -> Result<T, PackError> {
    let Some(d) = dest else {
        return work(&Sink { upload: None });
    };
    let uploaded = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let (tx, rx) = sync_channel::<ChunkSummary>(2);
        let uploaded = &uploaded;
        let uploader = scope.spawn(move || upload_loop(d, dir, rx, uploaded, progress));
        let sent_first = first.into_iter().all(|w| tx.send(w).is_ok());
        let result = match sent_first && !uploader.is_finished() {
            true => Some(work(&Sink { upload: Some(&tx) })),
            false => None, // the uploader failed: its error is reported below
        };
        drop(tx);
        let sent = uploader.join().unwrap_or_else(|_| {
            Err(PackError::Upload(format!(
                "the upload thread to {} panicked",
                d.url()
            )))
        });
        match (sent, result) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(r)) => r,
            (Ok(()), None) => Err(PackError::Upload(format!(
                "the upload thread to {} stopped",
                d.url()
            ))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_format::{ChunkWriter, Compression};

    #[test]
    fn marker_round_trip_and_damage() {
        let work = tempfile::tempdir().unwrap();
        let mut w = ChunkWriter::new(Vec::new(), [7; 16], 2).unwrap();
        for (p, d) in [(&b"a/x"[..], &b"hello"[..]), (b"b/y", b"")] {
            let crc = granary_format::crc32(d);
            w.append(p, d, Compression::None, d.len() as u64, crc, 0)
                .unwrap();
        }
        let (bytes, summary) = w.finish(&[b"a", b"b"]).unwrap();
        std::fs::write(work.path().join(chunk_file_name(2)), &bytes).unwrap();
        let crc = granary_format::crc32(&bytes);
        let digest = granary_format::chunk_digest(&bytes);
        assert_eq!((crc, digest), (summary.file_crc, summary.digest));
        let slim = ChunkSummary::bare(2, bytes.len() as u64, crc, digest);
        write_marker(work.path(), &slim).unwrap();
        let m = std::fs::read(work.path().join(sent_name(2))).unwrap();
        granary_format::testing::dump_fuzz_seed("upload_marker", "two-records", &m);
        let (size, got_crc, got_digest, footer) = decode_marker(&m, 2).expect("intact marker");
        assert_eq!(
            (size, got_crc, got_digest),
            (bytes.len() as u64, crc, digest)
        );
        assert_eq!(
            (footer.entries, footer.paths),
            (summary.entries, summary.paths)
        );
        // Another chunk's id, any truncation, any flipped bit.
        assert!(decode_marker(&m, 3).is_none());
        for i in 0..m.len() {
            assert!(decode_marker(&m[..i], 2).is_none(), "cut at {i}");
            let mut d = m.clone();
            d[i] ^= 0x20;
            assert!(decode_marker(&d, 2).is_none(), "flip at {i}");
        }
    }
}
