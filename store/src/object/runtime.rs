//! This process's async runtime (one per process; a forked child starts its own).

use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::error::{Result, StoreError};

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
