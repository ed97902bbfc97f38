//! Building one generation: sockets adopted or bound (admin first), pools
//! with their first members from DNS and carried-over backend states, the
//! first health round (which a stop signal cuts short on a first start).

use super::*;
use crate::admin::{AdminListener, Renderer};
use crate::config::AdminListen;
use crate::lifecycle::endpoint::{self, Endpoint, ListenError};
use crate::lifecycle::handoff::CarriedAdmin;
use crate::lifecycle::inventory::Inventory;
use crate::listener::Acks;

/// Builds a generation from its `Setup`: its config, what an older
/// generation (or systemd) handed over, and the process's own parts. The
/// parent is `run`'s to talk to once the generation is built; `first` says
/// there is none (a first start, not a reload's new generation).
pub(super) async fn start(setup: Setup, first: bool) -> Result<Generation, StartError> {
    let Setup {
        inheritance,
        config,
        exec,
        metrics,
        commands,
        parent: _,
    } = setup;
    let Inheritance {
        generation: number,
        sockets: mut inventory,
        draining,
        backends: carried_backends,
        report,
        tickets,
        resolved,
        ready_by,
        predecessor_started,
    } = inheritance;
    metrics::start(number, first);
    // What cuts a first start's waits on its backends short (a stop
    // during a reload's takeover fails it instead: `take_over`).
    let stop = first.then(|| commands.stop_signal());
    let (phase, phase_rx) = watch::channel(Phase::Starting {
        waiting_on: listener_checks(&config, false),
    });
    let mut holdings = Holdings::default();

    let admin = open_admin(
        &config,
        AdminStart {
            number,
            phase: phase_rx,
            metrics,
            report,
            at_once: first,
        },
        &mut inventory,
        &mut holdings,
    )?;

    let control = take_control(&config, &mut inventory, &mut holdings)?;

    adopt_renamed_listeners(&config, &mut inventory);
    let workers =
        crate::workers::Workers::start(config.workers, config.pin_workers, config.busy_poll)
            .map_err(StartError::Workers)?;
    let pools = Pool::all(&config.pools, workers.count());
    let resolver = crate::resolve::refresh::resolver_for(&config);
    // A drain said of a DNS name holds before its first members come, so
    // they come drained too.
    carry_names(&pools, &carried_backends);
    if let Some(resolver) = &resolver {
        let cut = stopped(stop.as_ref());
        crate::resolve::refresh::first_members(&pools, resolver, &resolved, cut).await;
    }
    // What nothing took is said once, at the go-ahead's carry, the last.
    let _ = carry_over(&pools, &carried_backends);
    let ticketer = Arc::new(crate::tls::tickets::Ticketer::new(
        tickets,
        config.ticket_rotation,
    )?);
    let drain = Drain::new(workers.count());
    let access_logs = Arc::new(crate::access_log::sink::Sinks::default());
    let reopening = Arc::clone(&access_logs);
    commands.on_reopen(move || reopening.reopen());
    let parts = ListenerParts {
        number,
        first,
        workers: workers.count(),
        pools: &pools,
        access_logs: &access_logs,
        ticketer: &ticketer,
        drain: &drain,
    };
    let (pending, views) = open_listeners(&config, &parts, &mut inventory, &mut holdings)?;
    let _ = phase.send(Phase::Starting {
        waiting_on: listener_checks(&config, true),
    });
    admin.shared.set_topology(Topology {
        listeners: views,
        pools: pools.clone(),
    });
    // The first health round (see `first_round_budget`).
    let round = first_round_budget(config.reload.ready_timeout, ready_by);
    probe::first_round(&pools, round, stopped(stop.as_ref())).await;
    let Leftovers {
        adopted,
        renamed,
        unclaimed,
    } = leftovers(inventory, &holdings, first);
    let (control_tx, control_rx) = mpsc::channel(16);
    Ok(Generation {
        pools,
        resolver,
        background: CancellationToken::new(),
        watchdog: CancellationToken::new(),
        unclaimed,
        draining,
        outlive_until: None,
        successor_departure: None,
        standing: Arc::default(),
        config,
        exec,
        number,
        commands,
        phase,
        admin: admin.shared,
        admin_stop: admin.stop,
        admin_closed: admin.closed,
        admin_go: admin.go,
        predecessor_gone: CancellationToken::new(),
        fd_store_again: Default::default(),
        accept_stop: CancellationToken::new(),
        holdings,
        pending,
        workers,
        accept_tasks: JoinSet::new(),
        control: Some(control),
        control_rx,
        control_tx,
        control_tasks: tokio_util::task::TaskTracker::new(),
        successor: None,
        caught_starting: false,
        predecessor_started,
        drain,
        adopted,
        renamed,
        ticketer,
        access_logs,
    })
}

