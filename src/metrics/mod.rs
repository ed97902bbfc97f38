//! Metric names, help texts and handles. Names follow Prometheus conventions
//! (base units, `_total`, `_seconds`); label values come only from the config.
//! Hot paths hold pre-built handles (no label formatting per request), and
//! building a handle at start creates the series at 0, as DESIGN.md asks.

pub mod exposition;
pub mod kernel;
pub mod process;

use metrics::{
    describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

pub const CONNECTIONS_ACCEPTED: &str = "baton_connections_accepted_total";
pub const CONNECTIONS_ACTIVE: &str = "baton_connections_active";
pub const REQUESTS: &str = "baton_requests_total";
pub const REQUEST_DURATION: &str = "baton_request_duration_seconds";
pub const UPSTREAM_ERRORS: &str = "baton_upstream_errors_total";
pub const BACKEND_IN_FLIGHT: &str = "baton_backend_in_flight";
pub const BACKEND_STATE: &str = "baton_backend_state";
pub const HEALTH_CHECKS: &str = "baton_health_checks_total";
pub const NO_BACKEND: &str = "baton_no_backend_total";
pub const CLIENT_ABORTS: &str = "baton_client_aborts_total";
pub const QUEUE_TIMEOUTS: &str = "baton_queue_timeouts_total";
pub const TCP_BYTES: &str = "baton_tcp_bytes_total";
pub const GENERATION: &str = "baton_generation";
pub const RELOADS: &str = "baton_reloads_total";
pub const LAST_RELOAD_SUCCESS: &str = "baton_last_reload_success_timestamp_seconds";
pub const LAST_RELOAD_SUCCESSFUL: &str = "baton_last_reload_successful";
pub const DRAINING_GENERATIONS: &str = "baton_draining_generations";
pub const HANDOFF_DURATION: &str = "baton_handoff_duration_seconds";
pub const DRAIN_DURATION: &str = "baton_drain_duration_seconds";
pub const DRAINED_CONNECTIONS: &str = "baton_drained_connections_total";
pub const DRAIN_FORCED: &str = "baton_drain_forced_connections_total";
pub const BUILD_INFO: &str = "baton_build_info";
pub const LONG_LIVED_DRAINED: &str = "baton_long_lived_drained_total";
pub const LISTENER_BACKLOG: &str = "baton_listener_backlog";
pub const AT_CAPACITY: &str = "baton_listener_at_capacity_total";
pub const KERNEL_LISTEN_OVERFLOWS: &str = "baton_kernel_listen_overflows_total";
pub const KERNEL_LISTEN_DROPS: &str = "baton_kernel_listen_drops_total";
pub const KERNEL_MIGRATE_REQ: &str = "baton_kernel_migrate_req_total";
pub const PROCESS_OPEN_FDS: &str = "baton_process_open_fds";
pub const PROCESS_RESIDENT: &str = "baton_process_resident_memory_bytes";
pub const PROCESS_CPU: &str = "baton_process_cpu_seconds";
pub const TLS_HANDSHAKES: &str = "baton_tls_handshakes_total";
pub const TLS_CERTIFICATE_EXPIRY: &str = "baton_tls_certificate_expiry_timestamp_seconds";
pub const PROXY_PROTOCOL_ERRORS: &str = "baton_proxy_protocol_errors_total";
pub const ACCESS_LOG_DROPPED: &str = "baton_access_log_dropped_total";
pub const DNS_RESOLUTIONS: &str = "baton_dns_resolutions_total";
pub const SHORTAGES: &str = "baton_shortages_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
const PHASE_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// How often histogram samples are folded into their buckets when nobody
/// scrapes: the recorder keeps every sample until then (8 bytes and more
/// each), and the allocator keeps their high-water mark as RSS. Every
/// 100 ms: at 130,000 requests/s a period's samples are about 100 KiB.
/// Every second they were over a MiB, more than the memory test allows
/// for 200,000 requests, once this machine served them in two seconds.
/// The work is the same whatever the period (each sample is folded once).
const UPKEEP_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// Installs the process-wide recorder; `/metrics` renders the handle. Must
/// run inside the runtime: it starts the recorder's upkeep, without which
/// a host nobody scrapes keeps 8 bytes per request for good.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(REQUEST_DURATION.into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(HANDOFF_DURATION.into()), PHASE_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(DRAIN_DURATION.into()), PHASE_BUCKETS)?
        .install_recorder()?;
    describe();
    for at in Shortage::ALL {
        metrics::counter!(SHORTAGES, "at" => at.as_str()).absolute(0);
    }
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_PERIOD);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

