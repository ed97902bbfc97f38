//! A capped pool's line (`max_connections_per_backend`): work that found
//! every backend at its cap waits here, first come, first served. A place
//! that frees up goes straight to the oldest waiter that may use it, as
//! HAProxy hands a freed slot to its queue, never back to the pool where a
//! newcomer could take it first or a waiter that excludes that backend
//! (a retry after it failed) could swallow the wake-up.
//!
//! One lock orders the three moves that touch a place: a newcomer looking
//! for one and joining the line, a lease ending (handed on, or given back),
//! and a backend coming up (its places offered down the line). So a place
//! is never given back while someone who could use it waits, and a newcomer
//! that joins never misses one freed meanwhile.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::in_flight::Place;
use super::{Backend, Lease, NoLease};

pub(crate) struct Line {
    /// `max_connections_per_backend`.
    cap: usize,
    waiting: Mutex<Waiters>,
    /// Someone waits: read without the lock by `Pool::pick`, so work
    /// that finds no one waiting takes a place lock-free; written under
    /// the lock at every change of the queue.
    occupied: AtomicBool,
}

#[derive(Default)]
struct Waiters {
    queue: VecDeque<Waiter>,
    next_id: u64,
}

/// One unit of work in line: the backend it must not use (the one its
/// first attempt failed on), and where its place is handed.
struct Waiter {
    id: u64,
    exclude: Option<usize>,
    place: oneshot::Sender<Arc<Backend>>,
}

/// A place in line, held by the work waiting. Dropped before it is served
/// (its client left, or it timed out), it leaves the line; a place handed
/// to it just then goes on to the next waiter.
pub(crate) struct Ticket<'a> {
    line: &'a Line,
    id: u64,
    place: oneshot::Receiver<Arc<Backend>>,
    /// Served: it left the line when it was handed its place.
    served: bool,
}

impl Line {
    pub fn new(cap: usize) -> Line {
        Line {
            cap,
            waiting: Mutex::default(),
            occupied: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // A panic elsewhere while holding it leaves the queue itself whole.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether work waits in line now.
    pub fn has_waiters(&self) -> bool {
        self.occupied.load(Ordering::SeqCst)
    }

    /// Says whether anyone waits, after a change of `waiters` (under the
    /// lock, so writers are one at a time). Stored only when it changed:
    /// every lease's end comes here, and a store each time would take the
    /// flag's cache line from every worker's `Pool::pick`, which reads it
    /// on every request.
    fn note(&self, waiters: &Waiters) {
        let occupied = !waiters.queue.is_empty();
        if self.occupied.load(Ordering::SeqCst) != occupied {
            self.occupied.store(occupied, Ordering::SeqCst);
        }
    }

    /// Takes a place now through `pick`, among backends no waiter may use,
    /// or joins the line when `pick` finds none (both under the line's
    /// lock, so a place freed between them is handed to us). A place a
    /// waiter may use is free only in the moment between a backend coming
    /// up and its places being offered down the line (`offer`): it is the
    /// waiter's. `NoBackend` when `any_up` says no backend it may use is
    /// up: waiting would be for nothing.
    pub fn join(
        &self,
        exclude: Option<usize>,
        pick: impl FnOnce(&dyn Fn(&Backend) -> bool) -> Option<Lease>,
        any_up: impl FnOnce() -> bool,
    ) -> Result<Result<Lease, Ticket<'_>>, NoLease> {
        let mut waiters = self.lock();
        if let Some(lease) = pick(&|backend: &Backend| !waiters.wants(backend)) {
            return Ok(Ok(lease));
        }
        if !any_up() {
            return Err(NoLease::NoBackend);
        }
        let (tx, rx) = oneshot::channel();
        let id = waiters.next_id;
        waiters.next_id += 1;
        waiters.queue.push_back(Waiter {
            id,
            exclude,
            place: tx,
        });
        self.note(&waiters);
        Ok(Err(Ticket {
            line: self,
            id,
            place: rx,
            served: false,
        }))
    }

    /// A lease on `backend` ended: its place goes to the oldest waiter that
    /// may use it, or back to the backend (its count down) when none does.
    /// True when it was given back.
    pub fn pass_on(&self, backend: &Arc<Backend>) -> bool {
        let mut waiters = self.lock();
        // `available` reads retirement relaxed: a member just retired gets
        // no new work through the line either.
        let open = backend.available() && !backend.retired.load(Ordering::SeqCst);
        let handed = open && waiters.hand(backend);
        // `hand` may also have dropped waiters that were gone.
        self.note(&waiters);
        if handed {
            return false;
        }
        backend.give_back(Place::Capped);
        true
    }

    /// `backend` came up (or was restored, or joined): every place it has
    /// free goes down the line, oldest waiter first.
    pub fn offer(&self, backend: &Arc<Backend>) {
        let mut waiters = self.lock();
        while backend.available()
            && waiters.wants(backend)
            && backend.take_place(self.cap).is_some()
        {
            if !waiters.hand(backend) {
                backend.give_back(Place::Capped);
                break;
            }
        }
        self.note(&waiters);
    }

    /// Found by its id, which orders the line (it joins at the back with
    /// the next id, and leaves only): a line of thousands timed out at once
    /// leaves oldest first, each from the front, where a scan of the whole
    /// line each under the lock took them in time squared.
    fn leave(&self, id: u64) {
        let mut waiters = self.lock();
        if let Ok(at) = waiters.queue.binary_search_by_key(&id, |w| w.id) {
            waiters.queue.remove(at);
        }
        self.note(&waiters);
    }
}

impl Waiters {
    /// Whether a waiter may use `backend`.
    fn wants(&self, backend: &Backend) -> bool {
        self.queue.iter().any(|w| w.exclude != Some(backend.index))
    }

