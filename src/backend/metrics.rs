//! A backend's own series: in flight, its state (one gauge per state, 1
//! for the current one), health checks and upstream errors by kind. They
//! live beside the backend, as each proxy's live beside it, so `metrics`
//! stays a leaf (names and shared handles) that imports no other module.

use ::metrics::{Counter, Gauge};

use super::BackendState;
use crate::metrics::{BACKEND_IN_FLIGHT, BACKEND_STATE, HEALTH_CHECKS, UPSTREAM_ERRORS};

/// Per-backend handles: in-flight gauge, state gauges, check counters.
pub struct BackendMetrics {
    pub in_flight: Gauge,
    states: Vec<(BackendState, Gauge)>,
    checks_ok: Counter,
    checks_failed: Counter,
}

impl BackendMetrics {
    pub fn state(&self, current: BackendState) {
        for (state, gauge) in &self.states {
            gauge.set(if *state == current { 1.0 } else { 0.0 });
        }
    }

    /// A backend that left its pool: its gauges say nothing any more
    /// (the recorder cannot drop a series).
    pub fn clear(&self) {
        self.in_flight.set(0.0);
        for (_, gauge) in &self.states {
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
        states: BackendState::ALL
            .iter()
            .map(|s| {
                (
                    *s,
                    metrics::gauge!(BACKEND_STATE, labels(("state", s.as_str()))),
                )
            })
            .collect(),
        checks_ok: metrics::counter!(HEALTH_CHECKS, labels(("result", "ok"))),
        checks_failed: metrics::counter!(HEALTH_CHECKS, labels(("result", "failed"))),
    }
}
