//! The supervisor of one generation: builds it ([`start`]), owns its
//! `Phase`, and runs the one `select!` over signals, control requests and
//! a reload under way ([`Generation::serve`]). It then ends in one of two
//! ways: handed over to a newer generation ([`Generation::retire`]) or
//! stopped ([`Generation::stop`]). Exit codes are DESIGN.md's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminShared, GenerationInfo, ListenerView, Topology};
use crate::backend::{probe, AdminState, Pool};
use crate::config::{Config, Protocol};
use crate::connection::{Connections, ListenerStats, Proxy};
use crate::lifecycle::control::{self, Reply, Request};
use crate::lifecycle::drain::{Drain, DrainOutcome};
use crate::lifecycle::generation::{self, Exec, HandoverError, Offer, Parent, Successor};
use crate::lifecycle::handoff::{BackendCarry, Channel, Message, Report};
use crate::lifecycle::inventory::{Holdings, Inventory};
use crate::lifecycle::signals::{Command, Signals};
use crate::lifecycle::{systemd, Check, Phase};
use crate::listener::{self, Closing, Listener};
use crate::metrics::{self, DrainReason};
use crate::proxy::{http::HttpProxy, tcp::TcpProxy};

/// Exit codes from DESIGN.md.
pub mod exit {
    pub const OK: i32 = 0;
    pub const FAILURE: i32 = 1;
    pub const FORCED: i32 = 3;
    pub const CONFIG: i32 = 78;
}

