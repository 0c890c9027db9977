//! The local chunk tier: verified copies of chunks on the node's local storage, in front of
//! shared storage. Safe to share between processes: every change happens under an exclusive
//! `flock` on `DIR/<dataset id>/lock`, files appear only complete (temporary name, fsync,
//! rename), the content list (`index`) is rewritten atomically and survives restarts, and the
//! byte quota is never exceeded. Entries are tied to the dataset id (one sub-directory per
//! dataset); an entry whose size or header does not match the snapshot is a miss and is
//! removed. (Integration into the epoch stream and hot-chunk re-packing are not built yet.)

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use granary_format::{chunk_file_name, ChunkEntry, ChunkHeader, CHUNK_HEADER_LEN};
use serde::Serialize;

use crate::error::{ReadError, Result};

/// What the tier keeps when it is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Evict the least recently used chunk.
    Lru,
    /// Fill until full, never evict.
    Static,
    /// Keep the chunks of highest importance per byte; a newcomer must beat the weakest
    /// resident by 10 % (hysteresis against churn).
    Importance,
}

impl CachePolicy {
    /// Parses `lru`, `static` or `importance`.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s {
            "lru" => Ok(CachePolicy::Lru),
            "static" => Ok(CachePolicy::Static),
            "importance" => Ok(CachePolicy::Importance),
            _ => Err(format!(
                "unknown cache policy {s:?}: use lru, static or importance"
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Entry {
    size: u64,
    last_use: u64,
    /// Importance per byte.
    score: f64,
}

/// Occupancy of a tier.
#[derive(Clone, Debug, Serialize)]
pub struct CacheStats {
    pub dir: PathBuf,
    pub entries: u64,
    pub bytes: u64,
    pub quota: u64,
}

/// A dataset's local chunk tier.
#[derive(Debug)]
pub struct ChunkCache {
    dir: PathBuf,
    dataset_id: [u8; 16],
    quota: u64,
    policy: CachePolicy,
}

struct Locked {
    _lock: File,
    index: BTreeMap<u32, Entry>,
    clock: u64,
}

impl Locked {
    /// Advances the use clock and marks `id` (if resident) as just used; returns the clock.
    fn touch(&mut self, id: u32) -> u64 {
        self.clock += 1;
        let clock = self.clock;
        if let Some(e) = self.index.get_mut(&id) {
            e.last_use = clock;
        }
        clock
    }
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

impl ChunkCache {
    /// The tiers (one per dataset id) found under `root`.
    pub fn list(root: &Path) -> Result<Vec<[u8; 16]>> {
        let mut out = Vec::new();
        let rd = std::fs::read_dir(root).map_err(|e| ReadError::io("listing", root, e))?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.len() == 32 && e.path().is_dir() {
                let mut id = [0u8; 16];
                let parsed =
                    (0..16).all(|i| match u8::from_str_radix(&name[2 * i..2 * i + 2], 16) {
                        Ok(b) => {
                            id[i] = b;
                            true
                        }
                        Err(_) => false,
                    });
                if parsed {
                    out.push(id);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Opens (creating it if needed) the tier of dataset `dataset_id` under `root`.
    pub fn open(
        root: &Path,
        dataset_id: [u8; 16],
        quota: u64,
        policy: CachePolicy,
    ) -> Result<Self> {
        let dir = root.join(hex(&dataset_id));
        std::fs::create_dir_all(&dir).map_err(|e| ReadError::io("creating", &dir, e))?;
        Ok(ChunkCache {
            dir,
            dataset_id,
            quota,
            policy,
        })
    }

    fn lock(&self) -> Result<Locked> {
        let p = self.dir.join("lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| ReadError::io("opening", &p, e))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| ReadError::io("locking", &p, e.into()))?;
        let (index, clock) = self.read_index();
        Ok(Locked {
            _lock: f,
            index,
            clock,
        })
    }

    /// Reads the content list; a missing or damaged list is rebuilt from the files present
    /// (their order of use is then unknown).
    fn read_index(&self) -> (BTreeMap<u32, Entry>, u64) {
        let mut index = BTreeMap::new();
        let mut clock = 0;
        let text = std::fs::read_to_string(self.dir.join("index")).unwrap_or_default();
        let (body, crc) = text.rsplit_once("crc ").unwrap_or(("", ""));
        if crc.trim().parse::<u32>().ok() == Some(crc32fast::hash(body.as_bytes())) {
            for line in body.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if let [id, size, last, score] = f[..] {
                    if let (Ok(id), Ok(size), Ok(last), Ok(score)) =
                        (id.parse(), size.parse(), last.parse::<u64>(), score.parse())
                    {
                        clock = clock.max(last);
                        index.insert(
                            id,
                            Entry {
                                size,
                                last_use: last,
                                score,
                            },
                        );
                    }
                }
            }
        }
        // Files are the truth: drop entries whose file is gone, adopt complete files not listed.
        index.retain(|id, e| {
            std::fs::metadata(self.dir.join(chunk_file_name(*id))).is_ok_and(|m| m.len() == e.size)
        });
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for f in rd.flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if let Some(id) = granary_format::parse_chunk_file_name(&name) {
                    if let (false, Ok(m)) = (index.contains_key(&id), f.metadata()) {
                        index.insert(
                            id,
                            Entry {
                                size: m.len(),
                                last_use: 0,
                                score: 0.0,
                            },
                        );
                    }
                }
            }
        }
        (index, clock)
    }

    fn write_index(&self, l: &Locked) -> Result<()> {
        let mut body = String::new();
        for (id, e) in &l.index {
            body += &format!("{id} {} {} {}\n", e.size, e.last_use, e.score);
        }
        let text = format!("{body}crc {}\n", crc32fast::hash(body.as_bytes()));
        write_atomic(&self.dir.join("index"), text.as_bytes())
    }

    /// Path of chunk `id`'s copy if the tier holds it and its size and header match the
    /// snapshot's chunk entry; a mismatching copy is removed (a miss, never served).
    pub fn lookup(&self, ce: &ChunkEntry) -> Result<Option<PathBuf>> {
        let p = self.dir.join(chunk_file_name(ce.chunk_id));
        let Ok(mut f) = File::open(&p) else {
            return Ok(None);
        };
        let mut head = [0u8; CHUNK_HEADER_LEN];
        let ok = f.metadata().is_ok_and(|m| m.len() == ce.file_size)
            && f.read_exact(&mut head).is_ok()
            && ChunkHeader::decode(&head)
                .is_ok_and(|h| h.dataset_id == self.dataset_id && h.chunk_id == ce.chunk_id);
        if !ok {
            self.discard(ce.chunk_id)?;
            return Ok(None);
        }
        let mut l = self.lock()?;
        l.touch(ce.chunk_id);
        self.write_index(&l)?;
        Ok(Some(p))
    }

    /// Removes chunk `id`'s copy (for example after a record in it failed its CRC).
    pub fn discard(&self, id: u32) -> Result<()> {
        let mut l = self.lock()?;
        let p = self.dir.join(chunk_file_name(id));
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ReadError::io("removing", &p, e)),
        }
        l.index.remove(&id);
        self.write_index(&l)
    }

    /// Offers chunk `ce`'s bytes (checked against the snapshot's size and whole-file CRC) to
    /// the tier with importance `score`; returns whether it was admitted. Never exceeds the
    /// quota: evicts per policy, or declines.
    pub fn admit(&self, ce: &ChunkEntry, bytes: &[u8], score: f64) -> Result<bool> {
        if bytes.len() as u64 != ce.file_size
            || crc32fast::hash(bytes) != ce.file_crc
            || ce.file_size > self.quota
        {
            return Ok(false);
        }
        let mut l = self.lock()?;
        let clock = l.touch(ce.chunk_id);
        if l.index.contains_key(&ce.chunk_id) {
            self.write_index(&l)?;
            return Ok(true);
        }
        let per_byte = score / ce.file_size.max(1) as f64;
        let used: u64 = l.index.values().map(|e| e.size).sum();
        let mut free = self.quota.saturating_sub(used);
        let mut victims = Vec::new();
        if free < ce.file_size {
            let mut order: Vec<(u32, Entry)> = l.index.iter().map(|(k, e)| (*k, *e)).collect();
            match self.policy {
                CachePolicy::Static => return Ok(false),
                CachePolicy::Lru => order.sort_by_key(|(_, e)| e.last_use),
                CachePolicy::Importance => order.sort_by(|a, b| a.1.score.total_cmp(&b.1.score)),
            }
            for (id, e) in order {
                if free >= ce.file_size {
                    break;
                }
                if self.policy == CachePolicy::Importance && e.score * 1.1 >= per_byte {
                    return Ok(false);
                }
                victims.push(id);
                free += e.size;
            }
            if free < ce.file_size {
                return Ok(false);
            }
        }
        for id in victims {
            let p = self.dir.join(chunk_file_name(id));
            std::fs::remove_file(&p).map_err(|e| ReadError::io("evicting", &p, e))?;
            l.index.remove(&id);
        }
        write_atomic(&self.dir.join(chunk_file_name(ce.chunk_id)), bytes)?;
        l.index.insert(
            ce.chunk_id,
            Entry {
                size: ce.file_size,
                last_use: clock,
                score: per_byte,
            },
        );
        self.write_index(&l)?;
        Ok(true)
    }

    /// Occupancy.
    pub fn stats(&self) -> Result<CacheStats> {
        let l = self.lock()?;
        Ok(CacheStats {
            dir: self.dir.clone(),
            entries: l.index.len() as u64,
            bytes: l.index.values().map(|e| e.size).sum(),
            quota: self.quota,
        })
    }

    /// Removes every entry.
    pub fn clear(&self) -> Result<()> {
        let mut l = self.lock()?;
        for id in l.index.keys().copied().collect::<Vec<_>>() {
            let p = self.dir.join(chunk_file_name(id));
            std::fs::remove_file(&p).map_err(|e| ReadError::io("removing", &p, e))?;
        }
        l.index.clear();
        self.write_index(&l)
    }
}

/// Writes `data` under a unique temporary name, fsyncs and renames it into place.
fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = File::create(&tmp).map_err(|e| ReadError::io("creating", &tmp, e))?;
    if let Err(e) = f.write_all(data).and_then(|_| f.sync_all()) {
        let _ = std::fs::remove_file(&tmp);
        return Err(ReadError::io("writing", &tmp, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| ReadError::io("renaming", &tmp, e))
}
