//! Sharded packing without a coordinator, and `merge`.
//!
//! Shard `i` of `n` keeps the files whose path hashes to `i` (a deterministic split every shard
//! computes alone from the names), packs them in its own seeded random order, and numbers its
//! `k`-th chunk `k × n + i`, so the shards' chunk ids never collide and need no agreement. Its
//! chunks go straight into the dataset directory; its plan, lock and, written last, its part
//! file (its settings and a line per chunk: id, size, CRC, sample count) live in
//! `DS/part-IIII-of-NNNN/`. `merge` checks the parts, fills the ids a shorter shard did not use
//! with empty chunks, and writes one snapshot over all chunks from their footers, one chunk at
//! a time; chunk data is never copied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use granary_format::{
    chunk_file_name, encode_string_table, parse_chunk_file_name, path_hash, ChunkHeader,
    ChunkSummary, ChunkWriter, SNAPSHOT_FILE,
};
use serde::Serialize;

use crate::plan::{put_blob, Body};
use crate::{hex_id, write_file_atomic, IoAt, PackError};
use granary_format::local::{LocalReader, SHARD_PART};

/// File name of a finished shard's part file, inside its part directory. It is written last
/// (atomically): a part directory without it is a shard still running or interrupted.
pub const PART_FILE: &str = "part.gpart";
// A part file is a node-local file (docs/internals.md, kind `SHARD_PART`).

/// The SplitMix64 finalizer: a stable 64-bit mix (never change it: it decides which shard
/// packs which file).
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which shard packs the file at `rel` when the input is split `n` ways: FNV-1a of the path
/// bytes, mixed, then mapped onto `0..n` by multiply-shift. Balanced in expectation by count
/// and by bytes (a file's size does not influence its shard).
pub fn shard_of(rel: &[u8], n: u32) -> u32 {
    ((mix64(path_hash(rel)) as u128 * n as u128) >> 64) as u32
}

/// Shard `index` of `count`. As data it is the pair `(index, count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "(u32, u32)", into = "(u32, u32)")]
pub struct ShardSpec {
    pub index: u32,
    pub count: u32,
}

impl ShardSpec {
    /// Parses `I/N` (0 ≤ I < N), `auto` (Slurm array job: `SLURM_ARRAY_TASK_ID`, `_MIN`,
    /// `_STEP`, `_COUNT`) or `auto/N` (index from `SLURM_ARRAY_TASK_ID` or Kubernetes'
    /// `JOB_COMPLETION_INDEX`, count N).
    pub fn parse(s: &str) -> Result<ShardSpec, String> {
        Self::parse_with(s, &|k| std::env::var(k).ok())
    }