/// Each listener's line in `/status`'s list of what a start waits on.
fn listener_checks(config: &Config, bound: bool) -> Vec<Check> {
    config
        .listeners
        .iter()
        .map(|l| Check {
            name: format!("listener {}", l.name),
            ok: bound,
            detail: (!bound).then(|| "not bound yet".into()),
        })
        .collect()
}

/// What every listener of a generation is built with.
struct ListenerParts<'a> {
    number: u64,
    first: bool,
    workers: usize,
    pools: &'a [Arc<Pool>],
    access_logs: &'a crate::access_log::sink::Sinks,
    ticketer: &'a Arc<crate::tls::tickets::Ticketer>,
    drain: &'a Drain,
}

/// Every listener's shards, adopted or bound, ready to accept, and what
/// `/status` shows of each listener. Shards of listeners the previous
/// generation serves too come last: listening joins its `SO_REUSEPORT`
/// group (see `make_ready`).
fn open_listeners(
    config: &Config,
    parts: &ListenerParts<'_>,
    inventory: &mut Inventory,
    holdings: &mut Holdings,
) -> Result<(Vec<Pending>, Vec<ListenerView>), StartError> {
    let mut pending = Vec::new();
    let mut joining = Vec::new();
    let mut views = Vec::new();
    for l in &config.listeners {
        let log = access_log(l, parts.access_logs, parts.number)?;
        if l.proxy_protocol.is_some() {
            let reasons = crate::proxy_protocol::receive::Refusal::ALL.map(|r| r.label());
            metrics::proxy_protocol_listener(&l.name, reasons);
        }
        let connections = Arc::new(Connections {
            config: Arc::new(l.clone()),
            proxy: Proxy::for_listener(l, parts.pools, log),
            tls: terminator(l, parts.ticketer),
            drain: parts.drain.watch(),
            stats: Arc::new(ListenerStats::default()),
            metrics: metrics::listener(&l.name),
        });
        let shards = shards(
            l,
            parts.workers,
            parts.first,
            &connections,
            inventory,
            holdings,
        )?;
        if shards.any_adopted {
            joining.extend(shards.pending);
        } else {
            pending.extend(shards.pending);
        }
        views.push(ListenerView {
            name: l.name.clone(),
            bind: shards.bound,
            protocol: l.protocol,
            stats: Arc::clone(&connections.stats),
            queues: shards.queues,
        });
    }
    pending.append(&mut joining);
    Ok((pending, views))
}

/// How long the first health round may take: a takeover needs only this
/// (verdicts carried over), not healthy backends, so a reload during an
/// outage works; and only half the ready budget, which the lookups before
/// took part of. A takeover's round also ends before the old generation's
/// wait does, with a quarter of what is left of it to spare: that wait is
/// set by the old generation's own `ready_timeout` (a raised one only
/// applies from the next reload: by ours, we were killed mid-round).
fn first_round_budget(ready_timeout: Duration, ready_by: Option<Instant>) -> Duration {
    let half = ready_timeout / 2;
    match ready_by {
        Some(by) => {
            let left = by.saturating_duration_since(tokio::time::Instant::now());
            half.min(left.saturating_sub(left / 4))
        }
        None => half,
    }
}

/// What became of the inherited sockets: the names taken, those taken
/// under a new name, and those to let go of (see [`leftovers`]).
struct Leftovers {
    adopted: Vec<String>,
    renamed: Vec<String>,
    unclaimed: Vec<String>,
}

