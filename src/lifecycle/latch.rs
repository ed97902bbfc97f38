//! A one-way latch that one worker's connections look at and wait on: set
//! once (a drain's start, or its force), read with one atomic load, waited
//! for through a `Notify` beside it. tokio-util's `CancellationToken` does
//! the same with a mutex it locks to say whether it fired, and another
//! lock to take a waiter: several times a request.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Default)]
pub struct Latch {
    set: AtomicBool,
    notify: Notify,
}

impl Latch {
    /// Sets it and wakes every task waiting on it.
    pub fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once it is set. The `Notified` is made before the look at
    /// the flag: `notify_waiters` wakes every one made before it, polled
    /// or not, so a `set` between the look and the first poll is not lost.
    pub async fn wait(&self) {
        let notified = self.notify.notified();
        if self.is_set() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::Latch;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wait_ends_when_the_latch_is_set_and_at_once_after() {
        let latch = Arc::new(Latch::default());
        let waiting = tokio::spawn({
            let latch = Arc::clone(&latch);
            async move { latch.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!latch.is_set() && !waiting.is_finished());
        latch.set();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ended")
            .expect("task");
        assert!(latch.is_set());
        tokio::time::timeout(Duration::from_secs(5), latch.wait())
            .await
            .expect("a wait after the set ends at once");
    }
}