    fn parse_with(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<ShardSpec, String> {
        let num = |what: &str, v: &str| -> Result<u32, String> {
            v.trim()
                .parse::<u32>()
                .map_err(|_| format!("{what} {v:?} is not a number"))
        };
        // The number in environment variable `k`, if it is set.
        let var = |k: &str| env(k).map(|v| num(k, &v)).transpose();
        let (i, n) = s.split_once('/').unwrap_or((s, ""));
        if i.trim() != "auto" {
            if n.is_empty() {
                return Err(format!("--shard {s:?}: expected I/N, e.g. 0/4, or auto"));
            }
            return ShardSpec::new(num("shard index", i)?, num("shard count", n)?);
        }
        let slurm = var("SLURM_ARRAY_TASK_ID")?;
        let index = match (slurm, var("JOB_COMPLETION_INDEX")) {
            (Some(id), _) => {
                let min = var("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
                let step = var("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
                id.checked_sub(min)
                    .map(|d| d / step)
                    .ok_or("SLURM_ARRAY_TASK_ID is below SLURM_ARRAY_TASK_MIN")?
            }
            (None, k8s) => k8s?.ok_or(
                "--shard auto needs SLURM_ARRAY_TASK_ID (a Slurm array job) or \
                 JOB_COMPLETION_INDEX (a Kubernetes indexed job); elsewhere give --shard I/N",
            )?,
        };
        let count = match (n.is_empty(), slurm.is_some()) {
            (false, _) => num("shard count", n)?,
            (true, true) => var("SLURM_ARRAY_TASK_COUNT")?
                .ok_or("--shard auto: SLURM_ARRAY_TASK_COUNT is not set; give --shard auto/N")?,
            (true, false) => Err(
                "--shard auto: a Kubernetes indexed job does not tell the number \
                 of shards; give --shard auto/N (N = the job's completions)",
            )?,
        };
        ShardSpec::new(index, count)
    }

    /// Shard `index` of `count`, if it is one (0 ≤ index < count ≤ 9999).
    pub fn new(index: u32, count: u32) -> Result<ShardSpec, String> {
        if count == 0 || index >= count {
            return Err(format!(
                "shard {index}/{count}: the index must lie in 0..{count} (shards are numbered from 0)"
            ));
        }
        if count > 9999 {
            return Err(format!("{count} shards: at most 9999 are supported"));
        }
        Ok(ShardSpec { index, count })
    }

    /// True if this shard packs `rel`.
    pub fn owns(&self, rel: &[u8]) -> bool {
        shard_of(rel, self.count) == self.index
    }

    /// The directory name of this shard's part inside the dataset.
    pub fn dir_name(&self) -> String {
        format!("part-{:04}-of-{:04}", self.index, self.count)
    }

    /// Parses [`ShardSpec::dir_name`].
    pub fn parse_dir_name(name: &str) -> Option<ShardSpec> {
        let (i, n) = name.strip_prefix("part-")?.split_once("-of-")?;
        let ok = |d: &str| d.len() == 4 && d.bytes().all(|b| b.is_ascii_digit());
        if !ok(i) || !ok(n) {
            return None;
        }
        let s = ShardSpec {
            index: i.parse().ok()?,
            count: n.parse().ok()?,
        };
        (s.index < s.count).then_some(s)
    }
}

impl TryFrom<(u32, u32)> for ShardSpec {
    type Error = String;
    fn try_from((index, count): (u32, u32)) -> Result<Self, String> {
        ShardSpec::new(index, count)
    }
}

impl From<ShardSpec> for (u32, u32) {
    fn from(s: ShardSpec) -> Self {
        (s.index, s.count)
    }
}

impl std::fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The dataset id all shards of one pack derive alone: from the settings they must share
/// (`key`), the shard count and the names they all listed.
pub(crate) fn shared_dataset_id(key: &str, shards: u32, names: u64, names_digest: u64) -> [u8; 16] {
    let key = path_hash(key.as_bytes());
    let words = [key, shards as u64, names, names_digest, 0x5348];
    crate::id_from(granary_format::SplitMix64::keyed(&words))
}

/// A chunk as a part file lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartChunk {
    pub chunk_id: u32,
    pub file_size: u64,
    pub file_crc: u32,
    pub digest: [u8; 16],
    pub samples: u64,
}

impl PartChunk {
    /// A written chunk as its part file lists it.
    pub(crate) fn of(s: &granary_format::ChunkSummary) -> Self {
        PartChunk {
            chunk_id: s.chunk_id,
            file_size: s.file_size,
            file_crc: s.file_crc,
            digest: s.digest,
            samples: s.entries.len() as u64,
        }
    }
}

/// What a finished shard leaves for `merge`: its settings and its chunks.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub shard: ShardSpec,
    pub dataset_id: [u8; 16],
    /// The settings every shard of the pack must share, and the digest of the names listed.
    pub key: String,
    pub classes: Vec<Vec<u8>>,
    /// Chunks in id order (ids `k × count + index`).
    pub chunks: Vec<PartChunk>,
}

impl Part {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.shard.index.to_le_bytes());
        b.extend_from_slice(&self.shard.count.to_le_bytes());
        b.extend_from_slice(&self.dataset_id);
        put_blob(&mut b, self.key.as_bytes());
        put_blob(&mut b, &encode_string_table(self.classes.iter()));
        b.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
        for c in &self.chunks {
            b.extend_from_slice(&c.chunk_id.to_le_bytes());
            b.extend_from_slice(&c.file_size.to_le_bytes());
            b.extend_from_slice(&c.file_crc.to_le_bytes());
            b.extend_from_slice(&c.digest);
            b.extend_from_slice(&c.samples.to_le_bytes());
        }
        SHARD_PART.frame(&b)
    }

    /// Decodes a part file; an error says what is wrong (damaged, truncated, another version).
    pub fn decode(b: &[u8]) -> Result<Part, String> {
        SHARD_PART.unframe(b).map_err(|e| e.to_string())?;
        Self::decode_body(b).ok_or_else(|| "part file: its body is inconsistent".to_string())
    }

    fn decode_body(b: &[u8]) -> Option<Part> {
        let mut r = Body(LocalReader::new(b, &SHARD_PART, b.len() as u64).ok()?);
        let shard = ShardSpec {
            index: r.u32()?,
            count: r.u32()?,
        };
        let dataset_id = r.array()?;
        let key = String::from_utf8(r.blob()?).ok()?;
        let classes = r.strings("part classes")?;
        let nc = r.u64()?;
        // Every chunk takes 40 bytes here: a count the file cannot hold is a lie.
        if nc > r.0.left() / 40 {
            return None;
        }
        let mut chunks = Vec::with_capacity(nc as usize);
        for _ in 0..nc {
            chunks.push(PartChunk {
                chunk_id: r.u32()?,
                file_size: r.u64()?,
                file_crc: r.u32()?,
                digest: r.array()?,
                samples: r.u64()?,
            });
        }
        r.0.finish().ok()?;
        Some(Part {
            shard,
            dataset_id,
            key,
            classes,
            chunks,
        })
    }
}

