//! An instant one side of an exchange sets and another reads, without a
//! lock: nanoseconds after an origin in an atomic (how a client's body
//! tells the exchange's watch when its last bytes came, and an upload when
//! the backend stopped taking them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// An `Instant`, or none, shared between tasks.
pub struct SharedInstant {
    origin: Instant,
    nanos: AtomicU64,
}

const UNSET: u64 = u64::MAX;

impl SharedInstant {
    /// Set to `origin` itself.
    pub fn at(origin: Instant) -> SharedInstant {
        SharedInstant {
            origin,
            nanos: AtomicU64::new(0),
        }
    }

    /// Not set; `origin` is what later instants are counted from.
    pub fn unset(origin: Instant) -> SharedInstant {
        SharedInstant {
            origin,
            nanos: AtomicU64::new(UNSET),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(UNSET - 1)
    }

    pub fn set_now(&self) {
        self.nanos.store(self.now(), Ordering::Relaxed);
    }

    /// Sets it to now unless it is set already (reads no clock then).
    pub fn set_now_if_unset(&self) {
        if self.nanos.load(Ordering::Relaxed) == UNSET {
            self.set_now();
        }
    }

    /// Unsets it; says whether it was set.
    pub fn clear(&self) -> bool {
        self.take().is_some()
    }

    /// Unsets it, giving what it was.
    pub fn take(&self) -> Option<Instant> {
        let nanos = self.nanos.swap(UNSET, Ordering::Relaxed);
        (nanos != UNSET).then(|| self.origin + Duration::from_nanos(nanos))
    }

    pub fn get(&self) -> Option<Instant> {
        let nanos = self.nanos.load(Ordering::Relaxed);
        (nanos != UNSET).then(|| self.origin + Duration::from_nanos(nanos))
    }
}
