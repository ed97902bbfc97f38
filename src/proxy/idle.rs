//! A tunnel's idleness (HAProxy's `timeout tunnel`): a TCP-mode connection
//! or an upgraded HTTP connection with no traffic either way for
//! `tunnel_timeout` is closed, so a vanished peer (NAT expiry, a client
//! that lost power) does not hold a connection slot and two fds forever.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};

/// Checks per `tunnel_timeout`: a quiet connection is closed after between
/// one and one and a quarter of it.
const CHECKS: u32 = 4;

/// Whether bytes moved, either way, since the idle clock last looked.
/// A flag, not a time: marking it is one store, where a clock read at
/// every burst cost a TCP-mode round trip a tenth of its instructions.
#[derive(Default)]
pub struct Activity {
    moved: AtomicBool,
}

impl Activity {
    pub fn touch(&self) {
        self.moved.store(true, Ordering::Relaxed);
    }

    /// Resolves once nothing moved for `limit` (give or take a quarter).
    pub async fn idle_for(&self, limit: Duration) {
        let step = (limit / CHECKS).max(Duration::from_millis(1));
        let mut quiet = Duration::ZERO;
        while quiet < limit {
            tokio::time::sleep(step).await;
            quiet = if self.moved.swap(false, Ordering::Relaxed) {
                Duration::ZERO
            } else {
                quiet + step
            };
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