/// What `merge` did.
#[derive(Clone, Debug, Serialize)]
pub struct MergeSummary {
    pub out: PathBuf,
    pub dataset_id: String,
    /// False if the dataset was merged already and nothing was left to do.
    pub merged: bool,
    pub parts: u32,
    pub files: u64,
    pub chunks: u64,
    /// Empty chunks written where a shard with fewer chunks left an id unused.
    pub filler_chunks: u64,
    pub snapshot_bytes: u64,
    pub elapsed_s: f64,
}

/// The error of a merge of `ds` that cannot be done, saying why.
macro_rules! refuse {
    ($ds:expr, $($arg:tt)*) => {
        usage!("cannot merge {}: {}", $ds.display(), format_args!($($arg)*))
    };
}

/// Merges the finished shards of a sharded pack in `ds` into one dataset: checks every part
/// (all `n` present and finished, undamaged, from one pack with the same settings, every chunk
/// file present with the recorded size, dataset id and chunk id, no duplicate paths), and only
/// then writes empty chunks for unused ids, the snapshot (atomically) and removes the part
/// directories. Nothing is changed if a check fails. Safe to rerun: a merged dataset is left as
/// it is, and a merge interrupted after its snapshot finishes.
pub fn merge(ds: &Path) -> Result<MergeSummary, PackError> {
    let t0 = Instant::now();
    // A second merge of the same parts waits, then finds them merged.
    let _lock = match ds.is_dir() {
        true => Some(crate::output::DirLock::dataset(ds, "merge")?),
        false => None,
    };
    let (specs, files) = list_parts(ds)?;
    if specs.is_empty() {
        return already_merged(ds, t0);
    }
    // Check: every part, every chunk, and the snapshot they make (written under a temporary
    // name); nothing visible changes until all of it passed.
    let n = shard_count(ds, &specs)?;
    let parts = read_parts(ds, &specs)?;
    check_part_chunks(ds, &parts, &files, n)?;
    build_and_publish(ds, &specs, parts, &files, t0)
}

/// The shard part directories in `ds`, and the chunk files there with their sizes.
fn list_parts(ds: &Path) -> Result<(Vec<ShardSpec>, BTreeMap<u32, u64>), PackError> {
    let mut specs = Vec::new();
    let mut files: BTreeMap<u32, u64> = Default::default();
    let rd = std::fs::read_dir(ds).at("listing", ds)?;
    for e in rd {
        let e = e.at("listing", ds)?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if let Some(s) = ShardSpec::parse_dir_name(&name) {
            specs.push(s);
        } else if let Some(id) = parse_chunk_file_name(&name) {
            let md = e.metadata().at("inspecting", &e.path())?;
            files.insert(id, md.len());
        }
    }
    Ok((specs, files))
}

/// A dataset without parts: merged already (left as it is), or not a sharded pack at all.
fn already_merged(ds: &Path, t0: Instant) -> Result<MergeSummary, PackError> {
    if let Ok(b) = std::fs::read(ds.join(SNAPSHOT_FILE)) {
        let snap = granary_format::Snapshot::open(b)?;
        return Ok(MergeSummary {
            out: ds.to_path_buf(),
            dataset_id: hex_id(&snap.dataset_id()),
            merged: false,
            parts: 0,
            files: snap.sample_count(),
            chunks: snap.chunk_count(),
            filler_chunks: 0,
            snapshot_bytes: snap.bytes().len() as u64,
            elapsed_s: t0.elapsed().as_secs_f64(),
        });
    }
    Err(refuse!(
        ds,
        "it holds no shard parts (part-IIII-of-NNNN directories written by \
         `granary pack --shard I/N`)"
    ))
}

