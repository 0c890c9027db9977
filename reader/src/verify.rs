//! `verify`: every section, every chunk, every record.

use std::path::Path;

use granary_format::{check_chunk, hex16, SNAPSHOT_FILE};
use rayon::prelude::*;
use serde_json::json;

use granary_store::{Location, RemoteKind, StoreConfig, StoreError};

use crate::dataset::{snapshot_file, Dataset};
use crate::error::ReadError;
use crate::pathfmt::escape_path;

/// One problem found by [`verify`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
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
    /// What could not be looked at (a missing dataset, bucket or permission, storage that did
    /// not answer): not a verdict of damage, but not a clean bill either.
    pub unreadable: Vec<Problem>,
    /// Files in the dataset directory that are not part of it (not damage).
    pub notes: Vec<String>,
    /// The digest a complete epoch delivers ([`Dataset::full_digest`]), as `granary read`
    /// prints it; `None` when the snapshot could not be read.
    pub digest: Option<u64>,
    /// The layout-independent digest of the content ([`Dataset::samples_digest`]).
    pub samples_digest: Option<u64>,
    /// Set when the dataset is of format 1.x with an intact snapshot: nothing is damaged, but
    /// this version reads it only once `granary upgrade` has rewritten its snapshot (what to
    /// run, said in full).
    pub needs_upgrade: Option<String>,
}

impl VerifyReport {
    /// True when everything was looked at and nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.unreadable.is_empty() && self.needs_upgrade.is_none()
    }

    /// True when damage was found.
    pub fn is_damaged(&self) -> bool {
        !self.problems.is_empty()
    }

    /// Records `e` at `location`: as what could not be looked at when `unreadable`, else as
    /// damage.
    fn fail(&mut self, location: String, e: &ReadError, unreadable: bool) {
        let detail = e.to_string();
        let p = Problem { location, detail };
        match unreadable {
            true => self.unreadable.push(p),
            false => self.problems.push(p),
        }
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "clean": self.is_clean(),
            "samples": self.samples,
            "chunks": self.chunks,
            "records_checked": self.records_checked,
            "bytes_checked": self.bytes_checked,
            "problems": self.problems,
            "unreadable": self.unreadable,
            "notes": self.notes,
            "digest": self.digest.map(|d| format!("{d:016x}")),
            "samples_digest": self.samples_digest.map(|d| format!("{d:016x}")),
            "needs_upgrade": self.needs_upgrade,
        })
    }
}

const STRUCTURE_LIMIT: usize = 1000;

/// Whether `e` means the data could not be looked at rather than that it is damaged: access
/// refused, storage that failed or did not answer, a malformed URL or missing credentials, and
/// (`whole`: opening the dataset itself) a dataset or bucket that is not there at all. A chunk
/// missing from a dataset that is there is damage, and so is a stale view (its dataset changed
/// since): a problem of the view.
fn cannot_look(e: &ReadError, whole: bool) -> bool {
    match e {
        ReadError::Store(StoreError::Remote { kind, .. }) => whole || *kind != RemoteKind::NotFound,
        ReadError::Store(StoreError::Io { source, .. }) => match source.kind() {
            std::io::ErrorKind::PermissionDenied => true,
            std::io::ErrorKind::NotFound => whole,
            _ => false,
        },
        ReadError::Store(StoreError::Invalid(m)) => whole && !m.contains("a stale view"),
        _ => false,
    }
}

/// Checks the dataset at `path` completely: snapshot header, section table, every section CRC
/// and structural invariant; every chunk file's size, whole-file CRC, header, footer, every
/// record's length and CRC; and that footers agree with the snapshot.
pub fn verify(path: &Path) -> VerifyReport {
    verify_with(path, &StoreConfig::default())
}

/// True when `path` holds a format 1.x snapshot that reads back whole.
fn legacy_intact(path: &Path, cfg: &StoreConfig) -> bool {
    let bytes = match granary_store::open(path, cfg) {
        Ok(Location::Local(p)) => std::fs::read(snapshot_file(&p)).ok(),
        Ok(Location::Object(u)) => u.get(SNAPSHOT_FILE).ok().map(|b| b.to_vec()),
        Err(_) => None,
    };
    bytes.is_some_and(|b| {
        granary_format::is_legacy_snapshot(&b) && granary_format::read_legacy_snapshot(&b).is_ok()
    })
}

