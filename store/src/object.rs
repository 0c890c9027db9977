//! Datasets in object stores: `s3://`, `gs://`, `az://` and read-only `http(s)://` URLs,
//! through the `object_store` crate (ranged GETs, retries with backoff, the configuration
//! variables users already set: `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...).
//!
//! A dataset at a URL is the same directory of immutable files as on disk, as objects under a
//! prefix. `granary::Dataset::open` fetches the snapshot once and keeps it in a local cache keyed by the
//! dataset id and the snapshot header's CRC ([`granary_format::snapshot_key`]), so reopening
//! costs one 64-byte ranged GET; chunks are read with ranged GETs ([`ObjectChunks`]), many in
//! flight, sizes taken from the snapshot (no HEAD per chunk). Everything the local reader
//! checks (headers, sizes, CRCs of every record) is checked the same way: a truncated or
//! replaced object is an error naming its URL, never short or wrong bytes.
//!
//! The async runtime and the HTTP clients belong to one process: a process forked after using
//! them (a PyTorch `DataLoader` worker) starts its own on first use and never touches the
//! parent's, whose threads do not exist in the child.

use std::future::Future;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::seam::{ChunkSource, ChunkStore, RangeRead, Source};
use crate::{DatasetId, RemoteKind, Result, StoreError};

/// URL schemes granary reads (and, but for `http(s)`, writes).
pub const SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https"];

/// Largest single ranged GET: a whole-chunk read of a default 32 MiB chunk is one GET; larger
/// ranges are split into parts of this size, fetched concurrently. Measured on SeaweedFS with
/// its disk cold (docs/object-stores.md): 8 MiB parts read 4,123 samples/s, whole chunks 4,776.
pub const GET_PART: u64 = 32 << 20;

/// GETs in flight per read call (each reader thread issues its own).
pub const GETS_IN_FLIGHT: usize = 16;

/// Parts of a multipart upload; files up to this size are one PUT.
pub const PUT_PART: usize = 16 << 20;

/// Multipart upload parts in flight per upload.
const PUTS_IN_FLIGHT: usize = 4;

/// Environment variables that set [`Timeouts`] (seconds, decimals allowed).
pub const CONNECT_TIMEOUT_ENV: &str = "GRANARY_CONNECT_TIMEOUT";
/// See [`CONNECT_TIMEOUT_ENV`].
pub const REQUEST_TIMEOUT_ENV: &str = "GRANARY_REQUEST_TIMEOUT";
/// See [`CONNECT_TIMEOUT_ENV`].
pub const RETRY_TIMEOUT_ENV: &str = "GRANARY_RETRY_TIMEOUT";

/// The longest pause between two attempts of one request (the client's backoff doubles from
/// 100 ms up to this).
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// How long granary waits on an object store. A request that cannot connect within `connect`,
/// or that receives no byte for `request` (waiting for the answer or within its body), fails
/// and is retried with backoff until `retry` has passed since its first attempt; then the
/// operation fails with an error naming the URL. A store that accepts connections and never
/// answers therefore fails an operation within [`Timeouts::bound`]. A slow transfer that keeps
/// making progress is never cut off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// Establishing a connection.
    pub connect: Duration,
    /// No byte received for this long (the answer, or the next part of its body).
    pub request: Duration,
    /// Retrying a failed request, counted from its first attempt.
    pub retry: Duration,
}

impl Default for Timeouts {
    /// 10 s to connect, 60 s without progress, 120 s of retries: long enough that a user on a
    /// slow or busy link does not hit them, short enough that a dead endpoint is an error
    /// within a few minutes rather than a hang.
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            request: Duration::from_secs(60),
            retry: Duration::from_secs(120),
        }
    }
}

impl Timeouts {
    /// The defaults, changed by [`CONNECT_TIMEOUT_ENV`], [`REQUEST_TIMEOUT_ENV`] and
    /// [`RETRY_TIMEOUT_ENV`] where set; a value that is not a positive number of seconds is an
    /// error naming the variable.
    pub fn from_env() -> Result<Self> {
        let mut t = Timeouts::default();
        for (var, slot) in [
            (CONNECT_TIMEOUT_ENV, &mut t.connect),
            (REQUEST_TIMEOUT_ENV, &mut t.request),
            (RETRY_TIMEOUT_ENV, &mut t.retry),
        ] {
            if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                let v = v.to_string_lossy();
                *slot = parse_seconds(&v)
                    .map_err(|why| StoreError::Invalid(format!("{var}={v}: {why}")))?;
            }
        }
        Ok(t)
    }

    /// The longest one operation waits on a store that never answers: the retry window, one
    /// more attempt begun just before it closed, and one backoff pause.
    pub fn bound(&self) -> Duration {
        self.retry + self.request.max(self.connect) + MAX_BACKOFF.min(self.retry)
    }
}

