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
//! waited its limit for the client. The exchange also hands its interim
//! (1xx) response heads over through it ([`Delivery::interim`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::HeaderMap;

use tokio::time::Instant;

use super::clock::SharedInstant;

/// One stream's delivery: since when a frame handed to the connection has
/// waited to go out (unset while none waits), whether that wait ran out,
/// and where its interim responses go.
pub struct Delivery {
    waiting: SharedInstant,
    timed_out: AtomicBool,
    /// Its stream and its connection's interim heads, for an exchange
    /// served by baton's h2 connection.
    interims: Option<(u32, Arc<Interims>)>,
    /// Interim heads passed on so far.
    interims_sent: AtomicU8,
}

/// The most interim (1xx) responses passed on for one stream; a backend's
/// later ones are read past (Java's HTTP client takes no more than 8
/// either). Each is held by the connection until written, so a backend
/// sending them without end must not fill its buffer.
const MAX_INTERIMS: u8 = 8;

/// An interim (1xx) response head: its status and fields.
pub type InterimHead = (u16, HeaderMap);

/// The interim response heads a connection's exchanges handed over, in
/// order, with their streams: the connection writes them when it next
/// looks, and always before a stream's final head.
#[derive(Default)]
pub struct Interims {
    queued: AtomicBool,
    heads: Mutex<Vec<(u32, InterimHead)>>,
}

impl Interims {
    /// What was handed over since the last call (nothing locked when
    /// nothing was).
    pub fn take(&self) -> Vec<(u32, InterimHead)> {
        // A load first: most looks find nothing, and a swap is a locked
        // instruction.
        if !self.queued.load(Ordering::Relaxed) || !self.queued.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.heads.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn push(&self, stream: u32, head: InterimHead) {
        let mut heads = self.heads.lock().unwrap_or_else(PoisonError::into_inner);
        heads.push((stream, head));
        self.queued.store(true, Ordering::Release);
    }
}

impl Delivery {
    pub fn new() -> Delivery {
        Delivery {
            waiting: SharedInstant::unset(Instant::now()),
            timed_out: AtomicBool::new(false),
            interims: None,
            interims_sent: AtomicU8::new(0),
        }
    }

    /// The delivery of `stream`, whose interim heads go to `interims`.
    pub fn of_stream(stream: u32, interims: Arc<Interims>) -> Delivery {
        Delivery {
            interims: Some((stream, interims)),
            ..Delivery::new()
        }
    }

    /// Hands an interim head to the connection, to go out before the
    /// final one; says whether it will (not past `MAX_INTERIMS`).
    pub fn interim(&self, head: InterimHead) -> bool {
        let Some((stream, interims)) = &self.interims else {
            return false;
        };
        // Only the stream's own exchange hands heads over.
        let sent = self.interims_sent.load(Ordering::Relaxed);
        if sent >= MAX_INTERIMS {
            return false;
        }
        self.interims_sent.store(sent + 1, Ordering::Relaxed);
        interims.push(*stream, head);
        true
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

    #[test]
    fn interim_heads_reach_the_connection_in_order_and_only_so_many() {
        let interims = Arc::new(Interims::default());
        let one = Delivery::of_stream(1, Arc::clone(&interims));
        let three = Delivery::of_stream(3, Arc::clone(&interims));
        assert!(one.interim((103, HeaderMap::new())));
        assert!(three.interim((103, HeaderMap::new())));
        assert!(one.interim((102, HeaderMap::new())));
        let order: Vec<(u32, u16)> = interims
            .take()
            .into_iter()
            .map(|(stream, (status, _))| (stream, status))
            .collect();
        assert_eq!(order, [(1, 103), (3, 103), (1, 102)]);
        assert!(interims.take().is_empty(), "taken once");
        let passed = (0..20)
            .filter(|_| three.interim((103, HeaderMap::new())))
            .count();
        assert_eq!(passed, usize::from(MAX_INTERIMS) - 1);
        assert!(
            !Delivery::new().interim((103, HeaderMap::new())),
            "no connection"
        );
    }
}
