//! Racing a busy future against a rare one without paying for the rare one
//! at every wake-up. `tokio::select!` polls each branch whenever the task
//! wakes, so a connection that moves a request polls its drain's force
//! token and its idle clock too, a few hundred instructions each time for
//! futures that fire once in a connection's life. [`first_of`] gives the
//! rare future a waker of its own and polls it only after that waker fired.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// Which future finished first.
#[derive(Debug, PartialEq, Eq)]
pub enum First<A, B> {
    Main(A),
    Rare(B),
}

/// Runs `main` until it or `rare` finishes; `main` is polled first at each
/// wake-up (as a `biased` select), `rare` only on its first poll and after
/// its own waker fired. Meant for a future polled by one task: the task's
/// waker is noted when `rare` is polled, so a future polled from varying
/// wakers (a shared one) could be woken through a stale one.
pub fn first_of<M: Future, R: Future>(main: M, rare: R) -> FirstOf<M, R> {
    FirstOf {
        main,
        rare,
        gate: Arc::new(Gate {
            woken: AtomicBool::new(true),
            task: Mutex::new(None),
        }),
    }
}

pin_project_lite::pin_project! {
    /// The future [`first_of`] returns.
    pub struct FirstOf<M, R> {
        #[pin]
        main: M,
        #[pin]
        rare: R,
        gate: Arc<Gate>,
    }
}

/// The rare future's waker: it notes that it fired, then wakes the task.
struct Gate {
    woken: AtomicBool,
    /// The task's waker, as of its last poll.
    task: Mutex<Option<Waker>>,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(waker) = task.as_ref() {
            waker.wake_by_ref();
        }
    }
}

impl<M: Future, R: Future> Future for FirstOf<M, R> {
    type Output = First<M::Output, R::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.main.poll(cx) {
            return Poll::Ready(First::Main(out));
        }
        if !this.gate.woken.swap(false, Ordering::Acquire) {
            return Poll::Pending;
        }
        {
            let mut task = this
                .gate
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let waker = Waker::from(Arc::clone(this.gate));
        match this.rare.poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(out) => Poll::Ready(First::Rare(out)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_main_future_wins_when_it_finishes_first() {
        let got = first_of(async { 7 }, std::future::pending::<()>()).await;
        assert_eq!(got, First::Main(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rare_future_that_fires_later_is_heard_while_main_keeps_waking() {
        let token = tokio_util::sync::CancellationToken::new();
        let canceller = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            canceller.cancel();
        });
        // A main future that wakes its task often and never finishes.
        let busy = async {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            first_of(busy, token.cancelled_owned()),
        )
        .await;
        assert_eq!(got, Ok(First::Rare(())));
    }

    /// Counts its polls; never finishes.
    struct Counted<'a>(&'a std::cell::Cell<u32>);

    impl Future for Counted<'_> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.0.set(self.0.get() + 1);
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_rare_future_is_not_polled_at_the_main_futures_wake_ups() {
        let polls = std::cell::Cell::new(0);
        // Wakes its task a hundred times, then finishes.
        let busy = async {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
        };
        let got = first_of(busy, Counted(&polls)).await;
        assert_eq!(got, First::Main(()));
        assert_eq!(polls.get(), 1, "polled on the first poll only");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rare_future_that_fires_while_main_is_idle_wakes_the_task() {
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            first_of(
                std::future::pending::<()>(),
                tokio::time::sleep(Duration::from_millis(20)),
            ),
        )
        .await;
        assert_eq!(got, Ok(First::Rare(())));
    }
}
