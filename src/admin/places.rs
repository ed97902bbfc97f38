//! The admin port's connection places. At most [`MAX_CONNECTIONS`] are
//! served at once: their fds and memory are the data plane's too. When
//! all are taken, a newcomer makes the oldest connection give its place
//! up (it finishes the request it is on within [`LEAVING_GRACE`], or is
//! cut, and closes; an idle one closes at once), as nginx reuses
//! keep-alive connections when it runs out: a probe is never kept waiting
//! behind long-lived scrapers or a flood.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Admin connections served at once, at most.
pub const MAX_CONNECTIONS: usize = 256;

/// How long a newcomer waits for the connection it asked to leave before
/// it asks the next oldest.
const ASK_AGAIN: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a connection asked to give its place up may take to finish
/// the response it is on (a scrape's takes milliseconds): one its client
/// reads slowly, or not at all, is cut then. Without it, 256 clients that
/// pipeline `/metrics` and read a trickle keep their places for good, and
/// the accept loop, waiting for a place, keeps every probe waiting.
pub const LEAVING_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

pub struct Places {
    free: Arc<Semaphore>,
    /// The connections holding a place, oldest first, with the token that
    /// asks each to give it up.
    open: Mutex<VecDeque<(u64, CancellationToken)>>,
    next_id: AtomicU64,
}

/// One connection's place, given back when dropped.
pub struct Place {
    places: Arc<Places>,
    id: u64,
    _permit: OwnedSemaphorePermit,
    /// Cancelled when the connection should end: the generation stops
    /// serving the admin port (a child of its stop token), or a newcomer
    /// needs the place.
    pub ending: CancellationToken,
}

impl Places {
    pub fn new() -> Arc<Places> {
        Arc::new(Places {
            free: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            open: Mutex::default(),
            next_id: AtomicU64::new(0),
        })
    }

    /// A place for a connection just accepted, once one is free: when none
    /// is, the oldest connection is asked to give its place up first.
    /// `None` only if the places are gone (never: nothing closes them).
    /// The oldest may be busy (a response its client reads slowly is cut
    /// only after [`LEAVING_GRACE`]): if no place frees up within
    /// [`ASK_AGAIN`], the next oldest is asked too.
    pub async fn take(self: &Arc<Self>, stop: &CancellationToken) -> Option<Place> {
        let permit = loop {
            if let Ok(permit) = Arc::clone(&self.free).try_acquire_owned() {
                break permit;
            }
            self.ask_oldest_to_go();
            let freed = Arc::clone(&self.free).acquire_owned();
            if let Ok(permit) = tokio::time::timeout(ASK_AGAIN, freed).await {
                break permit.ok()?;
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ending = stop.child_token();
        self.lock().push_back((id, ending.clone()));
        Some(Place {
            places: Arc::clone(self),
            id,
            _permit: permit,
            ending,
        })
    }

    fn ask_oldest_to_go(&self) {
        if let Some((_, ending)) = self.lock().iter().find(|(_, e)| !e.is_cancelled()) {
            ending.cancel();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, CancellationToken)>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.places.lock().retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every place held, and a newcomer asking for one (its place's id).
    async fn full_then_a_newcomer() -> (
        CancellationToken,
        Vec<Place>,
        tokio::task::JoinHandle<Option<u64>>,
    ) {
        let places = Places::new();
        let stop = CancellationToken::new();
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            held.push(places.take(&stop).await.expect("a free place"));
        }
        let newcomer = tokio::spawn({
            let (places, stop) = (Arc::clone(&places), stop.clone());
            async move { places.take(&stop).await.map(|p| p.id) }
        });
        (stop, held, newcomer)
    }

    #[tokio::test]
    async fn a_newcomer_at_the_cap_asks_the_oldest_to_go_and_gets_its_place() {
        let (stop, mut held, newcomer) = full_then_a_newcomer().await;
        held[0].ending.cancelled().await;
        assert!(!held[1].ending.is_cancelled(), "only the oldest is asked");
        held.remove(0);
        let id = newcomer.await.expect("join").expect("its place");
        assert_eq!(id, MAX_CONNECTIONS as u64);
        stop.cancel();
        assert!(
            held.iter().all(|p| p.ending.is_cancelled()),
            "a stop ends all"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn when_the_oldest_does_not_leave_the_next_oldest_is_asked() {
        let (_stop, mut held, newcomer) = full_then_a_newcomer().await;
        held[0].ending.cancelled().await;
        // The oldest is busy and stays; the next is asked and leaves.
        held[1].ending.cancelled().await;
        assert!(!held[2].ending.is_cancelled());
        held.remove(1);
        assert!(newcomer.await.expect("join").is_some());
    }
}
