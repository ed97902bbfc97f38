//! A generation's end: retired after a handoff, or stopped by a signal;
//! both drain under a budget, and the exit code says how it went.

use super::*;
use crate::config::AdminListen;

impl Generation {
    /// After a handoff: stop accepting (the sockets live on in the successor)
    /// and drain under `reload.drain_timeout`.
    /// `older` is the channel to the generation we took over from (which
    /// may still drain), told the stop's budget our successor keeps to.
    pub(super) async fn retire(
        mut self,
        successor: Successor,
        waiter: Option<tokio::sync::oneshot::Sender<Reply>>,
        older: Option<Arc<Channel>>,
    ) -> Exit {
        let successor_pid = successor.process.pid();
        tracing::info!(successor = successor_pid, "handed over; draining");
        // A stop's end is the main's: our successor's budget is the main's
        // (an older release says none), and a later reload's comes down
        // the chain.
        let stop_budget = StopBudget::new(
            successor.stop_budget.unwrap_or(self.config.stop_budget()),
            older,
        );
        let departure = listen_for_its_end(&successor, Some(Arc::clone(&stop_budget)));
        self.successor = Some(successor_pid);
        let (window_from, naming_window) = tokio::sync::oneshot::channel();
        if systemd::enabled() {
            tokio::spawn(keep_naming(
                successor_pid,
                self.standing.is_started(),
                naming_window,
                self.watchdog.clone(),
            ));
        }
        // Our admin stops before anything else: the successor answers from
        // our first report on, sent at once, where we answered on while our
        // doors closed (1.5 s when a removed listener defers accepting),
        // with a `/status` that named no serving generation and counts
        // the successor's would then step back from.
        self.admin_stop.cancel();
        self.admin_closed.cancelled().await;
        let _ = self.phase.send(Phase::Draining { deadline: None });
        let channel = Arc::clone(&successor.channel);
        let reporting = CancellationToken::new();
        let (first_sent, first_landed) = tokio::sync::oneshot::channel();
        let report_now = Arc::new(tokio::sync::Notify::new());
        let reporter = tokio::spawn(report_while_draining(
            Arc::clone(&channel),
            Arc::clone(&self.admin),
            reporting.clone(),
            first_sent,
            Arc::clone(&report_now),
        ));
        // Bounded: a successor that reads nothing (stopped, wedged) must
        // not keep our doors open and `baton reload` unanswered.
        if tokio::time::timeout(REPORT_WAIT, first_landed)
            .await
            .is_err()
        {
            tracing::warn!(waited = ?REPORT_WAIT, "the successor took no first report; closing the doors anyway");
        }
        self.holdings
            .handed_over(&successor.adopted, successor.names_every_socket);
        // Under systemd a path may be a socket unit's (`ListenStream=`),
        // which still listens there: it is left, as at a stop.
        if !systemd::enabled() {
            self.holdings.remove_unadopted_files();
        }
        self.close_doors().await;
        // Only now: when `baton reload` returns, every new connection and
        // probe reaches the new generation.
        if let Some(w) = waiter {
            let message = format!(
                "generation {} (pid {}) is serving",
                self.number + 1,
                successor_pid
            );
            let _ = w.send(Reply::serving(successor_pid, message));
        }
        // `ExecReload=` ends with that answer: the window runs from here.
        let named_until = Instant::now() + NAMING_WINDOW;
        let _ = window_from.send(named_until);
        self.background.cancel();
        let budget = self.config.reload.drain_timeout;
        self.publish_deadline(Instant::now() + budget);
        // The deadline, to the successor's `/status` at once.
        report_now.notify_one();
        let ended = self
            .drain_for(budget, DrainReason::Reload, || stop_budget.get())
            .await;
        let wait = PredecessorWait::after(&ended, stop_budget.get(), budget);
        // No stop's clock runs here, unless a stop or a force reached the
        // drain: then what is left of the wait, a second at least (a stop's
        // access-log lines are worth more than the older generation's last
        // count, which a main still waiting takes as cut anyway).
        let flush_limit = match wait.stopping || wait.forced {
            true => wait
                .bound
                .saturating_duration_since(Instant::now())
                .max(STOPPED_FLUSH_FLOOR),
            false => Duration::MAX,
        };
        self.write_out_telemetry(flush_limit).await;
        self.outlive_predecessor(wait).await;
        reporting.cancel();
        end_reports(&channel, reporter, || Message::Report(self.admin.report())).await;
        self.close_kept_connections();
        // A main must outlive a repetition of MAINPID= that lands, for a
        // systemd that ignores the first (see `keep_naming`).
        if systemd::enabled() {
            tokio::time::sleep_until(named_until).await;
        }
        departure::exit_with_successor(self.exit_code(&ended), departure).await
    }

