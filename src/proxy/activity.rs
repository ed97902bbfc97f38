//! One h2c client connection's activity: streams in flight, since when it
//! is idle (GOAWAY at `idle_timeout`), its opening clock, whether the
//! client takes the responses it is sent, when bytes last went out, and
//! how many streams it reset before their responses. The connection's
//! clocks (`h2::clocks`) are rules over it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::body::BodyGuard;
use super::delivery::Delivery;
use super::h2::opening::OpeningClock;

/// How many graces after its last stream ended a connection is closed
/// however often it still writes (see `ConnState::quiet`).
const QUIET_AT_MOST: u32 = 4;

/// A client whose streams sent on to a backend reach this many, more than
/// half of them reset before their responses, each within [`EARLY_RESET`]
/// of its start, is flooding: the "rapid reset" attack (CVE-2023-44487),
/// in which a stream costs the client two frames and baton, and its
/// backend, a request. A stream reset before the connection first polled
/// its exchange (its RST_STREAM came in the read that brought its HEADERS,
/// or while the connection could not poll it; or baton reset it for the
/// client's fault) counts as one sent on and reset: it cost an HPACK
/// decode and a few allocations, and seen by no count, such streams went
/// on without end. Envoy's bounds (`premature_reset_total_stream_count`:
/// 500 streams, half of them reset within a second). Streams baton answers
/// itself (refused: CONNECT, a bad Host) do not count: a client could
/// otherwise send one between resets and stay at half (one reset before it
/// ran counts, as any such stream does). A browser that cancels the rest
/// of a page it left stays far below; a gRPC client whose deadlines all
/// expire against a slow backend may reach it, and reconnects.
const RESET_FLOOD: u64 = 500;

const EARLY_RESET: Duration = Duration::from_secs(1);

pub struct ConnState {
    /// The slowloris clock of its opening (see `h2::opening`).
    pub opening: Arc<OpeningClock>,
    in_flight: AtomicUsize,
    /// Told when the last request in flight ends (once a look found some:
    /// see `in_flight_heard`), and when the client is found flooding: what
    /// the connection's clocks cannot see coming.
    changed: Notify,
    /// Whether the end of the last request in flight is to be told.
    tell_emptied: AtomicBool,
    /// When the connection last became idle, as nanoseconds since `origin`.
    idle_since_nanos: AtomicU64,
    origin: Instant,
    /// Whether the client takes the responses' bytes: how many responses
    /// have a frame handed to the h2 connection that it has not asked past
    /// yet (it asks for the next once a frame is written), and when any of
    /// them last moved. Frames waiting with nothing moving for long mean
    /// the client stopped reading (a full socket, or h2 windows at zero).
    frames_waiting: AtomicUsize,
    /// Nanoseconds since `origin`.
    delivery_moved_nanos: AtomicU64,
    /// When bytes last went to the client's socket, nanoseconds since
    /// `origin`: a stream is over for baton when its last frame is handed
    /// to the connection, which may hold that frame until the client's
    /// window opens (see [`ConnState::quiet`]).
    wrote_nanos: AtomicU64,
    /// Streams sent on to a backend (or reset before their exchange ran),
    /// and those of them the client reset early (see [`RESET_FLOOD`]).
    sent_on: AtomicU64,
    early_resets: AtomicU64,
    /// Set once the client is found flooding.
    flooded: AtomicBool,
}

/// What one of a connection's clocks says when looked at.
#[derive(Debug, PartialEq, Eq)]
pub enum Due {
    /// Its time has come.
    Now,
    /// Look again then.
    At(Instant),
    /// Look again when the last stream in flight ends (see
    /// [`ConnState::changed`]).
    WhenEmptied,
}

impl Due {
    /// A clock due `at`, looked at `now`.
    pub fn by(at: Instant, now: Instant) -> Due {
        if now >= at {
            Due::Now
        } else {
            Due::At(at)
        }
    }
}

