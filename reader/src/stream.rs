//! Streaming an epoch plan: an I/O thread reads each window's chunks (whole-chunk ranges for
//! chunkwise and sequential plans, single records for global plans) with the engine, a decode
//! stage checks every record's CRC and decompresses in parallel (rayon), and the consumer
//! iterates samples in plan order. Raw samples are slices of the read buffer, never copied.
//! Memory is bounded by `prefetch + 3` windows: the one being consumed, one decoded and
//! waiting, one read and waiting for the decoder, and `prefetch` windows of reads in flight
//! (hand-overs are rendezvous channels).

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use granary_format::{decode_record, SampleEntry, CHUNK_HEADER_LEN};
use rayon::prelude::*;

use crate::error::{ReadError, Result};
use crate::io::{Completed, DirectProbe, Engine, IoFile, IoKind, Pending, Request};
use crate::plan::{EpochPlan, ShuffleMode};
use crate::{ChunkCache, Dataset};

/// Options of the I/O path.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    pub io: IoKind,
    /// Reads in flight.
    pub queue_depth: usize,
    /// Cap on bytes in flight.
    pub max_inflight_bytes: usize,
    /// Windows whose reads are in flight ahead of the ones being decoded and consumed.
    pub prefetch: usize,
    /// Use O_DIRECT where the file system supports it.
    pub direct: bool,
    /// The local chunk tier: chunks it holds are read from it (and their whole-file CRC is
    /// checked: a damaged copy is discarded and the chunk refetched from the source); chunks
    /// read from the source are offered to it in the background. Chunk-wise and sequential
    /// plans only (global plans read single records).
    pub cache: Option<Arc<ChunkCache>>,
    /// Importance scores (a snapshot) that rank chunks for the tier's importance policy.
    pub scores: Option<Arc<crate::ImportanceScores>>,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            io: IoKind::Auto,
            queue_depth: 8,
            max_inflight_bytes: 256 << 20,
            prefetch: 1,
            direct: true,
            cache: None,
            scores: None,
        }
    }
}

/// A delivered sample: id, label, and its checked original bytes.
pub struct Sample {
    pub id: u64,
    pub label: u32,
    data: SampleData,
}

enum SampleData {
    /// A slice of a shared read buffer (raw records).
    Shared(Arc<Completed>, usize, usize),
    /// Decompressed bytes.
    Owned(Vec<u8>),
}

impl Sample {
    /// The sample's original bytes (CRC-checked).
    pub fn data(&self) -> &[u8] {
        match &self.data {
            SampleData::Shared(buf, at, len) => &buf.data()[*at..*at + *len],
            SampleData::Owned(v) => v,
        }
    }

    /// True when `data()` borrows the read buffer (no copy was made).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.data, SampleData::Shared(..))
    }
}

/// Iterator over one shard's epoch: `Result<Sample>` in plan order. After an error the stream
/// ends (the error names chunk, offset and sample).
pub struct EpochStream {
    rx: Receiver<Result<Vec<Result<Sample>>>>,
    current: std::vec::IntoIter<Result<Sample>>,
    done: bool,
    backend: &'static str,
    bytes_read: Arc<std::sync::atomic::AtomicU64>,
    stats: Arc<CacheCounters>,
}

