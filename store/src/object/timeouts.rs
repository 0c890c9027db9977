//! The warnings while granary waits on an object store (how long it waits: [`Timeouts`]).

use std::future::Future;
use std::time::Duration;

use crate::config::{Timeouts, REQUEST_TIMEOUT_ENV, RETRY_TIMEOUT_ENV};

/// `fut`, an operation `what` on `url`, with a warning each time it has waited another
/// doubling interval (the first after 10 s, or the request timeout if shorter).
pub(super) async fn watched<F: Future>(what: &str, url: &str, t: Timeouts, fut: F) -> F::Output {
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
