//! `upgrade`: rewrite a format 1.x dataset's snapshot as format 2.0, in a local directory or
//! under an object-store URL. Chunk files are not touched: 1.x chunks are valid 2.0 chunks
//! (their header's minor version is the feature bit of a fields block). Each is read once, for
//! the digest 2.0 records and 1.x did not.

use std::path::Path;

use granary_format::{
    chunk_digest, chunk_file_name, is_legacy_snapshot, read_legacy_snapshot, LegacySnapshot,
    Snapshot, SnapshotBuilder, SnapshotHeader, SNAPSHOT_FILE,
};
use granary_store::StoreConfig;
use rayon::prelude::*;
use serde::Serialize;

use crate::reindex::{check_built, Place};
use crate::{hex_id, PackError};

pub use crate::output::LEGACY_SNAPSHOT_FILE;

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
        let bytes = place.read(&name)?.ok_or_else(|| refuse("missing".into()))?;
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
