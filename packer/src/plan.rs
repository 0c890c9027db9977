//! The pack plan: which file goes into which chunk. Written to the work directory before any
//! chunk, so that `--resume` continues exactly the same plan even if the source is re-listed
//! differently.

use std::io::Write;
use std::path::Path;

use granary_format::{encode_string_table, StringTable};

use crate::PackError;

const PLAN_MAGIC: &[u8; 8] = b"GRNYPLAN";
/// Version 2 added each file's mtime; a plan of another version is not resumed.
const PLAN_VERSION: u32 = 2;

/// A file of the plan, in chunk order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PlanFile {
    pub rel: Vec<u8>,
    pub size: u64,
    pub label: u32,
    /// Inode number at scan time (only orders reads; never stored in the dataset).
    pub ino: u64,
    /// Modification time at scan time, nanoseconds since the epoch: a file whose size or
    /// mtime differs from the plan's has changed since the scan.
    pub mtime_ns: i64,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Canonical text of the settings the plan was made with (compared on resume).
    pub settings: String,
    pub dataset_id: [u8; 16],
    pub classes: Vec<Vec<u8>>,
    /// Files in chunk order.
    pub files: Vec<PlanFile>,
    /// `chunk_starts[c]..chunk_starts[c + 1]` are chunk `c`'s files.
    pub chunk_starts: Vec<u64>,
}

impl Plan {
    pub fn chunk_count(&self) -> usize {
        self.chunk_starts.len() - 1
    }

    pub fn chunk_files(&self, c: usize) -> &[PlanFile] {
        &self.files[self.chunk_starts[c] as usize..self.chunk_starts[c + 1] as usize]
    }

    /// Groups files (already in their final order) into chunks of about `target` bytes. A file
    /// of `target` bytes or more gets a chunk of its own.
    pub fn assign_chunks(files: &[PlanFile], target: u64) -> Vec<u64> {
        let mut starts = vec![0u64];
        let mut fill = 0u64;
        for (i, f) in files.iter().enumerate() {
            let i = i as u64;
            let open = *starts.last().unwrap() < i;
            if open && (f.size >= target || fill.saturating_add(f.size) > target) {
                starts.push(i);
                fill = 0;
            }
            fill = fill.saturating_add(f.size);
            if f.size >= target {
                starts.push(i + 1);
                fill = 0;
            }
        }
        if *starts.last().unwrap() != files.len() as u64 {
            starts.push(files.len() as u64);
        }
        starts
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(PLAN_MAGIC);
        b.extend_from_slice(&PLAN_VERSION.to_le_bytes());
        put_blob(&mut b, self.settings.as_bytes());
        b.extend_from_slice(&self.dataset_id);
        put_blob(&mut b, &encode_string_table(self.classes.iter()));
        put_blob(
            &mut b,
            &encode_string_table(self.files.iter().map(|f| &f.rel)),
        );
        b.extend_from_slice(&(self.files.len() as u64).to_le_bytes());
        for f in &self.files {
            b.extend_from_slice(&f.size.to_le_bytes());
            b.extend_from_slice(&f.label.to_le_bytes());
            b.extend_from_slice(&f.ino.to_le_bytes());
            b.extend_from_slice(&f.mtime_ns.to_le_bytes());
        }
        b.extend_from_slice(&(self.chunk_starts.len() as u64).to_le_bytes());
        for s in &self.chunk_starts {
            b.extend_from_slice(&s.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Plan> {
        let (body, crc) = b.split_at(b.len().checked_sub(4)?);
        if crc32fast::hash(body).to_le_bytes() != crc[..] {
            return None;
        }
        let mut r = Reader(body);
        if r.take(8)? != PLAN_MAGIC || r.u32()? != PLAN_VERSION {
            return None;
        }
        let settings = String::from_utf8(r.blob()?.to_vec()).ok()?;
        let dataset_id: [u8; 16] = r.take(16)?.try_into().ok()?;
        let classes = StringTable::parse(r.blob()?, "plan classes").ok()?;
        let classes = classes
            .iter()
            .map(|c| c.map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()
            .ok()?;
        let paths = StringTable::parse(r.blob()?, "plan paths").ok()?;
        let n = r.u64()?;
        if n != paths.len() {
            return None;
        }
        let mut files = Vec::with_capacity(n.min(1 << 24) as usize);
        for i in 0..n {
            files.push(PlanFile {
                rel: paths.get(i).ok()?.to_vec(),
                size: r.u64()?,
                label: r.u32()?,
                ino: r.u64()?,
                mtime_ns: r.u64()? as i64,
            });
        }
        let nc = r.u64()?;
        let mut chunk_starts = Vec::new();
        for _ in 0..nc {
            chunk_starts.push(r.u64()?);
        }
        let ok = !r.0.is_empty()
            || chunk_starts.first() != Some(&0)
            || chunk_starts.last() != Some(&n)
            || chunk_starts.windows(2).any(|w| w[0] > w[1]);
        if ok {
            return None;
        }
        Some(Plan {
            settings,
            dataset_id,
            classes,
            files,
            chunk_starts,
        })
    }

    /// Writes the plan atomically (temporary name, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), PackError> {
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| PackError::io("creating", &tmp, e))?;
        f.write_all(&self.encode())
            .and_then(|_| f.sync_all())
            .map_err(|e| PackError::io("writing", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| PackError::io("renaming", &tmp, e))
    }
}

/// How the source differs from a plan made of it earlier.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SourceChanges {
    /// Files whose size or modification time differs from the plan's.
    pub modified: Vec<Vec<u8>>,
    /// Files of the plan that are gone (or no longer regular files).
    pub removed: Vec<Vec<u8>>,
    /// Files that the plan does not have.
    pub added: Vec<Vec<u8>>,
}

impl SourceChanges {
    /// Compares `plan` with a fresh scan (`found`, sorted by path as the scan returns it).
    pub fn between(plan: &Plan, found: &[crate::scan::Found]) -> Self {
        let mut planned: Vec<&PlanFile> = plan.files.iter().collect();
        planned.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));
        let mut c = SourceChanges::default();
        let (mut p, mut f) = (planned.iter().peekable(), found.iter().peekable());
        loop {
            let plan_first = match (p.peek(), f.peek()) {
                (None, None) => break,
                (Some(a), Some(b)) if a.rel == b.rel => {
                    if a.size != b.size || a.mtime_ns != b.mtime_ns {
                        c.modified.push(a.rel.clone());
                    }
                    p.next();
                    f.next();
                    continue;
                }
                (Some(a), Some(b)) => a.rel < b.rel,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if plan_first {
                c.removed.extend(p.next().map(|a| a.rel.clone()));
            } else {
                c.added.extend(f.next().map(|b| b.rel.clone()));
            }
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        self.modified.is_empty() && self.removed.is_empty() && self.added.is_empty()
    }
}

impl std::fmt::Display for SourceChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for (what, list) in [
            ("modified", &self.modified),
            ("removed", &self.removed),
            ("added", &self.added),
        ] {
            if list.is_empty() {
                continue;
            }
            if !first {
                write!(f, "; ")?;
            }
            first = false;
            write!(f, "{} {what}", list.len())?;
            let shown: Vec<_> = list
                .iter()
                .take(3)
                .map(|p| String::from_utf8_lossy(p))
                .collect();
            write!(f, ", e.g. {}", shown.join(", "))?;
        }
        Ok(())
    }
}

