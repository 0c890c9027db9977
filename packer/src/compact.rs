//! Compaction: the chunks that keep deleted samples' records are rewritten without them, as a
//! new revision of each (`chunk-NNNNNNNN.rR.gchunk`), and the next generation of the snapshot
//! names the new files; the old files stay for readers of older generations until a grace
//! period has passed since their replacement was written, and are removed by a later
//! `compact` (at once with a grace of 0). Sample ids do not move.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use granary_format::{
    chunk_file_name_at, parse_chunk_file_name_at, ChunkSummary, Compression, FileAttrs, Lineage,
    SampleEntry, Snapshot, FLAG_FIELDS, FLAG_REMOVED, NO_LABEL,
};
use granary_store::chunk_file::{ChunkFile, Records};
use granary_store::write::{AtomicFile, Durability};
use serde::Serialize;

use granary_store::StoreConfig;

use crate::place::Place;
use crate::publish::{spooled_builder, sync_dir};
use crate::{IoAt, PackError};

/// What `compact` rewrites and when it removes replaced files.
#[derive(Clone, Debug)]
pub struct CompactOptions {
    /// Rewrite a chunk when its deleted records take at least this share of its record bytes
    /// (in [0, 1]).
    pub min_dead: f64,
    /// Rewrite every chunk holding a deleted sample's record, whatever its share.
    pub all: bool,
    /// How long a replaced chunk file stays for readers of older generations, counted from
    /// when its replacement was written.
    pub grace: Duration,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            min_dead: 0.2,
            all: false,
            grace: DEFAULT_GRACE,
        }
    }
}

/// How long replaced chunk files stay by default: a day, longer than most readers keep a
/// generation open without reopening it.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(24 * 3600);

/// What a compaction did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompactSummary {
    pub dataset: PathBuf,
    /// The generation published (`None`: no chunk needed rewriting).
    pub generation: Option<u64>,
    pub chunks_rewritten: u64,
    /// Deleted samples' records removed, and their bytes.
    pub records_removed: u64,
    pub bytes_removed: u64,
    /// Bytes of the rewritten chunks read, and of their new files written.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Chunks holding deleted records left as they are (below `min_dead`).
    pub chunks_left: u64,
    /// Replaced files removed now, and those kept until their grace period ends.
    pub files_removed: Vec<String>,
    pub files_waiting: Vec<String>,
    pub elapsed_s: f64,
}

/// A chunk file other than the one its dataset's snapshot names for its id.
struct OtherFile {
    name: String,
    /// Replaced by the snapshot's revision, written at this time; `None`: a revision no
    /// snapshot named (written by a compaction killed before it published).
    replaced_at: Option<SystemTime>,
}

/// Compacts the local dataset at `dataset` as `o` says, under the dataset's lock: killed at any
/// point, the dataset is the old generation or the new one (files a killed run wrote are
/// removed by the next). Replaced files whose grace period has ended are removed, whether or
/// not this run rewrites anything.
pub fn compact(
    dataset: &Path,
    o: &CompactOptions,
    cfg: &StoreConfig,
) -> Result<CompactSummary, PackError> {
    let t0 = Instant::now();
    if !(0.0..=1.0).contains(&o.min_dead) {
        return Err(usage!("--min-dead {} is not in [0, 1]", o.min_dead));
    }
    let place = Place::of(dataset, cfg)?;
    let _lock = place.lock("compact")?;
    let snap = place.snapshot()?;
    let mut s = CompactSummary {
        dataset: dataset.to_path_buf(),
        ..Default::default()
    };
    let dead = dead_by_chunk(&snap)?;
    let mut chosen = Vec::new();
    for (&c, &(_, bytes)) in &dead {
        let ce = snap.chunk(c as u64)?;
        let record_bytes = ce.records_end - granary_format::CHUNK_HEADER_LEN as u64;
        if o.all || bytes as f64 >= o.min_dead * record_bytes.max(1) as f64 {
            chosen.push(c);
        } else {
            s.chunks_left += 1;
        }
    }
    if !chosen.is_empty() {
        publish(&place, &snap, &chosen, &dead, &mut s)?;
    }
    // What is removed, by the snapshot now in place.
    let now = place.snapshot()?;
    for f in other_files(&place, &now)? {
        let due = f.replaced_at.is_none_or(|at| {
            SystemTime::now()
                .duration_since(at)
                .is_ok_and(|age| age >= o.grace)
        });
        if due {
            granary_store::write::crash_point("remove", &place.location(&f.name));
            place.remove(&f.name)?;
            s.files_removed.push(f.name);
        } else {
            s.files_waiting.push(f.name);
        }
    }
    // Uploads a killed compaction left open on an object store (its new revisions' files), and
    // the temporary files of those it was writing in a directory (under the lock, no other
    // compaction writes one).
    let revision_file = |n: &str| parse_chunk_file_name_at(n).is_some_and(|(_, r)| r > 0);
    s.files_removed.extend(place.abort_uploads(revision_file)?);
    if let Place::Dir(_) = &place {
        for name in place.names()? {
            if granary_store::write::temp_target(&name).is_some_and(revision_file) {
                place.remove(&name)?;
                s.files_removed.push(name);
            }
        }
    }
    if let (false, Place::Dir(d)) = (s.files_removed.is_empty(), &place) {
        sync_dir(d)?;
    }
    s.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(s)
}

