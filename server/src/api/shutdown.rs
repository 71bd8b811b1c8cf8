//! The end of the shutdown grace period, as every in-flight response sees it.
//! On SIGTERM the server stops accepting connections and lets running requests
//! finish; when the grace period ends, [`Shutdown::cut_now`] tells each one
//! left to end itself — a stream with a final chunk that carries a
//! finish_reason and the error, then `[DONE]`; a whole answer with 503 — and
//! counts them, so the process can exit non-zero when work was cut.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

/// The finish_reason of a stream cut short: clients read "length" as "the
/// answer is truncated", which it is; the error beside it says why.
pub const CUT_FINISH_REASON: &str = "length";

#[derive(Clone)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

struct Inner {
    cut: watch::Sender<bool>,
    cut_requests: AtomicUsize,
}

impl Default for Shutdown {
    fn default() -> Shutdown {
        Shutdown { inner: Arc::new(Inner { cut: watch::Sender::new(false), cut_requests: AtomicUsize::new(0) }) }
    }
}

impl Shutdown {
    /// Ends the grace period: every request still running is cut.
    pub fn cut_now(&self) {
        self.inner.cut.send_replace(true);
    }

    pub fn is_cut(&self) -> bool {
        *self.inner.cut.borrow()
    }

    /// Resolves once the grace period has ended (at once if it has).
    pub async fn cut(&self) {
        let mut rx = self.inner.cut.subscribe();
        // The sender lives in `self`, so the channel cannot close while waiting.
        let _ = rx.wait_for(|cut| *cut).await;
    }

    /// Counts one request cut short.
    pub fn record_cut(&self) {
        self.inner.cut_requests.fetch_add(1, Ordering::SeqCst);
    }

    /// Requests cut short so far.
    pub fn cut_requests(&self) -> usize {
        self.inner.cut_requests.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_web::test]
    async fn waiters_wake_when_the_grace_period_ends() {
        let s = Shutdown::default();
        assert!(!s.is_cut());
        let waiter = actix_web::rt::spawn({
            let s = s.clone();
            async move { s.cut().await }
        });
        s.cut_now();
        waiter.await.unwrap();
        assert!(s.is_cut());
        s.cut().await;
    }
}