/// A duration given as seconds ("10", "2.5"), positive and at most a day.
pub fn parse_seconds(s: &str) -> std::result::Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| "not a number of seconds".to_string())?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err("must be more than 0 and at most 86400 seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

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

/// [`is_url`] for a path argument.
pub fn is_url_path(p: &Path) -> bool {
    p.to_str().is_some_and(is_url)
}

/// Runs `f` to completion on this process's runtime (started on first use, and again in a
/// forked child). Must not be called from inside an async task.
pub fn block_on<F: Future>(f: F) -> Result<F::Output> {
    Ok(runtime()?.block_on(f))
}

fn runtime() -> Result<Arc<tokio::runtime::Runtime>> {
    static RT: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut g = RT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((p, rt)) = g.as_ref() {
        if *p == pid {
            return Ok(rt.clone());
        }
    }
    // A forked child: the parent's runtime has none of its threads here; dropping it would
    // wait for them forever, so it is left alone.
    if let Some(old) = g.take() {
        std::mem::forget(old);
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("granary-net")
            .enable_all()
            .build()
            .map_err(|e| StoreError::io("starting the network runtime", "(runtime)", e))?,
    );
    *g = Some((pid, rt.clone()));
    Ok(rt)
}

/// `fut`, an operation `what` on `url`, with a warning each time it has waited another
/// doubling interval (the first after 10 s, or the request timeout if shorter).
async fn watched<F: Future>(what: &str, url: &str, t: Timeouts, fut: F) -> F::Output {
    use futures_util::future::{select, Either};
    let mut fut = std::pin::pin!(fut);
    let mut next = t.request.min(Duration::from_secs(10));
    let mut waited = Duration::ZERO;
    loop {
        let tick = std::pin::pin!(tokio::time::sleep(next));
        match select(fut.as_mut(), tick).await {
            Either::Left((out, _)) => return out,
            Either::Right(((), _)) => {
                waited += next;
                next = waited;
                log::warn!(
                    "{url}: {what}: still waiting after {:.0} s (a slow or silent store: a \
                     request with no answer for {:.0} s is retried until {:.0} s have passed, \
                     then fails; {REQUEST_TIMEOUT_ENV} and {RETRY_TIMEOUT_ENV} change them)",
                    waited.as_secs_f64(),
                    t.request.as_secs_f64(),
                    t.retry.as_secs_f64(),
                );
            }
        }
    }
}

/// What [`ObjectUrl::get_into`] found.
pub(crate) enum Sized {
    /// All of it, with this CRC-32.
    Got(u32),
    Missing,
    /// Another length than asked for (the body is not read).
    Wrong(u64),
}

/// Connects clients whose every request carries the job's proof (`crate::auth`).
#[derive(Debug)]
struct Signing(crate::auth::Secret);

impl object_store::client::HttpConnector for Signing {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(object_store::client::HttpClient::new(Signed {
            inner,
            secret: self.0.clone(),
        }))
    }
}

#[derive(Debug)]
struct Signed {
    inner: object_store::client::HttpClient,
    secret: crate::auth::Secret,
}

#[async_trait::async_trait]
impl object_store::client::HttpService for Signed {
    async fn call(
        &self,
        mut req: object_store::client::HttpRequest,
    ) -> std::result::Result<object_store::client::HttpResponse, object_store::client::HttpError>
    {
        let range = req
            .headers()
            .get(http::header::RANGE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let proof = self.secret.sign(
            req.method().as_str(),
            req.uri().path(),
            range.as_deref(),
            crate::auth::unix_now(),
        );
        let value = http::HeaderValue::from_str(&proof).expect("a proof is ASCII");
        req.headers_mut().insert(crate::auth::AUTH_HEADER, value);
        self.inner.execute(req).await
    }
}

/// One process's clients of a store.
#[derive(Debug, Clone)]
struct Clients {
    store: Arc<dyn ObjectStore>,
    /// The same client as S3, for `s3://` URLs.
    s3: Option<Arc<object_store::aws::AmazonS3>>,
}

/// A multipart upload in progress, which [`abort_open_uploads`] can abort from any thread.
struct OpenUpload {
    token: u64,
    s3: Arc<object_store::aws::AmazonS3>,
    key: ObjPath,
    id: String,
    url: String,
}

/// This process's multipart uploads in progress; `closed` once they were aborted for an
/// interruption (no new one starts after that); `starting` counts the uploads whose start
/// request is on its way (the server may list them before this process learns their ids).
#[derive(Default)]
struct Uploads {
    closed: bool,
    next: u64,
    starting: usize,
    open: Vec<OpenUpload>,
}

static UPLOADS: Mutex<Uploads> = Mutex::new(Uploads {
    closed: false,
    next: 0,
    starting: 0,
    open: Vec::new(),
});

/// Signalled when an upload's start request returns.
static STARTED: std::sync::Condvar = std::sync::Condvar::new();

/// How long an interruption waits for start requests on their way, so that it can abort the
/// uploads they open.
const START_WAIT: Duration = Duration::from_secs(30);

fn uploads() -> std::sync::MutexGuard<'static, Uploads> {
    UPLOADS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Aborts every multipart upload this process has in progress (for a pack interrupted by a
/// signal, before it exits), and refuses new ones from then on. Start requests on their way
/// are waited for (up to 30 s) so that the uploads they open are aborted too. Returns the URL
/// of each upload and whether its abort succeeded (the server then drops its parts).
pub fn abort_open_uploads() -> Vec<(String, Result<()>)> {
    use object_store::multipart::MultipartStore;
    let (open, unknown) = {
        let mut u = uploads();
        u.closed = true;
        let t0 = Instant::now();
        while u.starting > 0 && t0.elapsed() < START_WAIT {
            u = STARTED
                .wait_timeout(u, START_WAIT.saturating_sub(t0.elapsed()))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        (std::mem::take(&mut u.open), u.starting)
    };
    let mut done: Vec<(String, Result<()>)> = open
        .into_iter()
        .map(|o| {
            let r = block_on(async { o.s3.abort_multipart(&o.key, &o.id).await }).and_then(|r| {
                r.or_else(|e| match e {
                    object_store::Error::NotFound { .. } => Ok(()),
                    e => Err(remote_error("aborting the upload of", &o.url, e)),
                })
            });
            (o.url, r)
        })
        .collect();
    if unknown > 0 {
        done.push((
            format!("{unknown} upload(s) being started"),
            Err(StoreError::Invalid(format!(
                "no answer to their start request within {}s: any upload they opened stays \
                 open until --resume aborts it",
                START_WAIT.as_secs()
            ))),
        ));
    }
    done
}

/// An upload left open on the server: its object's name under the prefix, and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenUploadInfo {
    pub name: String,
    pub id: String,
}

/// A dataset prefix in an object store: `scheme://bucket/prefix`.
#[derive(Debug)]
pub struct ObjectUrl {
    url: String,
    prefix: ObjPath,
    /// This process's client (see the module documentation on forks).
    client: Mutex<Option<(u32, Clients)>>,
    /// How long requests wait ([`Timeouts::from_env`] when parsed).
    timeouts: Timeouts,
    /// A peer's tier (`granary serve`): every request bounded by `timeouts.request`, never
    /// retried, and nothing logged while waiting (the peer layer handles a slow peer).
    peer: bool,
    /// The job's secret, which signs every request to a peer (`crate::auth`).
    secret: Option<crate::auth::Secret>,
    /// Certificates (PEM) a peer's TLS certificate must chain to: the peer is then `https`.
    peer_ca: Option<Vec<u8>>,
}

impl ObjectUrl {
    /// Parses `url` (no request is made; the client is built on first use).
    pub fn parse(url: &str) -> Result<Self> {
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
            timeouts: Timeouts::from_env()?,
            peer: false,
            secret: None,
            peer_ca: None,
        })
    }

