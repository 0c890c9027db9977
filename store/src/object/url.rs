//! Object store URLs, and [`ObjectUrl`]: a dataset prefix in a store.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use object_store::path::Path as ObjPath;

use super::client::Clients;
use super::runtime::block_on;
use super::timeouts::watched;
use super::SCHEMES;
use crate::config::StoreConfig;
use crate::config::Timeouts;
use crate::error::{Result, StoreError};

/// True if `s` is a URL granary reads through an object store (`scheme://...` with a known
/// scheme). A local directory whose name merely looks like one can be written `./s3:/...`.
pub fn is_url(s: &str) -> bool {
    s.split_once("://")
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// True if `s` has the form of a URL (`scheme://...`), known scheme or not.
pub fn looks_like_url(s: &str) -> bool {
    s.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    })
}

/// A dataset prefix in an object store: `scheme://bucket/prefix`.
#[derive(Debug)]
pub struct ObjectUrl {
    pub(super) url: String,
    pub(super) prefix: ObjPath,
    /// This process's client (see the module documentation on forks).
    pub(super) client: Mutex<Option<(u32, Clients)>>,
    /// How long requests wait.
    pub(super) timeouts: Timeouts,
    /// S3 credentials may come from the instance's role ([`StoreConfig::aws_imds`]).
    pub(super) aws_imds: bool,
    /// Set for a peer's tier (`granary serve`, read by the peers' client): every
    /// request bounded by `timeouts.request`, never retried, nothing logged while waiting (the
    /// peer layer handles a slow peer), signed with the job's secret.
    pub(super) peer: Option<PeerLink>,
}

/// How requests reach a peer's tier.
#[derive(Debug, Clone)]
pub(crate) struct PeerLink {
    /// The job's secret, which signs every request (`crate::auth`).
    pub(crate) secret: Option<crate::auth::Secret>,
    /// Certificates (PEM) the peer's TLS certificate must chain to: the peer is then `https`.
    pub(crate) ca: Option<Vec<u8>>,
}

impl ObjectUrl {
    /// `url` with the default configuration (tests and tools; front ends resolve a
    /// [`StoreConfig`] and use [`ObjectUrl::open`] or [`crate::open`]).
    pub fn parse(url: &str) -> Result<Self> {
        Self::open(url, &StoreConfig::default())
    }

    /// Parses `url`, whose client `cfg` configures (no request is made; the client is built
    /// on first use).
    pub fn open(url: &str, cfg: &StoreConfig) -> Result<Self> {
        let bad = |why: &str| StoreError::Invalid(format!("{url}: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("not a URL (scheme://bucket/prefix)"))?;
        let scheme = scheme.to_ascii_lowercase();
        if !SCHEMES.contains(&scheme.as_str()) {
            return Err(bad(&format!(
                "unknown scheme {scheme:?}: use s3://, gs://, az://, http(s):// or a local path"
            )));
        }
        let rest = rest.trim_end_matches('/');
        let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(bad("no bucket (or host) in the URL"));
        }
        let prefix =
            ObjPath::parse(prefix).map_err(|e| bad(&format!("not a valid object prefix: {e}")))?;
        Ok(ObjectUrl {
            url: format!("{scheme}://{rest}"),
            prefix,
            client: Mutex::new(None),
            timeouts: cfg.timeouts,
            aws_imds: cfg.aws_imds,
            peer: None,
        })
    }

    /// This URL read as one object: the prefix above it (configured alike) and the object's
    /// name, or `None` for a bucket or host without a path.
    pub fn as_object(&self) -> Option<(ObjectUrl, String)> {
        let (parent, name) = self.url.rsplit_once('/')?;
        let prefix = self.prefix.parts().collect::<Vec<_>>();
        let (_, above) = prefix.split_last()?;
        let parent = ObjectUrl {
            url: parent.to_string(),
            prefix: above.iter().cloned().collect(),
            client: Mutex::new(None),
            timeouts: self.timeouts,
            aws_imds: self.aws_imds,
            peer: self.peer.clone(),
        };
        Some((parent, name.to_string()))
    }

    /// The tier of dataset `id_hex` served by the peer at `addr` (`host:port`, `granary
    /// serve`), as the peers' client reads it: plain HTTP (TLS when `link` has a CA), each
    /// request bounded by `timeout` (connecting included) and never retried, so a peer that
    /// is gone costs one timeout, not a backoff schedule.
    pub(crate) fn peer(
        addr: &str,
        id_hex: &str,
        timeout: Duration,
        link: PeerLink,
    ) -> Result<Self> {
        let scheme = if link.ca.is_some() { "https" } else { "http" };
        let mut u = Self::parse(&format!("{scheme}://{addr}/{id_hex}"))?;
        u.timeouts = Timeouts {
            connect: timeout,
            request: timeout,
            retry: timeout,
        };
        u.peer = Some(link);
        Ok(u)
    }

    /// The timeouts its requests use.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Runs `fut`, an operation on `url`, on this process's runtime. While it takes long, a
    /// warning says so (once after the first notice, then at doubling intervals), naming the
    /// URL, so that a store that does not answer is never a silent wait.
    pub(super) fn run<F: Future>(&self, what: &str, url: &str, fut: F) -> Result<F::Output> {
        if self.peer.is_some() {
            return block_on(fut);
        }
        block_on(watched(what, url, self.timeouts, fut))
    }

    /// The URL (normalised: no trailing slash).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of object `name` under the prefix.
    pub fn object_url(&self, name: &str) -> String {
        format!("{}/{name}", self.url)
    }

    pub(super) fn key(&self, name: &str) -> ObjPath {
        self.prefix.clone().join(name)
    }

    pub(super) fn scheme(&self) -> &str {
        self.url.split_once("://").map_or("", |(s, _)| s)
    }

    /// True for stores that accept writes (not plain HTTP).
    pub fn writable(&self) -> bool {
        !matches!(self.scheme(), "http" | "https")
    }
}