impl EpochStream {
    /// Starts streaming `plan` from `ds`.
    pub fn new(
        ds: Arc<Dataset>,
        plan: EpochPlan,
        mode: ShuffleMode,
        opts: &StreamOptions,
    ) -> Result<Self> {
        let mut engine = Engine::new(opts.io, opts.queue_depth, opts.max_inflight_bytes)?;
        let backend = engine.name();
        let (tx, rx) = sync_channel::<Result<Vec<Result<Sample>>>>(0);
        let direct = opts.direct;
        let prefetch = opts.prefetch;
        let bytes_read = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = bytes_read.clone();
        let stats = Arc::new(CacheCounters::default());
        let stats2 = stats.clone();
        let cache = opts.cache.clone().filter(|_| mode != ShuffleMode::Global);
        let admission = cache.clone().map(Admission::start);
        let scores = opts.scores.clone();
        std::thread::Builder::new()
            .name("granary-io".into())
            .spawn(move || {
                let mut files: HashMap<u32, Arc<IoFile>> = HashMap::new();
                let mut probe = DirectProbe::default();
                let mut checked: std::collections::HashSet<u32> = Default::default();
                // Read ahead while a window is decoded: decoding runs on the rayon pool from a
                // second thread, handed each window through a rendezvous channel.
                let (dtx, drx) = sync_channel::<(
                    Vec<u64>,
                    Vec<(u32, u64)>,
                    Vec<Completed>,
                    Vec<SampleEntry>,
                    Vec<u32>,
                )>(0);
                let ds2 = ds.clone();
                let tx2 = tx.clone();
                let decoder = std::thread::Builder::new()
                    .name("granary-decode".into())
                    .spawn(move || {
                        for (ids, locs, bufs, entries, labels) in drx {
                            let r = decode_window(&ds2, &ids, &locs, bufs, &entries, &labels);
                            let stop = r.iter().any(|x| x.is_err());
                            if tx2.send(Ok(r)).is_err() || stop {
                                return;
                            }
                        }
                    })
                    .expect("spawn decoder");
                // Batches in flight ahead of the one being completed: the engine overlaps them.
                let ahead = prefetch.max(1);
                let mut pending: std::collections::VecDeque<(Prepared, Pending)> =
                    Default::default();
                let mut failure = None;
                let mut windows = plan.windows.iter();
                loop {
                    if failure.is_none() && pending.len() <= ahead {
                        if let Some(w) = windows.next() {
                            let ids = &plan.samples[w.range.clone()];
                            match prepare_window(
                                &ds,
                                &mut probe,
                                &mut files,
                                &mut checked,
                                ids,
                                mode,
                                direct,
                                cache.as_deref(),
                            ) {
                                Ok((prep, reqs)) => {
                                    let t = engine.submit(reqs);
                                    pending.push_back((prep, t));
                                }
                                Err(e) => failure = Some(e),
                            }
                            continue;
                        }
                    }
                    let Some((prep, t)) = pending.pop_front() else {
                        break;
                    };
                    match engine.wait(t).and_then(|bufs| {
                        complete_window(
                            &ds,
                            &prep,
                            bufs,
                            cache.as_deref(),
                            &mut files,
                            direct,
                            &mut probe,
                        )
                    }) {
                        Ok((bufs, served_from_cache)) => {
                            let n: u64 = bufs.iter().map(|b| b.data().len() as u64).sum();
                            counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                            stats2.count(
                                &prep,
                                &bufs,
                                &served_from_cache,
                                admission.as_ref(),
                                scores.as_deref(),
                                &ds,
                            );
                            if dtx
                                .send((prep.ids, prep.locs, bufs, prep.entries, prep.labels))
                                .is_err()
                            {
                                failure = None;
                                break;
                            }
                        }
                        Err(e) => {
                            failure = Some(e);
                            pending.clear();
                            break;
                        }
                    }
                }
                // Complete what is still in flight before the buffers go (the engine's Drop
                // also waits), then report a failure after every sample before it.
                for (_, t) in pending {
                    let _ = engine.wait(t);
                }
                if let Some(e) = failure {
                    drop(dtx);
                    let _ = decoder.join();
                    let _ = tx.send(Err(e));
                    return;
                }
                drop(dtx);
                let _ = decoder.join();
                if let Some(a) = admission {
                    a.finish();
                }
            })
            .map_err(|e| ReadError::io("starting the I/O thread", "(thread)", e))?;
        Ok(EpochStream {
            rx,
            current: Vec::new().into_iter(),
            done: false,
            backend,
            bytes_read,
            stats,
        })
    }

    /// The I/O backend in use ("uring" or "pread").
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Bytes read from storage so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How much of the epoch so far came from the local tier.
    pub fn cache_stats(&self) -> CacheHits {
        let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        CacheHits {
            samples_from_cache: l(&self.stats.samples_cache),
            samples_from_source: l(&self.stats.samples_source),
            bytes_from_cache: l(&self.stats.bytes_cache),
            bytes_from_source: l(&self.stats.bytes_source),
        }
    }
}

