//! A generation taking work: its accept loops open, systemd told (READY,
//! fd store, watchdog, STATUS lines).

use super::build::Door;
use super::*;
use crate::lifecycle::systemd::FdStoreUpdate;

impl Generation {
    /// Every accept loop's socket made ready to take connections:
    /// listening with the config's backlog (a reload's new generation's
    /// fresh sockets listen only now, while the old one still accepts; the
    /// rest listen already, and take a changed backlog), then watched by
    /// the reactor of the worker that will run its loop (see
    /// `Listener::register`); in that order, as a socket that does not
    /// listen yet reads as hung up to epoll, and its loop would find it
    /// ready for good. Before `Accepting`: a socket that cannot listen or
    /// be watched fails the reload (the old generation kills this one and
    /// serves on) or the first start, instead of leaving a listener that
    /// takes no connection. Listeners the old generation serves too come
    /// last (`build` orders them so): a fresh shard of one joins the old
    /// generation's `SO_REUSEPORT` group, and would take connections that
    /// the failed reload then resets. (Those listening before a socket
    /// that cannot be watched do take connections the failed reload
    /// resets: listening must come first.)
    pub(super) fn make_ready(&mut self) -> Result<Vec<Door>, StartError> {
        self.pending
            .drain(..)
            .map(|(listener, shard, connections, fate)| {
                let name = listener.settings.name.to_string();
                listener.listen().map_err(|source| StartError::Listen {
                    name: name.clone(),
                    addr: listener
                        .socket
                        .local_addr()
                        .map_or_else(|e| e.to_string(), |a| a.to_string()),
                    source,
                })?;
                let watched = listener
                    .register(self.workers.for_shard(shard))
                    .map_err(|source| StartError::Watch { name, source })?;
                Ok((watched, shard, connections, fate))
            })
            .collect()
    }

    /// Starts every accept loop (their sockets listen already): from here
    /// on this generation takes work.
    pub(super) fn open_doors(&mut self, doors: Vec<Door>) {
        probe::spawn_all(&self.pools, &self.background);
        tokio::spawn(crate::workers::watch(
            self.workers.beats(),
            Arc::clone(&self.admin.stuck_workers),
            self.background.clone(),
        ));
        tokio::spawn(crate::telemetry::held_back_reports());
        if let Some(resolver) = &self.resolver {
            crate::resolve::refresh::spawn_all(&self.pools, resolver, &self.background);
        }
        for (listener, shard, connections, fate) in doors {
            let stop = self.accept_stop.clone();
            let closing = move || match fate.get() {
                Fate::Adopted => Closing::HandedOver,
                Fate::Kept => Closing::Last,
                Fate::Dropped => Closing::Removed,
            };
            self.accept_tasks.spawn_on(
                listener.run(connections, stop, closing),
                self.workers.for_shard(shard),
            );
        }
        if let Some(control) = self.control.take() {
            self.accept_tasks.spawn(control::serve(
                control,
                self.control_tx.clone(),
                self.accept_stop.clone(),
                self.control_tasks.clone(),
            ));
        }
    }

    /// Active from now on. A takeover tells systemd at once (the service
    /// was ready already); a first start once the first health round has
    /// run, as DESIGN.md says: backends need not be healthy (a pool down at
    /// boot must not hold every other pool's traffic back; `/readyz` is what
    /// says whether pools are healthy). Returns the fd store update a
    /// takeover sends again once the old generation has exited.
    pub(super) fn became_active(&mut self, takeover: bool) -> Option<FdStoreUpdate> {
        // A first start a stop caught is never said to be ready (nor is
        // `/readyz` 200 for a moment): it serves what queued and stops.
        if !self.caught_starting {
            let _ = self.phase.send(Phase::Active);
        }
        if takeover {
            metrics::took_over();
        }
        let status = self.status_line();
        tracing::info!(
            generation = self.number,
            pid = std::process::id(),
            "serving"
        );
        let mut fd_store = None;
        if systemd::enabled() {
            match self.holdings.duplicates() {
                Ok(held) => {
                    let update = FdStoreUpdate::new(self.unclaimed.clone(), held);
                    update.send();
                    fd_store = Some(update);
                }
                Err(err) => tracing::warn!(cause = %err, "cannot update systemd's fd store"),
            }
            // Pinged until the process ends, or a retirement's naming
            // window does: an old generation stays main (and watched)
            // until its MAINPID= for the successor lands.
            let stuck = Arc::clone(&self.admin.stuck_workers);
            tokio::spawn(systemd::watchdog(self.watchdog.clone(), move || {
                !stuck.any()
            }));
            tokio::spawn(status_lines(
                Arc::clone(&self.admin),
                self.pools.clone(),
                self.phase.subscribe(),
                Arc::clone(&self.standing),
                self.background.clone(),
            ));
        }
        // What a takeover sends again; nothing for a first start.
        let again = if takeover { fd_store } else { None };
        if takeover && self.predecessor_started {
            self.standing.started(&status);
            return again;
        }
        if self.caught_starting {
            return None;
        }
        let first_round_done = |pools: &[Arc<Pool>]| pools.iter().all(|p| p.first_round_done());
        if first_round_done(&self.pools) {
            self.standing.started(&status);
            return again;
        }
        let (pools, stop) = (self.pools.clone(), self.background.clone());
        let (phase, standing) = (self.phase.subscribe(), Arc::clone(&self.standing));
        tokio::spawn(async move {
            tracing::info!("waiting for the first health round before READY=1");
            while !first_round_done(&pools) {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
            // Not once a stop began (its STOPPING=1 is the last word), nor
            // during a reload of ours (`status_lines` says it later); not at
            // all once we handed over (the successor's lines are systemd's).
            if matches!(*phase.borrow(), Phase::Active) {
                standing.started(&status);
            }
        });
        again
    }

    pub(super) fn status_line(&self) -> String {
        format!(
            "generation {} serving {} listener(s)",
            self.number,
            self.config.listeners.len()
        )
    }
}

/// Keeps systemd's one-line `STATUS=` current while we serve: at once,
/// after half a second, then every two seconds. Once every pool is ready
/// the line carries `READY=1` too: systemd 252 drops what a new generation
/// sends before its `MAINPID=` lands, so a takeover's first `READY=1` and
/// `STATUS=` may be lost, and repeating them is harmless. `standing`
/// decides under its lock: not `READY=1` while a reload of ours is under
/// way (it would end systemd's reload state before the new generation
/// serves), and nothing once a stop began (its `READY=1` and line would
/// replace the stop's `STATUS=stopping: draining` in `systemctl status`).
async fn status_lines(
    admin: Arc<AdminShared>,
    pools: Vec<Arc<Pool>>,
    phase: watch::Receiver<Phase>,
    standing: Arc<systemd::Standing>,
    stop: CancellationToken,
) {
    let mut pause = Duration::from_millis(500);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        if !matches!(*phase.borrow(), Phase::Active) {
            return;
        }
        pause = Duration::from_secs(2);
        let generations = admin.generations();
        let connections: u64 = generations.first().map_or(0, |g| g.in_flight);
        let up: usize = pools.iter().map(|p| p.healthy_count()).sum();
        let total: usize = pools.iter().map(|p| p.backends().backends.len()).sum();
        let line = format!(
            "generation {}: {connections} connection(s), {up}/{total} backends up, {} generation(s) draining",
            admin.generation.number,
            generations.len() - 1
        );
        standing.report(&line);
    }
}