pub(crate) fn put_blob(b: &mut Vec<u8>, data: &[u8]) {
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(data);
}

pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn blob(&mut self) -> Option<&'a [u8]> {
        let n = self.u64()?;
        self.take(usize::try_from(n).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(size: u64) -> PlanFile {
        PlanFile {
            rel: b"x".to_vec(),
            size,
            label: 0,
            ino: 0,
            mtime_ns: 0,
        }
    }

    #[test]
    fn chunk_assignment() {
        let files: Vec<_> = [3, 3, 3, 10, 1, 4, 4, 0].into_iter().map(f).collect();
        assert_eq!(Plan::assign_chunks(&files, 7), vec![0, 2, 3, 4, 6, 8]);
        assert_eq!(Plan::assign_chunks(&[], 7), vec![0]);
        assert_eq!(Plan::assign_chunks(&[f(20)], 7), vec![0, 1]);
        assert_eq!(Plan::assign_chunks(&[f(0), f(0)], 7), vec![0, 2]);
    }

    #[test]
    fn encode_round_trip_and_damage() {
        let p = Plan {
            settings: "s".into(),
            dataset_id: [3; 16],
            classes: vec![b"a".to_vec()],
            files: vec![
                PlanFile {
                    rel: b"a/1".to_vec(),
                    size: 5,
                    label: 0,
                    ino: 9,
                    mtime_ns: 1_700_000_000_123_456_789,
                },
                PlanFile {
                    rel: b"\xff".to_vec(),
                    size: 0,
                    label: u32::MAX,
                    ino: 1,
                    mtime_ns: -5,
                },
            ],
            chunk_starts: vec![0, 1, 2],
        };
        let b = p.encode();
        assert_eq!(Plan::decode(&b), Some(p));
        for cut in 0..b.len() {
            assert_eq!(Plan::decode(&b[..cut]), None);
        }
    }
}
