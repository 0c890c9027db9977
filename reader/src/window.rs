//! One stream's windows: what to read for each (`Windows::prepare`), checking what was read
//! (`Windows::complete`: tier and peer copies against the snapshot's whole-file CRC, hot
//! records against their own, chunk headers against the dataset), and counting where the
//! bytes came from (`Windows::count`, which also offers source reads to the tier). Every chunk
//! is opened through the stream's [`StoreStack`]; where its bytes came from is the source's
//! [`BytesFrom`], never inferred from a path. Bytes that fail a check give their source up for
//! the one the layer that served them names ([`granary_store::ChunkSource::fall_back`]): the
//! windows verify, the store decides where to read again.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use granary_format::{decode_record, ChunkEntry, SampleEntry, CHUNK_HEADER_LEN};

use crate::error::Result;
use crate::io::{BufPool, Completed, Engine, IoKind, Request};
use crate::plan::ShuffleMode;
use crate::tier::{HotState, TierCounters};
use crate::{Dataset, ImportanceScores};
use granary_store::tier::{Admission, Job};
use granary_store::StoreStack;
use granary_store::{BytesFrom, Source};

/// A window whose reads are queued: what decoding needs once they complete.
pub(crate) struct Prepared {
    pub(crate) ids: Vec<u64>,
    /// Per sample: (request index, offset of the record in that request's bytes).
    pub(crate) locs: Vec<(u32, u64)>,
    pub(crate) entries: Vec<SampleEntry>,
    pub(crate) labels: Vec<u32>,
    pub(crate) weights: Vec<f32>,
    /// Chunk headers to check, and the request whose bytes start with them.
    header_req: Vec<(u32, usize)>,
    /// With a tier: chunks read whole, their request, and whether from a copy (this node's
    /// tier or a peer's).
    whole: Vec<(u32, usize, bool)>,
    /// Records read from hot chunks: (hot chunk id, request, sample index in the window).
    hot: Vec<(u32, usize, usize)>,
    /// Ranges of source chunks read around records served by hot chunks: (chunk, request,
    /// offset of the range in the chunk).
    ranges: Vec<(u32, usize, u64)>,
    /// The window's requests (to read one again from another store when a tier copy fails),
    /// and per request the chunk whose bytes it reads.
    reqs: Vec<Request>,
    req_chunk: Vec<u32>,
}

/// Where the chunks a window read whole, and its records from hot chunks, came from in the end
/// (after any copy that failed was read again below it).
pub(crate) struct Served {
    whole: Vec<BytesFrom>,
    hot: Vec<BytesFrom>,
}

/// What a stream's I/O thread keeps from window to window.
pub(crate) struct Windows {
    pub(crate) ds: Arc<Dataset>,
    pub(crate) stack: StoreStack,
    mode: ShuffleMode,
    range_gap: u64,
    /// Chunk-wise and sequential windows read chunks whole (with a tier: whole chunks can be
    /// admitted, and copies are checked against the whole-file CRC), not up to their last
    /// record in the window.
    pub(crate) whole_files: bool,
    /// Chunks open (a chunk's source serves every window that reads it).
    files: HashMap<u32, Source>,
    /// Chunks whose header has been checked (or is checked with the window being read).
    checked: HashSet<u32>,
    /// Hot chunks (an importance tier with scores).
    pub(crate) hot: Option<HotState>,
    /// Admission into the tier.
    pub(crate) admission: Option<Admission>,
    /// Importance scores, which rank whole chunks for admission without hot chunks.
    pub(crate) scores: Option<Arc<ImportanceScores>>,
    stats: Arc<TierCounters>,
}

/// The read among `placed` (start, request; sorted by start) whose bytes hold record `e`.
fn covering(placed: &[(u64, usize)], reqs: &[Request], e: &SampleEntry) -> Option<usize> {
    let i = placed.partition_point(|&(start, _)| start <= e.offset);
    let (start, r) = *placed.get(i.checked_sub(1)?)?;
    (e.offset + e.stored_len <= start + reqs[r].len as u64).then_some(r)
}