fn describe() {
    describe_counter!(
        CONNECTIONS_ACCEPTED,
        "Client connections accepted, by listener."
    );
    describe_gauge!(
        TLS_CERTIFICATE_EXPIRY,
        "When a listener's certificate expires (notAfter), in Unix seconds, by listener and name."
    );
    describe_counter!(
        TLS_HANDSHAKES,
        "TLS handshakes on a listener, by result: full, resumed (a session ticket), failed, aborted (closed before a byte)."
    );
    describe_gauge!(
        CONNECTIONS_ACTIVE,
        "Client connections open now, by listener and state."
    );
    describe_counter!(
        REQUESTS,
        "HTTP requests answered, by listener, pool and status class."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time from request head to response head."
    );
    describe_counter!(UPSTREAM_ERRORS, "Failures talking to a backend, by kind.");
    describe_counter!(
        DNS_RESOLUTIONS,
        "Resolutions of backends named by DNS, by pool and result: ok, empty, timeout, error."
    );
    describe_counter!(
        SHORTAGES,
        "Times baton ran short of fds, memory, socket buffers or epoll watches, by where: accept (a client's connection), connect (to a backend)."
    );
    describe_gauge!(
        BACKEND_IN_FLIGHT,
        "Requests or connections a backend holds now."
    );
    describe_counter!(TCP_BYTES, "Bytes copied by TCP listeners, by direction.");
    describe_gauge!(GENERATION, "The serving generation's number.");
    describe_counter!(
        RELOADS,
        "Reloads attempted by this process lineage, by result."
    );
    describe_gauge!(
        LAST_RELOAD_SUCCESS,
        Unit::Seconds,
        "Unix time of the last successful reload."
    );
    describe_gauge!(
        LAST_RELOAD_SUCCESSFUL,
        "1 if the last reload (or the start) succeeded, 0 while the config on disk is one a reload refused."
    );
    describe_gauge!(DRAINING_GENERATIONS, "Older generations still draining.");
    describe_histogram!(
        HANDOFF_DURATION,
        Unit::Seconds,
        "Reload request to new generation accepting."
    );
    describe_histogram!(
        DRAIN_DURATION,
        Unit::Seconds,
        "Length of drains, by reason."
    );
    describe_counter!(
        DRAINED_CONNECTIONS,
        "Connections that finished during a drain, by reason."
    );
    describe_counter!(
        DRAIN_FORCED,
        "Connections force-closed at a drain deadline, by reason."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; labels carry the running version and commit."
    );
    describe_more();
}