    /// The tier of dataset `id_hex` served by the peer at `addr` (`host:port`, `granary
    /// serve`): plain HTTP, each request bounded by `timeout` (connecting included) and never
    /// retried, so a peer that is gone costs one timeout, not a backoff schedule; each signed
    /// with `secret` when there is one; over TLS, the peer's certificate checked against
    /// `ca` (PEM), when given.
    pub fn peer(
        addr: &str,
        id_hex: &str,
        timeout: Duration,
        secret: Option<crate::auth::Secret>,
        ca: Option<&[u8]>,
    ) -> Result<Self> {
        let scheme = if ca.is_some() { "https" } else { "http" };
        let mut u = Self::parse(&format!("{scheme}://{addr}/{id_hex}"))?;
        u.peer_ca = ca.map(<[u8]>::to_vec);
        u.timeouts = Timeouts {
            connect: timeout,
            request: timeout,
            retry: timeout,
        };
        u.peer = true;
        u.secret = secret;
        Ok(u)
    }

    /// The timeouts its requests use.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Runs `fut`, an operation on `url`, on this process's runtime. While it takes long, a
    /// warning says so (once after the first notice, then at doubling intervals), naming the
    /// URL, so that a store that does not answer is never a silent wait.
    fn run<F: Future>(&self, what: &str, url: &str, fut: F) -> Result<F::Output> {
        if self.peer {
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

    fn key(&self, name: &str) -> ObjPath {
        self.prefix.clone().join(name)
    }

    fn scheme(&self) -> &str {
        self.url.split_once("://").map_or("", |(s, _)| s)
    }

    /// True for stores that accept writes (not plain HTTP).
    pub fn writable(&self) -> bool {
        !matches!(self.scheme(), "http" | "https")
    }

    /// This process's client for the store.
    pub fn client(&self) -> Result<Arc<dyn ObjectStore>> {
        Ok(self.clients()?.store)
    }

    /// This process's S3 client, for an `s3://` URL (multipart uploads it can abort from
    /// anywhere, and the listing of open ones).
    fn s3(&self) -> Result<Option<Arc<object_store::aws::AmazonS3>>> {
        Ok(self.clients()?.s3)
    }

    fn clients(&self) -> Result<Clients> {
        let pid = std::process::id();
        let mut g = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((p, c)) = g.as_ref() {
            if *p == pid {
                return Ok(c.clone());
            }
        }
        if let Some(old) = g.take() {
            std::mem::forget(old); // the parent's connections; see `runtime`
        }
        let c = self.build()?;
        *g = Some((pid, c.clone()));
        Ok(c)
    }

    fn build(&self) -> Result<Clients> {
        let bucket_url = match self.url.split_once("://") {
            Some((s, rest)) => format!("{s}://{}", rest.split('/').next().unwrap_or(rest)),
            None => self.url.clone(),
        };
        let fail = |e: object_store::Error| {
            StoreError::Invalid(format!("{}: cannot configure the client: {e}", self.url))
        };
        use object_store::ClientConfigKey as K;
        let t = self.timeouts;
        // The client's whole-request limit (30 s by default) would cut off a large GET on a
        // slow link and retry it forever; progress is watched by `read_timeout` instead, and
        // the whole request is only bounded for a peer.
        let whole = if self.peer {
            t.request
        } else {
            Duration::from_secs(86_400)
        };
        let secs = |d: Duration| format!("{}ms", d.as_millis().max(1));
        let client: [(K, String); 3] = [
            (K::ConnectTimeout, secs(t.connect)),
            (K::ReadTimeout, secs(t.request)),
            (K::Timeout, secs(whole)),
        ];
        let retry = object_store::RetryConfig {
            max_retries: if self.peer { 0 } else { 100 },
            retry_timeout: t.retry,
            backoff: object_store::BackoffConfig {
                max_backoff: MAX_BACKOFF,
                ..Default::default()
            },
        };
        let mut s3 = None;
        let store: Arc<dyn ObjectStore> = match self.scheme() {
            "s3" | "s3a" => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as C};
                check_aws_credentials(&self.url)?;
                let b = client
                    .into_iter()
                    .fold(AmazonS3Builder::from_env(), |b, (k, v)| {
                        b.with_config(C::Client(k), v)
                    });
                let c = Arc::new(
                    b.with_url(&bucket_url)
                        .with_retry(retry)
                        .build()
                        .map_err(fail)?,
                );
                s3 = Some(c.clone());
                c
            }
            "gs" => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey as C};
                let b = client
                    .into_iter()
                    .fold(GoogleCloudStorageBuilder::from_env(), |b, (k, v)| {
                        b.with_config(C::Client(k), v)
                    });
                Arc::new(
                    b.with_url(&bucket_url)
                        .with_retry(retry)
                        .build()
                        .map_err(fail)?,
                )
            }
            "az" | "abfs" | "abfss" => {
                use object_store::azure::{AzureConfigKey as C, MicrosoftAzureBuilder};
                let b = client
                    .into_iter()
                    .fold(MicrosoftAzureBuilder::from_env(), |b, (k, v)| {
                        b.with_config(C::Client(k), v)
                    });
                Arc::new(
                    b.with_url(&bucket_url)
                        .with_retry(retry)
                        .build()
                        .map_err(fail)?,
                )
            }
            scheme => {
                // An http:// URL asks for plain HTTP; the client refuses it otherwise.
                let mut options = object_store::ClientOptions::new()
                    .with_allow_http(scheme == "http")
                    .with_connect_timeout(t.connect)
                    .with_read_timeout(t.request)
                    .with_timeout(whole);
                if let Some(pem) = &self.peer_ca {
                    let certs = object_store::Certificate::from_pem_bundle(pem).map_err(|e| {
                        StoreError::Invalid(format!("the peers' CA certificates: {e}"))
                    })?;
                    if certs.is_empty() {
                        return Err(StoreError::Invalid(
                            "the peers' CA file holds no certificate".into(),
                        ));
                    }
                    for c in certs {
                        options = options.with_root_certificate(c);
                    }
                }
                let mut b = object_store::http::HttpBuilder::new()
                    .with_url(&bucket_url)
                    .with_retry(retry)
                    .with_client_options(options);
                if let Some(secret) = &self.secret {
                    b = b.with_http_connector(Signing(secret.clone()));
                }
                Arc::new(b.build().map_err(fail)?)
            }
        };
        Ok(Clients { store, s3 })
    }

    /// Bytes `range` of object `name`; exactly that many, or an error naming the object.
    pub fn get_range(&self, name: &str, range: Range<u64>) -> Result<bytes::Bytes> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        self.run(
            "reading",
            &url,
            fetch_range(&*client, &key, &url, range, None),
        )?
    }

    /// The whole of object `name`.
    pub fn get(&self, name: &str) -> Result<bytes::Bytes> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        self.run("reading", &url, async {
            client.get(&key).await?.bytes().await
        })?
        .map_err(|e| remote_error("reading", &url, e))
    }

    /// Object `name`, if it is `size` bytes long, streamed into `parts` one after another (no
    /// second copy in memory; they must hold `size` bytes together): its length is checked
    /// before its body is read, so that a peer announcing another size costs nothing. Returns
    /// the CRC-32 of what was written.
    pub(crate) fn get_into(&self, name: &str, size: u64, parts: &mut [&mut [u8]]) -> Result<Sized> {
        let client = self.client()?;
        let key = self.key(name);
        let url = self.object_url(name);
        self.run("reading", &url, async {
            let res = match client.get(&key).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(Sized::Missing),
                Err(e) => return Err(remote_error("reading", &url, e)),
            };
            if res.meta.size != size {
                return Ok(Sized::Wrong(res.meta.size));
            }
            let mut crc = crc32fast::Hasher::new();
            let (mut part, mut at, mut total) = (0usize, 0usize, 0u64);
            let mut body = res.into_stream();
            while let Some(got) = body.next().await {
                let got = got.map_err(|e| remote_error("reading", &url, e))?;
                total += got.len() as u64;
                if total > size {
                    return Ok(Sized::Wrong(total));
                }
                crc.update(&got);
                let mut rest: &[u8] = &got;
                while !rest.is_empty() {
                    let dst = &mut parts[part][at..];
                    let n = dst.len().min(rest.len());
                    dst[..n].copy_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    at += n;
                    if at == parts[part].len() {
                        (part, at) = (part + 1, 0);
                    }
                }
            }
            Ok(if total == size {
                Sized::Got(crc.finalize())
            } else {
                Sized::Wrong(total)
            })
        })?
    }

    /// Size of object `name`, `None` if there is none.
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        match self.run("inspecting", &url, async { client.head(&key).await })? {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(remote_error("inspecting", &url, e)),
        }
    }

    /// Names and sizes of the objects directly under the prefix.
    pub fn list(&self) -> Result<Vec<(String, u64)>> {
        let client = self.client()?;
        let prefix = (!self.prefix.as_ref().is_empty()).then(|| self.prefix.clone());
        let listed = self
            .run("listing", &self.url, async {
                client.list_with_delimiter(prefix.as_ref()).await
            })?
            .map_err(|e| remote_error("listing", &self.url, e))?;
        Ok(listed
            .objects
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?.to_string();
                Some((name, m.size))
            })
            .collect())
    }

    /// Deletes object `name` (absent is fine).
    pub fn delete(&self, name: &str) -> Result<()> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        match self.run("deleting", &url, async { client.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error("deleting", &url, e)),
        }
    }

    /// Stores `data` as object `name` with one PUT (it appears whole or not at all).
    pub fn put_bytes(&self, name: &str, data: Vec<u8>) -> Result<()> {
        let client = self.client()?;
        let (key, url) = (self.key(name), self.object_url(name));
        self.run("uploading", &url, async {
            client.put(&key, PutPayload::from(data)).await
        })?
        .map(|_| ())
        .map_err(|e| remote_error("uploading", &url, e))
    }

    /// The multipart uploads open on the server under the prefix (S3's ListMultipartUploads:
    /// an interrupted pack's, or anyone's); `None` for stores other than S3, which granary
    /// does not list.
    pub fn open_uploads(&self) -> Result<Option<Vec<OpenUploadInfo>>> {
        let Some(s3) = self.s3()? else {
            return Ok(None);
        };
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = env("AWS_ENDPOINT_URL")
            .or_else(|| env("AWS_ENDPOINT"))
            .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let bucket = self.url.split_once("://").map_or("", |(_, r)| r);
        let bucket = bucket.split('/').next().unwrap_or(bucket).to_string();
        let prefix = match self.prefix.as_ref() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let unsigned = env("AWS_SKIP_SIGNATURE").is_some_and(|v| v == "true" || v == "1");
        let t = self.timeouts;
        let options = object_store::ClientOptions::new()
            .with_allow_http(endpoint.starts_with("http://"))
            .with_connect_timeout(t.connect)
            .with_read_timeout(t.request);
        use object_store::client::HttpConnector;
        let http = object_store::client::ReqwestConnector::default()
            .connect(&options)
            .map_err(|e| remote_error("listing the open uploads of", &self.url, e))?;
        let url = self.url.clone();
        let list = async move {
            let mut found = Vec::new();
            let mut markers = String::new();
            loop {
                let uri = format!(
                    "{endpoint}/{bucket}?prefix={}&uploads={markers}",
                    query_encode(&prefix)
                );
                let mut req = http::Request::builder()
                    .method("GET")
                    .uri(&uri)
                    .body(object_store::client::HttpRequestBody::from(Vec::new()))
                    .map_err(|e| StoreError::Invalid(format!("{uri}: {e}")))?;
                if !unsigned {
                    let cred = s3
                        .credentials()
                        .get_credential()
                        .await
                        .map_err(|e| remote_error("listing the open uploads of", &url, e))?;
                    object_store::aws::AwsAuthorizer::new(&cred, "s3", &region)
                        .try_authorize(&mut req, None)
                        .map_err(|e| remote_error("listing the open uploads of", &url, e))?;
                }
                let failed = |e: &dyn std::fmt::Display| StoreError::Remote {
                    op: "listing the open uploads of",
                    url: url.clone(),
                    detail: e.to_string(),
                    kind: RemoteKind::Failed,
                };
                let resp = http.execute(req).await.map_err(|e| failed(&e))?;
                let status = resp.status();
                let body = resp.into_body().bytes().await.map_err(|e| failed(&e))?;
                let text = String::from_utf8_lossy(&body);
                if !status.is_success() {
                    return Err(failed(&format!("{status}: {text}")));
                }
                for part in text.split("<Upload>").skip(1) {
                    if let (Some(k), Some(id)) =
                        (xml_field(part, "Key"), xml_field(part, "UploadId"))
                    {
                        let k = xml_unescape(k);
                        found.push(OpenUploadInfo {
                            name: k.strip_prefix(&prefix).unwrap_or(&k).to_string(),
                            id: xml_unescape(id),
                        });
                    }
                }
                let more = xml_field(&text, "IsTruncated") == Some("true");
                match (
                    more,
                    xml_field(&text, "NextKeyMarker"),
                    xml_field(&text, "NextUploadIdMarker"),
                ) {
                    (true, Some(k), Some(u)) => {
                        markers = format!(
                            "&key-marker={}&upload-id-marker={}",
                            query_encode(&xml_unescape(k)),
                            query_encode(&xml_unescape(u))
                        )
                    }
                    _ => return Ok(found),
                }
            }
        };
        self.run("listing the open uploads of", &self.url, list)?
            .map(Some)
    }

    /// Aborts open multipart upload `u` (found by [`ObjectUrl::open_uploads`]); one already
    /// gone is fine.
    pub fn abort_upload(&self, u: &OpenUploadInfo) -> Result<()> {
        use object_store::multipart::MultipartStore;
        let Some(s3) = self.s3()? else {
            return Ok(());
        };
        let (key, url) = (self.key(&u.name), self.object_url(&u.name));
        match self.run("aborting the upload of", &url, async {
            s3.abort_multipart(&key, &u.id).await
        })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error("aborting the upload of", &url, e)),
        }
    }

    /// Stores the local file `path` as object `name`: one PUT up to [`PUT_PART`], a multipart
    /// upload (parts in flight, aborted on failure) above. The object appears whole or not at
    /// all. `progress` is called with each part's size as it is handed to the upload.
    pub fn put_file(&self, name: &str, path: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
        use std::io::Read;
        let client = self.client()?;
        let key = self.key(name);
        let url = self.object_url(name);
        let mut file = std::fs::File::open(path).map_err(|e| StoreError::io("opening", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| StoreError::io("inspecting", path, e))?
            .len();
        if len <= PUT_PART as u64 {
            let mut data = Vec::with_capacity(len as usize);
            file.read_to_end(&mut data)
                .map_err(|e| StoreError::io("reading", path, e))?;
            let n = data.len() as u64;
            self.put_bytes(name, data)?;
            progress(n);
            return Ok(());
        }
        if let Some(s3) = self.s3()? {
            let up = put_parts(&s3, &key, &url, path, &file, len, progress);
            return self.run("uploading", &url, up)?;
        }
        self.run("uploading", &url, async {
            let upload = client
                .put_multipart(&key)
                .await
                .map_err(|e| remote_error("starting the upload of", &url, e))?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, PUT_PART);
            let mut buf = Vec::with_capacity(PUT_PART);
            let sent: Result<()> = async {
                loop {
                    w.wait_for_capacity(PUTS_IN_FLIGHT)
                        .await
                        .map_err(|e| remote_error("uploading", &url, e))?;
                    buf.clear();
                    let n = (&mut file)
                        .take(PUT_PART as u64)
                        .read_to_end(&mut buf)
                        .map_err(|e| StoreError::io("reading", path, e))?;
                    if n == 0 {
                        return Ok(());
                    }
                    w.write(&buf);
                    progress(n as u64);
                }
            }
            .await;
            match sent {
                // The server drops the parts of an aborted upload (best effort: the error
                // that stopped it is the one reported).
                Err(e) => {
                    let _ = w.abort().await;
                    Err(e)
                }
                Ok(()) => w
                    .finish()
                    .await
                    .map(|_| ())
                    .map_err(|e| remote_error("completing the upload of", &url, e)),
            }
        })?
    }
}

