//! `baton check`: the config validated, and what it means printed: every
//! listener and pool, TLS certificates, what `TimeoutStopSec` must be, and
//! whether the installed unit's timeouts are enough (`super::unit`).

use std::time::Duration;

use crate::cli::CheckArgs;
use crate::config::duration::display;
use crate::config::{
    Balance, DnsQuery, Forwarded, HealthKind, ListenerConfig, PoolConfig, Protocol,
};
use crate::exit::Exit;
use crate::tls::{ClientAuth, TlsSettings};

pub fn check(mut args: CheckArgs) -> Exit {
    // Read once: the budgets it runs with, then what it holds baton to.
    let unit = super::unit::read_unit_files(args.unit.as_deref());
    with_the_units_budgets(&mut args, &unit);
    let Ok(c) = super::load_config(&args.config.config, &super::run::overrides(args.budgets))
    else {
        return Exit::Config;
    };
    for warning in &c.warnings {
        eprintln!("baton: warning: {warning}");
    }
    // Before the verdict: it said "is valid", then exited 78.
    if super::unit::warn_about_the_unit(&unit, &c) {
        eprintln!("baton: the service would refuse this config (exit 78): its user cannot read what it names");
        return Exit::Config;
    }
    say!("config {} is valid", c.source.display());
    say!("workers                 {}", c.workers);
    say!("pin_workers             {}", c.pin_workers);
    say!("busy_poll               {}", display(c.busy_poll));
    say!("admin.listen            {}", c.admin.listen);
    say!("control.socket          {}", c.control.socket.display());
    say!(
        "shutdown.pre_stop_delay {}",
        display(c.shutdown.pre_stop_delay)
    );
    say!(
        "shutdown.drain_timeout  {}",
        display(c.shutdown.drain_timeout)
    );
    say!(
        "reload.ready_timeout    {}",
        display(c.reload.ready_timeout)
    );
    say!(
        "reload.drain_timeout    {}",
        display(c.reload.drain_timeout)
    );
    say!("reload.max_draining     {}", c.reload.max_draining);
    say!("reload.close_spread     {}", display(c.reload.close_spread));
    say!(
        "admin.liveness_paths    {}",
        c.admin.liveness_paths.join(", ")
    );
    say!(
        "admin.readiness_paths   {}",
        c.admin.readiness_paths.join(", ")
    );
    say!(
        "admin.token_file        {}",
        if c.admin.token.is_some() {
            "set"
        } else {
            "none"
        }
    );
    say!("tls.ticket_rotation     {}", display(c.ticket_rotation));
    for l in &c.listeners {
        let pool = &c.pools[l.pool].name;
        say!(
            "listener {} {} {} -> pool {} (reuseport {}, backlog {}, max_connections {}, defer_accept {})",
            l.name,
            l.protocol.as_str(),
            l.bind,
            pool,
            l.reuseport.max(c.workers),
            l.backlog,
            l.max_connections,
            l.defer_accept
        );
        print_listener_settings(l, &c.pools);
        if let Some(tls) = &l.tls {
            print_tls(&l.name, tls);
        }
        if let Some(log) = &l.access_log {
            say!(
                "listener {} access_log {} ({})",
                l.name,
                log.destination,
                log.format.as_str()
            );
        }
        if let Some(pp) = &l.proxy_protocol {
            let trusted: Vec<String> = pp.trusted.iter().map(ToString::to_string).collect();
            say!(
                "listener {} proxy_protocol accept {}, trusted [{}], {}, timeout {}",
                l.name,
                pp.accept.as_str(),
                trusted.join(", "),
                if pp.required { "required" } else { "optional" },
                display(pp.timeout),
            );
        }
    }
    for p in &c.pools {
        let sends = p
            .send_proxy
            .map_or(String::new(), |v| format!(", send_proxy {}", v.as_str()));
        say!("pool {}: {} backend(s){sends}", p.name, p.backends.len());
        for b in &p.backends {
            say!(
                "pool {} backend {} {}, weight {}",
                p.name,
                b.name,
                b.address,
                b.weight
            );
        }
        print_pool_settings(p);
        for n in &p.named {
            let (kind, weight) = match n.query {
                DnsQuery::Host { .. } => ("A/AAAA", format!(", weight {}", n.weight)),
                DnsQuery::Srv(_) => ("SRV", String::new()),
            };
            say!(
                "pool {} backend {} from DNS {kind} {}{weight}, resolved every {} or the TTL",
                p.name,
                n.name,
                n.query,
                display(p.resolve_interval)
            );
        }
    }
    if c.pools.iter().any(|p| !p.named.is_empty()) {
        let servers: Vec<String> = c
            .resolver
            .nameservers
            .iter()
            .map(ToString::to_string)
            .collect();
        say!(
            "resolver nameservers {}, timeout {}",
            if servers.is_empty() {
                "from /etc/resolv.conf".to_string()
            } else {
                servers.join(", ")
            },
            display(c.resolver.timeout)
        );
    }
    say!("TimeoutStopSec={}", seconds_up(c.timeout_stop()));
    Exit::Clean
}