/// [`verify`] with the store configured by `cfg`.
pub fn verify_with(path: &Path, cfg: &StoreConfig) -> VerifyReport {
    let mut r = VerifyReport::default();
    let ds = match Dataset::open_with(path, cfg) {
        Ok(ds) => ds,
        Err(e) if legacy_intact(path, cfg) => {
            r.needs_upgrade = Some(format!(
                "{}: a dataset of format 1.x whose snapshot is intact ({e}); run `granary \
                 upgrade {}` to read it with this version (it keeps every fact the snapshot \
                 records; `reindex` would lose file modes, mtimes and empty directories)",
                path.display(),
                path.display()
            ));
            return r;
        }
        Err(e) => {
            r.fail(path.display().to_string(), &e, cannot_look(&e, true));
            return r;
        }
    };
    if let Some(v) = ds.view() {
        r.notes.push(format!(
            "{} is a view selecting {} of the {} samples of the dataset at {}: the whole \
             dataset was verified (the counts below are the dataset's)",
            path.display(),
            v.ids.len(),
            ds.len(),
            ds.dir().display()
        ));
    }
    let snap_loc = ds.snapshot_path().display().to_string();
    let snap = ds.snapshot();
    r.samples = snap.live_count();
    r.chunks = snap.chunk_count();
    r.digest = ds.full_digest().ok();
    r.samples_digest = ds.samples_digest().ok();
    let mut found = snap.check_blocks();
    found.extend(snap.check_structure(STRUCTURE_LIMIT));
    for e in found {
        let (location, detail) = (snap_loc.clone(), e.to_string());
        r.problems.push(Problem { location, detail });
    }
    let chunks = (0..snap.chunk_count() as u32).into_par_iter();
    for c in chunks.map(|c| check_one_chunk(&ds, c)).collect::<Vec<_>>() {
        r.records_checked += c.records_checked;
        r.bytes_checked += c.bytes_checked;
        r.problems.extend(c.problems);
        r.unreadable.extend(c.unreadable);
    }
    let chunk_of = |name: &str| {
        granary_format::parse_chunk_file_name_at(name)
            .filter(|(id, _)| u64::from(*id) < snap.chunk_count())
    };
    let known = |name: &str| {
        name == SNAPSHOT_FILE || chunk_of(name).is_some_and(|(id, rev)| rev == snap.revision(id))
    };
    let listed = ds.store().list();
    for (n, l) in listed.iter().flatten().filter(|(n, _)| !known(n)) {
        let m = match chunk_of(n) {
            Some((id, rev)) if rev < snap.revision(id) => format!(
                "{} is chunk {id} as it was before compaction, kept for readers of older \
                 generations (`granary compact` removes it once its grace period has passed)",
                l.display()
            ),
            _ => format!("{} is not part of the dataset", l.display()),
        };
        r.notes.push(m);
    }
    if let Err(e) = listed {
        let m = format!("cannot list the dataset's files: {e}");
        r.notes.push(m);
    }
    r.notes.sort();
    r
}

/// Checks chunk `c`: its file's header, whole-file CRC, every record, and that the footer
/// agrees with the snapshot.
fn check_one_chunk(ds: &Dataset, c: u32) -> VerifyReport {
    let loc = ds.chunk_path(c).display().to_string();
    let mut out = VerifyReport::default();
    // A chunk table entry that cannot be read is reported by the snapshot's checks.
    let Ok(ce) = ds.chunk(c) else {
        return out;
    };
    let bytes = match ds.load_chunk(c) {
        Ok(b) => b,
        Err(e) => {
            out.fail(loc, &e, cannot_look(&e, false));
            return out;
        }
    };
    out.bytes_checked = bytes.len() as u64;
    let problems = &mut out.problems;
    // A problem of the chunk (`None`) or of the record at an offset.
    let mut p = |at: Option<u64>, detail: String| {
        let (location, detail) = match at {
            None => (loc.clone(), format!("chunk {c}: {detail}")),
            Some(o) => (format!("{loc} (chunk {c}, offset {o})"), detail),
        };
        problems.push(Problem { location, detail })
    };
    let check = match check_chunk(&bytes, &ds.snapshot().dataset_id(), c) {
        Ok(check) => check,
        Err(e) => {
            p(None, e.to_string());
            return out;
        }
    };
    if check.file_crc != ce.file_crc {
        let (want, got) = (ce.file_crc, check.file_crc);
        let m = format!("whole-file checksum mismatch (snapshot {want:#010x}, file {got:#010x})");
        p(None, m);
    }
    if check.digest != ce.digest {
        let (want, got) = (hex16(&ce.digest), hex16(&check.digest));
        let m = format!("digest mismatch (snapshot {want}, file {got})");
        p(None, m + ": not the chunk the snapshot lists");
    }
    let shown = |i: usize| escape_path(&check.footer.paths[i]);
    for (i, err) in &check.bad_records {
        let at = check.footer.entries[*i].offset;
        p(Some(at), format!("record {i} ({}): {err}", shown(*i)));
    }
    // Every chunk carries the snapshot's class table (SPEC.md §4), byte for byte.
    let classes = ds.classes();
    let theirs = &check.footer.classes;
    let same = |t: &Vec<&[u8]>| t.iter().copied().eq(theirs.iter().map(|b| &b[..]));
    if !classes.as_ref().is_ok_and(same) {
        let mine = classes.map_or_else(|e| e.to_string(), |t| t.len().to_string());
        let n = theirs.len();
        let m = format!("its footer's class table ({n} classes) is not the snapshot's ({mine})");
        p(None, m);
    }
    // The footer lists the chunk's samples whose records compaction did not remove.
    let snap = ds.snapshot();
    let removed = |id: u64| {
        snap.record(id)
            .is_ok_and(|r| u32::from(r.flags) & granary_format::FLAG_REMOVED != 0)
    };
    let present: Vec<u64> = ce.samples().filter(|&id| !removed(id)).collect();
    let records = check.footer.entries.len() as u64;
    if records != present.len() as u64 {
        let want = present.len();
        let m = format!("footer lists {records} records, the snapshot {want}");
        p(None, m);
    } else {
        check_fields(ds, &bytes, &check, &mut p);
        for (i, &id) in present.iter().enumerate() {
            if snap.deleted_by(id).is_some() {
                // Deleted: its record is still here, as the record table says; it has no path.
                let f = &check.footer.entries[i];
                let same = snap.record(id).is_ok_and(|r| {
                    (r.offset, r.flags as u32, r.crc32, r.label)
                        == (f.offset, f.flags, f.crc32, f.label)
                });
                if !same {
                    let m =
                        format!("footer record {i} disagrees with deleted snapshot sample {id}");
                    p(Some(f.offset), m);
                }
                continue;
            }
            let same_entry = snap.sample(id).is_ok_and(|s| s == check.footer.entries[i]);
            let same_path = ds.path(id).is_ok_and(|s| s == check.footer.paths[i]);
            // The same fields, by name, length and CRC.
            let same_fields = match &check.footer.fields {
                None => !snap.has_fields(),
                Some(f) => snap.fields(id).is_ok_and(|mine| {
                    mine.len() == f.records[i].len()
                        && mine.iter().zip(&f.records[i]).all(|(m, e)| {
                            f.names
                                .get(e.name as usize)
                                .is_some_and(|n| n[..] == *m.name)
                                && m.len == e.len
                                && m.crc32 == e.crc32
                        })
                }),
            };
            // Attributes a footer records are the snapshot's (a snapshot upgraded from 1.x
            // records them where its chunks do not).
            let attrs = check.footer.attrs.as_ref().filter(|_| snap.has_attrs());
            let same_attrs = attrs.is_none_or(|a| snap.attrs(id).is_ok_and(|m| m == Some(a[i])));
            if !same_entry || !same_path || !same_fields || !same_attrs {
                let (at, path) = (check.footer.entries[i].offset, shown(i));
                let m = format!("footer record {i} ({path}) disagrees with snapshot sample {id}");
                p(Some(at), m);
            }
        }
    }
    // Every directory a footer records is one of the snapshot's (whose attributes are those
    // of the first chunk that records it).
    for (d, _) in &check.footer.dirs {
        let found = ds.snapshot().find(d);
        if !found.is_ok_and(|f| f.is_some_and(|(_, e)| e.is_dir())) {
            let d = escape_path(d);
            let m = format!("the footer records directory {d}, the snapshot does not");
            p(None, m);
        }
    }
    out.records_checked = records;
    out
}

