//! Building this process's client for a URL: credentials, timeouts, retries, signing.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use super::ObjectUrl;
use crate::config::MAX_BACKOFF;
use crate::error::{Result, StoreError};

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
pub(super) struct Clients {
    pub(super) store: Arc<dyn ObjectStore>,
    /// The same client as S3, for `s3://` URLs.
    pub(super) s3: Option<Arc<object_store::aws::AmazonS3>>,
}

impl ObjectUrl {
    /// This process's client for the store.
    pub fn client(&self) -> Result<Arc<dyn ObjectStore>> {
        Ok(self.clients()?.store)
    }

    /// This process's S3 client, for an `s3://` URL (multipart uploads it can abort from
    /// anywhere, and the listing of open ones).
    pub(super) fn s3(&self) -> Result<Option<Arc<object_store::aws::AmazonS3>>> {
        Ok(self.clients()?.s3)
    }

    pub(super) fn clients(&self) -> Result<Clients> {
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
        let mut s3 = None;
        let store: Arc<dyn ObjectStore> = match self.scheme() {
            "s3" | "s3a" => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as C};
                check_aws_credentials(&self.url, self.aws_imds)?;
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
                Arc::new(b.build().map_err(fail)?)
            }
        };
        Ok(Clients { store, s3 })
    }
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
