//! `reindex`: rebuild a lost or damaged snapshot from the chunk footers alone.

use std::path::Path;

use granary_format::{
    check_chunk, chunk_file_name, parse_chunk_file_name, ChunkHeader, ChunkSummary, Snapshot,
    SnapshotBuilder, SNAPSHOT_FILE,
};
use rayon::prelude::*;
use serde::Serialize;

use crate::{hex_id, write_file_atomic, PackError};

/// A checked chunk: its summary, dataset id and class table.
type CheckedChunk = (ChunkSummary, [u8; 16], Vec<Vec<u8>>);

/// What `reindex` rebuilt.
#[derive(Clone, Debug, Serialize)]
pub struct ReindexSummary {
    pub dataset_id: String,
    pub chunks: u64,
    pub samples: u64,
    pub snapshot_bytes: u64,
}

/// Rebuilds `dir/snapshot.gsnap` from the chunk files in `dir`. Every chunk is checked
/// completely first (header, footer, every record CRC); chunk ids must run 0..n without gaps
/// and all chunks must carry the same dataset id and class table. Nothing is written unless
/// all of that holds; the new snapshot replaces the old one atomically.
pub fn reindex(dir: &Path) -> Result<ReindexSummary, PackError> {
    let rd = std::fs::read_dir(dir).map_err(|e| PackError::io("listing", dir, e))?;
    let mut ids: Vec<u32> = Vec::new();
    for e in rd {
        let e = e.map_err(|e| PackError::io("listing", dir, e))?;
        if let Some(id) = parse_chunk_file_name(&e.file_name().to_string_lossy()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    if ids.is_empty() {
        return Err(PackError::Usage(format!(
            "{}: no chunk files found",
            dir.display()
        )));
    }
    let missing: Vec<String> = (0..=*ids.last().expect("non-empty"))
        .filter(|i| ids.binary_search(i).is_err())
        .take(20)
        .map(chunk_file_name)
        .collect();
    if !missing.is_empty() {
        return Err(PackError::Usage(format!(
            "{}: chunks are missing, the snapshot cannot be rebuilt: {}",
            dir.display(),
            missing.join(", ")
        )));
    }
    let checked: Vec<Result<CheckedChunk, PackError>> = ids
        .par_iter()
        .map(|&id| {
            let path = dir.join(chunk_file_name(id));
            let bytes = std::fs::read(&path).map_err(|e| PackError::io("reading", &path, e))?;
            let header = ChunkHeader::decode(&bytes).map_err(|e| PackError::Source {
                path: path.clone(),
                detail: e.to_string(),
            })?;
            let check = check_chunk(&bytes, &header.dataset_id, id).map_err(|e| PackError::Source {
                path: path.clone(),
                detail: e.to_string(),
            })?;
            if let Some((i, err)) = check.bad_records.first() {
                return Err(PackError::Source {
                    path,
                    detail: format!(
                        "record {i} at offset {} is damaged ({err}); {} damaged records in this chunk",
                        check.footer.entries[*i].offset,
                        check.bad_records.len()
                    ),
                });
            }
            Ok((
                ChunkSummary {
                    chunk_id: id,
                    file_size: bytes.len() as u64,
                    file_crc: check.file_crc,
                    entries: check.footer.entries,
                    paths: check.footer.paths,
                },
                header.dataset_id,
                check.footer.classes,
            ))
        })
        .collect();
    let mut chunks = Vec::with_capacity(checked.len());
    let mut first: Option<([u8; 16], Vec<Vec<u8>>)> = None;
    for r in checked {
        let (s, id, classes) = r?;
        match &first {
            None => first = Some((id, classes)),
            Some((id0, c0)) => {
                if *id0 != id {
                    return Err(PackError::Usage(format!(
                        "{}: belongs to another dataset than chunk 0",
                        dir.join(chunk_file_name(s.chunk_id)).display()
                    )));
                }
                if *c0 != classes {
                    return Err(PackError::Usage(format!(
                        "{}: its class table differs from chunk 0's",
                        dir.join(chunk_file_name(s.chunk_id)).display()
                    )));
                }
            }
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
    // Footers are checksummed but can still be crafted (paths leaving the tree, labels past the
    // class table): the rebuilt snapshot must pass the full structural check before it is
    // written (O(samples), small next to reading every chunk above).
    let problems = Snapshot::open(&snap[..])
        .map(|s| s.check_structure(5))
        .unwrap_or_else(|e| vec![e]);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|e| e.to_string()).collect();
        return Err(PackError::Usage(format!(
            "{}: the chunk footers do not describe a valid dataset, no snapshot written: {}",
            dir.display(),
            list.join("; ")
        )));
    }
    write_file_atomic(&dir.join(SNAPSHOT_FILE), &snap)?;
    Ok(ReindexSummary {
        dataset_id: hex_id(&dataset_id),
        chunks: chunks.len() as u64,
        samples,
        snapshot_bytes: snap.len() as u64,
    })
}