fn describe_more() {
    describe_counter!(
        AT_CAPACITY,
        "Times a listener reached max_connections and stopped accepting."
    );
    describe_gauge!(
        BACKEND_STATE,
        "1 for the backend's current state (up, down, draining, out), else 0."
    );
    describe_counter!(HEALTH_CHECKS, "Active health checks, by result.");
    describe_counter!(
        NO_BACKEND,
        "Requests or connections refused because no backend of the pool was up."
    );
    describe_counter!(
        QUEUE_TIMEOUTS,
        "Work refused after waiting queue_timeout for a backend under its cap, by pool."
    );
    describe_counter!(
        CLIENT_ABORTS,
        "Client connections cut on the client's account, by listener and reason."
    );
    describe_counter!(
        LONG_LIVED_DRAINED,
        "Long-lived streams (WebSocket, other upgrades, SSE) ended by a drain, by kind."
    );
    describe_gauge!(
        LISTENER_BACKLOG,
        "Connections waiting in the kernel accept queue of a listener's sockets."
    );
    describe_counter!(
        KERNEL_LISTEN_OVERFLOWS,
        "The network namespace's TcpExt ListenOverflows (accept queue full)."
    );
    describe_counter!(
        KERNEL_LISTEN_DROPS,
        "The network namespace's TcpExt ListenDrops."
    );
    describe_counter!(
        KERNEL_MIGRATE_REQ,
        "The network namespace's TCPMigrateReqSuccess/Failure, by result."
    );
    describe_gauge!(
        PROCESS_OPEN_FDS,
        "Open fds: the serving generation, and the draining ones summed."
    );
    describe_gauge!(
        PROCESS_RESIDENT,
        Unit::Bytes,
        "Resident memory: the serving generation, and the draining ones summed."
    );
    describe_counter!(
        ACCESS_LOG_DROPPED,
        "Access-log lines lost: the writer fell behind, or the destination refused them (a full disk)."
    );
    describe_counter!(
        PROXY_PROTOCOL_ERRORS,
        "Connections closed over their PROXY header (untrusted, malformed, missing, timeout, version, closed)."
    );
    describe_gauge!(PROCESS_CPU, Unit::Seconds, "CPU seconds used: the serving generation, and the draining ones summed (a gauge: an exit lowers the sum).");
}

/// Per-listener connection counters.
#[derive(Clone)]
pub struct ListenerMetrics {
    pub accepted: Counter,
    pub active: Gauge,
}

pub fn listener(name: &str) -> ListenerMetrics {
    metrics::gauge!(CONNECTIONS_ACTIVE, "listener" => name.to_string(), "state" => "draining")
        .set(0.0);
    metrics::gauge!(LISTENER_BACKLOG, "listener" => name.to_string()).set(0.0);
    metrics::counter!(AT_CAPACITY, "listener" => name.to_string()).absolute(0);
    ListenerMetrics {
        accepted: metrics::counter!(CONNECTIONS_ACCEPTED, "listener" => name.to_string()),
        active: metrics::gauge!(CONNECTIONS_ACTIVE, "listener" => name.to_string(), "state" => "serving"),
    }
}

/// A TLS listener's handshakes by result.
#[derive(Clone)]
pub struct TlsMetrics {
    pub full: Counter,
    pub resumed: Counter,
    pub failed: Counter,
    /// Closed before the client sent a byte (a TCP check, a port scan).
    pub aborted: Counter,
}

impl TlsMetrics {
    pub fn completed(&self, resumed: bool) {
        if resumed {
            self.resumed.increment(1);
        } else {
            self.full.increment(1);
        }
    }
}

/// Publishes when a listener's certificate expires, for the alert rule.
pub fn tls_certificate_expiry(listener: &str, name: &str, not_after_unix: i64) {
    metrics::gauge!(TLS_CERTIFICATE_EXPIRY, "listener" => listener.to_string(), "name" => name.to_string())
        .set(not_after_unix as f64);
}

pub fn tls(listener: &str) -> TlsMetrics {
    let counter = |result: &'static str| {
        let c = metrics::counter!(TLS_HANDSHAKES, "listener" => listener.to_string(), "result" => result);
        c.absolute(0);
        c
    };
    TlsMetrics {
        full: counter("full"),
        resumed: counter("resumed"),
        failed: counter("failed"),
        aborted: counter("aborted"),
    }
}

/// Per (listener, pool) request counters, one per status class.
#[derive(Clone)]
pub struct RequestMetrics {
    by_class: [Counter; 5],
    pub duration: Histogram,
}

impl RequestMetrics {
    pub fn count(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.by_class[class].increment(1);
    }
}