    /// Waits (bounded by our own drain budget) until the generation we
    /// took over from has exited: its reports, which we keep forwarding,
    /// reach the serving generation only through us. A stop (systemd
    /// signals every generation at once), heard here or in our drain,
    /// bounds the wait by its own end, a second before the main's wait for
    /// older generations ends: what the stop cuts in the older generation
    /// reaches the main, and its exit code says so (it said 0 when we left
    /// at the stop). A second stop signal, or SIGUSR2 (which the main sends
    /// every draining generation as it forces them), leaves a second for
    /// the older one's forced count.
    async fn outlive_predecessor(&mut self, mut wait: PredecessorWait) {
        if self.predecessor_gone.is_cancelled() {
            return;
        }
        tracing::info!(
            waiting_at_most = ?wait.bound.saturating_duration_since(Instant::now()),
            "drain over; waiting for the older generation to exit so its counts reach the serving one"
        );
        loop {
            tokio::select! {
                () = self.predecessor_gone.cancelled() => return,
                () = tokio::time::sleep_until(wait.bound) => {
                    tracing::warn!("the older generation outlived our wait; its last counts may be lost");
                    return;
                }
                command = self.commands.recv() => {
                    match command {
                        // A reload is the serving generation's business.
                        Command::Reload => {
                            tracing::info!("reload ignored: this generation is draining");
                            continue;
                        }
                        Command::Stop if !wait.stopping => {
                            wait.stop_heard(Instant::now());
                            self.show_stopping();
                            self.publish_deadline(wait.bound);
                        }
                        Command::Stop | Command::ForceDrain => wait.forced(Instant::now()),
                    }
                    tracing::info!(
                        ?command,
                        waiting_at_most = ?wait.bound.saturating_duration_since(Instant::now()),
                        "still waiting for the older generation to exit"
                    );
                }
            }
        }
    }

    /// A probe this generation still answers (one it took before its admin
    /// stop) is told the host is stopping, as the serving generation tells
    /// it.
    fn show_stopping(&self) {
        self.phase.send_modify(|phase| {
            *phase = Phase::Stopping {
                deadline: phase.drain_deadline(),
            };
        });
    }

    /// The ordered stop: readiness flips, pre-stop pause, doors close (queue
    /// served), in-flight work drains, admin closes last. A first start
    /// the stop caught pauses only as long as held-back connections need:
    /// it was never ready, so nobody routing by readiness sent it work.
    pub(super) async fn stop(mut self, signalled: Instant) -> Exit {
        let pause = if self.caught_starting {
            self.config.held_back_wait()
        } else {
            self.config.stop_pause()
        };
        tracing::info!(
            pre_stop_delay = ?self.config.shutdown.pre_stop_delay,
            ?pause,
            "stopping"
        );
        let stop_ends = signalled + self.config.stop_budget();
        // What the stop needs: `timeout_stop`, and longer when the stop
        // caught a reload whose new generation stops later (we outlive it).
        let later = self.outlive_until.map_or(Duration::ZERO, |until| {
            until.saturating_duration_since(stop_ends)
        });
        let needs = self.config.timeout_stop() + later;
        // systemd kills what still runs at `TimeoutStopSec`, or at what
        // `stopping` asks it to wait (`needs`), the exit code and the last
        // reports with it: what follows the drain keeps to what is left
        // before then.
        let exit_by = signalled + needs - EXIT_MARGIN;
        let older_forced_before = self.admin.inherited_forced_connections();
        let _ = self.phase.send(Phase::Stopping { deadline: None });
        self.standing.stopping(needs);
        let release = release_fd_store_unless_restarting(
            self.holdings.names(),
            self.fd_store_again.clone(),
            pause,
        );
        // Connections held back for their first bytes (`defer_accept`)
        // are queued within the pause (`Config::stop_pause`); new ones are
        // queued as they come.
        self.holdings.stop_deferring();
        // The doors close once both are done; a second stop signal closes
        // them at once, without waiting for either.
        let forced_early = self
            .unless_forced(async move {
                tokio::join!(tokio::time::sleep(pause), release);
            })
            .await;
        self.holdings.kept();
        self.close_doors().await;
        // Under systemd the control socket lives on in the fd store for the
        // next start, and its path with it; otherwise nothing serves it now.
        if !systemd::enabled() {
            if let Err(err) = std::fs::remove_file(&self.config.control.socket) {
                tracing::debug!(cause = %err, "control socket not removed");
            }
        }
        let own_budget = self.config.stop_budget();
        let ended = if forced_early {
            self.drain.begin(Duration::ZERO);
            let open = self.drain.force().await;
            if open == 0 {
                tracing::info!("second stop signal: nothing was open");
            }
            metrics::drain_finished(DrainReason::Shutdown, 0.0, 0, open);
            Ended {
                outcome: DrainOutcome::Forced { open },
                cut: Some(Cut::Stop),
                stop_heard: None,
            }
        } else {
            self.drain_for(
                self.config.shutdown.drain_timeout,
                DrainReason::Shutdown,
                || own_budget,
            )
            .await
        };
        let flush_by = exit_by.checked_sub(AFTER_FLUSH).unwrap_or(exit_by);
        self.write_out_telemetry(flush_by.saturating_duration_since(Instant::now()))
            .await;
        let older_cut = self
            .outlive_other_generations(
                stop_ends.max(self.outlive_until.unwrap_or(stop_ends)) + OLDER_GENERATIONS_SLACK,
                exit_by,
                ended.by_signal(),
            )
            .await
            || self.admin.inherited_forced_connections() > older_forced_before;
        self.background.cancel();
        self.forget_admin_path();
        self.admin_stop.cancel();
        self.last_admin_answers(exit_by).await;
        let exit = match self.exit_code(&ended) {
            Exit::Clean if older_cut => {
                tracing::warn!("older generations still draining were forced by the stop");
                Exit::Forced
            }
            exit => exit,
        };
        self.close_kept_connections();
        departure::exit_with_successor(exit, self.successor_departure.take()).await
    }

