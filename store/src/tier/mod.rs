//! The local tier: verified copies of chunks, and hot chunks, on the node's local storage in
//! front of shared storage, one sub-directory per dataset id. Safe to share between processes:
//! every change happens under an exclusive `flock` on `DIR/<dataset id>/lock`, files appear
//! only complete, the content list (`index`) and the hot-sample map (`hot.map`) are replaced
//! atomically, and the byte quota is never exceeded. An entry whose size, header or checksum
//! does not match is a miss and is removed, never served.
//!
//! Hot chunks (`hot-NNNNNNNN.gchunk`, chunk id = hot id) hold records of high importance copied
//! as stored from many chunks, so that a tier of fraction f of the dataset holds the most
//! important fraction f of the samples (whole chunks average importance away). `hot.map` says
//! where each of their samples is; hot ids only grow, so an old map never names reused bytes.

mod admit;
mod feed;
pub mod fetch;
mod files;
mod layer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

use crate::copy_name::{copy_file_name, parse_copy_file_name};
use granary_format::{hex16, ChunkEntry, ChunkHeader, Compression, SampleEntry, CHUNK_HEADER_LEN};
use serde::Serialize;

use crate::chunk_file::{ChunkFile, InMemory, Records};
use crate::error::{Result, StoreError};
use crate::file::IoFile;
use crate::mapcache::FileKey;
use crate::seam::{BytesFrom, ChunkSource, RangeRead};
use crate::write::{Durability, Seal};

pub(crate) use admit::{hot_cost, Admission, Job};
pub(crate) use feed::HotChunks;
pub use feed::{chunk_importance, Importance, TierFeed};
use files::*;
pub use files::{decode_hot_map, decode_tier_index, lock_exclusive, write_atomic};
pub use layer::TierStore;

granary_format::named_enum! {
    /// What the tier keeps when it is full.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum TierPolicy ("cache policy") {
        /// Evict the least recently used chunk.
        Lru = "lru",
        /// Fill until full, never evict.
        Static = "static",
        /// Keep the entries of highest importance per byte; a newcomer must beat the weakest
        /// resident by 10 % (hysteresis against churn). With a score table the tier holds hot
        /// chunks re-packed from the samples of highest score per byte.
        Importance = "importance",
    }
}

/// A tier entry: a copy of a chunk (its id and digest: two generations' chunk `id` with other
/// bytes are two entries), or a hot chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Chunk(u32, [u8; 16]),
    Hot(u32),
}

impl Key {
    fn file_name(self) -> String {
        match self {
            Key::Chunk(id, digest) => copy_file_name(id, &digest),
            Key::Hot(id) => hot_file_name(id),
        }
    }

    /// The key of chunk `ce`'s copy.
    fn copy(ce: &ChunkEntry) -> Key {
        Key::Chunk(ce.chunk_id, ce.digest)
    }

    /// The entry a file of the tier is, by its name.
    fn parse(name: &str) -> Option<Key> {
        match parse_copy_file_name(name) {
            Some((id, digest)) => Some(Key::Chunk(id, digest)),
            None => parse_hot_file_name(name).map(Key::Hot),
        }
    }
}

/// File name of hot chunk `id` in a tier directory.
pub fn hot_file_name(id: u32) -> String {
    format!("hot-{id:08}.gchunk")
}

fn parse_hot_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("hot-")?.strip_suffix(".gchunk")?;
    let id: u32 = digits.parse().ok()?;
    (hot_file_name(id) == name).then_some(id)
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Entry {
    size: u64,
    last_use: u64,
    /// Importance per byte.
    score: f64,
}

impl Entry {
    fn new(size: u64, last_use: u64, score: f64) -> Entry {
        Entry {
            size,
            last_use,
            score,
        }
    }
}

/// Occupancy of a tier.
#[derive(Clone, Debug, Serialize)]
pub struct TierStats {
    pub dir: PathBuf,
    /// Chunk copies and hot chunks.
    pub entries: u64,
    pub bytes: u64,
    pub quota: u64,
    pub hot_chunks: u64,
    pub hot_samples: u64,
}