/// The stop budgets the unit runs the service with, where `check` was
/// given none of its own; said either way when they differ from what it
/// checks with. Checked with the shell's, a drop-in's budget went unseen.
fn with_the_units_budgets(args: &mut CheckArgs, files: &[(std::path::PathBuf, String)]) {
    for (given, flag, variable) in [
        (
            &mut args.budgets.drain_timeout,
            "--drain-timeout",
            "BATON_DRAIN_TIMEOUT",
        ),
        (
            &mut args.budgets.pre_stop_delay,
            "--pre-stop-delay",
            "BATON_PRE_STOP_DELAY",
        ),
    ] {
        let units = super::unit::units_budget(files, flag, variable);
        match (given.as_deref(), units) {
            (None, Some(value)) => {
                eprintln!("baton: checked with {value} as {flag} (or {variable}), as the unit runs the service");
                *given = Some(value);
            }
            (Some(own), Some(value)) if own != value => {
                eprintln!("baton: note: checked with {flag} (or {variable}) {own}, given here; the unit runs the service with {value}");
            }
            _ => {}
        }
    }
    if super::unit::reads_environment_files(files) {
        eprintln!("baton: note: the unit reads an EnvironmentFile=, which check does not: a BATON_DRAIN_TIMEOUT or BATON_PRE_STOP_DELAY set there is not checked (give it as --drain-timeout or --pre-stop-delay)");
    }
}

/// A TLS listener's settings, then one line per certificate, in the order
/// SNI falls back through (the first is the default).
fn print_tls(listener: &str, tls: &TlsSettings) {
    say!(
        "listener {listener} tls alpn [{}], min_version {}, handshake_timeout {}, client_auth {}",
        tls.alpn.join(", "),
        tls.min_version.as_str(),
        display(tls.handshake_timeout),
        tls.client_auth.map_or("off", ClientAuth::as_str),
    );
    let now = crate::tls::unix_seconds(std::time::SystemTime::now());
    for cert in &tls.certificates {
        let expires = if now > cert.not_after_unix {
            "expired"
        } else {
            "expires"
        };
        say!(
            "listener {listener} tls certificate {} (names {}; {expires} {})",
            cert.name,
            cert.names.join(", "),
            crate::tls::format_time(cert.not_after_unix),
        );
    }
}

/// A listener's timeouts, and for HTTP its forwarding, h2 and routes.
fn print_listener_settings(l: &ListenerConfig, pools: &[PoolConfig]) {
    if l.protocol != Protocol::Http {
        // idle: once the backend has closed its half (HAProxy's client-fin).
        say!(
            "listener {} timeouts: connect {}, tunnel {}, idle {}",
            l.name,
            display(l.connect_timeout),
            display(l.tunnel_timeout),
            display(l.idle_timeout),
        );
        return;
    }
    say!(
        "listener {} timeouts: header {}, idle {}, keepalive_drain_grace {}, connect {}, response {}, tunnel {}",
        l.name,
        display(l.header_timeout),
        display(l.idle_timeout),
        display(l.keepalive_drain_grace),
        display(l.connect_timeout),
        display(l.response_timeout),
        display(l.tunnel_timeout),
    );
    let forwarded = match l.forwarded {
        Forwarded::Replace => "replace",
        Forwarded::Append => "append",
        Forwarded::Off => "off",
    };
    let body_min_rate = match l.body_min_rate {
        0 => "none".to_string(),
        rate => format!("{rate} B/s"),
    };
    say!(
        "listener {} forwarded {forwarded}, h2_max_concurrent_streams {}, body_min_rate {body_min_rate}",
        l.name, l.h2_max_concurrent_streams
    );
    for r in &l.routes {
        let host = r.host.as_deref().map(|h| format!("host {h} "));
        let prefix = r
            .path_prefix
            .as_deref()
            .map(|p| format!("path_prefix {p} "));
        say!(
            "listener {} route {}{}-> pool {}",
            l.name,
            host.unwrap_or_default(),
            prefix.unwrap_or_default(),
            pools[r.pool].name
        );
    }
}

/// A pool's balancing, its cap and line, and its health checks.
fn print_pool_settings(p: &PoolConfig) {
    let balance = match p.balance {
        Balance::RoundRobin => "round_robin",
        Balance::LeastConn => "least_conn",
        Balance::RandomTwo => "random_two",
    };
    let cap = match p.max_connections_per_backend {
        0 => "none".to_string(),
        n => format!("{n}, queue_timeout {}", display(p.queue_timeout)),
    };
    say!(
        "pool {} balance {balance}, max_connections_per_backend {cap}",
        p.name
    );
    match &p.tls {
        None => say!("pool {} tls none (plain TCP to the backends)", p.name),
        Some(tls) => say!(
            "pool {} tls, server_name {}, verify {}",
            p.name,
            tls.names(),
            tls.verify
        ),
    }
    match &p.health {
        None => say!("pool {} health none (backends taken as up)", p.name),
        Some(h) => {
            let kind = match h.kind {
                HealthKind::Http => match &h.host {
                    Some(host) => format!("http {} (Host: {host})", h.path),
                    None => format!("http {}", h.path),
                },
                HealthKind::Tcp => "tcp".to_string(),
            };
            say!(
                "pool {} health {kind}, every {}, timeout {}, rise {}, fall {}",
                p.name,
                display(h.interval),
                display(h.timeout),
                h.rise,
                h.fall
            );
        }
    }
}

/// `d` in whole seconds, rounded up: a `TimeoutStopSec` rounded down would
/// SIGKILL baton just before its drain deadline.
pub(super) fn seconds_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
