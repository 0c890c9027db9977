//! The store stack one reader reads through: the local tier ([`TierStore`]) over the job's
//! other nodes ([`crate::PeerStore`]) over origin storage (tuned for how this reader reads),
//! any subset of them. Every layer is metered ([`crate::Metered`], [`StoreStack::layers`]).

use std::sync::Arc;

use granary_format::ChunkEntry;

use crate::counts::{Meter, MeterReading};
use crate::meter::Metered;
use crate::peers::{PeerStore, Peers};
use crate::seam::{Access, BytesFrom, ChunkStore, Source};
use crate::tier::fetch::ChunkScore;
use crate::tier::{Admission, HotChunks, Importance, LocalTier, TierFeed, TierStore};

/// The layers one reader reads through, built once per reader (a stream, a random-access
/// reader, a mount).
#[derive(Debug, Clone)]
pub struct StoreStack {
    top: Arc<dyn ChunkStore>,
    tier: Option<Arc<TierStore>>,
    /// The job's other nodes, when the tier is shared with them.
    peers: Option<Arc<Peers>>,
    /// Each layer's meter, top first.
    meters: Vec<(&'static str, Arc<Meter>)>,
}

/// `store` counted in `meter`, added to `meters` under `layer`.
fn metered(
    store: Arc<dyn ChunkStore>,
    layer: &'static str,
    meter: Arc<Meter>,
    meters: &mut Vec<(&'static str, Arc<Meter>)>,
) -> Arc<dyn ChunkStore> {
    meters.insert(0, (layer, meter.clone()));
    Arc::new(Metered::new(store, meter))
}

impl StoreStack {
    /// The stack of a reader that reads as `access` says: `cache` over `peers` (if any) over
    /// `store`, a dataset's own store whose chunk table is `chunks`.
    pub fn with_tier(
        store: &Arc<dyn ChunkStore>,
        chunks: Arc<[ChunkEntry]>,
        access: Access,
        cache: Arc<LocalTier>,
        peers: Option<Arc<Peers>>,
    ) -> StoreStack {
        // Copies no reader of this dataset can use, and what exceeds the quota, go first.
        if let Err(e) = cache.retain_current(&chunks) {
            log::warn!(
                "the local tier in {}: cannot drop the copies of other chunks ({e}); they stay \
                 until evicted",
                cache.dir().display()
            );
        }
        let plain = Self::plain(store, access.clone());
        let (origin, mut meters) = (plain.top, plain.meters);
        let below = match peers.clone() {
            Some(p) => {
                let meter = Arc::new(Meter::default());
                let peers = PeerStore::new(p, origin.clone(), chunks.clone(), meter.clone());
                metered(Arc::new(peers), "peers", meter, &mut meters)
            }
            None => origin,
        };
        // The tier opens its copies as the reader reads, counted in its own meter.
        let meter = Arc::new(Meter::default());
        let copies = Access {
            meter: meter.clone(),
            ..access
        };
        let tier = Arc::new(TierStore::new(cache, below, chunks, &copies));
        StoreStack {
            top: metered(tier.clone(), "tier", meter, &mut meters),
            tier: Some(tier),
            peers,
            meters,
        }
    }

    /// A dataset's own store alone, tuned for `access`.
    pub fn plain(store: &Arc<dyn ChunkStore>, access: Access) -> StoreStack {
        let mut meters = Vec::new();
        let tuned = store.tuned(&access).unwrap_or_else(|| store.clone());
        let origin = metered(tuned, "origin", access.meter.clone(), &mut meters);
        StoreStack {
            top: origin,
            tier: None,
            peers: None,
            meters,
        }
    }

    /// The stack's top: where a chunk is opened.
    pub fn store(&self) -> &Arc<dyn ChunkStore> {
        &self.top
    }

    /// What a stream's reads feed the stack's tier with ([`TierFeed`]): admission with at most
    /// a quarter of `memory` (the stream's budget) of offers waiting, hot chunks carrying the
    /// class table `classes` when the policy is importance and `importance` says something,
    /// whole chunks ranked by it otherwise. `None` without a tier.
    pub fn tier_feed(
        &self,
        classes: Vec<Vec<u8>>,
        importance: Option<Arc<dyn Importance>>,
        memory: u64,
    ) -> crate::Result<Option<TierFeed>> {
        let Some(t) = &self.tier else {
            return Ok(None);
        };
        let hot = importance.clone().map(|i| HotChunks::open(t, i, memory));
        let hot = hot.transpose()?.flatten();
        let admission = Admission::start(
            t.cache.clone(),
            classes,
            memory / 4,
            self.meter("tier").unwrap_or_default(),
            self.peers.clone(),
        );
        Ok(Some(TierFeed {
            admission,
            hot,
            importance,
            chunks: t.chunks.clone(),
        }))
    }

    /// Fetch on first touch into the stack's tier ([`crate::tier::fetch`]) with `threads`
    /// threads, `score` ranking a chunk for the policy; `admitted` is told after each chunk
    /// the tier took. False without a tier, or if it fetches already.
    pub fn fetch_on_touch(
        &self,
        threads: usize,
        score: ChunkScore,
        admitted: Arc<dyn Fn() + Send + Sync>,
    ) -> bool {
        let meter = self.meter("tier").unwrap_or_default();
        self.tier
            .as_ref()
            .is_some_and(|t| t.fetch_on_touch(threads, score, admitted, meter))
    }

    /// Stops fetching on first touch (waiting for a fetch in progress).
    pub fn stop_fetching(&self) {
        if let Some(f) = self.tier.as_ref().and_then(|t| t.fetch.get()) {
            f.stop();
        }
    }

    /// Counts `samples` samples in `bytes` bytes a reader delivered from bytes that came from
    /// `from` (a completed read's [`crate::engine::Completed::from`]), in that layer's meter,
    /// or the top's in a stack without that layer.
    pub fn served(&self, from: BytesFrom, samples: u64, bytes: u64) {
        let top = || Some(self.meters.first()?.1.clone());
        if let Some(m) = self.meter(Self::layer_of(from)).or_else(top) {
            m.served(samples, bytes);
        }
    }

    fn layer_of(from: BytesFrom) -> &'static str {
        match from {
            BytesFrom::Tier => "tier",
            BytesFrom::Peer => "peers",
            BytesFrom::Origin => "origin",
        }
    }

    /// The layer (`tier`, `peers` or `origin`) whose bytes `source` serves now.
    pub fn layer_serving(&self, source: &Source) -> &'static str {
        Self::layer_of(source.bytes_from())
    }

    /// What passed through each layer so far, top first (`tier`, `peers`, `origin`), each with
    /// the time its reader waited in it.
    pub fn layers(&self) -> Vec<(&'static str, MeterReading)> {
        self.meters
            .iter()
            .map(|(name, m)| (*name, m.reading()))
            .collect()
    }

    /// Layer `name`'s meter (the tier's counts its admission too), if the stack has that layer.
    fn meter(&self, name: &str) -> Option<Arc<Meter>> {
        let m = self.meters.iter().find(|(layer, _)| *layer == name);
        Some(m?.1.clone())
    }

    /// What passed through layer `name` so far (nothing for a layer the stack does not have).
    pub fn layer(&self, name: &str) -> MeterReading {
        self.meter(name).map(|m| m.reading()).unwrap_or_default()
    }
}