/// Settles the inventory once every listener has claimed its sockets:
/// what no listener named stops listening (a first start's, from systemd)
/// or is closed, and systemd's fd store lets go of it, of the old names of
/// renamed sockets, and of stale copies, before ours go in (it keeps one
/// entry a socket, under its first name).
fn leftovers(mut inventory: Inventory, holdings: &Holdings, first: bool) -> Leftovers {
    let adopted = inventory.taken();
    let renamed = inventory.renamed();
    let stale_copies = inventory.drop_copies_of(holdings);
    let mut unclaimed = inventory.unclaimed();
    if !unclaimed.is_empty() && first {
        // From systemd: a socket unit's copy would go on listening for
        // nobody (connections hang), as a store entry would until the
        // store lets it go.
        tracing::warn!(sockets = ?unclaimed, "sockets systemd passed that the config does not name stop listening (left in the fd store by a config since changed, or named by a socket unit)");
        inventory.stop_listening_unclaimed();
    } else if !unclaimed.is_empty() {
        tracing::info!(sockets = ?unclaimed, "closing inherited sockets the config no longer names");
    }
    unclaimed.extend(renamed.iter().cloned());
    unclaimed.extend(stale_copies);
    Leftovers {
        adopted,
        renamed,
        unclaimed,
    }
}

/// Resolves once `stop` (a first start's: see `Commands::stop_signal`)
/// is cancelled; never without one. What ends a start's waits on its
/// backends early: a generation stopped before it was ever ready serves
/// what queued meanwhile and exits, and the wait would come out of the
/// stop's time (systemd's `TimeoutStopSec` counts from the signal).
async fn stopped(stop: Option<&CancellationToken>) {
    match stop {
        Some(stop) => stop.cancelled().await,
        None => std::future::pending().await,
    }
}

/// What the admin server starts from beside the config.
struct AdminStart {
    number: u64,
    phase: watch::Receiver<Phase>,
    metrics: Option<PrometheusHandle>,
    /// What the older generation reported with its offer.
    report: crate::lifecycle::handoff::Report,
    /// A first start: nobody else answers on the admin socket meanwhile.
    at_once: bool,
}

/// The admin server: what it reads, and the tokens that start and stop
/// its accept loop (see [`Generation`]'s fields of the same names).
struct AdminParts {
    shared: Arc<AdminShared>,
    stop: CancellationToken,
    closed: CancellationToken,
    go: CancellationToken,
}

/// Binds (or adopts) the admin listener, first of all sockets, and spawns
/// its accept loop, which waits for `go`.
fn open_admin(
    config: &Config,
    start: AdminStart,
    inventory: &mut Inventory,
    holdings: &mut Holdings,
) -> Result<AdminParts, StartError> {
    let admin_port = match &config.admin.listen {
        AdminListen::Tcp(addr) => Some(addr.port()),
        AdminListen::Unix(_) => None,
    };
    let admin_err = |source| StartError::Admin {
        addr: config.admin.listen.to_string(),
        hint: super::remedy(&source, admin_port),
        source,
    };
    let admin_endpoint = match &config.admin.listen {
        AdminListen::Tcp(addr) => Endpoint::Tcp {
            addr: *addr,
            backlog: 128,
            reuseport: false,
        },
        AdminListen::Unix(path) => Endpoint::Unix(path),
    };
    let listening = endpoint::listen("admin", &admin_endpoint, inventory, holdings)
        .map_err(|e| start_error(e, admin_err))?;
    // At once: probes are answered from the first instant.
    listening.listen().map_err(admin_err)?;
    let admin_socket = listening.socket;
    let admin = Arc::new(AdminShared {
        config: config.admin.clone(),
        generation: GenerationInfo {
            number: start.number,
            pid: std::process::id(),
            started_at: SystemTime::now(),
        },
        phase: start.phase,
        topology: Default::default(),
        metrics: start.metrics,
        inherited: Default::default(),
        configured: configured(config),
        draining_shown: Default::default(),
        handed_over: Default::default(),
        rendering: Renderer::start().map_err(|err| {
            admin_err(std::io::Error::new(
                err.kind(),
                format!("cannot start the thread that renders /metrics: {err}"),
            ))
        })?,
        answering: Default::default(),
        stuck_workers: Arc::default(),
    });
    admin.set_inherited(start.report);
    let (admin_listener, admin_addr) =
        admin_listener(admin_socket, &config.admin.listen).map_err(admin_err)?;
    // A first start answers probes at once (503 `starting`) while DNS and
    // the first health round run; a new generation of a reload only once
    // told to go ahead: until then the old one, still serving, answers on
    // the shared socket.
    let parts = AdminParts {
        shared: Arc::clone(&admin),
        stop: CancellationToken::new(),
        closed: CancellationToken::new(),
        go: CancellationToken::new(),
    };
    if start.at_once {
        parts.go.cancel();
    }
    let (go, stop, closed) = (parts.go.clone(), parts.stop.clone(), parts.closed.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = go.cancelled() => admin::serve(admin_listener, admin, stop).await,
            () = stop.cancelled() => {}
        }
        closed.cancel();
    });
    tracing::info!(generation = start.number, admin = %admin_addr, "admin bound");
    Ok(parts)
}

