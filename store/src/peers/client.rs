//! The peers' client: one other node's tier of one dataset, as this node reads it from that
//! node's `granary serve` ([`super::server`]). It speaks the object module's HTTP (the same
//! ranged GETs, the same runtime), configured the way a peer must be asked: every request
//! signed with the job's secret ([`crate::auth`]), bounded by the peer timeout (connecting
//! included) and never retried, over TLS when the job has a CA.

use std::time::Duration;

use crate::error::Result;
use crate::object::{ObjectUrl, PeerLink, Sized};

/// One node's tier of one dataset, read over HTTP.
#[derive(Debug)]
pub(crate) struct PeerClient {
    url: ObjectUrl,
}

impl PeerClient {
    /// The tier of dataset `id_hex` at `addr` (`host:port`): requests bounded by `timeout`,
    /// signed with `secret` when there is one, over TLS checked against `ca` (PEM) when given.
    pub(crate) fn new(
        addr: &str,
        id_hex: &str,
        timeout: Duration,
        secret: Option<crate::auth::Secret>,
        ca: Option<&[u8]>,
    ) -> Result<Self> {
        let link = PeerLink {
            secret,
            ca: ca.map(<[u8]>::to_vec),
        };
        Ok(PeerClient {
            url: ObjectUrl::peer(addr, id_hex, timeout, link)?,
        })
    }

    /// The URL of chunk file `name` at the peer, for messages.
    pub(crate) fn chunk_url(&self, name: &str) -> String {
        self.url.object_url(name)
    }

    /// Chunk file `name`, which must be `size` bytes, streamed into `parts`: whether the peer
    /// had it, and with which size and CRC-32 (checked by the caller against the snapshot).
    pub(crate) fn get_into(&self, name: &str, size: u64, parts: &mut [&mut [u8]]) -> Result<Sized> {
        self.url.get_into(name, size, parts)
    }
}
