//! One view over every live generation: this one, plus what the older ones
//! still draining reported (their counters become our baseline, so no
//! counter ever goes backwards across a reload; their connections and
//! process numbers show under `state="draining"`).

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use super::AdminShared;
use crate::lifecycle::handoff::{GenerationEntry, GenerationState, Report};
use crate::metrics::exposition::InFlightOnBackends;
use crate::metrics::{self, exposition, kernel, process, Sampled};

pub fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl AdminShared {
    /// Takes a report from the older generation (with the offer, or while
    /// it drains), less the series of what our config no longer has: a
    /// removed listener, pool or backend is carried to no later generation.
    /// A series an earlier report had and this one lacks keeps its value
    /// (`exposition::keep_dropped`).
    pub fn set_inherited(&self, mut report: Report) {
        exposition::retain_configured(&mut report.baseline, &self.configured);
        exposition::drop_idle(&mut report.baseline);
        tracing::debug!(
            series = report.baseline.len(),
            generations = report.generations.len(),
            "report from the older generation"
        );
        if let Ok(mut r) = self.inherited.write() {
            let previous = std::mem::take(&mut r.baseline);
            exposition::keep_dropped(&mut report.baseline, previous);
            *r = report;
        }
    }

    /// The older generation we took over from exited: its last counters
    /// stay, and its entries go but for those of generations older still
    /// that run on (`running`): one whose drain outlasted the wait of the
    /// one between (its own `reload.drain_timeout`) still holds
    /// connections, shown as its last report had them (they can only have
    /// fallen since), until it exits too ([`Self::inherited_gone`]).
    pub fn inherited_exited(&self, running: &[u32]) {
        if let Ok(mut r) = self.inherited.write() {
            r.generations.retain(|g| running.contains(&g.pid));
        }
    }

    /// An older generation exited: its entry goes.
    pub fn inherited_gone(&self, pid: u32) {
        if let Ok(mut r) = self.inherited.write() {
            r.generations.retain(|g| g.pid != pid);
        }
    }

    /// Connections the older generations have reported force-closed by
    /// their drains, all told: a stop that waits for them compares it
    /// before and after, for its exit code.
    pub fn inherited_forced_connections(&self) -> f64 {
        self.inherited
            .read()
            .map(|r| {
                r.baseline
                    .values()
                    .filter(|s| s.family == metrics::DRAIN_FORCED)
                    .map(|s| s.value)
                    .sum()
            })
            .unwrap_or(0.0)
    }

    fn inherited(&self) -> Report {
        self.inherited.read().map(|r| r.clone()).unwrap_or_default()
    }

    /// The older generations' entries alone: `/status` and the drain's
    /// reports read them often, and a copy of the whole report (thousands
    /// of series at scale) for them was a waste.
    fn inherited_generations(&self) -> Vec<GenerationEntry> {
        self.inherited
            .read()
            .map(|r| r.generations.clone())
            .unwrap_or_default()
    }

    /// This generation's own entry.
    pub fn own_entry(&self) -> GenerationEntry {
        let topology = self.topology();
        let active = topology
            .listeners
            .iter()
            .map(|l| (l.name.clone(), l.stats.active() as u64))
            .collect();
        let in_flight = topology
            .listeners
            .iter()
            .map(|l| l.stats.active() as u64)
            .sum();
        // One borrow, released at once: a second read guard taken while
        // the supervisor waits to write the phase would deadlock (the watch
        // is a writer-preferring lock).
        let (state, drain_deadline) = {
            let phase = self.phase.borrow();
            (phase.state(), phase.drain_deadline())
        };
        let mut backends_in_flight = InFlightOnBackends::new();
        for pool in &topology.pools {
            for b in pool.backends().backends.iter() {
                let n = b.in_flight() as u64;
                if n > 0 {
                    backends_in_flight
                        .entry(pool.name.clone())
                        .or_default()
                        .insert(b.label.clone(), n);
                }
            }
        }
        GenerationEntry {
            number: self.generation.number,
            pid: self.generation.pid,
            state,
            started_at: unix(self.generation.started_at),
            in_flight,
            drain_deadline: drain_deadline.map(unix),
            active,
            process: process::read(),
            backends_in_flight,
        }
    }

    /// What the older generations still draining have in flight on each
    /// backend, all told (read in place: the report also holds every
    /// carried series).
    pub fn in_flight_of_older(&self) -> InFlightOnBackends {
        self.inherited
            .read()
            .map(|r| in_flight_of(&r.generations))
            .unwrap_or_default()
    }

    /// Every live generation, newest (this one) first.
    pub fn generations(&self) -> Vec<GenerationEntry> {
        let mut all = vec![self.own_entry()];
        // Older generations are draining once we serve, whatever their last
        // report (sent before the takeover) said.
        all.extend(self.inherited_generations().into_iter().map(|mut g| {
            g.state = GenerationState::Draining;
            g
        }));
        all
    }

    /// The exposition `/metrics` serves: our series plus the baseline, with
    /// the sampled gauges (queues, kernel, processes) refreshed first.
    pub fn render_metrics(&self) -> String {
        let Some(handle) = &self.metrics else {
            return String::new();
        };
        let inherited = self.inherited();
        self.sample(&inherited);
        let merged = exposition::merge(&handle.render(), &inherited.baseline);
        let merged =
            exposition::with_older_in_flight(merged, &in_flight_of(&inherited.generations));
        exposition::without_gone(merged, &self.members(), &self.listeners(&inherited))
    }

    /// The listeners with series to show: ours, and those an older
    /// generation still drains connections on (a listener a reload
    /// removed, whose draining count leaves with the last of them).
    fn listeners(&self, inherited: &Report) -> HashSet<String> {
        let mut names = self.configured.listeners.clone();
        for g in &inherited.generations {
            names.extend(g.active.keys().cloned());
        }
        names
    }

    /// The pools' members from DNS as they are now (see
    /// [`exposition::Members`]).
    fn members(&self) -> exposition::Members {
        let mut members = exposition::Members::default();
        for pool in &self.topology().pools {
            for b in pool.backends().backends.iter() {
                if b.resolved_from.is_some() {
                    members.insert(&pool.name, &b.label);
                }
            }
        }
        members
    }

    fn sample(&self, inherited: &Report) {
        let topology = self.topology();
        for pool in &topology.pools {
            pool.backends()
                .backends
                .iter()
                .for_each(|b| b.publish_in_flight());
        }
        let backlog = topology
            .listeners
            .iter()
            .map(|l| (l.name.as_str(), l.backlog()))
            .collect();
        let mut draining_active = std::collections::BTreeMap::new();
        let mut draining = process::ProcessStats::default();
        for g in &inherited.generations {
            for (listener, n) in &g.active {
                *draining_active.entry(listener.clone()).or_insert(0) += n;
            }
            draining.add(&g.process);
        }
        for l in &topology.listeners {
            draining_active.entry(l.name.clone()).or_insert(0);
        }
        if let Ok(mut shown) = self.draining_shown.lock() {
            for name in shown.iter() {
                draining_active.entry(name.clone()).or_insert(0);
            }
            shown.extend(draining_active.keys().cloned());
        }
        metrics::record_sampled(&Sampled {
            backlog,
            draining_active,
            draining_generations: inherited.generations.len(),
            serving: process::read(),
            draining,
            netstat: kernel::netstat(),
        });
    }

    /// What we tell our successor: cumulative counters and live generations.
    /// (No sampling here: sampled series are gauges or the kernel's own
    /// absolute counters, which are never carried.)
    pub fn report(&self) -> Report {
        let inherited = self.inherited();
        let own = self
            .metrics
            .as_ref()
            .map(|h| h.render())
            .unwrap_or_default();
        let members = self.members();
        let mut baseline = exposition::baseline(&exposition::merge(&own, &inherited.baseline));
        baseline.retain(|key, _| members.keeps(key));
        Report {
            baseline,
            generations: self.generations(),
        }
    }
}

/// What `generations` have in flight on each backend, all told.
fn in_flight_of(generations: &[GenerationEntry]) -> InFlightOnBackends {
    let mut all = InFlightOnBackends::new();
    for g in generations {
        for (pool, backends) in &g.backends_in_flight {
            let into = all.entry(pool.clone()).or_default();
            for (backend, n) in backends {
                *into.entry(backend.clone()).or_insert(0) += n;
            }
        }
    }
    all
}