/// The admin socket as its server takes it, and where it is (a TCP
/// socket's own port: the config's `:0` takes any).
fn admin_listener(
    socket: socket2::Socket,
    listen: &AdminListen,
) -> std::io::Result<(AdminListener, String)> {
    match listen {
        AdminListen::Tcp(_) => {
            let listener: std::net::TcpListener = socket.into();
            let at = listener.local_addr()?.to_string();
            let listener = tokio::net::TcpListener::from_std(listener)?;
            Ok((AdminListener::Tcp(listener), at))
        }
        AdminListen::Unix(_) => {
            let listener: std::os::unix::net::UnixListener = socket.into();
            let listener = tokio::net::UnixListener::from_std(listener)?;
            Ok((AdminListener::Unix(listener), listen.to_string()))
        }
    }
}

/// Listener `l`'s TLS termination, if it has any, sealing session
/// tickets with the generation's `ticketer` in the listener's own scope.
fn terminator(
    l: &crate::config::ListenerConfig,
    ticketer: &Arc<crate::tls::tickets::Ticketer>,
) -> Option<Arc<crate::tls::handshake::Terminator>> {
    let t = l.tls.as_ref()?;
    for (name, not_after) in t.expiries() {
        metrics::tls_certificate_expiry(&l.name, name, not_after);
    }
    let mut server = (*t.server_config).clone();
    let scope = crate::tls::tickets::Scope::new(&l.name, &t.client_policy);
    server.ticketer = Arc::new(crate::tls::tickets::ListenerTickets::new(
        Arc::clone(ticketer),
        scope,
    ));
    Some(Arc::new(crate::tls::handshake::Terminator::new(
        &l.name,
        Arc::new(server),
        t.handshake_timeout,
        l.protocol == crate::config::Protocol::Http,
    )))
}

/// An accept loop not started yet: its socket (plain, or once watched by
/// its worker's reactor: [`Door`]), its shard number (which picks its
/// worker), what it hands connections to, and what becomes of its socket
/// when this generation ends.
pub(super) type Pending<S = std::net::TcpListener> =
    (Listener<S>, usize, Arc<Connections>, Arc<FateCell>);

/// An accept loop ready to start: its socket watched by its worker.
pub(super) type Door = Pending<tokio::net::TcpListener>;

/// A listener's shards, and what `/status` shows of them.
struct Shards {
    pending: Vec<Pending>,
    /// One of them was adopted: the previous generation listens there too.
    any_adopted: bool,
    /// The address really bound (a port 0 in the config made concrete).
    bound: std::net::SocketAddr,
    /// Their sockets' accept queues, as the admin reads them.
    queues: Vec<Arc<crate::metrics::kernel::AcceptQueue>>,
}

/// Delayed ACKs for plain HTTP only, where the client's request comes
/// whole and first (`Acks::WithAnswer`). Not behind TLS, whose first
/// flight a client may send in two segments (a post-quantum key share
/// passes one MSS) and hold the second for the ACK; not behind a PROXY
/// header, which a balancer may send apart from the request; not in TCP
/// mode, whose protocols baton does not know.
fn acks_for(l: &crate::config::ListenerConfig) -> Acks {
    let plain_http = l.protocol == crate::config::Protocol::Http
        && l.tls.is_none()
        && l.proxy_protocol.is_none();
    if plain_http {
        Acks::WithAnswer
    } else {
        Acks::Prompt
    }
}

/// Shard `shard`'s name. Shard 0 is the listener's own name, so a socket
/// unit's `FileDescriptorName=web` matches listener "web".
fn shard_name(listener: &str, shard: usize) -> String {
    if shard == 0 {
        listener.to_string()
    } else {
        format!("{listener}#{shard}")
    }
}

/// The shard number `name` stands for in `listener`, if it is one of its,
/// written as [`shard_name`] writes it (`web#01` is not `web#1`).
fn shard_number(listener: &str, name: &str) -> Option<usize> {
    let shard = match name.strip_prefix(listener)? {
        "" => 0,
        rest => rest.strip_prefix('#')?.parse().ok()?,
    };
    (shard_name(listener, shard) == name).then_some(shard)
}

