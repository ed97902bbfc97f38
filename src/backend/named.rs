//! A backend named by DNS (a host name `address`, or a pool's `srv`): what
//! it asks, the last good answer (kept through failures, carried to the
//! next generation), and the operator's last word on the name, which
//! members that join later take too, and on single members whose address
//! left DNS, which they take when it comes back. Its members live in the
//! pool's snapshot like any backend (see `members`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::members::Resolved;
use super::AdminState;
use crate::config::{DnsQuery, NamedConfig};

/// Members' states a name keeps for addresses gone from DNS, at most: the
/// operator names each one, so a few; bounded all the same.
const REMEMBERED: usize = 1024;

pub struct Named {
    pub name: String,
    pub query: DnsQuery,
    /// Each member's weight for a host name (SRV records bring their own).
    pub weight: u32,
    admin: AtomicU8,
    /// The operator's word on members removed while it differed from the
    /// name's (one drained by `name@address`): an address that comes back
    /// (a redeploy, rotating answers) must not come back enabled. As many
    /// as the operator named one by one.
    said_of_gone: Mutex<HashMap<SocketAddr, AdminState>>,
    /// The last good answer; `None` until DNS first answered.
    last: Mutex<Option<Vec<Resolved>>>,
    /// The last resolution failed: its warning is logged once per outage.
    failing: AtomicBool,
    /// DNS says the name has no address (NXDOMAIN, no records): since
    /// when, and when it last said so.
    empty: Mutex<Option<EmptyRun>>,
    /// When the start's own lookup said to ask again: the refresh task
    /// waits until then, where it asked again at once (every name twice
    /// at every first start).
    next_after_start: Mutex<Option<Instant>>,
}

/// Answers of no address in a row: failures between do not end the run,
/// an answer with addresses does, and so does a pause of more than twice
/// the hold between two of them (one NXDOMAIN, an hour of timeouts, then
/// another, is no hour of NXDOMAIN; the hold itself would be too short a
/// pause: after a failure a name with members is asked a whole interval
/// on, and empty, failure, empty take more than two).
#[derive(Clone, Copy)]
struct EmptyRun {
    since: Instant,
    last: Instant,
}

impl Named {
    pub fn new(config: &NamedConfig) -> Named {
        Named {
            name: config.name.clone(),
            query: config.query.clone(),
            weight: config.weight,
            admin: AtomicU8::new(AdminState::Enabled as u8),
            said_of_gone: Mutex::new(HashMap::new()),
            last: Mutex::new(None),
            failing: AtomicBool::new(false),
            empty: Mutex::new(None),
            next_after_start: Mutex::new(None),
        }
    }

    /// The start's lookup answered (or failed): ask again at `at`.
    pub fn ask_again_at(&self, at: Instant) {
        if let Ok(mut next) = self.next_after_start.lock() {
            *next = Some(at);
        }
    }

    /// When the start's lookup said to ask again, once; `None` where it
    /// made none (the answers were carried over) or has not ended.
    pub fn take_ask_again_at(&self) -> Option<Instant> {
        self.next_after_start.lock().ok().and_then(|mut n| n.take())
    }

    /// DNS has answered at least once (here or in an older generation).
    pub fn answered(&self) -> bool {
        self.kept().is_some()
    }

    /// How many addresses the last good answer holds; `None` until DNS
    /// first answered. Counted in place: the answer is not copied.
    pub fn kept(&self) -> Option<usize> {
        self.last.lock().ok().and_then(|l| l.as_ref().map(Vec::len))
    }

    /// The last good answer, if any.
    pub fn last(&self) -> Option<Vec<Resolved>> {
        self.last.lock().ok().and_then(|l| l.clone())
    }

    pub fn admin(&self) -> AdminState {
        AdminState::from_u8(self.admin.load(Ordering::SeqCst))
    }

    /// The operator drained or restored the name: members that join later
    /// start so too, whatever was said of single ones before.
    pub fn set_admin(&self, admin: AdminState) {
        self.admin.store(admin as u8, Ordering::SeqCst);
        if let Ok(mut said) = self.said_of_gone.lock() {
            said.clear();
        }
    }

    /// The state a member joining at `address` starts in: what the operator
    /// said of it before it left, else the name's.
    pub fn admin_at(&self, address: SocketAddr) -> AdminState {
        let said = self
            .said_of_gone
            .lock()
            .ok()
            .and_then(|mut s| s.remove(&address));
        if let Some(state) = said {
            // Maybe a new instance on a reused address: said, so that one
            // left out of rotation is not left so unnoticed.
            tracing::info!(
                backend = %format!("{}@{address}", self.name),
                state = %state.as_str(),
                "a member the operator set apart before its address left DNS is back, as it was left; restore it if it is a new instance"
            );
        }
        said.unwrap_or_else(|| self.admin())
    }

    /// A member at `address` in state `admin` is removed: its state is
    /// kept for its return when the operator set it apart from the name's
    /// (enabled where the name is drained, or the other way round; a
    /// drained member of a drained name is `out` where the name says
    /// `draining`, and is not apart). At most `REMEMBERED` addresses.
    pub fn remember(&self, address: SocketAddr, admin: AdminState) {
        let apart = (admin == AdminState::Enabled) != (self.admin() == AdminState::Enabled);
        if let Ok(mut said) = self.said_of_gone.lock() {
            if !apart {
                said.remove(&address);
            } else if said.len() < REMEMBERED || said.contains_key(&address) {
                said.insert(address, admin);
            } else {
                tracing::warn!(
                    backend = %format!("{}@{address}", self.name),
                    remembered = REMEMBERED,
                    "too many members set apart by the operator are gone from DNS: this one's state is not kept for its return"
                );
            }
        }
    }