/// Per chunk whose file keeps deleted samples' records: (records, their bytes).
fn dead_by_chunk(snap: &Snapshot<Vec<u8>>) -> Result<BTreeMap<u32, (u64, u64)>, PackError> {
    let mut dead: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for &id in snap.deleted().iter() {
        let r = snap.record(id)?;
        if u32::from(r.flags) & FLAG_REMOVED != 0 {
            continue;
        }
        let ce = snap.chunk_of(id)?;
        let end = match id + 1 < ce.samples().end {
            true => snap.record(id + 1)?.offset,
            false => ce.records_end,
        };
        let d = dead.entry(ce.chunk_id).or_default();
        d.0 += 1;
        d.1 += end.saturating_sub(r.offset);
    }
    Ok(dead)
}

/// Chunk files in `dataset` that are not the revision `snap` names for their id (ids past its
/// chunk count are left alone: an interrupted append's).
fn other_files(place: &Place, snap: &Snapshot<Vec<u8>>) -> Result<Vec<OtherFile>, PackError> {
    let mut out = Vec::new();
    for name in place.names()? {
        let Some((id, rev)) = parse_chunk_file_name_at(&name) else {
            continue;
        };
        if u64::from(id) >= snap.chunk_count() || rev == snap.revision(id) {
            continue;
        }
        let replaced_at = match rev < snap.revision(id) {
            false => None,
            true => Some(place.modified(&snap.chunk_file_name(id))?),
        };
        out.push(OtherFile { name, replaced_at });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Rewrites chunks `chosen` without their deleted records and publishes the next generation.
fn publish(
    place: &Place,
    snap: &Snapshot<Vec<u8>>,
    chosen: &[u32],
    dead: &BTreeMap<u32, (u64, u64)>,
    s: &mut CompactSummary,
) -> Result<(), PackError> {
    let generation = snap.lineage().generation + 1;
    // Files of a killed run (revisions no snapshot names) would be in the way.
    for f in other_files(place, snap)?
        .into_iter()
        .filter(|f| f.replaced_at.is_none())
    {
        place.remove(&f.name)?;
    }
    let mut revisions: Vec<u32> = (0..snap.chunk_count() as u32)
        .map(|c| snap.revision(c))
        .collect();
    let mut rewritten: BTreeMap<u32, ChunkSummary> = BTreeMap::new();
    for &c in chosen {
        let rev = revisions[c as usize] + 1;
        let summary = rewrite(place, snap, c, rev, s)?;
        revisions[c as usize] = rev;
        let (n, bytes) = dead[&c];
        s.records_removed += n;
        s.bytes_removed += bytes;
        s.chunks_rewritten += 1;
        rewritten.insert(c, summary);
    }
    if let Place::Dir(d) = place {
        sync_dir(d)?;
    }
    let classes = (0..snap.class_count())
        .map(|c| snap.class_name(c as u32).map(<[u8]>::to_vec))
        .collect::<Result<Vec<_>, _>>()?;
    let mut b = spooled_builder(&place.scratch(), snap.dataset_id(), classes)?;
    let deleted = snap.deleted().iter();
    b.deletions(
        deleted
            .map(|&id| (id, snap.deleted_by(id).unwrap_or(0) as u32))
            .collect(),
    )?;
    b.revisions(revisions);
    let (summaries, order) = snap.chunk_summaries_and_order()?;
    b.path_order_hint(order);
    for (c, old) in summaries.into_iter().enumerate() {
        match rewritten.remove(&(c as u32)) {
            None => b.push_chunk(&old)?,
            Some(new) => b.push_chunk(&compacted_summary(snap, c as u32, old, new)?)?,
        }
    }
    let dirs = snap.dirs()?.into_iter();
    b.push_dirs(dirs.map(|d| (d.path, d.attrs.unwrap_or(FileAttrs::DIR_DEFAULT))))?;
    b.lineage(Lineage {
        generation,
        parent: snap.content_digest(),
    });
    if place.snapshot_key()? != (snap.dataset_id(), snap.content_digest()) {
        return Err(usage!(
            "{}: another command published a new generation while this compaction ran; run \
             it again (the chunk files it wrote are removed then)",
            place.show()
        ));
    }
    s.bytes_written += place.publish_snapshot(b)?;
    s.generation = Some(generation);
    Ok(())
}

/// Writes chunk `c` at revision `rev`: its records whose samples are not deleted, as stored,
/// with their paths, attributes, fields and the directories its file lists. Returns the new
/// file's summary (its records in order).
fn rewrite(
    place: &Place,
    snap: &Snapshot<Vec<u8>>,
    c: u32,
    rev: u32,
    s: &mut CompactSummary,
) -> Result<ChunkSummary, PackError> {
    let ce = snap.chunk(c as u64)?;
    let old_path = place.location(&snap.chunk_file_name(c));
    let bytes = place.read_named(&snap.chunk_file_name(c))?;
    let bytes: &[u8] = &bytes;
    let changed = |detail: String| PackError::Source {
        path: old_path.clone(),
        detail: format!("not the chunk the snapshot lists ({detail}); run granary verify"),
    };
    if bytes.len() as u64 != ce.file_size || granary_format::chunk_digest(bytes) != ce.digest {
        return Err(changed(format!("{} bytes or another digest", bytes.len())));
    }
    let check = granary_format::check_chunk(bytes, &snap.dataset_id(), c)
        .map_err(|e| changed(e.to_string()))?;
    if let Some((i, e)) = check.bad_records.first() {
        return Err(changed(format!("record {i}: {e}")));
    }
    s.bytes_read += bytes.len() as u64;
    let footer = check.footer;
    // The footer's records are the chunk's samples whose records were not removed, in order.
    let present: Vec<u64> = (ce.samples())
        .filter(|&id| {
            snap.record(id)
                .is_ok_and(|r| u32::from(r.flags) & FLAG_REMOVED == 0)
        })
        .collect();
    if present.len() != footer.entries.len() {
        return Err(changed(format!(
            "its footer lists {} records, the snapshot {}",
            footer.entries.len(),
            present.len()
        )));
    }
    let records = match (&footer.fields, &footer.attrs) {
        (Some(_), _) => Records::Fields,
        (None, Some(_)) => Records::Attrs(footer.dirs.clone()),
        (None, None) => Records::Plain,
    };
    let name = chunk_file_name_at(c, rev);
    let path = place.scratch().join(&name);
    let file = AtomicFile::create(&path, Durability::File).at("creating", &path)?;
    let tmp = file.tmp_path().to_path_buf();
    let io = |e| PackError::io("writing", &tmp, e);
    let mut f = ChunkFile::create(file, snap.dataset_id(), c, records).map_err(io)?;
    for (i, &id) in present.iter().enumerate() {
        if snap.deleted_by(id).is_some() {
            continue;
        }
        let e = &footer.entries[i];
        let stored = &bytes[e.offset as usize..(e.offset + e.stored_len) as usize];
        let w = f.records();
        match &footer.fields {
            Some(fl) => {
                let mut at = 0usize;
                let mut parts = Vec::with_capacity(fl.records[i].len());
                for fe in &fl.records[i] {
                    let part = &stored[at..at + fe.len as usize];
                    at += part.len();
                    parts.push((&fl.names[fe.name as usize][..], part, fe.crc32));
                }
                w.append_group(&footer.paths[i], &parts, e.label)
                    .map_err(io)?;
            }
            None => {
                let comp = e.compression()?;
                w.append(&footer.paths[i], stored, comp, e.orig_len, e.crc32, e.label)
                    .map_err(io)?;
                if let Some(a) = &footer.attrs {
                    w.attrs(a[i]).map_err(io)?;
                }
            }
        }
    }
    let types: BTreeMap<Vec<u8>, String> = match &footer.fields {
        Some(fl) => fl
            .names
            .iter()
            .cloned()
            .zip(fl.types.iter().cloned())
            .collect(),
        None => BTreeMap::new(),
    };
    granary_store::write::crash_point("publish", &path);
    let summary = f.publish(&footer.classes, &types).map_err(io)?;
    place.publish_file(&name, &path)?;
    s.bytes_written += summary.file_size;
    Ok(summary)
}

/// What the snapshot records of compacted chunk `c` whose new file is `new`: the samples not
/// deleted at their new places, each deleted one removed (an empty record where the next one
/// starts).
fn compacted_summary(
    snap: &Snapshot<Vec<u8>>,
    c: u32,
    mut s: ChunkSummary,
    new: ChunkSummary,
) -> Result<ChunkSummary, PackError> {
    let ce = snap.chunk(c as u64)?;
    let mut fresh = new.entries.iter();
    let mut end = granary_format::CHUNK_HEADER_LEN as u64;
    for (k, id) in ce.samples().enumerate() {
        let e = &mut s.entries[k];
        if snap.deleted_by(id).is_some() {
            let fields = e.flags & FLAG_FIELDS;
            *e = SampleEntry {
                chunk: c,
                label: NO_LABEL,
                offset: end,
                stored_len: 0,
                orig_len: 0,
                crc32: 0,
                flags: FLAG_REMOVED | fields | Compression::None as u32,
            };
            continue;
        }
        let n = fresh.next().ok_or_else(|| {
            usage!("chunk {c}: its new file holds fewer records than the samples it keeps")
        })?;
        if (n.stored_len, n.crc32) != (e.stored_len, e.crc32) {
            return Err(usage!(
                "chunk {c}: sample {id}'s record changed while it was copied"
            ));
        }
        e.offset = n.offset;
        end = n.offset + n.stored_len;
    }
    s.file_size = new.file_size;
    s.file_crc = new.file_crc;
    s.digest = new.digest;
    Ok(s)
}