    /// Waits, a second at most and within `exit_by`, for the admin's
    /// answers: a probe or `baton status` queued as the admin closed is
    /// answered once (a 503 while stopping), where the exit reset it.
    async fn last_admin_answers(&self, exit_by: Instant) {
        let until = exit_by.min(Instant::now() + LAST_ADMIN_ANSWERS);
        let answered = async {
            self.admin_closed.cancelled().await;
            self.admin.answering.close();
            self.admin.answering.wait().await;
        };
        if tokio::time::timeout_at(until, answered).await.is_err() {
            tracing::debug!("admin connections still open at the exit");
        }
    }

    /// Closes the backend connections kept idle, once the work is over
    /// (drained, or forced: a task cut then may still have put one back
    /// after its drain ended): with close_notify for TLS backends, not by
    /// the exit's FIN, which a backend logs as a truncated session.
    fn close_kept_connections(&self) {
        self.pools.iter().for_each(|p| p.close_idle());
    }

    /// A Unix admin socket's path goes as the control socket's did (under
    /// systemd both live on in the fd store for the next start, and their
    /// paths with them): nothing will answer there. Before the server
    /// stops, so a daemon started meanwhile, which replaces a socket nobody
    /// answers on, does not lose its own to this.
    fn forget_admin_path(&self) {
        let AdminListen::Unix(path) = &self.config.admin.listen else {
            return;
        };
        if !systemd::enabled() {
            if let Err(err) = std::fs::remove_file(path) {
                tracing::debug!(cause = %err, "admin socket not removed");
            }
        }
    }

    /// Waits, until `bound` at the latest, for the other generations still
    /// running to exit: the older ones draining, and a new one that a stop
    /// caught taking over (see `Reloading::settle_for_stop`). Under systemd
    /// a stop signals the unit's whole control group, so they drain to the
    /// stop's end too (or their own earlier one); but once the main
    /// process exits, systemd signals whatever is left in the group again,
    /// and a stopping or draining generation takes a second stop signal as
    /// "force now". The main process goes last, so that second signal
    /// finds nobody. A forced stop (`force`, or a second stop signal while
    /// we wait) forces them at once, and waits a moment for them to go.
    ///
    /// A generation the stop caught taking over, told to stop by the word
    /// of the one it took over from, is not the main process (systemd
    /// takes no `MAINPID=` once its stop began): it does not wait, its
    /// predecessor outlives it.
    ///
    /// Once they are gone, their last reports are in (the last comes as
    /// each exits, through the one we took over from, which exits last of
    /// them), for the caller to count what the stop cut. True when they
    /// still ran at `bound` under systemd, which forces them as we exit
    /// (elsewhere nothing does: they drain on). Their last reports are
    /// waited for until `exit_by` at the latest.
    async fn outlive_other_generations(
        &mut self,
        bound: Instant,
        exit_by: Instant,
        force: bool,
    ) -> bool {
        let outlived_by_main = self.commands.stop_word();
        if outlived_by_main.is_cancelled() {
            return false;
        }
        self.draining.retain(Process::is_alive);
        if !self.draining.is_empty() && !self.other_generations_exited(bound, force).await {
            return if systemd::enabled() {
                tracing::warn!("other generations still running at the stop's end; systemd forces them as we exit");
                true
            } else {
                tracing::warn!(
                    "other generations still running at the stop's end; they drain on to their own deadline"
                );
                false
            };
        }
        tokio::select! {
            _ = tokio::time::timeout_at(
                exit_by.min(Instant::now() + OLDER_GENERATIONS_SLACK),
                self.predecessor_gone.cancelled(),
            ) => {}
            () = outlived_by_main.cancelled() => {}
        }
        false
    }

