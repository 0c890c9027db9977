//! `granary serve`: this node's tier, read-only over HTTP, for the other nodes of a job.
//!
//! `GET` or `HEAD /<dataset id>/chunk-NNNNNNNN.gchunk`, with an optional single byte range
//! (`Range: bytes=a-b`, `bytes=a-`, `bytes=-n`). Only the dataset ids of the datasets named on
//! the command line are served, only chunk copies (no hot chunks, index, scores or lock file),
//! and nothing is ever written. Every request must carry a proof made with the job's secret
//! (`granary::auth`): without one it is refused (401, 403), and the refusal logged with the
//! caller's address. Clients check every copy against the snapshot (size and whole-file CRC),
//! so the server does not: a damaged copy is rejected where it is used.

use std::collections::HashMap;
use std::net::TcpListener;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};

/// Serve this node's local tier to the other nodes of a training job (read-only HTTP).
#[derive(clap::Args)]
#[command(after_help = "Examples:
  granary serve train.granary --cache-dir /ssd/gcache --listen 10.0.0.7:7070
  # every rank of a 4-node job (the same list everywhere; its node follows from its rank):
  granary read train.granary --cache-dir /ssd/gcache --cache-size 200GiB \\
      --peers 10.0.0.5:7070,10.0.0.6:7070,10.0.0.7:7070,10.0.0.8:7070 --rank R --world-size 4

The server answers GET and HEAD for /<dataset id>/chunk-NNNNNNNN.gchunk (single byte ranges
supported) from the tier directory of each dataset named, and nothing else: no other dataset,
no other file, no writes. Only the job's own readers are answered: every request carries an
HMAC-SHA256 proof made with the job's secret (--secret-file, or GRANARY_PEER_SECRET; readers
take the same: `granary read --peer-secret-file`, or the variable), bound to the request and to
a 60 s window and never accepted twice; any other request is refused (401 without a proof, 403
with a wrong, stale or replayed one) and logged with the caller's address. The bytes travel in
the clear unless --tls-cert/--tls-key are given (readers then pass --peer-ca): bind a plain
server to the job's internal network. Readers check every chunk they
receive against their snapshot (size and CRC-32), so a damaged or foreign copy is rejected and
read from origin storage instead. A secret: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'
(Python: granary.job_secret() makes one on rank 0 and shares it).

With --listen HOST:0 a free port is chosen; the address is printed on stdout as
`listening on http://HOST:PORT`. The server runs until it is stopped (SIGINT or SIGTERM).")]
pub struct Args {
    /// Datasets whose tiers are served (a snapshot's dataset id names its tier).
    #[arg(required = true, value_name = "DATASET")]
    pub datasets: Vec<PathBuf>,
    /// The tier directory, as given to `granary read --cache-dir` on this node.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: PathBuf,
    /// Address to listen on, HOST:PORT (port 0: a free one, printed on stdout).
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// Threads answering requests.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// File holding the job's secret (default: the GRANARY_PEER_SECRET variable). Requests
    /// without a proof made with it are refused.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Answer every request that reaches the port, without a secret (a network where only the
    /// job's nodes can connect). Without a secret, serve refuses to start unless this is given.
    #[arg(long, conflicts_with = "secret_file")]
    pub insecure: bool,
    /// Serve over TLS with this certificate chain (PEM; its first certificate names this
    /// node's address), so that the bytes cannot be read in transit. Readers then need
    /// --peer-ca with the certificate that signed it.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The TLS side of the server, from a certificate chain and its key (PEM files).
fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| anyhow::anyhow!("reading the certificate {}: {e}", cert.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no certificate in it",
        cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("reading the private key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the certificate and the key do not go together")?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// What the server may serve: each dataset id (hex) and its tier directory; who it answers.
struct Served {
    tiers: HashMap<String, PathBuf>,
    /// `None`: --insecure.
    verifier: Option<granary::auth::Verifier>,
    refused: std::sync::atomic::AtomicU64,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let secret = if a.insecure {
        None
    } else {
        Some(super::job_secret(a.secret_file.as_deref())?.ok_or_else(|| {
            anyhow::anyhow!(
                "no secret: give the job's secret with --secret-file FILE or GRANARY_PEER_SECRET \
                 (readers take the same), or --insecure to answer anyone who reaches the port"
            )
        })?)
    };
    let mut tiers = HashMap::new();
    for d in &a.datasets {
        let ds = super::open_dataset(d)?;
        let id = ds.snapshot().dataset_id();
        let dir = granary::LocalTier::tier_dir(&a.cache_dir, &id);
        let hex = granary::DatasetId(id).to_string();
        tiers.insert(hex, dir);
    }
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(tls_acceptor(c, k)?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listener =
        TcpListener::bind(&a.listen).with_context(|| format!("cannot listen on {}", a.listen))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads.max(1))
        .thread_name("granary-serve")
        .enable_io()
        .build()
        .context("starting the server's runtime")?;
    let served = Arc::new(Served {
        tiers,
        verifier: secret.map(granary::auth::Verifier::new),
        refused: Default::default(),
    });
    eprintln!(
        "granary serve: the tiers of {} dataset(s) under {}, read-only, at {scheme}://{addr}{}",
        served.tiers.len(),
        a.cache_dir.display(),
        if served.verifier.is_some() {
            " (requests must be signed with the job's secret)"
        } else {
            " (--insecure: answering anyone who reaches the port)"
        }
    );
    println!("listening on {scheme}://{addr}");
    use std::io::Write;
    std::io::stdout().flush()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        loop {
            let (stream, from) = match listener.accept().await {
                Ok(s) => s,
                // Out of file descriptors or a connection reset before it was accepted: the
                // next one may work.
                Err(e) => {
                    eprintln!("granary serve: accepting a connection failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let served = served.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let served = served.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(answer(&served, req, from).await)
                    }
                });
                let http = hyper::server::conn::http1::Builder::new();
                // A client that goes away mid-response is its own business.
                match tls {
                    None => {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    }
                    Some(tls) => match tls.accept(stream).await {
                        Ok(s) => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                                .await;
                        }
                        Err(e) => eprintln!("granary serve: TLS handshake with {from} failed: {e}"),
                    },
                }
            });
        }
        #[allow(unreachable_code)]
        Ok::<_, std::io::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

