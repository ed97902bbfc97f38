//! A pool's members: the snapshot pickers load, how a backend is made, and
//! the changes DNS answers make. A change builds a new snapshot (with a new
//! pick state: positions move) and swaps it in whole, so a pick never sees
//! half a change and never takes a lock. A member whose address DNS no
//! longer gives is retired (no new work, shown `draining`) once another
//! member of its name is up, and leaves at the next sweep after its
//! in-flight work ends.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::health::Health;
use super::line::Line;
use super::named::Named;
use super::{authority_of, balance, idle, AdminState, Backend, Pool};
use crate::config::{BackendConfig, PoolConfig};

/// The backends of a pool at one moment, with the pick state that goes
/// with their positions.
pub struct Members {
    pub backends: Vec<Arc<Backend>>,
    pub(super) picks: balance::PickState,
}

impl Members {
    pub(super) fn new(backends: Vec<Arc<Backend>>, workers: usize) -> Members {
        Members {
            picks: balance::PickState::new(&backends, workers),
            backends,
        }
    }
}

/// One address DNS gave a named backend: a member's address, its weight,
/// and what it was resolved from (the host name and port, or the SRV
/// record's target). Carried to the next generation as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    pub address: std::net::SocketAddr,
    pub weight: u32,
    pub from: String,
}

/// How a member that joins starts its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joining {
    /// Before the generation serves: its first check decides at once, as
    /// for every backend at start.
    AtStart,
    /// While serving: down until `rise` checks pass (up at once in a pool
    /// without checks).
    Serving,
}

/// How a pool makes its backends, kept for members that join later.
pub(super) struct Recipe {
    pool: String,
    checked: bool,
    rise: u32,
    fall: u32,
    line: Option<Arc<Line>>,
    workers: usize,
    tls: Option<Arc<crate::tls::upstream::UpstreamTls>>,
    send_proxy: Option<crate::proxy_protocol::Version>,
    /// The generation's next free backend index.
    next_index: Arc<AtomicUsize>,
}

/// What one backend is: the parts an IP backend and a member differ in.
struct Identity {
    index: usize,
    name: String,
    label: String,
    resolved_from: Option<String>,
    address: std::net::SocketAddr,
    weight: u32,
}

impl Recipe {
    pub(super) fn new(
        config: &PoolConfig,
        line: Option<Arc<Line>>,
        workers: usize,
        next_index: Arc<AtomicUsize>,
    ) -> Recipe {
        let (rise, fall) = config.health.as_ref().map_or((1, 1), |h| (h.rise, h.fall));
        Recipe {
            pool: config.name.clone(),
            checked: config.health.is_some(),
            rise,
            fall,
            line,
            workers,
            tls: config.tls.clone(),
            send_proxy: config.send_proxy,
            next_index,
        }
    }

    /// A backend the config gives by IP address.
    pub(super) fn ip_backend(&self, index: usize, config: &BackendConfig) -> Arc<Backend> {
        let identity = Identity {
            index,
            name: config.name.clone(),
            label: config.name.clone(),
            resolved_from: None,
            address: config.address,
            weight: config.weight,
        };
        self.make(identity, Joining::AtStart, AdminState::Enabled)
    }

    /// A member of `named` at `resolved`, with the operator's last word on
    /// the name.
    fn member(&self, named: &Named, resolved: &Resolved, joining: Joining) -> Arc<Backend> {
        let identity = Identity {
            index: self.next_index.fetch_add(1, Ordering::Relaxed),
            name: named.name.clone(),
            label: format!("{}@{}", named.name, resolved.address),
            resolved_from: Some(resolved.from.clone()),
            address: resolved.address,
            weight: resolved.weight,
        };
        let backend = self.make(identity, joining, named.admin_at(resolved.address));
        backend.settle();
        backend
    }

