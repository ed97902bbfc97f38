//! An admin connection's stream, bounded in time. hyper's HTTP/1 server
//! bounds each request head's arrival (`header_read_timeout`), not a
//! response's write: a client that pipelines `/metrics` and never reads
//! stalls that write for good, and a request body may trickle. Each pins a task, its buffers and an fd, which the data plane
//! shares. So the stream itself fails with `TimedOut` when it has made no
//! progress either way for [`IDLE`], or for [`STALLED`] while a write
//! waits (nginx's `keepalive_timeout` and `send_timeout`, shorter).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// No request coming and nothing to write: a scraper reconnects after it.
pub const IDLE: Duration = Duration::from_secs(30);
/// A write the client does not take (a scrape's own timeout is 10 s).
pub const STALLED: Duration = Duration::from_secs(10);

pub struct Bounded<S> {
    inner: S,
    last_progress: Instant,
    /// Since when a write has waited (it returned `Pending` and has not
    /// moved since): its 10 s count from then, not from the last read.
    write_waiting: Option<Instant>,
    clock: Pin<Box<Sleep>>,
}

impl<S> Bounded<S> {
    pub fn new(inner: S) -> Bounded<S> {
        let now = Instant::now();
        Bounded {
            inner,
            last_progress: now,
            write_waiting: None,
            clock: Box::pin(tokio::time::sleep_until(now + IDLE)),
        }
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Called when the stream waits: an error once it has waited too long
    /// (the wake-up is registered otherwise).
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let (bound, deadline) = match self.write_waiting {
            Some(since) => (STALLED, since.max(self.last_progress) + STALLED),
            None => (IDLE, self.last_progress + IDLE),
        };
        if self.clock.deadline() != deadline {
            self.clock.as_mut().reset(deadline);
        }
        ready!(self.clock.as_mut().poll(cx));
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no progress for {bound:?}"),
        ))
    }

    /// What a write returned, accounted: progress, or a wait on the clock.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Pending => {
                self.write_waiting.get_or_insert_with(Instant::now);
                self.check(cx).map(Err)
            }
            Poll::Ready(result) => {
                self.write_waiting = None;
                if matches!(result, Ok(n) if n > 0) {
                    self.progressed();
                }
                Poll::Ready(result)
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Pending => self.check(cx).map(Err),
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                Poll::Ready(result)
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_moves_lives_on_and_an_idle_one_times_out() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut bounded = Bounded::new(ours);
        let mut byte = [0u8; 1];
        for _ in 0..5 {
            tokio::time::advance(IDLE - Duration::from_secs(1)).await;
            theirs.write_all(b"x").await.expect("write");
            bounded.read_exact(&mut byte).await.expect("a byte in time");
        }
        let started = Instant::now();
        let err = bounded.read(&mut byte).await.expect_err("idle too long");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_nobody_takes_times_out_sooner_counted_from_its_wait() {
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut bounded = Bounded::new(ours);
        bounded.write_all(&[0u8; 64]).await.expect("room for these");
        tokio::time::advance(STALLED + Duration::from_secs(5)).await;
        let started = Instant::now();
        let err = bounded
            .write_all(&[0u8; 1])
            .await
            .expect_err("stalled too long");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), STALLED);
    }
}