/// The multipart upload of the local file `path` (`len` bytes) as `key` through S3's
/// multipart API: started, registered (so that [`abort_open_uploads`] can abort it from the
/// thread that handles an interruption), parts in flight, completed; aborted on failure.
async fn put_parts(
    s3: &Arc<object_store::aws::AmazonS3>,
    key: &ObjPath,
    url: &str,
    path: &Path,
    file: &std::fs::File,
    len: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    use object_store::multipart::{MultipartStore, PartId};
    use std::os::unix::fs::FileExt;
    let interrupted =
        || StoreError::Invalid(format!("{url}: not uploaded: the pack was interrupted"));
    {
        let mut u = uploads();
        if u.closed {
            return Err(interrupted());
        }
        u.starting += 1;
    }
    let started = s3.create_multipart(key).await;
    // Registered (or known to have failed) in the same step that ends its start, so that an
    // interruption waiting for `starting` to reach 0 finds every upload the server opened.
    let (token, closed) = {
        let mut u = uploads();
        u.starting -= 1;
        let token = started.as_ref().ok().map(|id| {
            u.next += 1;
            let token = u.next;
            u.open.push(OpenUpload {
                token,
                s3: s3.clone(),
                key: key.clone(),
                id: id.clone(),
                url: url.to_string(),
            });
            token
        });
        STARTED.notify_all();
        (token, u.closed)
    };
    let id = started.map_err(|e| remote_error("starting the upload of", url, e))?;
    if closed {
        // The interruption aborts it (it is on the list it takes).
        return Err(interrupted());
    }
    let token = token.expect("a started upload is registered");
    let parts = len.div_ceil(PUT_PART as u64) as usize;
    let sent: Result<Vec<PartId>> = stream::iter(0..parts)
        .map(|i| {
            let id = &id;
            async move {
                let at = i as u64 * PUT_PART as u64;
                let n = (len - at).min(PUT_PART as u64) as usize;
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, at)
                    .map_err(|e| StoreError::io("reading", path, e))?;
                let part = s3
                    .put_part(key, id, i, PutPayload::from(buf))
                    .await
                    .map_err(|e| remote_error("uploading", url, e))?;
                progress(n as u64);
                Ok(part)
            }
        })
        .buffered(PUTS_IN_FLIGHT)
        .try_collect()
        .await;
    let done = match sent {
        Ok(parts) => s3
            .complete_multipart(key, &id, parts)
            .await
            .map(|_| ())
            .map_err(|e| remote_error("completing the upload of", url, e)),
        Err(e) => Err(e),
    };
    // Whoever takes it off the list aborts it (the interruption may have, meanwhile).
    let mine = {
        let mut u = uploads();
        let before = u.open.len();
        u.open.retain(|o| o.token != token);
        u.open.len() < before
    };
    if done.is_err() && mine {
        // The server drops the parts (best effort: the error that stopped it is reported).
        let _ = s3.abort_multipart(key, &id).await;
    }
    done
}

