//! The supervisor of one generation: builds it (`build::start`), owns its
//! `Phase`, and runs the one `select!` over commands (signals, or a test's
//! channel), control requests and a reload under way
//! (`Generation::serve`). It then ends in one of two ways: handed over to
//! a newer generation (`end`: `retire`) or stopped (`end`: `stop`). Exit
//! codes are DESIGN.md's.
//!
//! Split by phase: `build` makes a generation, `active` opens it and keeps
//! systemd informed, this file serves, `end` retires or stops it.

mod active;
mod build;
mod end;
mod reloading;
mod takeover;

use reloading::Reloading;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminShared, GenerationInfo, ListenerView, Topology};
use crate::backend::{probe, AdminState, Pool};
use crate::config::Config;
use crate::connection::{Connections, ListenerStats, Proxy};
use crate::exit::Exit;
use crate::lifecycle::control::{self, Reply, Request};
use crate::lifecycle::departure::{self, Departure, StopBudget};
use crate::lifecycle::drain::{Drain, DrainOutcome};
use crate::lifecycle::generation::{
    self, Exec, GoAhead, HandoverError, Inheritance, Offer, Parent, Successor,
};
use crate::lifecycle::handoff::{BackendCarry, Channel, Message};
use crate::lifecycle::inventory::{Fate, FateCell, Holdings};
use crate::lifecycle::process::{Named, Process};
use crate::lifecycle::signals::{Command, Commands};
use crate::lifecycle::{systemd, Check, Phase};
use crate::listener::{Closing, Listener};
use crate::metrics::{self, DrainReason};

