//! A tunnel's idleness (HAProxy's `timeout tunnel`): a TCP-mode connection
//! or an upgraded HTTP connection with no traffic either way for
//! `tunnel_timeout` is closed, so a vanished peer (NAT expiry, a client
//! that lost power) does not hold a connection slot and two fds forever.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::Instant;

/// When bytes last moved, either way.
pub struct Activity {
    origin: Instant,
    /// Nanoseconds since `origin`.
    last: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            origin: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl Activity {
    pub fn touch(&self) {
        let now = self.origin.elapsed().as_nanos() as u64;
        self.last.store(now, Ordering::Relaxed);
    }

    /// Resolves once nothing moved for `limit`.
    pub async fn idle_for(&self, limit: Duration) {
        loop {
            let last = self.origin + Duration::from_nanos(self.last.load(Ordering::Relaxed));
            let until = last + limit;
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }
}

/// A reader that marks `activity` whenever bytes arrive.
pub struct Observed<R> {
    inner: R,
    activity: Arc<Activity>,
}

impl<R> Observed<R> {
    pub fn new(inner: R, activity: Arc<Activity>) -> Observed<R> {
        Observed { inner, activity }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Observed<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}
