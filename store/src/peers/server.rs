//! `granary serve`: this node's tier, read-only over HTTP, for the other nodes of a job.
//!
//! `GET` or `HEAD /<dataset id>/chunk-NNNNNNNN-<digest>.gchunk`, with an optional single byte
//! range ([`super::request`]). Only the given datasets' chunk copies are served, nothing is
//! written. A request without a proof made with the job's secret ([`crate::auth`]) is refused
//! (401, 403) and logged with the caller's address. Clients check every copy, the server not.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    HeaderValue, ACCEPT_RANGES, ALLOW, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE,
    WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::auth::{Secret, Verifier};
use crate::error::{Result, StoreError};

fn invalid(msg: String) -> StoreError {
    StoreError::Invalid(msg)
}

/// What a server serves, and to whom.
pub struct ServeConfig {
    /// Each dataset id (hex) served, and its tier directory.
    pub tiers: HashMap<String, PathBuf>,
    /// The job's secret, whose proofs every request must carry; `None` answers anyone.
    pub secret: Option<Secret>,
    /// A certificate chain and its private key (PEM files): serve over TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub threads: usize,
}

/// A bound server, ready to serve ([`PeerServer::serve`]).
pub struct PeerServer {
    listener: TcpListener,
    addr: SocketAddr,
    rt: tokio::runtime::Runtime,
    served: Arc<Served>,
}

impl PeerServer {
    /// Listens on `listen` (`HOST:PORT`; port 0: a free one) to serve what `cfg` says.
    pub fn bind(listen: &str, cfg: ServeConfig) -> Result<PeerServer> {
        let tls = cfg.tls.as_ref().map(|(c, k)| tls_acceptor(c, k));
        let tls = tls.transpose()?;
        let listener =
            TcpListener::bind(listen).map_err(|e| StoreError::io("listening on", listen, e))?;
        let addr = listener
            .local_addr()
            .and_then(|a| listener.set_nonblocking(true).map(|()| a))
            .map_err(|e| StoreError::io("listening on", listen, e))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.threads.max(1))
            .thread_name("granary-serve")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| StoreError::io("starting the server's runtime", listen, e))?;
        let served = Arc::new(Served {
            tiers: cfg.tiers,
            verifier: cfg.secret.map(Verifier::new),
            refused: Default::default(),
            tls,
        });
        Ok(PeerServer {
            listener,
            addr,
            rt,
            served,
        })
    }

    /// Where it listens: `http://HOST:PORT`, or `https://` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.served.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// True when requests must carry the job's proof.
    pub fn checks_proofs(&self) -> bool {
        self.served.verifier.is_some()
    }

    /// Serves until the process is stopped; returns only if the listener fails.
    pub fn serve(self) -> Result<()> {
        let (listener, served) = (self.listener, self.served);
        let r: std::io::Result<()> = self.rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            loop {
                let (stream, from) = match listener.accept().await {
                    Ok(s) => s,
                    // Out of descriptors or a connection reset: the next one may work.
                    Err(e) => {
                        log::warn!("serve: accepting a connection failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(stream, from, served.clone()));
            }
        });
        r.map_err(|e| StoreError::io("serving on", self.addr.to_string(), e))
    }
}

/// Answers the requests of one connection.
async fn connection(stream: tokio::net::TcpStream, from: SocketAddr, served: Arc<Served>) {
    let tls = served.tls.clone();
    let svc = hyper::service::service_fn(move |req| {
        let served = served.clone();
        async move { Ok::<_, std::convert::Infallible>(answer(&served, req, from).await) }
    });
    let http = hyper::server::conn::http1::Builder::new();
    let _ = match tls {
        None => http.serve_connection(TokioIo::new(stream), svc).await,
        Some(tls) => match tls.accept(stream).await {
            Ok(s) => http.serve_connection(TokioIo::new(s), svc).await,
            Err(e) => return log::warn!("serve: TLS handshake with {from} failed: {e}"),
        },
    };
}

fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<std::result::Result<_, _>>())
        .map_err(|e| invalid(format!("reading the certificate {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!("{}: no certificate in it", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| invalid(format!("reading the private key {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            invalid(format!(
                "the certificate and the key do not go together: {e}"
            ))
        })?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// What the server may serve ([`ServeConfig::tiers`]), who it answers (`None`: --insecure),
/// and over TLS or not.
struct Served {
    tiers: HashMap<String, PathBuf>,
    verifier: Option<Verifier>,
    refused: std::sync::atomic::AtomicU64,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

/// A 500 answer: `what` failed with `e`.
fn failed(what: &str, e: impl std::fmt::Display) -> Response<Full<Bytes>> {
    reply(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{what} failed: {e}\n"),
    )
}

/// The tier file a request names, if it is one the server may serve.
fn file_for(served: &Served, path: &str) -> std::result::Result<PathBuf, &'static str> {
    let (id, name) = super::request::chunk_request(path)?;
    match served.tiers.get(id) {
        Some(dir) => Ok(dir.join(name)),
        None => Err("not found: this server does not serve that dataset\n"),
    }
}

/// The refusal of `req` if it lacks the job's proof (logged with `from`: the first 20, then
/// every 1000th).
fn refusal(
    served: &Served,
    req: &Request<hyper::body::Incoming>,
    from: std::net::SocketAddr,
) -> Option<Response<Full<Bytes>>> {
    let v = served.verifier.as_ref()?;
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    let checked = v.check(
        req.method().as_str(),
        req.uri().path(),
        header(RANGE.as_str()),
        header(crate::auth::AUTH_HEADER),
        crate::auth::unix_now(),
    );
    let why = checked.err()?;
    let n = served
        .refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if n <= 20 || n.is_multiple_of(1000) {
        log::warn!(
            "serve: refused {} {} from {from}: {why} ({n} refused so far)",
            req.method(),
            req.uri().path()
        );
    }
    let status = StatusCode::from_u16(why.status()).expect("401 or 403");
    let mut r = reply(status, format!("refused: {why}\n"));
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("granary-peer-v1"),
        );
    }
    Some(r)
}

async fn answer(
    served: &Served,
    req: Request<hyper::body::Incoming>,
    from: std::net::SocketAddr,
) -> Response<Full<Bytes>> {
    if let Some(r) = refusal(served, &req, from) {
        return r;
    }
    let head = match *req.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ => {
            let mut r = reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "read-only: GET and HEAD only\n",
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
    };
    let path = match file_for(served, req.uri().path()) {
        Ok(p) => p,
        Err(why) => return reply(StatusCode::NOT_FOUND, why),
    };
    let range = req
        .headers()
        .get(RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // File reads block: off the runtime's threads.
    let read = tokio::task::spawn_blocking(move || read_file(&path, range.as_deref(), head)).await;
    read.unwrap_or_else(|e| failed("reading", e))
}

fn read_file(path: &Path, range: Option<&str>, head: bool) -> Response<Full<Bytes>> {
    // The tier replaces and removes files whole: an open file keeps its bytes.
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return reply(StatusCode::NOT_FOUND, "not found: not in this tier\n")
        }
        Err(e) => return failed("opening", e),
    };
    let size = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return failed("inspecting", e),
    };
    let (status, (start, end)) = match super::request::byte_range(range, size) {
        Ok(None) => (StatusCode::OK, (0, size)),
        Ok(Some(r)) => (StatusCode::PARTIAL_CONTENT, r),
        Err(super::request::Unsatisfiable) => {
            let mut r = reply(StatusCode::RANGE_NOT_SATISFIABLE, "");
            r.headers_mut().insert(
                CONTENT_RANGE,
                format!("bytes */{size}").parse().expect("valid"),
            );
            return r;
        }
    };
    let body = if head {
        Bytes::new()
    } else {
        let mut buf = vec![0u8; (end - start) as usize];
        if let Err(e) = f.read_exact_at(&mut buf, start) {
            // Cut short under us (it cannot be replaced in place): say so rather than send less.
            return failed("reading", e);
        }
        Bytes::from(buf)
    };
    let mut r = reply(status, body);
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if head {
        h.insert(CONTENT_LENGTH, HeaderValue::from(end - start));
    }
    if status == StatusCode::PARTIAL_CONTENT {
        h.insert(
            CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", end - 1)
                .parse()
                .expect("valid"),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_chunk_copies_of_the_datasets_served_are_files() {
        let served = Served {
            tiers: [("ab".to_string(), PathBuf::from("/t/ab"))].into(),
            verifier: None,
            refused: Default::default(),
            tls: None,
        };
        let copy = crate::copy_file_name(7, &[0x11; 16]);
        assert_eq!(
            file_for(&served, &format!("/ab/{copy}")),
            Ok(PathBuf::from(format!("/t/ab/{copy}")))
        );
        // Another dataset's id; names that are not chunk copies are refused by
        // `super::request::chunk_request` (its own test lists them).
        for bad in [
            format!("/cd/{copy}"),
            "/ab/index".into(),
            format!("/ab/../ab/{copy}"),
            "/ab/chunk-00000007.gchunk".into(),
        ] {
            assert!(file_for(&served, &bad).is_err(), "{bad}");
        }
    }
}