/// A listener the config renamed, at the same address, keeps its sockets:
/// those held under an old name no listener has now, at the address of a
/// listener that holds none under its own name, take that listener's name
/// (shard by shard). Bound afresh instead, the new sockets would join the
/// old ones' `SO_REUSEPORT` group while those closed, resetting what the
/// kernel had queued on them. Not for port 0, where the address says
/// nothing of which listener it was. The old names leave systemd's fd
/// store (see [`Inventory::renamed`]): it keeps one entry a socket, and
/// drops a second name for one it holds, so under the old name it would
/// hold the socket listening for good once the listener goes.
fn adopt_renamed_listeners(config: &Config, inventory: &mut Inventory) {
    let named: std::collections::HashSet<&str> =
        config.listeners.iter().map(|l| l.name.as_str()).collect();
    for l in config.listeners.iter().filter(|l| l.bind.port() != 0) {
        let endpoint = Endpoint::Tcp {
            addr: l.bind,
            backlog: l.backlog,
            reuseport: true,
        };
        let held = inventory.held_at(&endpoint);
        if held
            .iter()
            .any(|name| shard_number(&l.name, name).is_some())
        {
            continue;
        }
        for old in held {
            let owner = old.split_once('#').map_or(old.as_str(), |(owner, _)| owner);
            // The admin and control sockets are never a listener's.
            let mine = named.contains(owner) || ["admin", "control"].contains(&owner);
            let Some(shard) = shard_number(owner, &old).filter(|_| !mine) else {
                continue;
            };
            let new = shard_name(&l.name, shard);
            if inventory.rename(&old, &new) {
                tracing::info!(from = %old, to = %new, "listener renamed at the same address: its socket is adopted under the new name");
            }
        }
    }
}

/// How many shards listener `l` has: one per worker, at least `reuseport`,
/// and every shard the previous generation had at that address. A reload
/// never drops one: the kernel gives each socket of a `SO_REUSEPORT` group
/// its share of new connections until its last copy closes (systemd's fd
/// store let go of its copy a moment after the old generation closed its
/// own), and what reached a closing shard was reset unless
/// `net.ipv4.tcp_migrate_req` is set (measured under systemd: a few
/// connections at every reload from 4 workers to 2 under load). A worker
/// then serves several shards (`Workers::for_shard`). Only a start with
/// no sockets handed over (not a restart that inherits systemd's fd
/// store) sets the count afresh.
fn shard_count(
    l: &crate::config::ListenerConfig,
    workers: usize,
    inventory: &Inventory,
    endpoint: &Endpoint<'_>,
) -> usize {
    let inherited = inventory
        .held_at(endpoint)
        .iter()
        .filter_map(|name| shard_number(&l.name, name))
        .map(|shard| shard + 1)
        .max()
        .unwrap_or(0);
    l.reuseport.max(workers).max(inherited)
}

/// Every shard of listener `l`: one per worker, at least `reuseport`, and
/// every one inherited (see [`shard_count`]).
/// A first start listens on the sockets it binds at once (connections
/// wait in their queues while it starts); a reload's new generation only
/// as it opens its doors (see `Listening::listen`).
fn shards(
    l: &crate::config::ListenerConfig,
    workers: usize,
    first: bool,
    connections: &Arc<Connections>,
    inventory: &mut Inventory,
    holdings: &mut Holdings,
) -> Result<Shards, StartError> {
    let shared = crate::listener::Shared::new(l.max_connections);
    let acks = acks_for(l);
    let endpoint_at = |addr| Endpoint::Tcp {
        addr,
        backlog: l.backlog,
        reuseport: true,
    };
    let mut endpoint = endpoint_at(l.bind);
    let bind_err = |source| StartError::Bind {
        name: l.name.clone(),
        addr: l.bind.to_string(),
        hint: super::remedy(&source, Some(l.bind.port())),
        source,
    };
    let mut shards = Shards {
        pending: Vec::new(),
        any_adopted: false,
        bound: l.bind,
        queues: Vec::new(),
    };
    for shard in 0..shard_count(l, workers, inventory, &endpoint) {
        let name = shard_name(&l.name, shard);
        let listening = match endpoint::listen(&name, &endpoint, inventory, holdings) {
            Ok(listening) => listening,
            // A shard only there to give every worker one may not be
            // possible (a socket systemd bound as another user cannot be
            // shared): fewer workers take this listener.
            Err(ListenError::Bind(err)) if shard > 0 && shard >= l.reuseport => {
                tracing::warn!(listener = %l.name, shards = shard, cause = %err, "cannot add a shard for every worker; fewer workers accept on this listener");
                break;
            }
            Err(e) => return Err(start_error(e, bind_err)),
        };
        if first {
            listening.listen().map_err(bind_err)?;
        }
        shards.any_adopted |= listening.adopted;
        let socket: std::net::TcpListener = listening.socket.into();
        shards.bound = socket.local_addr().map_err(bind_err)?;
        // Port 0: the kernel picks shard 0's port, and every other shard
        // joins it (each picked one of its own: one listener on as many
        // ports as workers, and `/status` showed the last).
        if shard == 0 && l.bind.port() == 0 {
            endpoint = endpoint_at(shards.bound);
        }
        let queue = Arc::new(crate::metrics::kernel::AcceptQueue::default());
        shards.queues.push(Arc::clone(&queue));
        let listener = Listener {
            socket,
            settings: crate::listener::Settings {
                name: Arc::from(l.name.as_str()),
                backlog: l.backlog,
                acks,
                defer_accept: l.defer_accept,
                shared: Arc::clone(&shared),
                nodelay_each: listening.nodelay_each,
                queue,
            },
        };
        shards
            .pending
            .push((listener, shard, Arc::clone(connections), listening.fate));
    }
    Ok(shards)
}