/// A start-up failure, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("admin listener {addr} (admin.listen): {source}{hint}")]
    Admin {
        addr: String,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("control socket {path} (control.socket): {source}{hint}")]
    Control {
        path: String,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("listener \"{name}\" cannot bind {addr}: {source}{hint}")]
    Bind {
        name: String,
        addr: String,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("cannot start the worker threads: {0}")]
    Workers(std::io::Error),
    #[error("listener \"{name}\" cannot listen on {addr}: {source}")]
    Listen {
        name: String,
        addr: String,
        source: std::io::Error,
    },
    /// Its worker's reactor could not take the socket (see
    /// `Listener::register`).
    #[error("listener \"{name}\" cannot have its socket watched: {source}")]
    Watch {
        name: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Adopt(#[from] crate::lifecycle::inventory::AdoptError),
    #[error("handoff: {0}")]
    Handoff(#[from] HandoverError),
    #[error("TLS session tickets: {0}")]
    Tickets(#[from] crate::tls::tickets::TicketError),
    #[error("listener \"{listener}\" access log {destination}: {source}")]
    AccessLog {
        listener: String,
        destination: String,
        source: std::io::Error,
    },
}

/// What a socket's failure to bind most likely means, for the error's
/// reader: `port` is the TCP port asked for (none for a Unix socket).
fn remedy(err: &std::io::Error, port: Option<u16>) -> &'static str {
    use std::io::ErrorKind;
    match (err.kind(), port) {
        (ErrorKind::AddrInUse, Some(_)) => {
            "; another process listens there (`ss -ltnp` names it), maybe another baton"
        }
        (ErrorKind::AddrNotAvailable, _) => "; no interface of this host has that address",
        (ErrorKind::PermissionDenied, Some(port)) if port < 1024 => {
            "; a port below 1024 needs CAP_NET_BIND_SERVICE (the package's unit grants it) or root"
        }
        (ErrorKind::PermissionDenied, None) => {
            "; under systemd the unit's RuntimeDirectory= makes /run/baton, run by hand name a path this user may write"
        }
        _ => "",
    }
}

/// The inputs of one generation's run.
pub struct Setup {
    pub config: Config,
    pub exec: Exec,
    /// The older generation we take over from, for the conversation.
    pub parent: Option<Parent>,
    /// What it (or systemd) handed over: nothing for a first start.
    pub inheritance: Inheritance,
    pub metrics: Option<PrometheusHandle>,
    /// Stop, reload and force: the binary's from its signals (installed
    /// first thing in the process, so a signal during start-up, a SIGHUP
    /// while the config loads, is never its default action); a test's
    /// from a channel.
    pub commands: Commands,
}

/// Runs one generation to its end and returns the process exit code.
/// All it hears from outside comes in `setup`, so a test can run it inside
/// its own process with a command channel (`tests/support/in_process.rs`);
/// a reload, which execs the next generation, needs the binary.
pub async fn run(mut setup: Setup) -> Exit {
    let parent = setup.parent.take();
    let built = build::start(setup, parent.is_none()).await;
    let mut gen = match built {
        Ok(g) => g,
        Err(e) => return fail(parent.as_ref(), e).await,
    };
    let mut predecessor = None;
    match parent {
        Some(parent) => match gen.take_over(parent).await {
            Ok(channel) => predecessor = channel,
            Err(code) => return code,
        },
        None => {
            gen.caught_starting = gen.commands.stop_queued();
            gen.predecessor_gone.cancel();
            match gen.make_ready() {
                Ok(doors) => gen.open_doors(doors),
                Err(e) => return fail(None, e).await,
            }
            gen.became_active(false);
        }
    }
    let exit = match gen.serve().await {
        Ending::HandedOver(successor, waiter) => {
            gen.retire(*successor, waiter, predecessor.clone()).await
        }
        Ending::Stop(signalled) => gen.stop(signalled).await,
    };
    if let Some(channel) = predecessor {
        departure::leaving(&channel, exit).await;
    }
    exit
}

async fn fail(parent: Option<&Parent>, err: StartError) -> Exit {
    let code = match &err {
        StartError::Handoff(h) => h.exit_code(),
        _ => Exit::Failure,
    };
    match parent {
        // The older generation serves on and logs the failed reload at
        // ERROR: this one is its cause, not a second outage.
        Some(parent) => {
            tracing::warn!(cause = %err, "new generation could not start; the reload fails and the older generation serves on");
            parent.fail(code, &err.to_string()).await;
        }
        None => tracing::error!(cause = %err, "start-up failed"),
    }
    code
}

/// A built generation: everything it owns until it exits.
struct Generation {
    config: Config,
    pools: Vec<Arc<Pool>>,
    /// Looks up backends named by DNS (none when the config names none).
    resolver: Option<crate::resolve::Resolver>,
    /// Stops background work: health checks, DNS re-resolution, status
    /// lines (at handoff, or at teardown).
    background: CancellationToken,
    /// Stops the watchdog's pings: once a successor is surely systemd's
    /// main process (the naming window's end), systemd would log each of
    /// ours as a warning for the rest of the drain.
    watchdog: CancellationToken,
    exec: Exec,
    number: u64,
    commands: Commands,
    phase: watch::Sender<Phase>,
    admin: Arc<AdminShared>,
    /// Stops the admin accept loop: at handoff, or last of all at a stop.
    admin_stop: CancellationToken,
    /// Cancelled once the admin listener is closed (after a stop).
    admin_closed: CancellationToken,
    /// Lets the admin accept loop start (see `build`).
    admin_go: CancellationToken,
    /// The generation we took over from has exited (at once for a first
    /// start): until then its reports reach the serving generation only
    /// through us, so we outlive it.
    predecessor_gone: CancellationToken,
    /// A takeover's fd store update, sent again once the predecessor has
    /// exited, unless our doors closed first.
    fd_store_again: crate::lifecycle::systemd::PendingUpdate,
    /// Stops data-plane and control accept loops.
    accept_stop: CancellationToken,
    holdings: Holdings,
    /// Accept loops not yet started (their sockets are made ready at
    /// [`Self::make_ready`], and the loops start at [`Self::open_doors`]).
    pending: Vec<build::Pending>,
    /// The threads connections live on.
    workers: crate::workers::Workers,
    accept_tasks: JoinSet<()>,
    control: Option<tokio::net::UnixListener>,
    control_rx: mpsc::Receiver<control::Incoming>,
    control_tx: mpsc::Sender<control::Incoming>,
    /// Inherited socket names the config no longer has, or has under
    /// another name (a renamed listener's): dropped from systemd's fd
    /// store once we serve, before our own names are stored.
    unclaimed: Vec<String>,
    /// Control requests being read or answered (see `answer_late`).
    control_tasks: tokio_util::task::TaskTracker,
    /// The generation we handed over to, once we have.
    successor: Option<u32>,
    /// A stop signal came during this first start, before it was ever
    /// announced ready: nobody was told to send it work, so its stop has
    /// no pre-stop pause (see `stop`).
    caught_starting: bool,
    /// The generation we took over from had said `READY=1`: a takeover
    /// says it at once, as the service was ready already; one that took
    /// over during a first start waits for its own first round.
    predecessor_started: bool,
    drain: Drain,
    adopted: Vec<String>,
    /// Old names of sockets adopted under new ones (renamed listeners).
    renamed: Vec<String>,
    /// Older generations still draining, oldest first; once a stop caught
    /// a reload, the new generation too, last (see
    /// `Reloading::settle_for_stop`).
    draining: Vec<Process>,
    /// When the new generation's stop ends at the latest, if it is among
    /// `draining`: our stop waits for it until then, not its own end.
    outlive_until: Option<Instant>,
    /// How that new generation ends, which our exit code tells too.
    successor_departure: Option<Departure>,
    /// What we last told systemd of where we stand (serving, reloading,
    /// stopping), which our tasks' reports keep to.
    standing: Arc<systemd::Standing>,
    /// Seals every TLS listener's session tickets; its keys go to the
    /// next generation.
    ticketer: Arc<crate::tls::tickets::Ticketer>,
    /// The access logs' writers: written out before the generation exits.
    access_logs: Arc<crate::access_log::sink::Sinks>,
}

enum Ending {
    /// With whoever asked for the reload, answered once we stopped accepting.
    /// (Boxed: a successor holds its channel's receive state.)
    HandedOver(Box<Successor>, Option<tokio::sync::oneshot::Sender<Reply>>),
    /// A stop, signalled at this instant (settling a reload under way may
    /// have taken a while since).
    Stop(Instant),
}

impl Generation {
    /// The serving loop: returns when a reload handed over or a stop began.
    async fn serve(&mut self) -> Ending {
        let mut reload: Option<Reloading> = None;
        let mut waiter: Option<tokio::sync::oneshot::Sender<Reply>> = None;
        // A SIGHUP while a reload is under way: the config may have changed
        // again since the new generation read it (two tools, each writing
        // and signalling), so another reload follows this one, here if it
        // fails, in the new generation if it succeeds. Dropped, the later
        // change would never be applied, and nothing would say so.
        let mut again = false;
        loop {
            tokio::select! {
                // Commands first: a stop that came while a handoff finished
                // is a stop of the service, which stops the successor too
                // (seen after the handoff, it would stop this one alone).
                biased;
                command = self.commands.recv() => match command {
                    Command::Stop => {
                        let signalled = Instant::now();
                        if let Some(under_way) = reload.take() {
                            let settled = under_way.settle_for_stop(&mut self.draining).await;
                            self.settled_for_stop(settled, waiter.take());
                        }
                        return Ending::Stop(signalled);
                    }
                    // Commands are heard in the order they came: a SIGHUP
                    // and then a SIGTERM (a first start saw both) began a
                    // reload whose new generation the stop then killed.
                    Command::Reload if self.commands.stop_queued() => {
                        tracing::info!("SIGHUP ignored: a stop signal came after it");
                    }
                    Command::Reload if reload.is_none() => reload = Some(self.begin_reload()),
                    Command::Reload => {
                        tracing::info!("SIGHUP during a reload: another follows once it ends");
                        again = true;
                    }
                    Command::ForceDrain => tracing::info!(signal = "SIGUSR2", "ignored signal: nothing is draining here"),
                },
                Some(incoming) = self.control_rx.recv() => match incoming.request {
                    Request::Reload if self.commands.stop_queued() => {
                        let _ = incoming.reply.send(Reply::err(Exit::Failure, "baton is stopping: no reload"));
                    }
                    Request::Reload if reload.is_none() => {
                        reload = Some(self.begin_reload());
                        waiter = Some(incoming.reply);
                    }
                    Request::Reload => {
                        let _ = incoming.reply.send(Reply::err(Exit::Busy, "a reload is already under way; retry when it has finished"));
                    }
                    Request::Status => {
                        let pid = std::process::id();
                        let _ = incoming.reply.send(Reply::serving(pid, format!("generation {} (pid {pid}) is serving", self.number)));
                    }
                },
                outcome = async {
                    match reload.as_mut() {
                        Some(under_way) => under_way.finished().await,
                        None => std::future::pending().await,
                    }
                }, if reload.is_some() => {
                    let Some(under_way) = reload.take() else { continue };
                    let took = under_way.started.elapsed().as_secs_f64();
                    match outcome {
                        Ok(successor) if self.commands.stop_queued() => {
                            // A stop signal's handler ran before this
                            // success was taken, its command not heard
                            // yet: the stop came first, as above (which
                            // counts no reload either).
                            let signalled = self.commands.hear_the_stop().await;
                            let settled = under_way.settle(Ok(successor), &mut self.draining).await;
                            self.settled_for_stop(settled, waiter.take());
                            return Ending::Stop(signalled);
                        }
                        Ok(successor) => {
                            metrics::reload_finished(true, took);
                            // Named main here, where nothing can fail any
                            // more (under `NotifyAccess=main` no rollback
                            // to our pid would be heard after) and no stop
                            // came first: a stop handled first keeps us
                            // main (we pass it on and outlive N+1,
                            // `settle_for_stop`). Named in the handoff's
                            // task, a stop seen a moment later found N+1
                            // main already, passed it the word "I outlive
                            // you", and N+1 did not wait for our drain:
                            // exiting first, its end made systemd force
                            // ours, and its exit code hid it.
                            crate::lifecycle::systemd::handed_over(
                                successor.process.pid(),
                                self.standing.is_started(),
                            );
                            under_way.force_beyond_max();
                            if again {
                                // It serves already: its handlers are in
                                // place, and a reload it is asked while it
                                // finishes taking over waits until it serves.
                                if let Err(err) = successor.process.signal(rustix::process::Signal::HUP) {
                                    tracing::warn!(cause = %err, "could not pass the SIGHUP on to the new generation");
                                }
                            }
                            return Ending::HandedOver(Box::new(successor), waiter.take());
                        }
                        Err(err) => {
                            metrics::reload_finished(false, took);
                            under_way.give_back(&mut self.draining);
                            self.admin.keep_backends();
                            tracing::error!(cause = %err, "reload failed; this generation keeps serving");
                            self.standing.serving(&self.status_line());
                            if let Some(w) = waiter.take() {
                                let _ = w.send(Reply::err(err.exit_code(), format!("reload failed: {err}")));
                            }
                            if std::mem::take(&mut again) {
                                reload = Some(self.begin_reload());
                            }
                        }
                    }
                }
            }
        }
    }

    /// A reload settled for a stop: its requester hears how, and our stop
    /// outlives the new generation if it stops too.
    fn settled_for_stop(
        &mut self,
        settled: reloading::Settled,
        waiter: Option<tokio::sync::oneshot::Sender<Reply>>,
    ) {
        self.outlive_until = settled.outlive_until;
        self.successor_departure = settled.departure;
        // Handed over or not, this generation serves its pre-stop pause: it
        // takes backend posts.
        self.admin.keep_backends();
        if let Some(w) = waiter {
            let _ = w.send(Reply::err(Exit::Failure, settled.said));
        }
    }

    /// Spawns the handoff as a task.
    fn begin_reload(&mut self) -> Reloading {
        self.standing.reloading();
        self.draining.retain(Process::is_alive);
        // This one drains too once the reload succeeds: the oldest beyond
        // the bound are forced then (see `Reloading`), and are not offered.
        let beyond = self
            .draining
            .len()
            .saturating_sub(self.config.reload.max_draining.saturating_sub(1));
        let beyond_max: Vec<Process> = self.draining.drain(..beyond).collect();
        let mut draining: Vec<Named> = self.draining.iter().filter_map(Process::named).collect();
        draining.push(Named::this_process());
        let sockets = self.holdings.offer();
        let backends = build::carry_out(&self.pools);
        let (pools, admin) = (self.pools.clone(), Arc::clone(&self.admin));
        let at_go_ahead: Box<dyn Fn() -> GoAhead + Send> = Box::new(move || GoAhead {
            backends: admin.hand_over_backends(|| build::carry_out(&pools)),
            report: Some(admin.report()),
        });
        let report = self.admin.report();
        let tickets = self.ticketer.keys();
        let resolved = crate::resolve::refresh::carry_out(&self.pools);
        let started = self.standing.is_started();
        let exec = self.exec.clone();
        let ready_timeout = self.config.reload.ready_timeout;
        let generation = self.number + 1;
        tracing::info!(generation, "reload: starting the next generation");
        Reloading::begin(
            |abandon| {
                tokio::spawn(async move {
                    let sockets = sockets.map_err(|e| HandoverError::Channel(e.into()))?;
                    generation::hand_over(
                        &exec,
                        Offer {
                            generation,
                            sockets,
                            draining,
                            backends,
                            report,
                            tickets,
                            resolved,
                            started,
                            at_go_ahead,
                        },
                        ready_timeout,
                        abandon,
                    )
                    .await
                })
            },
            beyond_max,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    use super::remedy;

    /// Each likely cause of a socket that cannot be bound is named; one
    /// with no likely cause gets no guess.
    #[test]
    fn a_bind_failure_says_what_it_most_likely_means() {
        let said = |kind, port| remedy(&Error::from(kind), port);
        assert!(said(ErrorKind::AddrInUse, Some(80)).contains("another process listens there"));
        assert!(said(ErrorKind::AddrNotAvailable, Some(8080)).contains("no interface"));
        assert!(said(ErrorKind::PermissionDenied, Some(443)).contains("CAP_NET_BIND_SERVICE"));
        assert!(said(ErrorKind::PermissionDenied, None).contains("RuntimeDirectory="));
        assert_eq!(said(ErrorKind::PermissionDenied, Some(8080)), "");
        assert_eq!(said(ErrorKind::InvalidInput, Some(80)), "");
    }
}