    /// What [`Self::remember`] holds, for the next generation.
    pub fn remembered(&self) -> Vec<(SocketAddr, AdminState)> {
        let said = self.said_of_gone.lock();
        said.map(|s| s.iter().map(|(a, s)| (*a, *s)).collect())
            .unwrap_or_default()
    }

    /// Keeps a good answer; says whether it ends a run of failures.
    pub fn answer(&self, resolved: Vec<Resolved>) -> bool {
        self.keep(resolved);
        self.failing.swap(false, Ordering::SeqCst)
    }

    /// Keeps an answer, one some of whose lookups failed too (an SRV
    /// target's, its part kept from the last good answer): it has
    /// addresses, but a run of failures goes on.
    pub fn keep(&self, resolved: Vec<Resolved>) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(resolved);
        }
        *self.empty.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Notes that DNS says the name has no address; returns how long it
    /// has said so (zero at the first such answer, and after a pause of
    /// more than twice `hold` since the last).
    pub fn answered_empty(&self, hold: Duration) -> Duration {
        let now = Instant::now();
        let mut run = self.empty.lock().unwrap_or_else(|e| e.into_inner());
        let since = match *run {
            Some(r) if now.duration_since(r.last) <= hold * 2 => r.since,
            _ => now,
        };
        *run = Some(EmptyRun { since, last: now });
        now.duration_since(since)
    }

    /// How long DNS has said the name has no address, and how long ago
    /// it last said so, if it says so (its last such answer within twice
    /// `hold`): for the next generation, whose hold counts on from there.
    pub fn empty_for(&self, hold: Duration) -> Option<(Duration, Duration)> {
        let run = self.empty.lock().unwrap_or_else(|e| e.into_inner());
        run.filter(|r| r.last.elapsed() <= hold * 2)
            .map(|r| (r.since.elapsed(), r.last.elapsed()))
    }

    /// An older generation had heard "no address" for `empty_for`, last
    /// `last_ago`: the run counts from then, not from this generation's
    /// start (a reload every minute would otherwise keep the members for
    /// good), and a pause counts from its last answer (taken as now, a
    /// reload during a pause let a later answer of no address continue a
    /// run that had ended, and drain every member).
    pub fn empty_earlier(&self, empty_for: Duration, last_ago: Duration) {
        let now = Instant::now();
        let since = now.checked_sub(empty_for).unwrap_or(now);
        let last = now.checked_sub(last_ago).unwrap_or(now).max(since);
        *self.empty.lock().unwrap_or_else(|e| e.into_inner()) = Some(EmptyRun { since, last });
    }

    /// DNS has said for the hold that the name has no address: that is
    /// its last good answer now (carried so to the next generation),
    /// and the run of empty answers goes on.
    pub fn emptied(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(Vec::new());
        }
    }

    /// Notes a failed resolution; says whether it starts a run of them.
    pub fn failed(&self) -> bool {
        !self.failing.swap(true, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named() -> Named {
        Named::new(&NamedConfig {
            name: "app".into(),
            query: DnsQuery::Host {
                host: "app.internal".into(),
                port: 80,
            },
            weight: 1,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn answers_of_no_address_run_on_until_a_pause_past_twice_the_hold() {
        let n = named();
        let hold = Duration::from_secs(10);
        let later = |secs| tokio::time::advance(Duration::from_secs(secs));
        assert_eq!(n.answered_empty(hold), Duration::ZERO);
        later(6).await;
        assert_eq!(n.answered_empty(hold), Duration::from_secs(6));
        later(19).await;
        assert_eq!(n.answered_empty(hold), Duration::from_secs(25), "19 s on");
        later(21).await;
        assert_eq!(n.empty_for(hold), None, "21 s since the last: not carried");
        assert_eq!(n.answered_empty(hold), Duration::ZERO, "nor counted on");
        later(4).await;
        let ages = (Duration::from_secs(4), Duration::from_secs(4));
        assert_eq!(
            n.empty_for(hold),
            Some(ages),
            "4 s since it began, and since the last"
        );
        n.empty_earlier(Duration::from_secs(30), Duration::from_secs(5));
        assert_eq!(
            n.empty_for(hold),
            Some((Duration::from_secs(30), Duration::from_secs(5)))
        );
        assert_eq!(n.answered_empty(hold), Duration::from_secs(30));
        n.answer(Vec::new());
        assert_eq!(n.empty_for(hold), None, "an answer ends the run");
        // Carried in a pause: the pause counts from the older generation's
        // last answer, and one past twice the hold ends the run.
        n.empty_earlier(Duration::from_secs(30), Duration::from_secs(15));
        later(6).await;
        assert_eq!(n.answered_empty(hold), Duration::ZERO, "21 s of pause");
    }

    #[test]
    fn only_a_word_apart_from_the_names_is_remembered() {
        let n = named();
        let at = |last: u8| SocketAddr::from(([10, 0, 0, last], 80));
        n.remember(at(1), AdminState::Draining);
        assert_eq!(n.remembered(), [(at(1), AdminState::Draining)]);
        assert_eq!(n.admin_at(at(1)), AdminState::Draining);
        assert!(n.remembered().is_empty(), "taken by the returning member");
        // A drained name's members go out: not apart from it.
        n.set_admin(AdminState::Draining);
        n.remember(at(2), AdminState::Out);
        assert!(n.remembered().is_empty());
        n.remember(at(3), AdminState::Enabled);
        assert_eq!(n.admin_at(at(3)), AdminState::Enabled);
        for last in 0..=255u8 {
            for port in 0..5u16 {
                n.remember(
                    SocketAddr::from(([10, 1, 0, last], port)),
                    AdminState::Enabled,
                );
            }
        }
        assert_eq!(n.remembered().len(), REMEMBERED);
    }
}
