//! A generation taking work: its accept loops open, systemd told (READY,
//! fd store, watchdog, STATUS lines).

use super::build::pools_ready;
use super::*;

impl Generation {
    /// Starts every accept loop: from here on this generation takes work.
    pub(super) fn open_doors(&mut self) {
        probe::spawn_all(&self.pools, &self.background);
        for (listener, connections, handed_over) in self.pending.drain(..) {
            let stop = self.accept_stop.clone();
            let closing = move || {
                if handed_over.load(Ordering::SeqCst) {
                    Closing::HandedOver
                } else {
                    Closing::Last
                }
            };
            self.accept_tasks
                .spawn(listener.run(connections, stop, closing));
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
    /// was ready already); a first start only once every pool has a healthy
    /// backend, which is when `/readyz` turns 200.
    pub(super) fn became_active(&mut self, takeover: bool) {
        let _ = self.phase.send(Phase::Active);
        let status = self.status_line();
        tracing::info!(
            generation = self.number,
            pid = std::process::id(),
            "serving"
        );
        if systemd::enabled() {
            // Removed first: a stale entry may share a name we store now.
            self.unclaimed
                .iter()
                .for_each(|name| systemd::remove_stored_fd(name));
            self.holdings.each(systemd::store_fd);
            // Pinged until the process ends: an old generation stays main
            // (and watched) until its MAINPID= for the successor lands.
            tokio::spawn(systemd::watchdog(CancellationToken::new()));
            tokio::spawn(status_lines(
                Arc::clone(&self.admin),
                self.pools.clone(),
                self.background.clone(),
            ));
        }
        if takeover || pools_ready(&self.pools) {
            systemd::ready(&status);
            return;
        }
        let (pools, stop) = (self.pools.clone(), self.background.clone());
        tokio::spawn(async move {
            tracing::info!("waiting for every pool to have a healthy backend before READY=1");
            while !pools_ready(&pools) {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
            systemd::ready(&status);
        });
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
/// `STATUS=` may be lost, and repeating them is harmless.
async fn status_lines(admin: Arc<AdminShared>, pools: Vec<Arc<Pool>>, stop: CancellationToken) {
    let mut pause = Duration::from_millis(500);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = Duration::from_secs(2);
        let generations = admin.generations();
        let connections: u64 = generations.first().map_or(0, |g| g.in_flight);
        let up: usize = pools.iter().map(|p| p.healthy_count()).sum();
        let total: usize = pools.iter().map(|p| p.backends.len()).sum();
        let line = format!(
            "generation {}: {connections} connection(s), {up}/{total} backends up, {} generation(s) draining",
            admin.generation.number,
            generations.len() - 1
        );
        if pools_ready(&pools) {
            systemd::ready(&line);
        } else {
            systemd::status(&line);
        }
    }
}