/// `s` percent-encoded for a URL query (RFC 3986 unreserved characters kept).
fn query_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The few XML entities S3 uses in keys, decoded.
fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// Refuses to start without credentials rather than let the client wait on an instance
/// metadata service that is not there: S3 needs `AWS_ACCESS_KEY_ID` and
/// `AWS_SECRET_ACCESS_KEY`, a web identity or container credentials, `AWS_SKIP_SIGNATURE=true`
/// for public buckets, or `GRANARY_AWS_IMDS=1` on cloud instances whose role provides them.
fn check_aws_credentials(url: &str) -> Result<()> {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let key = set("AWS_ACCESS_KEY_ID");
    let secret = set("AWS_SECRET_ACCESS_KEY");
    if key != secret {
        let missing = if key {
            "AWS_SECRET_ACCESS_KEY"
        } else {
            "AWS_ACCESS_KEY_ID"
        };
        return Err(StoreError::Invalid(format!(
            "{url}: {missing} is not set (the other half of the key pair is)"
        )));
    }
    let other = [
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ]
    .iter()
    .any(|k| set(k));
    let anonymous = std::env::var("AWS_SKIP_SIGNATURE").is_ok_and(|v| v == "true" || v == "1");
    let imds = std::env::var("GRANARY_AWS_IMDS").is_ok_and(|v| v == "1");
    if key || other || anonymous || imds {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "{url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and \
         AWS_ENDPOINT_URL for a server other than AWS), AWS_SKIP_SIGNATURE=true for a public \
         bucket, or GRANARY_AWS_IMDS=1 to take them from the instance's role"
    )))
}