/// The tier file a request names, if it is one the server may serve.
fn file_for(served: &Served, path: &str) -> Result<PathBuf, &'static str> {
    let (id, name) = granary::serving::chunk_request(path)?;
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
        header(hyper::header::RANGE.as_str()),
        header(granary::auth::AUTH_HEADER),
        granary::auth::unix_now(),
    );
    let why = checked.err()?;
    let n = served
        .refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if n <= 20 || n.is_multiple_of(1000) {
        eprintln!(
            "granary serve: refused {} {} from {from}: {why} ({n} refused so far)",
            req.method(),
            req.uri().path()
        );
    }
    let status = StatusCode::from_u16(why.status()).expect("401 or 403");
    let mut r = reply(status, format!("refused: {why}\n"));
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            "granary-peer-v1".parse().expect("valid"),
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
                .insert(hyper::header::ALLOW, "GET, HEAD".parse().expect("valid"));
            return r;
        }
    };
    let path = match file_for(served, req.uri().path()) {
        Ok(p) => p,
        Err(why) => return reply(StatusCode::NOT_FOUND, why),
    };
    let range = req
        .headers()
        .get(hyper::header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // File reads block: off the runtime's threads.
    let read = tokio::task::spawn_blocking(move || read_file(&path, range.as_deref(), head)).await;
    match read {
        Ok(r) => r,
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading failed: {e}\n"),
        ),
    }
}

fn read_file(path: &std::path::Path, range: Option<&str>, head: bool) -> Response<Full<Bytes>> {
    // The tier replaces and removes files whole; an open file keeps its bytes even if it is
    // evicted while being read.
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return reply(StatusCode::NOT_FOUND, "not found: not in this tier\n")
        }
        Err(e) => {
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("opening failed: {e}\n"),
            )
        }
    };
    let size = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => {
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("inspecting failed: {e}\n"),
            )
        }
    };
    let (status, (start, end)) = match granary::serving::byte_range(range, size) {
        Ok(None) => (StatusCode::OK, (0, size)),
        Ok(Some(r)) => (StatusCode::PARTIAL_CONTENT, r),
        Err(granary::serving::Unsatisfiable) => {
            let mut r = reply(StatusCode::RANGE_NOT_SATISFIABLE, "");
            r.headers_mut().insert(
                hyper::header::CONTENT_RANGE,
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
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading failed: {e}\n"),
            );
        }
        Bytes::from(buf)
    };
    let mut r = reply(status, body);
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        "application/octet-stream".parse().expect("valid"),
    );
    h.insert(
        hyper::header::ACCEPT_RANGES,
        "bytes".parse().expect("valid"),
    );
    if head {
        h.insert(
            hyper::header::CONTENT_LENGTH,
            (end - start).to_string().parse().expect("valid"),
        );
    }
    if status == StatusCode::PARTIAL_CONTENT {
        h.insert(
            hyper::header::CONTENT_RANGE,
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
        };
        assert_eq!(
            file_for(&served, "/ab/chunk-00000007.gchunk"),
            Ok(PathBuf::from("/t/ab/chunk-00000007.gchunk"))
        );
        // Another dataset's id; names that are not chunk copies are refused by
        // `granary::serving::chunk_request` (its own test lists them).
        for bad in [
            "/cd/chunk-00000007.gchunk",
            "/ab/index",
            "/ab/../ab/chunk-00000007.gchunk",
        ] {
            assert!(file_for(&served, bad).is_err(), "{bad}");
        }
    }
}