/// Marks a stream in flight from its opening until its response body is
/// done (or it is reset).
pub struct Busy {
    state: Arc<ConnState>,
    /// Whether it has a frame waiting (see `frames_waiting`); the stream's
    /// own [`Delivery`] hears the same.
    waiting: bool,
    delivery: Option<Arc<Delivery>>,
    /// When it began, nanoseconds since the state's `origin`.
    begun_nanos: u64,
    /// Whether it was sent on to a backend.
    sent_on: bool,
    /// Whether its response was made: a `Busy` dropped before is a stream
    /// the client reset first (the connection drops its exchange), or the
    /// connection's end; or one that never ran (see `ran`).
    answered: bool,
    /// Whether its exchange ran (see [`Busy::runs`]).
    ran: bool,
}

impl Busy {
    /// Its exchange runs, the stream's delivery lent to it (known only
    /// then): from now on it counts for the flood bound only if it is
    /// [`Self::sent_on`].
    pub fn runs(&mut self, delivery: Option<Arc<Delivery>>) {
        self.ran = true;
        self.delivery = delivery;
    }

    /// The stream goes on to a backend: one the flood bound counts.
    pub fn sent_on(&mut self) {
        self.sent_on = true;
        self.state.sent_on.fetch_add(1, Ordering::Relaxed);
    }

    /// The stream's response is made: from now on, a reset is the
    /// client's right (it stops a download it no longer wants).
    pub fn answered(&mut self) {
        self.answered = true;
    }