    fn make(&self, id: Identity, joining: Joining, admin: AdminState) -> Arc<Backend> {
        // Unchecked backends are taken as healthy; checked ones wait for
        // their first check at start, and for `rise` of them later.
        let health = match (self.checked, joining) {
            (false, _) => Health::with_verdict(self.rise, self.fall, true),
            (true, Joining::AtStart) => Health::new(self.rise, self.fall),
            (true, Joining::Serving) => Health::with_verdict(self.rise, self.fall, false),
        };
        let backend = Arc::new_cyclic(|me| Backend {
            me: me.clone(),
            index: id.index,
            metrics: super::metrics::register(&self.pool, &id.label),
            name: id.name,
            label: id.label,
            resolved_from: id.resolved_from,
            address: id.address,
            authority: authority_of(id.address),
            weight: AtomicU32::new(id.weight),
            pool: self.pool.clone(),
            checked: self.checked,
            in_flight: super::in_flight::InFlight::new(self.workers),
            admin: AtomicU8::new(admin as u8),
            healthy: AtomicBool::new(health.is_healthy()),
            health: Mutex::new(health),
            traffic_failures: AtomicU32::new(0),
            last_check: Mutex::new(None),
            last_error: Mutex::new(None),
            line: self.line.clone(),
            idle: idle::IdleConnections::new(self.workers),
            tls: self.tls.clone(),
            send_proxy: self.send_proxy,
            vanished: Mutex::new(None),
            retired: AtomicBool::new(false),
            elder_may_use: AtomicBool::new(false),
            gone: CancellationToken::new(),
        });
        backend.publish();
        backend
    }
}

impl Backend {
    /// How long DNS has not given its address, if it does not.
    fn vanished_for(&self) -> Option<Duration> {
        self.vanished_since().map(|since| since.elapsed())
    }

    fn vanished_since(&self) -> Option<Instant> {
        *self.vanished.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks its address given by DNS (`false`) or not (`true`); true
    /// when it was given until now.
    fn set_vanished(&self, vanished: bool) -> bool {
        let mut since = self.vanished.lock().unwrap_or_else(|e| e.into_inner());
        let was_given = since.is_none();
        *since = match (vanished, *since) {
            (false, _) => None,
            (true, Some(at)) => Some(at),
            (true, None) => Some(Instant::now()),
        };
        was_given
    }

    /// Retired with nothing in flight: the next sweep removes it.
    fn leaving(&self) -> bool {
        self.retired.load(Ordering::SeqCst) && self.in_flight() == 0
    }

    /// Cancelled once it has left its pool (its health checks stop on it).
    pub fn gone(&self) -> &CancellationToken {
        &self.gone
    }

    fn member_of(&self, named: &Named) -> bool {
        self.resolved_from.is_some() && self.name == named.name
    }
}

impl Pool {
    /// Makes the members of `named` those at `resolved`: new addresses
    /// join (their health per `joining`), vanished ones retire, returning
    /// ones come back, weights follow the answer. Returns the members that
    /// joined: starting their health checks is the caller's part.
    pub fn apply(
        &self,
        named: &Named,
        resolved: &[Resolved],
        joining: Joining,
    ) -> Vec<Arc<Backend>> {
        let Ok(_changing) = self.changing.lock() else {
            return Vec::new();
        };
        let current = self.members.load_full();
        for b in current.backends.iter().filter(|b| b.member_of(named)) {
            match resolved.iter().find(|r| r.address == b.address) {
                Some(r) => {
                    b.weight.store(r.weight, Ordering::Relaxed);
                    b.set_vanished(false);
                    if b.retired.swap(false, Ordering::SeqCst) {
                        tracing::info!(pool = %self.name, backend = %b.label, "address is back in DNS; the member stays");
                        b.settle();
                        b.publish();
                        b.wake_queue();
                    }
                }
                None if b.set_vanished(true) => {
                    tracing::info!(pool = %self.name, backend = %b.label, hold_s = self.obsolete_hold().as_secs_f64(), "address gone from DNS; the member drains once gone for the hold and another can take its work");
                }
                None => {}
            }
        }
        let joined: Vec<Arc<Backend>> = resolved
            .iter()
            .filter(|r| {
                !current
                    .backends
                    .iter()
                    .any(|b| b.member_of(named) && b.address == r.address)
            })
            .map(|r| self.recipe.member(named, r, joining))
            .collect();
        for b in &joined {
            tracing::info!(pool = %self.name, backend = %b.label, from = b.resolved_from.as_deref().unwrap_or(""), "member joins from DNS");
        }
        if !joined.is_empty() {
            let mut backends = current.backends.clone();
            backends.extend(joined.iter().cloned());
            self.members
                .store(Arc::new(Members::new(backends, self.recipe.workers)));
            joined.iter().for_each(|b| b.wake_queue());
        }
        self.retire_vanished();
        joined
    }