/// One hot chunk: its file's size and CRC, the chunks (id, digest) its records come from, and
/// (sample id, record offset) of every record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotChunk {
    pub id: u32,
    pub file_size: u64,
    pub file_crc: u32,
    pub sources: Vec<(u32, [u8; 16])>,
    pub samples: Vec<(u64, u64)>,
}

impl HotChunk {
    /// Whether every chunk its records came from is in `chunks` with the same digest.
    pub fn current(&self, chunks: &[ChunkEntry]) -> bool {
        self.sources
            .iter()
            .all(|(id, d)| chunks.get(*id as usize).is_some_and(|ce| ce.digest == *d))
    }
}

/// Which samples the tier's hot chunks hold.
#[derive(Clone, Debug, Default)]
pub struct HotMap {
    pub chunks: BTreeMap<u32, HotChunk>,
    /// Sample id → (hot chunk id, record offset).
    pub by_sample: HashMap<u64, (u32, u64)>,
}

impl HotMap {
    /// Forgets hot chunk `id` (its copy turned out damaged or gone).
    pub fn forget(&mut self, id: u32) {
        if let Some(h) = self.chunks.remove(&id) {
            for (s, _) in h.samples {
                if self.by_sample.get(&s).is_some_and(|x| x.0 == id) {
                    self.by_sample.remove(&s);
                }
            }
        }
    }
}

/// A record offered for a hot chunk: the sample, its entry, the digest of its chunk, its path,
/// stored bytes and score.
#[derive(Clone, Debug)]
pub struct HotRecord {
    pub id: u64,
    pub entry: SampleEntry,
    pub source: [u8; 16],
    pub path: Vec<u8>,
    pub stored: Vec<u8>,
    pub score: f64,
}

/// A dataset's local tier.
#[derive(Debug)]
pub struct LocalTier {
    dir: PathBuf,
    dataset_id: [u8; 16],
    quota: u64,
    policy: TierPolicy,
    view: std::sync::Mutex<View>,
    /// Copies and hot chunks this handle dropped as damaged (or gone bad in another way).
    dropped: std::sync::atomic::AtomicU64,
    /// Chunks (id, digest) whose bytes this tier must not hold: they keep records of deleted
    /// samples ([`LocalTier::forbid`]).
    forbidden: std::sync::RwLock<HashSet<(u32, [u8; 16])>>,
}

/// A handle's copy of the content list, the identity of the `index` file it was read from
/// (changed by any process replacing it), and the uses not yet written to it.
#[derive(Debug, Default)]
struct View {
    token: Option<FileKey>,
    index: BTreeMap<Key, Entry>,
    touches: Vec<Key>,
}

/// Uses noted before they are written to the content list.
const TOUCH_BATCH: usize = 64;
/// Most uses kept while the lock stays busy (older ones are dropped: the order is advisory).
const MAX_TOUCHES: usize = 4096;

struct Locked {
    _lock: File,
    index: BTreeMap<Key, Entry>,
    clock: u64,
    next_hot: u32,
}

impl Locked {
    /// Advances the use clock and marks `key` (if resident) as just used; returns the clock.
    fn touch(&mut self, key: Key) -> u64 {
        self.clock += 1;
        let clock = self.clock;
        if let Some(e) = self.index.get_mut(&key) {
            e.last_use = clock;
        }
        clock
    }

    /// Lists `key` (`size` bytes, importance `per_byte`) as just used.
    fn insert(&mut self, key: Key, size: u64, per_byte: f64) {
        let last_use = self.touch(key);
        self.index.insert(key, Entry::new(size, last_use, per_byte));
    }

    fn used(&self) -> u64 {
        self.index.values().map(|e| e.size).sum()
    }
}