pub fn requests(listener: &str, pool: &str) -> RequestMetrics {
    metrics::counter!(NO_BACKEND, "listener" => listener.to_string(), "pool" => pool.to_string())
        .absolute(0);
    let counter = |code: &'static str| metrics::counter!(REQUESTS, "listener" => listener.to_string(), "pool" => pool.to_string(), "code" => code);
    RequestMetrics {
        by_class: [
            counter("1xx"),
            counter("2xx"),
            counter("3xx"),
            counter("4xx"),
            counter("5xx"),
        ],
        duration: metrics::histogram!(REQUEST_DURATION, "listener" => listener.to_string(), "pool" => pool.to_string()),
    }
}

/// The results a resolution of a pool's named backends can have.
const DNS_RESULTS: [&str; 4] = ["ok", "empty", "timeout", "error"];

/// Creates a pool's resolution series at 0 (a pool with named backends).
pub fn dns_resolutions(pool: &str) {
    for result in DNS_RESULTS {
        metrics::counter!(DNS_RESOLUTIONS, "pool" => pool.to_string(), "result" => result)
            .absolute(0);
    }
}

pub fn dns_resolution(pool: &str, result: &'static str) {
    metrics::counter!(DNS_RESOLUTIONS, "pool" => pool.to_string(), "result" => result).increment(1);
}

/// Why a client connection was cut on the client's account.
#[derive(Debug, Clone, Copy)]
pub enum AbortReason {
    /// It stopped taking response bytes for `idle_timeout`.
    StalledReader,
    /// An h2 client reset most of the streams it opened before their
    /// responses (the "rapid reset" attack).
    ResetFlood,
}

impl AbortReason {
    const ALL: [AbortReason; 2] = [AbortReason::StalledReader, AbortReason::ResetFlood];

    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::StalledReader => "stalled_reader",
            AbortReason::ResetFlood => "reset_flood",
        }
    }
}

/// Creates a pool's queue-timeout series at 0.
pub fn queue_timeouts(pool: &str) {
    metrics::counter!(QUEUE_TIMEOUTS, "pool" => pool.to_string()).absolute(0);
}

/// Where baton ran short (of fds, memory, socket buffers: see
/// `crate::shortage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortage {
    /// Accepting a client's connection.
    Accept,
    /// Connecting to a backend, for a request or a health check.
    Connect,
}

impl Shortage {
    pub const ALL: [Shortage; 2] = [Shortage::Accept, Shortage::Connect];

    pub fn as_str(self) -> &'static str {
        match self {
            Shortage::Accept => "accept",
            Shortage::Connect => "connect",
        }
    }
}

/// Baton ran short at `at`: the log says so within a budget, this counts
/// every time.
pub fn shortage(at: Shortage) {
    metrics::counter!(SHORTAGES, "at" => at.as_str()).increment(1);
}

pub fn queue_timeout(pool: &str) {
    metrics::counter!(QUEUE_TIMEOUTS, "pool" => pool.to_string()).increment(1);
}

/// Creates a listener's client-abort series at 0, one a reason.
pub fn client_aborts(listener: &str) {
    for reason in AbortReason::ALL {
        metrics::counter!(CLIENT_ABORTS, "listener" => listener.to_string(), "reason" => reason.as_str())
            .absolute(0);
    }
}

pub fn client_abort(listener: &str, reason: AbortReason) {
    metrics::counter!(CLIENT_ABORTS, "listener" => listener.to_string(), "reason" => reason.as_str())
        .increment(1);
}

pub fn no_backend(listener: &str, pool: &str) {
    metrics::counter!(NO_BACKEND, "listener" => listener.to_string(), "pool" => pool.to_string())
        .increment(1);
}

/// A listener's dropped access-log lines (published at 0 from the start).
pub fn access_log_dropped(listener: &str) -> Counter {
    let counter = metrics::counter!(ACCESS_LOG_DROPPED, "listener" => listener.to_string());
    counter.increment(0);
    counter
}

