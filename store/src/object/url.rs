//! Object store URLs, [`ObjectUrl`] (a dataset prefix in a store), and this process's client
//! for one: credentials, timeouts, retries, signing.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;

use super::{block_on, watched, SCHEMES};
use crate::config::{StoreConfig, Timeouts, MAX_BACKOFF};
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
    /// Set for a peer's tier (`granary serve`): every request bounded by `timeouts.request`,
    /// never retried, nothing logged while waiting, signed with the job's secret.
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

    /// Runs `fut`, an operation on `url`, on this process's runtime, warning while it takes
    /// long (a peer's request is bounded instead).
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

/// A store's multipart uploads.
pub(super) trait Multipart: MultipartStore + std::fmt::Debug {}
impl<T: MultipartStore + std::fmt::Debug> Multipart for T {}

/// One process's clients of a store.
#[derive(Debug, Clone)]
pub(super) struct Clients {
    pub(super) store: Arc<dyn ObjectStore>,
    /// The same client, for the stores that take multipart uploads (which granary can abort
    /// from anywhere).
    pub(super) multipart: Option<Arc<dyn Multipart>>,
    /// The same client as S3, for `s3://` URLs (the listing of open uploads).
    pub(super) s3: Option<Arc<object_store::aws::AmazonS3>>,
}

impl ObjectUrl {
    /// This process's client for the store.
    pub(super) fn client(&self) -> Result<Arc<dyn ObjectStore>> {
        Ok(self.clients()?.store)
    }

    /// This process's clients for the store.
    pub(super) fn clients(&self) -> Result<Clients> {
        super::per_process(&self.client, || self.build())
    }

    fn build(&self) -> Result<Clients> {
        let host = self.url.split('/').nth(2).unwrap_or_default();
        let bucket_url = format!("{}://{host}", self.scheme());
        let fail = |e: object_store::Error| {
            StoreError::Invalid(format!("{}: cannot configure the client: {e}", self.url))
        };
        use object_store::ClientConfigKey as K;
        let t = self.timeouts;
        // The client's whole-request limit (30 s by default) would cut off a large GET on a
        // slow link and retry it forever; progress is watched by `read_timeout` instead, and
        // the whole request is only bounded for a peer.
        let whole = if self.peer.is_some() {
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
            max_retries: if self.peer.is_some() { 0 } else { 100 },
            retry_timeout: t.retry,
            backoff: object_store::BackoffConfig {
                max_backoff: MAX_BACKOFF,
                ..Default::default()
            },
        };
        // The cloud stores' builders take the same settings by the same calls.
        macro_rules! cloud {
            ($builder:ty, $key:path) => {
                client
                    .into_iter()
                    .fold(<$builder>::from_env(), |b, (k, v)| {
                        b.with_config($key(k), v)
                    })
                    .with_url(&bucket_url)
                    .with_retry(retry)
                    .build()
                    .map_err(fail)?
            };
        }
        use object_store::{aws, azure, gcp};
        let mut s3 = None;
        let (store, multipart) = match self.scheme() {
            "s3" | "s3a" => {
                check_aws_credentials(&self.url, self.aws_imds)?;
                let c = Arc::new(cloud!(aws::AmazonS3Builder, aws::AmazonS3ConfigKey::Client));
                s3 = Some(c.clone());
                both(c)
            }
            "gs" => both(Arc::new(cloud!(
                gcp::GoogleCloudStorageBuilder,
                gcp::GoogleConfigKey::Client
            ))),
            "az" | "abfs" | "abfss" => both(Arc::new(cloud!(
                azure::MicrosoftAzureBuilder,
                azure::AzureConfigKey::Client
            ))),
            scheme => {
                // An http:// URL asks for plain HTTP; the client refuses it otherwise.
                let mut options = object_store::ClientOptions::new()
                    .with_allow_http(scheme == "http")
                    .with_connect_timeout(t.connect)
                    .with_read_timeout(t.request)
                    .with_timeout(whole);
                if let Some(pem) = self.peer.as_ref().and_then(|p| p.ca.as_ref()) {
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
                if let Some(secret) = self.peer.as_ref().and_then(|p| p.secret.as_ref()) {
                    b = b.with_http_connector(Signing(secret.clone()));
                }
                (
                    Arc::new(b.build().map_err(fail)?) as Arc<dyn ObjectStore>,
                    None,
                )
            }
        };
        Ok(Clients {
            store,
            multipart,
            s3,
        })
    }
}

/// A client as the store and as its multipart uploads.
fn both<T: ObjectStore + Multipart>(
    c: Arc<T>,
) -> (Arc<dyn ObjectStore>, Option<Arc<dyn Multipart>>) {
    (c.clone(), Some(c))
}

/// Refuses to start without credentials rather than let the client wait on an instance
/// metadata service that is not there: S3 needs `AWS_ACCESS_KEY_ID` and
/// `AWS_SECRET_ACCESS_KEY`, a web identity or container credentials, `AWS_SKIP_SIGNATURE=true`
/// for public buckets, or [`crate::StoreConfig::aws_imds`] (`GRANARY_AWS_IMDS=1`) on cloud
/// instances whose role provides them.
pub(super) fn check_aws_credentials(url: &str, imds: bool) -> Result<()> {
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
    if key || other || anonymous || imds {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "{url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and \
         AWS_ENDPOINT_URL for a server other than AWS), AWS_SKIP_SIGNATURE=true for a public \
         bucket, or GRANARY_AWS_IMDS=1 to take them from the instance's role"
    )))
}
