//! Whether an h2 client takes one stream's response, watched from the
//! stream's own task. The connection-wide clock (`activity`) sees a client
//! that takes nothing at all; it cannot see one stream starved of its
//! flow-control window while another moves, and such a stream would hold
//! its backend connection, and its place under a cap, for good. HTTP/1
//! bounds the same wait on every write (`client_stall`), and nginx's
//! `send_timeout` is per stream too.
//!
//! hyper runs a stream's service future inside the task it spawns for the
//! stream, through baton's executor: the executor wraps the task in
//! [`StreamTask`], which lends the stream its [`Delivery`] while it polls it
//! ([`current`]), and ends the task, which resets the stream, once a frame
//! handed to hyper has waited `limit` for the client.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::clock::SharedInstant;

/// One stream's delivery: since when a frame handed to hyper has waited
/// to go out (unset while none waits), and whether that wait ran out.
pub struct Delivery {
    waiting: SharedInstant,
    timed_out: AtomicBool,
}

impl Delivery {
    fn new() -> Delivery {
        Delivery {
            waiting: SharedInstant::unset(Instant::now()),
            timed_out: AtomicBool::new(false),
        }
    }

    /// A frame went to hyper, which asks for the next once it can send it.
    pub fn handed(&self) {
        self.waiting.set_now();
    }

    /// hyper asked for the next frame: the last one went out.
    pub fn asked(&self) {
        self.waiting.clear();
    }

    /// The stream was ended because the client took none of its bytes.
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Relaxed)
    }
}

thread_local! {
    /// The delivery of the stream task this thread is polling.
    static POLLED: RefCell<Option<Arc<Delivery>>> = const { RefCell::new(None) };
}

/// The delivery of the stream whose task is being polled, for its service
/// future to take when it starts; `None` outside a [`StreamTask`] task.
pub fn current() -> Option<Arc<Delivery>> {
    POLLED.with(|polled| polled.borrow().clone())
}

/// A stream's task, ended once a frame has waited `limit` for the client.
pub struct StreamTask<F> {
    task: Pin<Box<F>>,
    /// Lent to [`POLLED`] while the task is polled.
    delivery: Option<Arc<Delivery>>,
    limit: Duration,
    /// Armed the first time a frame waits, then moved only when it fires
    /// early (a later frame waiting): no timer work while bytes move.
    alarm: Option<Pin<Box<Sleep>>>,
    /// Told when the stream is ended for its client's stall.
    on_stall: Arc<dyn Fn() + Send + Sync>,
}

impl<F> StreamTask<F> {
    pub fn new(task: F, limit: Duration, on_stall: Arc<dyn Fn() + Send + Sync>) -> StreamTask<F> {
        StreamTask {
            task: Box::pin(task),
            delivery: Some(Arc::new(Delivery::new())),
            limit,
            alarm: None,
            on_stall,
        }
    }

    /// Whether the frame waiting now has waited `limit` (arming the alarm
    /// for when it will have).
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(since) = self.delivery.as_ref().and_then(|d| d.waiting.get()) else {
            return false;
        };
        let due = since + self.limit;
        let alarm = self
            .alarm
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        loop {
            if alarm.as_mut().poll(cx).is_pending() {
                return false;
            }
            if alarm.deadline() >= due {
                return true;
            }
            alarm.as_mut().reset(due);
        }
    }
}

impl<F: Future<Output = ()>> Future for StreamTask<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let lent = POLLED.with(|polled| polled.replace(this.delivery.take()));
        let polled = this.task.as_mut().poll(cx);
        this.delivery = POLLED.with(|polled| polled.replace(lent));
        if polled.is_ready() {
            return Poll::Ready(());
        }
        if this.stalled(cx) {
            if let Some(delivery) = &this.delivery {
                delivery.timed_out.store(true, Ordering::Relaxed);
            }
            (this.on_stall)();
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for hyper's stream task: hands a frame, then waits (for
    /// window) until `moves` says the client took it.
    async fn hands_a_frame_and_waits(moves: tokio::sync::watch::Receiver<bool>) {
        let delivery = current().expect("lent while polled");
        delivery.handed();
        let mut moves = moves;
        while moves.changed().await.is_ok() {
            delivery.asked();
            delivery.handed();
        }
        std::future::pending::<()>().await;
    }

    fn stall_counter() -> (
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<dyn Fn() + Send + Sync>,
    ) {
        let stalls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&stalls);
        let on_stall = Arc::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        (stalls, on_stall)
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_that_waits_the_limit_ends_the_stream() {
        let (_moves, watch) = tokio::sync::watch::channel(false);
        let (stalls, on_stall) = stall_counter();
        let started = Instant::now();
        StreamTask::new(
            hands_a_frame_and_waits(watch),
            Duration::from_secs(5),
            on_stall,
        )
        .await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(stalls.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn frames_that_keep_going_out_never_end_it() {
        let (moves, watch) = tokio::sync::watch::channel(false);
        let (stalls, on_stall) = stall_counter();
        let task = tokio::spawn(StreamTask::new(
            hands_a_frame_and_waits(watch),
            Duration::from_secs(5),
            on_stall,
        ));
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            moves.send_replace(true);
        }
        assert!(!task.is_finished(), "30 s of frames each out within 3 s");
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(task.is_finished(), "then one frame waited 6 s");
        assert_eq!(stalls.load(Ordering::Relaxed), 1);
    }
}