/// Listener `l`'s access log, its destination opened (shared with every
/// other listener that logs there).
fn access_log(
    l: &crate::config::ListenerConfig,
    sinks: &crate::access_log::sink::Sinks,
    generation: u64,
) -> Result<Option<crate::access_log::AccessLog>, StartError> {
    let Some(settings) = &l.access_log else {
        return Ok(None);
    };
    let sink = sinks
        .open(&settings.destination)
        .map_err(|source| StartError::AccessLog {
            listener: l.name.clone(),
            destination: settings.destination.to_string(),
            source,
        })?;
    Ok(Some(crate::access_log::AccessLog::new(
        sink,
        settings.format,
        &l.name,
        generation,
    )))
}

/// Applies backend states an older generation carried over, matched by
/// pool, name and address (a backend whose address changed starts afresh).
/// A name resolved from DNS carries the operator's word on the name itself
/// with its query as the address (members that join later take it).
/// Returns the operator's drains that nothing here took (a backend
/// retired, renamed, moved, or at a new address), for [`say_untaken`].
pub(super) fn carry_over<'a>(
    pools: &[Arc<Pool>],
    carried: &'a [BackendCarry],
) -> Vec<&'a BackendCarry> {
    carry_names(pools, carried);
    let mut untaken = Vec::new();
    for c in carried {
        let admin = carried_admin(c.admin);
        let mut taken = false;
        for p in pools.iter().filter(|p| p.name == c.pool) {
            let members = p.backends();
            let backend = members
                .backends
                .iter()
                .find(|b| b.name == c.name && b.address.to_string() == c.address);
            let named = p.named.iter().find(|n| n.name == c.name);
            match (backend, c.address.parse()) {
                (Some(backend), _) => {
                    // Another check's verdict says nothing of this one's.
                    let (healthy, streak) = match same_check(&c.checked_by, &p.checked_by) {
                        true => (c.healthy, c.streak),
                        false => (None, 0),
                    };
                    backend.adopt(admin, healthy, streak);
                    taken = true;
                }
                // A DNS member whose address is not in the answer now:
                // its state waits for the address.
                (None, Ok(address)) => {
                    if let Some(named) = named {
                        named.remember(address, admin);
                        taken = true;
                    }
                }
                // A name's own word, taken by `carry_names` when its query
                // is the same.
                (None, Err(_)) => {
                    taken |= named.is_some_and(|n| n.query.to_string() == c.address);
                }
            }
        }
        if !taken && admin != AdminState::Enabled {
            untaken.push(c);
        }
    }
    untaken
}

/// Whether a verdict checked by `carried` counts for checks that ask
/// `ours` (see `probe::asked`): not when both say what they asked, in the
/// same words' format, and it differs. A format of another release (its
/// first word) cannot be compared, and is taken as the same check.
fn same_check(carried: &Option<String>, ours: &Option<String>) -> bool {
    let format = |words: &str| words.split(' ').next().map(str::to_owned);
    match (carried, ours) {
        (Some(carried), Some(ours)) => carried == ours || format(carried) != format(ours),
        _ => true,
    }
}