/// The shard count of the parts: one pack's, none missing.
fn shard_count(ds: &Path, specs: &[ShardSpec]) -> Result<u32, PackError> {
    let mut specs = specs.to_vec();
    specs.sort_unstable_by_key(|s| (s.count, s.index));
    let n = specs[0].count;
    if let Some(other) = specs.iter().find(|s| s.count != n) {
        return Err(refuse!(ds,
                "it holds parts of a {n}-way and of a {}-way sharded pack ({} and {}); remove the parts of the pack you do not want",
                other.count,
                specs[0].dir_name(),
                other.dir_name()
            ));
    }
    let missing: Vec<String> = (0..n)
        .filter(|i| !specs.iter().any(|s| s.index == *i))
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(refuse!(ds,
                "shard(s) {} of this {n}-way pack never started (no part directory); run them with `granary pack SRC -o {} --shard I/{n}`",
                missing.join(", "),
                ds.display()
            ));
    }
    Ok(n)
}

/// Every part's part file, read and checked: finished, undamaged, its own shard's, and from
/// one pack with the same settings and classes as the others.
fn read_parts(ds: &Path, specs: &[ShardSpec]) -> Result<Vec<Part>, PackError> {
    let n = specs.len();
    let mut parts: Vec<Part> = Vec::with_capacity(n);
    for s in specs {
        let p = ds.join(s.dir_name()).join(PART_FILE);
        let bytes = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(refuse!(ds,
                        "shard {s} has not finished ({} has no {PART_FILE}): it is still running or was interrupted; rerun it with --resume",
                        ds.join(s.dir_name()).display()
                    ))
            }
            Err(e) => return Err(PackError::io("reading", &p, e)),
        };
        let part = Part::decode(&bytes).map_err(|e| {
            refuse!(
                ds,
                "{} is unusable ({e}); rerun shard {s} with --force",
                p.display()
            )
        })?;
        if part.shard != *s {
            return Err(refuse!(
                ds,
                "{} belongs to shard {}, not to {s}",
                p.display(),
                part.shard
            ));
        }
        if let Some(first) = parts.first() {
            if part.dataset_id != first.dataset_id || part.key != first.key {
                return Err(refuse!(ds,
                        "shard {s} was packed from other input or with other settings than shard {} (every shard needs the same source listing, seed, chunk size, compression, labels and order; dataset ids {} and {}):\nshard {}:\n{}shard {s}:\n{}",
                        first.shard,
                        hex_id(&first.dataset_id),
                        hex_id(&part.dataset_id),
                        first.shard,
                        first.key,
                        part.key
                    ));
            }
            if part.classes != first.classes {
                return Err(refuse!(
                    ds,
                    "shard {s} has another class table than shard {}",
                    first.shard
                ));
            }
        }
        parts.push(part);
    }
    Ok(parts)
}

/// Every chunk a part lists must be there with the size written; ids must be the part's own
/// (each one's header and footer are checked as the snapshot is built).
fn check_part_chunks(
    ds: &Path,
    parts: &[Part],
    files: &BTreeMap<u32, u64>,
    n: u32,
) -> Result<(), PackError> {
    for part in parts {
        for (k, c) in part.chunks.iter().enumerate() {
            let want = (k as u64) * n as u64 + part.shard.index as u64;
            if c.chunk_id as u64 != want {
                return Err(refuse!(
                    ds,
                    "the part file of shard {} lists chunk {} where chunk {want} belongs",
                    part.shard,
                    c.chunk_id
                ));
            }
            let path = ds.join(chunk_file_name(c.chunk_id));
            let Some(&len) = files.get(&c.chunk_id) else {
                let (p, s) = (path.display(), part.shard);
                return Err(refuse!(
                    ds,
                    "{p} of shard {s} is missing; rerun the shard with --force"
                ));
            };
            if len != c.file_size {
                return Err(refuse!(
                    ds,
                    "{} is {len} bytes, but shard {} wrote {} bytes; rerun the shard with --force",
                    path.display(),
                    part.shard,
                    c.file_size
                ));
            }
        }
    }
    Ok(())
}

