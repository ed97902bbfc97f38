//! Work in flight on one backend, counted so that a request's count
//! touches no cache line another worker writes: each worker adds and takes
//! away on a line of its own, and readers (least-conn picks, drains,
//! `/status`, `/metrics`) sum the lines. One count for every worker
//! bounced its line between their cores twice a request, and with it the
//! backend's fields that every pick reads. A capped pool keeps one shared
//! count instead: a place under the cap must be taken atomically.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::workers::PerWorker;

pub struct InFlight {
    /// Places of a capped pool, taken under the cap.
    capped: AtomicUsize,
    /// Places taken by each worker, each given back where it was taken.
    per_worker: PerWorker<AtomicUsize>,
}

/// Where a place was counted: it is given back there, whichever thread
/// ends its lease, so no count goes below zero and the sum is never short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Capped,
    Worker(usize),
}

impl InFlight {
    pub fn new(workers: usize) -> InFlight {
        InFlight {
            capped: AtomicUsize::new(0),
            per_worker: PerWorker::new(workers, |_| AtomicUsize::new(0)),
        }
    }

    /// Takes a place: under `cap` in a capped pool (none at the cap), on
    /// the calling worker's count without one (`cap` 0; any thread outside
    /// the workers counts on worker 0's).
    pub fn take(&self, cap: usize) -> Option<Place> {
        if cap == 0 {
            let worker = self.per_worker.index();
            self.per_worker.get(worker).fetch_add(1, Ordering::SeqCst);
            return Some(Place::Worker(worker));
        }
        self.capped
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Place::Capped)
    }

    /// Gives back a place `take` gave.
    pub fn give_back(&self, place: Place) {
        let count = match place {
            Place::Capped => &self.capped,
            Place::Worker(worker) => self.per_worker.get(worker),
        };
        count.fetch_sub(1, Ordering::SeqCst);
    }

    /// Places taken and not given back. Sequentially consistent with the
    /// changes: of two last places given back at once on two workers, at
    /// least one giver reads none left (a drain's `out` is not missed).
    pub fn total(&self) -> usize {
        self.per_worker
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .sum::<usize>()
            + self.capped.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::{InFlight, Place};

    /// Each worker counts on its own line, and a place given back on
    /// another thread than took it goes back where it was taken.
    #[tokio::test]
    async fn each_worker_counts_on_its_own_and_the_sum_holds() {
        let counts = std::sync::Arc::new(InFlight::new(2));
        let workers =
            crate::workers::Workers::start(2, false, std::time::Duration::ZERO).expect("workers");
        let mut places = Vec::new();
        for worker in 0..2 {
            let counts = std::sync::Arc::clone(&counts);
            places.push(
                workers
                    .for_shard(worker)
                    .spawn(async move { counts.take(0).expect("uncapped") })
                    .await
                    .expect("worker"),
            );
        }
        assert_eq!(places, vec![Place::Worker(0), Place::Worker(1)]);
        assert_eq!(counts.total(), 2);
        let given_back = std::sync::Arc::clone(&counts);
        workers
            .for_shard(1)
            .spawn(async move { places.into_iter().for_each(|p| given_back.give_back(p)) })
            .await
            .expect("worker 1");
        assert_eq!(
            counts.total(),
            0,
            "taken on both workers, given back on one"
        );
        assert_eq!(
            counts
                .per_worker
                .get(0)
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[test]
    fn a_capped_count_stops_at_its_cap() {
        let counts = InFlight::new(2);
        let places = [counts.take(2), counts.take(2)];
        assert_eq!(places, [Some(Place::Capped); 2]);
        assert_eq!(counts.take(2), None, "a third place over a cap of 2");
        assert_eq!(counts.total(), 2);
        counts.give_back(Place::Capped);
        assert_eq!(counts.take(2), Some(Place::Capped));
    }
}