impl Iterator for EpochStream {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        loop {
            if let Some(s) = self.current.next() {
                if s.is_err() {
                    // Samples after a damaged one are not delivered: the stream ends here.
                    self.done = true;
                    self.current = Vec::new().into_iter();
                }
                return Some(s);
            }
            if self.done {
                return None;
            }
            match self.rx.recv() {
                Ok(Ok(v)) => self.current = v.into_iter(),
                Ok(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Err(_) => {
                    self.done = true;
                    return None;
                }
            }
        }
    }
}

/// A window whose reads are queued: what decoding needs once they complete.
struct Prepared {
    ids: Vec<u64>,
    /// Per sample: (request index, offset of the record in that request's bytes).
    locs: Vec<(u32, u64)>,
    entries: Vec<SampleEntry>,
    labels: Vec<u32>,
    /// Chunk headers to check, and the request whose bytes start with them.
    header_req: Vec<(u32, usize)>,
    /// With a cache: chunks read whole, their request, and whether from the cache.
    whole: Vec<(u32, usize, bool)>,
}

/// Plans a window's reads: whole ranges from each chunk's start (chunkwise, sequential), or
/// one read per record plus a header read per chunk not seen yet (global).
#[allow(clippy::too_many_arguments)]
fn prepare_window(
    ds: &Dataset,
    probe: &mut DirectProbe,
    files: &mut HashMap<u32, Arc<IoFile>>,
    checked: &mut std::collections::HashSet<u32>,
    ids: &[u64],
    mode: ShuffleMode,
    direct: bool,
    cache: Option<&ChunkCache>,
) -> Result<(Prepared, Vec<Request>)> {
    let mut entries = Vec::with_capacity(ids.len());
    let mut labels = Vec::with_capacity(ids.len());
    // Per chunk: the byte range every sample of the window needs.
    let mut ranges: Vec<(u32, u64, u64)> = Vec::new();
    let mut index: HashMap<u32, usize> = HashMap::new();
    for &id in ids {
        let info = ds.sample(id)?;
        let ce = ds.check_placement(&info)?;
        let e = info.entry;
        let end = e.offset + e.stored_len;
        if let std::collections::hash_map::Entry::Vacant(slot) = files.entry(e.chunk) {
            // Another process may evict a cached copy between lookup and open: then the
            // source serves the chunk.
            let cached = cache.map(|c| c.lookup(&ce)).transpose()?.flatten();
            let f = match cached.map(|p| IoFile::open_probed(&p, direct, probe)) {
                Some(Ok(f)) => f,
                _ => IoFile::open_probed(&ds.chunk_path(e.chunk), direct, probe)?,
            };
            let path = f.path.clone();
            ds.check_chunk_size(&ce, &f.file, &path)?;
            slot.insert(Arc::new(f));
        }
        if mode != ShuffleMode::Global {
            // Whole ranges from the chunk start: the header is checked on the way.
            let i = *index.entry(e.chunk).or_insert_with(|| {
                ranges.push((e.chunk, 0, 0));
                ranges.len() - 1
            });
            // With a cache, whole files: they can be admitted, and cached copies are checked
            // against the whole-file CRC.
            ranges[i].2 = if cache.is_some() {
                ce.file_size
            } else {
                ranges[i].2.max(end)
            };
        }
        entries.push(e);
        labels.push(e.label);
    }
    let mut reqs: Vec<Request> = Vec::new();
    let mut locs: Vec<(u32, u64)> = Vec::with_capacity(ids.len());
    let mut header_req: Vec<(u32, usize)> = Vec::new();
    let mut whole: Vec<(u32, usize, bool)> = Vec::new();
    if mode == ShuffleMode::Global {
        for e in &entries {
            if !checked.contains(&e.chunk) && !header_req.iter().any(|(c, _)| *c == e.chunk) {
                header_req.push((e.chunk, reqs.len()));
                reqs.push(Request {
                    file: files[&e.chunk].clone(),
                    offset: 0,
                    len: CHUNK_HEADER_LEN,
                });
            }
        }
        for e in &entries {
            locs.push((reqs.len() as u32, 0));
            reqs.push(Request {
                file: files[&e.chunk].clone(),
                offset: e.offset,
                len: e.stored_len as usize,
            });
        }
    } else {
        for (c, start, end) in &ranges {
            if !checked.contains(c) {
                header_req.push((*c, reqs.len()));
            }
            if cache.is_some() {
                let from_cache = files[c].path != ds.chunk_path(*c);
                whole.push((*c, reqs.len(), from_cache));
            }
            reqs.push(Request {
                file: files[c].clone(),
                offset: *start,
                len: (*end).max(CHUNK_HEADER_LEN as u64) as usize,
            });
        }
        for e in &entries {
            locs.push((index[&e.chunk] as u32, e.offset));
        }
    }
    // Headers are checked when this window's reads complete, before any of its samples (or
    // of a later window) is delivered.
    for (c, _) in &header_req {
        checked.insert(*c);
    }
    let prep = Prepared {
        ids: ids.to_vec(),
        locs,
        entries,
        labels,
        header_req,
        whole,
    };
    Ok((prep, reqs))
}

