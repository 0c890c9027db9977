//! One stream's windows: what to read for each and what its bytes must be
//! (`Windows::prepare`), the chunk headers checked once read (`Windows::complete`), and what
//! was read counted by where it came from and offered to the tier (`Windows::count`). Chunks
//! open through the stream's [`StoreStack`], whose engine returns verified bytes: a copy that
//! fails what a read expects is read again below it ([`granary_store::verified`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use granary_format::{ChunkEntry, SampleEntry, CHUNK_HEADER_LEN};

use crate::dataset::Dataset;
use crate::error::Result;
use crate::io::{BufPool, Completed, Request};
use crate::plan::ShuffleMode;
use granary_store::engine::{Expect, Relocate};
use granary_store::tier::TierFeed;
use granary_store::StoreStack;
use granary_store::{BytesFrom, DatasetId, Source};

/// A window whose reads are queued: what decoding needs once they complete.
pub(crate) struct Prepared {
    pub(crate) ids: Vec<u64>,
    /// Per sample: (request index, offset of the record in that request's bytes).
    pub(crate) locs: Vec<(u32, u64)>,
    pub(crate) entries: Vec<SampleEntry>,
    pub(crate) weights: Vec<f32>,
    /// The window's requests (shared with the engine that reads them).
    pub(crate) reqs: Arc<[Request]>,
    /// What the requests read (its `reqs` moved to the above).
    plan: Plan,
}

/// What a stream's I/O thread keeps from window to window.
pub(crate) struct Windows {
    pub(crate) ds: Arc<Dataset>,
    /// The dataset's id, which every chunk header read must carry.
    id: DatasetId,
    pub(crate) stack: StoreStack,
    pub(crate) mode: ShuffleMode,
    range_gap: u64,
    /// Read chunks whole (with a tier: they can be admitted, and copies are checked against
    /// the whole-file CRC), not up to their last record in the window.
    pub(crate) whole_files: bool,
    /// Chunks open (a chunk's source serves every window that reads it).
    files: HashMap<u32, Source>,
    /// Chunks whose header has been checked (or is checked with the window being read).
    checked: HashSet<u32>,
    /// What the window's reads feed the tier with (admission, hot chunks).
    pub(crate) feed: Option<TierFeed>,
}

/// The read among `placed` (start, request; sorted by start) whose bytes hold record `e`.
fn covering(placed: &[(u64, usize)], reqs: &[Request], e: &SampleEntry) -> Option<usize> {
    let i = placed.partition_point(|&(start, _)| start <= e.offset);
    let (start, r) = *placed.get(i.checked_sub(1)?)?;
    (e.offset + e.stored_len <= start + reqs[r].len as u64).then_some(r)
}

/// A view's window reads a chunk in ranges around its records when they are less than this
/// share of the chunk's record bytes, and the chunk whole otherwise: the crossover
/// `bench/views.sh` measured (`bench/reports/views/report.md`).
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

/// The chunks a window reads, in order of first use, with their chunk table entries.
type WindowChunks = Vec<(u32, ChunkEntry)>;

/// Requests for a window's samples, and what each reads.
#[derive(Default)]
struct Plan {
    reqs: Vec<Request>,
    /// Per request, the chunk whose bytes it reads.
    req_chunk: Vec<u32>,
    /// Chunk headers to check, and the request whose bytes start with them.
    header_req: Vec<(u32, usize)>,
    /// With a tier: chunks read whole, and their request.
    whole: Vec<(u32, usize)>,
    /// Ranges of source chunks read around records served by hot chunks: (chunk, request,
    /// offset of the range in the chunk).
    ranges: Vec<(u32, usize, u64)>,
    /// Per chunk read in one piece or in ranges: (start, request) sorted by start.
    placed: HashMap<u32, Vec<(u64, usize)>>,
}

impl Plan {
    /// Queues `req`, a read of chunk `c`'s bytes (which start with the header to check, with
    /// `header`); its index.
    fn push(&mut self, c: u32, req: Request, header: bool) -> usize {
        if header {
            self.header_req.push((c, self.reqs.len()));
        }
        self.reqs.push(req);
        self.req_chunk.push(c);
        self.reqs.len() - 1
    }
}