    /// The operator's word on `named` (`Draining` or `Enabled`), for its
    /// members now and to come, said under the lock `apply` and `sweep`
    /// hold while members join and leave: none joins with the word from
    /// before once this has looked at who is there, and none leaves (to
    /// be remembered with its word for its return) before it was told.
    /// Returns the members it told.
    pub fn say_of_name(&self, named: &Named, word: AdminState) -> Vec<Arc<Backend>> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        named.set_admin(word);
        let members = self.members.load();
        let told: Vec<Arc<Backend>> = members
            .backends
            .iter()
            .filter(|b| b.member_of(named))
            .cloned()
            .collect();
        for member in &told {
            if word == AdminState::Enabled {
                member.restore();
            } else {
                member.drain();
            }
        }
        told
    }

    /// Members of `named` gone from its answer that still serve (within
    /// their hold, or no other member of the name can take work yet), with
    /// how long they have been gone, for the next generation.
    pub fn still_serving(&self, named: &Named) -> Vec<(Resolved, Duration)> {
        self.members
            .load()
            .backends
            .iter()
            .filter(|b| b.member_of(named) && !b.retired.load(Ordering::SeqCst))
            .filter_map(|b| {
                let gone_for = b.vanished_for()?;
                let member = Resolved {
                    address: b.address,
                    weight: b.weight.load(Ordering::Relaxed),
                    from: b.resolved_from.clone().unwrap_or_default(),
                };
                Some((member, gone_for))
            })
            .collect()
    }

    /// A member of `named` at `address` that an older generation saw gone
    /// from the answer `gone_for` ago: its hold counts from then, not from
    /// this generation's start (a reload every few minutes would otherwise
    /// keep it serving for good).
    pub fn gone_earlier(&self, named: &Named, address: std::net::SocketAddr, gone_for: Duration) {
        let members = self.members.load();
        let member = members
            .backends
            .iter()
            .find(|b| b.member_of(named) && b.address == address);
        if let Some(b) = member {
            let since = Instant::now()
                .checked_sub(gone_for)
                .unwrap_or_else(Instant::now);
            let mut vanished = b.vanished.lock().unwrap_or_else(|e| e.into_inner());
            if vanished.is_some() {
                *vanished = Some(since);
            }
        }
        drop(members);
        if let Ok(_changing) = self.changing.lock() {
            self.retire_vanished();
        }
    }

    /// How long a member whose address left the answer keeps serving
    /// (HAProxy's `hold obsolete`): two resolve intervals, so an answer
    /// that rotates among more addresses than it holds, or is cut short
    /// once, does not retire members that are still there (to come back
    /// as new ones, down until `rise`), and the members of a name moved
    /// whole are not all replaced by the first new one up. Also how long
    /// an answer of no address keeps the last good set
    /// (`resolve::refresh`).
    pub fn obsolete_hold(&self) -> Duration {
        self.resolve_interval * 2
    }

