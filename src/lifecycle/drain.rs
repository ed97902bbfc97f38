//! Draining in three parts (the mini-redis / hyper-util graceful pattern): a
//! trigger only the supervisor holds ([`Drain`], not `Clone`), a watch every
//! connection task holds ([`DrainWatch`]), and a wait on the task tracker
//! rather than a polled counter. Two signals reach connections: *graceful*
//! (finish what you have, take no more) and *force* (stop now).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::latch::Latch;
use crate::metrics::{self, LongLivedKind};
use crate::wake_gate::first_of;
use crate::workers::{working, PerWorker};

/// Long-lived streams a drain ended, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LongLivedEnded {
    pub websockets: u64,
    pub upgrades: u64,
    pub event_streams: u64,
}

impl LongLivedEnded {
    pub fn total(&self) -> u64 {
        self.websockets + self.upgrades + self.event_streams
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every tracked task finished by itself.
    Drained,
    /// The deadline passed (or a second stop signal came); `open` tasks
    /// were force-closed.
    Forced { open: usize },
}

/// The supervisor's side. Deliberately not `Clone`: one owner decides.
pub struct Drain {
    signals: Arc<Signals>,
}

/// What connection tasks hold: they learn when to wind down and are counted.
/// One `Arc` to clone per connection; each task looks at its own worker's
/// signals through it.
#[derive(Clone)]
pub struct DrainWatch {
    signals: Arc<Signals>,
}

/// What the drain's two sides share.
struct Signals {
    /// Each worker's two signals, which its connections look at and wait
    /// on, on a cache line of its own: one for every worker bounced that
    /// line between their cores several times a request (a look, a waiter
    /// taken and dropped).
    per_worker: PerWorker<WorkerSignals>,
    tracker: TaskTracker,
    /// Window over which long-lived streams are ended (`reload.close_spread`).
    spread_nanos: AtomicU64,
    /// Ends what is left of that window: every long-lived stream still
    /// waiting for its place in it ends now.
    spread_cut: CancellationToken,
    /// Idle keep-alive connections closed by the drain: said once, at its
    /// end, rather than a line each (thousands at a reload).
    idle_closed: AtomicU64,
    /// Long-lived streams the drain ended, by kind (`LongLivedKind`'s
    /// order): said once at its end too, as a reload with 10,000
    /// WebSockets would otherwise write 10,000 lines.
    long_lived_ended: [AtomicU64; 3],
}

/// One worker's signals: *graceful* (finish what you have, take no more)
/// and *force* (stop now).
#[derive(Default)]
struct WorkerSignals {
    graceful: Latch,
    force: Latch,
}

impl Signals {
    /// The calling worker's signals (any thread outside the workers shares
    /// worker 0's, and is as well served).
    fn local(&self) -> &WorkerSignals {
        self.per_worker.mine()
    }
}

impl Drain {
    /// A drain for connections served by `workers` workers.
    pub fn new(workers: usize) -> Self {
        Drain {
            signals: Arc::new(Signals {
                per_worker: PerWorker::new(workers, |_| WorkerSignals::default()),
                tracker: TaskTracker::new(),
                spread_nanos: AtomicU64::new(0),
                spread_cut: CancellationToken::new(),
                idle_closed: AtomicU64::new(0),
                long_lived_ended: Default::default(),
            }),
        }
    }

    pub fn watch(&self) -> DrainWatch {
        DrainWatch {
            signals: Arc::clone(&self.signals),
        }
    }

    /// Tells every connection to finish what it has; no new task will be
    /// waited for after this (late spawns still run and are counted).
    /// Long-lived streams end spread over `spread` (zero: all at once).
    pub fn begin(&self, spread: Duration) {
        let nanos = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
        self.signals.spread_nanos.store(nanos, Ordering::SeqCst);
        self.signals
            .per_worker
            .iter()
            .for_each(|w| w.graceful.set());
        self.signals.tracker.close();
    }

    /// A stop reached this reload's drain: the long-lived streams still
    /// waiting for their place in the close spread end now, as a stop ends
    /// them (DESIGN). Left to their places, those placed past the stop's
    /// deadline would be cut there together, unannounced, and the stop
    /// counted as forced.
    pub fn end_spread(&self) {
        self.signals.spread_cut.cancel();
    }

    /// Connections still open: each is one task of the tracker (an h2
    /// connection's streams run in its task).
    pub fn in_flight(&self) -> usize {
        self.signals.tracker.len()
    }

    /// Resolves once every tracked task has finished (after [`Self::begin`]).
    pub async fn idle(&self) {
        self.signals.tracker.wait().await;
    }

    /// Idle keep-alive connections the drain has closed so far.
    pub fn idle_closed(&self) -> u64 {
        self.signals.idle_closed.load(Ordering::Relaxed)
    }

    /// Long-lived streams the drain has ended so far, by kind.
    pub fn long_lived_ended(&self) -> LongLivedEnded {
        let [websocket, upgrade, sse] = &self.signals.long_lived_ended;
        LongLivedEnded {
            websockets: websocket.load(Ordering::Relaxed),
            upgrades: upgrade.load(Ordering::Relaxed),
            event_streams: sse.load(Ordering::Relaxed),
        }
    }

    /// Ends every remaining task now and returns how many connections
    /// were open.
    pub async fn force(&self) -> usize {
        let open = self.in_flight();
        self.signals.per_worker.iter().for_each(|w| w.force.set());
        // Forced tasks return at their next poll; this bound only guards
        // against one stuck in a blocking call.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.signals.tracker.wait()).await;
        open
    }
}

impl DrainWatch {
    /// Runs `task` counted by the drain, dropped at once if forced.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // The force token is polled only once it fired, not at each of
        // the task's wake-ups (`wake_gate`); it is waited on through the
        // shared signals, not a clone of its own.
        let signals = Arc::clone(&self.signals);
        self.signals.tracker.spawn(async move {
            first_of(working(task), signals.local().force.wait()).await;
        });
    }