impl Windows {
    /// The windows of a stream of `ds` that reads through `stack`; no tier feed until set.
    pub(crate) fn new(
        ds: Arc<Dataset>,
        stack: StoreStack,
        mode: ShuffleMode,
        range_gap: u64,
        whole_files: bool,
    ) -> Windows {
        Windows {
            id: DatasetId(ds.snapshot().dataset_id()),
            ds,
            stack,
            mode,
            range_gap,
            whole_files,
            files: HashMap::new(),
            checked: HashSet::new(),
            feed: None,
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

    /// Plans a window's reads: whole ranges from each chunk's start (chunkwise, sequential),
    /// or one read per record plus a header read per chunk not seen yet (global). With hot
    /// chunks, samples they hold are read from them, and a source chunk read from origin is
    /// read in ranges around them.
    pub(crate) fn prepare(&mut self, ids: &[u64], weights: &[f32]) -> Result<Prepared> {
        let (entries, chunks) = self.entries(ids)?;
        let mut in_hot = self.in_hot(ids);
        let mut plan = Plan::default();
        self.plan_chunks(&mut plan, &chunks, &entries, &in_hot)?;
        let locs = self.plan_records(&mut plan, &entries, &mut in_hot);
        // Headers are checked when this window's reads complete, before any of its samples (or
        // of a later window) is delivered.
        for (c, _) in &plan.header_req {
            self.checked.insert(*c);
        }
        Ok(Prepared {
            ids: ids.to_vec(),
            locs,
            entries,
            weights: weights.to_vec(),
            reqs: std::mem::take(&mut plan.reqs).into(),
            plan,
        })
    }

    /// The entries of samples `ids`, and their chunks in order of first use with the chunk
    /// table's entry (each sample's placement checked against it).
    fn entries(&self, ids: &[u64]) -> Result<(Vec<SampleEntry>, WindowChunks)> {
        let mut entries = Vec::with_capacity(ids.len());
        let mut chunks = WindowChunks::new();
        let mut seen: HashSet<u32> = HashSet::new();
        self.ds.prefetch_samples(ids)?;
        for &id in ids {
            let info = self.ds.sample(id)?;
            let ce = self.ds.check_placement(&info)?;
            if seen.insert(info.entry.chunk) {
                chunks.push((info.entry.chunk, ce));
            }
            entries.push(info.entry);
        }
        Ok((entries, chunks))
    }

    /// Per sample of `ids`: the hot chunk that holds it and where, if any (not for global
    /// plans, which read single records).
    fn in_hot(&mut self, ids: &[u64]) -> Vec<Option<(Source, u64)>> {
        match (self.feed.as_mut(), self.mode == ShuffleMode::Global) {
            (Some(f), false) => f.hot_samples(ids),
            _ => vec![None; ids.len()],
        }
    }

    /// The reads of each chunk of the window: ranges around what the hot chunks do not serve
    /// (hot chunks, sparse views), or one range from its start.
    fn plan_chunks(
        &mut self,
        plan: &mut Plan,
        chunks: &WindowChunks,
        entries: &[SampleEntry],
        in_hot: &[Option<(Source, u64)>],
    ) -> Result<()> {
        // Per chunk: bytes the window needs from the source if hot samples come from hot chunks.
        let mut needed: HashMap<u32, u64> = HashMap::new();
        for (e, h) in entries.iter().zip(in_hot) {
            if h.is_none() {
                *needed.entry(e.chunk).or_default() += e.stored_len;
            }
        }
        for &(c, ce) in chunks {
            let needed = needed.get(&c).copied().unwrap_or(0);
            // A chunk whose window samples all come from hot chunks is not read.
            if self.has_hot() && needed == 0 && !self.files.contains_key(&c) {
                continue;
            }
            let f = self.open(c)?;
            let header = (!self.checked.contains(&c)).then_some((self.id, c));
            let global = self.mode == ShuffleMode::Global;
            if global && header.is_none() {
                continue;
            }
            if !global
                && !f.whole_reads()
                && (self.has_hot()
                    || (self.ds.selection().is_some() && !self.whole_files && sparse(needed, &ce)))
            {
                self.plan_ranges(plan, c, f, entries, in_hot);
            } else {
                self.plan_from_start(plan, (c, ce), f, header, entries);
            }
        }
        Ok(())
    }

    /// One range of chunk `c` from its start: to its last record in the window, or with a tier
    /// the whole file (it can be admitted, and a copy is checked against the whole-file CRC),
    /// or for a global plan (which reads records one by one) its header alone; the header
    /// (`header`: not checked yet) is checked on the way.
    fn plan_from_start(
        &self,
        plan: &mut Plan,
        (c, ce): (u32, ChunkEntry),
        f: Source,
        header: Option<(DatasetId, u32)>,
        entries: &[SampleEntry],
    ) {
        let global = self.mode == ShuffleMode::Global;
        let whole = self.whole_files && !global;
        let end = match whole {
            true => ce.file_size,
            false => entries
                .iter()
                .filter(|e| e.chunk == c && !global)
                .map(|e| e.offset + e.stored_len)
                .max()
                .unwrap_or(0),
        };
        let req = Request {
            source: f,
            offset: 0,
            len: end.max(CHUNK_HEADER_LEN as u64) as usize,
            // A whole file's CRC-32 does not tell chunks apart by their headers (each ends
            // with its own CRC): a copy read whole is checked for both.
            expect: Expect {
                header: header.or(whole.then_some((self.id, c))),
                file_crc: whole.then_some(ce.file_crc),
                ..Expect::default()
            },
        };
        let r = plan.push(c, req, header.is_some());
        if whole {
            plan.whole.push((c, r));
        }
        plan.placed.insert(c, vec![(0, r)]);
    }

    /// Where each sample's record is read: inside a read planned for its chunk, or in a read
    /// of its own (from a hot chunk, or a global plan's single record). Returns each sample's
    /// (request, offset in it).
    fn plan_records(
        &self,
        plan: &mut Plan,
        entries: &[SampleEntry],
        in_hot: &mut [Option<(Source, u64)>],
    ) -> Vec<(u32, u64)> {
        let mut locs: Vec<(u32, u64)> = vec![(0, 0); entries.len()];
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
            // The record is checked where it comes from a copy; a hot chunk's that fails is
            // read from the record's own chunk.
            let mut expect = Expect {
                records: Arc::new([(0, *e)]),
                ..Expect::default()
            };
            let (source, offset) = match in_hot[i].take() {
                Some((file, offset)) => {
                    expect.relocate = Some(Relocate {
                        store: self.stack.store().clone(),
                        chunk: e.chunk,
                        offset: e.offset,
                    });
                    (file, offset)
                }
                // Global plans: one read per record.
                None => (self.files[&e.chunk].clone(), e.offset),
            };
            let req = Request {
                source,
                offset,
                len: e.stored_len as usize,
                expect,
            };
            plan.push(e.chunk, req, false);
        }
        locs
    }

    /// The records of chunk `c` that the hot chunks do not hold, in ranges that skip no less
    /// than `range_gap`: large records are read alone, runs of small ones together.
    fn plan_ranges(
        &self,
        plan: &mut Plan,
        c: u32,
        f: Source,
        entries: &[SampleEntry],
        in_hot: &[Option<(Source, u64)>],
    ) {
        let mine: Vec<&SampleEntry> = entries
            .iter()
            .zip(in_hot)
            .filter(|(e, h)| e.chunk == c && h.is_none())
            .map(|(e, _)| e)
            .collect();
        let want = mine.iter().map(|e| (e.offset, e.offset + e.stored_len));
        let with_header = !self.checked.contains(&c);
        for (start, end) in coalesce(want.collect(), self.range_gap, with_header) {
            // What the range holds, checked where it comes from a copy.
            let records = mine
                .iter()
                .filter(|e| e.offset >= start && e.offset + e.stored_len <= end)
                .map(|e| (e.offset - start, **e))
                .collect();
            let header = start == 0 && with_header;
            let req = Request {
                source: f.clone(),
                offset: start,
                len: (end - start) as usize,
                expect: Expect {
                    header: header.then_some((self.id, c)),
                    records,
                    ..Expect::default()
                },
            };
            let r = plan.push(c, req, header);
            plan.ranges.push((c, r, start));
            plan.placed.entry(c).or_default().push((start, r));
        }
    }

    /// Checks a completed window, whose bytes the store verified (a copy that failed was read
    /// again below it): every chunk header read must be this dataset's.
    pub(crate) fn complete(
        &mut self,
        prep: &Prepared,
        read: Result<Vec<Completed>>,
    ) -> Result<Vec<Completed>> {
        let bufs = read?;
        for &(c, i) in &prep.plan.header_req {
            let head = &bufs[i].data()[..CHUNK_HEADER_LEN];
            self.ds
                .check_chunk_header(head, c, prep.reqs[i].source.location())?;
        }
        Ok(bufs)
    }

    /// What reading the window of `ids` would ask of each layer, without reading it: each
    /// request's layer (that serves its source), its chunk and its length within the chunk.
    pub(crate) fn predict(&mut self, ids: &[u64]) -> Result<Vec<(&'static str, u32, u64)>> {
        let prep = self.prepare(ids, &[])?;
        let out = prep
            .reqs
            .iter()
            .zip(&prep.plan.req_chunk)
            .map(|(r, &c)| {
                let len = (r.len as u64).min(r.source.len().saturating_sub(r.offset));
                (self.stack.layer_serving(&r.source), c, len)
            })
            .collect();
        if self.mode != ShuffleMode::Global {
            self.files.clear();
        }
        Ok(out)
    }

    /// After a window of a chunk-wise or sequential plan: a chunk belongs to one window, so its
    /// map goes with the window's samples, not with the stream (global plans keep chunks open:
    /// records of any chunk come any time).
    pub(crate) fn release_maps(&mut self) {
        if self.mode != ShuffleMode::Global {
            self.files.retain(|_, f| !f.mapped());
        }
    }

    /// Counts a completed window by where its bytes came from; offers the chunks it read whole
    /// to the tier's admission, or with hot chunks harvests the records that belong in them.
    pub(crate) fn count(&mut self, prep: &Prepared, bufs: &[Arc<Completed>]) {
        // Every read in the layer whose bytes served it: (samples, bytes read) by layer.
        let mut samples = vec![0u64; bufs.len()];
        for &(r, _) in &prep.locs {
            samples[r as usize] += 1;
        }
        let mut served: Vec<(BytesFrom, u64, u64)> = Vec::with_capacity(3);
        for (b, n) in bufs.iter().zip(samples) {
            let (from, bytes) = (b.from(), b.data().len() as u64);
            match served.iter_mut().find(|s| s.0 == from) {
                Some(s) => (s.1, s.2) = (s.1 + n, s.2 + bytes),
                None => served.push((from, n, bytes)),
            }
        }
        for (from, samples, bytes) in served {
            self.stack.served(from, samples, bytes);
        }
        let Some(feed) = self.feed.as_mut() else {
            return;
        };
        for &(c, i) in &prep.plan.whole {
            feed.consumed_whole(c, &bufs[i]);
        }
        // Ranges of a chunk are consecutive in `prep.plan.ranges`, sorted by offset; they feed only
        // hot chunks.
        let hot = feed.has_hot();
        for group in prep.plan.ranges.chunk_by(|a, b| a.0 == b.0).filter(|_| hot) {
            let ranges: Vec<_> = group
                .iter()
                .map(|&(_, r, start)| (start, &bufs[r]))
                .collect();
            feed.consumed_ranges(group[0].0, &ranges);
        }
    }

    /// The end of the epoch: what the tier was fed is admitted.
    pub(crate) fn finish(self) {
        if let Some(f) = self.feed {
            f.finish();
        }
    }

    /// Whether hot chunks serve samples of the windows.
    fn has_hot(&self) -> bool {
        self.feed.as_ref().is_some_and(TierFeed::has_hot)
    }
}

/// The most bytes a batch can take from the pool: its buffers (aligned and rounded as the
/// pool does), or the mapped ranges it borrows.
pub(crate) fn buffer_bytes(reqs: &[Request]) -> usize {
    reqs.iter()
        .map(|r| match r.map() {
            Some(_) => r.len,
            None => BufPool::charge(r.len + r.direct() as usize * 2 * granary_store::buf::ALIGN),
        })
        .sum()
}