impl LocalTier {
    /// The tiers (one per dataset id) found under `root`.
    pub fn list(root: &Path) -> Result<Vec<[u8; 16]>> {
        let rd = std::fs::read_dir(root).map_err(|e| StoreError::io("listing", root, e))?;
        let mut out: Vec<[u8; 16]> = rd
            .flatten()
            .filter_map(|e| {
                parse_hex_id(e.file_name().as_encoded_bytes()).filter(|_| e.path().is_dir())
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Opens (creating it if needed) the tier of dataset `dataset_id` under `root`.
    pub fn open(root: &Path, dataset_id: [u8; 16], quota: u64, policy: TierPolicy) -> Result<Self> {
        let dir = Self::tier_dir(root, &dataset_id);
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io("creating", &dir, e))?;
        Ok(LocalTier {
            dir,
            dataset_id,
            quota,
            policy,
            view: Default::default(),
            dropped: Default::default(),
            forbidden: Default::default(),
        })
    }

    /// The directory of dataset `dataset_id`'s tier under `root`, without opening it.
    pub fn tier_dir(root: &Path, dataset_id: &[u8; 16]) -> PathBuf {
        root.join(hex16(dataset_id))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the node's shared importance score table of this dataset lives
    /// (`granary::SharedScores`).
    pub fn scores_path(&self) -> PathBuf {
        self.dir.join("scores")
    }

    fn lock(&self) -> Result<Locked> {
        let f = lock_exclusive(&self.dir.join("lock"))?;
        Ok(self.locked(f, true))
    }

    /// The tier under lock `f`: the content list (checked against the files when `rescan`, or
    /// when it is missing or damaged) with this handle's pending uses applied.
    fn locked(&self, f: File, rescan: bool) -> Locked {
        let (index, clock, next_hot) = match (rescan, self.parse_index()) {
            (false, Some(parsed)) => parsed,
            _ => self.read_index(),
        };
        let mut l = Locked {
            _lock: f,
            index,
            clock,
            next_hot,
        };
        for k in std::mem::take(&mut self.view().touches) {
            l.touch(k);
        }
        l
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        // A panic elsewhere while holding it leaves a view that is at worst stale, and a
        // stale view is revalidated by the token.
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The identity of file `name` of the tier, `None` without one.
    fn file_key(&self, name: &str) -> Option<FileKey> {
        Some(FileKey::of(&std::fs::metadata(self.dir.join(name)).ok()?))
    }

    /// The content list as this handle last saw it, revalidated by one `stat` of `index`
    /// (re-read only when another process replaced it); a missing or damaged list is rebuilt.
    fn current(&self) -> Result<std::sync::MutexGuard<'_, View>> {
        {
            let mut v = self.view();
            let token = self.file_key("index");
            if token.is_some() && token == v.token {
                return Ok(v);
            }
            if let (Some(t), Some((index, _, _))) = (token, self.parse_index()) {
                // Read after the stat: if replaced in between, the next look sees a new token.
                v.index = index;
                v.token = Some(t);
                return Ok(v);
            }
        }
        let l = self.lock()?;
        self.write_index(&l, true)?;
        drop(l);
        Ok(self.view())
    }

    /// Notes a use of `key`; every [`TOUCH_BATCH`] uses are written when the lock is free.
    fn note_use(&self, key: Key) {
        let full = {
            let mut v = self.view();
            v.touches.push(key);
            if v.touches.len() > MAX_TOUCHES {
                let extra = v.touches.len() - MAX_TOUCHES;
                v.touches.drain(..extra);
            }
            v.touches.len() >= TOUCH_BATCH
        };
        if full {
            let _ = self.flush_uses(false);
        }
    }

    /// Writes the noted uses to the content list (without fsync); with `wait` false only if
    /// the lock is free.
    fn flush_uses(&self, wait: bool) -> Result<()> {
        if self.view().touches.is_empty() {
            return Ok(());
        }
        let Some(f) = lock_file(&self.dir.join("lock"), wait)? else {
            return Ok(());
        };
        let l = self.locked(f, false);
        self.write_index(&l, false)
    }

    /// The content list if it is present and intact: entries, use clock, next hot id.
    fn parse_index(&self) -> Option<(BTreeMap<Key, Entry>, u64, u32)> {
        parse_index(&crate::file::read_regular(&self.dir.join("index")).ok()?)
    }

    /// Reads the content list; a missing or damaged list is rebuilt from the files present
    /// (their order of use is then unknown). Hot chunks must also be in `hot.map`.
    fn read_index(&self) -> (BTreeMap<Key, Entry>, u64, u32) {
        let (mut index, clock, mut next_hot) = self.parse_index().unwrap_or_default();
        let hot = self.read_hot_chunks();
        // Files are the truth: entries whose file is gone go, files not listed are adopted.
        let mapped = |k: &Key, size| match k {
            Key::Hot(id) => hot.get(id).is_some_and(|h| h.file_size == size),
            Key::Chunk(..) => true,
        };
        index.retain(|k, e| {
            mapped(k, e.size)
                && std::fs::symlink_metadata(self.dir.join(k.file_name()))
                    .is_ok_and(|m| m.is_file() && m.len() == e.size)
        });
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for f in rd.flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if let Some(lock) = temp_lock(&name) {
                    // Left over from a process that died writing it when its writer's lock is
                    // free (the tier's own files are written only under the lock we hold).
                    let free = |p: &Path| !p.exists() || matches!(lock_file(p, false), Ok(Some(_)));
                    if lock == "lock" || free(&self.dir.join(lock)) {
                        let _ = remove_entry(&f.path());
                    }
                    continue;
                }
                let Some(key) = Key::parse(&name) else {
                    // Named like a copy but not as the tier names one (by its id alone, as
                    // tiers of earlier versions did: no digest says which bytes it holds):
                    // never served; its space is freed.
                    if name.starts_with("chunk-") && name.ends_with(".gchunk") {
                        let _ = remove_entry(&f.path());
                    }
                    continue;
                };
                if let Key::Hot(id) = key {
                    next_hot = next_hot.max(id.saturating_add(1));
                }
                if !f.file_type().is_ok_and(|t| t.is_file()) {
                    // A FIFO, directory or link under an entry's name: never ours, never read.
                    index.remove(&key);
                    let _ = remove_entry(&f.path());
                    continue;
                }
                if let (false, Ok(m)) = (index.contains_key(&key), f.metadata()) {
                    if mapped(&key, m.len()) {
                        index.insert(key, Entry::new(m.len(), 0, 0.0));
                    } else {
                        // A hot chunk nobody maps: left over from an interrupted admission.
                        let _ = std::fs::remove_file(f.path());
                    }
                }
            }
        }
        (index, clock, next_hot)
    }

    fn read_hot_chunks(&self) -> BTreeMap<u32, HotChunk> {
        crate::file::read_regular(&self.dir.join("hot.map"))
            .ok()
            .and_then(|b| decode_hot_map(&b))
            .unwrap_or_default()
    }

    /// Replaces the content list (fsynced when `durable`) and makes it this handle's view.
    fn write_index(&self, l: &Locked, durable: bool) -> Result<()> {
        let text = encode_index(&l.index, l.next_hot);
        write_atomic_with(&self.dir.join("index"), &text, durable)?;
        let token = self.file_key("index");
        let mut v = self.view();
        v.index = l.index.clone();
        v.token = token;
        Ok(())
    }

    /// Rewrites `hot.map` to list exactly the hot chunks in the index.
    fn write_hot_map(&self, l: &Locked, mut hot: BTreeMap<u32, HotChunk>) -> Result<()> {
        hot.retain(|id, _| l.index.contains_key(&Key::Hot(*id)));
        write_atomic(&self.dir.join("hot.map"), &encode_hot_map(&hot))
    }

    /// Path of chunk `ce`'s copy if the tier holds one of its digest, its size and header
    /// matching; a mismatching copy is removed. A hit takes no lock and writes nothing.
    pub fn lookup(&self, ce: &ChunkEntry) -> Result<Option<PathBuf>> {
        let opener = crate::local::Opener::positional();
        Ok(self
            .open_copy(ce, |p| opener.open_unmapped(p, Some(ce.chunk_id)))?
            .map(|f| f.path))
    }

    /// As [`LocalTier::lookup`], returning the copy as `open` opened it, its size and header
    /// checked: the one open of a tier hit.
    pub fn open_copy(
        &self,
        ce: &ChunkEntry,
        open: impl FnOnce(&Path) -> Result<IoFile>,
    ) -> Result<Option<IoFile>> {
        let key = Key::copy(ce);
        if self.is_forbidden(ce.chunk_id, &ce.digest) || !self.current()?.index.contains_key(&key) {
            return Ok(None);
        }
        let p = self.dir.join(key.file_name());
        // Gone, not a regular file, unreadable or damaged: dropped from the list and removed.
        let f = match open(&p) {
            Ok(f) => f,
            Err(e) => {
                // Gone is what another process's eviction does between our look at the list
                // and the open: a miss like any other. Anything else is worth a line.
                let gone = matches!(&e, crate::StoreError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound);
                if !gone {
                    log::warn!(
                        "tier copy {}: cannot open it ({e}); dropped from the tier",
                        p.display()
                    );
                }
                let _ = self.discard(key, !gone);
                return Ok(None);
            }
        };
        let mut head = [0u8; CHUNK_HEADER_LEN];
        let ok = f.len == ce.file_size
            && f.read_ranges(&mut [RangeRead {
                offset: 0,
                buf: &mut head,
                need: CHUNK_HEADER_LEN,
            }])
            .is_ok()
            && ChunkHeader::decode(&head)
                .is_ok_and(|h| h.dataset_id == self.dataset_id && h.chunk_id == ce.chunk_id);
        if !ok {
            log::warn!(
                "tier copy {}: not chunk {} of this dataset at {} bytes (cut short, replaced or \
                 damaged); dropped from the tier",
                p.display(),
                ce.chunk_id,
                ce.file_size
            );
            self.discard(key, true)?;
            return Ok(None);
        }
        self.note_use(key);
        Ok(Some(f.serving(BytesFrom::Tier)))
    }

    /// Removes the entries `keys`; rewrites `hot.map` when a hot chunk was among them.
    fn evict(&self, l: &mut Locked, keys: Vec<Key>) -> Result<()> {
        let hot = keys.iter().any(|k| matches!(k, Key::Hot(_)));
        for k in keys {
            remove_entry(&self.dir.join(k.file_name()))?;
            l.index.remove(&k);
        }
        if hot {
            self.write_hot_map(l, self.read_hot_chunks())?;
        }
        Ok(())
    }

    /// Removes entry `key`; when `damaged` (it failed its checks when opened, or its bytes when
    /// read) counted in [`LocalTier::dropped`].
    fn discard(&self, key: Key, damaged: bool) -> Result<()> {
        self.dropped.fetch_add(damaged.into(), Relaxed);
        let mut l = self.lock()?;
        self.evict(&mut l, vec![key])?;
        self.write_index(&l, true)
    }

    /// Copies and hot chunks this handle dropped as damaged so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// The hot-sample map as last written, of the hot chunks whose records all come from
    /// chunks of `current` (a dataset's chunk table), digests equal.
    pub fn hot_map(&self, current: &[ChunkEntry]) -> HotMap {
        let mut chunks = self.read_hot_chunks();
        chunks.retain(|_, h| {
            h.current(current) && !h.sources.iter().any(|(c, d)| self.is_forbidden(*c, d))
        });
        let by_sample = chunks
            .values()
            .flat_map(|h| h.samples.iter().map(|&(s, off)| (s, (h.id, off))))
            .collect();
        HotMap { chunks, by_sample }
    }

    /// Re-scores every hot chunk with its samples' current importance, so that eviction
    /// compares today's values.
    pub fn rescore_hot(&self, score: impl Fn(u64) -> f64) -> Result<()> {
        let mut l = self.lock()?;
        let hot = self.read_hot_chunks();
        let mut changed = false;
        for h in hot.values() {
            if let Some(e) = l.index.get_mut(&Key::Hot(h.id)) {
                let s: f64 = h.samples.iter().map(|&(id, _)| score(id)).sum();
                e.score = s / h.file_size.max(1) as f64;
                changed = true;
            }
        }
        if changed {
            self.write_index(&l, true)?;
        }
        Ok(())
    }

    /// Ids of the chunks of `chunks` (a chunk table) the tier holds copies of, digests equal.
    pub fn resident_chunks(&self, chunks: &[ChunkEntry]) -> Result<HashSet<u32>> {
        Ok(self
            .current()?
            .index
            .keys()
            .filter_map(|k| match k {
                Key::Chunk(id, d) => chunks
                    .get(*id as usize)
                    .is_some_and(|ce| ce.digest == *d)
                    .then_some(*id),
                Key::Hot(_) => None,
            })
            .collect())
    }

    /// Path of hot chunk `h` if its file is present with the mapped size.
    pub fn hot_path(&self, h: &HotChunk) -> Option<PathBuf> {
        let p = self.dir.join(hot_file_name(h.id));
        std::fs::metadata(&p)
            .is_ok_and(|m| m.is_file() && m.len() == h.file_size)
            .then_some(p)
    }

    /// The entries to evict so that a newcomer of `size` bytes and importance `per_byte`
    /// fits, as the policy says; `None` when the newcomer does not get in.
    fn victims(&self, index: &BTreeMap<Key, Entry>, size: u64, per_byte: f64) -> Option<Vec<Key>> {
        if size > self.quota {
            return None;
        }
        let mut free = self
            .quota
            .saturating_sub(index.values().map(|e| e.size).sum());
        if free >= size {
            return Some(Vec::new());
        }
        let mut order: Vec<(Key, Entry)> = index.iter().map(|(k, e)| (*k, *e)).collect();
        match self.policy {
            TierPolicy::Static => return None,
            TierPolicy::Lru => order.sort_by_key(|(_, e)| e.last_use),
            TierPolicy::Importance => order.sort_by(|a, b| a.1.score.total_cmp(&b.1.score)),
        }
        let mut victims = Vec::new();
        for (k, e) in order {
            if free >= size {
                break;
            }
            if self.policy == TierPolicy::Importance && e.score * 1.1 >= per_byte {
                return None;
            }
            victims.push(k);
            free += e.size;
        }
        (free >= size).then_some(victims)
    }

    /// Marks the chunks `ids` of the chunk table `chunks` as holding records of deleted samples:
    /// from now on this handle neither keeps nor serves a copy of them nor a hot chunk made
    /// from them, and [`LocalTier::retain_current`] removes what the tier holds of them.
    pub fn forbid(&self, chunks: &[ChunkEntry], ids: &[u32]) {
        let mut f = self.forbidden.write().unwrap_or_else(|p| p.into_inner());
        f.extend(
            ids.iter()
                .filter_map(|&id| chunks.get(id as usize))
                .map(|ce| (ce.chunk_id, ce.digest)),
        );
    }

    fn is_forbidden(&self, id: u32, digest: &[u8; 16]) -> bool {
        let f = self.forbidden.read().unwrap_or_else(|p| p.into_inner());
        !f.is_empty() && f.contains(&(id, *digest))
    }

    /// Brings the tier in line with the dataset whose chunk table is `chunks`, as a reader of
    /// it starts: copies of chunks the table does not list with their digest, and hot chunks
    /// made from such chunks, are removed (kept, they would hold the quota for ever); then,
    /// while the tier holds more than its quota, entries are evicted least recently used
    /// first. A reader of another generation meets misses, never wrong bytes. Returns the
    /// bytes freed.
    pub fn retain_current(&self, chunks: &[ChunkEntry]) -> Result<u64> {
        let mut l = self.lock()?;
        let hot = self.read_hot_chunks();
        let stale = |k: &Key| match k {
            Key::Chunk(id, d) => {
                chunks.get(*id as usize).is_none_or(|ce| ce.digest != *d)
                    || self.is_forbidden(*id, d)
            }
            Key::Hot(id) => hot.get(id).is_some_and(|h| {
                !h.current(chunks) || h.sources.iter().any(|(c, d)| self.is_forbidden(*c, d))
            }),
        };
        let before = l.used();
        let live = l.index.iter().filter(|(k, _)| !stale(k));
        let mut used: u64 = live.map(|(_, e)| e.size).sum();
        // The stale entries first, then the least recently used while over the quota.
        let mut order: Vec<(Key, Entry)> = l.index.iter().map(|(k, e)| (*k, *e)).collect();
        order.sort_by_key(|(k, e)| (!stale(k), e.last_use));
        let mut victims = Vec::new();
        for (k, e) in order {
            if !stale(&k) {
                if used <= self.quota {
                    break;
                }
                used -= e.size;
            }
            victims.push(k);
        }
        if victims.is_empty() {
            return Ok(0);
        }
        self.evict(&mut l, victims)?;
        self.write_index(&l, true)?;
        Ok(before - l.used())
    }

    /// Bytes the tier holds now (its content list, revalidated by one `stat`).
    pub fn used(&self) -> Result<u64> {
        Ok(self.current()?.index.values().map(|e| e.size).sum())
    }

    /// Offers chunk `ce`'s bytes to the tier with importance `score`; returns whether it was
    /// admitted (evicting per policy, or declined). Bytes that are not the chunk the snapshot
    /// lists ([`LocalTier::check_copy`]) are an error naming the chunk, never a copy.
    pub fn admit(&self, ce: &ChunkEntry, bytes: &[u8], score: f64) -> Result<bool> {
        Self::check_copy(ce, bytes, &self.dir.join(Key::copy(ce).file_name()))?;
        self.admit_checked(ce, bytes, score)
    }

    /// Whether `bytes` are chunk `ce` as the snapshot lists it: its size and digest (SHA-256
    /// over every byte); an error naming the chunk and `location` otherwise.
    pub(crate) fn check_copy(ce: &ChunkEntry, bytes: &[u8], location: &Path) -> Result<()> {
        if bytes.len() as u64 == ce.file_size && granary_format::chunk_digest(bytes) == ce.digest {
            return Ok(());
        }
        Err(StoreError::damaged(
            location,
            format!(
                "chunk {}: {} bytes that are not the chunk the snapshot lists ({} bytes, digest \
                 {}): not kept (`granary verify` checks the dataset)",
                ce.chunk_id,
                bytes.len(),
                ce.file_size,
                hex16(&ce.digest)
            ),
        ))
    }

    /// [`LocalTier::admit`] of bytes [`LocalTier::check_copy`] passed.
    pub(crate) fn admit_checked(&self, ce: &ChunkEntry, bytes: &[u8], score: f64) -> Result<bool> {
        if self.is_forbidden(ce.chunk_id, &ce.digest) {
            return Ok(false);
        }
        let mut l = self.lock()?;
        let key = Key::copy(ce);
        if l.index.contains_key(&key) {
            l.touch(key);
            self.write_index(&l, true)?;
            return Ok(true);
        }
        let per_byte = score / ce.file_size.max(1) as f64;
        let Some(victims) = self.victims(&l.index, ce.file_size, per_byte) else {
            return Ok(false);
        };
        self.evict(&mut l, victims)?;
        // Not fsynced: a copy is checked against the snapshot's whole-file CRC before it is
        // served, so one cut short by a power loss is a miss, never wrong bytes.
        write_atomic_with(&self.dir.join(key.file_name()), bytes, false)?;
        l.insert(key, ce.file_size, per_byte);
        self.write_index(&l, true)?;
        Ok(true)
    }

    /// Re-packs `records` into a new hot chunk, skipping samples already in one; returns the
    /// number of samples admitted (0 when the policy declined or nothing was new).
    pub fn admit_hot<C: AsRef<[u8]>>(&self, records: &[HotRecord], classes: &[C]) -> Result<u64> {
        let mut l = self.lock()?;
        let mut hot = self.read_hot_chunks();
        let mut seen: HashSet<u64> = hot
            .values()
            .flat_map(|h| h.samples.iter().map(|s| s.0))
            .collect();
        let fresh: Vec<&HotRecord> = (records.iter())
            .filter(|r| !self.is_forbidden(r.entry.chunk, &r.source) && seen.insert(r.id))
            .collect();
        if fresh.is_empty() {
            return Ok(0);
        }
        let id = l.next_hot;
        let key = Key::Hot(id);
        let path = self.dir.join(key.file_name());
        let building = |e| StoreError::io("building", &path, e);
        // Built in memory: the tier makes room for it before it is written. Not fsynced: every
        // record read from a hot chunk is CRC-checked.
        let out = InMemory::new(&path, Durability::Rename);
        let mut f =
            ChunkFile::create(out, self.dataset_id, id, Records::Plain).map_err(building)?;
        let mut samples = Vec::with_capacity(fresh.len());
        let mut sources = std::collections::BTreeSet::new();
        for r in &fresh {
            let en = &r.entry;
            sources.insert((en.chunk, r.source));
            let comp = Compression::from_code(en.flags).unwrap_or(Compression::None);
            let e = f
                .records()
                .append(&r.path, &r.stored, comp, en.orig_len, en.crc32, en.label)
                .map_err(building)?;
            samples.push((r.id, e.offset));
        }
        let (file, summary) = f.finish(classes, &BTreeMap::new()).map_err(building)?;
        let score: f64 = fresh.iter().map(|r| r.score).sum();
        let per_byte = score / summary.file_size.max(1) as f64;
        let Some(victims) = self.victims(&l.index, summary.file_size, per_byte) else {
            self.write_index(&l, true)?;
            return Ok(0);
        };
        self.evict(&mut l, victims)?;
        // The file first, then the map that names it, then the index: a crash in between
        // leaves an unmapped file, removed on the next change.
        file.seal().and_then(|f| f.publish()).map_err(building)?;
        hot.insert(
            id,
            HotChunk {
                id,
                file_size: summary.file_size,
                file_crc: summary.file_crc,
                sources: sources.into_iter().collect(),
                samples,
            },
        );
        l.next_hot = id + 1;
        l.insert(key, summary.file_size, per_byte);
        self.write_hot_map(&l, hot)?;
        self.write_index(&l, true)?;
        Ok(fresh.len() as u64)
    }

    pub fn stats(&self) -> Result<TierStats> {
        let l = self.lock()?;
        let hot = self.read_hot_chunks();
        Ok(TierStats {
            dir: self.dir.clone(),
            entries: l.index.len() as u64,
            bytes: l.used(),
            quota: self.quota,
            hot_chunks: l.index.keys().filter(|k| matches!(k, Key::Hot(_))).count() as u64,
            hot_samples: hot
                .values()
                .filter(|h| l.index.contains_key(&Key::Hot(h.id)))
                .map(|h| h.samples.len() as u64)
                .sum(),
        })
    }

    /// Removes every entry.
    pub fn clear(&self) -> Result<()> {
        let mut l = self.lock()?;
        let all = l.index.keys().copied().collect();
        self.evict(&mut l, all)?;
        self.write_hot_map(&l, BTreeMap::new())?;
        self.write_index(&l, true)
    }
}

impl Drop for LocalTier {
    /// Writes the uses noted since the last batch (errors only cost the order of use).
    fn drop(&mut self) {
        let _ = self.flush_uses(true);
    }
}

#[cfg(test)]
mod tests;