/// An object store error as one a user can act on: what failed, on which URL, and why.
pub fn remote_error(op: &'static str, url: &str, e: object_store::Error) -> StoreError {
    use object_store::Error as E;
    let text = e.to_string();
    // S3-style servers say what is wrong in an XML error body: its code decides.
    let code = xml_field(&text, "Code").unwrap_or_default();
    let said = match xml_field(&text, "Message") {
        Some(m) => format!("{code}: {m}"),
        None => text.clone(),
    };
    let detail = match (&e, code) {
        (_, "SignatureDoesNotMatch" | "InvalidAccessKeyId" | "InvalidToken" | "ExpiredToken")
        | (E::Unauthenticated { .. }, _) => format!(
            "the credentials were rejected: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY \
             (or the store's equivalents) ({said})"
        ),
        (_, "NoSuchBucket") => "the bucket does not exist: check the URL's bucket name".into(),
        (E::NotFound { .. }, _) | (_, "NoSuchKey") => {
            "not found: check the bucket and prefix (and that the dataset was packed there)".into()
        }
        (E::PermissionDenied { .. }, _) | (_, "AccessDenied") => format!(
            "access denied: the credentials may not do this; check their permissions ({said})"
        ),
        (_, "SlowDown" | "Throttling" | "RequestLimitExceeded" | "ServiceUnavailable") => {
            format!(
                "the server kept throttling the request (retried with backoff, then gave up; \
                 fewer readers or a larger --memory window make fewer requests): {said}"
            )
        }
        _ if timed_out(&e) => format!(
            "the store did not answer: no connection, or no byte, within the timeouts \
             ({CONNECT_TIMEOUT_ENV}, {REQUEST_TIMEOUT_ENV}), and retries ran out after \
             {RETRY_TIMEOUT_ENV} ({said})"
        ),
        _ => said,
    };
    let kind = match (&e, code) {
        (E::NotFound { .. }, _) | (_, "NoSuchKey" | "NoSuchBucket") => RemoteKind::NotFound,
        (_, "SignatureDoesNotMatch" | "InvalidAccessKeyId" | "InvalidToken" | "ExpiredToken")
        | (E::Unauthenticated { .. } | E::PermissionDenied { .. }, _)
        | (_, "AccessDenied") => RemoteKind::Denied,
        (_, "SlowDown" | "Throttling" | "RequestLimitExceeded" | "ServiceUnavailable")
        | (E::Generic { .. }, _) => RemoteKind::Transient,
        _ => RemoteKind::Failed,
    };
    StoreError::Remote {
        op,
        url: url.to_string(),
        detail,
        kind,
    }
}

