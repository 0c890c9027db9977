//! A tier shared by the nodes of one job: every node knows which node's tier keeps which
//! chunk without asking anyone ([`Ownership`]). A read goes local tier → owner's tier (over
//! HTTP, `granary serve`) → origin, and a peer's copy must have the chunk's size and digest
//! from the snapshot, or the chunk comes from origin. A peer that fails or does not answer in
//! time is marked down until the next epoch: a dead node costs speed, never data or a hang.
//! Only whole chunk copies are shared.

pub mod request;
#[cfg(feature = "server")]
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use granary_format::ChunkEntry;

use crate::counts::Meter;
use crate::error::{Result, StoreError};
use crate::object::{ObjectUrl, PeerLink, Sized};
use crate::seam::{open_sized, BytesFrom, ChunkSource, ChunkStore, RangeRead, Source};
use granary_format::DatasetId;

const NO_OWNER: u32 = u32::MAX;

/// Which node's tier keeps each chunk: a pure function of the plan and each node's tier
/// capacity, computed identically on every node ([`Ownership::assign`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ownership {
    owner: Vec<u32>,
    nodes: u32,
}

impl Ownership {
    /// Each chunk to its home node (`home[c]`: the node whose ranks read chunk `c` of
    /// `sizes[c]` bytes) while that node has room; the rest to the node with the most room
    /// left (the lowest-numbered on a tie), or to none (read from origin).
    pub fn assign(home: &[u32], sizes: &[u64], capacities: &[u64]) -> Ownership {
        let mut room = capacities.to_vec();
        let mut owner = vec![NO_OWNER; home.len()];
        let mut spill = Vec::new();
        for (c, (&h, &size)) in home.iter().zip(sizes).enumerate() {
            if size <= room[h as usize] {
                room[h as usize] -= size;
                owner[c] = h;
            } else {
                spill.push(c);
            }
        }
        for c in spill {
            let best = (0..room.len()).max_by_key(|&n| (room[n], std::cmp::Reverse(n)));
            if let Some(n) = best.filter(|&n| sizes[c] <= room[n]) {
                room[n] -= sizes[c];
                owner[c] = n as u32;
            }
        }
        Ownership {
            owner,
            nodes: capacities.len() as u32,
        }
    }

