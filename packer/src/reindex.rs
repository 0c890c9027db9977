//! The commands that rewrite a dataset's snapshot in place, in a local directory or under an
//! object-store URL: `reindex` rebuilds a lost or damaged snapshot from the chunk footers
//! alone; `upgrade` rewrites a format 1.x snapshot as format 2.0. Chunk files are not touched:
//! 1.x chunks are valid 2.0 chunks (their header's minor version is the feature bit of a fields
//! block); `upgrade` reads each once, for the digest 2.0 records and 1.x did not.

use std::path::Path;

use granary_format::{
    check_chunk, chunk_digest, chunk_file_name, is_legacy_snapshot, parse_chunk_file_name,
    read_legacy_snapshot, ChunkHeader, ChunkSummary, LegacySnapshot, Snapshot, SnapshotBuilder,
    SnapshotHeader, SNAPSHOT_FILE,
};
use granary_store::StoreConfig;
use rayon::prelude::*;
use serde::Serialize;

use crate::output::LEGACY_SNAPSHOT_FILE;
use crate::place::Place;
use crate::{hex_id, PackError};

/// A checked chunk: its summary, dataset id and class table.
type CheckedChunk = ([u8; 16], Vec<Vec<u8>>, ChunkSummary);

/// What `reindex` rebuilt.
#[derive(Clone, Debug, Serialize)]
pub struct ReindexSummary {
    pub dataset_id: String,
    pub chunks: u64,
    pub samples: u64,
    pub snapshot_bytes: u64,
    /// Directories of the rebuilt namespace (recorded in chunks, or ancestors of paths).
    pub directories: u64,
    /// Whether every chunk recorded its files' modes and mtimes (chunks of a pack with
    /// `--no-metadata`, of the Writer or of granary 0.1 before format 2.0 do not).
    pub file_attributes: bool,
    /// Where the snapshot was written.
    pub snapshot: String,
}

/// Rebuilds the snapshot of `dataset` (a directory or an object-store URL) from its chunk
/// files. Every chunk is checked completely first (header, footer, every record CRC); chunk
/// ids must run 0..n without gaps and all chunks must carry the same dataset id and class
/// table. Nothing is written unless all of that holds, and the snapshot is written last. A
/// snapshot that is there and intact is replaced only with `force`.
pub fn reindex(
    dataset: &Path,
    force: bool,
    cfg: &StoreConfig,
) -> Result<ReindexSummary, PackError> {
    let place = Place::of(dataset, cfg)?;
    let _lock = place.lock("reindex")?;
    if !force {
        place.refuse_intact_snapshot()?;
    }
    let names = place.names()?;
    if let Some(n) = names
        .iter()
        .find(|n| granary_format::parse_chunk_file_name_at(n).is_some_and(|(_, rev)| rev > 0))
    {
        return Err(usage!(
            "{}: {n} is a chunk rewritten by `granary compact`: rebuilding the snapshot of a \
             compacted dataset from its chunks is not supported yet (which samples were \
             deleted is known only to the snapshot)",
            place.show()
        ));
    }
    let mut ids: Vec<u32> = names
        .iter()
        .filter_map(|n| parse_chunk_file_name(n))
        .collect();
    ids.sort_unstable();
    if ids.is_empty() {
        return Err(usage!("{}: no chunk files found", place.show()));
    }
    // A snapshot still there that opens says how many chunks the dataset has: a missing last
    // chunk is missing too (without one, the chunks found are all that can be known).
    let old_bytes = place.read(SNAPSHOT_FILE)?;
    // A snapshot with deletions, damaged or not (its header says so), is the only record of
    // them: one rebuilt from the chunks would bring back the deleted samples they still hold.
    let header = old_bytes
        .as_deref()
        .and_then(|b| SnapshotHeader::decode(b).ok());
    if header.is_some_and(|h| h.has_deletions()) {
        return Err(usage!(
            "{}: its snapshot lists deleted samples and is the only record of them: a snapshot \
             rebuilt from the chunks would bring back those whose records the chunks still \
             hold; reindex refuses a dataset with deletions (restore the snapshot from a copy)",
            place.show()
        ));
    }
    let old = old_bytes.as_deref().and_then(|b| Snapshot::open(b).ok());
    let listed = old.map_or(0, |s| s.chunk_count());
    let end = u64::from(*ids.last().expect("non-empty") + 1).max(listed);
    let missing: Vec<String> = (0..end)
        .map(|i| i as u32)
        .filter(|i| ids.binary_search(i).is_err())
        .take(20)
        .map(chunk_file_name)
        .collect();
    if !missing.is_empty() {
        return Err(usage!(
            "{}: chunks are missing, the snapshot cannot be rebuilt: {}",
            place.show(),
            missing.join(", ")
        ));
    }
    let checked: Vec<Result<CheckedChunk, PackError>> = ids
        .par_iter()
        .map(|&id| {
            let path = place.location(&chunk_file_name(id));
            let bad = |detail: String| PackError::Source {
                path: path.clone(),
                detail,
            };
            let bytes = place
                .read_chunk(id)?
                .ok_or_else(|| bad("vanished while reindexing".into()))?;
            let header = ChunkHeader::decode(&bytes).map_err(|e| bad(e.to_string()))?;
            let check =
                check_chunk(&bytes, &header.dataset_id, id).map_err(|e| bad(e.to_string()))?;
            if let Some((i, err)) = check.bad_records.first() {
                return Err(bad(format!(
                    "record {i} at offset {} is damaged ({err}); {} damaged records in this chunk",
                    check.footer.entries[*i].offset,
                    check.bad_records.len()
                )));
            }
            Ok((
                header.dataset_id,
                check.footer.classes.clone(),
                ChunkSummary::from_footer(
                    id,
                    bytes.len() as u64,
                    check.file_crc,
                    check.digest,
                    check.footer,
                ),
            ))
        })
        .collect();
    let mut chunks = Vec::with_capacity(checked.len());
    let mut first: Option<([u8; 16], Vec<Vec<u8>>)> = None;
    for r in checked {
        let (id, classes, s) = r?;
        let (id0, c0) = first.get_or_insert_with(|| (id, classes.clone()));
        let path = place.location(&chunk_file_name(s.chunk_id));
        if *id0 != id {
            let shown = path.display();
            return Err(usage!("{shown}: belongs to another dataset than chunk 0"));
        }
        if *c0 != classes {
            let shown = path.display();
            return Err(usage!("{shown}: its class table differs from chunk 0's"));
        }
        chunks.push(s);
    }
    let (dataset_id, classes) = first.expect("non-empty");
    let mut b = SnapshotBuilder::new(dataset_id, classes);
    let mut samples = 0u64;
    for s in &chunks {
        b.push_chunk(s)?;
        samples += s.entries.len() as u64;
    }
    let snap = b.build()?;
    let s = check_built(&snap).map_err(|why| {
        usage!(
            "{}: the chunk footers do not describe a valid dataset, no snapshot written: {why}",
            place.show()
        )
    })?;
    let (directories, file_attributes) = (s.dir_count(), s.has_attrs());
    place.write(SNAPSHOT_FILE, &snap)?;
    Ok(ReindexSummary {
        snapshot: place.location(SNAPSHOT_FILE).display().to_string(),
        dataset_id: hex_id(&dataset_id),
        chunks: chunks.len() as u64,
        samples,
        snapshot_bytes: snap.len() as u64,
        directories,
        file_attributes,
    })
}