/// A PROXY-protocol listener's refusal series, one per `reasons`, at 0
/// from the start (an alert on their increase sees the first refusal).
pub fn proxy_protocol_listener(listener: &str, reasons: impl IntoIterator<Item = &'static str>) {
    for reason in reasons {
        metrics::counter!(PROXY_PROTOCOL_ERRORS, "listener" => listener.to_string(), "reason" => reason)
            .increment(0);
    }
}

/// A connection closed over its PROXY header, by `reason`.
pub fn proxy_protocol_error(listener: &str, reason: &'static str) {
    metrics::counter!(PROXY_PROTOCOL_ERRORS, "listener" => listener.to_string(), "reason" => reason)
        .increment(1);
}

/// Kinds of upstream failure, the `kind` label.
#[derive(Debug, Clone, Copy)]
pub enum UpstreamErrorKind {
    Connect,
    Timeout,
    Protocol,
}

pub fn upstream_error(pool: &str, backend: &str, kind: UpstreamErrorKind) {
    let kind = match kind {
        UpstreamErrorKind::Connect => "connect",
        UpstreamErrorKind::Timeout => "timeout",
        UpstreamErrorKind::Protocol => "protocol",
    };
    metrics::counter!(UPSTREAM_ERRORS, "pool" => pool.to_string(), "backend" => backend.to_string(), "kind" => kind)
        .increment(1);
}

/// A TCP listener's `baton_tcp_bytes_total`, each way.
pub struct TcpBytes {
    pub to_backend: Counter,
    pub to_client: Counter,
}

/// A TCP listener's series, there from its start; its byte counters.
pub fn tcp_listener(listener: &str, pool: &str) -> TcpBytes {
    metrics::counter!(NO_BACKEND, "listener" => listener.to_string(), "pool" => pool.to_string())
        .absolute(0);
    let bytes = |direction: &'static str| metrics::counter!(TCP_BYTES, "listener" => listener.to_string(), "direction" => direction);
    TcpBytes {
        to_backend: bytes("to_backend"),
        to_client: bytes("to_client"),
    }
}

/// Long-lived stream kinds, the `kind` label.
#[derive(Debug, Clone, Copy)]
pub enum LongLivedKind {
    WebSocket,
    Upgrade,
    Sse,
}

impl LongLivedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LongLivedKind::WebSocket => "websocket",
            LongLivedKind::Upgrade => "upgrade",
            LongLivedKind::Sse => "sse",
        }
    }
}

pub fn long_lived_drained(kind: LongLivedKind) {
    metrics::counter!(LONG_LIVED_DRAINED, "kind" => kind.as_str()).increment(1);
}

/// Why a drain runs, the `reason` label.
#[derive(Debug, Clone, Copy)]
pub enum DrainReason {
    Reload,
    Shutdown,
}

impl DrainReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainReason::Reload => "reload",
            DrainReason::Shutdown => "shutdown",
        }
    }
}

pub fn drain_finished(reason: DrainReason, seconds: f64, drained: usize, forced: usize) {
    let r = reason.as_str();
    metrics::histogram!(DRAIN_DURATION, "reason" => r).record(seconds);
    metrics::counter!(DRAINED_CONNECTIONS, "reason" => r).increment(drained as u64);
    metrics::counter!(DRAIN_FORCED, "reason" => r).increment(forced as u64);
}