    /// The node whose tier keeps `chunk`, if any.
    pub fn owner(&self, chunk: u32) -> Option<u32> {
        self.owner
            .get(chunk as usize)
            .copied()
            .filter(|&n| n != NO_OWNER)
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// A fingerprint of the whole table (8 bytes of SHA-256, in hex): equal on every node of a
    /// job exactly when they agree on who keeps what.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.nodes.to_le_bytes());
        for o in &self.owner {
            h.update(o.to_le_bytes());
        }
        h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The other nodes of a job, as one node reads from them.
#[derive(Debug)]
pub struct Peers {
    me: u32,
    addrs: Vec<String>,
    /// Each node's tier of this dataset; `None` for this node.
    clients: Vec<Option<ObjectUrl>>,
    ownership: Ownership,
    down: Vec<AtomicBool>,
    /// A rejected copy is reported once per peer and epoch.
    rejected_said: Vec<AtomicBool>,
}

impl Peers {
    /// The peers of node `me` for dataset `dataset_id`: `addrs[node]` is each node's `granary
    /// serve` address (`host:port`, this node's too). Requests are bounded by `timeout` and
    /// not retried; with `secret` (the job's) each carries the server's proof; with `tls_ca`
    /// (PEM) they go over TLS to servers whose certificates chain to it.
    pub fn new(
        dataset_id: [u8; 16],
        addrs: Vec<String>,
        me: u32,
        ownership: Ownership,
        timeout: Duration,
        secret: Option<crate::auth::Secret>,
        tls_ca: Option<&[u8]>,
    ) -> Result<Peers> {
        if addrs.len() != ownership.nodes() as usize {
            return Err(StoreError::Invalid(format!(
                "{} peer addresses for {} nodes: list every node's address, this node's too, \
                 in node order",
                addrs.len(),
                ownership.nodes()
            )));
        }
        if me >= ownership.nodes() {
            return Err(StoreError::Invalid(format!(
                "node {me} is not in 0..{}",
                ownership.nodes()
            )));
        }
        let id = DatasetId(dataset_id).to_string();
        let link = PeerLink {
            secret,
            ca: tls_ca.map(<[u8]>::to_vec),
        };
        let mut clients = Vec::with_capacity(addrs.len());
        for (n, a) in addrs.iter().enumerate() {
            check_addr(a)?;
            let client = (n as u32 != me).then(|| ObjectUrl::peer(a, &id, timeout, link.clone()));
            clients.push(client.transpose()?);
        }
        Ok(Peers {
            me,
            down: addrs.iter().map(|_| AtomicBool::new(false)).collect(),
            rejected_said: addrs.iter().map(|_| AtomicBool::new(false)).collect(),
            addrs,
            clients,
            ownership,
        })
    }

    pub fn me(&self) -> u32 {
        self.me
    }

    pub fn ownership(&self) -> &Ownership {
        &self.ownership
    }

    /// True if this node's tier keeps `chunk` (it admits no other chunk copy).
    pub fn keeps(&self, chunk: u32) -> bool {
        self.ownership.owner(chunk) == Some(self.me)
    }

    /// A new epoch: every peer is asked again.
    pub fn begin_epoch(&self) {
        for (d, r) in self.down.iter().zip(&self.rejected_said) {
            d.store(false, Relaxed);
            r.store(false, Relaxed);
        }
    }

    /// Peers marked down this epoch, by address.
    pub fn down(&self) -> Vec<String> {
        self.down
            .iter()
            .zip(&self.addrs)
            .filter(|(d, _)| d.load(Relaxed))
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// Chunk `ce` from `node`'s tier into `parts` (its size together, in order), if that node
    /// has it and its copy checks out; what happened is counted in `c`.
    fn fetch_into(
        &self,
        node: u32,
        name: &str,
        ce: &ChunkEntry,
        parts: &mut [&mut [u8]],
        c: &Meter,
    ) -> bool {
        let n = node as usize;
        if self.down[n].load(Relaxed) {
            c.unreachable.fetch_add(1, Relaxed);
            return false;
        }
        let Some(peer) = self.clients[n].as_ref() else {
            return false;
        };
        let reject = |what: String| {
            c.rejected.fetch_add(1, Relaxed);
            if !self.rejected_said[n].swap(true, Relaxed) {
                log::warn!(
                    "peer {} (node {node}) served {} with {what}, not the \
                     snapshot's {} bytes and digest {}: rejected, read from origin (further \
                     rejections from this peer are counted, not printed, this epoch)",
                    self.addrs[n],
                    peer.object_url(name),
                    ce.file_size,
                    granary_format::hex16(&ce.digest)
                );
            }
            false
        };
        match peer.get_into(name, ce.file_size, parts) {
            // The whole copy's SHA-256, not only its CRC-32: a peer is another machine, and a
            // copy with the right CRCs but other bytes must not pass.
            Ok(Sized::Got(digest)) if digest == ce.digest => {
                c.chunks_from_peers.fetch_add(1, Relaxed);
                c.bytes_from_peers.fetch_add(ce.file_size, Relaxed);
                true
            }
            Ok(Sized::Got(digest)) => reject(format!("digest {}", granary_format::hex16(&digest))),
            Ok(Sized::Wrong(len)) => reject(format!("{len} bytes")),
            Ok(Sized::Missing) => {
                c.missing_at_owner.fetch_add(1, Relaxed);
                false
            }
            Err(e) => {
                c.unreachable.fetch_add(1, Relaxed);
                if !self.down[n].swap(true, Relaxed) {
                    c.peers_marked_down.fetch_add(1, Relaxed);
                    let why = match &e {
                        StoreError::Remote { kind, .. } if *kind == crate::RemoteKind::Denied => {
                            format!(
                                "refused this reader: it does not hold the job's secret (give it \
                                 the one `granary serve` was given: --peer-secret-file or {}) \
                                 ({e})",
                                crate::auth::SECRET_ENV
                            )
                        }
                        _ => format!("failed ({e})"),
                    };
                    log::warn!(
                        "peer {} (node {node}) {why}; its chunks come from origin storage for \
                         the rest of this epoch",
                        self.addrs[n]
                    );
                }
                false
            }
        }
    }
}

/// `host:port`, nothing else (no scheme, no path).
fn check_addr(a: &str) -> Result<()> {
    let ok = a.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "peer address {a:?} is not host:port (e.g. 10.0.0.7:7070)"
        )))
    }
}

/// The job's other nodes as a layer: a chunk another node keeps is asked of that node first
/// and read from the next store when that fails; every other chunk comes from the next store.
#[derive(Debug)]
pub struct PeerStore {
    peers: Arc<Peers>,
    next: Arc<dyn ChunkStore>,
    chunks: Arc<[ChunkEntry]>,
    meter: Arc<Meter>,
}

impl PeerStore {
    /// `peers` in front of `next`, for a dataset whose chunk table is `chunks`, counted in
    /// `meter` (the layer's).
    pub fn new(
        peers: Arc<Peers>,
        next: Arc<dyn ChunkStore>,
        chunks: Arc<[ChunkEntry]>,
        meter: Arc<Meter>,
    ) -> Self {
        PeerStore {
            peers,
            next,
            chunks,
            meter,
        }
    }
}

impl ChunkStore for PeerStore {
    fn chunk_location(&self, id: u32) -> PathBuf {
        self.next.chunk_location(id)
    }