/// True if `e` ends in a request that timed out or could not connect.
fn timed_out(e: &object_store::Error) -> bool {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<HttpError>() {
            return matches!(h.kind(), HttpErrorKind::Timeout | HttpErrorKind::Connect);
        }
        cause = c.source();
    }
    false
}

/// The text of `<name>...</name>` in an error message that carries an XML body.
fn xml_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = text.find(&open)? + open.len();
    let len = text[start..].find(&format!("</{name}>"))?;
    Some(text[start..start + len].trim())
}

/// Bytes `range` of the object at `key` (`url` for errors): exactly that many, and with
/// `object_size`, from an object of that size (the response names the object's whole size, so
/// one truncated or replaced since the snapshot was written shows whichever part is read).
async fn fetch_range(
    client: &dyn ObjectStore,
    key: &ObjPath,
    url: &str,
    range: Range<u64>,
    object_size: Option<u64>,
) -> Result<bytes::Bytes> {
    let res = get_range(client, key, url, range.clone(), object_size).await?;
    let got = res
        .bytes()
        .await
        .map_err(|e| remote_error("reading", url, e))?;
    let want = range.end - range.start;
    if got.len() as u64 != want {
        return Err(truncated(url, range.start, want, got.len()));
    }
    Ok(got)
}

/// [`fetch_range`] straight into `dst` (`range`'s length): the body's pieces are copied there
/// as they arrive, while they are still in the CPU's cache, instead of being gathered into a
/// new buffer of the range's size first (whose fresh pages cost a fault and a zeroing each,
/// then a second copy out of memory: a third of the reader's cycles on whole-chunk GETs).
async fn fetch_range_into(
    client: &dyn ObjectStore,
    key: &ObjPath,
    url: &str,
    range: Range<u64>,
    object_size: Option<u64>,
    dst: &mut [u8],
) -> Result<()> {
    let res = get_range(client, key, url, range.clone(), object_size).await?;
    let want = dst.len();
    let mut body = res.into_stream();
    let mut at = 0usize;
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| remote_error("reading", url, e))?;
        let end = at + piece.len();
        if end > want {
            return Err(StoreError::damaged(
                url,
                format!(
                    "answered more than the {want} bytes asked for at offset {}",
                    range.start
                ),
            ));
        }
        dst[at..end].copy_from_slice(&piece);
        at = end;
    }
    if at != want {
        return Err(truncated(url, range.start, want as u64, at));
    }
    Ok(())
}

/// Starts a ranged GET and checks the object's size against the snapshot's (`object_size`).
async fn get_range(
    client: &dyn ObjectStore,
    key: &ObjPath,
    url: &str,
    range: Range<u64>,
    object_size: Option<u64>,
) -> Result<object_store::GetResult> {
    let opts = GetOptions::default().with_range(Some(range));
    let res = client
        .get_opts(key, opts)
        .await
        .map_err(|e| remote_error("reading", url, e))?;
    if let Some(len) = object_size.filter(|&l| l != res.meta.size) {
        return Err(StoreError::damaged(
            url,
            format!(
                "object is {} bytes, the snapshot says {len} (truncated or replaced since the \
                 dataset was written)",
                res.meta.size
            ),
        ));
    }
    Ok(res)
}

fn truncated(url: &str, offset: u64, want: u64, got: usize) -> StoreError {
    StoreError::Damaged {
        path: PathBuf::from(url),
        detail: format!(
            "object ends early: asked for {want} bytes at offset {offset}, got {got} \
             (truncated or replaced since the snapshot was written)"
        ),
    }
}

/// The chunk files of a dataset under a URL prefix. Chunk sizes come from the snapshot, so
/// opening a chunk costs no request.
#[derive(Debug)]
pub struct ObjectChunks {
    url: Arc<ObjectUrl>,
    sizes: Vec<u64>,
}

impl ObjectChunks {
    /// Chunks under `url` with the sizes the snapshot records (indexed by chunk id).
    pub fn new(url: Arc<ObjectUrl>, sizes: Vec<u64>) -> Self {
        ObjectChunks { url, sizes }
    }

    /// The prefix.
    pub fn url(&self) -> &Arc<ObjectUrl> {
        &self.url
    }
}

impl ChunkStore for ObjectChunks {
    fn chunk_location(&self, id: u32) -> PathBuf {
        PathBuf::from(self.url.object_url(&granary_format::chunk_file_name(id)))
    }

    fn location(&self) -> String {
        self.url.url().to_string()
    }

    fn open_chunk(&self, id: u32) -> Result<Source> {
        let len = *self.sizes.get(id as usize).ok_or_else(|| {
            StoreError::Invalid(format!(
                "chunk {id} is not in the snapshot of {}",
                self.url.url
            ))
        })?;
        let name = granary_format::chunk_file_name(id);
        Ok(Arc::new(ObjectChunk {
            location: PathBuf::from(self.url.object_url(&name)),
            url: self.url.clone(),
            name,
            len,
        }))
    }

    fn list(&self) -> Result<Vec<(String, PathBuf)>> {
        Ok(self
            .url
            .list()?
            .into_iter()
            .map(|(name, _)| {
                let location = PathBuf::from(self.url.object_url(&name));
                (name, location)
            })
            .collect())
    }
}

/// One chunk object, read with ranged GETs.
#[derive(Debug)]
struct ObjectChunk {
    url: Arc<ObjectUrl>,
    name: String,
    location: PathBuf,
    len: u64,
}

