//! Whether an h2 client takes one stream's response, watched from the
//! stream's own task. The connection-wide clock (`activity`) sees a client
//! that takes nothing at all; it cannot see one stream starved of its
//! flow-control window while another moves, and such a stream would hold
//! its backend connection, and its place under a cap, for good. HTTP/1
//! bounds the same wait on every write (`client_stall`), and nginx's
//! `send_timeout` is per stream too.
//!
//! baton's h2 connection (`h2::conn`) keeps each stream's [`Delivery`],
//! lends it to the stream's exchange while it polls it ([`lend`], read by
//! [`current`]), and resets the stream once a frame handed to it has
//! waited its limit for the client.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::time::Instant;

use super::clock::SharedInstant;

/// One stream's delivery: since when a frame handed to the connection has
/// waited to go out (unset while none waits), and whether that wait ran
/// out.
pub struct Delivery {
    waiting: SharedInstant,
    timed_out: AtomicBool,
}

impl Delivery {
    pub fn new() -> Delivery {
        Delivery {
            waiting: SharedInstant::unset(Instant::now()),
            timed_out: AtomicBool::new(false),
        }
    }

    /// A frame went to the connection, which asks for the next once it can
    /// send it.
    pub fn handed(&self) {
        self.waiting.set_now();
    }

    /// The connection asked for the next frame: the last one went out.
    pub fn asked(&self) {
        self.waiting.clear();
    }

    /// Since when a frame has waited, if one does.
    pub fn waiting_since(&self) -> Option<Instant> {
        self.waiting.get()
    }

    /// The stream is ended: the client took none of its bytes in time.
    pub fn time_out(&self) {
        self.timed_out.store(true, Ordering::Relaxed);
    }

    /// The stream was ended because the client took none of its bytes.
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Relaxed)
    }
}

impl Default for Delivery {
    fn default() -> Delivery {
        Delivery::new()
    }
}

thread_local! {
    /// The delivery of the stream whose exchange this thread is polling.
    static POLLED: RefCell<Option<Arc<Delivery>>> = const { RefCell::new(None) };
}

/// The delivery of the stream whose exchange is being polled, for the
/// exchange to take when it starts; `None` outside [`lend`].
pub fn current() -> Option<Arc<Delivery>> {
    POLLED.with(|polled| polled.borrow().clone())
}

/// Runs `poll` (a stream's exchange, polled) with `delivery` lent to it.
pub fn lend<R>(delivery: &Arc<Delivery>, poll: impl FnOnce() -> R) -> R {
    let lent = POLLED.with(|polled| polled.replace(Some(Arc::clone(delivery))));
    let polled = poll();
    POLLED.with(|polled| polled.replace(lent));
    polled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_is_lent_while_its_exchange_is_polled_alone() {
        let delivery = Arc::new(Delivery::new());
        assert!(current().is_none());
        let seen = lend(&delivery, current).expect("lent");
        assert!(Arc::ptr_eq(&seen, &delivery));
        assert!(current().is_none(), "given back after the poll");
        seen.handed();
        assert!(delivery.waiting_since().is_some());
        seen.asked();
        assert!(delivery.waiting_since().is_none());
    }
}