    /// Waits for `self.draining` to exit, until `bound`; false if they
    /// did not. True as well once the word of the generation we took over
    /// from says it outlives us (see `outlive_other_generations`).
    async fn other_generations_exited(&mut self, bound: Instant, force: bool) -> bool {
        let mut bound = bound;
        if force {
            signal_each(&self.draining, rustix::process::Signal::USR2);
            bound = bound.min(Instant::now() + OLDER_GENERATIONS_SLACK);
        }
        tracing::info!(
            generations = self.draining.len(),
            "drained; waiting for the other generations to finish"
        );
        let outlived_by_main = self.commands.stop_word();
        // Taken: the commands are read meanwhile.
        let draining = std::mem::take(&mut self.draining);
        let all_exited = async {
            for older in &draining {
                older.exited().await;
            }
        };
        tokio::pin!(all_exited);
        loop {
            tokio::select! {
                () = &mut all_exited => return true,
                () = outlived_by_main.cancelled() => {
                    tracing::info!("the generation we took over from is systemd's main process and outlives us; not waiting");
                    return true;
                }
                () = tokio::time::sleep_until(bound) => return false,
                command = self.commands.recv() => match command {
                    Command::Stop | Command::ForceDrain => {
                        signal_each(&draining, rustix::process::Signal::USR2);
                        bound = bound.min(Instant::now() + OLDER_GENERATIONS_SLACK);
                    }
                    Command::Reload => tracing::info!("reload ignored: this generation is stopping"),
                },
            }
        }
    }

    /// Waits for `work` (the pre-stop pause, during which the load balancer
    /// in front may still send traffic, and systemd's answer); true when a
    /// second stop cut it short. A reload does not end it, nor does a
    /// SIGUSR2 (a force meant for draining generations), except where this
    /// generation stops at the word of the one it took over from (a stop
    /// caught the handoff): a second stop of that one forces us with
    /// SIGUSR2, as it forces every generation it waits for, since a stop
    /// signal could not (the first after the word counts as the word's).
    async fn unless_forced(&mut self, work: impl std::future::Future<Output = ()>) -> bool {
        tokio::pin!(work);
        let stopping_at_word = self.commands.stop_word();
        loop {
            tokio::select! {
                () = &mut work => return false,
                command = self.commands.recv() => match command {
                    Command::Stop => return true,
                    Command::ForceDrain if stopping_at_word.is_cancelled() => {
                        tracing::info!(signal = "SIGUSR2", "the generation we took over from forces the stop");
                        return true;
                    }
                    other => tracing::info!(command = ?other, "ignored: this generation is stopping"),
                },
            }
        }
    }

    /// The telemetry's last words, once the drain is over (no connection
    /// is left to add any): every access-log line of this generation
    /// reaches its file within `within`, and the count of client-fault
    /// lines still held back is logged.
    async fn write_out_telemetry(&self, within: Duration) {
        crate::telemetry::report_held_back(true);
        let sinks = Arc::clone(&self.access_logs);
        match crate::shortage::on_a_thread("baton-close", move || sinks.close(within)) {
            Ok(closed) => {
                let _ = closed.await;
            }
            // No thread to be had: closed here, the runtime waiting with
            // it (the drain is over: nothing else of ours runs now).
            Err(_) => self.access_logs.close(within),
        }
    }

    /// Stops every accept loop and waits until each has closed its socket.
    async fn close_doors(&mut self) {
        self.holdings = Holdings::default();
        self.fd_store_again.drop_unsent();
        self.accept_stop.cancel();
        self.workers.calm();
        while self.accept_tasks.join_next().await.is_some() {}
    }