    /// Retires every member of `named` (DNS has said for the hold that the
    /// name has no address: nothing will replace them); returns how many
    /// it retired. They leave at a sweep once their in-flight work ends.
    pub fn retire_all_of(&self, named: &Named) -> usize {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let members = self.members.load();
        let mut retired = 0;
        for b in members.backends.iter().filter(|b| b.member_of(named)) {
            b.set_vanished(true);
            if !b.retired.swap(true, Ordering::SeqCst) {
                b.publish();
                retired += 1;
            }
        }
        retired
    }

    /// Retires members whose address vanished from DNS once they have
    /// been gone for `obsolete_hold` and another member of their name can
    /// take work (one still in the answer, or one that left it after
    /// them), or at once when they cannot take work themselves (down
    /// and failing their checks, or drained by the operator): kept, they
    /// would serve nothing, and with addresses that churn during an outage
    /// or a drain every address ever seen would pile up (and go on to the
    /// next generation). The later leaver counts too: with answers that
    /// change faster than a new member passes its way up to `rise`, each
    /// came up only once out of the answer, none in it was ever available,
    /// and every address the name ever gave stayed a member, checked and
    /// taking traffic.
    fn retire_vanished(&self) {
        let members = self.members.load();
        let hold = self.obsolete_hold();
        for b in members.backends.iter() {
            let Some(gone_for) = b.vanished_for() else {
                continue;
            };
            let left_at = b.vanished_since();
            let replaced = gone_for >= hold
                && members.backends.iter().any(|m| {
                    let left_later = match m.vanished_since() {
                        None => true,
                        since => since > left_at,
                    };
                    m.name == b.name && left_later && m.available()
                });
            // Down, and its last check failed: not a member handed over at
            // a reload before its first check, nor a new one still passing
            // its way up to `rise` (with answers that rotate, it would
            // never get there).
            let down = !b.is_healthy() && b.consecutive_failures() > 0;
            let useless = down || b.admin() != AdminState::Enabled;
            if (replaced || useless) && !b.retired.swap(true, Ordering::SeqCst) {
                tracing::info!(pool = %self.name, backend = %b.label, in_flight = b.in_flight(), "address gone from DNS; draining the member");
                b.publish();
            }
        }
    }

