//! A tunnel's idleness (HAProxy's `timeout tunnel`): a TCP-mode connection
//! or an upgraded HTTP connection with no traffic either way for
//! `tunnel_timeout` is closed, so a vanished peer (NAT expiry, a client
//! that lost power) does not hold a connection slot and two fds forever.
//! Once the backend has closed its half, a shorter limit may apply to the
//! client's (HAProxy's `timeout client-fin`); a client's half-close waits
//! for the backend's answer under the tunnel's own limit, as HAProxy's
//! does with no `server-fin` set.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;

/// Checks per `tunnel_timeout`: a quiet connection is closed after between
/// one and one and a quarter of it.
const CHECKS: u32 = 4;

/// Whether bytes moved, either way, since the idle clock last looked.
/// A flag, not a time: marking it is one store, where a clock read at
/// every burst cost a TCP-mode round trip a tenth of its instructions.
#[derive(Default)]
pub struct Activity {
    moved: AtomicBool,
    /// The backend closed its half (its EOF was passed on).
    backend_closed: AtomicBool,
    closed_half: Notify,
}

impl Activity {
    pub fn touch(&self) {
        self.moved.store(true, Ordering::Relaxed);
    }

    /// The backend closed its half: from now on [`Self::idle_for_or`]'s
    /// shorter limit applies. Not the client's: after its FIN it waits
    /// for an answer the backend may take long to give (a report, a
    /// job), and a cut then looked like a whole, empty answer.
    pub fn backend_closed(&self) {
        self.backend_closed.store(true, Ordering::Relaxed);
        self.closed_half.notify_waiters();
    }

    /// Resolves once nothing moved for `limit`, or for `half_limit` once
    /// the backend has closed its half (give or take a quarter): a backend
    /// that closed leaves its client's half-open socket holding the
    /// backend's place (`max_connections_per_backend`) and a drain, for
    /// `limit` (an hour by default), when the client never closes its side
    /// (pooled sockets left in CLOSE_WAIT).
    pub async fn idle_for_or(&self, limit: Duration, half_limit: Duration) {
        let closed_half = self.closed_half.notified();
        tokio::pin!(closed_half);
        closed_half.as_mut().enable();
        if !self.backend_closed.load(Ordering::Relaxed) {
            tokio::select! {
                () = self.idle_for(limit) => return,
                () = closed_half => {}
            }
        }
        self.idle_for(half_limit.min(limit)).await;
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