    /// Runs the drain; stop signals shorten or force it. A stop's end is
    /// `stop_budget()` from when it is heard (in a reload's drain, the main
    /// generation's, as the latest reload passed it down: its wait for
    /// older generations ends by it).
    async fn drain_for(
        &mut self,
        budget: Duration,
        reason: DrainReason,
        stop_budget: impl Fn() -> Duration,
    ) -> Ended {
        let started = Instant::now();
        let spread = match reason {
            DrainReason::Reload => self.config.reload.close_spread,
            DrainReason::Shutdown => Duration::ZERO,
        };
        self.drain.begin(spread);
        let at_start = self.drain.in_flight();
        let mut deadline = started + budget;
        self.publish_deadline(deadline);
        tracing::info!(connections = at_start, budget = ?budget, reason = reason.as_str(), "drain started");
        let mut stop_heard = None;
        let mut cut = None;
        // Which budget the deadline is now: a stop's end, if it came first.
        let mut deadline_key = match reason {
            DrainReason::Reload => "reload.drain_timeout",
            DrainReason::Shutdown => "shutdown.drain_timeout",
        };
        // When a stop's cut ends the long-lived streams the spread still holds.
        let mut spread_cut: Option<Instant> = None;
        let outcome = loop {
            tokio::select! {
                () = self.drain.idle() => break DrainOutcome::Drained,
                () = tokio::time::sleep_until(spread_cut.unwrap_or(deadline)), if spread_cut.is_some() => {
                    self.drain.end_spread();
                    spread_cut = None;
                }
                () = tokio::time::sleep_until(deadline) => {
                    cut = Some(Cut::Deadline { after: started.elapsed(), key: deadline_key });
                    break DrainOutcome::Forced { open: self.drain.force().await };
                }
                command = self.commands.recv() => match command {
                    Command::Stop if stop_heard.is_none() && matches!(reason, DrainReason::Reload) => {
                        stop_heard = Some(Instant::now());
                        // The stop's own end: its pause, then its drain.
                        let stop_end = Instant::now() + stop_budget();
                        if stop_end < deadline {
                            deadline = stop_end;
                            deadline_key = "shutdown.drain_timeout";
                        }
                        self.show_stopping();
                        self.publish_deadline(deadline);
                        // Ended as the serving generation ends its own:
                        // when its pause is over.
                        spread_cut = Some(Instant::now() + self.config.stop_pause());
                        tracing::info!("stop signal while draining: the drain ends by the stop's end at the latest");
                    }
                    command @ (Command::Stop | Command::ForceDrain) => {
                        cut = Some(match command {
                            Command::Stop => Cut::Stop,
                            _ => Cut::Told,
                        });
                        break DrainOutcome::Forced { open: self.drain.force().await };
                    }
                    // Not passed on: `systemctl kill -s HUP baton` (or a
                    // container's keeper) reaches the serving generation
                    // too, and would reload twice. Said where it was sent
                    // by pid, read a moment before a reload.
                    Command::Reload => match self.successor {
                        Some(serving) if matches!(reason, DrainReason::Reload) => tracing::warn!(
                            serving,
                            "SIGHUP ignored: this generation is draining; send it to the serving generation (systemctl reload baton, or kill -HUP the serving pid)"
                        ),
                        _ => tracing::info!("SIGHUP ignored: this generation is draining"),
                    },
                },
                Some(incoming) = self.control_rx.recv() => self.answer_late(incoming),
            }
        };
        self.finish_control_requests().await;
        let idle_closed = self.drain.idle_closed();
        if idle_closed > 0 {
            tracing::info!(
                connections = idle_closed,
                expected = true,
                "closed idle keep-alive connections for the drain"
            );
        }
        let long_lived = self.drain.long_lived_ended();
        if long_lived.total() > 0 {
            tracing::info!(
                websockets = long_lived.websockets,
                upgrades = long_lived.upgrades,
                event_streams = long_lived.event_streams,
                expected = true,
                "ended long-lived streams for the drain"
            );
        }
        let forced = match outcome {
            DrainOutcome::Drained => 0,
            DrainOutcome::Forced { open } => open,
        };
        metrics::drain_finished(
            reason,
            started.elapsed().as_secs_f64(),
            at_start.saturating_sub(forced),
            forced,
        );
        Ended {
            outcome,
            cut,
            stop_heard,
        }
    }

    /// A control request this generation accepted just before it stopped
    /// accepting: answered, never left to hang up.
    fn answer_late(&self, incoming: control::Incoming) {
        let reply = match (incoming.request, self.successor) {
            (Request::Status, Some(pid)) => Reply::serving(
                pid,
                format!("generation {} (pid {pid}) is serving", self.number + 1),
            ),
            (Request::Reload, Some(_)) => {
                Reply::err(Exit::Busy, "a reload just completed; retry to reload again")
            }
            (_, None) => Reply::err(Exit::Failure, "the daemon is stopping"),
        };
        let _ = incoming.reply.send(reply);
    }