/// A view's window reads a chunk in ranges around its records when they are less than this
/// share of the chunk's record bytes, and the chunk whole otherwise: the crossover
/// `bench/views.sh` measured cold on ImageNet-like records, between 50 and 75 % (ranges took
/// 0.76–0.81× the time of whole chunks at 50 %, 0.94–1.12× at 75 %, in two runs;
/// `bench/reports/views/report.md`).
pub(crate) const SPARSE_SHARE: f64 = 0.65;

/// Whether a view's window that needs `needed` bytes of chunk `ce` reads them in ranges
/// (`GRANARY_VIEW_READS=ranges` or `chunks` forces one way, for measurements).
pub(crate) fn sparse(needed: u64, ce: &ChunkEntry) -> bool {
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| match std::env::var("GRANARY_VIEW_READS").as_deref() {
        Ok("ranges") => Some(true),
        Ok("chunks") => Some(false),
        _ => None,
    });
    let span = ce
        .records_end
        .saturating_sub(CHUNK_HEADER_LEN as u64)
        .max(1);
    forced.unwrap_or((needed as f64) < SPARSE_SHARE * span as f64)
}

/// The reads of records at `want` (start, end) of a chunk: sorted, a gap shorter than `gap`
/// read rather than skipped, and with `with_header` the chunk's header read first (joined to
/// the first range when that starts within `gap` of it).
pub(crate) fn coalesce(mut want: Vec<(u64, u64)>, gap: u64, with_header: bool) -> Vec<(u64, u64)> {
    want.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, end) in want {
        match merged.last_mut() {
            Some(last) if start <= last.1 + gap => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    if with_header && !merged.is_empty() {
        if merged[0].0 <= gap + CHUNK_HEADER_LEN as u64 {
            merged[0].0 = 0;
        } else {
            merged.insert(0, (0, CHUNK_HEADER_LEN as u64));
        }
    }
    merged
}

/// Reads `reqs` with a small pread engine (refetches after a damaged copy).
fn read_now(reqs: &[Request]) -> Result<Vec<Completed>> {
    Ok(Engine::new(IoKind::Pread, 4, 64 << 20)?.read(reqs)?)
}

/// Requests for a window's samples, being assembled.
#[derive(Default)]
struct Plan {
    reqs: Vec<Request>,
    header_req: Vec<(u32, usize)>,
    whole: Vec<(u32, usize, bool)>,
    ranges: Vec<(u32, usize, u64)>,
    /// Per chunk read in one piece or in ranges: (start, request) sorted by start.
    placed: HashMap<u32, Vec<(u64, usize)>>,
}

impl Windows {
    /// The windows of a stream of `ds` that reads through `stack` and counts where its bytes
    /// came from in `stats` (no hot chunks, admission or scores until they are set).
    pub(crate) fn new(
        ds: Arc<Dataset>,
        stack: StoreStack,
        mode: ShuffleMode,
        range_gap: u64,
        stats: Arc<TierCounters>,
    ) -> Windows {
        Windows {
            ds,
            stack,
            mode,
            range_gap,
            whole_files: false,
            files: HashMap::new(),
            checked: HashSet::new(),
            hot: None,
            admission: None,
            scores: None,
            stats,
        }
    }

    /// Opens chunk `c` through the stack (once per stream while it stays open).
    fn open(&mut self, c: u32) -> Result<Source> {
        if let Some(f) = self.files.get(&c) {
            return Ok(f.clone());
        }
        let f = self.ds.open_chunk_in(&**self.stack.store(), c)?;
        self.files.insert(c, f.clone());
        Ok(f)
    }

    /// Chunk `c`'s bytes failed (`why`): its source is given up for the one the layer that
    /// served it names (the tier discards its copy, logged once with its path, and the chunk
    /// is opened below it; a peer's chunk is opened at origin), whose size is checked. Later
    /// windows read the new source too. A source with nothing below it (the dataset's own) is
    /// kept, and read again.
    fn reopen_below(&mut self, c: u32, why: &dyn std::fmt::Display) -> Result<Source> {
        let f = self.open(c)?;
        match self.ds.fall_back(&f, c, why)? {
            Some(below) => {
                self.files.insert(c, below.clone());
                Ok(below)
            }
            None => Ok(f),
        }
    }

    /// Request `r` read again from chunk `c`'s store below its failed copy.
    fn reread_below(
        &mut self,
        c: u32,
        r: &Request,
        why: &dyn std::fmt::Display,
    ) -> Result<Completed> {
        let source = self.reopen_below(c, why)?;
        let mut got = read_now(&[Request {
            source,
            offset: r.offset,
            len: r.len,
        }])?;
        Ok(got.pop().expect("one request, one buffer"))
    }

    /// Record `e`, whose hot chunk `h` failed (`why`): the hot chunk is dropped and the record
    /// read from its source chunk (whose header is checked on the way, and the record's CRC:
    /// a copy of the chunk that fails is given up for the store below it, until one passes).
    fn reread_hot(
        &mut self,
        h: u32,
        e: &SampleEntry,
        why: &dyn std::fmt::Display,
    ) -> Result<Completed> {
        if let Some(hs) = self.hot.as_mut() {
            log::warn!(
                "hot chunk {h} in the tier: {why}; dropped, its records are read from their chunks"
            );
            hs.discard(h)?;
        }
        let c = e.chunk;
        let mut f = self.open(c)?;
        loop {
            let read = || -> Result<Completed> {
                let mut fresh = read_now(&[
                    Request {
                        source: f.clone(),
                        offset: 0,
                        len: CHUNK_HEADER_LEN,
                    },
                    Request {
                        source: f.clone(),
                        offset: e.offset,
                        len: e.stored_len as usize,
                    },
                ])?;
                self.ds
                    .check_chunk_header(fresh[0].data(), c, f.location())?;
                let rec = fresh.pop().expect("two requests, two buffers");
                decode_record(e, rec.data())
                    .map_err(|err| crate::ReadError::format(f.location(), err))?;
                Ok(rec)
            };
            match read() {
                Ok(rec) => {
                    self.checked.insert(c);
                    return Ok(rec);
                }
                Err(err) => match self.ds.fall_back(&f, c, &err)? {
                    Some(below) => {
                        self.files.insert(c, below.clone());
                        f = below;
                    }
                    None => return Err(err),
                },
            }
        }
    }

    /// A window whose reads failed (`e`): when a tier copy may be the cause, each request is
    /// read again alone, and one that fails on a tier copy (cut short, removed, unreadable)
    /// is read from the store below the tier instead, the copy dropped. Returns the buffers
    /// and the requests read elsewhere. Any other failure is the window's error.
    fn salvage(
        &mut self,
        prep: &Prepared,
        e: crate::ReadError,
    ) -> Result<(Vec<Completed>, HashSet<usize>)> {
        if !prep.reqs.iter().any(|r| r.source.bytes_from().is_copy()) {
            return Err(e);
        }
        let mut bufs = Vec::with_capacity(prep.reqs.len());
        let mut elsewhere = HashSet::new();
        for (i, r) in prep.reqs.iter().enumerate() {
            let got = match read_now(std::slice::from_ref(r)) {
                Ok(mut b) => b.pop().expect("one request, one buffer"),
                Err(err) if r.source.bytes_from().is_copy() => {
                    elsewhere.insert(i);
                    match prep.hot.iter().find(|&&(_, hr, _)| hr == i) {
                        Some(&(h, _, s)) => self.reread_hot(h, &prep.entries[s], &err)?,
                        None => self.reread_below(prep.req_chunk[i], r, &err)?,
                    }
                }
                Err(err) => return Err(err),
            };
            bufs.push(got);
        }
        Ok((bufs, elsewhere))
    }

    /// Plans a window's reads: whole ranges from each chunk's start (chunkwise, sequential),
    /// or one read per record plus a header read per chunk not seen yet (global). With hot
    /// chunks, samples they hold are read from them, and a source chunk read from origin is
    /// read in ranges around them.
    pub(crate) fn prepare(
        &mut self,
        ids: &[u64],
        weights: &[f32],
    ) -> Result<(Prepared, Vec<Request>)> {
        let mut entries = Vec::with_capacity(ids.len());
        // Chunks in order of first use, with their entry.
        let mut chunks: Vec<(u32, ChunkEntry)> = Vec::new();
        let mut chunk_index: HashMap<u32, usize> = HashMap::new();
        self.ds.prefetch_samples(ids)?;
        for &id in ids {
            let info = self.ds.sample(id)?;
            let ce = self.ds.check_placement(&info)?;
            if let std::collections::hash_map::Entry::Vacant(v) =
                chunk_index.entry(info.entry.chunk)
            {
                v.insert(chunks.len());
                chunks.push((info.entry.chunk, ce));
            }
            entries.push(info.entry);
        }
        let labels: Vec<u32> = entries.iter().map(|e| e.label).collect();
        // Which samples the hot chunks can serve.
        let mut in_hot: Vec<Option<(u32, Source, u64)>> = vec![None; ids.len()];
        if let (Some(h), false) = (self.hot.as_mut(), self.mode == ShuffleMode::Global) {
            h.refresh();
            for (i, &id) in ids.iter().enumerate() {
                in_hot[i] = h.locate(id);
            }
        }
        // Per chunk: bytes the window needs from the source if hot samples come from hot
        // chunks.
        let mut needed = vec![0u64; chunks.len()];
        for (i, e) in entries.iter().enumerate() {
            if in_hot[i].is_none() {
                needed[chunk_index[&e.chunk]] += e.stored_len;
            }
        }
        let whole_files = self.whole_files;
        let mut plan = Plan::default();
        for (k, (c, ce)) in chunks.iter().enumerate() {
            // A chunk whose window samples all come from hot chunks is not read.
            if self.hot.is_some() && needed[k] == 0 && !self.files.contains_key(c) {
                continue;
            }
            let f = self.open(*c)?;
            let copy = f.bytes_from().is_copy();
            if self.mode == ShuffleMode::Global {
                if !self.checked.contains(c) {
                    plan.header_req.push((*c, plan.reqs.len()));
                    plan.reqs.push(Request {
                        source: f,
                        offset: 0,
                        len: CHUNK_HEADER_LEN,
                    });
                }
            } else if !copy
                && (self.hot.is_some()
                    || (self.ds.view().is_some() && !whole_files && sparse(needed[k], ce)))
            {
                self.plan_ranges(&mut plan, *c, f, &entries, &in_hot);
            } else {
                // Whole ranges from the chunk start: the header is checked on the way. With a
                // tier, whole files: they can be admitted, and copies are checked against the
                // whole-file CRC.
                let end = if whole_files {
                    ce.file_size
                } else {
                    entries
                        .iter()
                        .filter(|e| e.chunk == *c)
                        .map(|e| e.offset + e.stored_len)
                        .max()
                        .unwrap_or(0)
                };
                if !self.checked.contains(c) {
                    plan.header_req.push((*c, plan.reqs.len()));
                }
                if whole_files {
                    plan.whole.push((*c, plan.reqs.len(), copy));
                }
                plan.placed.insert(*c, vec![(0, plan.reqs.len())]);
                plan.reqs.push(Request {
                    source: f,
                    offset: 0,
                    len: end.max(CHUNK_HEADER_LEN as u64) as usize,
                });
            }
        }
        let mut locs: Vec<(u32, u64)> = vec![(0, 0); ids.len()];
        let mut hot_reads = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if let Some(r) = plan
                .placed
                .get(&e.chunk)
                .and_then(|l| covering(l, &plan.reqs, e))
            {
                locs[i] = (r as u32, e.offset - plan.reqs[r].offset);
                continue;
            }
            locs[i] = (plan.reqs.len() as u32, 0);
            let (source, offset) = match in_hot[i].take() {
                Some((h, file, offset)) => {
                    hot_reads.push((h, plan.reqs.len(), i));
                    (file, offset)
                }
                // Global plans: one read per record.
                None => (self.files[&e.chunk].clone(), e.offset),
            };
            plan.reqs.push(Request {
                source,
                offset,
                len: e.stored_len as usize,
            });
        }
        // Headers are checked when this window's reads complete, before any of its samples (or
        // of a later window) is delivered.
        for (c, _) in &plan.header_req {
            self.checked.insert(*c);
        }
        let mut req_chunk = vec![u32::MAX; plan.reqs.len()];
        for &(c, r) in &plan.header_req {
            req_chunk[r] = c;
        }
        for &(c, r, _) in &plan.whole {
            req_chunk[r] = c;
        }
        for &(c, r, _) in &plan.ranges {
            req_chunk[r] = c;
        }
        for (e, &(r, _)) in entries.iter().zip(&locs) {
            if req_chunk[r as usize] == u32::MAX {
                req_chunk[r as usize] = e.chunk;
            }
        }
        let prep = Prepared {
            ids: ids.to_vec(),
            locs,
            entries,
            labels,
            weights: weights.to_vec(),
            header_req: plan.header_req,
            whole: plan.whole,
            hot: hot_reads,
            ranges: plan.ranges,
            reqs: plan.reqs.clone(),
            req_chunk,
        };
        Ok((prep, plan.reqs))
    }

    /// The records of chunk `c` that the hot chunks do not hold, in ranges that skip no less
    /// than `range_gap`: large records are read alone, runs of small ones together.
    fn plan_ranges(
        &self,
        plan: &mut Plan,
        c: u32,
        f: Source,
        entries: &[SampleEntry],
        in_hot: &[Option<(u32, Source, u64)>],
    ) {
        let want: Vec<(u64, u64)> = entries
            .iter()
            .zip(in_hot)
            .filter(|(e, h)| e.chunk == c && h.is_none())
            .map(|(e, _)| (e.offset, e.offset + e.stored_len))
            .collect();
        let with_header = !self.checked.contains(&c);
        let merged = coalesce(want, self.range_gap, with_header);
        if with_header && !merged.is_empty() {
            plan.header_req.push((c, plan.reqs.len()));
        }
        let list = plan.placed.entry(c).or_default();
        for (start, end) in merged {
            plan.ranges.push((c, plan.reqs.len(), start));
            list.push((start, plan.reqs.len()));
            plan.reqs.push(Request {
                source: f.clone(),
                offset: start,
                len: (end - start) as usize,
            });
        }
    }

    /// Checks a completed window: chunk copies (this node's tier, a peer's) must match the
    /// snapshot's whole-file CRC and records from hot chunks their record CRC (a damaged copy
    /// is discarded and the data read again from origin, which later windows then use too),
    /// and chunk headers must belong to this dataset.
    ///
    /// A tier copy that fails in any way (a read error, a short read, a CRC mismatch, a wrong
    /// header) is dropped, logged once with its path, and its bytes read from the store below
    /// the tier: the window goes on with the right bytes.
    pub(crate) fn complete(
        &mut self,
        prep: &Prepared,
        read: Result<Vec<Completed>>,
    ) -> Result<(Vec<Completed>, Served)> {
        let (mut bufs, elsewhere) = match read {
            Ok(b) => (b, HashSet::new()),
            Err(e) => self.salvage(prep, e)?,
        };
        let mut served = Served {
            whole: Vec::with_capacity(prep.whole.len()),
            hot: Vec::with_capacity(prep.hot.len()),
        };
        for &(c, i, copy) in &prep.whole {
            let ce = self.ds.chunk(c)?;
            let moved = elsewhere.contains(&i);
            let damaged = copy && !moved && crc32fast::hash(bufs[i].data()) != ce.file_crc;
            if damaged {
                let why = "its bytes do not match the snapshot's CRC";
                bufs[i] = self.reread_below(c, &prep.reqs[i], &why)?;
            }
            // Where the bytes came from in the end: the source read, or the one read after it
            // failed (which later windows of the chunk read too).
            served.whole.push(if damaged || moved {
                self.files[&c].bytes_from()
            } else {
                prep.reqs[i].source.bytes_from()
            });
        }
        for &(h, i, s) in &prep.hot {
            let e = &prep.entries[s];
            let moved = elsewhere.contains(&i);
            let intact = !moved && decode_record(e, bufs[i].data()).is_ok();
            if !intact && !moved {
                bufs[i] = self.reread_hot(h, e, &"a record's CRC does not match")?;
            }
            served.hot.push(if intact {
                prep.reqs[i].source.bytes_from()
            } else {
                self.files[&e.chunk].bytes_from()
            });
        }
        if self.mode == ShuffleMode::Global {
            self.check_copy_records(prep, &mut bufs, &elsewhere)?;
        }
        for &(c, i) in &prep.header_req {
            let f = prep.reqs[i].source.clone();
            let ds = self.ds.clone();
            let check = |b: &Completed, at: &Path| {
                ds.check_chunk_header(&b.data()[..CHUNK_HEADER_LEN], c, at)
            };
            match check(&bufs[i], f.location()) {
                Err(e) if f.bytes_from().is_copy() && !elsewhere.contains(&i) => {
                    bufs[i] = self.reread_below(c, &prep.reqs[i], &e)?;
                    let at = self.files[&c].location().to_path_buf();
                    check(&bufs[i], &at)?;
                }
                r => r?,
            }
        }
        Ok((bufs, served))
    }

    /// Global plans read a tier copy record by record, with no whole-file CRC: each such
    /// record is checked here, and a copy with a damaged one is dropped and the window's
    /// reads of it made again below the tier (a damaged record must never end the epoch when
    /// a sound copy of it exists).
    fn check_copy_records(
        &mut self,
        prep: &Prepared,
        bufs: &mut [Completed],
        elsewhere: &HashSet<usize>,
    ) -> Result<()> {
        let mut bad: Vec<u32> = Vec::new();
        for (e, &(r, off)) in prep.entries.iter().zip(&prep.locs) {
            let r = r as usize;
            if !prep.reqs[r].source.bytes_from().is_copy()
                || elsewhere.contains(&r)
                || bad.contains(&e.chunk)
            {
                continue;
            }
            let rec = bufs[r]
                .data()
                .get(off as usize..(off + e.stored_len) as usize);
            if rec.is_none_or(|rec| decode_record(e, rec).is_err()) {
                bad.push(e.chunk);
            }
        }
        for c in bad {
            let why = "a record's CRC does not match";
            for (r, req) in prep.reqs.iter().enumerate() {
                if prep.req_chunk[r] == c && !elsewhere.contains(&r) {
                    bufs[r] = self.reread_below(c, req, &why)?;
                }
            }
        }
        Ok(())
    }

    /// After a window of a chunk-wise or sequential plan: a chunk belongs to one window, so its
    /// map goes with the window's samples, not with the stream (which would keep every chunk
    /// of the epoch mapped).
    /// What reading the window of `ids` would ask of each layer, without reading it: each
    /// request's layer (where its source's bytes come from), its chunk and its length within
    /// the chunk. For a bill before the run; files are let go after each
    /// window.
    pub(crate) fn predict(&mut self, ids: &[u64]) -> Result<Vec<(BytesFrom, u32, u64)>> {
        let (prep, reqs) = self.prepare(ids, &[])?;
        // Each request's chunk: what the window's bookkeeping says, else its records'.
        let mut chunk = prep.req_chunk.clone();
        for (&(r, _), e) in prep.locs.iter().zip(&prep.entries) {
            if chunk[r as usize] == u32::MAX {
                chunk[r as usize] = e.chunk;
            }
        }
        let out = reqs
            .iter()
            .zip(chunk)
            .map(|(r, c)| {
                let len = (r.len as u64).min(r.source.len().saturating_sub(r.offset));
                (r.source.bytes_from(), c, len)
            })
            .collect();
        if self.mode != ShuffleMode::Global {
            self.files.clear();
        }
        Ok(out)
    }

    pub(crate) fn release_maps(&mut self) {
        self.files
            .retain(|_, f| f.local().is_none_or(|l| l.map().is_none()));
    }

    /// Counts a completed window by where its bytes came from; offers its origin-read chunks
    /// for admission, or with hot chunks harvests the records that belong in them.
    pub(crate) fn count(&mut self, prep: &Prepared, bufs: &[Arc<Completed>], served: &Served) {
        let ds = &self.ds;
        let stats = &self.stats;
        let admission = self.admission.as_ref();
        for (&(c, i, _), &from) in prep.whole.iter().zip(&served.whole) {
            let n = prep.entries.iter().filter(|e| e.chunk == c).count() as u64;
            let bytes = bufs[i].data();
            stats.add(from, n, bytes.len() as u64);
            if from.is_copy() {
                continue;
            }
            let Ok(ce) = ds.chunk(c) else { continue };
            if let Some(h) = self.hot.as_mut() {
                for id in ce.samples() {
                    if let Ok(info) = ds.sample(id) {
                        let e = info.entry;
                        if let Some(rec) =
                            bytes.get(e.offset as usize..(e.offset + e.stored_len) as usize)
                        {
                            h.harvest(ds, id, rec, admission);
                        }
                    }
                }
            } else if let Some(a) = admission {
                // A chunk's importance: the sum of its samples' scores (equal without a
                // score table, so that importance admission then only adds hysteresis).
                let score = match &self.scores {
                    Some(t) => ce.samples().map(|id| t.score(id)).sum(),
                    None => ce.sample_count as f64,
                };
                a.offer(Job::Chunk(ce, bufs[i].clone(), score));
            }
        }
        for (&(_, i, _), &from) in prep.hot.iter().zip(&served.hot) {
            stats.add(from, 1, bufs[i].data().len() as u64);
        }
        for &(_, r, _) in &prep.ranges {
            let n = prep.locs.iter().filter(|l| l.0 as usize == r).count() as u64;
            let from = prep.reqs[r].source.bytes_from();
            stats.add(from, n, bufs[r].data().len() as u64);
        }
        // Every record inside a range read may belong in a hot chunk, drawn or not. Ranges
        // of a chunk are consecutive in `prep.ranges`, sorted by offset.
        if let Some(h) = self.hot.as_mut() {
            for group in prep.ranges.chunk_by(|a, b| a.0 == b.0) {
                let Ok(ce) = ds.chunk(group[0].0) else {
                    continue;
                };
                for id in ce.samples() {
                    let Ok(info) = ds.sample(id) else { continue };
                    let e = info.entry;
                    let k = group.partition_point(|&(_, _, start)| start <= e.offset);
                    let Some(&(_, r, start)) = k.checked_sub(1).and_then(|k| group.get(k)) else {
                        continue;
                    };
                    let at = (e.offset - start) as usize;
                    if let Some(rec) = bufs[r].data().get(at..at + e.stored_len as usize) {
                        h.harvest(ds, id, rec, admission);
                    }
                }
            }
        }
    }

    /// The end of the epoch: hot records still waiting go to the tier, and admission finishes.
    pub(crate) fn finish(mut self) {
        if let Some(h) = self.hot.as_mut() {
            h.flush(self.admission.as_ref());
        }
        if let Some(a) = self.admission {
            a.finish();
        }
    }
}

/// The most bytes a batch can take from the pool: its buffers (aligned and rounded as the
/// pool does), or the mapped ranges it borrows.
pub(crate) fn buffer_bytes(reqs: &[Request]) -> usize {
    reqs.iter()
        .map(|r| match (r.map(), r.direct()) {
            (Some(_), _) => r.len,
            (None, direct) => BufPool::charge(
                r.len
                    + if direct {
                        2 * granary_store::buf::ALIGN
                    } else {
                        0
                    },
            ),
        })
        .sum()
}