/// Says what became of drains no backend of this config took (`untaken`,
/// of all that were `carried`): one whose address (or DNS query) a new
/// name holds was renamed or moved, or swapped addresses with another (a
/// drain meant for it is lost: warned of); a backend now at another
/// address keeps the name (its new machine starts enabled); any other
/// left the config. A name the older generation had already at that
/// address, in whatever pool, is no new name (an address two backends
/// share, a pool renamed around one that was serving).
pub(super) fn say_untaken(
    pools: &[Arc<Pool>],
    carried: &[BackendCarry],
    untaken: &[&BackendCarry],
) {
    let was_there = |name: &str, address: &str| {
        carried.iter().any(|c| {
            c.name == name && c.address == address && !untaken.iter().any(|u| std::ptr::eq(*u, c))
        })
    };
    // Every name of this config and where it is (an address, or a DNS
    // name's query), that the older generation did not have there.
    // (A DNS member is carried under its name, and said by its label.)
    let mut new_names: Vec<(String, String, String)> = Vec::new();
    for p in pools {
        for b in p.backends().backends.iter() {
            let at = b.address.to_string();
            if !was_there(&b.name, &at) {
                new_names.push((p.name.clone(), b.label.clone(), at));
            }
        }
        for n in &p.named {
            let query = n.query.to_string();
            if !was_there(&n.name, &query) {
                new_names.push((p.name.clone(), n.name.clone(), query));
            }
        }
    }
    for lost in untaken {
        let renamed = new_names.iter().find(|(_, _, at)| *at == lost.address);
        let readdressed = pools.iter().any(|p| {
            p.name == lost.pool
                && (p.named.iter().any(|n| n.name == lost.name)
                    || p.backends().backends.iter().any(|b| b.name == lost.name))
        });
        let (pool, backend, address) = (&lost.pool, &lost.name, &lost.address);
        match (renamed, readdressed) {
            (Some((now_pool, now_backend, _)), _) => {
                tracing::warn!(pool = %pool, backend = %backend, address = %address, now_pool = %now_pool, now_backend = %now_backend, "a backend the operator drained is now named otherwise (renamed, moved, or its address swapped?): its drain is not carried; drain it again by its new name if it is still meant to be")
            }
            (None, true) => {
                tracing::info!(pool = %pool, backend = %backend, address = %address, "a backend the operator drained now has another address or query: the new one starts enabled")
            }
            (None, false) => {
                tracing::info!(pool = %pool, backend = %backend, address = %address, "a backend the operator drained left the config; its drain ends with it")
            }
        }
    }
}

/// The operator's word on each DNS name, carried over: members that join
/// later start so.
fn carry_names(pools: &[Arc<Pool>], carried: &[BackendCarry]) {
    for c in carried {
        let admin = carried_admin(c.admin);
        for p in pools.iter().filter(|p| p.name == c.pool) {
            let named = p.named.iter().find(|n| n.name == c.name);
            if let Some(named) = named.filter(|n| n.query.to_string() == c.address) {
                named.set_admin(admin);
            }
        }
    }
}

/// A state of a later release this one does not know (a rollback) is
/// taken as draining: the operator took the backend out of full service
/// somehow, and putting it back into rotation unasked would undo that
/// (its health and streak are carried all the same).
fn carried_admin(admin: CarriedAdmin) -> AdminState {
    match admin {
        CarriedAdmin::Enabled => AdminState::Enabled,
        CarriedAdmin::Draining | CarriedAdmin::Unknown => AdminState::Draining,
        CarriedAdmin::Out => AdminState::Out,
    }
}

fn carried(admin: AdminState) -> CarriedAdmin {
    match admin {
        AdminState::Enabled => CarriedAdmin::Enabled,
        AdminState::Draining => CarriedAdmin::Draining,
        AdminState::Out => CarriedAdmin::Out,
    }
}