    /// Answers the control requests still being read, for up to a second.
    async fn finish_control_requests(&mut self) {
        self.control_tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                tokio::select! {
                    () = self.control_tasks.wait() => return,
                    Some(incoming) = self.control_rx.recv() => self.answer_late(incoming),
                }
            }
        })
        .await;
    }

    /// Publishes the drain deadline in the phase, as wall-clock time (what
    /// `/status` and the reports to a successor show).
    fn publish_deadline(&self, deadline: Instant) {
        let wall = SystemTime::now() + deadline.saturating_duration_since(Instant::now());
        self.phase
            .send_modify(|phase| phase.set_drain_deadline(wall));
    }

    fn exit_code(&self, ended: &Ended) -> Exit {
        match ended.outcome {
            DrainOutcome::Drained => {
                tracing::info!(
                    generation = self.number,
                    expected = true,
                    "drained; exiting"
                );
                Exit::Clean
            }
            DrainOutcome::Forced { open: 0 } => Exit::Clean,
            DrainOutcome::Forced { open } => {
                let generation = self.number;
                match ended.cut {
                    Some(Cut::Deadline { after, key }) => tracing::warn!(
                        generation,
                        connections = open,
                        "drain deadline passed after {:.1}s; connections force-closed (their clients need longer than {key})",
                        after.as_secs_f64()
                    ),
                    Some(Cut::Told) => tracing::warn!(
                        generation,
                        connections = open,
                        "SIGUSR2 ended the drain (sent by the serving generation past reload.max_draining or at its own forced stop, or by hand); connections force-closed"
                    ),
                    Some(Cut::Stop) | None => tracing::warn!(
                        generation,
                        connections = open,
                        "a second stop signal ended the drain; connections force-closed"
                    ),
                }
                Exit::Forced
            }
        }
    }
}

/// Listens for how `successor` ends; `None` (logged) when it cannot be held.
pub(super) fn listen_for_its_end(
    successor: &Successor,
    stop_budget: Option<Arc<StopBudget>>,
) -> Option<Departure> {
    successor
        .listen_for_its_end(stop_budget)
        .inspect_err(|err| tracing::warn!(cause = %err, "cannot follow the new generation's end"))
        .ok()
}

/// How long an old generation keeps naming its successor to systemd after
/// the reload's answer (and so stays alive at least that long).
const NAMING_WINDOW: Duration = Duration::from_millis(1500);
/// How often `keep_naming` repeats itself within that window: three times
/// after `ExecReload=` ended.
const NAMING_EVERY: Duration = Duration::from_millis(500);

/// How a drain ended, and what cut it if it did not end by itself.
struct Ended {
    outcome: DrainOutcome,
    cut: Option<Cut>,
    /// When a stop reached a reload's drain (it keeps the drain's earlier
    /// deadline, or brings the stop's own end).
    stop_heard: Option<Instant>,
}

impl Ended {
    /// Whether a signal, not its deadline, cut it.
    fn by_signal(&self) -> bool {
        matches!(self.cut, Some(Cut::Stop | Cut::Told))
    }
}

/// What cut a drain short, for the line that says so (the fix differs).
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Its deadline, `after` its start: the budget of `key`, or a stop's
    /// end that came first.
    Deadline { after: Duration, key: &'static str },
    /// A second stop signal.
    Stop,
    /// SIGUSR2: the serving generation past `reload.max_draining` or at its
    /// own forced stop, or a user.
    Told,
}

/// How long a drained generation waits for the one it took over from
/// (see `outlive_predecessor`).
struct PredecessorWait {
    bound: Instant,
    /// The stop's budget (the successor's, as the main's): a stop heard
    /// bounds the wait by it, and half the main's slack.
    stop_budget: Duration,
    stopping: bool,
    forced: bool,
}

impl PredecessorWait {
    /// The wait after a reload's drain of `drain_timeout`, which may have
    /// heard a stop or been forced.
    fn after(drained: &Ended, stop_budget: Duration, drain_timeout: Duration) -> Self {
        let mut wait = PredecessorWait {
            bound: Instant::now() + drain_timeout,
            stop_budget,
            stopping: false,
            forced: false,
        };
        if let Some(heard) = drained.stop_heard {
            wait.stop_heard(heard);
        }
        if drained.by_signal() {
            wait.forced(Instant::now());
        }
        wait
    }

    /// To the stop's end, and a second of the main's slack: gone, the last
    /// report sent, before the main stops waiting.
    fn stop_heard(&mut self, at: Instant) {
        self.stopping = true;
        self.bound = self
            .bound
            .min(at + self.stop_budget + OLDER_GENERATIONS_SLACK / 2);
    }

    fn forced(&mut self, at: Instant) {
        self.forced = true;
        self.bound = self.bound.min(at + FORCED_PREDECESSOR_WAIT);
    }
}

/// Sends `signal` to each of `generations` still running.
fn signal_each(generations: &[Process], signal: rustix::process::Signal) {
    for older in generations {
        if older.signal(signal).is_ok() {
            tracing::info!(pid = older.pid(), ?signal, "signalled an older generation");
        }
    }
}

/// How long before systemd's `TimeoutStopSec` (`Config::timeout_stop`; a
/// container's stop timeout the same) a stop means to be done, whatever
/// is left undone: what still runs after it (a last word to the
/// generation we took over from, the runtime's own shutdown) takes up to
/// a second each.
const EXIT_MARGIN: Duration = Duration::from_secs(2);

/// What a stop keeps back from the access log's flush for the rest of its
/// teardown: the older generations' last reports and the exit itself.
const AFTER_FLUSH: Duration = Duration::from_secs(1);