    /// Retires vanished members that have a replacement, and removes
    /// retired ones whose in-flight work has ended.
    pub fn sweep(&self) {
        // Under the change lock: an answer applied meanwhile (which may
        // bring a vanished address back) is not undone by a stale look.
        if let Ok(_changing) = self.changing.lock() {
            self.retire_vanished();
        }
        if !self.members.load().backends.iter().any(|b| b.leaving()) {
            return;
        }
        let Ok(_changing) = self.changing.lock() else {
            return;
        };
        let current = self.members.load_full();
        let (left, kept): (Vec<_>, Vec<_>) =
            current.backends.iter().cloned().partition(|b| b.leaving());
        self.members
            .store(Arc::new(Members::new(kept, self.recipe.workers)));
        for b in left {
            if let Some(named) = self.named.iter().find(|n| b.member_of(n)) {
                named.remember(b.address, b.admin());
            }
            b.gone.cancel();
            b.metrics.clear();
            tracing::info!(pool = %self.name, backend = %b.label, "member drained and removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Lease;
    use super::*;
    use crate::config::{Balance, DnsQuery, NamedConfig};

    fn pool() -> Pool {
        pool_checked(None)
    }

    fn pool_checked(health: Option<crate::config::HealthConfig>) -> Pool {
        let config = PoolConfig {
            name: "p".into(),
            balance: Balance::RoundRobin,
            health,
            backends: vec![BackendConfig {
                name: "ip".into(),
                address: ([127, 0, 0, 1], 9000).into(),
                weight: 1,
            }],
            named: vec![NamedConfig {
                name: "app".into(),
                query: DnsQuery::Host {
                    host: "app.internal".into(),
                    port: 80,
                },
                weight: 1,
            }],
            resolve_interval: std::time::Duration::from_secs(1),
            max_connections_per_backend: 0,
            queue_timeout: std::time::Duration::from_secs(1),
            tls: None,
            send_proxy: None,
        };
        Pool::new(&config, 0, Arc::new(AtomicUsize::new(1)), 1)
    }

    /// A pool whose members pass TCP checks up (`rise = 2`) and down (`fall = 1`).
    fn pool_with_tcp_checks() -> Pool {
        pool_checked(Some(crate::config::HealthConfig {
            kind: crate::config::HealthKind::Tcp,
            path: "/".into(),
            host: None,
            interval: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(1),
            rise: 2,
            fall: 1,
        }))
    }

    fn at(last: u8, weight: u32) -> Resolved {
        Resolved {
            address: ([10, 0, 0, last], 80).into(),
            weight,
            from: "app.internal:80".into(),
        }
    }

    /// Past the pool's hold (two resolve intervals of 1 s), and a sweep.
    async fn past_the_hold(p: &Pool) {
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        p.sweep();
    }

    #[tokio::test(start_paused = true)]
    async fn members_join_retire_and_leave_once_idle() {
        let p = pool();
        let named = Arc::clone(&p.named[0]);
        let joined = p.apply(&named, &[at(1, 1), at(2, 1)], Joining::Serving);
        assert_eq!(joined.len(), 2);
        let labels: Vec<String> = p
            .backends()
            .backends
            .iter()
            .map(|b| b.label.clone())
            .collect();
        assert_eq!(labels, ["ip", "app@10.0.0.1:80", "app@10.0.0.2:80"]);
        assert_eq!(
            joined[0].index, 1,
            "members are numbered after the IP backends"
        );
        assert_eq!(joined[1].index, 2);
        assert_eq!(joined[0].state().as_str(), "up", "no checks: up at once");

        let held = Lease::within(&joined[0], 0).expect("a lease");
        assert!(p.apply(&named, &[at(2, 3)], Joining::Serving).is_empty());
        assert_eq!(joined[0].state().as_str(), "up", "held while gone a while");
        past_the_hold(&p).await;
        assert_eq!(joined[0].state().as_str(), "draining");
        assert_eq!(joined[1].weight(), 3, "the weight follows the answer");
        for _ in 0..10 {
            assert_ne!(p.pick(None).expect("pick").backend().index, 1);
        }
        p.sweep();
        assert_eq!(p.backends().backends.len(), 3, "kept while it has work");
        drop(held);
        assert_eq!(joined[0].state().as_str(), "out");
        p.sweep();
        assert_eq!(p.backends().backends.len(), 2);
        assert!(joined[0].gone().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_address_keeps_its_member() {
        let p = pool();
        let named = Arc::clone(&p.named[0]);
        let joined = p.apply(&named, &[at(1, 1)], Joining::Serving);
        let held = Lease::within(&joined[0], 0).expect("a lease");
        let other = p.apply(&named, &[at(2, 1)], Joining::Serving);
        past_the_hold(&p).await;
        assert_eq!(joined[0].state().as_str(), "draining");
        assert!(p.apply(&named, &[at(1, 1)], Joining::Serving).is_empty());
        assert_eq!(joined[0].state().as_str(), "up");
        assert_eq!(other[0].state().as_str(), "up", "gone, within its hold");
        past_the_hold(&p).await;
        assert_eq!(other[0].state().as_str(), "out");
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_vanished_member_serves_until_a_new_one_is_up() {
        let p = pool_with_tcp_checks();
        let named = Arc::clone(&p.named[0]);
        let old = p.apply(&named, &[at(1, 1)], Joining::Serving);
        old[0].observe_check(true, "ok".into());
        old[0].observe_check(true, "ok".into());
        let new = p.apply(&named, &[at(2, 1)], Joining::Serving);
        assert_eq!(
            new[0].state().as_str(),
            "down",
            "a new member waits for `rise`"
        );
        assert_eq!(
            old[0].state().as_str(),
            "up",
            "so the old one keeps serving"
        );
        let lease = p.pick(None).expect("the old member takes work");
        assert_eq!(lease.backend().index, old[0].index);
        drop(lease);
        past_the_hold(&p).await;
        assert_eq!(old[0].state().as_str(), "up", "no other member is up yet");
        new[0].observe_check(true, "ok".into());
        new[0].observe_check(true, "ok".into());
        p.sweep();
        assert_eq!(old[0].state().as_str(), "out");
        let left: Vec<usize> = p.backends().backends.iter().map(|b| b.index).collect();
        assert_eq!(left, [0, new[0].index]);
    }

    /// Answers that change faster than a new member passes its way up to
    /// `rise` (each a new address): each member comes up only once out of
    /// the answer. Those that left before the last one up are retired, so
    /// the members stay few; every address ever given stayed before.
    #[tokio::test(start_paused = true)]
    async fn members_of_answers_that_churn_faster_than_rise_do_not_pile_up() {
        let p = pool_with_tcp_checks();
        let named = Arc::clone(&p.named[0]);
        let mut previous: Option<Arc<Backend>> = None;
        for last in 1..=30 {
            let joined = p.apply(&named, &[at(last, 1)], Joining::Serving);
            joined[0].observe_check(true, "ok".into());
            if let Some(before) = &previous {
                before.observe_check(true, "ok".into());
            }
            previous = joined.into_iter().next();
            tokio::time::advance(std::time::Duration::from_secs(1)).await;
            p.sweep();
        }
        let left = p.backends().backends.len();
        assert!(left <= 5, "{left} members after 30 answers");
        assert!(p.pick(None).is_some(), "one that is up still serves");
    }

    /// An answer that leaves an address out once (it rotates among more
    /// addresses than it holds, or was cut short) does not retire its
    /// member: back within the hold, it serves on as it was.
    #[tokio::test(start_paused = true)]
    async fn an_address_left_out_of_one_answer_keeps_serving() {
        let p = pool_with_tcp_checks();
        let named = Arc::clone(&p.named[0]);
        let members = p.apply(&named, &[at(1, 1), at(2, 1)], Joining::Serving);
        for m in &members {
            m.observe_check(true, "ok".into());
            m.observe_check(true, "ok".into());
        }
        p.apply(&named, &[at(2, 1)], Joining::Serving);
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        p.sweep();
        assert_eq!(members[0].state().as_str(), "up", "within the hold");
        p.apply(&named, &[at(1, 1)], Joining::Serving);
        assert_eq!(members[0].state().as_str(), "up", "back in the answer");
        past_the_hold(&p).await;
        assert_eq!(
            members[0].state().as_str(),
            "up",
            "its hold ended when it came back"
        );
        assert_eq!(members[1].state().as_str(), "out", "the other's did not");
    }

    /// A member an older generation handed over as still serving keeps the
    /// time it left the answer: its hold does not start again at the
    /// reload (reloads more often than the hold would keep it for good).
    #[tokio::test(start_paused = true)]
    async fn a_member_handed_over_while_gone_keeps_its_hold_time() {
        let p = pool();
        let named = Arc::clone(&p.named[0]);
        let members = p.apply(&named, &[at(1, 1), at(2, 1)], Joining::AtStart);
        p.apply(&named, &[at(2, 1)], Joining::AtStart);
        assert_eq!(members[0].state().as_str(), "up", "its hold starts now");
        p.gone_earlier(
            &named,
            at(1, 1).address,
            std::time::Duration::from_millis(1500),
        );
        assert_eq!(members[0].state().as_str(), "up", "1.5 s of its 2 s");
        tokio::time::advance(std::time::Duration::from_millis(600)).await;
        p.sweep();
        assert_eq!(members[0].state().as_str(), "out");
        let serving = p.still_serving(&named);
        assert!(serving.is_empty(), "{:?}", serving.len());
    }

    /// The operator's word on a name while members join from DNS: each
    /// takes it, whether it joined before the word (`say_of_name` tells
    /// it) or after (it takes the name's). One that read
    /// the name's word before it changed, and joined after the look at who
    /// is there, would keep the old word.
    #[test]
    fn a_word_on_a_name_reaches_members_joining_meanwhile() {
        use std::sync::atomic::AtomicBool;
        let p = Arc::new(pool());
        let named = Arc::clone(&p.named[0]);
        let applied = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let joiner = {
            let (p, named) = (Arc::clone(&p), Arc::clone(&named));
            let (applied, done) = (Arc::clone(&applied), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut port = 0u16;
                while !done.load(Ordering::SeqCst) {
                    port = port % 60_000 + 1;
                    let fresh = Resolved {
                        address: ([10, 0, 0, 1], port).into(),
                        weight: 1,
                        from: "app.internal:80".into(),
                    };
                    p.apply(&named, &[fresh], Joining::Serving);
                    p.sweep();
                    applied.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        for round in 0..4000 {
            let drain = round % 2 == 0;
            let word = if drain {
                AdminState::Draining
            } else {
                AdminState::Enabled
            };
            p.say_of_name(&named, word);
            // Two answers on: the one under way, if any, has joined.
            let seen = applied.load(Ordering::SeqCst);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while applied.load(Ordering::SeqCst) < seen + 2 {
                assert!(std::time::Instant::now() < deadline, "the joiner stopped");
                std::thread::yield_now();
            }
            let members = p.backends();
            let apart = members
                .backends
                .iter()
                .filter(|b| b.member_of(&named) && (b.admin() == AdminState::Enabled) == drain)
                .count();
            assert_eq!(apart, 0, "round {round}: members without the word {word:?}");
        }
        done.store(true, Ordering::SeqCst);
        joiner.join().expect("joiner");
    }

    #[test]
    fn a_drained_name_drains_members_that_join_later() {
        let p = pool();
        let named = Arc::clone(&p.named[0]);
        named.set_admin(AdminState::Draining);
        let joined = p.apply(&named, &[at(1, 1)], Joining::Serving);
        assert_eq!(joined[0].state().as_str(), "out");
    }

    /// Addresses that churn while no member can take work (drained here,
    /// or all down) do not pile up: a vanished member that cannot serve
    /// leaves at once.
    #[test]
    fn churn_while_drained_or_down_keeps_only_the_answer() {
        let p = pool();
        let named = Arc::clone(&p.named[0]);
        named.set_admin(AdminState::Draining);
        for last in 1..=5 {
            p.apply(&named, &[at(last, 1)], Joining::Serving);
            p.sweep();
        }
        let members = |p: &Pool| p.backends().backends.len() - 1;
        assert_eq!(members(&p), 1, "the drained name holds its answer alone");

        let p = pool_with_tcp_checks();
        let named = Arc::clone(&p.named[0]);
        for last in 1..=5 {
            let joined = p.apply(&named, &[at(last, 1)], Joining::Serving);
            joined[0].observe_check(false, "refused".into());
            p.sweep();
        }
        assert_eq!(members(&p), 1, "a name all down holds its answer alone");

        // Answers that rotate: a member passing its way up to `rise` stays
        // while it is out of the answer, and gets there.
        let named = Arc::clone(&p.named[0]);
        let rising = p.apply(&named, &[at(10, 1)], Joining::Serving);
        rising[0].observe_check(true, "ok".into());
        p.apply(&named, &[at(11, 1)], Joining::Serving);
        p.sweep();
        rising[0].observe_check(true, "ok".into());
        assert_eq!(rising[0].state().as_str(), "up");
    }
}