/// Opens a snapshot just built and checks it completely (footers are checksummed but can
/// still be crafted: paths leaving the tree, labels past the class table); `Err` says what
/// is wrong.
fn check_built(b: &[u8]) -> Result<Snapshot<&[u8]>, String> {
    let s = Snapshot::open(b).map_err(|e| e.to_string())?;
    let problems: Vec<String> = s
        .check_blocks()
        .into_iter()
        .chain(s.check_structure(5))
        .map(|e| e.to_string())
        .collect();
    match problems.is_empty() {
        true => Ok(s),
        false => Err(problems.join("; ")),
    }
}

/// What `upgrade` did.
#[derive(Clone, Debug, Serialize)]
pub struct UpgradeSummary {
    /// The format version found (`"1.6"`, or `"2.0"` when there was nothing to do).
    pub from: String,
    /// False when the snapshot was 2.0 already.
    pub upgraded: bool,
    pub dataset_id: String,
    pub samples: u64,
    pub chunks: u64,
    /// Directories and attributes carried over.
    pub directories: u64,
    pub file_attributes: bool,
    pub old_bytes: u64,
    pub new_bytes: u64,
    /// Where the 1.x snapshot was kept (empty when nothing was upgraded).
    pub kept: String,
}

/// Rewrites the snapshot of `dataset` as format 2.0 from its 1.x snapshot, with every fact
/// that snapshot recorded (samples, paths, labels, fields, lineage, modes, mtimes,
/// directories). The new snapshot is built and checked completely (and compared with the old
/// one, chunk by chunk) before anything is written; the old one is then kept as
/// [`LEGACY_SNAPSHOT_FILE`] and the new one replaces `snapshot.gsnap` in one step (a rename, or
/// one PUT). Interrupted, it is run again: the snapshot in place is either the old one or the
/// new one. A damaged 1.x snapshot is refused with a pointer to `granary reindex`, which
/// rebuilds a 2.0 snapshot from the chunks.
pub fn upgrade(dataset: &Path, cfg: &StoreConfig) -> Result<UpgradeSummary, PackError> {
    let place = Place::of(dataset, cfg)?;
    // Another upgrade of the same dataset finishes first; this one then finds 2.0.
    let _lock = place.lock("upgrade")?;
    let snap_loc = place.location(SNAPSHOT_FILE).display().to_string();
    let old = place.read(SNAPSHOT_FILE)?.ok_or_else(|| {
        usage!(
            "{snap_loc}: no snapshot there (`granary reindex {}` rebuilds one from the chunks)",
            place.show()
        )
    })?;
    if let Ok(h) = SnapshotHeader::decode(&old) {
        let s = Snapshot::open(&old[..]).map_err(|e| usage!("{snap_loc}: {e}"))?;
        return Ok(UpgradeSummary {
            from: "2.0".into(),
            upgraded: false,
            dataset_id: hex_id(&h.dataset_id),
            samples: s.sample_count(),
            chunks: s.chunk_count(),
            directories: s.dir_count(),
            file_attributes: s.has_attrs(),
            old_bytes: old.len() as u64,
            new_bytes: old.len() as u64,
            kept: String::new(),
        });
    }
    if !is_legacy_snapshot(&old) {
        return Err(usage!(
            "{snap_loc}: not a granary snapshot of format 1.x or 2.0"
        ));
    }
    let mut legacy = read_legacy_snapshot(&old).map_err(|e| {
        usage!(
            "{snap_loc}: the 1.x snapshot is damaged ({e}); `granary reindex {} --force` \
             rebuilds a 2.0 snapshot from the chunks (without file modes, mtimes and empty \
             directories, which 1.x chunks do not hold)",
            place.show()
        )
    })?;
    hash_chunks(&place, &mut legacy)?;
    let mut b = SnapshotBuilder::new(legacy.dataset_id, legacy.classes.clone());
    b.lineage(legacy.lineage);
    for c in &legacy.chunks {
        b.push_chunk(c)?;
    }
    b.push_dirs(legacy.dirs.clone())?;
    let new = b.build()?;
    check_same(&new, &legacy).map_err(|why| {
        usage!(
            "{snap_loc}: the 2.0 snapshot built from it does not check out, nothing written: {why}"
        )
    })?;
    place.write(LEGACY_SNAPSHOT_FILE, &old)?;
    place.write(SNAPSHOT_FILE, &new)?;
    Ok(UpgradeSummary {
        from: format!("{}.{}", legacy.version.0, legacy.version.1),
        upgraded: true,
        dataset_id: hex_id(&legacy.dataset_id),
        samples: legacy.chunks.iter().map(|c| c.entries.len() as u64).sum(),
        chunks: legacy.chunks.len() as u64,
        directories: Snapshot::open(&new[..]).map_or(0, |s| s.dir_count()),
        file_attributes: legacy.attrs,
        old_bytes: old.len() as u64,
        new_bytes: new.len() as u64,
        kept: place.location(LEGACY_SNAPSHOT_FILE).display().to_string(),
    })
}

