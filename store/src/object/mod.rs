//! Datasets in object stores: `s3://`, `gs://`, `az://` and read-only `http(s)://` URLs,
//! through the `object_store` crate (ranged GETs, retries with backoff, the configuration
//! variables users already set: `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...).
//!
//! A dataset at a URL is the same directory of immutable files as on disk, as objects under a
//! prefix. Its snapshot is cached locally ([`snapcache`]); chunks are read with ranged GETs
//! ([`ObjectChunks`]), many in flight, sizes taken from the snapshot (no HEAD per chunk).
//! Everything the local reader checks is checked the same way: a truncated or replaced object
//! is an error naming its URL, never short or wrong bytes.
//!
//! The async runtime and the HTTP clients belong to one process: a process forked after using
//! them (a PyTorch `DataLoader` worker) starts its own on first use and never touches the
//! parent's, whose threads do not exist in the child.

mod chunks;
mod errors;
mod ops;
pub mod snapcache;
mod uploads;
mod url;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{cache_home, REQUEST_TIMEOUT_ENV, RETRY_TIMEOUT_ENV};
pub use crate::config::{parse_seconds, Timeouts};
use crate::error::{Result, StoreError};
pub use chunks::ObjectChunks;
pub(crate) use ops::Sized;
pub use uploads::{abort_open_uploads, OpenUploadInfo};
pub(crate) use url::PeerLink;
pub use url::{is_url, looks_like_url, ObjectUrl};

/// URL schemes granary reads (and, but for `http(s)`, writes).
pub const SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https"];

/// Largest single ranged GET: a whole-chunk read of a default 32 MiB chunk is one GET; larger
/// ranges are split into parts of this size, fetched concurrently.
pub const GET_PART: u64 = 32 << 20;

/// GETs in flight per read call (each reader thread issues its own).
const GETS_IN_FLIGHT: usize = 16;

/// Parts of a multipart upload; files up to this size are one PUT.
const PUT_PART: usize = 16 << 20;

/// Multipart upload parts in flight per upload.
const PUTS_IN_FLIGHT: usize = 4;

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

/// Runs `f` to completion on this process's runtime (started on first use, and again in a
/// forked child). Must not be called from inside an async task.
fn block_on<F: Future>(f: F) -> Result<F::Output> {
    static RT: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);
    let rt = per_process(&RT, || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("granary-net")
            .enable_all()
            .build()
            .map_err(|e| StoreError::io("starting the network runtime", "(runtime)", e))?;
        Ok(Arc::new(rt))
    })?;
    Ok(rt.block_on(f))
}

/// `slot`'s value for this process, made by `make` on first use in it. A forked child makes its
/// own: the parent's (a runtime, connections) has none of its threads there, and dropping it
/// would wait for them forever, so it is left alone.
fn per_process<T: Clone>(
    slot: &Mutex<Option<(u32, T)>>,
    make: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let pid = std::process::id();
    let mut g = slot.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_ref() {
        Some((p, v)) if *p == pid => Ok(v.clone()),
        _ => {
            std::mem::forget(g.take());
            let v = make()?;
            Ok(g.insert((pid, v)).1.clone())
        }
    }
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
