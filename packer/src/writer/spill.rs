//! The scatter pass: spill records, their logs, and the threads that append to them.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Mutex;

use granary_format::{path_hash, ChunkWriter, Compression};

use crate::encode::{encode_bytes, CompressMode, Encoded};
use crate::shard::mix64;
use crate::{lock, IoAt, PackError};

use super::*;

/// One record of a spill log.
pub(super) struct SpillRecord {
    pub(super) key: Vec<u8>,
    /// A class index, or `NO_LABEL`.
    pub(super) label: u32,
    /// A class name (labels given by name without a class table).
    pub(super) label_name: Vec<u8>,
    /// A sample with named fields (record kind 2): name, length and CRC-32 of each field,
    /// whose bytes are `enc.stored` back to back (raw; `enc` describes their concatenation).
    pub(super) fields: Vec<(Vec<u8>, u64, u32)>,
    pub(super) enc: Encoded,
}

impl SpillRecord {
    /// What holding this record in memory costs: its bytes, its key and names, and the
    /// record's own size and one allocation's bookkeeping per buffer (for 64-byte samples the
    /// overhead is most of it, so the memory budget must count it).
    pub(super) fn held_bytes(&self) -> u64 {
        pub(super) const PER_ALLOCATION: usize = 16;
        let fields: usize = self
            .fields
            .iter()
            .map(|(n, _, _)| {
                std::mem::size_of::<(Vec<u8>, u64, u32)>() + n.capacity() + PER_ALLOCATION
            })
            .sum();
        (std::mem::size_of::<SpillRecord>()
            + self.key.capacity()
            + self.label_name.capacity()
            + self.enc.stored.capacity()
            + fields
            + 4 * PER_ALLOCATION) as u64
    }

    /// Appends the sample to chunk `w` with class index `label`: a blob as it is stored, a
    /// field group field by field.
    pub(super) fn append_to<W: Write>(&self, w: &mut ChunkWriter<W>, label: u32) -> io::Result<()> {
        let e = &self.enc;
        if self.fields.is_empty() {
            let (stored, z) = (&e.stored, e.compression);
            return w
                .append(&self.key, stored, z, e.orig_len, e.crc32, label)
                .map(drop);
        }
        let mut at = 0usize;
        let parts: Vec<(&[u8], &[u8], u32)> = self
            .fields
            .iter()
            .map(|(name, len, crc)| {
                at += *len as usize;
                (&name[..], &e.stored[at - *len as usize..at], *crc)
            })
            .collect();
        w.append_group(&self.key, &parts, label).map(drop)
    }

    /// Appends the record (length, body, CRC-32 of the body) to `out`.
    pub(super) fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        // The field directory of a kind-2 record: per field, name length u8, name, length
        // u64, CRC-32 u32.
        let mut dir = Vec::with_capacity(self.fields.len() * 24);
        for (name, len, crc) in &self.fields {
            dir.push(name.len() as u8);
            dir.extend_from_slice(name);
            dir.extend_from_slice(&len.to_le_bytes());
            dir.extend_from_slice(&crc.to_le_bytes());
        }
        let body_len = RECORD_FIXED
            + self.key.len()
            + self.label_name.len()
            + dir.len()
            + self.enc.stored.len();
        let mut h = [0u8; 4 + RECORD_FIXED];
        h[0..4].copy_from_slice(&(body_len as u32).to_le_bytes());
        let b = &mut h[4..];
        b[0] = if self.fields.is_empty() { 1 } else { 2 }; // one blob, or named fields
        b[1] = !self.label_name.is_empty() as u8;
        b[2] = self.enc.compression.code() as u8;
        b[4..8].copy_from_slice(&self.label.to_le_bytes());
        b[8..12].copy_from_slice(&(self.key.len() as u32).to_le_bytes());
        b[12..16].copy_from_slice(&(self.label_name.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.enc.orig_len.to_le_bytes());
        b[24..28].copy_from_slice(&self.enc.crc32.to_le_bytes());
        b[28..32].copy_from_slice(&(self.fields.len() as u32).to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h[4..]);
        crc.update(&self.key);
        crc.update(&self.label_name);
        crc.update(&dir);
        crc.update(&self.enc.stored);
        out.write_all(&h)?;
        out.write_all(&self.key)?;
        out.write_all(&self.label_name)?;
        out.write_all(&dir)?;
        out.write_all(&self.enc.stored)?;
        out.write_all(&crc.finalize().to_le_bytes())
    }

