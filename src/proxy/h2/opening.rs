//! An h2c connection's opening clock (slowloris on h2): its preface and
//! first SETTINGS frame must be in within `header_timeout`, else it is
//! closed. After that its idleness is the proxy's business. (HTTP/1 heads
//! have their own clocks in `h1::conn`.) The stream also tells the
//! connection when it last wrote (see `activity`), and is handed back when
//! the h2 connection drops it, for its closing linger.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::proxy::activity::ConnState;

/// Runs from the connection's start until its opening is in.
pub struct OpeningClock {
    started: Instant,
    done: AtomicBool,
}

impl OpeningClock {
    /// Runs from `started`, when the connection was accepted: the preface
    /// read before the h2 connection took over and the SETTINGS after it
    /// share one
    /// `header_timeout`.
    pub fn since(started: Instant) -> OpeningClock {
        OpeningClock {
            started,
            done: AtomicBool::new(false),
        }
    }

    fn done(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    /// When the opening is overdue, given `limit`: `None` once it is in.
    pub fn due(&self, limit: Duration) -> Option<Instant> {
        (!self.done.load(Ordering::Relaxed)).then_some(self.started + limit)
    }
}

/// The client's stream, telling the connection's state when the opening
/// is in and when bytes went out.
pub struct Watched<S> {
    /// `None` only once dropped: then it goes to `back`.
    inner: Option<S>,
    back: Option<oneshot::Sender<S>>,
    /// Bytes read before the h2 connection took over (to tell h2 from
    /// HTTP/1), given to it first.
    prefix: Vec<u8>,
    state: Arc<ConnState>,
    opening: Opening,
}

/// How far a connection's opening is known.
enum Opening {
    /// Its first bytes: the h2 preface (already seen by the listener's
    /// peek), and the header of the SETTINGS frame after it.
    Sniffing(Vec<u8>),
    /// Bytes of the first SETTINGS frame still to come.
    Settings(usize),
    /// The opening is in.
    Known,
}

/// The h2 client preface (RFC 9113 §3.4); a SETTINGS frame must follow.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame header: 24-bit length, type, flags, stream id.
const FRAME_HEADER: usize = 9;

impl<S> Watched<S> {
    /// `inner`, sent to `back` when the h2 connection is done with it: it
    /// keeps the stream it is given, and closing it well needs the socket
    /// after.
    pub fn new(
        inner: S,
        prefix: Vec<u8>,
        state: Arc<ConnState>,
        back: oneshot::Sender<S>,
    ) -> Watched<S> {
        Watched {
            inner: Some(inner),
            back: Some(back),
            prefix,
            state,
            opening: Opening::Sniffing(Vec::new()),
        }
    }

    /// Follows the opening bytes until the preface and first SETTINGS
    /// frame are in.
    fn follow_opening(&mut self, mut fresh: &[u8]) {
        while !fresh.is_empty() {
            let next = match &mut self.opening {
                Opening::Known => return,
                Opening::Sniffing(seen) => {
                    let want = PREFACE.len() + FRAME_HEADER;
                    let take = fresh.len().min(want - seen.len());
                    seen.extend_from_slice(&fresh[..take]);
                    fresh = &fresh[take..];
                    let compared = seen.len().min(PREFACE.len());
                    if seen[..compared] != PREFACE[..compared] {
                        // Not h2 after all: the connection refuses it.
                        self.state.opening.done();
                        Opening::Known
                    } else if seen.len() < want {
                        return;
                    } else {
                        let h = &seen[PREFACE.len()..];
                        Opening::Settings(u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize)
                    }
                }
                Opening::Settings(left) => {
                    let take = fresh.len().min(*left);
                    *left -= take;
                    fresh = &fresh[take..];
                    if *left > 0 {
                        return;
                    }
                    self.state.opening.done();
                    Opening::Known
                }
            };
            self.opening = next;
        }
        if let Opening::Settings(0) = self.opening {
            self.state.opening.done();
            self.opening = Opening::Known;
        }
    }
}

impl<S> Drop for Watched<S> {
    fn drop(&mut self) {
        if let (Some(inner), Some(back)) = (self.inner.take(), self.back.take()) {
            // Nobody waiting for it: it closes here.
            let _ = back.send(inner);
        }
    }
}

/// What a poll on a stream already handed back meets (never: it is handed
/// back only as `Watched` is dropped).
fn gone<T>() -> Poll<std::io::Result<T>> {
    Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()))
}

impl<S> Watched<S> {
    /// Tells the connection's state that bytes went out.
    fn noted(&self, written: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.state.wrote();
        }
        written
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = if self.prefix.is_empty() {
            match self.inner.as_mut() {
                Some(inner) => Pin::new(inner).poll_read(cx, buf),
                None => return gone(),
            }
        } else {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.drain(..n);
            Poll::Ready(Ok(()))
        };
        if matches!(polled, Poll::Ready(Ok(())))
            && buf.filled().len() > before
            && !matches!(self.opening, Opening::Known)
        {
            let fresh = buf.filled()[before..].to_vec();
            self.follow_opening(&fresh);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_write(cx, data),
            None => return gone(),
        };
        self.noted(written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_write_vectored(cx, bufs),
            None => return gone(),
        };
        self.noted(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(S::is_write_vectored)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_flush(cx),
            None => gone(),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_shutdown(cx),
            None => gone(),
        }
    }
}
