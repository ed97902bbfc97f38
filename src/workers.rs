//! The data plane's threads: `workers` of them, each a current-thread tokio
//! runtime. A listener's SO_REUSEPORT shards are spread over them, and a
//! connection lives its whole life on the worker whose shard accepted it,
//! with that worker's idle backend connections: its data never crosses
//! threads and its tasks never meet another thread's scheduler. The main
//! runtime keeps the lifecycle, the admin server and the probes. With
//! `pin_workers`, each worker is held to a CPU of its own.

mod busy_poll;
mod watch;

pub use busy_poll::working;
pub use watch::{watch, Stuck};

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

thread_local! {
    /// This thread's worker number (0 off the workers).
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The worker the calling thread is (0 for any other thread).
pub fn current() -> usize {
    WORKER.get()
}

/// One `T` for each worker, each on cache lines of its own: state a worker
/// writes at every request, which one shared copy (or copies side by side)
/// bounced between the workers' cores. Any thread outside the workers uses
/// worker 0's.
pub struct PerWorker<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T> PerWorker<T> {
    /// `make(n)` is worker n's (at least one).
    pub fn new(workers: usize, make: impl FnMut(usize) -> T) -> PerWorker<T> {
        PerWorker {
            slots: (0..workers.max(1))
                .map(make)
                .map(CachePadded::new)
                .collect(),
        }
    }

    /// The calling worker's number among these.
    pub fn index(&self) -> usize {
        current() % self.slots.len()
    }

    /// The calling worker's.
    pub fn mine(&self) -> &T {
        self.get(self.index())
    }

    pub fn get(&self, worker: usize) -> &T {
        &self.slots[worker]
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|slot| &**slot)
    }
}

pub struct Workers {
    handles: Vec<Handle>,
    /// Ends every worker thread (and drops what its runtime still runs).
    stop: CancellationToken,
    /// Set once the generation's doors closed: its workers stop busy
    /// polling.
    calm: Arc<AtomicBool>,
    /// Each worker's heartbeats, which `watch` follows.
    beats: Arc<watch::Beats>,
}

impl Drop for Workers {
    /// The generation is over: its threads go with it, so a daemon run
    /// inside another process (a test's) leaves none behind.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How often a worker's clock ticks with nothing else to do.
const HEARTBEAT: Duration = watch::LOOK_EVERY;

/// Keeps a timer due within a second on the worker's clock. tokio wakes its
/// driver through an eventfd write whenever a new timer is due before every
/// other one; a connection's clocks (seconds away) are then never the
/// earliest, and a connection per request stops paying that syscall each
/// time (strace: 1.03 writes a request without it, 0.04 with it). Each
/// tick is counted: a worker whose count stops is stuck (see `watch`).
async fn heartbeat(beats: &watch::Beats, worker: usize) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        beats.beat(worker);
    }
}

/// The CPUs `count` workers are held to, one each, from those this
/// process may run on (its affinity: `taskset`, systemd's `CPUAffinity=`,
/// a cpuset): none when there are fewer than workers, as two workers held
/// to one CPU could not move to another that is idle.
fn cpus_for(count: usize) -> Vec<usize> {
    let allowed = match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => set,
        Err(err) => {
            tracing::warn!(cause = %err, "cannot read this process's CPUs; workers not pinned");
            return Vec::new();
        }
    };
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .collect();
    if cpus.len() < count {
        tracing::warn!(
            workers = count,
            cpus = cpus.len(),
            "more workers than CPUs to run on; workers not pinned"
        );
        return Vec::new();
    }
    cpus.into_iter().take(count).collect()
}

/// Holds the calling thread to `cpu`.
fn hold_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let held = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(err) = held {
        tracing::warn!(cpu, cause = %err, "cannot pin a worker to its CPU");
    }
}

impl Workers {
    /// Starts `count` worker threads; they run until the `Workers` drops.
    /// With `pin`, worker N runs only on the Nth CPU this process may use;
    /// with a `busy_poll` window, each spins through gaps in dense traffic
    /// (see the `busy_poll` module).
    pub fn start(count: usize, pin: bool, busy_poll: Duration) -> std::io::Result<Workers> {
        let mut handles = Vec::with_capacity(count);
        let stop = CancellationToken::new();
        let calm = Arc::new(AtomicBool::new(false));
        let beats = Arc::new(watch::Beats::new(count.max(1)));
        let cpus = if pin {
            cpus_for(count.max(1))
        } else {
            Vec::new()
        };
        for index in 0..count.max(1) {
            let cpu = cpus.get(index).copied();
            let mut builder = tokio::runtime::Builder::new_current_thread();
            builder.enable_all();
            if !busy_poll.is_zero() {
                busy_poll::hook(&mut builder, busy_poll);
            }
            let runtime = builder.build()?;
            handles.push(runtime.handle().clone());
            let stopped = stop.clone();
            let calm = Arc::clone(&calm);
            let beats = Arc::clone(&beats);
            std::thread::Builder::new()
                .name(format!("baton-worker-{index}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        hold_to(cpu);
                    }
                    WORKER.set(index);
                    runtime.block_on(async {
                        if !busy_poll.is_zero() {
                            tokio::spawn(busy_poll::spin(busy_poll, calm));
                        }
                        tokio::select! {
                            () = stopped.cancelled() => {}
                            () = heartbeat(&beats, index) => {}
                        }
                    });
                })?;
        }
        Ok(Workers {
            handles,
            stop,
            calm,
            beats,
        })
    }

    /// The workers' heartbeats, for `watch`.
    pub fn beats(&self) -> Arc<watch::Beats> {
        Arc::clone(&self.beats)
    }

    /// Stops busy polling: the generation no longer accepts, and its
    /// successor's workers should have the cores.
    pub fn calm(&self) {
        self.calm.store(true, Ordering::Relaxed);
    }

    /// The worker that runs shard number `shard` of a listener.
    pub fn for_shard(&self, shard: usize) -> &Handle {
        &self.handles[shard % self.handles.len()]
    }

    pub fn count(&self) -> usize {
        self.handles.len()
    }
}

#[cfg(test)]
mod tests {
    use super::PerWorker;

    /// Two workers' slots never share a cache line (each is written at
    /// every request), and off the workers a thread gets worker 0's.
    #[test]
    fn each_workers_slot_has_a_cache_line_of_its_own() {
        let slots = PerWorker::new(2, |n| n);
        let line = |i: usize| std::ptr::from_ref(slots.get(i)) as usize / 64;
        assert!(line(1) > line(0), "slots 0 and 1 share a cache line");
        assert_eq!((slots.index(), *slots.mine()), (0, 0));
        assert_eq!(slots.iter().copied().collect::<Vec<_>>(), vec![0, 1]);
    }
}