/// Gives each chunk the digest format 2.0 records (1.x did not), from its file, which must be
/// the one the 1.x snapshot lists (its size and whole-file CRC-32): a chunk missing, damaged or
/// replaced stops the upgrade before anything is written.
fn hash_chunks(place: &Place, legacy: &mut LegacySnapshot) -> Result<(), PackError> {
    legacy.chunks.par_iter_mut().try_for_each(|c| {
        let name = chunk_file_name(c.chunk_id);
        let refuse = |what: String| {
            usage!(
                "{}: {what}, not the chunk the 1.x snapshot lists ({} bytes, CRC-32 {:08x}); \
                 nothing written (restore the chunk, then upgrade; `granary verify` names what \
                 else is damaged)",
                place.location(&name).display(),
                c.file_size,
                c.file_crc
            )
        };
        let bytes = place
            .read_chunk(c.chunk_id)?
            .ok_or_else(|| refuse("missing".into()))?;
        let crc = crc32fast::hash(&bytes);
        if bytes.len() as u64 != c.file_size || crc != c.file_crc {
            return Err(refuse(format!("{} bytes, CRC-32 {crc:08x}", bytes.len())));
        }
        c.digest = chunk_digest(&bytes);
        Ok(())
    })
}

/// Checks the new snapshot completely and that it records what the old one did: every
/// chunk's entries, paths and fields, every attribute, every recorded directory.
fn check_same(new: &[u8], old: &granary_format::LegacySnapshot) -> Result<(), String> {
    let s = check_built(new)?;
    let mut id = 0u64;
    for c in &old.chunks {
        let n = s
            .chunk_summary(c.chunk_id as u64)
            .map_err(|e| e.to_string())?;
        let same_fields = match (&n.fields, &c.fields) {
            (None, None) => true,
            (Some(a), Some(b)) => a.names == b.names && a.records == b.records,
            _ => false,
        };
        if n.entries != c.entries || n.paths != c.paths || !same_fields {
            return Err(format!("chunk {} differs", c.chunk_id));
        }
        for k in 0..c.entries.len() {
            let a = s.attrs(id).map_err(|e| e.to_string())?;
            if a != c.attrs.as_ref().map(|v| v[k]) {
                return Err(format!("sample {id}'s attributes differ"));
            }
            id += 1;
        }
    }
    for (d, a) in &old.dirs {
        let found = s.find(d).map_err(|e| e.to_string())?;
        let want = old.attrs.then_some(*a);
        if !found.is_some_and(|(_, e)| e.is_dir() && e.attrs == want) {
            return Err(format!("directory {} differs", String::from_utf8_lossy(d)));
        }
    }
    if s.lineage() != old.lineage {
        return Err("the lineage differs".into());
    }
    Ok(())
}
