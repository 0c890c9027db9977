//! `verify`: every section, every chunk, every record.

use std::path::Path;

use granary_format::{check_chunk, parse_chunk_file_name};
use rayon::prelude::*;
use serde_json::json;

use crate::{escape_path, Dataset};

/// One problem found by [`verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where: a file, and a chunk / offset / sample where known.
    pub location: String,
    /// What is wrong.
    pub detail: String,
}

/// What [`verify`] found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    pub samples: u64,
    pub chunks: u64,
    pub records_checked: u64,
    pub bytes_checked: u64,
    pub problems: Vec<Problem>,
    /// Files in the dataset directory that are not part of it (not damage).
    pub notes: Vec<String>,
    /// The digest a complete epoch delivers ([`Dataset::full_digest`]), as `granary read`
    /// prints it; `None` when the snapshot could not be read.
    pub digest: Option<u64>,
    /// The layout-independent digest of the content ([`Dataset::content_digest`]).
    pub content_digest: Option<u64>,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "clean": self.is_clean(),
            "samples": self.samples,
            "chunks": self.chunks,
            "records_checked": self.records_checked,
            "bytes_checked": self.bytes_checked,
            "problems": self.problems.iter().map(|p| json!({"location": p.location, "detail": p.detail})).collect::<Vec<_>>(),
            "notes": self.notes,
            "digest": self.digest.map(|d| format!("{d:016x}")),
            "content_digest": self.content_digest.map(|d| format!("{d:016x}")),
        })
    }
}

const STRUCTURE_LIMIT: usize = 1000;

/// Checks the dataset at `path` completely: snapshot header, section table, every section CRC
/// and structural invariant; every chunk file's size, whole-file CRC, header, footer, every
/// record's length and CRC; and that footers agree with the snapshot.
pub fn verify(path: &Path) -> VerifyReport {
    let mut r = VerifyReport::default();
    let ds = match Dataset::open(path) {
        Ok(ds) => ds,
        Err(e) => {
            r.problems.push(Problem {
                location: path.display().to_string(),
                detail: e.to_string(),
            });
            return r;
        }
    };
    let snap_loc = ds.snapshot_path().display().to_string();
    let snap = ds.snapshot();
    r.samples = snap.sample_count();
    r.chunks = snap.chunk_count();
    r.digest = ds.full_digest().ok();
    r.content_digest = ds.content_digest().ok();
    for e in snap
        .check_sections()
        .into_iter()
        .chain(snap.check_structure(STRUCTURE_LIMIT))
    {
        r.problems.push(Problem {
            location: snap_loc.clone(),
            detail: e.to_string(),
        });
    }
    let per_chunk: Vec<(u64, u64, Vec<Problem>)> = (0..snap.chunk_count() as u32)
        .into_par_iter()
        .map(|c| check_one_chunk(&ds, c))
        .collect();
    for (records, bytes, problems) in per_chunk {
        r.records_checked += records;
        r.bytes_checked += bytes;
        r.problems.extend(problems);
    }
    let known = |name: &str| {
        name == granary_format::SNAPSHOT_FILE
            || parse_chunk_file_name(name).is_some_and(|id| (id as u64) < snap.chunk_count())
    };
    match ds.store().list() {
        Ok(files) => {
            for (_, location) in files.iter().filter(|(n, _)| !known(n)) {
                r.notes
                    .push(format!("{} is not part of the dataset", location.display()));
            }
        }
        Err(e) => r
            .notes
            .push(format!("cannot list the dataset's files: {e}")),
    }
    r.notes.sort();
    r
}

fn check_one_chunk(ds: &Dataset, c: u32) -> (u64, u64, Vec<Problem>) {
    let loc = ds.chunk_path(c).display().to_string();
    let mut problems = Vec::new();
    let mut p = |location: String, detail: String| problems.push(Problem { location, detail });
    let Ok(ce) = ds.chunk(c) else {
        return (0, 0, problems);
    };
    let bytes = match ds.load_chunk(c) {
        Ok(b) => b,
        Err(e) => {
            p(loc, e.to_string());
            return (0, 0, problems);
        }
    };
    let check = match check_chunk(&bytes, &ds.snapshot().dataset_id(), c) {
        Ok(check) => check,
        Err(e) => {
            p(loc, format!("chunk {c}: {e}"));
            return (0, bytes.len() as u64, problems);
        }
    };
    if check.file_crc != ce.file_crc {
        p(
            loc.clone(),
            format!(
                "chunk {c}: whole-file checksum mismatch (snapshot {:#010x}, file {:#010x})",
                ce.file_crc, check.file_crc
            ),
        );
    }
    for (i, err) in &check.bad_records {
        let e = &check.footer.entries[*i];
        p(
            format!("{loc} (chunk {c}, offset {})", e.offset),
            format!(
                "record {} ({}): {err}",
                i,
                escape_path(&check.footer.paths[*i])
            ),
        );
    }
    let records = check.footer.entries.len() as u64;
    if records != ce.sample_count {
        p(
            loc.clone(),
            format!(
                "chunk {c}: footer lists {records} records, the snapshot {}",
                ce.sample_count
            ),
        );
    } else {
        for (i, id) in ce.samples().enumerate() {
            let same_entry = ds
                .snapshot()
                .sample(id)
                .is_ok_and(|s| s == check.footer.entries[i]);
            let same_path = ds.path(id).is_ok_and(|s| s == check.footer.paths[i]);
            if !same_entry || !same_path {
                p(
                    format!(
                        "{loc} (chunk {c}, offset {})",
                        check.footer.entries[i].offset
                    ),
                    format!(
                        "footer record {i} ({}) disagrees with snapshot sample {id}",
                        escape_path(&check.footer.paths[i])
                    ),
                );
            }
        }
    }
    (records, bytes.len() as u64, problems)
}