/// Checks a completed window: chunk copies from the cache must match the snapshot's whole-file
/// CRC (a damaged copy is discarded and the chunk read again from the source, which later
/// windows then use too), and chunk headers must belong to this dataset.
#[allow(clippy::too_many_arguments)]
fn complete_window(
    ds: &Dataset,
    prep: &Prepared,
    mut bufs: Vec<Completed>,
    cache: Option<&ChunkCache>,
    files: &mut HashMap<u32, Arc<IoFile>>,
    direct: bool,
    probe: &mut DirectProbe,
) -> Result<(Vec<Completed>, Vec<bool>)> {
    let mut served_from_cache = Vec::with_capacity(prep.whole.len());
    for &(c, i, from_cache) in &prep.whole {
        let ce = ds.chunk(c)?;
        let intact = from_cache && crc32fast::hash(bufs[i].data()) == ce.file_crc;
        served_from_cache.push(intact);
        if from_cache && !intact {
            if let Some(cache) = cache {
                cache.discard(c)?;
            }
            let path = ds.chunk_path(c);
            let f = Arc::new(IoFile::open_probed(&path, direct, probe)?);
            ds.check_chunk_size(&ce, &f.file, &path)?;
            let mut e = Engine::new(IoKind::Pread, 4, 64 << 20)?;
            let fresh = e.read(&[Request {
                file: f.clone(),
                offset: 0,
                len: ce.file_size as usize,
            }])?;
            bufs[i] = fresh.into_iter().next().expect("one request, one buffer");
            files.insert(c, f);
        }
    }
    for &(c, i) in &prep.header_req {
        ds.check_chunk_header(&bufs[i].data()[..CHUNK_HEADER_LEN], c, &ds.chunk_path(c))?;
    }
    Ok((bufs, served_from_cache))
}

/// Hits and misses of the local tier during one stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheHits {
    pub samples_from_cache: u64,
    pub samples_from_source: u64,
    pub bytes_from_cache: u64,
    pub bytes_from_source: u64,
}

#[derive(Default)]
struct CacheCounters {
    samples_cache: std::sync::atomic::AtomicU64,
    samples_source: std::sync::atomic::AtomicU64,
    bytes_cache: std::sync::atomic::AtomicU64,
    bytes_source: std::sync::atomic::AtomicU64,
}