/// What this generation carries to the next about its backends and the
/// names resolved from DNS: every name, enabled ones too, as the go-ahead
/// must undo a drain the offer carried when the operator restored the
/// name while the next generation started.
pub(super) fn carry_out(pools: &[Arc<Pool>]) -> Vec<BackendCarry> {
    let names = pools.iter().flat_map(|p| {
        p.named.iter().map(|n| BackendCarry {
            pool: p.name.clone(),
            name: n.name.clone(),
            address: n.query.to_string(),
            admin: carried(n.admin()),
            healthy: None,
            streak: 0,
            checked_by: None,
        })
    });
    let backends = pools.iter().flat_map(|p| {
        p.backends()
            .backends
            .iter()
            .map(|b| BackendCarry {
                pool: b.pool.clone(),
                name: b.name.clone(),
                address: b.address.to_string(),
                admin: carried(b.admin()),
                // An unchecked backend's "healthy" was never a check's: a
                // reload that adds checks lets its first round decide.
                healthy: (b.is_checked() && b.has_verdict()).then(|| b.is_healthy()),
                streak: b.health_streak(),
                checked_by: p.checked_by.clone(),
            })
            .collect::<Vec<_>>()
    });
    backends.chain(names).chain(remembered(pools)).collect()
}

/// What the operator said of DNS members whose address is gone (see
/// `Named::remember`), carried as members are: by name and address.
fn remembered(pools: &[Arc<Pool>]) -> impl Iterator<Item = BackendCarry> + '_ {
    pools.iter().flat_map(|p| {
        p.named.iter().flat_map(|n| {
            n.remembered()
                .into_iter()
                .map(|(address, admin)| BackendCarry {
                    pool: p.name.clone(),
                    name: n.name.clone(),
                    address: address.to_string(),
                    admin: carried(admin),
                    healthy: None,
                    streak: 0,
                    checked_by: None,
                })
        })
    })
}

/// The names `config` gives listeners, pools and backends, which inherited
/// metric series must carry to be kept.
fn configured(config: &Config) -> crate::metrics::exposition::Configured {
    crate::metrics::exposition::Configured {
        listeners: config.listeners.iter().map(|l| l.name.clone()).collect(),
        pools: config
            .pools
            .iter()
            .map(|p| {
                let ip = p.backends.iter().map(|b| b.name.clone());
                let backends = ip.chain(p.named.iter().map(|n| n.name.clone())).collect();
                (p.name.clone(), backends)
            })
            .collect(),
    }
}

fn take_control(
    config: &Config,
    inventory: &mut Inventory,
    holdings: &mut Holdings,
) -> Result<tokio::net::UnixListener, StartError> {
    let path = &config.control.socket;
    let err = |source| StartError::Control {
        path: path.display().to_string(),
        hint: super::remedy(&source, None),
        source,
    };
    let listening = endpoint::listen("control", &Endpoint::Unix(path), inventory, holdings)
        .map_err(|e| start_error(e, err))?;
    tokio::net::UnixListener::from_std(listening.socket.into()).map_err(err)
}

/// A socket that could not be had, in the words of `context` (the socket
/// it is); an inherited one that failed its check says so itself.
fn start_error(err: ListenError, context: impl FnOnce(std::io::Error) -> StartError) -> StartError {
    match err {
        ListenError::Adopt(e) => StartError::Adopt(e),
        ListenError::Bind(e) | ListenError::Hold(e) => context(e),
    }
}

#[cfg(test)]
mod tests {
    use super::{same_check, shard_name, shard_number};

    /// A carried verdict counts unless both generations said what their
    /// checks asked, in one format, and it differs.
    #[test]
    fn a_verdict_carries_unless_its_check_asked_otherwise() {
        let words = |w: &str| Some(w.to_string());
        let health = words("1 http GET /health host -");
        assert!(same_check(&health, &health));
        assert!(!same_check(&health, &words("1 http GET /ready host -")));
        assert!(!same_check(&words("1 tcp"), &health));
        assert!(
            same_check(&words("2 http GET /ready"), &health),
            "another release's format is not compared"
        );
        assert!(same_check(&None, &health), "a release that said nothing");
    }

    #[test]
    fn a_later_releases_backend_state_is_taken_as_draining() {
        use crate::backend::AdminState;
        use crate::lifecycle::handoff::CarriedAdmin;
        assert_eq!(
            super::carried_admin(CarriedAdmin::Unknown),
            AdminState::Draining
        );
        assert_eq!(super::carried_admin(CarriedAdmin::Out), AdminState::Out);
    }

    #[test]
    fn a_shard_name_reads_back_as_its_number_and_no_other_listener_s_does() {
        for shard in [0, 1, 7, 12] {
            assert_eq!(shard_number("web", &shard_name("web", shard)), Some(shard));
        }
        for other in [
            "webx", "web2#1", "we", "web#", "web#x", "web#-1", "web#+1", "web#01", "web#0",
            "admin", "raw#1",
        ] {
            assert_eq!(shard_number("web", other), None, "{other}");
        }
    }
}