    /// Decodes a record body whose CRC was checked.
    pub(super) fn decode(body: Vec<u8>) -> Result<SpillRecord, String> {
        if body.len() < RECORD_FIXED || !(1..=2).contains(&body[0]) || body[1] > 1 || body[3] != 0 {
            return Err("not a record this granary writes".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().expect("4 bytes"));
        let compression = Compression::from_code(body[2] as u32).ok_or("unknown compression")?;
        let (key_len, name_len) = (u32_at(8) as usize, u32_at(12) as usize);
        let orig_len = u64::from_le_bytes(body[16..24].try_into().expect("8 bytes"));
        let crc32 = u32_at(24);
        let label = u32_at(4);
        let count = u32_at(28) as usize;
        let grouped = body[0] == 2;
        if grouped != (count > 0) || (grouped && compression != Compression::None) {
            return Err("field count and record kind disagree".into());
        }
        let head = RECORD_FIXED
            .checked_add(key_len)
            .and_then(|x| x.checked_add(name_len))
            .filter(|&x| x <= body.len() && (body[1] == 1) == (name_len > 0))
            .ok_or("lengths do not add up")?;
        let key = body[RECORD_FIXED..RECORD_FIXED + key_len].to_vec();
        let label_name = body[RECORD_FIXED + key_len..head].to_vec();
        let mut at = head;
        let mut fields = Vec::with_capacity(count.min(1024));
        let mut total = 0u64;
        for _ in 0..count {
            let n = *body.get(at).ok_or("field directory cut short")? as usize;
            let end = at + 1 + n + 12;
            if end > body.len() {
                return Err("field directory cut short".into());
            }
            let name = body[at + 1..at + 1 + n].to_vec();
            let len = u64::from_le_bytes(body[at + 1 + n..at + 9 + n].try_into().expect("8 bytes"));
            let crc = u32::from_le_bytes(body[at + 9 + n..end].try_into().expect("4 bytes"));
            total = total.checked_add(len).ok_or("field lengths overflow")?;
            fields.push((name, len, crc));
            at = end;
        }
        let mut stored = body;
        stored.drain(..at);
        if compression == Compression::None && stored.len() as u64 != orig_len
            || (grouped && total != orig_len)
        {
            return Err("stored length differs from the original's".into());
        }
        Ok(SpillRecord {
            key,
            label,
            label_name,
            fields,
            enc: Encoded {
                stored,
                compression,
                orig_len,
                crc32,
            },
        })
    }
}

/// Reads the next record of a spill log: `Ok(None)` at a clean end, `Err` at a torn or damaged
/// record (what follows it is not trusted).
pub(super) fn next_record(r: &mut impl Read) -> Result<Option<(Vec<u8>, u64)>, String> {
    let mut len = [0u8; 4];
    match r.read(&mut len[..1]) {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    r.read_exact(&mut len[1..]).map_err(|e| e.to_string())?;
    let n = u32::from_le_bytes(len) as usize;
    if n < RECORD_FIXED {
        return Err(format!("record length {n} is too short"));
    }
    // The length is untrusted until the CRC matches: memory grows with the bytes actually
    // there (a torn log, or a damaged length, never allocates what it claims).
    let mut body = Vec::new();
    r.take(n as u64 + 4)
        .read_to_end(&mut body)
        .map_err(|e| e.to_string())?;
    if body.len() != n + 4 {
        return Err(format!(
            "record of {n} bytes cut short after {} (the log ends)",
            body.len().saturating_sub(4)
        ));
    }
    let crc = u32::from_le_bytes(body[n..].try_into().expect("4 bytes"));
    body.truncate(n);
    if crc32fast::hash(&body) != crc {
        return Err("record CRC mismatch".into());
    }
    Ok(Some((body, 4 + n as u64 + 4)))
}

/// A record of a spill log with its offset and length, or why the log ends there.
pub(super) type LogItem = Result<(u64, u64, SpillRecord), (u64, String, bool)>;

/// A spill log's records in order, up to the first torn or damaged one, which ends them as
/// `Err((offset, why, torn))`: `torn` when the record is cut short or fails its CRC, not when
/// its checked bytes are no record this granary writes.
pub(super) fn records(mut r: impl Read) -> impl Iterator<Item = LogItem> {
    let (mut at, mut end) = (0u64, false);
    std::iter::from_fn(move || {
        if end {
            return None;
        }
        let item = match next_record(&mut r) {
            Ok(None) => None,
            Ok(Some((body, n))) => Some(
                SpillRecord::decode(body)
                    .map(|rec| (at, n, rec))
                    .map_err(|why| (at, why, false)),
            ),
            Err(why) => Some(Err((at, why, true))),
        };
        match &item {
            Some(Ok((_, n, _))) => at += n,
            _ => end = true,
        }
        item
    })
}

/// The records of a spill log held in memory, up to the first torn or damaged one; each must
/// encode back to its bytes (the fuzz target's check).
pub(crate) fn parse_log(b: &[u8]) -> usize {
    let mut n = 0;
    for (at, len, rec) in records(b).map_while(Result::ok) {
        let mut again = Vec::new();
        rec.write_to(&mut again).expect("writing to memory");
        assert!(
            again[..] == b[at as usize..(at + len) as usize],
            "a spill record decoded from bytes that are not its encoding"
        );
        n += 1;
    }
    n
}

/// The 128-bit hash of a key that the duplicate check keeps.
pub(super) fn key_hash(key: &[u8]) -> u128 {
    let mut s = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut s);
    ((path_hash(key) as u128) << 64) | s.finish() as u128
}

/// Which spill log a key goes to.
pub(super) fn bucket_of(key: &[u8], seed: u64, buckets: u32) -> u32 {
    let h = mix64(path_hash(key) ^ mix64(seed ^ 0x5343_4154));
    ((h as u128 * buckets as u128) >> 64) as u32
}

/// A key's place in the seeded order within its log.
pub(super) fn order_of(key: &[u8], seed: u64) -> u64 {
    mix64(path_hash(key) ^ mix64(seed ^ 0x4f52_4452))
}

pub(super) fn log_name(b: u32) -> String {
    format!("spill-{b:04}.log")
}

/// True for the names a writer keeps in its spill directory.
pub(crate) fn spill_file(name: &str) -> bool {
    if let Some(target) = granary_store::write::temp_target(name) {
        return spill_file(target);
    }
    name == STATE_FILE
        || name == TYPES_FILE
        || name == "field.tmp"
        || name == "writer.tmp"
        || (name.starts_with("spill-") && name.ends_with(".log"))
}

/// Removes a writer's own files from `dir` (refusing anything else there).
pub(super) fn clear_spill(dir: &Path) -> Result<(), PackError> {
    crate::output::remove_files_where(dir, |name, _| spill_file(name))
}

/// A writer thread: takes samples off the queue, encodes them and appends them to their log.
pub(super) fn spill_loop(rx: &Mutex<Receiver<Job>>, shared: &Shared, mode: CompressMode) {
    loop {
        // The queue's lock is held only while taking a job.
        let Ok(job) = lock(rx).recv() else { return };
        if let Err(e) = spill(job, shared, mode) {
            return shared.fail(e);
        }
    }
}

/// Encodes one sample and hands it to its chunk (with an expected count), to its bucket in
/// memory (within the budget) or to its spill log.
fn spill(job: Job, shared: &Shared, mode: CompressMode) -> Result<(), PackError> {
    let (fields, enc) = if job.fields.is_empty() {
        let enc = encode_bytes(job.data, mode).map_err(|detail| PackError::Source {
            path: PathBuf::from(String::from_utf8_lossy(&job.key).into_owned()),
            detail,
        })?;
        (Vec::new(), enc)
    } else {
        // Named fields are stored raw: one CRC per field, and theirs combined for the whole
        // (the CRC of the concatenation).
        let mut at = 0;
        let mut group = crc32fast::Hasher::new();
        let mut fields = Vec::with_capacity(job.fields.len());
        for (name, len) in job.fields {
            let crc = crc32fast::hash(&job.data[at..at + len]);
            group.combine(&crc32fast::Hasher::new_with_initial_len(crc, len as u64));
            fields.push((name, len as u64, crc));
            at += len;
        }
        let enc = Encoded {
            orig_len: job.data.len() as u64,
            crc32: group.finalize(),
            stored: job.data,
            compression: Compression::None,
        };
        (fields, enc)
    };
    let (label, label_name, b) = (job.label, job.label_name, job.bucket);
    let rec = SpillRecord {
        key: job.key,
        label,
        label_name,
        fields,
        enc,
    };
    if let Some(d) = shared.direct.get() {
        return d.append(b, rec);
    }
    let size = rec.held_bytes();
    if shared.held_bytes.fetch_add(size, Ordering::Relaxed) + size <= shared.budget {
        lock(&shared.held[b as usize]).push(rec);
        return Ok(());
    }
    shared.held_bytes.fetch_sub(size, Ordering::Relaxed);
    let mut log = lock(&shared.logs[b as usize]);
    rec.write_to(&mut *log)
        .at("writing", &shared.dir.join(log_name(b)))
}

/// A record to gather: held in memory (or read whole from a small log), or still in its log.
pub(super) enum Rec {
    Mem(SpillRecord),
    Disk(u64, u64),
}

/// The records of one spill log with their order keys: read whole if the log fits `memory`,
/// else indexed (offset, length), to be read one by one.
pub(super) fn read_log(
    p: &Path,
    seed: u64,
    memory: u64,
) -> Result<(File, Vec<(u64, Rec)>), PackError> {
    let f = File::open(p).at("opening", p)?;
    let len = f.metadata().at("inspecting", p)?.len();
    let mut recs = Vec::new();
    for r in records(BufReader::with_capacity(1 << 20, &f)) {
        let (at, n, rec) = r.map_err(|(at, why, _)| PackError::Source {
            path: p.to_path_buf(),
            detail: format!("spill log damaged at byte {at}: {why}"),
        })?;
        let order = order_of(&rec.key, seed);
        // Too large to hold: only where each record is.
        let rec = match len <= memory {
            true => Rec::Mem(rec),
            false => Rec::Disk(at, n),
        };
        recs.push((order, rec));
    }
    Ok((f, recs))
}

/// Reads record `(offset, length)` of spill log `p` back.
pub(super) fn read_record(f: &File, p: &Path, off: u64, n: u64) -> Result<SpillRecord, PackError> {
    let mut buf = vec![0u8; n as usize];
    f.read_exact_at(&mut buf, off).at("reading", p)?;
    let (body, _) = next_record(&mut &buf[..])
        .ok()
        .flatten()
        .ok_or_else(|| PackError::Source {
            path: p.to_path_buf(),
            detail: format!("spill log changed at byte {off} while the dataset was written"),
        })?;
    SpillRecord::decode(body).map_err(|why| PackError::Source {
        path: p.to_path_buf(),
        detail: why,
    })
}
