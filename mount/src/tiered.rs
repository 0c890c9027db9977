//! Whole samples for the mount: from the local tier when it holds the sample's chunk, else
//! from the dataset's own storage, CRC-checked either way; and Monarch's placement, the tier's
//! fetch-on-first-touch admission (`granary_store::tier::fetch`): a sample missing from the
//! tier has its whole chunk copied into the tier by a fetch thread, and the read waits for
//! that fetch when the chunk fits the tier's free space or is already on its way; otherwise
//! (a full tier that would evict for it) it reads its own record from the origin meanwhile.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use granary::{
    Access, Dataset, ImportanceScores, LayerReading, LocalTier, ReadError, SampleReader, Weighed,
};
use granary_store::tier::fetch::ChunkScore;
use granary_store::tier::{chunk_importance, Importance};
use serde::Serialize;

/// Chunks fetched at once (each holds one chunk in memory while it is read and admitted).
const FETCH_THREADS: usize = 3;
/// How often the node's score table is re-read (the training loop keeps reporting into it).
const SCORES_EVERY: Duration = Duration::from_secs(30);

/// Counters of a mount, as `user.granary.stats` shows them.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ReadStats {
    pub samples_from_tier: u64,
    pub samples_from_origin: u64,
    pub bytes_from_tier: u64,
    pub bytes_from_origin: u64,
    /// Chunks copied into the tier by the background fetcher, and their bytes.
    pub chunks_fetched: u64,
    pub bytes_fetched: u64,
    /// Chunks fetched that the tier then declined, and fetches skipped because it would have.
    pub chunks_declined: u64,
    pub fetches_skipped: u64,
    /// Fetches that failed (the samples still came from the origin).
    pub fetch_errors: u64,
    /// Reads answered with EIO: damaged records or unreadable storage.
    pub read_errors: u64,
    /// Tier copies (and hot chunks) this mount found damaged - when it opened them or as it
    /// read them -, removed, and read from the origin instead.
    pub tier_copies_discarded: u64,
}

/// Reads whole samples for the mount. `Sync`: the FUSE threads share one.
pub struct TieredReader {
    /// Reads through the store stack: the tier's copies (one open per copy), else origin.
    reader: Arc<SampleReader>,
    /// The local tier (whose stack layer fetches on first touch unless the mount only reads).
    cache: Option<Arc<LocalTier>>,
    read_errors: AtomicU64,
}

impl TieredReader {
    /// Reads `ds`, with `cache` as its local tier when given; `fetch` starts the background
    /// fetcher that copies first-touched chunks into the tier.
    pub fn new(
        ds: Arc<Dataset>,
        cache: Option<Arc<LocalTier>>,
        fetch: bool,
    ) -> Result<TieredReader, ReadError> {
        let stack = ds.stack(Access::positional(), cache.clone(), None)?;
        let reader = Arc::new(SampleReader::with_stack(ds.clone(), stack));
        if let (Some(c), true) = (&cache, fetch) {
            // Admission may have evicted copies held open here: let their space go.
            let r = Arc::downgrade(&reader);
            let admitted = Arc::new(move || {
                if let Some(r) = r.upgrade() {
                    r.forget(|_, _| true);
                }
            });
            let score = chunk_score(ds, c.clone());
            reader
                .stack()
                .fetch_on_touch(FETCH_THREADS, score, admitted);
        }
        Ok(TieredReader {
            reader,
            cache,
            read_errors: AtomicU64::new(0),
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<Dataset> {
        self.reader.dataset()
    }

    /// The counters so far.
    pub fn stats(&self) -> ReadStats {
        let stack = self.reader.stack();
        let (tier, origin) = (stack.layer("tier"), stack.layer("origin"));
        ReadStats {
            // The mount reads without peers.
            samples_from_tier: tier.served_samples,
            samples_from_origin: origin.served_samples,
            bytes_from_tier: tier.served_bytes,
            bytes_from_origin: origin.served_bytes,
            chunks_fetched: tier.chunks_fetched,
            bytes_fetched: tier.bytes_fetched,
            chunks_declined: tier.fetches_declined,
            fetches_skipped: tier.fetches_skipped,
            fetch_errors: tier.fetch_errors,
            read_errors: self.read_errors.load(Relaxed),
            tier_copies_discarded: self.cache.as_ref().map_or(0, |c| c.dropped()),
        }
    }

    /// Sample `id`'s original bytes, CRC-checked: from the tier's copy of its chunk if there
    /// is one (a damaged copy is removed and the origin read instead), else after fetching
    /// the chunk into the tier, else from the origin.
    pub fn read(&self, id: u64) -> Result<Vec<u8>, ReadError> {
        let read = || {
            let info = self.dataset().sample(id)?;
            let mut out = vec![0u8; info.entry.orig_len as usize];
            // The stack fetches the chunk into the tier on a miss (and this read may wait for
            // it), and verifies what a copy serves: a tier copy that fails is dropped (logged)
            // and the sample read below it.
            let src = self.reader.source(info.entry.chunk)?;
            let from = self.reader.read_from(&src, &info, &mut out)?;
            self.reader.stack().served(from, 1, info.entry.stored_len);
            Ok(out)
        };
        read().inspect_err(|_| {
            self.read_errors.fetch_add(1, Relaxed);
        })
    }

    /// Stops fetching into the tier (waiting for a fetch in progress to finish).
    pub fn shutdown(&self) {
        self.reader.stack().stop_fetching();
    }

    /// What passed through each layer of the reader's store stack so far, top first.
    pub fn layers(&self) -> Vec<LayerReading> {
        self.reader
            .stack()
            .layers()
            .into_iter()
            .map(|(layer, reading)| LayerReading { layer, reading })
            .collect()
    }

    /// Where the tier is, if there is one.
    pub fn tier_dir(&self) -> Option<PathBuf> {
        self.cache.as_ref().map(|c| c.dir().to_path_buf())
    }
}

impl Drop for TieredReader {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A chunk's importance for the tier: the sum of its samples' scores in the node's score
/// table (re-read every 30 s, if the training loop wrote one), else its sample count.
fn chunk_score(ds: Arc<Dataset>, cache: Arc<LocalTier>) -> ChunkScore {
    type Table = (Option<Arc<ImportanceScores>>, Option<Instant>);
    let table: Mutex<Table> = Mutex::new((None, None));
    Arc::new(move |ce| {
        let scores = {
            let mut s = table.lock().expect("scores");
            if s.1.is_none_or(|t| t.elapsed() >= SCORES_EVERY) {
                // No table (the training loop wrote none) or an unreadable one: sample counts.
                s.0 = ImportanceScores::load(&cache.scores_path())
                    .ok()
                    .map(Arc::new);
                s.1 = Some(Instant::now());
            }
            s.0.clone()
        };
        let weighed = scores
            .filter(|s| s.len() == ds.len())
            .map(|scores| Weighed {
                ds: ds.clone(),
                scores,
            });
        chunk_importance(ce, weighed.as_ref().map(|w| w as &dyn Importance))
    })
}
