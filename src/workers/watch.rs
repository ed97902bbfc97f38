//! Whether every worker still runs. A worker that stops (a runaway loop, a
//! blocking call on its thread, a bug) leaves its shards' accept queues
//! undrained and its connections frozen, while the supervisor's thread
//! answers `/readyz` and pings systemd's watchdog as if all were well. So
//! each worker counts its heartbeats (`Beats`), and the supervisor looks
//! at the counts once a second (`watch`): a worker whose count has not
//! moved for `STUCK_AFTER` of the supervisor's own looks is stuck
//! (`Stuck`). Counted in the supervisor's looks, not by the wall clock, a
//! process frozen whole (SIGSTOP, a suspended host) is never taken for
//! one stuck: the looks stop with it. `/readyz` then says which worker is
//! stuck, and the watchdog pings stop, as HAProxy's watchdog ends a
//! process whose thread is stuck, so that a `WatchdogSec=` restarts it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::PerWorker;

/// How often the supervisor looks (and each worker beats).
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Looks in a row without a heartbeat that make a worker stuck: a worker
/// runs its timers between every few dozen tasks, so even a loaded one
/// beats every second.
const STUCK_AFTER: u32 = 5;

/// Each worker's heartbeat count, written by the worker alone.
pub struct Beats(PerWorker<AtomicU64>);

impl Beats {
    pub fn new(workers: usize) -> Beats {
        Beats(PerWorker::new(workers, |_| AtomicU64::new(0)))
    }

    /// Worker `worker` ran its clock once more.
    pub fn beat(&self, worker: usize) {
        self.0.get(worker).fetch_add(1, Ordering::Relaxed);
    }

    fn counts(&self) -> Vec<u64> {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// The workers seen stuck now, by number, and for how many looks.
#[derive(Default)]
pub struct Stuck(Mutex<Vec<(usize, u32)>>);

impl Stuck {
    /// Each stuck worker with the seconds it has not run for.
    pub fn now(&self) -> Vec<(usize, u64)> {
        let looks = LOOK_EVERY.as_secs();
        self.lock()
            .iter()
            .map(|&(worker, silent)| (worker, u64::from(silent) * looks))
            .collect()
    }

    pub fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    fn set(&self, stuck: Vec<(usize, u32)>) {
        *self.lock() = stuck;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(usize, u32)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Looks at the workers' heartbeats once a second until `stop`, keeping
/// `stuck` up to date and saying when a worker stops and starts again.
pub async fn watch(beats: Arc<Beats>, stuck: Arc<Stuck>, stop: CancellationToken) {
    let mut last = beats.counts();
    let mut silent = vec![0u32; last.len()];
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        let counts = beats.counts();
        for (worker, (count, before)) in counts.iter().zip(&last).enumerate() {
            silent[worker] = next_silence(silent[worker], count == before, worker);
        }
        last = counts;
        stuck.set(
            silent
                .iter()
                .enumerate()
                .filter(|(_, &s)| s >= STUCK_AFTER)
                .map(|(worker, &s)| (worker, s))
                .collect(),
        );
    }
}

/// A worker's looks without a heartbeat after one more look, said as it
/// becomes stuck and as it runs again.
fn next_silence(silent: u32, unmoved: bool, worker: usize) -> u32 {
    match (unmoved, silent >= STUCK_AFTER) {
        (true, _) => {
            let silent = silent.saturating_add(1);
            if silent == STUCK_AFTER {
                tracing::error!(
                    worker,
                    seconds = u64::from(silent) * LOOK_EVERY.as_secs(),
                    "a worker thread has not run: connections on its shards wait; /readyz is 503 and the watchdog pings stop until it runs again"
                );
            }
            silent
        }
        (false, true) => {
            tracing::warn!(
                worker,
                seconds = u64::from(silent) * LOOK_EVERY.as_secs(),
                "a worker thread runs again after being stuck"
            );
            0
        }
        (false, false) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::{next_silence, STUCK_AFTER};

    /// Stuck only after `STUCK_AFTER` looks in a row without a beat; one
    /// beat starts the count again.
    #[test]
    fn a_worker_is_stuck_after_looks_in_a_row_without_a_beat() {
        let looks_to_stuck = |mut silent: u32| {
            let mut looks = 0;
            while silent < STUCK_AFTER {
                silent = next_silence(silent, true, 0);
                looks += 1;
            }
            looks
        };
        assert_eq!(looks_to_stuck(0), STUCK_AFTER);
        let mut silent = 0;
        for _ in 0..STUCK_AFTER - 1 {
            silent = next_silence(silent, true, 0);
        }
        silent = next_silence(silent, false, 0);
        assert_eq!(silent, 0, "a beat resets it");
        assert_eq!(looks_to_stuck(silent), STUCK_AFTER, "all looks again");
        assert_eq!(next_silence(STUCK_AFTER, false, 0), 0, "running again");
    }
}