/// Series that must exist from the start, before anything happens.
/// `first` marks a start that is not a reload's new generation: its
/// config was read as a reload's would be, so the last good load is now
/// (as Prometheus' own `prometheus_config_last_reload_success_timestamp_seconds`
/// counts its start), where a takeover sets it as it takes over
/// ([`took_over`]); without it an alert on the reload's age has no series
/// until the first reload.
pub fn start(generation: u64, first: bool) {
    metrics::gauge!(GENERATION).set(generation as f64);
    if first {
        took_over();
    }
    metrics::gauge!(DRAINING_GENERATIONS).set(0.0);
    metrics::counter!(RELOADS, "result" => "success").absolute(0);
    metrics::counter!(RELOADS, "result" => "failed").absolute(0);
    metrics::gauge!(BUILD_INFO, "version" => crate::VERSION, "commit" => crate::COMMIT).set(1.0);
    for kind in [
        LongLivedKind::WebSocket,
        LongLivedKind::Upgrade,
        LongLivedKind::Sse,
    ] {
        metrics::counter!(LONG_LIVED_DRAINED, "kind" => kind.as_str()).absolute(0);
    }
    for reason in [DrainReason::Reload, DrainReason::Shutdown] {
        metrics::counter!(DRAINED_CONNECTIONS, "reason" => reason.as_str()).absolute(0);
        metrics::counter!(DRAIN_FORCED, "reason" => reason.as_str()).absolute(0);
        // A histogram shows, with every bucket at 0, once it has a handle.
        let _ = metrics::histogram!(DRAIN_DURATION, "reason" => reason.as_str());
    }
    let _ = metrics::histogram!(HANDOFF_DURATION);
}

/// The older generation's side of a reload: the counters it reports on to
/// the new one.
pub fn reload_finished(ok: bool, seconds: f64) {
    if ok {
        metrics::counter!(RELOADS, "result" => "success").increment(1);
        metrics::histogram!(HANDOFF_DURATION).record(seconds);
    } else {
        metrics::counter!(RELOADS, "result" => "failed").increment(1);
        // Until a reload succeeds: the config on disk is not the one served.
        metrics::gauge!(LAST_RELOAD_SUCCESSFUL).set(0.0);
    }
}

/// The new generation's side of a reload that succeeded: it took over now.
/// Set here, since a gauge is not carried across generations (the older
/// generation's would never reach `/metrics`).
pub fn took_over() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    metrics::gauge!(LAST_RELOAD_SUCCESS).set(now);
    metrics::gauge!(LAST_RELOAD_SUCCESSFUL).set(1.0);
}

/// Numbers read when `/metrics` renders rather than counted as they happen.
pub struct Sampled<'a> {
    /// Accept-queue length by listener name.
    pub backlog: Vec<(&'a str, u64)>,
    /// Open connections of draining generations, by listener name.
    pub draining_active: std::collections::BTreeMap<String, u64>,
    pub draining_generations: usize,
    pub serving: process::ProcessStats,
    pub draining: process::ProcessStats,
    /// `None` when they could not be read: not recorded then.
    pub netstat: Option<kernel::Netstat>,
}

pub fn record_sampled(s: &Sampled<'_>) {
    for (listener, queue) in &s.backlog {
        metrics::gauge!(LISTENER_BACKLOG, "listener" => listener.to_string()).set(*queue as f64);
    }
    for (listener, n) in &s.draining_active {
        metrics::gauge!(CONNECTIONS_ACTIVE, "listener" => listener.clone(), "state" => "draining")
            .set(*n as f64);
    }
    metrics::gauge!(DRAINING_GENERATIONS).set(s.draining_generations as f64);
    for (state, p) in [("serving", &s.serving), ("draining", &s.draining)] {
        metrics::gauge!(PROCESS_OPEN_FDS, "state" => state).set(p.open_fds as f64);
        metrics::gauge!(PROCESS_RESIDENT, "state" => state).set(p.resident_bytes as f64);
        metrics::gauge!(PROCESS_CPU, "state" => state).set(p.cpu_seconds);
    }
    if let Some(n) = &s.netstat {
        metrics::counter!(KERNEL_LISTEN_OVERFLOWS).absolute(n.listen_overflows);
        metrics::counter!(KERNEL_LISTEN_DROPS).absolute(n.listen_drops);
        metrics::counter!(KERNEL_MIGRATE_REQ, "result" => "success").absolute(n.migrate_success);
        metrics::counter!(KERNEL_MIGRATE_REQ, "result" => "failure").absolute(n.migrate_failure);
    }
}
