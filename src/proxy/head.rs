//! The request-head clock (slowloris): once a client starts a request, or
//! opens a connection, it must deliver the whole head within
//! `header_timeout`, else it gets 408 and the connection closes. Idleness
//! between keep-alive requests is a different clock: hyper's own header
//! timer, set to `idle_timeout` (hyper starts it when a connection turns
//! idle, and it sends no 408).
//!
//! An h2c connection (prior knowledge) is under the same clock until its
//! preface and first SETTINGS frame are in (then it is closed, without a
//! 408, if they are late); after that its idleness is the proxy's business.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What a client is answered when its head is too slow.
pub const TIMEOUT_RESPONSE: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

pub struct HeadClock {
    origin: Instant,
    /// When the head in progress began, as nanoseconds since `origin` + 1;
    /// 0 when no head is in progress.
    since: AtomicU64,
    /// A request is being answered: bytes now are its body, not a head.
    answering: AtomicBool,
    /// h2 frames its own requests; this clock is for HTTP/1 and h2's opening.
    off: AtomicBool,
    /// The connection opened with the h2 preface.
    h2: AtomicBool,
    /// Its opening bytes were not the h2 preface: HTTP/1 for good.
    http1: AtomicBool,
    /// The head was too slow: the connection goes with a 408.
    expired: AtomicBool,
}

impl Default for HeadClock {
    fn default() -> Self {
        Self::new()
    }
}

impl HeadClock {
    /// A new connection's clock, already running: it must speak.
    pub fn new() -> HeadClock {
        HeadClock {
            origin: Instant::now(),
            since: AtomicU64::new(1),
            answering: AtomicBool::new(false),
            off: AtomicBool::new(false),
            h2: AtomicBool::new(false),
            http1: AtomicBool::new(false),
            expired: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64 + 1
    }

    fn bytes_read(&self) {
        if !self.answering.load(Ordering::Relaxed) {
            let _ =
                self.since
                    .compare_exchange(0, self.now(), Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// A whole head arrived: the request is being answered.
    pub fn head_done(&self) {
        self.answering.store(true, Ordering::Relaxed);
        self.since.store(0, Ordering::Relaxed);
    }

    /// The response is done; the next bytes start a new head.
    pub fn answered(&self) {
        self.answering.store(false, Ordering::Relaxed);
    }

    /// Marks the connection for a 408 when its stream is dropped.
    pub fn expire(&self) {
        self.expired.store(true, Ordering::Relaxed);
    }

    pub fn turn_off(&self) {
        self.off.store(true, Ordering::Relaxed);
    }

    /// Whether the connection opened with the h2 preface.
    pub fn is_h2(&self) -> bool {
        self.h2.load(Ordering::Relaxed)
    }

    /// Whether its opening showed it is HTTP/1.
    pub fn is_http1(&self) -> bool {
        self.http1.load(Ordering::Relaxed)
    }

    /// Resolves once a head has been in progress for `limit`.
    pub async fn overdue(&self, limit: Duration) {
        loop {
            let since = self.since.load(Ordering::Relaxed);
            let wait = if self.off.load(Ordering::Relaxed) || since == 0 {
                limit
            } else {
                let elapsed = Duration::from_nanos(self.now() - since);
                if elapsed >= limit {
                    return;
                }
                limit - elapsed
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// The client's stream, telling the clock when bytes arrive. It writes the
/// 408 itself as it is dropped, because hyper, waiting for a head, holds
/// the stream and writes nothing (a second fd per connection just for this
/// would halve how many connections fit under the fd limit).
pub struct Watched {
    inner: TcpStream,
    clock: Arc<HeadClock>,
    opening: Opening,
}

/// How far a connection's opening is known.
enum Opening {
    /// Its first bytes: are they the h2 preface, and how long is the
    /// SETTINGS frame after it?
    Sniffing(Vec<u8>),
    /// h2: bytes of the first SETTINGS frame still to come.
    Settings(usize),
    /// HTTP/1, or h2 with its opening in.
    Known,
}

/// The h2 client preface (RFC 9113 §3.4); a SETTINGS frame must follow.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame header: 24-bit length, type, flags, stream id.
const FRAME_HEADER: usize = 9;

impl Watched {
    pub fn new(inner: TcpStream, clock: Arc<HeadClock>) -> Watched {
        Watched {
            inner,
            clock,
            opening: Opening::Sniffing(Vec::new()),
        }
    }

    /// Follows the opening bytes: an HTTP/1 connection is left to the clock
    /// at once; an h2 one is let go of once its preface and first SETTINGS
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
                        self.clock.http1.store(true, Ordering::Relaxed);
                        Opening::Known
                    } else if seen.len() < want {
                        if seen.len() >= PREFACE.len() {
                            self.clock.h2.store(true, Ordering::Relaxed);
                        }
                        return;
                    } else {
                        self.clock.h2.store(true, Ordering::Relaxed);
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
                    self.clock.turn_off();
                    Opening::Known
                }
            };
            self.opening = next;
        }
        if let Opening::Settings(0) = self.opening {
            self.clock.turn_off();
            self.opening = Opening::Known;
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.clock.expired.load(Ordering::Relaxed) && !self.clock.is_h2() {
            // Best effort: 75 bytes fit an empty send buffer; a client that
            // stopped reading gets the close alone.
            let _ = self.inner.try_write(TIMEOUT_RESPONSE);
            let _ = socket2::SockRef::from(&self.inner).shutdown(std::net::Shutdown::Write);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.bytes_read();
            if !matches!(self.opening, Opening::Known) {
                let fresh = buf.filled()[before..].to_vec();
                self.follow_opening(&fresh);
            }
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