/// Builds the merged snapshot from every chunk's footer (CRC-checked, one chunk at a time) and
/// empty chunks for the ids no shard used, streams it to its temporary name (duplicate paths,
/// or chunks that do not match their parts, are found here, before anything visible changes),
/// then publishes: filler chunks, the snapshot, and the part directories go. Each step is
/// atomic and rerunning merge redoes what is left.
fn build_and_publish(
    ds: &Path,
    specs: &[ShardSpec],
    parts: Vec<Part>,
    files: &BTreeMap<u32, u64>,
    t0: Instant,
) -> Result<MergeSummary, PackError> {
    let snap_path = &ds.join(SNAPSHOT_FILE);
    let dataset_id = parts[0].dataset_id;
    let classes = parts[0].classes.clone();
    // The parts' chunks in id order; ids are distinct (checked above: shard I lists exactly
    // the ids k × n + I).
    let mut by_id: std::collections::BTreeMap<u32, (PartChunk, ShardSpec)> = parts
        .iter()
        .flat_map(|p| p.chunks.iter().map(|c| (c.chunk_id, (*c, p.shard))))
        .collect();
    drop(parts);
    let last = by_id.keys().next_back().copied();
    let count = last.map_or(0, |l| l as u64 + 1);
    let stray = |path: &Path| {
        let why = "is not listed by any part (left from an earlier pack?); remove it";
        refuse!(ds, "{} {why}", path.display())
    };
    if let Some((&id, _)) = files.range(count as u32..).next() {
        return Err(stray(&ds.join(chunk_file_name(id))));
    }
    // Ids no shard used, below the highest: empty chunks. A file already there is acceptable
    // only if it is exactly that empty chunk (written by an interrupted merge).
    let mut fillers = Vec::new();
    // Each chunk's entries and paths come from its footer (CRC-checked), one chunk at a time:
    // merge holds only the builder's paths, not every part's samples.
    let mut b = crate::spooled_builder(ds, dataset_id, classes.clone())?;
    let mut samples = 0u64;
    let not_a_dataset = |e| refuse!(ds, "the parts do not form a dataset: {e}");
    for id in 0..count as u32 {
        let path = ds.join(chunk_file_name(id));
        if let Some((c, shard)) = by_id.remove(&id) {
            let (head, .., footer) = crate::read_footer_bytes(ds, id, c.file_size)
                .map_err(|e| refuse!(ds, "{e}; rerun shard {shard} with --force"))?;
            let header = ChunkHeader::decode(&head)?; // decoded once already: intact
            if header.dataset_id != dataset_id {
                return Err(refuse!(
                    ds,
                    "{} belongs to another dataset ({}); rerun shard {shard} with --force",
                    path.display(),
                    hex_id(&header.dataset_id)
                ));
            }
            let full = ChunkSummary::from_footer(id, c.file_size, c.file_crc, c.digest, footer);
            if full.entries.len() as u64 != c.samples {
                return Err(refuse!(
                    ds,
                    "{} holds {} samples, but shard {shard} wrote {}; rerun the shard with --force",
                    path.display(),
                    full.entries.len(),
                    c.samples
                ));
            }
            b.push_chunk(&full).map_err(not_a_dataset)?;
            samples += c.samples;
            continue;
        }
        // An empty chunk fills the id.
        let w = ChunkWriter::new(Vec::new(), dataset_id, id).expect("writing to memory");
        let (bytes, s) = w.finish(&classes).expect("writing to memory");
        let on_disk = || {
            let src = granary_store::ChunkStore::open_chunk(&granary_store::LocalDir::new(ds), id);
            granary_store::file::read_whole(&*src.ok()?).ok()
        };
        if !files.contains_key(&id) {
            fillers.push((path, bytes));
        } else if on_disk().as_deref() != Some(&bytes[..]) {
            return Err(stray(&path));
        }
        b.push_chunk(&s).map_err(not_a_dataset)?;
    }
    // The snapshot is streamed to its temporary name first: that is where duplicate paths are
    // found, before anything visible changes.
    let (snapshot, snapshot_bytes) =
        crate::write_snapshot_pending(snap_path, b).map_err(|e| match e {
            PackError::Usage(m) => {
                refuse!(ds,
                "the parts do not form a dataset: {m} (were the shards given different inputs?)"
            )
            }
            e => e,
        })?;
    // A failure drops the snapshot, which removes its temporary file.
    for (path, bytes) in &fillers {
        write_file_atomic(path, bytes)?;
    }
    snapshot.publish().at("renaming into place", snap_path)?;
    for s in specs {
        let d = ds.join(s.dir_name());
        std::fs::remove_dir_all(&d).at("removing", &d)?;
    }
    crate::sync_dir(ds)?;
    Ok(MergeSummary {
        out: ds.to_path_buf(),
        dataset_id: hex_id(&dataset_id),
        merged: true,
        parts: specs.len() as u32,
        files: samples,
        chunks: count,
        filler_chunks: fillers.len() as u64,
        snapshot_bytes,
        elapsed_s: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_specs_and_env_fallbacks() {
        let none = |_: &str| None;
        assert_eq!(
            ShardSpec::parse_with("2/4", &none),
            Ok(ShardSpec { index: 2, count: 4 })
        );
        assert!(ShardSpec::parse_with("4/4", &none).is_err());
        assert!(ShardSpec::parse_with("1/0", &none).is_err());
        assert!(ShardSpec::parse_with("x/2", &none).is_err());
        assert!(ShardSpec::parse_with("3", &none).is_err());
        assert!(ShardSpec::parse_with("auto", &none)
            .unwrap_err()
            .contains("SLURM_ARRAY_TASK_ID"));
        let slurm = |k: &str| {
            match k {
                "SLURM_ARRAY_TASK_ID" => Some("5"),
                "SLURM_ARRAY_TASK_MIN" => Some("1"),
                "SLURM_ARRAY_TASK_STEP" => Some("2"),
                "SLURM_ARRAY_TASK_COUNT" => Some("3"),
                _ => None,
            }
            .map(String::from)
        };
        assert_eq!(
            ShardSpec::parse_with("auto", &slurm),
            Ok(ShardSpec { index: 2, count: 3 })
        );
        let k8s = |k: &str| (k == "JOB_COMPLETION_INDEX").then(|| "3".to_string());
        assert!(ShardSpec::parse_with("auto", &k8s)
            .unwrap_err()
            .contains("auto/N"));
        assert_eq!(
            ShardSpec::parse_with("auto/8", &k8s),
            Ok(ShardSpec { index: 3, count: 8 })
        );
        let s = ShardSpec {
            index: 7,
            count: 12,
        };
        assert_eq!(ShardSpec::parse_dir_name(&s.dir_name()), Some(s));
        assert_eq!(ShardSpec::parse_dir_name("part-0004-of-0004"), None);
        assert_eq!(ShardSpec::parse_dir_name("part-1-of-2"), None);
    }

    #[test]
    fn split_is_stable() {
        // The split decides where files go in packs made by different granary builds and
        // machines: it must never change.
        let got: Vec<u32> = (0..8)
            .map(|i| shard_of(format!("class/{i}.jpg").as_bytes(), 4))
            .collect();
        assert_eq!(got, vec![2, 3, 0, 0, 0, 0, 3, 0]);
    }

    proptest! {
        #[test]
        fn shards_cover_every_file_exactly_once(
            names in proptest::collection::btree_set("[a-c]{1,2}/[a-z0-9]{1,12}", 0..300),
            n in 1u32..17,
        ) {
            let mut seen = std::collections::BTreeMap::new();
            for i in 0..n {
                let s = ShardSpec { index: i, count: n };
                for name in &names {
                    if s.owns(name.as_bytes()) {
                        *seen.entry(name.clone()).or_insert(0) += 1;
                    }
                }
            }
            prop_assert_eq!(seen.len(), names.len());
            prop_assert!(seen.values().all(|&k| k == 1));
        }
    }

    #[test]
    fn split_is_balanced() {
        let n = 4;
        let mut count = [0u32; 4];
        for i in 0..100_000 {
            count[shard_of(format!("n{:05}/{i}.JPEG", i % 1000).as_bytes(), n) as usize] += 1;
        }
        for c in count {
            assert!((24_000..26_000).contains(&c), "{count:?}");
        }
    }

    #[test]
    fn part_round_trip_and_damage() {
        let c0 = PartChunk {
            chunk_id: 1,
            file_size: 1 << 40,
            file_crc: 0xdead_beef,
            digest: [9; 16],
            samples: 7,
        };
        let p = Part {
            shard: ShardSpec { index: 1, count: 3 },
            dataset_id: [1; 16],
            key: "seed=0\n".into(),
            classes: vec![b"a".to_vec()],
            chunks: vec![c0],
        };
        let b = p.encode();
        granary_format::testing::dump_fuzz_seed("part_file", "one-chunk", &b);
        assert_eq!(Part::decode(&b), Ok(p));
        for cut in 0..b.len() {
            assert!(Part::decode(&b[..cut]).is_err());
        }
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(Part::decode(&bad).is_err(), "flip at {i}");
        }
    }
}