impl CacheCounters {
    /// Counts a completed window and offers its source-read chunks for admission.
    #[allow(clippy::too_many_arguments)]
    fn count(
        &self,
        prep: &Prepared,
        bufs: &[Completed],
        served_from_cache: &[bool],
        admission: Option<&Admission>,
        scores: Option<&crate::ImportanceScores>,
        ds: &Dataset,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        for (&(c, i, _), &cached) in prep.whole.iter().zip(served_from_cache) {
            let n = prep.entries.iter().filter(|e| e.chunk == c).count() as u64;
            let bytes = bufs[i].data().len() as u64;
            if cached {
                self.samples_cache.fetch_add(n, Relaxed);
                self.bytes_cache.fetch_add(bytes, Relaxed);
            } else {
                self.samples_source.fetch_add(n, Relaxed);
                self.bytes_source.fetch_add(bytes, Relaxed);
                if let (Some(a), Ok(ce)) = (admission, ds.chunk(c)) {
                    // A chunk's importance: the sum of its samples' scores (equal without a
                    // score table, so that importance admission then only adds hysteresis).
                    let score = match scores {
                        Some(t) => ce.samples().map(|id| t.score(id)).sum(),
                        None => ce.sample_count as f64,
                    };
                    a.offer(ce, bufs[i].data(), score);
                }
            }
        }
    }
}

/// A one-slot mailbox: the offered chunk (if any) and whether the stream has finished.
type Mailbox = (
    std::sync::Mutex<(Option<(granary_format::ChunkEntry, Vec<u8>, f64)>, bool)>,
    std::sync::Condvar,
);

/// Background admission into the tier: a one-slot mailbox, so an epoch never waits on it
/// (while a chunk is being written, only the most valuable newer offer waits; others are dropped).
struct Admission {
    slot: Arc<Mailbox>,
    thread: std::thread::JoinHandle<()>,
}

impl Admission {
    fn start(cache: Arc<ChunkCache>) -> Admission {
        let slot: Arc<Mailbox> = Arc::default();
        let s2 = slot.clone();
        let thread = std::thread::spawn(move || loop {
            let job = {
                let (m, cv) = &*s2;
                let mut g = m.lock().expect("admission lock");
                while g.0.is_none() && !g.1 {
                    g = cv.wait(g).expect("admission lock");
                }
                match g.0.take() {
                    Some(j) => j,
                    None => return,
                }
            };
            // Errors only cost a missed admission; the epoch goes on from the source.
            let _ = cache.admit(&job.0, &job.1, job.2);
        });
        Admission { slot, thread }
    }

    fn offer(&self, ce: granary_format::ChunkEntry, bytes: &[u8], score: f64) {
        let (m, cv) = &*self.slot;
        let mut g = m.lock().expect("admission lock");
        // An empty slot takes the offer; a waiting offer of lower importance per byte is
        // replaced, so busy admission drops the least valuable chunks first.
        let per_byte = score / ce.file_size.max(1) as f64;
        let better =
            g.0.as_ref()
                .is_none_or(|(w, _, ws)| ws / (w.file_size.max(1) as f64) < per_byte);
        if better {
            g.0 = Some((ce, bytes.to_vec(), score));
            cv.notify_one();
        }
    }

    fn finish(self) {
        {
            let (m, cv) = &*self.slot;
            m.lock().expect("admission lock").1 = true;
            cv.notify_one();
        }
        let _ = self.thread.join();
    }
}

fn decode_window(
    ds: &Dataset,
    ids: &[u64],
    locs: &[(u32, u64)],
    bufs: Vec<Completed>,
    entries: &[SampleEntry],
    labels: &[u32],
) -> Vec<Result<Sample>> {
    let bufs: Vec<Arc<Completed>> = bufs.into_iter().map(Arc::new).collect();
    (0..ids.len())
        .into_par_iter()
        .map(|i| {
            let (b, at) = locs[i];
            let e = &entries[i];
            let buf = &bufs[b as usize];
            let stored = buf
                .data()
                .get(at as usize..(at + e.stored_len) as usize)
                .ok_or_else(|| {
                    ReadError::Invalid(format!("sample {}: read buffer too short", ids[i]))
                })?;
            let data = match decode_record(e, stored) {
                Ok(std::borrow::Cow::Borrowed(_)) => {
                    SampleData::Shared(buf.clone(), at as usize, e.stored_len as usize)
                }
                Ok(std::borrow::Cow::Owned(v)) => SampleData::Owned(v),
                Err(err) => {
                    let info = ds.sample(ids[i])?;
                    return Err(ds.record_error(&info, err));
                }
            };
            Ok(Sample {
                id: ids[i],
                label: labels[i],
                data,
            })
        })
        .collect()
}