/// A start-up failure, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("admin listener {addr}: {source}")]
    Admin {
        addr: String,
        source: std::io::Error,
    },
    #[error("control socket {path}: {source}")]
    Control {
        path: String,
        source: std::io::Error,
    },
    #[error("listener \"{name}\" cannot bind {addr}: {source}")]
    Bind {
        name: String,
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Adopt(#[from] crate::lifecycle::inventory::AdoptError),
    #[error("handoff: {0}")]
    Handoff(#[from] HandoverError),
}

/// The inputs of one generation's run.
pub struct Setup {
    pub config: Config,
    pub exec: Exec,
    pub parent: Option<(Parent, Inventory)>,
    pub metrics: Option<PrometheusHandle>,
}

/// Runs one generation to its end and returns the process exit code.
pub async fn run(setup: Setup) -> i32 {
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return fail(None, StartError::Signals(e)).await,
    };
    let (parent, inventory) = match setup.parent {
        Some((p, i)) => (Some(p), i),
        None => (None, systemd_inventory()),
    };
    let number = parent.as_ref().map_or(1, |p| p.generation);
    let carried = parent
        .as_ref()
        .map(|p| (p.backends.clone(), p.report.clone()))
        .unwrap_or_default();
    let built = start(
        carried,
        setup.config,
        setup.exec,
        inventory,
        number,
        setup.metrics,
        signals,
    )
    .await;
    let mut gen = match built {
        Ok(g) => g,
        Err(e) => return fail(parent.as_ref(), e).await,
    };
    let adopted = gen.adopted.clone();
    let takeover = parent.is_some();
    if let Some(parent) = parent {
        gen.draining_pids = parent.draining.clone();
        if let Err(e) = parent.ready(adopted).await {
            tracing::error!(cause = %e, "old generation did not let us take over");
            return exit::FAILURE;
        }
        gen.open_doors();
        match parent.accepting().await {
            Ok(channel) => {
                let (on_report, on_exit) = (Arc::clone(&gen.admin), Arc::clone(&gen.admin));
                tokio::spawn(generation::reports(
                    channel,
                    move |r| on_report.set_inherited(r),
                    move || on_exit.inherited_exited(),
                ));
            }
            Err(e) => {
                tracing::warn!(cause = %e, "could not confirm the takeover to the old generation")
            }
        }
    } else {
        gen.open_doors();
    }
    gen.became_active(takeover);
    match gen.serve().await {
        Ending::HandedOver(successor, waiter) => gen.retire(successor, waiter).await,
        Ending::Stop => gen.stop().await,
    }
}

/// Sockets systemd passed us (socket activation or its fd store), if any.
fn systemd_inventory() -> Inventory {
    let passed = crate::lifecycle::handoff::from_systemd()
        .and_then(|(entries, fds)| Inventory::new(entries, fds).map_err(std::io::Error::other));
    match passed {
        Ok(inventory) => {
            if !inventory.is_empty() {
                tracing::info!(sockets = inventory.len(), "adopting sockets from systemd");
            }
            inventory
        }
        Err(err) => {
            tracing::warn!(cause = %err, "ignoring sockets passed by systemd");
            Inventory::default()
        }
    }
}

async fn fail(parent: Option<&Parent>, err: StartError) -> i32 {
    let code = match &err {
        StartError::Handoff(h) => h.exit_code(),
        _ => exit::FAILURE,
    };
    tracing::error!(cause = %err, "start-up failed");
    if let Some(parent) = parent {
        parent.fail(code, &err.to_string()).await;
    }
    code
}

/// A built generation: everything it owns until it exits.
struct Generation {
    config: Config,
    pools: Vec<Arc<Pool>>,
    /// Stops background work: health checks, watchdog pings, status lines
    /// (at handoff, or at teardown).
    background: CancellationToken,
    exec: Exec,
    number: u64,
    signals: Signals,
    phase: watch::Sender<Phase>,
    admin: Arc<AdminShared>,
    /// Stops the admin accept loop: at handoff, or last of all at a stop.
    admin_stop: CancellationToken,
    /// Stops data-plane and control accept loops.
    accept_stop: CancellationToken,
    holdings: Holdings,
    /// Accept loops not yet started (they start at [`Self::open_doors`]).
    pending: Vec<(Listener, Arc<Connections>, Arc<AtomicBool>)>,
    accept_tasks: JoinSet<()>,
    control: Option<tokio::net::UnixListener>,
    control_rx: mpsc::Receiver<control::Incoming>,
    control_tx: mpsc::Sender<control::Incoming>,
    /// Inherited socket names the config no longer has (dropped from
    /// systemd's fd store once we serve).
    unclaimed: Vec<String>,
    /// Control requests being read or answered (see `answer_late`).
    control_tasks: tokio_util::task::TaskTracker,
    /// The generation we handed over to, once we have.
    successor: Option<u32>,
    drain: Drain,
    adopted: Vec<String>,
    draining_pids: Vec<u32>,
}

enum Ending {
    /// With whoever asked for the reload, answered once we stopped accepting.
    HandedOver(Successor, Option<tokio::sync::oneshot::Sender<Reply>>),
    Stop,
}

#[allow(clippy::too_many_arguments)]
async fn start(
    carried: (Vec<BackendCarry>, Report),
    config: Config,
    exec: Exec,
    mut inventory: Inventory,
    number: u64,
    metrics: Option<PrometheusHandle>,
    signals: Signals,
) -> Result<Generation, StartError> {
    metrics::start(number);
    let mut waiting: Vec<Check> = config
        .listeners
        .iter()
        .map(|l| Check {
            name: format!("listener {}", l.name),
            ok: false,
            detail: Some("not bound yet".into()),
        })
        .collect();
    let (phase, phase_rx) = watch::channel(Phase::Starting {
        waiting_on: waiting.clone(),
    });
    let mut holdings = Holdings::default();

    let admin_std = match inventory.take_tcp("admin", config.admin.listen)? {
        Some(l) => l,
        None => listener::bind_tcp(config.admin.listen, 128, false).map_err(|source| {
            StartError::Admin {
                addr: config.admin.listen.to_string(),
                source,
            }
        })?,
    };
    let admin_addr = admin_std.local_addr().map_err(|source| StartError::Admin {
        addr: config.admin.listen.to_string(),
        source,
    })?;
    holdings
        .hold(
            "admin",
            admin_addr.to_string(),
            std::os::fd::AsFd::as_fd(&admin_std),
        )
        .map_err(|source| StartError::Admin {
            addr: admin_addr.to_string(),
            source,
        })?;
    let admin = Arc::new(AdminShared {
        config: config.admin.clone(),
        generation: GenerationInfo {
            number,
            pid: std::process::id(),
            started_at: SystemTime::now(),
        },
        phase: phase_rx,
        topology: Default::default(),
        metrics,
        drain_deadline: Default::default(),
        inherited: std::sync::RwLock::new(carried.1),
    });
    let admin_stop = CancellationToken::new();
    let admin_listener =
        tokio::net::TcpListener::from_std(admin_std).map_err(|source| StartError::Admin {
            addr: admin_addr.to_string(),
            source,
        })?;
    tokio::spawn(admin::serve(
        admin_listener,
        Arc::clone(&admin),
        admin_stop.clone(),
    ));
    tracing::info!(generation = number, admin = %admin_addr, "admin listening");

    let control = take_control(&config, &mut inventory, &mut holdings)?;

    let pools = Pool::all(&config.pools);
    carry_over(&pools, &carried.0);
    let drain = Drain::new();
    let mut pending = Vec::new();
    let mut views = Vec::new();
    for (i, l) in config.listeners.iter().enumerate() {
        let stats = Arc::new(ListenerStats::default());
        let conf = Arc::new(l.clone());
        let proxy = match l.protocol {
            Protocol::Http => Proxy::Http(Arc::new(HttpProxy::new(l, &pools))),
            Protocol::Tcp => Proxy::Tcp(Arc::new(TcpProxy {
                listener: Arc::from(l.name.as_str()),
                pool: Arc::clone(&pools[l.pool]),
                connect_timeout: l.connect_timeout,
            })),
        };
        let connections = Arc::new(Connections {
            config: Arc::clone(&conf),
            proxy,
            drain: drain.watch(),
            stats: Arc::clone(&stats),
            metrics: metrics::listener(&l.name),
        });
        let limit = Arc::new(tokio::sync::Semaphore::new(l.max_connections));
        let mut bound = l.bind;
        let mut inodes = Vec::new();
        for shard in 0..l.reuseport {
            // Shard 0 is the listener's own name, so a socket unit's
            // `FileDescriptorName=web` matches listener "web".
            let name = if shard == 0 {
                l.name.clone()
            } else {
                format!("{}#{shard}", l.name)
            };
            let std = match inventory.take_tcp(&name, l.bind)? {
                Some(s) => s,
                None => listener::bind_tcp(l.bind, l.backlog, true).map_err(|source| {
                    StartError::Bind {
                        name: l.name.clone(),
                        addr: l.bind.to_string(),
                        source,
                    }
                })?,
            };
            let local = std.local_addr().map_err(|source| StartError::Bind {
                name: l.name.clone(),
                addr: l.bind.to_string(),
                source,
            })?;
            bound = local;
            inodes.extend(crate::metrics::kernel::socket_inode(
                std::os::fd::AsFd::as_fd(&std),
            ));
            let flag = holdings
                .hold(&name, local.to_string(), std::os::fd::AsFd::as_fd(&std))
                .map_err(|source| StartError::Bind {
                    name: l.name.clone(),
                    addr: local.to_string(),
                    source,
                })?;
            let socket =
                tokio::net::TcpListener::from_std(std).map_err(|source| StartError::Bind {
                    name: l.name.clone(),
                    addr: local.to_string(),
                    source,
                })?;
            pending.push((
                Listener {
                    name: Arc::from(l.name.as_str()),
                    socket,
                    limit: Arc::clone(&limit),
                },
                Arc::clone(&connections),
                flag,
            ));
        }
        waiting[i] = Check {
            name: format!("listener {}", l.name),
            ok: true,
            detail: None,
        };
        views.push(ListenerView {
            name: l.name.clone(),
            bind: bound,
            protocol: l.protocol,
            stats,
            inodes,
        });
    }
    let _ = phase.send(Phase::Starting {
        waiting_on: waiting,
    });
    admin.set_topology(Topology {
        listeners: views,
        pools: pools.clone(),
    });
    // The first health round: a takeover needs only this (verdicts carried
    // over), not healthy backends, so a reload during an outage works.
    probe::first_round(&pools).await;
    let adopted = inventory.taken();
    let unclaimed = inventory.unclaimed();
    if !unclaimed.is_empty() {
        tracing::info!(sockets = ?unclaimed, "closing inherited sockets the config no longer names");
    }
    drop(inventory);
    let (control_tx, control_rx) = mpsc::channel(16);
    Ok(Generation {
        pools,
        background: CancellationToken::new(),
        unclaimed,
        draining_pids: Vec::new(),
        config,
        exec,
        number,
        signals,
        phase,
        admin,
        admin_stop,
        accept_stop: CancellationToken::new(),
        holdings,
        pending,
        accept_tasks: JoinSet::new(),
        control: Some(control),
        control_rx,
        control_tx,
        control_tasks: tokio_util::task::TaskTracker::new(),
        successor: None,
        drain,
        adopted,
    })
}

/// Applies backend states an older generation carried over, matched by
/// pool, name and address (a backend whose address changed starts afresh).
fn carry_over(pools: &[Arc<Pool>], carried: &[BackendCarry]) {
    for c in carried {
        let found = pools
            .iter()
            .filter(|p| p.name == c.pool)
            .flat_map(|p| p.backends.iter())
            .find(|b| b.name == c.name && b.address.to_string() == c.address);
        if let (Some(backend), Some(admin)) = (found, AdminState::parse(&c.admin)) {
            backend.adopt(admin, c.healthy);
        }
    }
}

/// What this generation carries to the next about its backends.
fn carry_out(pools: &[Arc<Pool>]) -> Vec<BackendCarry> {
    pools
        .iter()
        .flat_map(|p| p.backends.iter())
        .map(|b| BackendCarry {
            pool: b.pool.clone(),
            name: b.name.clone(),
            address: b.address.to_string(),
            admin: b.admin().as_str().to_string(),
            healthy: b.has_verdict().then(|| b.is_healthy()),
        })
        .collect()
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

/// Every pool has a backend that can take work.
fn pools_ready(pools: &[Arc<Pool>]) -> bool {
    pools.iter().all(|p| p.healthy_count() > 0)
}

fn take_control(
    config: &Config,
    inventory: &mut Inventory,
    holdings: &mut Holdings,
) -> Result<tokio::net::UnixListener, StartError> {
    let path = &config.control.socket;
    let err = |source| StartError::Control {
        path: path.display().to_string(),
        source,
    };
    let std = match inventory.take_unix("control", path)? {
        Some(l) => l,
        None => control::bind(path).map_err(err)?,
    };
    holdings
        .hold(
            "control",
            path.display().to_string(),
            std::os::fd::AsFd::as_fd(&std),
        )
        .map_err(err)?;
    tokio::net::UnixListener::from_std(std).map_err(err)
}

impl Generation {
    /// Starts every accept loop: from here on this generation takes work.
    fn open_doors(&mut self) {
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
    fn became_active(&mut self, takeover: bool) {
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

    fn status_line(&self) -> String {
        format!(
            "generation {} serving {} listener(s)",
            self.number,
            self.config.listeners.len()
        )
    }

    /// The serving loop: returns when a reload handed over or a stop began.
    async fn serve(&mut self) -> Ending {
        let mut reload: Option<(JoinHandle<Result<Successor, HandoverError>>, Instant)> = None;
        let mut waiter: Option<tokio::sync::oneshot::Sender<Reply>> = None;
        loop {
            tokio::select! {
                command = self.signals.recv() => match command {
                    Command::Stop => return Ending::Stop,
                    Command::Reload if reload.is_none() => reload = Some((self.begin_reload(), Instant::now())),
                    Command::Reload => tracing::info!("SIGHUP ignored: a reload is already under way"),
                    Command::ForceDrain => tracing::info!(signal = "SIGUSR2", "ignored signal: nothing is draining here"),
                },
                Some(incoming) = self.control_rx.recv() => match incoming.request {
                    Request::Reload if reload.is_none() => {
                        reload = Some((self.begin_reload(), Instant::now()));
                        waiter = Some(incoming.reply);
                    }
                    Request::Reload => {
                        let _ = incoming.reply.send(Reply::err(75, "a reload is already under way; retry when it has finished"));
                    }
                    Request::Status => {
                        let pid = std::process::id();
                        let _ = incoming.reply.send(Reply::serving(pid, format!("generation {} (pid {pid}) is serving", self.number)));
                    }
                },
                joined = async {
                    match reload.as_mut() {
                        Some((handle, _)) => handle.await,
                        None => std::future::pending().await,
                    }
                }, if reload.is_some() => {
                    let started = reload.take().map_or_else(Instant::now, |(_, t)| t);
                    let outcome = joined.unwrap_or_else(|e| Err(HandoverError::OutOfTurn(format!("reload task: {e}"))));
                    metrics::reload_finished(outcome.is_ok(), started.elapsed().as_secs_f64());
                    match outcome {
                                                Ok(successor) => return Ending::HandedOver(successor, waiter.take()),
                        Err(err) => {
                            tracing::error!(cause = %err, "reload failed; this generation keeps serving");
                            systemd::ready(&self.status_line());
                            if let Some(w) = waiter.take() {
                                let _ = w.send(Reply::err(err.exit_code(), format!("reload failed: {err}")));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Spawns the handoff as a task (dropping it kills the child).
    fn begin_reload(&mut self) -> JoinHandle<Result<Successor, HandoverError>> {
        systemd::reloading();
        self.draining_pids.retain(|&pid| alive(pid));
        let max = self.config.reload.max_draining;
        while self.draining_pids.len() >= max {
            let oldest = self.draining_pids.remove(0);
            tracing::info!(
                pid = oldest,
                max_draining = max,
                "too many generations draining; forcing the oldest to close"
            );
            signal(oldest, nix::sys::signal::Signal::SIGUSR2);
        }
        let mut draining = self.draining_pids.clone();
        draining.push(std::process::id());
        let sockets = self.holdings.offer();
        let backends = carry_out(&self.pools);
        let report = self.admin.report();
        let exec = self.exec.clone();
        let ready_timeout = self.config.reload.ready_timeout;
        let generation = self.number + 1;
        tracing::info!(generation, "reload: starting the next generation");
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
                },
                ready_timeout,
            )
            .await
        })
    }

    /// After a handoff: stop accepting (the sockets live on in the successor)
    /// and drain under `reload.drain_timeout`.
    async fn retire(
        mut self,
        successor: Successor,
        waiter: Option<tokio::sync::oneshot::Sender<Reply>>,
    ) -> i32 {
        tracing::info!(successor = successor.pid, "handed over; draining");
        self.successor = Some(successor.pid);
        let naming = CancellationToken::new();
        let named_until = Instant::now() + NAMING_WINDOW;
        if systemd::enabled() {
            tokio::spawn(keep_naming(successor.pid, naming.clone()));
        }
        let _ = self.phase.send(Phase::Draining);
        self.holdings.handed_over(&successor.adopted);
        self.close_doors().await;
        // Only now: when `baton reload` returns, every new connection and
        // probe reaches the new generation.
        if let Some(w) = waiter {
            let message = format!(
                "generation {} (pid {}) is serving",
                self.number + 1,
                successor.pid
            );
            let _ = w.send(Reply::serving(successor.pid, message));
        }
        self.background.cancel();
        self.admin_stop.cancel();
        let budget = self.config.reload.drain_timeout;
        self.publish_deadline(Instant::now() + budget);
        let channel = Arc::new(successor.channel);
        let reporting = CancellationToken::new();
        let reporter = tokio::spawn(report_while_draining(
            Arc::clone(&channel),
            Arc::clone(&self.admin),
            reporting.clone(),
        ));
        let outcome = self.drain_for(budget, DrainReason::Reload).await;
        reporting.cancel();
        // A periodic report still being sent must land before the last one,
        // or the successor would end on older, smaller totals.
        let _ = reporter.await;
        // The last word: everything counted up to now, so the successor's
        // totals are exact once we are gone.
        let last = Message::Report(self.admin.report());
        if let Err(err) = channel.send(&last, &[]).await {
            tracing::info!(cause = %err, "could not send the final report to the successor");
        }
        // From root, systemd takes the first MAINPID= at once; an
        // unprivileged main must outlive a repetition that lands.
        if systemd::enabled() && !nix::unistd::geteuid().is_root() {
            tokio::time::sleep_until(named_until).await;
        }
        naming.cancel();
        self.exit_code(outcome)
    }

    /// The ordered stop: readiness flips, pre-stop pause, doors close (queue
    /// served), in-flight work drains, admin closes last.
    async fn stop(mut self) -> i32 {
        tracing::info!(pre_stop_delay = ?self.config.shutdown.pre_stop_delay, "stopping");
        let _ = self.phase.send(Phase::Stopping);
        systemd::stopping();
        let forced_early = tokio::select! {
            () = tokio::time::sleep(self.config.shutdown.pre_stop_delay) => false,
            command = self.signals.recv() => command == Command::Stop,
        };
        self.holdings.handed_over(&[]);
        self.close_doors().await;
        // Under systemd the control socket lives on in the fd store for the
        // next start, and its path with it; otherwise nothing serves it now.
        if !systemd::enabled() {
            if let Err(err) = std::fs::remove_file(&self.config.control.socket) {
                tracing::debug!(cause = %err, "control socket not removed");
            }
        }
        let outcome = if forced_early {
            self.drain.begin(Duration::ZERO);
            let open = self.drain.force().await;
            tracing::info!(open, "second stop signal: forced");
            DrainOutcome::Forced { open: open.max(1) }
        } else {
            self.drain_for(self.config.shutdown.drain_timeout, DrainReason::Shutdown)
                .await
        };
        self.background.cancel();
        self.admin_stop.cancel();
        self.exit_code(outcome)
    }

    /// Stops every accept loop and waits until each has closed its socket.
    async fn close_doors(&mut self) {
        self.holdings = Holdings::default();
        self.accept_stop.cancel();
        while self.accept_tasks.join_next().await.is_some() {}
    }

    /// Runs the drain; stop signals shorten or force it.
    async fn drain_for(&mut self, budget: Duration, reason: DrainReason) -> DrainOutcome {
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
        let mut stops = 0;
        let outcome = loop {
            tokio::select! {
                () = self.drain.idle() => break DrainOutcome::Drained,
                () = tokio::time::sleep_until(deadline) => break DrainOutcome::Forced { open: self.drain.force().await },
                command = self.signals.recv() => match command {
                    Command::Stop if stops == 0 && matches!(reason, DrainReason::Reload) => {
                        stops += 1;
                        deadline = deadline.min(Instant::now() + self.config.shutdown.drain_timeout);
                        self.publish_deadline(deadline);
                        tracing::info!("stop signal while draining: keeping the earlier deadline");
                    }
                    Command::Stop | Command::ForceDrain => break DrainOutcome::Forced { open: self.drain.force().await },
                                        Command::Reload => tracing::info!("SIGHUP ignored: this generation is draining"),
                },
                Some(incoming) = self.control_rx.recv() => self.answer_late(incoming),
            }
        };
        self.finish_control_requests().await;
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
        outcome
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
                Reply::err(75, "a reload just completed; retry to reload again")
            }
            (_, None) => Reply::err(exit::FAILURE, "the daemon is stopping"),
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

    fn publish_deadline(&self, deadline: Instant) {
        let wall = SystemTime::now() + deadline.saturating_duration_since(Instant::now());
        if let Ok(mut d) = self.admin.drain_deadline.write() {
            *d = Some(wall);
        }
    }

    fn exit_code(&self, outcome: DrainOutcome) -> i32 {
        match outcome {
            DrainOutcome::Drained => {
                tracing::info!(
                    generation = self.number,
                    expected = true,
                    "drained; exiting"
                );
                exit::OK
            }
            DrainOutcome::Forced { open: 0 } => exit::OK,
            DrainOutcome::Forced { open } => {
                let listeners: Vec<&str> = self
                    .config
                    .listeners
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect();
                tracing::warn!(
                    generation = self.number,
                    connections = open,
                    ?listeners,
                    "drain deadline passed; connections force-closed"
                );
                exit::FORCED
            }
        }
    }
}

/// How long an old generation keeps naming its successor to systemd (and
/// so stays alive at least that long after a handoff).
const NAMING_WINDOW: Duration = Duration::from_millis(1500);

/// Repeats `MAINPID=<successor>` every 100 ms. systemd 252 ignores MAINPID=
/// while the unit is in its reload state, which lasts as long as
/// `ExecReload=` (our `baton reload`, which waits for this very handoff)
/// runs; once it has exited, the next repetition lands. The first one was
/// sent before we stopped accepting, which is what newer systemd and a
/// SIGHUP reload take. Once the successor is main, systemd drops our
/// messages, so repeating is harmless. The old generation must not exit
/// before a repetition landed, or systemd would take the unit for dead:
/// hence `NAMING_WINDOW`.
async fn keep_naming(successor: u32, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        systemd::main_pid(successor);
    }
}

/// Sends our counters and live generations to the successor at once (our
/// drain deadline is known by then), then every half second while we drain.
async fn report_while_draining(
    channel: Arc<Channel>,
    admin: Arc<AdminShared>,
    stop: CancellationToken,
) {
    loop {
        if let Err(err) = channel.send(&Message::Report(admin.report()), &[]).await {
            tracing::info!(cause = %err, "successor stopped taking reports");
            return;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

fn alive(pid: u32) -> bool {
    i32::try_from(pid)
        .is_ok_and(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok())
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), sig);
    }
}
