//! Backends and pools: who can take work, and how much each holds now.
//! A backend's state combines two owners: the operator's admin state
//! (`enabled`, `draining`, `out`, set through the admin API) and the health
//! verdict (from probes and passive failures). Pickers see only backends
//! that are enabled and healthy. A [`Lease`] is one unit of in-flight work;
//! a draining backend turns `out` when its last lease ends.
//!
//! A pool's backends are a [`members::Members`] snapshot, swapped whole
//! when DNS changes who a named backend is (see [`named`]): a pick loads
//! it once, lock-free, and a lease keeps its backend alive past a swap.

pub mod balance;
pub mod health;
pub mod idle;
mod in_flight;
mod line;
pub mod members;
pub mod metrics;
pub mod named;
pub mod probe;
pub mod stream;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use self::metrics::BackendMetrics;
use crate::config::{Balance, HealthConfig, PoolConfig};
use crate::metrics::UpstreamErrorKind;
use health::{Flip, Health};
use in_flight::Place;
use line::Line;
use members::{Members, Recipe};
use named::Named;

/// What `/status` and `baton_backend_state` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    Up,
    Down,
    Draining,
    Out,
}

impl BackendState {
    pub const ALL: [BackendState; 4] = [
        BackendState::Up,
        BackendState::Down,
        BackendState::Draining,
        BackendState::Out,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BackendState::Up => "up",
            BackendState::Down => "down",
            BackendState::Draining => "draining",
            BackendState::Out => "out",
        }
    }
}

/// The operator's word on a backend, independent of its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminState {
    Enabled = 0,
    Draining = 1,
    Out = 2,
}

impl AdminState {
    fn from_u8(v: u8) -> AdminState {
        match v {
            1 => AdminState::Draining,
            2 => AdminState::Out,
            _ => AdminState::Enabled,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Enabled => "enabled",
            AdminState::Draining => "draining",
            AdminState::Out => "out",
        }
    }
}

/// The last active check or upstream failure, for `/status`.
#[derive(Debug, Clone)]
pub struct CheckRecord {
    pub at: SystemTime,
    pub ok: bool,
    pub detail: String,
}

/// A socket address is always a valid authority.
fn authority_of(address: SocketAddr) -> ::http::uri::Authority {
    ::http::uri::Authority::try_from(address.to_string().as_str())
        .unwrap_or_else(|_| ::http::uri::Authority::from_static("invalid"))
}

pub struct Backend {
    /// Itself, for the pool's line: a place it offers is handed on as the
    /// backend the waiter then holds.
    me: Weak<Backend>,
    /// Global index (the admin API's `{id}`): IP backends in config order,
    /// then members resolved from DNS as they come.
    pub index: usize,
    pub name: String,
    /// What its metrics carry as `backend`: the name, or `name@address`
    /// for a member resolved from DNS (its name is shared).
    pub label: String,
    /// For a member resolved from DNS, what it was resolved from
    /// (`app1.internal:8080`, or an SRV record's target).
    pub resolved_from: Option<String>,
    pub address: SocketAddr,
    /// `address` as a URI authority, built once rather than per request.
    pub authority: ::http::uri::Authority,
    /// Its share (an SRV record's weight may change it).
    weight: AtomicU32,
    pub pool: String,
    /// Active checks exist: only then may passive failures mark it down
    /// (nothing would ever bring it back up otherwise).
    checked: bool,
    in_flight: in_flight::InFlight,
    admin: AtomicU8,
    /// The health verdict, cached for pickers (the `Health` lock is for writers).
    healthy: AtomicBool,
    health: Mutex<Health>,
    /// Failures of real traffic since it last answered (see
    /// `observe_passive_failure`): apart from the checks' streak, so that
    /// traffic neither hides a failing check nor adds to one.
    traffic_failures: AtomicU32,
    last_check: Mutex<Option<CheckRecord>>,
    /// The last request or connection it failed; clients see none of it.
    last_error: Mutex<Option<CheckRecord>>,
    metrics: BackendMetrics,
    /// The pool's line, which a place goes to first when a lease ends
    /// (only a capped pool has one).
    line: Option<Arc<Line>>,
    /// HTTP/1 connections to it, idle between requests.
    pub idle: idle::IdleConnections,
    /// The pool's TLS to its backends (see `stream`), if any.
    tls: Option<Arc<crate::tls::upstream::UpstreamTls>>,
    /// The pool's `send_proxy`: its connections carry a client's PROXY
    /// header, so each serves that one client only.
    pub send_proxy: Option<crate::proxy_protocol::Version>,
    /// Since when DNS no longer gives its address; it is retired once it
    /// has been gone for the pool's hold and another member of its name
    /// can take its work (make before break: a move whose new address
    /// enters through `rise` loses nothing; an answer that rotates or is
    /// cut short does not churn the members).
    vanished: Mutex<Option<tokio::time::Instant>>,
    /// No new work; it leaves the pool once its in-flight work ends. Apart
    /// from the operator's admin state, which a returning address finds as
    /// it was.
    retired: AtomicBool,
    /// An older generation, still draining, may have work on it: a drain
    /// (carried over, or posted to us since) is not `out` before that
    /// generation is gone, whatever our own count says (see
    /// `Pool::settle_drains`).
    elder_may_use: AtomicBool,
    /// Cancelled when it leaves its pool: its health checks stop.
    gone: CancellationToken,
}