/// How long after the stop's own end the main process still waits for
/// older generations: theirs is the same end (or earlier), then their
/// access logs are written out.
const OLDER_GENERATIONS_SLACK: Duration = Duration::from_secs(2);

/// Repeats `MAINPID=<successor>` every `NAMING_EVERY` until the naming window
/// (`NAMING_WINDOW` from the reload's answer, which `window` brings) is
/// over. The first one, sent before we stopped accepting, is the one
/// systemd 252 takes on cgroup v2, as a host runs it: at once, while
/// `ExecReload=` still runs (the sandbox test
/// `a_command_after_baton_reload_in_exec_reload_fails_nothing`). An older
/// sandbox showed it ignored in the unit's reload state, until
/// `ExecReload=` ended; the repetitions are for such a systemd. The old
/// generation must not exit before a repetition landed, or such a systemd
/// would take the unit for dead: hence the window. Not for the whole
/// drain, nor often: once the successor is main, systemd logs each of our
/// messages as a warning (a long drain wrote ten a second to the journal;
/// now a reload writes about three). The watchdog's pings (`watchdog`)
/// end with the window, for the same reason.
async fn keep_naming(
    successor: u32,
    started: bool,
    mut window: tokio::sync::oneshot::Receiver<Instant>,
    watchdog: CancellationToken,
) {
    let _pings_end = watchdog.drop_guard();
    let mut until: Option<Instant> = None;
    loop {
        tokio::select! {
            end = &mut window, if until.is_none() => {
                // Never sent: the retirement ended before its answer.
                until = Some(end.unwrap_or_else(|_| Instant::now()));
            }
            () = tokio::time::sleep(NAMING_EVERY) => {}
        }
        if until.is_some_and(|until| Instant::now() >= until) {
            return;
        }
        systemd::handed_over(successor, started);
    }
}

/// Ends the reports to the successor once `reporter` is told to stop: a
/// periodic report still being sent lands first (or the successor would
/// end on older, smaller totals), then the last word, everything counted
/// up to now (`last`), so the successor's totals are exact once we are
/// gone. Each within [`REPORT_WAIT`]: a successor alive but reading
/// nothing (stopped, wedged) fills the socket, and a send waiting for room
/// held this generation past its drain's deadline for good, deaf to
/// signals. A report cut part-way leaves the channel mid-message: no last
/// word follows it.
async fn end_reports(
    channel: &Channel,
    reporter: tokio::task::JoinHandle<()>,
    last: impl FnOnce() -> Message,
) {
    if tokio::time::timeout(REPORT_WAIT, reporter).await.is_err() {
        tracing::warn!(waited = ?REPORT_WAIT, "the successor took no report; exiting without the last (its totals lack what we counted since)");
        return;
    }
    match tokio::time::timeout(REPORT_WAIT, channel.send(&last(), &[])).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            tracing::info!(cause = %err, "could not send the final report to the successor");
        }
        Err(_) => {
            tracing::warn!(waited = ?REPORT_WAIT, "the successor took no final report; exiting without it");
        }
    }
}

/// The least a stopped drained generation gives its access logs to be
/// written out, whatever is left of its wait for the older one.
const STOPPED_FLUSH_FLOOR: Duration = Duration::from_secs(1);

/// How long a drained generation still waits for the older one once a
/// second stop signal or SIGUSR2 forced both: the older one's forced count
/// comes in its last report, within the main's `OLDER_GENERATIONS_SLACK`.
const FORCED_PREDECESSOR_WAIT: Duration = Duration::from_secs(1);

/// How long a stop's exit waits for the admin's last answers.
const LAST_ADMIN_ANSWERS: Duration = Duration::from_secs(1);

/// How long a report to the successor may wait for room on the channel
/// as this generation exits.
const REPORT_WAIT: Duration = Duration::from_secs(2);

/// Sends our counters and live generations to the successor at once (our
/// admin has stopped: the successor answers from this first report on,
/// `first_sent` says it landed), then every half second while we drain,
/// and at once when `now` is notified (our drain deadline is known).
async fn report_while_draining(
    channel: Arc<Channel>,
    admin: Arc<AdminShared>,
    stop: CancellationToken,
    first_sent: tokio::sync::oneshot::Sender<()>,
    now: Arc<tokio::sync::Notify>,
) {
    let mut first_sent = Some(first_sent);
    loop {
        if let Err(err) = channel.send(&Message::Report(admin.report()), &[]).await {
            tracing::info!(cause = %err, "successor stopped taking reports");
            return;
        }
        if let Some(sent) = first_sent.take() {
            let _ = sent.send(());
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
            () = now.notified() => {}
        }
    }
}