    fn location(&self) -> String {
        self.next.location()
    }

    fn open_chunk(&self, id: u32) -> Result<Source> {
        // Asked of its owner first, if that is not this node and not down.
        let p = &self.peers;
        let owner = p.ownership.owner(id);
        let owner = owner.filter(|&n| n != p.me && !p.down[n as usize].load(Relaxed));
        let (Some(node), Some(ce)) = (owner, self.chunks.get(id as usize)) else {
            return self.next.open_chunk(id);
        };
        let name = crate::copy_file_name(id, &ce.digest);
        let location = PathBuf::from(format!("http://{}/{name}", self.peers.addrs[node as usize]));
        Ok(Arc::new(PeerSource {
            peers: self.peers.clone(),
            node,
            ce: *ce,
            name,
            location,
            next: self.next.clone(),
            meter: self.meter.clone(),
            fell_back: Default::default(),
            given_up: Default::default(),
        }))
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        self.next.list()
    }
}

/// A chunk owned by another node: its owner's copy when that checks out, the next store's
/// otherwise.
#[derive(Debug)]
struct PeerSource {
    peers: Arc<Peers>,
    node: u32,
    ce: ChunkEntry,
    name: String,
    location: PathBuf,
    next: Arc<dyn ChunkStore>,
    meter: Arc<Meter>,
    /// Whether the latest read came from the next store.
    fell_back: AtomicBool,
    /// Bytes from the peer failed once: every later read goes to the next store.
    given_up: AtomicBool,
}

impl ChunkSource for PeerSource {
    fn location(&self) -> &Path {
        &self.location
    }

    fn len(&self) -> u64 {
        self.ce.file_size
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()> {
        // A read of the whole chunk (in one range, or pieces back to back) is streamed from the
        // peer straight into them; anything else (or a peer that fails) from the next store.
        let size = self.ce.file_size as usize;
        let mut order: Vec<&mut RangeRead<'_>> = reads.iter_mut().collect();
        order.sort_by_key(|r| r.offset);
        let mut parts: Vec<&mut [u8]> = Vec::with_capacity(order.len());
        let mut end = 0usize;
        for r in order {
            if r.offset as usize != end || end >= size {
                parts.clear();
                break;
            }
            let n = r.buf.len().min(size - end);
            parts.push(&mut r.buf[..n]);
            end += n;
        }
        if end == size
            && !parts.is_empty()
            && !self.given_up.load(Relaxed)
            && self
                .peers
                .fetch_into(self.node, &self.name, &self.ce, &mut parts, &self.meter)
        {
            self.fell_back.store(false, Relaxed);
            return Ok(());
        }
        open_sized(&*self.next, &self.ce)?.read_ranges(reads)?;
        let n: u64 = reads.iter().map(|r| r.buf.len() as u64).sum();
        self.meter
            .bytes_from_origin_instead
            .fetch_add(n.min(self.ce.file_size), Relaxed);
        self.fell_back.store(true, Relaxed);
        Ok(())
    }

    fn bytes_from(&self) -> BytesFrom {
        if self.fell_back.load(Relaxed) {
            BytesFrom::Origin
        } else {
            BytesFrom::Peer
        }
    }

    /// A peer's bytes that fail are given up for the next store's, for good.
    fn fall_back(&self, why: &str, served: BytesFrom) -> Result<bool> {
        if served != BytesFrom::Peer {
            return Ok(false);
        }
        log::debug!(
            "chunk {} read through the peers failed ({why}); read at {} from now on",
            self.ce.chunk_id,
            self.next.location()
        );
        self.given_up.store(true, Relaxed);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_go_home_while_there_is_room_then_to_the_roomiest_node_then_to_none() {
        // Chunks of 10 bytes; node 0 reads chunks 0-3, node 1 chunks 4-5; room for 2 and 3.
        let home = [0, 0, 0, 0, 1, 1];
        let o = Ownership::assign(&home, &[10; 6], &[20, 30]);
        assert_eq!(
            (0..6).map(|c| o.owner(c)).collect::<Vec<_>>(),
            [Some(0), Some(0), Some(1), None, Some(1), Some(1)]
        );
        assert_ne!(
            o.fingerprint(),
            Ownership::assign(&home, &[10; 6], &[30, 30]).fingerprint()
        );
    }

    #[test]
    fn peer_addresses_are_host_and_port_only() {
        for ok in ["127.0.0.1:7070", "node-3:80", "[::1]:9000"] {
            assert!(check_addr(ok).is_ok(), "{ok}");
        }
        for bad in [
            "127.0.0.1",
            "http://a:1",
            "a:0",
            ":80",
            "a/b:80",
            "a:x",
            "a:70000",
        ] {
            assert!(check_addr(bad).is_err(), "{bad}");
        }
    }
}
