//! A backend named by DNS (a host name `address`, or a pool's `srv`): what
//! it asks, the last good answer (kept through failures, carried to the
//! next generation), and the operator's last word on the name, which
//! members that join later take too. Its members live in the pool's
//! snapshot like any backend (see `members`).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;

use super::members::Resolved;
use super::AdminState;
use crate::config::{DnsQuery, NamedConfig};

pub struct Named {
    pub name: String,
    pub query: DnsQuery,
    /// Each member's weight for a host name (SRV records bring their own).
    pub weight: u32,
    admin: AtomicU8,
    /// The last good answer; `None` until DNS first answered.
    last: Mutex<Option<Vec<Resolved>>>,
    /// The last resolution failed: its warning is logged once per outage.
    failing: AtomicBool,
}

impl Named {
    pub fn new(config: &NamedConfig) -> Named {
        Named {
            name: config.name.clone(),
            query: config.query.clone(),
            weight: config.weight,
            admin: AtomicU8::new(AdminState::Enabled as u8),
            last: Mutex::new(None),
            failing: AtomicBool::new(false),
        }
    }

    /// DNS has answered at least once (here or in an older generation).
    pub fn answered(&self) -> bool {
        self.last.lock().map(|l| l.is_some()).unwrap_or(false)
    }

    /// The last good answer, if any.
    pub fn last(&self) -> Option<Vec<Resolved>> {
        self.last.lock().ok().and_then(|l| l.clone())
    }

    pub fn admin(&self) -> AdminState {
        AdminState::from_u8(self.admin.load(Ordering::SeqCst))
    }

    /// The operator drained or restored the name: members that join later
    /// start so too.
    pub fn set_admin(&self, admin: AdminState) {
        self.admin.store(admin as u8, Ordering::SeqCst);
    }

    /// Keeps a good answer; says whether it ends a run of failures.
    pub fn answer(&self, resolved: Vec<Resolved>) -> bool {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(resolved);
        }
        self.failing.swap(false, Ordering::SeqCst)
    }

    /// Notes a failed resolution; says whether it starts a run of them.
    pub fn failed(&self) -> bool {
        !self.failing.swap(true, Ordering::SeqCst)
    }
}