    fn waiting(&mut self, waiting: bool) {
        let state = &self.state;
        state
            .delivery_moved_nanos
            .store(state.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if waiting == self.waiting {
            return;
        }
        self.waiting = waiting;
        if waiting {
            state.frames_waiting.fetch_add(1, Ordering::Relaxed);
        } else {
            state.frames_waiting.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(delivery) = &self.delivery {
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
        let state = &self.state;
        if self.waiting {
            state.frames_waiting.fetch_sub(1, Ordering::Relaxed);
        }
        let now = state.origin.elapsed().as_nanos() as u64;
        let early = now - self.begun_nanos < EARLY_RESET.as_nanos() as u64;
        if !self.ran {
            state.sent_on.fetch_add(1, Ordering::Relaxed);
        }
        if (self.sent_on || !self.ran) && !self.answered && early {
            state.reset_early();
        }
        state.idle_since_nanos.store(now, Ordering::Relaxed);
        let last = state.in_flight.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && state.tell_emptied.swap(false, Ordering::SeqCst) {
            state.changed.notify_waiters();
        }
    }
}

impl ConnState {
    /// A connection accepted at `opened`.
    pub fn new(opened: Instant) -> ConnState {
        ConnState {
            opening: Arc::new(OpeningClock::since(opened)),
            in_flight: AtomicUsize::new(0),
            changed: Notify::new(),
            tell_emptied: AtomicBool::new(false),
            idle_since_nanos: AtomicU64::new(0),
            origin: Instant::now(),
            frames_waiting: AtomicUsize::new(0),
            delivery_moved_nanos: AtomicU64::new(0),
            wrote_nanos: AtomicU64::new(0),
            sent_on: AtomicU64::new(0),
            early_resets: AtomicU64::new(0),
            flooded: AtomicBool::new(false),
        }
    }

    /// A stream sent on ended before its response, soon after it began.
    fn reset_early(&self) {
        let resets = self.early_resets.fetch_add(1, Ordering::Relaxed) + 1;
        let sent_on = self.sent_on.load(Ordering::Relaxed);
        if sent_on >= RESET_FLOOD
            && resets * 2 > sent_on
            && !self.flooded.swap(true, Ordering::Relaxed)
        {
            self.changed.notify_waiters();
        }
    }

    /// Whether the client was found flooding (see `RESET_FLOOD`).
    pub fn is_flooded(&self) -> bool {
        self.flooded.load(Ordering::Relaxed)
    }

    /// Resolves on a change the clocks below cannot foresee: the last
    /// stream in flight ended (after a look that found it in flight), or
    /// the client was found flooding. Heard from its creation on, polled
    /// or not: made before the clocks are looked at, it misses nothing
    /// that happens after.
    pub fn changed(&self) -> Notified<'_> {
        self.changed.notified()
    }

    /// Whether a request is in flight; if so, its end is told (`changed`).
    /// Only then: a client that sends one request at a time would wake its
    /// connection's task once more a request, for a clock that was looked
    /// at when no request was in flight and is not due before its alarm.
    /// The flag is set before the count is read, and read after the count
    /// is lowered: an end that comes meanwhile is told, or seen here.
    fn in_flight_heard(&self) -> bool {
        self.tell_emptied.store(true, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) != 0 {
            return true;
        }
        self.tell_emptied.store(false, Ordering::Relaxed);
        false
    }

    /// When `nanos` after `origin` is.
    fn at(&self, nanos: &AtomicU64) -> Instant {
        self.origin + Duration::from_nanos(nanos.load(Ordering::Relaxed))
    }

    /// Bytes went to the client's socket now.
    pub fn wrote(&self) {
        let now = self.origin.elapsed().as_nanos() as u64;
        self.wrote_nanos.store(now, Ordering::Relaxed);
    }

    /// Whether no request has been in flight and no byte has gone out for
    /// `grace`, nor since `said` (when the GOAWAY was put out: the
    /// connection is polled to write it before it is closed): what h2 still held of a finished response
    /// went out (or the client stopped opening its window for it). Closing
    /// before that cut the response's tail, at every reload, for a client
    /// reading slowly. Bounded: `QUIET_AT_MOST` graces after the later of
    /// `from` (when the close was decided) and the last stream's end, it is
    /// due all the same (a client that PINGs often is answered every time,
    /// and would hold the connection, and a drain, for good).
    pub fn quiet(&self, grace: Duration, said: Instant, from: Instant, now: Instant) -> Due {
        if self.in_flight_heard() {
            return Due::WhenEmptied;
        }
        let ended = self.at(&self.idle_since_nanos);
        let quiet_at = self.at(&self.wrote_nanos).max(said) + grace;
        let bound = from.max(ended) + grace * QUIET_AT_MOST;
        Due::by((ended + grace).max(quiet_at.min(bound)), now)
    }

    /// A stream opened: in flight from now. Taken as the client opens it,
    /// not when its exchange first runs, so that a stream reset before
    /// that is counted too (see [`RESET_FLOOD`]).
    pub fn open(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Acquire);
        Busy {
            state: Arc::clone(self),
            waiting: false,
            delivery: None,
            begun_nanos: self.origin.elapsed().as_nanos() as u64,
            sent_on: false,
            answered: false,
            ran: false,
        }
    }

    /// A stream whose exchange runs (for the clocks' tests).
    #[cfg(test)]
    pub fn running(self: &Arc<Self>) -> Busy {
        let mut busy = self.open();
        busy.runs(None);
        busy
    }

    /// When to look for a stalled reader again: `None` if response frames
    /// have waited `limit` for the client with none of them moving. With
    /// none waiting, `limit` from now: a stall is seen within two of them,
    /// and an idle connection is looked at once per `limit`, not more.
    pub fn next_stall_look(&self, limit: Duration, now: Instant) -> Option<Instant> {
        if self.frames_waiting.load(Ordering::Relaxed) == 0 {
            return Some(now + limit);
        }
        let due = self.at(&self.delivery_moved_nanos) + limit;
        (now < due).then_some(due)
    }

    /// Whether no request has been in flight for `grace`.
    pub fn idle(&self, grace: Duration, now: Instant) -> Due {
        if self.in_flight_heard() {
            return Due::WhenEmptied;
        }
        Due::by(self.at(&self.idle_since_nanos) + grace, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<ConnState> {
        Arc::new(ConnState::new(Instant::now()))
    }

    /// `n` streams sent on and ended at once: `answered`, or reset.
    fn streams(state: &Arc<ConnState>, n: u64, answered: bool) {
        for _ in 0..n {
            let mut busy = state.running();
            busy.sent_on();
            if answered {
                busy.answered();
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn streams_all_reset_before_their_responses_are_a_flood_at_the_bound() {
        let (few, many) = (state(), state());
        streams(&few, RESET_FLOOD - 1, false);
        streams(&many, RESET_FLOOD, false);
        assert!(!few.is_flooded());
        assert!(many.is_flooded());
    }

    #[tokio::test(start_paused = true)]
    async fn resets_are_a_flood_only_when_most_streams_end_so() {
        let state = state();
        streams(&state, RESET_FLOOD, true);
        streams(&state, RESET_FLOOD, false);
        assert!(!state.is_flooded(), "half reset");
        streams(&state, 1, false);
        assert!(state.is_flooded(), "more than half reset");
    }

    /// Streams reset before their exchange ran count as sent on and
    /// reset: a client that resets each stream in the write that opens it
    /// reaches the bound as one that waits for baton to send it on.
    #[tokio::test(start_paused = true)]
    async fn streams_reset_before_their_exchange_ran_are_a_flood_too() {
        let state = state();
        for _ in 0..RESET_FLOOD {
            drop(state.open());
        }
        assert!(state.is_flooded());
    }

    /// Streams baton answered itself make no room for resets: a client
    /// sending one between resets stayed at half.
    #[tokio::test(start_paused = true)]
    async fn streams_refused_by_baton_do_not_count() {
        let state = state();
        for _ in 0..RESET_FLOOD {
            state.running().answered();
        }
        streams(&state, RESET_FLOOD, false);
        assert!(state.is_flooded());
    }

    /// What the connection's clocks cannot foresee is told: the end of the
    /// last stream in flight a look found, and a flood (with a stream
    /// still open).
    #[tokio::test(start_paused = true)]
    async fn the_last_streams_end_and_a_flood_are_told() {
        use futures_util::FutureExt;
        let state = state();
        let (first, second) = (state.running(), state.running());
        assert_eq!(state.idle(EARLY_RESET, Instant::now()), Due::WhenEmptied);
        let changed = state.changed();
        drop(first);
        assert!(changed.now_or_never().is_none(), "a stream still in flight");
        let changed = state.changed();
        drop(second);
        assert!(changed.now_or_never().is_some(), "the last one ended");
        assert_eq!(
            state.idle(EARLY_RESET, Instant::now()),
            Due::At(Instant::now() + EARLY_RESET)
        );
        let unlooked = state.running();
        let changed = state.changed();
        drop(unlooked);
        let told = changed.now_or_never().is_some();
        assert!(!told, "an end no look waits for is not told");
        let looked = state.running();
        let quiet = state.quiet(EARLY_RESET, Instant::now(), Instant::now(), Instant::now());
        assert_eq!(quiet, Due::WhenEmptied);
        let changed = state.changed();
        drop(looked);
        assert!(
            changed.now_or_never().is_some(),
            "the end a close waits for"
        );
        let _open = state.running();
        streams(&state, RESET_FLOOD - 1, false);
        let changed = state.changed();
        streams(&state, 1, false);
        assert!(changed.now_or_never().is_some(), "found flooding");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_reset_after_a_second_is_no_flood() {
        let state = state();
        let begun: Vec<Busy> = (0..RESET_FLOOD)
            .map(|_| {
                let mut busy = state.running();
                busy.sent_on();
                busy
            })
            .collect();
        tokio::time::advance(EARLY_RESET).await;
        drop(begun);
        assert!(!state.is_flooded());
    }
}