    pub fn is_draining(&self) -> bool {
        self.signals.local().graceful.is_set()
    }

    /// An idle keep-alive connection closes for the drain.
    pub fn closed_idle(&self) {
        self.signals.idle_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// A long-lived stream ended for the drain: counted in the metric at
    /// once, and in the drain's summary line at its end.
    pub fn ended_long_lived(&self, kind: LongLivedKind) {
        metrics::long_lived_drained(kind);
        let index = match kind {
            LongLivedKind::WebSocket => 0,
            LongLivedKind::Upgrade => 1,
            LongLivedKind::Sse => 2,
        };
        self.signals.long_lived_ended[index].fetch_add(1, Ordering::Relaxed);
    }

    /// The drain was forced: tasks dropped now were cut by it.
    pub fn is_forced(&self) -> bool {
        self.signals.local().force.is_set()
    }

    /// Resolves when the drain begins.
    pub async fn draining(&self) {
        self.signals.local().graceful.wait().await;
    }

    /// Resolves once `grace` has passed since the drain began, or since
    /// the first poll if that came later (not since a connection turned
    /// idle: a client idle for long may be sending its next request right
    /// now): when a connection still idle then closes.
    pub async fn grace_over(&self, grace: std::time::Duration) {
        self.draining().await;
        tokio::time::sleep(grace).await;
    }

    /// Resolves when a long-lived stream (WebSocket, SSE, other upgrade)
    /// should end: at drain start, or at a point spread evenly over the
    /// close-spread window so their clients do not reconnect in one storm.
    pub async fn long_lived_ending(&self) {
        self.signals.local().graceful.wait().await;
        let spread = self.signals.spread_nanos.load(Ordering::SeqCst);
        if spread > 0 {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_nanos(jitter() % spread)) => {}
                () = self.signals.spread_cut.cancelled() => {}
            }
        }
    }
}

/// A well-spread pseudo-random number (splitmix64 over a counter): enough
/// to place streams across the spread window, no RNG dependency.
fn jitter() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x2545_f491_4f6c_dd1d);
    crate::splitmix::next(&NEXT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test(start_paused = true)]
    async fn finished_tasks_drain_and_stuck_ones_are_forced() {
        let drain = Drain::new(1);
        let watch = drain.watch();
        watch.spawn(async {});
        let stuck = drain.watch();
        watch.spawn(async move {
            stuck.draining().await;
            std::future::pending::<()>().await
        });
        drain.begin(Duration::ZERO);
        let waited = tokio::time::timeout(Duration::from_secs(5), drain.idle()).await;
        assert!(waited.is_err(), "a stuck task must hold the drain");
        assert_eq!(drain.force().await, 1);
        assert_eq!(drain.in_flight(), 0);
    }

    /// Each worker's connections look at and wait on signals of their own
    /// (on a cache line no other worker writes), and the drain reaches
    /// them all.
    #[tokio::test]
    async fn each_worker_waits_on_signals_of_its_own_that_the_drain_reaches() {
        let workers =
            crate::workers::Workers::start(2, false, std::time::Duration::ZERO).expect("workers");
        let drain = Drain::new(2);
        let mut waits = Vec::new();
        let mut started = Vec::new();
        for worker in 0..2 {
            let watch = drain.watch();
            let (start, started_here) = tokio::sync::oneshot::channel();
            started.push(started_here);
            waits.push(workers.for_shard(worker).spawn(async move {
                let line = std::ptr::from_ref(watch.signals.local()) as usize / 64;
                let drained_before = watch.is_draining();
                let _ = start.send(());
                watch.draining().await;
                (line, drained_before, watch.is_draining())
            }));
        }
        for start in started {
            start.await.expect("started");
        }
        drain.begin(Duration::ZERO);
        let mut seen = Vec::new();
        for wait in waits {
            let waited = tokio::time::timeout(Duration::from_secs(5), wait).await;
            let (line, before, after) = waited.expect("the drain reached it").expect("task");
            assert!(!before && after, "draining only once the drain began");
            seen.push(line);
        }
        assert_ne!(seen[0], seen[1], "both workers' signals on one cache line");
    }

    /// Long-lived streams end at places spread over the window, and a
    /// stop's cut ends every one still waiting at once.
    #[tokio::test(start_paused = true)]
    async fn long_lived_streams_end_spread_until_the_spread_is_cut() {
        let drain = Drain::new(1);
        let ended = Arc::new(AtomicUsize::new(0));
        for _ in 0..32 {
            let (watch, ended) = (drain.watch(), Arc::clone(&ended));
            watch.clone().spawn(async move {
                watch.long_lived_ending().await;
                ended.fetch_add(1, Ordering::SeqCst);
            });
        }
        let spread = Duration::from_secs(100);
        drain.begin(spread);
        tokio::time::sleep(spread / 2).await;
        let early = ended.load(Ordering::SeqCst);
        assert!(
            (1..32).contains(&early),
            "halfway through the window, some but not all have ended: {early}"
        );
        drain.end_spread();
        let waited = tokio::time::timeout(Duration::from_millis(1), drain.idle()).await;
        assert!(waited.is_ok(), "the cut ends every stream still waiting");
        assert_eq!(ended.load(Ordering::SeqCst), 32);
    }
}
