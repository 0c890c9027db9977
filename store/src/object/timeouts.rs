//! How long granary waits on an object store, and the warnings while it waits.

use std::future::Future;
use std::time::Duration;

use crate::config::{REQUEST_TIMEOUT_ENV, RETRY_TIMEOUT_ENV};

/// The longest pause between two attempts of one request (the client's backoff doubles from
/// 100 ms up to this).
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(15);

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
