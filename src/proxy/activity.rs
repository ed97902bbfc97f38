//! One HTTP client connection's activity: requests in flight, since when
//! it is idle (the drain closes idle keep-alive connections only after
//! `keepalive_drain_grace`), whether it speaks h2, its head clock, and
//! whether the client takes the responses it is sent.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::body::BodyGuard;
use super::head::HeadClock;

pub struct ConnState {
    h2: AtomicBool,
    /// Upgraded tunnels this connection turned into: the connection (its
    /// `max_connections` permit and its count) lives until they end.
    pub tunnels: tokio_util::task::TaskTracker,
    /// The slowloris clock (see `head`).
    pub head: Arc<HeadClock>,
    in_flight: AtomicUsize,
    /// When the connection last became idle, as nanoseconds since `origin`.
    idle_since_nanos: AtomicU64,
    origin: Instant,
    /// One per response being sent.
    deliveries: Mutex<Vec<Weak<Delivery>>>,
}

/// Whether the client takes a response's bytes: a frame was handed to
/// hyper at this time (nanoseconds since the connection's origin, + 1) and
/// hyper has not asked for the next one since (0: nothing waits). hyper
/// asks again once the frame is written, so a frame waiting long means
/// the client stopped reading (a full socket, or an h2 window at zero).
#[derive(Default)]
struct Delivery {
    handed_at: AtomicU64,
}

/// Marks a request in flight until the response body is done.
pub struct Busy(Arc<ConnState>, Arc<Delivery>);

impl BodyGuard for Busy {
    fn asked(&mut self) {
        self.1.handed_at.store(0, Ordering::Relaxed);
    }

    fn handed(&mut self) {
        let now = self.0.origin.elapsed().as_nanos() as u64 + 1;
        self.1.handed_at.store(now, Ordering::Relaxed);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let state = &self.0;
        state
            .idle_since_nanos
            .store(state.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if state.in_flight.fetch_sub(1, Ordering::Release) == 1 {
            state.head.answered();
        }
    }
}

impl Default for ConnState {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnState {
    pub fn new() -> ConnState {
        ConnState {
            h2: AtomicBool::new(false),
            tunnels: tokio_util::task::TaskTracker::new(),
            head: Arc::new(HeadClock::new()),
            in_flight: AtomicUsize::new(0),
            idle_since_nanos: AtomicU64::new(0),
            origin: Instant::now(),
            deliveries: Mutex::new(Vec::new()),
        }
    }

    pub fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Acquire);
        self.head.head_done();
        let delivery = Arc::new(Delivery::default());
        if let Ok(mut d) = self.deliveries.lock() {
            d.retain(|w| w.strong_count() > 0);
            d.push(Arc::downgrade(&delivery));
        }
        Busy(Arc::clone(self), delivery)
    }

    /// Resolves once a response frame has waited `limit` for the client to
    /// take it (checked every second at most).
    pub async fn stalled_reader(&self, limit: Duration) {
        loop {
            tokio::time::sleep(limit.min(Duration::from_secs(1))).await;
            let now = self.origin.elapsed().as_nanos() as u64 + 1;
            let limit = limit.as_nanos() as u64;
            let stalled = self.deliveries.lock().is_ok_and(|d| {
                d.iter().filter_map(Weak::upgrade).any(|d| {
                    let at = d.handed_at.load(Ordering::Relaxed);
                    at != 0 && now.saturating_sub(at) >= limit
                })
            });
            if stalled {
                return;
            }
        }
    }

    pub fn mark_h2(&self) {
        self.h2.store(true, Ordering::Relaxed);
    }

    /// It opened with the h2 preface, or carried an h2 request.
    pub fn is_h2(&self) -> bool {
        self.h2.load(Ordering::Relaxed) || self.head.is_h2()
    }

    /// Resolves once the connection speaks h2 and has had no stream open
    /// for `limit` (hyper's h2 server has no idle timeout of its own).
    pub async fn h2_idle_for(&self, limit: Duration) {
        while !self.is_h2() {
            tokio::time::sleep(limit.min(Duration::from_secs(1))).await;
        }
        self.idle_for(limit).await;
    }

    /// Resolves once no request has been in flight for `grace`.
    pub async fn idle_for(&self, grace: Duration) {
        loop {
            if self.in_flight.load(Ordering::Acquire) == 0 {
                let since = Duration::from_nanos(self.idle_since_nanos.load(Ordering::Relaxed));
                let idle = self.origin.elapsed().saturating_sub(since);
                if idle >= grace {
                    return;
                }
                tokio::time::sleep(grace - idle).await;
            } else {
                tokio::time::sleep(
                    grace.clamp(Duration::from_millis(10), Duration::from_millis(100)),
                )
                .await;
            }
        }
    }
}
