//! Which end of a tunnel (TCP mode, or an upgraded HTTP connection) an
//! I/O error came from, carried inside the `io::Error` so it passes
//! through tokio's `copy` unchanged: the other end is then reset
//! (`reset`), and a backend's failure is counted against it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

/// Which end of a tunnel an I/O error came from: a backend's reset is the
/// backend's failure (`SD`, counted against it), a client's its own
/// (`CD`). Carried inside the `io::Error`, so it passes through tokio's
/// `copy` unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Backend,
}

#[derive(Debug, thiserror::Error)]
#[error("{source}")]
struct SideError {
    side: Side,
    source: std::io::Error,
}

/// Marks an error as `side`'s (once: the first mark stays).
pub fn on(side: Side) -> impl Fn(std::io::Error) -> std::io::Error {
    move |err| match side_of(&err) {
        Some(_) => err,
        None => std::io::Error::new(err.kind(), SideError { side, source: err }),
    }
}

pub fn side_of(err: &std::io::Error) -> Option<Side> {
    err.get_ref()?.downcast_ref::<SideError>().map(|e| e.side)
}

/// A half of a TLS tunnel whose errors are marked as its side's.
pub struct Sided<T> {
    inner: T,
    side: Side,
}

impl<T> Sided<T> {
    pub fn new(inner: T, side: Side) -> Sided<T> {
        Sided { inner, side }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Sided<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let side = self.side;
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            // A TLS peer that closed its TCP connection without
            // close_notify (rustls says UnexpectedEof): in a tunnel that is
            // an end, as a plain peer's FIN is, not a failure to pass on
            // as a reset.
            std::task::Poll::Ready(Err(err)) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
                std::task::Poll::Ready(Ok(()))
            }
            read => read.map_err(on(side)),
        }
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Sided<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let side = self.side;
        std::pin::Pin::new(&mut self.inner)
            .poll_write(cx, data)
            .map_err(on(side))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let side = self.side;
        std::pin::Pin::new(&mut self.inner)
            .poll_flush(cx)
            .map_err(on(side))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let side = self.side;
        std::pin::Pin::new(&mut self.inner)
            .poll_shutdown(cx)
            .map_err(on(side))
    }
}

/// Runs a tunnel's two ways, `up` (client to backend) and `down`, until
/// both end or one fails. A failed write to the backend (`up` failing on
/// the backend's side: it reset, crashed or closed under what the client
/// sent) leaves `down` running: what the backend sent before is still owed
/// to the client. That failure is still the answer once `down` ends: the
/// kernel reports a reset once, to the write that met it, and `down`'s
/// reads then end as if with a FIN, which would pass a crash off as a
/// whole stream. (`tokio::try_join!` dropped `down` at once, and with it
/// what the tunnel held of the backend's last bytes.) Any other failure
/// ends both at once. `up_failed` is set for the way down to see: it ends
/// at the backend's end without a FIN then, as the tunnel ends in a reset.
pub fn both_ways<U, D>(up: U, down: D, up_failed: &UpFailed) -> BothWays<'_, U, D>
where
    U: Future<Output = io::Result<()>>,
    D: Future<Output = io::Result<()>>,
{
    BothWays {
        up,
        down,
        up_ended: None,
        down_done: false,
        up_failed,
    }
}

pin_project_lite::pin_project! {
    /// The future [`both_ways`] returns. A struct, not an async fn: one
    /// kept each way's future twice, as its argument and as its pinned
    /// local (400 bytes more in every TCP-mode connection's task).
    pub struct BothWays<'f, U, D> {
        #[pin]
        up: U,
        #[pin]
        down: D,
        up_ended: Option<io::Result<()>>,
        down_done: bool,
        up_failed: &'f UpFailed,
    }
}

impl<U, D> Future for BothWays<'_, U, D>
where
    U: Future<Output = io::Result<()>>,
    D: Future<Output = io::Result<()>>,
{
    type Output = io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        if this.up_ended.is_none() {
            if let Poll::Ready(ended) = this.up.poll(cx) {
                if let Err(err) = &ended {
                    if side_of(err) != Some(Side::Backend) {
                        return Poll::Ready(ended);
                    }
                    this.up_failed.0.store(true, Ordering::Relaxed);
                }
                *this.up_ended = Some(ended);
            }
        }
        if !*this.down_done {
            match this.down.poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) => *this.down_done = true,
            }
        }
        // Once down ended, up alone (its waker is set by the poll above).
        match this.up_ended.take() {
            Some(ended) => Poll::Ready(ended),
            None => Poll::Pending,
        }
    }
}

/// Set once a tunnel's way up failed on the backend's side ([`both_ways`]):
/// the way down then passes the backend's end on as no FIN, since a FIN
/// reaching the client ahead of the reset would pass the abort off as a
/// whole stream.
#[derive(Default)]
pub struct UpFailed(std::sync::atomic::AtomicBool);

impl UpFailed {
    pub fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::{both_ways, on, side_of, Side, Sided, UpFailed};
    use std::io::ErrorKind;
    use tokio::io::AsyncReadExt;

    /// A reader whose every read fails with `kind`.
    struct Failing(ErrorKind);

    impl tokio::io::AsyncRead for Failing {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Err(self.0.into()))
        }
    }

    /// A TLS peer's close without close_notify is an end; a reset is its
    /// side's failure.
    #[tokio::test]
    async fn an_unexpected_eof_is_an_end_and_a_reset_is_the_sides_failure() {
        let mut buf = [0u8; 16];
        let mut closed = Sided::new(Failing(ErrorKind::UnexpectedEof), Side::Client);
        assert_eq!(closed.read(&mut buf).await.expect("an end"), 0);
        let mut reset = Sided::new(Failing(ErrorKind::ConnectionReset), Side::Backend);
        let err = reset.read(&mut buf).await.expect_err("a failure");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset);
        assert_eq!(side_of(&err), Some(Side::Backend));
    }

    /// A failed write to the backend leaves the way down running to its
    /// end, and is the answer then; a client's failure ends both at once.
    #[tokio::test]
    async fn a_failed_write_to_the_backend_leaves_the_way_down_running() {
        let refused = || Err(on(Side::Backend)(ErrorKind::BrokenPipe.into()));
        let came_down = std::cell::Cell::new(false);
        let down = async {
            tokio::task::yield_now().await;
            came_down.set(true);
            Ok(())
        };
        let up_failed = UpFailed::default();
        let err = both_ways(async { refused() }, down, &up_failed)
            .await
            .expect_err("the backend's failure, once the way down ended");
        assert!(came_down.get(), "the way down ran to its end");
        assert!(up_failed.is_set(), "and was told, to hold its FIN back");
        assert_eq!(side_of(&err), Some(Side::Backend));
        let gone = || Err(on(Side::Client)(ErrorKind::ConnectionReset.into()));
        let err = both_ways(
            async { gone() },
            std::future::pending(),
            &UpFailed::default(),
        )
        .await
        .expect_err("the client's failure");
        assert_eq!(side_of(&err), Some(Side::Client));
    }
}