impl Backend {
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// A connection another worker keeps idle, moved to the calling one,
    /// for a capped plain backend only (see
    /// `IdleConnections::take_from_another`: the cap is what makes an idle
    /// connection on another worker cost a request its place; a TLS
    /// session cannot move, and its pool's lists are not looked through).
    pub fn idle_elsewhere(&self) -> Option<stream::BackendStream> {
        if self.line.is_none() || self.tls.is_some() {
            return None;
        }
        self.idle.take_from_another()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.total()
    }

    /// Sets its in-flight gauge from the count, as `/metrics` is rendered:
    /// a gauge moved at every request was one more cache line every worker
    /// wrote.
    pub fn publish_in_flight(&self) {
        self.metrics.in_flight.set(self.in_flight() as f64);
    }

    pub fn admin(&self) -> AdminState {
        AdminState::from_u8(self.admin.load(Ordering::SeqCst))
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    /// Whether its pool checks it (`health`).
    pub fn is_checked(&self) -> bool {
        self.checked
    }

    /// Whether the health verdict exists (a first check ran or carried over).
    pub fn has_verdict(&self) -> bool {
        self.health.lock().map(|h| h.has_verdict()).unwrap_or(true)
    }

    pub fn state(&self) -> BackendState {
        if self.retired.load(Ordering::SeqCst) {
            return if self.in_flight() > 0 {
                BackendState::Draining
            } else {
                BackendState::Out
            };
        }
        match self.admin() {
            AdminState::Draining => BackendState::Draining,
            AdminState::Out => BackendState::Out,
            AdminState::Enabled if self.is_healthy() => BackendState::Up,
            AdminState::Enabled => BackendState::Down,
        }
    }

    /// Pickers may send it work.
    pub fn available(&self) -> bool {
        self.admin() == AdminState::Enabled
            && self.is_healthy()
            && !self.retired.load(Ordering::Relaxed)
    }

    /// The checks in a row against its verdict, for the next generation.
    pub fn health_streak(&self) -> u32 {
        self.health.lock().map(|h| h.streak()).unwrap_or(0)
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.health
            .lock()
            .map(|h| h.consecutive_failures())
            .unwrap_or(0)
    }

    pub fn last_check(&self) -> Option<CheckRecord> {
        self.last_check.lock().ok().and_then(|c| c.clone())
    }

    /// An active check's result.
    pub fn observe_check(&self, ok: bool, detail: String) {
        self.metrics.check(ok);
        if let Ok(mut c) = self.last_check.lock() {
            *c = Some(CheckRecord {
                at: SystemTime::now(),
                ok,
                detail: detail.clone(),
            });
        }
        self.observe(ok, &detail);
    }

    pub fn last_error(&self) -> Option<CheckRecord> {
        self.last_error.lock().ok().and_then(|c| c.clone())
    }

    /// A request or connection to it failed: counted by `kind`, kept for
    /// `/status`, and a passive health failure when `blames_backend`.
    pub fn upstream_failed(&self, kind: UpstreamErrorKind, detail: &str, blames_backend: bool) {
        crate::metrics::upstream_error(&self.pool, &self.label, kind);
        if let Ok(mut e) = self.last_error.lock() {
            *e = Some(CheckRecord {
                at: SystemTime::now(),
                ok: false,
                detail: detail.to_string(),
            });
        }
        if blames_backend {
            self.observe_passive_failure(detail);
        }
    }

    /// A connect to it failed, or a response head was later than
    /// `response_timeout`: `fall` such failures with no answer between
    /// take it down, as HAProxy's `observe` counts them (its checks bring
    /// it back). Counted apart from the checks, and set back to zero by
    /// any answer ([`Backend::answered`]): a few slow requests among
    /// thousands answered are no verdict.
    fn observe_passive_failure(&self, detail: &str) {
        // Down already: what its in-flight work still fails says nothing
        // more, and would be left over for when the checks bring it back.
        if !self.checked || !self.is_healthy() {
            return;
        }
        let in_a_row = self.traffic_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let flip = match self.health.lock() {
            Ok(mut h) if in_a_row >= h.fall() => {
                self.traffic_failures.store(0, Ordering::Relaxed);
                let flip = h.fail_from_traffic();
                self.healthy.store(h.is_healthy(), Ordering::SeqCst);
                flip
            }
            _ => None,
        };
        self.told(flip, detail);
    }

    /// It answered a request (a response head came; in TCP mode, a
    /// connection was made): the failures of traffic count from zero.
    /// A load alone on the hot path, which is all an answer costs while
    /// nothing failed.
    pub fn answered(&self) {
        if self.traffic_failures.load(Ordering::Relaxed) != 0 {
            self.traffic_failures.store(0, Ordering::Relaxed);
        }
    }

    fn observe(&self, ok: bool, detail: &str) {
        let flip = match self.health.lock() {
            Ok(mut h) => {
                let flip = h.observe(ok);
                self.healthy.store(h.is_healthy(), Ordering::SeqCst);
                flip
            }
            Err(_) => None,
        };
        self.told(flip, detail);
    }

    /// Says a flip of its verdict, and publishes its state.
    fn told(&self, flip: Option<Flip>, detail: &str) {
        match flip {
            Some(Flip::Up) => {
                // Back through its checks: traffic's failures from before
                // do not count on.
                self.traffic_failures.store(0, Ordering::Relaxed);
                tracing::info!(pool = %self.pool, backend = %self.label, "backend is up");
                self.wake_queue();
            }
            Some(Flip::Down) => {
                tracing::warn!(pool = %self.pool, backend = %self.label, cause = detail, "backend is down")
            }
            None => {}
        }
        self.publish();
    }

    /// Operator drain: no new work; `out` once in-flight work ends.
    pub fn drain(&self) -> BackendState {
        if self.admin() == AdminState::Enabled {
            self.admin
                .store(AdminState::Draining as u8, Ordering::SeqCst);
            tracing::info!(pool = %self.pool, backend = %self.label, in_flight = self.in_flight(), "backend draining");
        }
        self.settle();
        self.publish();
        self.state()
    }

    /// Operator restore: back through the health thresholds, not straight in.
    pub fn restore(&self) -> BackendState {
        if self.admin() != AdminState::Enabled {
            if self.checked {
                if let Ok(mut h) = self.health.lock() {
                    h.require_rise();
                    self.healthy.store(false, Ordering::SeqCst);
                }
            }
            self.admin
                .store(AdminState::Enabled as u8, Ordering::SeqCst);
            tracing::info!(pool = %self.pool, backend = %self.label, "backend restored; it re-enters after passing checks");
            // Unchecked, it takes work at once.
            self.wake_queue();
        }
        self.publish();
        self.state()
    }

    /// Offers its free places to the work waiting in line (`lease`): it
    /// came up, was restored or joined. A place freed by a lease's end is
    /// handed on by `Lease::drop`.
    pub(crate) fn wake_queue(&self) {
        if let Some(line) = &self.line {
            if let Some(me) = self.me.upgrade() {
                line.offer(&me);
            }
        }
    }

    /// Takes one of its places if it has fewer than `cap` in use (0: no
    /// cap) and it is neither retired nor drained by the operator. A member
    /// retired meanwhile may be swept out as soon as its count reads 0, and
    /// a drain turns a backend `out` as soon as its count reads 0: the
    /// count is up first, then retirement and the operator's word are
    /// looked at again (all SeqCst), so either the sweep or the drain sees
    /// this place, or this place sees them and lets go (and settles the
    /// drain its count may have held up). Without the second look a pick
    /// that chose the backend just before a drain sent work to it after it
    /// said `out`, which an operator takes as "safe to redeploy".
    fn take_place(&self, cap: usize) -> Option<Place> {
        let place = self.in_flight.take(cap)?;
        if self.retired.load(Ordering::SeqCst) || self.admin() != AdminState::Enabled {
            self.give_back(place);
            self.settle();
            return None;
        }
        Some(place)
    }

    /// Gives one place back where it was taken (see `take_place`).
    fn give_back(&self, place: Place) {
        self.in_flight.give_back(place);
    }

    /// Draining with nothing in flight is out. The count (a sum over the
    /// workers' lines) is read only while draining, not at every lease's
    /// end; the drain sets `Draining` before it settles, and a giver gives
    /// back before it looks (all SeqCst), so one of them sees the other.
    fn settle(&self) {
        if self.retired.load(Ordering::SeqCst) {
            self.publish();
            return;
        }
        if self.admin() == AdminState::Draining
            && self.in_flight() == 0
            && !self.elder_may_use.load(Ordering::SeqCst)
            && self
                .admin
                .compare_exchange(
                    AdminState::Draining as u8,
                    AdminState::Out as u8,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
        {
            tracing::info!(pool = %self.pool, backend = %self.label, "backend drained; out of rotation");
            self.publish();
        }
    }

    fn publish(&self) {
        self.metrics.state(|| self.state());
    }

    /// Takes a carried-over admin state, verdict and streak from an older
    /// generation. Until that generation, which may still have work on the
    /// backend, is gone, a drain stays a drain (not `out`, though nothing
    /// of ours is in flight): one carried over, and one posted to us
    /// meanwhile (its tunnels and kept-alive connections go on using the
    /// backend). See `Pool::settle_drains`.
    pub fn adopt(&self, admin: AdminState, healthy: Option<bool>, streak: u32) {
        self.elder_may_use.store(true, Ordering::SeqCst);
        if let (true, Some(healthy)) = (self.checked, healthy) {
            if let Ok(mut h) = self.health.lock() {
                *h = Health::carried(h.rise(), h.fall(), healthy, streak);
                self.healthy.store(healthy, Ordering::SeqCst);
            }
        }
        self.admin.store(admin as u8, Ordering::SeqCst);
        self.publish();
    }
}

pub struct Pool {
    pub name: String,
    /// Its backends now; replaced whole, never edited in place.
    members: ArcSwap<Members>,
    /// Held while a new snapshot is made and stored, so two changes never
    /// race (the last would drop the first's).
    changing: Mutex<()>,
    /// How its backends are made, for members that come later.
    recipe: Recipe,
    /// Its backends named by DNS, in config order.
    pub named: Vec<Arc<Named>>,
    /// How often `named` are resolved again (a shorter TTL comes first).
    pub resolve_interval: std::time::Duration,
    /// `send_proxy` (each backend holds it too).
    pub send_proxy: Option<crate::proxy_protocol::Version>,
    pub health: Option<HealthConfig>,
    /// What its checks ask, in words (`probe::asked`), carried with each
    /// verdict to the next generation.
    pub checked_by: Option<String>,
    balance: Balance,
    /// Per-backend cap (0: none) and how long work waits for a place.
    cap: usize,
    queue_timeout: std::time::Duration,
    /// Where work waits for a place, first come, first served; only with a
    /// cap (without one nobody ever waits).
    line: Option<Arc<Line>>,
}

impl Pool {
    /// Builds pool `config`, numbering its IP backends from `first_index`
    /// and members resolved later from `next_index`, with idle connections
    /// kept per worker.
    pub fn new(
        config: &PoolConfig,
        first_index: usize,
        next_index: Arc<AtomicUsize>,
        workers: usize,
    ) -> Pool {
        let cap = config.max_connections_per_backend;
        let line = (cap > 0).then(|| Arc::new(Line::new(cap)));
        crate::metrics::queue_timeouts(&config.name);
        if !config.named.is_empty() {
            crate::metrics::dns_resolutions(&config.name);
        }
        let recipe = Recipe::new(config, line.clone(), workers, next_index);
        let backends: Vec<Arc<Backend>> = config
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| recipe.ip_backend(first_index + i, b))
            .collect();
        Pool {
            name: config.name.clone(),
            members: ArcSwap::from_pointee(Members::new(backends, workers)),
            changing: Mutex::new(()),
            recipe,
            named: config
                .named
                .iter()
                .map(|n| Arc::new(Named::new(n)))
                .collect(),
            resolve_interval: config.resolve_interval,
            send_proxy: config.send_proxy,
            health: config.health.clone(),
            checked_by: config
                .health
                .as_ref()
                .map(|h| probe::asked(h, config.tls.as_deref(), config.send_proxy)),
            balance: config.balance,
            cap,
            queue_timeout: config.queue_timeout,
            line,
        }
    }

    /// Builds every pool of a config, with global backend indices: IP
    /// backends in config order, members resolved from DNS after them.
    pub fn all(configs: &[PoolConfig], workers: usize) -> Vec<Arc<Pool>> {
        let total = configs.iter().map(|c| c.backends.len()).sum();
        let next_index = Arc::new(AtomicUsize::new(total));
        let mut first = 0;
        configs
            .iter()
            .map(|c| {
                let pool = Pool::new(c, first, Arc::clone(&next_index), workers);
                first += c.backends.len();
                Arc::new(pool)
            })
            .collect()
    }

    /// Its backends now: a snapshot, for anything off the request path.
    pub fn backends(&self) -> Arc<Members> {
        self.members.load_full()
    }

    /// Closes every backend connection kept idle: the generation drained.
    pub fn close_idle(&self) {
        for backend in &self.backends().backends {
            backend.idle.close_all();
        }
    }

    /// Picks a backend for one unit of work, skipping `exclude` (a backend
    /// that just failed) and those at their cap, or `None` when no backend
    /// can take it now. One lock-free load of the members per pick. While
    /// work waits in line, `None`: the caller goes through the line's lock
    /// (`lease`), where a place a waiter may use is not a newcomer's.
    pub fn pick(&self, exclude: Option<usize>) -> Option<Lease> {
        if self.line.as_ref().is_some_and(|line| line.has_waiters()) {
            return None;
        }
        self.pick_where(exclude, |_| true)
    }

    /// `pick`, among the backends `allowed` says may be taken.
    fn pick_where(
        &self,
        exclude: Option<usize>,
        allowed: impl Fn(&Backend) -> bool,
    ) -> Option<Lease> {
        let members = self.members.load();
        loop {
            let chosen = balance::choose(self.balance, &members.backends, &members.picks, |b| {
                b.available() && Some(b.index) != exclude && self.below_cap(b) && allowed(b)
            })?;
            // Another pick may have taken the last place meanwhile.
            if let Some(lease) = Lease::within(&members.backends[chosen], self.cap) {
                return Some(lease);
            }
        }
    }

    /// Like [`Self::pick`], but when every backend that could take the work
    /// is at its cap, waits in line (first come, first served) up to
    /// `queue_timeout`. Work in line whose backends all go down waits on:
    /// one that comes back up in time serves it; one that does not is told
    /// `NoBackend`, not `QueueTimeout`, so the log and the metrics name the
    /// outage rather than a shortage of places.
    pub async fn lease(&self, exclude: Option<usize>) -> Result<Lease, NoLease> {
        if let Some(lease) = self.pick(exclude) {
            return Ok(lease);
        }
        let Some(line) = &self.line else {
            return Err(NoLease::NoBackend);
        };
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        let any_up = || {
            self.members
                .load()
                .backends
                .iter()
                .any(|b| b.available() && Some(b.index) != exclude)
        };
        match line.join(exclude, |allowed| self.pick_where(exclude, allowed), any_up)? {
            Ok(lease) => Ok(lease),
            Err(ticket) => match ticket.served(deadline).await {
                Err(NoLease::QueueTimeout) if !any_up() => Err(NoLease::NoBackend),
                served => served,
            },
        }
    }

    /// Draining backends with nothing in flight go `out`: called once the
    /// older generation is gone, whose work on them `adopt` waited for.
    pub fn settle_drains(&self) {
        for b in self.members.load().backends.iter() {
            b.elder_may_use.store(false, Ordering::SeqCst);
            b.settle();
        }
    }

    fn below_cap(&self, b: &Backend) -> bool {
        self.cap == 0 || b.in_flight() < self.cap
    }

    pub fn healthy_count(&self) -> usize {
        self.members
            .load()
            .backends
            .iter()
            .filter(|b| b.available())
            .count()
    }

    /// Every checked backend has a verdict: the first health round ran
    /// (a check that times out counts, as a failure).
    pub fn first_round_done(&self) -> bool {
        self.members
            .load()
            .backends
            .iter()
            .all(|b| !b.checked || b.has_verdict())
    }

    /// Its named backends DNS has not answered for yet.
    pub fn waiting_for_dns(&self) -> Vec<&str> {
        self.named
            .iter()
            .filter(|n| !n.answered())
            .map(|n| n.name.as_str())
            .collect()
    }
}

/// One request or connection on a backend; counted until dropped.
pub struct Lease {
    backend: Arc<Backend>,
    place: Place,
}

/// Why a pool gave no lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoLease {
    /// No backend is up (or the only one just failed).
    NoBackend,
    /// Every backend stayed at its cap for `queue_timeout`.
    QueueTimeout,
}

impl Lease {
    /// A lease on `backend` if it has fewer than `cap` (0: any number).
    fn within(backend: &Arc<Backend>, cap: usize) -> Option<Lease> {
        let place = backend.take_place(cap)?;
        Some(Lease {
            backend: Arc::clone(backend),
            place,
        })
    }

    /// The lease on a place already counted (one handed on in a capped
    /// pool's line).
    fn handed(backend: Arc<Backend>) -> Lease {
        Lease {
            backend,
            place: Place::Capped,
        }
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The backend, to keep beyond the lease (an access-log line names it).
    pub fn shared(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for Lease {
    /// In a capped pool the place goes on to the line first.
    fn drop(&mut self) {
        let given_back = match &self.backend.line {
            Some(line) => line.pass_on(&self.backend),
            None => {
                self.backend.give_back(self.place);
                true
            }
        };
        if given_back {
            self.backend.settle();
        }
    }
}
