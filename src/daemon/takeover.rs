//! A new generation's side of a reload, from *ready* to serving: the
//! go-ahead (with backend states as they are now), accepting, then the old
//! generation's reports until it exits.
//!
//! The admin socket is shared, and `/metrics` must never go backwards: we
//! take admin requests only once the old generation has stopped taking
//! them and its first report since (counts up to then) is in. Until then
//! the kernel queues probes and scrapes, for a few milliseconds.

use super::*;

/// How long we wait for the old generation's first report before taking
/// admin requests anyway (it may be frozen or gone).
const FIRST_REPORT_WAIT: Duration = Duration::from_secs(2);

impl Generation {
    /// A stop signal came before we took over: the reload fails, and the
    /// old generation serves on.
    async fn stopped_before_taking_over(parent: Parent) -> Exit {
        let reason = "stopped by a signal before it took over";
        tracing::info!("{reason}; the reload fails and the old generation serves on");
        parent.fail(Exit::Failure, reason).await;
        Exit::Failure
    }

    /// Ready → serving; `Err` carries the exit code when the old
    /// generation did not let us take over. `Ok` holds the channel to it,
    /// on which we tell it how we end, if we took over.
    pub(super) async fn take_over(&mut self, parent: Parent) -> Result<Option<Arc<Channel>>, Exit> {
        if self.commands.stop_queued() {
            return Err(Generation::stopped_before_taking_over(parent).await);
        }
        let stop_budget = self.config.stop_budget();
        let mut alone = false;
        match parent
            .ready(self.adopted.clone(), self.renamed.clone(), stop_budget)
            .await
        {
            Err(e) if self.offering_generation_gone(&e).await => {
                tracing::warn!(
                    cause = %e,
                    "the old generation exited before its go-ahead (killed?): taking over alone, with the backend states and counts of its offer"
                );
                alone = true;
            }
            Ok(go_ahead) => {
                let untaken = build::carry_over(&self.pools, &go_ahead.backends);
                build::say_untaken(&self.pools, &go_ahead.backends, &untaken);
                // Counted up to now: what `/metrics` shows if the old
                // generation's first report is late (see `FIRST_REPORT_WAIT`).
                if let Some(report) = go_ahead.report {
                    self.admin.set_inherited(report);
                }
            }
            Err(e) => {
                tracing::error!(cause = %e, "old generation did not let us take over");
                // Read by a frozen one once it runs again: the reload's
                // reply then says why, not only that we exited.
                if matches!(e, HandoverError::NoGoAhead(_)) {
                    parent.fail(Exit::Failure, &e.to_string()).await;
                }
                return Err(Exit::Failure);
            }
        }
        // Asked again after the go-ahead, before we accept: a stop aimed at
        // us alone while the old generation weighed our ready would
        // otherwise have us take over only to stop at once, and nobody
        // would serve. (A service stop reaches the old generation too: our
        // failure ends its handoff, and it stops alone.)
        if self.commands.stop_queued() {
            return Err(Generation::stopped_before_taking_over(parent).await);
        }
        let doors = match self.make_ready() {
            Ok(doors) => doors,
            Err(err) => {
                tracing::error!(cause = %err, "cannot take over");
                parent.fail(Exit::Failure, &err.to_string()).await;
                return Err(Exit::Failure);
            }
        };
        // A drain carried over ends (`out`) only once every older
        // generation, which may still have work on the backend, is gone:
        // the one we took over from, and those it took over from (which
        // may outlive it when its own drain budget was shorter).
        let (pools, gone) = (self.pools.clone(), self.predecessor_gone.clone());
        let older: Vec<Process> = self
            .draining
            .iter()
            .filter_map(|p| p.try_clone().ok())
            .collect();
        tokio::spawn(async move {
            gone.cancelled().await;
            for generation in &older {
                generation.exited().await;
            }
            pools.iter().for_each(|p| p.settle_drains());
        });
        self.open_doors(doors);
        if alone {
            // Its fd store update went once; the exit it is held to be
            // sent again after has come.
            let _ = self.became_active(true);
            // The dead one's entry (and every older one's, as each exits)
            // leaves `/status` and the in-flight counts: no report of its
            // exit will come.
            self.follow_older_exits();
            self.admin_go.cancel();
            self.predecessor_gone.cancel();
            return Ok(None);
        }
        let accepting = parent.accepting().await;
        if let Some(update) = self.became_active(true) {
            self.fd_store_again.hold(update);
        }
        let channel = match accepting {
            Ok(channel) => channel,
            Err(e) => {
                tracing::warn!(cause = %e, "could not confirm the takeover to the old generation");
                self.follow_older_exits();
                self.admin_go.cancel();
                self.predecessor_gone.cancel();
                return Ok(None);
            }
        };
        let (go, stopped) = (self.admin_go.clone(), self.commands.stop_word());
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(FIRST_REPORT_WAIT) => go.cancel(),
                // A stop that began as we took over: the old generation,
                // systemd's main process to the end, keeps the admin
                // socket for its whole stop and sends no report. Both
                // answering, scrapes went back and forth between two
                // sets of counts, each step down a counter reset.
                () = stopped.cancelled() => {}
            }
        });
        let older_running = self.follow_older_exits();
        let (on_report, on_exit) = (Arc::clone(&self.admin), Arc::clone(&self.admin));
        let (go_on_report, go_on_exit) = (self.admin_go.clone(), self.admin_go.clone());
        let gone = self.predecessor_gone.clone();
        let fd_store_again = self.fd_store_again.clone();
        tokio::spawn(generation::reports(
            Arc::clone(&channel),
            move |r| {
                on_report.set_inherited(r);
                go_on_report.cancel();
            },
            self.commands.stop_word(),
            move || {
                let running: Vec<u32> = older_running
                    .iter()
                    .filter(|p| p.is_alive())
                    .map(Process::pid)
                    .collect();
                on_exit.inherited_exited(&running);
                go_on_exit.cancel();
                gone.cancel();
                // We are surely systemd's main process by now, if we
                // still serve.
                fd_store_again.send();
            },
        ));
        Ok(Some(channel))
    }

    /// Whether the generation that offered us its sockets is gone, which
    /// `err` (its end of the channel closed) suggests: an out-of-memory
    /// kill, likeliest during a reload, when two generations hold memory
    /// and the old one most. Nobody is left to give the go-ahead; we exited
    /// holding every listening socket, and nothing served (nginx's new
    /// master and HAProxy's new process serve on). Its channel closes as
    /// it exits: a second is ample to see the exit itself.
    async fn offering_generation_gone(
        &self,
        err: &crate::lifecycle::generation::HandoverError,
    ) -> bool {
        let Some(offering) = self.draining.last() else {
            return false;
        };
        matches!(err, crate::lifecycle::generation::HandoverError::Channel(_))
            && tokio::time::timeout(Duration::from_secs(1), offering.exited())
                .await
                .is_ok()
    }

    /// Takes each older generation's entry out of `/status` as it exits,
    /// and returns holds on them all: the one we took over from reports
    /// their entries, but one it stopped waiting for outlives it, with no
    /// one left to say when it goes.
    fn follow_older_exits(&self) -> Vec<Process> {
        let held: Vec<Process> = self
            .draining
            .iter()
            .filter_map(|p| p.try_clone().ok())
            .collect();
        for process in held.iter().filter_map(|p| p.try_clone().ok()) {
            let admin = Arc::clone(&self.admin);
            tokio::spawn(async move {
                process.exited().await;
                admin.inherited_gone(process.pid());
            });
        }
        held
    }
}