    /// Hands a place on `backend` (already counted) to the oldest waiter
    /// that may use it; false when none does.
    fn hand(&mut self, backend: &Arc<Backend>) -> bool {
        let mut place = Arc::clone(backend);
        while let Some(at) = self
            .queue
            .iter()
            .position(|w| w.exclude != Some(backend.index))
        {
            let Some(waiter) = self.queue.remove(at) else {
                break;
            };
            // A waiter leaves the line before its receiver goes, so this
            // fails only if that order is ever broken: then the next one.
            match waiter.place.send(place) {
                Ok(()) => return true,
                Err(back) => place = back,
            }
        }
        false
    }
}

impl Ticket<'_> {
    /// Waits for a place until `deadline`.
    pub async fn served(mut self, deadline: Instant) -> Result<Lease, NoLease> {
        match tokio::time::timeout_at(deadline, &mut self.place).await {
            Ok(Ok(backend)) => {
                self.served = true;
                Ok(Lease::handed(backend))
            }
            Ok(Err(_)) => Err(NoLease::NoBackend),
            Err(_) => Err(NoLease::QueueTimeout),
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.served {
            return;
        }
        self.line.leave(self.id);
        // Handed a place as we left: it goes on down the line (the lease's
        // end passes it on, outside the line's lock).
        if let Ok(backend) = self.place.try_recv() {
            drop(Lease::handed(backend));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::super::{AdminState, Lease, NoLease, Pool};
    use crate::config::{BackendConfig, Balance, PoolConfig};

    /// A pool of `backends` backends, each with one place.
    fn pool(backends: u16) -> Pool {
        let config = PoolConfig {
            name: "p".into(),
            balance: Balance::RoundRobin,
            health: None,
            backends: (0..backends)
                .map(|i| BackendConfig {
                    name: format!("b{i}"),
                    address: ([127, 0, 0, 1], 9000 + i).into(),
                    weight: 1,
                })
                .collect(),
            named: Vec::new(),
            resolve_interval: Duration::from_secs(1),
            max_connections_per_backend: 1,
            queue_timeout: Duration::from_secs(10),
            tls: None,
            send_proxy: None,
        };
        Pool::new(&config, 0, std::sync::Arc::default(), 1)
    }

    /// Work that asks `pool` for a place (excluding `exclude`), run until
    /// it has one or waits in line.
    async fn in_line(
        pool: &std::sync::Arc<Pool>,
        exclude: Option<usize>,
    ) -> tokio::task::JoinHandle<Result<Lease, NoLease>> {
        let pool = std::sync::Arc::clone(pool);
        let waiting = tokio::spawn(async move { pool.lease(exclude).await });
        tokio::task::yield_now().await;
        waiting
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_place_goes_to_the_oldest_waiter_not_to_a_newcomer() {
        let p = std::sync::Arc::new(pool(1));
        let held = p.pick(None).expect("the only place");
        let first = in_line(&p, None).await;
        let second = in_line(&p, None).await;
        drop(held);
        assert!(p.pick(None).is_none(), "the place went to the line");
        let served = first.await.expect("join").expect("the oldest is served");
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "the next waits its turn");
        drop(served);
        let last = second.await.expect("join").expect("then the next");
        assert_eq!(last.backend().in_flight(), 1, "one place, one holder");
    }

    /// Between a backend coming up and its places being offered down the
    /// line, a newcomer does not take one: the work in line came first.
    /// One no waiter may use is the newcomer's at once.
    #[tokio::test(start_paused = true)]
    async fn a_backend_that_comes_up_serves_the_line_before_a_newcomer() {
        let p = std::sync::Arc::new(pool(2));
        let on_0 = p.pick(None).expect("b0");
        let b1 = std::sync::Arc::clone(&p.backends().backends[1]);
        b1.drain();
        let waiting = in_line(&p, None).await;
        // Up, not yet offered (what `restore` does next).
        b1.admin.store(AdminState::Enabled as u8, Ordering::SeqCst);
        assert!(
            p.pick(None).is_none(),
            "the newcomer took the waiter's place"
        );
        let newcomer = in_line(&p, None).await;
        b1.wake_queue();
        let served = waiting.await.expect("join").expect("served by b1");
        assert_eq!(served.backend().index, 1);
        tokio::task::yield_now().await;
        assert!(!newcomer.is_finished(), "the newcomer waits its turn");
        drop(on_0);
        let next = newcomer.await.expect("join").expect("then the newcomer");
        assert_eq!(next.backend().index, 0);
        drop((served, next));

        let on_0 = p.pick(Some(1)).expect("b0");
        let retry = in_line(&p, Some(1)).await;
        let newcomer = in_line(&p, None).await;
        assert!(
            newcomer.is_finished(),
            "b1 is no waiter's: it is taken at once"
        );
        let took = newcomer.await.expect("join").expect("b1");
        assert_eq!(took.backend().index, 1);
        drop(on_0);
        assert_eq!(retry.await.expect("join").expect("b0").backend().index, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_a_waiter_may_not_use_goes_to_the_next_one() {
        let p = std::sync::Arc::new(pool(2));
        let on_0 = p.pick(None).expect("b0");
        let on_1 = p.pick(None).expect("b1");
        assert_eq!(on_0.backend().index, 0);
        let retry = in_line(&p, Some(0)).await;
        let fresh = in_line(&p, None).await;
        drop(on_0);
        let served = fresh.await.expect("join").expect("served by b0");
        assert_eq!(served.backend().index, 0);
        tokio::task::yield_now().await;
        assert!(!retry.is_finished(), "b0 is not for the retry");
        drop(on_1);
        let retried = retry.await.expect("join").expect("served by b1");
        assert_eq!(retried.backend().index, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_handed_to_work_that_just_left_goes_on_down_the_line() {
        let p = std::sync::Arc::new(pool(1));
        let held = p.pick(None).expect("the only place");
        let gone = in_line(&p, None).await;
        let next = in_line(&p, None).await;
        drop(held);
        gone.abort();
        let served = next.await.expect("join").expect("the place went on");
        assert_eq!(served.backend().in_flight(), 1, "counted once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_restored_backend_serves_the_line_and_a_timed_out_waiter_leaves_it() {
        let p = std::sync::Arc::new(pool(2));
        let on_0 = p.pick(None).expect("b0");
        let b1 = std::sync::Arc::clone(&p.backends().backends[1]);
        b1.drain();
        let waiting = in_line(&p, None).await;
        b1.restore();
        let served = waiting.await.expect("join").expect("served by b1");
        assert_eq!(served.backend().index, 1);

        let late = in_line(&p, None).await;
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(late.await.expect("join").err(), Some(NoLease::QueueTimeout));
        drop(on_0);
        assert!(p.pick(None).is_some(), "given back: nobody waits any more");
    }

    /// Work in line whose every backend went down while it waited is told
    /// of the outage when its time runs out, not of a shortage of places.
    #[tokio::test(start_paused = true)]
    async fn a_wait_that_ends_with_every_backend_down_is_no_backend() {
        let p = std::sync::Arc::new(pool(1));
        let held = p.pick(None).expect("the only place");
        let waiting = in_line(&p, None).await;
        p.backends().backends[0].drain();
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(waiting.await.expect("join").err(), Some(NoLease::NoBackend));
        drop(held);
    }
}
