//! Backends and pools: who can take work, and how much each holds now.
//! A [`Lease`] is one unit of in-flight work on a backend; it is counted
//! while alive, which is what `least_conn` and `/status` read.

pub mod balance;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::{Balance, PoolConfig};
use crate::metrics;

pub struct Backend {
    /// Global index in config order (the admin API's `{id}`).
    pub index: usize,
    pub name: String,
    pub address: SocketAddr,
    pub weight: u32,
    pub pool: String,
    in_flight: AtomicUsize,
    in_flight_gauge: ::metrics::Gauge,
}

impl Backend {
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

pub struct Pool {
    pub name: String,
    pub backends: Vec<Arc<Backend>>,
    balance: Balance,
    cursor: AtomicUsize,
}

impl Pool {
    /// Builds pool `config`, numbering its backends from `first_index`.
    pub fn new(config: &PoolConfig, first_index: usize) -> Pool {
        let backends = config
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                Arc::new(Backend {
                    index: first_index + i,
                    name: b.name.clone(),
                    address: b.address,
                    weight: b.weight,
                    pool: config.name.clone(),
                    in_flight: AtomicUsize::new(0),
                    in_flight_gauge: metrics::backend_in_flight(&config.name, &b.name),
                })
            })
            .collect();
        Pool {
            name: config.name.clone(),
            backends,
            balance: config.balance,
            cursor: AtomicUsize::new(0),
        }
    }

    /// Builds every pool of a config, with global backend indices.
    pub fn all(configs: &[PoolConfig]) -> Vec<Arc<Pool>> {
        let mut next = 0;
        configs
            .iter()
            .map(|c| {
                let pool = Pool::new(c, next);
                next += c.backends.len();
                Arc::new(pool)
            })
            .collect()
    }

    /// Picks a backend for one unit of work, skipping `exclude` (a backend
    /// that just failed), or `None` when no backend can take it.
    pub fn pick(&self, exclude: Option<usize>) -> Option<Lease> {
        let candidates: Vec<&Arc<Backend>> = self
            .backends
            .iter()
            .filter(|b| Some(b.index) != exclude)
            .collect();
        let ticket = self.cursor.fetch_add(1, Ordering::Relaxed);
        let chosen = balance::choose(self.balance, &candidates, ticket)?;
        Some(Lease::new(Arc::clone(candidates[chosen])))
    }
}

/// One request or connection on a backend; counted until dropped.
pub struct Lease {
    backend: Arc<Backend>,
}

impl Lease {
    fn new(backend: Arc<Backend>) -> Lease {
        backend.in_flight.fetch_add(1, Ordering::Relaxed);
        backend.in_flight_gauge.increment(1.0);
        Lease { backend }
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.backend.in_flight_gauge.decrement(1.0);
    }
}