/// Checks a chunk's fields against the snapshot's types: every field's bytes a value of its
/// type, and a typed fields block declaring the snapshot's type for each name.
fn check_fields(
    ds: &Dataset,
    bytes: &[u8],
    check: &granary_format::ChunkCheck,
    p: &mut dyn FnMut(Option<u64>, String),
) {
    let Some(f) = &check.footer.fields else {
        return;
    };
    let names = ds.field_names().unwrap_or_default();
    let types = ds.snapshot().field_types().unwrap_or_default();
    // The snapshot's type of the field named `name`.
    let type_of = |name: &[u8]| types.get(names.iter().position(|m| *m == name)?);
    // Every field's bytes are a value of its type (fixed lengths, UTF-8, JSON).
    for (i, fields) in f.records.iter().enumerate() {
        let mut at = check.footer.entries[i].offset as usize;
        for e in fields {
            let end = at.saturating_add(e.len as usize).min(bytes.len());
            let name = String::from_utf8_lossy(&f.names[e.name as usize]);
            let value = &bytes[at.min(end)..end];
            let typ = type_of(&f.names[e.name as usize]);
            if let Some(Err(why)) = typ.map(|t| check_value(t, value)) {
                let path = escape_path(&check.footer.paths[i]);
                let m = format!("record {i} ({path}), field {name}: {why}");
                p(Some(at as u64), m);
            }
            at = end;
        }
    }
    // A chunk whose fields block carries types: each the snapshot's for its name.
    for (n, t) in f.names.iter().zip(&f.types) {
        let mine = type_of(n);
        if mine.is_none_or(|m| m.descriptor() != *t) {
            let (n, mine) = (
                String::from_utf8_lossy(n),
                mine.map_or("absent".into(), |m| m.descriptor()),
            );
            let m = format!("field {n} is {t} in the footer, {mine} in the snapshot");
            p(None, m);
        }
    }
}

/// Checks a field's bytes against its type: the fixed length of `int` and `ndarray`, UTF-8 for
/// `str`, a JSON document for `json`.
fn check_value(t: &granary_format::FieldType, b: &[u8]) -> std::result::Result<(), String> {
    t.check_value(b)?;
    if *t == granary_format::FieldType::Json {
        serde_json::from_slice::<serde::de::IgnoredAny>(b)
            .map_err(|e| format!("not a JSON document: {e}"))?;
    }
    Ok(())
}
