//! A backend's own series: in flight, its state (one gauge per state, 1
//! for the current one), health checks and upstream errors by kind. They
//! live beside the backend, as each proxy's live beside it, so `metrics`
//! stays a leaf (names and shared handles) that imports no other module.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ::metrics::{Counter, Gauge};

use super::BackendState;
use crate::metrics::{BACKEND_IN_FLIGHT, BACKEND_STATE, HEALTH_CHECKS, UPSTREAM_ERRORS};

/// Per-backend handles: in-flight gauge, state gauges, check counters.
pub struct BackendMetrics {
    pub in_flight: Gauge,
    states: Mutex<StateGauges>,
    checks_ok: Counter,
    checks_failed: Counter,
}

/// One gauge per state, and whether the backend left its pool. Behind
/// one lock, in which the state is read: two threads that published at
/// once (an operator's drain, a worker's last lease ending it) could
/// write in the other order than they read, and leave `draining` set for
/// a backend `/status` said was `out`, until its next change.
struct StateGauges {
    gauges: Vec<(BackendState, Gauge)>,
    cleared: bool,
}

impl BackendMetrics {
    fn states(&self) -> MutexGuard<'_, StateGauges> {
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the gauges to the state `current` reads now.
    pub fn state(&self, current: impl FnOnce() -> BackendState) {
        let states = self.states();
        if states.cleared {
            return;
        }
        let current = current();
        for (state, gauge) in &states.gauges {
            gauge.set(if *state == current { 1.0 } else { 0.0 });
        }
    }

    /// A backend that left its pool: its gauges say nothing any more
    /// (the recorder cannot drop a series), whatever publishes after.
    pub fn clear(&self) {
        self.in_flight.set(0.0);
        let mut states = self.states();
        states.cleared = true;
        for (_, gauge) in &states.gauges {
            gauge.set(0.0);
        }
    }

    pub fn check(&self, ok: bool) {
        if ok {
            self.checks_ok.increment(1);
        } else {
            self.checks_failed.increment(1);
        }
    }
}

/// Creates a backend's series (the error kinds at 0) and its handles.
pub fn register(pool: &str, backend: &str) -> BackendMetrics {
    for kind in ["connect", "timeout", "protocol"] {
        metrics::counter!(UPSTREAM_ERRORS, "pool" => pool.to_string(), "backend" => backend.to_string(), "kind" => kind)
            .absolute(0);
    }
    let labels = |extra: (&'static str, &'static str)| {
        vec![
            metrics::Label::new("pool", pool.to_string()),
            metrics::Label::new("backend", backend.to_string()),
            metrics::Label::new(extra.0, extra.1),
        ]
    };
    BackendMetrics {
        in_flight: metrics::gauge!(BACKEND_IN_FLIGHT, "pool" => pool.to_string(), "backend" => backend.to_string()),
        states: Mutex::new(StateGauges {
            gauges: BackendState::ALL
                .iter()
                .map(|s| {
                    (
                        *s,
                        metrics::gauge!(BACKEND_STATE, labels(("state", s.as_str()))),
                    )
                })
                .collect(),
            cleared: false,
        }),
        checks_ok: metrics::counter!(HEALTH_CHECKS, labels(("result", "ok"))),
        checks_failed: metrics::counter!(HEALTH_CHECKS, labels(("result", "failed"))),
    }
}