impl ChunkSource for ObjectChunk {
    fn location(&self) -> &Path {
        &self.location
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_ranges(&self, reads: &mut [RangeRead<'_>]) -> Result<()> {
        // Every range clipped to the object and split into parts of at most GET_PART bytes;
        // all parts of the call in flight together (up to GETS_IN_FLIGHT).
        let mut parts: Vec<(Range<u64>, &mut [u8])> = Vec::new();
        for r in reads.iter_mut() {
            let end = (r.offset + r.buf.len() as u64).min(self.len);
            if r.offset + r.need as u64 > end {
                return Err(crate::file::eof_at(&self.location, self.len));
            }
            let mut buf = &mut r.buf[..(end - r.offset.min(end)) as usize];
            let mut at = r.offset;
            while !buf.is_empty() {
                let n = (buf.len() as u64).min(GET_PART) as usize;
                let (head, tail) = std::mem::take(&mut buf).split_at_mut(n);
                parts.push((at..at + n as u64, head));
                at += n as u64;
                buf = tail;
            }
        }
        if parts.is_empty() {
            return Ok(());
        }
        let client = self.url.client()?;
        let key = self.url.key(&self.name);
        let url = self.url.object_url(&self.name);
        let len = self.len;
        self.url
            .run("reading", &url, async {
                stream::iter(parts.into_iter().map(|(range, dst)| {
                    let (client, key, url) = (&client, &key, &url);
                    async move { fetch_range_into(&**client, key, url, range, Some(len), dst).await }
                }))
                .buffer_unordered(GETS_IN_FLIGHT)
                .try_collect::<Vec<()>>()
                .await
            })?
            .map(|_| ())
    }
}

/// granary's local cache directory: `$XDG_CACHE_HOME/granary`, else `~/.cache/granary`.
pub fn cache_home() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("granary")
}

/// The default staging directory of a write to `url` (spill logs, chunks in transit, resume
/// state): one per destination under [`cache_home`], so that a resumed write finds it again.
pub fn staging_dir(url: &str) -> PathBuf {
    let name: String = url
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '.' | '_' => c,
            _ => '_',
        })
        .collect();
    cache_home().join("uploads").join(name)
}

/// Where a dataset written to `out` goes: `None` for a local path, else the object store and
/// the local staging directory (`staging`, or [`staging_dir`]). Refuses read-only URLs, and a
/// staging directory for a local path.
pub fn write_destination(
    out: &str,
    staging: Option<&Path>,
) -> std::result::Result<Option<(ObjectUrl, PathBuf)>, String> {
    if !is_url(out) {
        return match staging {
            Some(_) => Err(format!(
                "a staging directory is for writing to an object store URL; {out} is a local path"
            )),
            None => Ok(None),
        };
    }
    let u = ObjectUrl::parse(out).map_err(|e| format!("{out}: {e}"))?;
    if !u.writable() {
        return Err(format!(
            "{out}: http(s) URLs are read-only; write to s3://, gs:// or az://"
        ));
    }
    let staging = staging.map_or_else(|| staging_dir(u.url()), Path::to_path_buf);
    Ok(Some((u, staging)))
}

/// Where fetched snapshots are kept: `GRANARY_SNAPSHOT_CACHE`, else `snapshots` in
/// [`cache_home`].
pub fn snapshot_cache_dir() -> PathBuf {
    match std::env::var_os("GRANARY_SNAPSHOT_CACHE").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => cache_home().join("snapshots"),
    }
}

/// The first 64 bytes of the snapshot of the dataset at `url` (one ranged GET), or an error
/// that says what the prefix holds instead (an upload that has not finished).
pub fn snapshot_head(url: &ObjectUrl) -> Result<bytes::Bytes> {
    use granary_format::{SNAPSHOT_FILE, SNAPSHOT_HEADER_LEN};
    let head = match url.get_range(SNAPSHOT_FILE, 0..SNAPSHOT_HEADER_LEN as u64) {
        Err(StoreError::Remote {
            kind: RemoteKind::NotFound,
            ..
        }) if url.list().is_ok_and(|l| {
            l.iter()
                .any(|(n, _)| granary_format::parse_chunk_file_name(n).is_some())
        }) =>
        {
            return Err(StoreError::Invalid(format!(
                "{}: holds chunks but no snapshot: an upload that has not finished (or was \
                 interrupted: `granary pack ... -o {} --resume` continues it)",
                url.url(),
                url.url()
            )));
        }
        r => r?,
    };
    Ok(head)
}

/// Fetches the snapshot of the dataset at `url` into the local cache unless the cached copy
/// is current (one 64-byte ranged GET to tell), and returns the cached file's path. A fetched
/// snapshot has every section's CRC checked before it is kept; it is written under a
/// temporary name and renamed, so concurrent openers (every loader worker) never see half.
pub fn fetch_snapshot(url: &ObjectUrl, dir: &Path) -> Result<PathBuf> {
    use granary_format::{snapshot_key, Snapshot, SNAPSHOT_FILE};
    let snap_url = url.object_url(SNAPSHOT_FILE);
    let head = snapshot_head(url)?;
    let (id, crc) = snapshot_key(&head).map_err(|e| StoreError::format(&snap_url, e))?;
    let cached = dir.join(format!("{}-{crc:08x}.gsnap", DatasetId(id)));
    if cached.is_file() {
        return Ok(cached);
    }
    crate::snapcache::evict(dir, crate::snapcache::cache_budget(), &cached);
    let bytes = url.get(SNAPSHOT_FILE)?;
    let key = snapshot_key(&bytes).map_err(|e| StoreError::format(&snap_url, e))?;
    if key != (id, crc) {
        return Err(StoreError::damaged(
            &snap_url,
            "the snapshot was replaced while it was fetched; open the dataset again",
        ));
    }
    let snap = Snapshot::open(&bytes[..]).map_err(|e| StoreError::format(&snap_url, e))?;
    if let Some(e) = snap.check_sections().into_iter().next() {
        return Err(StoreError::format(&snap_url, e));
    }
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io("creating", dir, e))?;
    let tmp = dir.join(format!(
        ".{}-{crc:08x}.{}.tmp",
        DatasetId(id),
        std::process::id()
    ));
    // Not fsynced: a cached copy lost to a crash is fetched again.
    granary_format::local::write_atomic(&cached, &tmp, false, |w| {
        std::io::Write::write_all(w, &bytes)
    })
    .map_err(|e| StoreError::io("caching the snapshot in", &tmp, e))?;
    Ok(cached)
}
