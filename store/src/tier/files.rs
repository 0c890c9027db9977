//! The tier's own files: the content list, the hot map, locks and atomic rewrites.

use std::io::Write;

use granary_format::{local, DatasetId};

use super::*;
use crate::write::Durability;

pub(super) fn encode_hot_map(chunks: &BTreeMap<u32, HotChunk>) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(chunks.len() as u64).to_le_bytes());
    for h in chunks.values() {
        b.extend_from_slice(&h.id.to_le_bytes());
        b.extend_from_slice(&h.file_size.to_le_bytes());
        b.extend_from_slice(&h.file_crc.to_le_bytes());
        b.extend_from_slice(&(h.sources.len() as u64).to_le_bytes());
        for (id, digest) in &h.sources {
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(digest);
        }
        b.extend_from_slice(&(h.samples.len() as u64).to_le_bytes());
        for &(s, off) in &h.samples {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
    }
    local::HOT_MAP.frame(&b)
}

/// Decodes `hot.map` (docs/internals.md); `None` when damaged.
pub fn decode_hot_map(b: &[u8]) -> Option<BTreeMap<u32, HotChunk>> {
    let body = local::HOT_MAP.unframe(b).ok()?;
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = body.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes"));
    let count = u64_(take(8)?);
    let mut out = BTreeMap::new();
    for _ in 0..count {
        let id = u32_(take(4)?);
        let file_size = u64_(take(8)?);
        let file_crc = u32_(take(4)?);
        let n = u64_(take(8)?);
        let raw = take(usize::try_from(n).ok()?.checked_mul(20)?)?;
        let sources = raw
            .chunks_exact(20)
            .map(|c| (u32_(&c[..4]), c[4..].try_into().expect("16 bytes")))
            .collect();
        let n = u64_(take(8)?);
        let raw = take(usize::try_from(n).ok()?.checked_mul(16)?)?;
        let samples = raw
            .chunks_exact(16)
            .map(|c| (u64_(&c[..8]), u64_(&c[8..])))
            .collect();
        // Each hot chunk is listed once.
        let dup = out.insert(
            id,
            HotChunk {
                id,
                file_size,
                file_crc,
                sources,
                samples,
            },
        );
        if dup.is_some() {
            return None;
        }
    }
    (at == body.len()).then_some(out)
}

/// The tier's content list (`index`, docs/internals.md): framed text lines, `next-hot N`, then
/// `chunk ID-DIGEST SIZE LAST_USE SCORE` or `hot ID SIZE LAST_USE SCORE` per file.
pub(super) fn encode_index(index: &BTreeMap<Key, Entry>, next_hot: u32) -> Vec<u8> {
    let mut body = format!("next-hot {next_hot}\n");
    for (k, e) in index {
        let (kind, id) = match k {
            Key::Chunk(id, digest) => ("chunk", format!("{id}-{}", hex16(digest))),
            Key::Hot(id) => ("hot", id.to_string()),
        };
        body += &format!("{kind} {id} {} {} {}\n", e.size, e.last_use, e.score);
    }
    local::TIER_INDEX.frame(body.as_bytes())
}

/// Decodes the content list: entries, use clock, next hot id; `None` if the frame is damaged
/// or any line is not one the tier writes (the list is then rebuilt from the files).
pub(super) fn parse_index(b: &[u8]) -> Option<(BTreeMap<Key, Entry>, u64, u32)> {
    let body = std::str::from_utf8(local::TIER_INDEX.unframe(b).ok()?).ok()?;
    let mut index = BTreeMap::new();
    let mut clock = 0;
    let mut next_hot = None;
    for line in body.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[..] {
            ["next-hot", n] if next_hot.is_none() => next_hot = Some(n.parse().ok()?),
            [kind, id, size, last, score] => {
                let key = match kind {
                    "chunk" => {
                        let (id, digest) = id.split_once('-')?;
                        Key::Chunk(id.parse().ok()?, parse_hex_id(digest.as_bytes())?)
                    }
                    "hot" => Key::Hot(id.parse().ok()?),
                    _ => return None,
                };
                let last: u64 = last.parse().ok()?;
                clock = clock.max(last);
                let e = Entry::new(size.parse().ok()?, last, score.parse().ok()?);
                if index.insert(key, e).is_some() {
                    return None;
                }
            }
            _ => return None,
        }
    }
    Some((index, clock, next_hot?))
}

/// Decodes a tier content list (for tools and fuzzing): `(files, use clock, next hot id)`,
/// or `None` if it is damaged.
pub fn decode_tier_index(b: &[u8]) -> Option<(usize, u64, u32)> {
    parse_index(b).map(|(i, c, n)| (i.len(), c, n))
}

/// Parses the 32 hex digits of a tier directory's name.
pub(super) fn parse_hex_id(name: &[u8]) -> Option<[u8; 16]> {
    let id: DatasetId = std::str::from_utf8(name).ok()?.parse().ok()?;
    Some(id.0)
}

/// For a temporary file of the tier directory (`<name>.<host>-<pid>-<n>.tmp`, as every
/// [`crate::write::AtomicFile`] is named; tiers of earlier versions wrote `<stem>.tmp<pid>`),
/// the lock file that says it is no longer being written: `lock`, or `scores.lock` for the
/// score table's; `None` for any other name.
pub(super) fn temp_lock(name: &str) -> Option<&'static str> {
    let legacy = || {
        let (stem, pid) = name.rsplit_once('.')?;
        let pid = pid.strip_prefix("tmp")?;
        (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(stem)
    };
    let stem = match crate::write::temp_target(name) {
        Some(target) => target.split('.').next()?,
        None => legacy()?,
    };
    match stem {
        "scores" => Some("scores.lock"),
        "index" | "hot" => Some("lock"),
        s if s.starts_with("chunk-") || s.starts_with("hot-") => Some("lock"),
        _ => None,
    }
}

/// Removes a tier entry whatever it turned out to be (a file, or a directory); a missing one
/// is fine.
pub(super) fn remove_entry(p: &Path) -> Result<()> {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("removing", p, e)),
    }
}

/// Opens (creating it) the lock file at `path` and takes an exclusive `flock` on it, held until
/// the returned file is dropped.
pub fn lock_exclusive(path: &Path) -> Result<File> {
    Ok(lock_file(path, true)?.expect("a waiting lock is always taken"))
}

/// Opens (creating it) the lock file at `path` and takes an exclusive `flock` on it; without
/// `wait`, `None` at once when another holder has the lock.
pub(super) fn lock_file(path: &Path, wait: bool) -> Result<Option<File>> {
    use rustix::fs::FlockOperation::{LockExclusive, NonBlockingLockExclusive};
    let f = crate::file::open_regular_for_writing(path)
        .map_err(|e| StoreError::io("opening", path, e))?;
    let op = if wait {
        LockExclusive
    } else {
        NonBlockingLockExclusive
    };
    match rustix::fs::flock(&f, op) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) if !wait => Ok(None),
        Err(e) => Err(StoreError::io("locking", path, e.into())),
    }
}

/// Writes `data` under a unique temporary name, fsyncs and renames it into place.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_atomic_with(path, data, true)
}

/// [`write_atomic`], fsyncing the file and its directory only when `durable`.
pub(super) fn write_atomic_with(path: &Path, data: &[u8], durable: bool) -> Result<()> {
    let durability = match durable {
        true => Durability::FileAndDir,
        false => Durability::Rename,
    };
    crate::write::write_atomic(path, durability, |w| w.write_all(data))
        .map_err(|e| StoreError::io("writing", path, e))
}
