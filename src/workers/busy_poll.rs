//! Busy polling (`busy_poll`, off by default): a worker that runs out of
//! work while traffic is dense asks the kernel for events again and again,
//! for up to its window, before it sleeps in `epoll_wait`.
//!
//! Why: a worker asleep in `epoll_wait` must be woken by whoever makes it
//! ready, and on a virtual machine that is an interrupt sent across cores
//! that costs the waking core several microseconds (the NIC's, or a local
//! client's). A worker that spends little a request runs out of work often
//! (with a connection per request, 0.55 sleeps a request against
//! HAProxy's 0.40), so it costs the other core more than a slower one
//! does. HAProxy's `busy-polling` answers the same, also off by default:
//! the worker's core then reads busy while it waits.
//!
//! How: the runtime's park hook notes when the worker went to sleep; the
//! unpark hook, when that sleep was short (traffic is dense), arms a
//! spinner task. The spinner yields over and over (each yield is a
//! zero-timeout poll of the kernel's events, as tokio polls its driver
//! before it runs a yielded task again) until the worker has done no
//! other work for the window; then it lies dormant and the worker sleeps.
//! Other work is told by a count every connection's task adds to when it
//! is polled ([`working`]); time is told by the clock, so a worker whose
//! core the host takes away stops spinning after its window all the same.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

thread_local! {
    /// When this worker last went to sleep.
    static ASLEEP_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Whether the spinner should spin when it is next polled.
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// The dormant spinner, to wake when a short sleep ends.
    static SPINNER: Cell<Option<Waker>> = const { Cell::new(None) };
    /// Polls of connections' tasks on this worker, ever.
    static WORK: Cell<u64> = const { Cell::new(0) };
}

/// A sleep shorter than this many windows means traffic is dense enough
/// to spin through the next gap.
const DENSE: u32 = 4;

/// Sets `builder`'s park hooks for a worker that spins for `window`.
pub fn hook(builder: &mut tokio::runtime::Builder, window: Duration) {
    builder
        .on_thread_park(|| ASLEEP_SINCE.set(Some(Instant::now())))
        .on_thread_unpark(move || woke(window * DENSE));
}

/// After a sleep shorter than `dense`, arms the spinner.
fn woke(dense: Duration) {
    let Some(since) = ASLEEP_SINCE.take() else {
        return;
    };
    if since.elapsed() < dense {
        ARMED.set(true);
        if let Some(spinner) = SPINNER.take() {
            spinner.wake();
        }
    }
}

/// Waits until the spinner is armed.
async fn armed() {
    std::future::poll_fn(|cx| {
        if ARMED.replace(false) {
            Poll::Ready(())
        } else {
            SPINNER.set(Some(cx.waker().clone()));
            Poll::Pending
        }
    })
    .await;
}

/// `task`, each of whose polls counts as its worker's work: what a
/// spinning worker watches to tell a gap in traffic from traffic.
pub async fn working<F: Future>(task: F) -> F::Output {
    let mut task = std::pin::pin!(task);
    std::future::poll_fn(|cx| {
        WORK.set(WORK.get().wrapping_add(1));
        task.as_mut().poll(cx)
    })
    .await
}

/// The spinner: runs on its worker until the worker ends, or until `calm`
/// (the generation closed its doors: a draining generation leaves the
/// cores to the one that serves, as HAProxy's old processes do).
pub async fn spin(window: Duration, calm: Arc<AtomicBool>) {
    loop {
        armed().await;
        if calm.load(Ordering::Relaxed) {
            return;
        }
        let mut idle_since = Instant::now();
        let mut seen = WORK.get();
        loop {
            tokio::task::yield_now().await;
            if calm.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            let work = WORK.get();
            if work != seen {
                seen = work;
                idle_since = now;
            } else if now.duration_since(idle_since) >= window {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::workers::Workers;

    /// The calling thread's voluntary context switches: each is a sleep.
    fn sleeps() -> u64 {
        std::fs::read_to_string("/proc/thread-self/status")
            .expect("status")
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("voluntary_ctxt_switches")
    }

    /// Runs `work` on worker 0 and returns what it gave.
    fn on_worker<T: Send + 'static>(
        workers: &Workers,
        work: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let (tx, rx) = mpsc::channel();
        workers.for_shard(0).spawn(async move {
            let _ = tx.send(work.await);
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("worker answered")
    }

    /// How often worker 0 slept through a hundred 1 ms gaps in its work:
    /// dense traffic as a clock makes it.
    fn sleeps_through_gaps(workers: &Workers) -> u64 {
        on_worker(
            workers,
            super::working(async {
                let before = sleeps();
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                sleeps() - before
            }),
        )
    }

    /// The CPU time worker 0 used while nothing came for 300 ms.
    fn cpu_while_idle(workers: &Workers) -> Duration {
        let cpu = || {
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
                .map(Duration::from)
                .expect("thread CPU clock")
        };
        let before = on_worker(workers, async move { cpu() });
        std::thread::sleep(Duration::from_millis(300));
        on_worker(workers, async move { cpu() }) - before
    }

    /// A busy-polling worker stays awake through short gaps, sleeps once
    /// nothing has come for its window, and sleeps through every gap
    /// once calmed (a retiring generation's).
    #[test]
    fn a_busy_polling_worker_spins_through_short_gaps_only_until_idle_or_calmed() {
        let workers = Workers::start(1, false, Duration::from_millis(20)).expect("workers");
        let spinning = sleeps_through_gaps(&workers);
        assert!(spinning < 40, "slept {spinning} times in 100 gaps of 1 ms");
        std::thread::sleep(Duration::from_millis(100));
        let idle = cpu_while_idle(&workers);
        assert!(idle < Duration::from_millis(60), "spun {idle:?} while idle");
        workers.calm();
        let calmed = sleeps_through_gaps(&workers);
        assert!(
            calmed > 50,
            "slept {calmed} times in 100 gaps of 1 ms once calmed"
        );
    }

    /// Without busy polling, the same gaps are each a sleep: what the
    /// test above counts can tell the two apart.
    #[test]
    fn a_worker_without_busy_polling_sleeps_in_every_gap() {
        let workers = Workers::start(1, false, Duration::ZERO).expect("workers");
        let slept = sleeps_through_gaps(&workers);
        assert!(slept > 50, "slept {slept} times in 100 gaps of 1 ms");
    }
}