/// How long systemd is given to close its copies of the sockets taken out
/// of its fd store before ours close: the removal is a datagram it handles
/// in its own time.
const FD_STORE_RELEASE_SETTLE: Duration = Duration::from_millis(100);

/// On a stop that is not a restart, takes this generation's sockets out of
/// systemd's fd store, during the pre-stop pause, so that closing the doors
/// closes them: a connection arriving after that is refused at once (and
/// the queue is served first), where the store's copies kept it queued
/// until the unit ended and then reset it. A restart leaves them there for
/// the next start, which serves what queued meanwhile.
async fn release_fd_store_unless_restarting(
    names: Vec<String>,
    pending: systemd::PendingUpdate,
    pause: Duration,
) {
    if !systemd::enabled() || names.is_empty() {
        return;
    }
    // Kept, the store must hold every socket: a takeover's update waits to
    // be sent again once the older generation exits (it may have come
    // before our MAINPID= landed, and been dropped), and a restart while
    // that one still drains would lose the sockets a reload added.
    match systemd::restarting(pause).await {
        Ok(true) => {
            tracing::info!(
                "a restart: the listening sockets stay in systemd's fd store for the next start"
            );
            pending.send();
        }
        Ok(false) => {
            pending.release(&names);
            tokio::time::sleep(FD_STORE_RELEASE_SETTLE).await;
        }
        Err(cause) => {
            tracing::warn!(
                %cause,
                "could not ask systemd (busctl) whether this stop is a restart: the sockets stay in its fd store, where connections arriving after the doors close wait until the service ends"
            );
            pending.send();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::handoff::Report;

    /// A stop heard in the drain bounds the wait for the older generation
    /// from when it was heard, a second short of the main's slack; a force
    /// leaves a second; neither lengthens an earlier bound.
    #[tokio::test(start_paused = true)]
    async fn a_stop_or_a_force_bounds_the_wait_for_the_older_generation() {
        let second = Duration::from_secs(1);
        let (budget, drain) = (10 * second, 60 * second);
        let ended = |stop_heard, by_signal: bool| Ended {
            outcome: DrainOutcome::Drained,
            cut: by_signal.then_some(Cut::Stop),
            stop_heard,
        };
        let start = Instant::now();
        let plain = PredecessorWait::after(&ended(None, false), budget, drain);
        assert_eq!(plain.bound, start + drain);
        let heard = start - 3 * second;
        let stopped = PredecessorWait::after(&ended(Some(heard), false), budget, drain);
        assert_eq!(stopped.bound, heard + budget + second);
        assert!(stopped.stopping && !stopped.forced);
        let forced = PredecessorWait::after(&ended(Some(heard), true), budget, drain);
        assert_eq!(forced.bound, start + FORCED_PREDECESSOR_WAIT);
        let mut late = PredecessorWait::after(&ended(None, true), budget, drain);
        late.stop_heard(start);
        assert_eq!(
            late.bound,
            start + FORCED_PREDECESSOR_WAIT,
            "not lengthened"
        );
    }

    /// The last word reaches a successor that reads, once the report
    /// under way landed: everything counted up to the exit.
    #[tokio::test]
    async fn the_last_report_reaches_a_successor_that_reads() {
        let (ours, theirs) = Channel::connected();
        let landed = tokio::spawn(async {});
        end_reports(&ours, landed, || Message::Report(Report::default())).await;
        let (got, _) = theirs.recv().await.expect("a message");
        assert_eq!(got, Message::Report(Report::default()));
    }

    /// A successor that reads nothing (the socket full, a report waiting
    /// for room) does not hold an exiting generation for ever: the report
    /// under way and the last one are each given `REPORT_WAIT`.
    #[tokio::test(start_paused = true)]
    async fn a_successor_that_reads_nothing_does_not_hold_the_exit() {
        let (channel, _unread) = Channel::pair().expect("a pair");
        let channel = Arc::new(channel);
        let report = || Message::Report(Report::default());
        let room = Duration::from_millis(1);
        while tokio::time::timeout(room, channel.send(&report(), &[]))
            .await
            .is_ok()
        {}
        let reporter = tokio::spawn({
            let channel = Arc::clone(&channel);
            async move {
                let _ = channel.send(&report(), &[]).await;
            }
        });
        let began = Instant::now();
        let ended =
            tokio::time::timeout(4 * REPORT_WAIT, end_reports(&channel, reporter, report)).await;
        assert!(ended.is_ok(), "still waiting after {:?}", began.elapsed());
        // The report under way landed; the last one finds no room.
        let landed = tokio::spawn(async {});
        let began = Instant::now();
        let ended =
            tokio::time::timeout(4 * REPORT_WAIT, end_reports(&channel, landed, report)).await;
        assert!(ended.is_ok(), "still waiting after {:?}", began.elapsed());
    }
}
