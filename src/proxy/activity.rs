//! One h2c client connection's activity: streams in flight, since when it
//! is idle (GOAWAY at `idle_timeout`), its opening clock, whether the
//! client takes the responses it is sent, and when bytes last went out.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::body::BodyGuard;
use super::delivery::Delivery;
use super::head::OpeningClock;

/// How many graces after its last stream ended a connection is closed
/// however often it still writes (see `ConnState::done_and_quiet`).
const QUIET_AT_MOST: u32 = 4;

pub struct ConnState {
    /// The slowloris clock of its opening (see `head`).
    pub opening: Arc<OpeningClock>,
    in_flight: AtomicUsize,
    /// Told when the last request in flight ends.
    emptied: Notify,
    /// When the connection last became idle, as nanoseconds since `origin`.
    idle_since_nanos: AtomicU64,
    origin: Instant,
    /// Whether the client takes the responses' bytes: how many responses
    /// have a frame handed to hyper that hyper has not asked past yet
    /// (hyper asks for the next once a frame is written), and when any of
    /// them last moved. Frames waiting with nothing moving for long mean
    /// the client stopped reading (a full socket, or h2 windows at zero).
    frames_waiting: AtomicUsize,
    /// Nanoseconds since `origin`.
    delivery_moved_nanos: AtomicU64,
    /// When bytes last went to the client's socket, nanoseconds since
    /// `origin`: a stream is over for baton when its last frame is handed
    /// to hyper, but h2 may hold that frame until the client's window
    /// opens (see [`ConnState::done_and_quiet`]).
    wrote_nanos: AtomicU64,
}

/// Marks a request in flight until the response body is done; the bool
/// says whether it has a frame waiting (see `frames_waiting`), and the
/// stream's own [`Delivery`] hears the same.
pub struct Busy(Arc<ConnState>, bool, Option<Arc<Delivery>>);

impl Busy {
    fn waiting(&mut self, waiting: bool) {
        let state = &self.0;
        state
            .delivery_moved_nanos
            .store(state.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if waiting == self.1 {
            return;
        }
        self.1 = waiting;
        if waiting {
            state.frames_waiting.fetch_add(1, Ordering::Relaxed);
        } else {
            state.frames_waiting.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(delivery) = &self.2 {
            if waiting {
                delivery.handed();
            } else {
                delivery.asked();
            }
        }
    }
}

impl BodyGuard for Busy {
    fn asked(&mut self) {
        self.waiting(false);
    }

    fn handed(&mut self, _bytes: usize) {
        self.waiting(true);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.1 {
            self.0.frames_waiting.fetch_sub(1, Ordering::Relaxed);
        }
        let state = &self.0;
        state
            .idle_since_nanos
            .store(state.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if state.in_flight.fetch_sub(1, Ordering::Release) == 1 {
            state.emptied.notify_waiters();
        }
    }
}

impl ConnState {
    /// A connection accepted at `opened`.
    pub fn new(opened: Instant) -> ConnState {
        ConnState {
            opening: Arc::new(OpeningClock::since(opened)),
            in_flight: AtomicUsize::new(0),
            emptied: Notify::new(),
            idle_since_nanos: AtomicU64::new(0),
            origin: Instant::now(),
            frames_waiting: AtomicUsize::new(0),
            delivery_moved_nanos: AtomicU64::new(0),
            wrote_nanos: AtomicU64::new(0),
        }
    }

    /// Bytes went to the client's socket now.
    pub fn wrote(&self) {
        let now = self.origin.elapsed().as_nanos() as u64;
        self.wrote_nanos.store(now, Ordering::Relaxed);
    }

    /// Resolves once no request has been in flight and no byte has gone
    /// out for `grace`: what h2 still held of a finished response went out
    /// (or the client stopped opening its window for it). Closing before
    /// that cut the response's tail, at every reload, for a client reading
    /// slowly. Bounded: `QUIET_AT_MOST` graces after the later of `from`
    /// (when the close was decided) and the last stream's end, it resolves
    /// all the same (a client that PINGs often is answered every time, and
    /// would hold the connection, and a drain, for good).
    pub async fn done_and_quiet(&self, grace: Duration, from: Instant) {
        loop {
            self.idle_for(grace).await;
            let wrote = Duration::from_nanos(self.wrote_nanos.load(Ordering::Relaxed));
            let ended = Duration::from_nanos(self.idle_since_nanos.load(Ordering::Relaxed));
            let quiet = self.origin.elapsed().saturating_sub(wrote);
            let waited = from.max(self.origin + ended).elapsed();
            if quiet >= grace || waited >= grace * QUIET_AT_MOST {
                return;
            }
            tokio::time::sleep(grace - quiet).await;
        }
    }

    pub fn begin(self: &Arc<Self>, delivery: Option<Arc<Delivery>>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Acquire);
        Busy(Arc::clone(self), false, delivery)
    }

    /// Resolves once response frames have waited `limit` for the client
    /// with none of them moving. Wakes once per `limit` on an idle
    /// connection, not more: cheap for many idle connections.
    pub async fn stalled_reader(&self, limit: Duration) {
        loop {
            let moved = Duration::from_nanos(self.delivery_moved_nanos.load(Ordering::Relaxed));
            let still = self.origin.elapsed().saturating_sub(moved);
            if self.frames_waiting.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(limit).await;
            } else if still >= limit {
                return;
            } else {
                tokio::time::sleep(limit - still).await;
            }
        }
    }

    /// Resolves once no request has been in flight for `grace`. Wakes when
    /// the last stream in flight ends, not on a clock while streams run.
    pub async fn idle_for(&self, grace: Duration) {
        loop {
            // Listening before looking: an end in between still wakes it.
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                let since = Duration::from_nanos(self.idle_since_nanos.load(Ordering::Relaxed));
                let idle = self.origin.elapsed().saturating_sub(since);
                if idle >= grace {
                    return;
                }
                tokio::time::sleep(grace - idle).await;
            } else {
                emptied.await;
            }
        }
    }
}
