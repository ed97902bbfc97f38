//! Reading into and writing from the buffers of one exchange. A read
//! buffer is taken when bytes arrive and given back when it empties, so an
//! idle keep-alive connection holds its socket and no buffer; given-back
//! buffers wait in a small per-thread stock for the next request, which
//! spares an allocation per read. A write that makes no progress for the
//! stall limit ends the connection: the peer stopped taking bytes.
//!
//! Reads go through tokio's `poll_read`, which marks a socket drained when
//! a read comes back short: the next wait goes straight to the reactor
//! instead of a read that would only say EAGAIN (a third of the syscalls of
//! a small exchange).

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::lifecycle::drain::DrainWatch;

/// Room made in a read buffer before each read.
const READ_CHUNK: usize = 16 * 1024;

/// Spare read buffers kept per thread, at most (2 to 4 MiB: 16 KiB each,
/// or up to 32 KiB for one a burst grew): each h2c stream
/// waiting for its backend holds one, and a client may keep dozens of
/// streams in flight on each connection.
const SPARES: usize = 128;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// Makes room in `buf` for a read, taking a spare buffer if it has none.
fn room(buf: &mut BytesMut) {
    if buf.capacity() == 0 {
        *buf = SPARE
            .with(|s| s.borrow_mut().pop())
            .unwrap_or_else(|| BytesMut::with_capacity(READ_CHUNK));
    }
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// Has the kernel acknowledge the client's bytes at once again, as baton
/// waits for more of a request: a plain HTTP listener delays its ACKs
/// until the answer (`listener::Acks::WithAnswer`), and a client holding
/// its next bytes until the last are acknowledged (Nagle) would wait for
/// the delayed ACK, 40 ms. The kernel turns back to delaying by itself
/// once baton answers.
pub fn ack_promptly<S: crate::stream::ByteStream>(stream: &S) {
    let _ = socket2::SockRef::from(stream.tcp()).set_tcp_quickack(true);
}

/// Reads what is there into `buf`; `Ok(0)` at EOF.
pub async fn read_some<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> io::Result<usize> {
    room(buf);
    r.read_buf(buf).await
}

/// `read_some` for a reader polled by hand (an h2 stream's response body).
pub fn poll_read_some<R: AsyncRead + Unpin>(
    r: &mut R,
    cx: &mut std::task::Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    room(buf);
    tokio_util::io::poll_read_buf(Pin::new(r), cx, buf)
}

/// Reads what `stream` has now, without waiting: `None` if nothing (its
/// readiness was stale), `Some(0)` at EOF.
pub async fn read_now<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> io::Result<Option<usize>> {
    room(buf);
    let read = std::future::poll_fn(|cx| {
        match tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, buf) {
            Poll::Ready(r) => Poll::Ready(r.map(Some)),
            Poll::Pending => Poll::Ready(Ok(None)),
        }
    })
    .await;
    release_if_empty(buf);
    read
}

/// Reads what `r` has into `buf`, taking a spare buffer only for a read
/// that finds bytes: while it waits `buf` holds none, so a stream that
/// waits for long (an idle tunnel) holds no block. `Ok(0)` at EOF.
pub async fn read_lent<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> io::Result<usize> {
    std::future::poll_fn(|cx| {
        let read = poll_read_some(r, cx, buf);
        if !matches!(read, Poll::Ready(Ok(n)) if n > 0) {
            release_if_empty(buf);
        }
        read
    })
    .await
}

/// Copies `from` to `to` until `from` ends: a chunk read (into a lent
/// buffer, `read_lent`: an idle tunnel holds none), then written and
/// flushed whole before the next read. A read that fails (the side reset)
/// so leaves nothing of what that side sent before it held here or in a
/// TLS session (which takes a write before the socket does): the reset
/// that follows (`reset::once_taken`, which sees only the socket's queue)
/// lands after all of it. `tokio::io::copy` read ahead while a slow reader
/// held its write, and dropped its buffer at the error, up to 8 KiB and
/// what the session held; and it held its 8 KiB for the tunnel's life.
pub async fn relay<R, W>(from: &mut R, to: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::new();
    loop {
        if read_lent(from, &mut buf).await? == 0 {
            return Ok(());
        }
        to.write_all(&buf).await?;
        to.flush().await?;
        buf.clear();
        release_if_empty(&mut buf);
    }
}

/// How long a close reads what its client still sends: each wait for
/// more, and all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linger {
    /// The client may still be sending: a request body left unread (an
    /// answer came before it, a 413 or 401, or baton's own error page), a
    /// pipelined request, a body behind a head refused for what it asks.
    /// Long enough for a client that reads only once it wrote its whole
    /// upload (nginx's `lingering_timeout` 5 s and `lingering_time` 30 s).
    /// No cap on bytes: a cap closed over an upload still coming, a reset,
    /// and the answer lost with it.
    Upload,
    /// Anything else (an idle connection's close, a malformed head's, a
    /// slow client's): a moment for a request that crossed the close. The
    /// place a connection holds in `max_connections` is held no longer for
    /// a client that trickles.
    Brief,
}

impl Linger {
    fn limits(self) -> (Duration, Duration) {
        match self {
            Linger::Upload => (Duration::from_secs(5), Duration::from_secs(30)),
            Linger::Brief => (Duration::from_secs(1), Duration::from_secs(1)),
        }
    }
}

/// How long a close lingers once the generation drains: the linger runs
/// within the drain, whose deadline would count it forced (a client that
/// keeps sending would hold a stop to its budget).
const LINGER_IN_DRAIN: Duration = Duration::from_secs(1);

/// How long a TLS stream's shutdown may take to send what it holds.
const SHUTDOWN_TIME: Duration = Duration::from_secs(1);

/// Closes a client connection gracefully: the write side first, then
/// what the client still sends is read and dropped, because closing a
/// socket with unread bytes makes the kernel send a reset, which can
/// destroy a response the client has not read yet (a pipelined request
/// during a drain, an upload answered early). nginx's `lingering_close`
/// does the same.
pub async fn linger_close<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    linger: Linger,
    drain: &DrainWatch,
) {
    // Bounded too: a TLS stream's shutdown sends close_notify after every
    // record still buffered, and waits for good on a client that stopped
    // reading (a plain socket's returns at once).
    if !matches!(
        tokio::time::timeout(SHUTDOWN_TIME, stream.shutdown()).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let (wait, time) = linger.limits();
    // Read into a lent buffer: connections closed by the thousand (idle
    // ones at their timeout, or at a drain's grace) hold none while they
    // wait for a client that sends nothing.
    let mut sink = BytesMut::new();
    let dropping = tokio::time::timeout(time, async {
        while let Ok(Ok(1..)) = tokio::time::timeout(wait, read_lent(stream, &mut sink)).await {
            sink.clear();
        }
    });
    tokio::select! {
        _ = dropping => {}
        () = drain.grace_over(LINGER_IN_DRAIN) => {}
    }
    release_if_empty(&mut sink);
}

/// Gives a buffer that holds nothing back to this thread's spares.
pub fn release_if_empty(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > 0 {
        let mut spare = std::mem::take(buf);
        // Bytes taken from its front (`take_bytes`) shrank what it says it
        // holds; the block is whole again once nothing else shares it.
        // (Still shared: it is kept or not by its size below.)
        let _ = spare.try_reclaim(READ_CHUNK);
        // Only ordinary sizes are kept: a buffer a pipelining client grew
        // would otherwise sit in the stock for good.
        if (READ_CHUNK / 2..=READ_CHUNK * 2).contains(&spare.capacity()) {
            SPARE.with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < SPARES {
                    s.push(spare);
                }
            });
        }
    }
}

/// Frames up to this size are copied out of a read buffer.
const COPY_UNDER: usize = 4 * 1024;

/// The first `n` bytes of `buf`, taken as `Bytes` for a frame: a copy when
/// small, so the buffer stays whole and can go back to the spares (a split
/// shares the buffer's block until the frame is dropped, and an h2c stream
/// then took a new 16 KiB block for every response); a split when large,
/// where a copy would cost more than a block.
pub fn take_bytes(buf: &mut BytesMut, n: usize) -> bytes::Bytes {
    if n < COPY_UNDER {
        let taken = bytes::Bytes::copy_from_slice(&buf[..n]);
        buf.advance(n);
        taken
    } else {
        buf.split_to(n).freeze()
    }
}

/// Why bytes did not go out.
#[derive(Debug)]
pub enum WriteFault {
    /// The peer took nothing for the stall limit.
    Stalled,
    Failed(io::Error),
}

/// Writes all of `data` out; each write must make progress within
/// `stall`, and the flush that ends it must be over within `stall`. A
/// write the socket takes at once arms no timer (the usual case). The
/// flush is what sends the end of it over TLS: a TLS stream's write takes
/// the bytes into its session and returns, with up to 64 KiB of records
/// still held there when the socket was full, which nothing would send
/// until the next write (so the last bytes of a response to a client that
/// reads slower than the backend sends waited for its next request, or
/// for `idle_timeout`). A plain socket's flush does nothing.
pub async fn write_all<W: AsyncWrite + Unpin>(
    w: &mut W,
    data: &[u8],
    stall: Duration,
) -> Result<(), WriteFault> {
    write_each(w, data, stall).await?;
    let now = std::future::poll_fn(|cx| match Pin::new(&mut *w).poll_flush(cx) {
        Poll::Ready(r) => Poll::Ready(Some(r)),
        Poll::Pending => Poll::Ready(None),
    })
    .await;
    let flushed = match now {
        Some(r) => Ok(r),
        None => tokio::time::timeout(stall, w.flush()).await,
    };
    match flushed {
        Err(_) => Err(WriteFault::Stalled),
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(WriteFault::Failed(e)),
    }
}

/// Hands all of `data` to `w`; each write must make progress within
/// `stall`.
async fn write_each<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut data: &[u8],
    stall: Duration,
) -> Result<(), WriteFault> {
    while !data.is_empty() {
        let now = std::future::poll_fn(|cx| match Pin::new(&mut *w).poll_write(cx, data) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        let written = match now {
            Some(r) => Ok(r),
            None => tokio::time::timeout(stall, w.write(data)).await,
        };
        match written {
            Err(_) => return Err(WriteFault::Stalled),
            Ok(Ok(0)) => {
                return Err(WriteFault::Failed(io::ErrorKind::WriteZero.into()));
            }
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(WriteFault::Failed(e)),
        }
    }
    Ok(())
}

/// Where a [`Counting`] writer adds what it wrote.
pub trait Tally {
    fn add(&self, bytes: u64);
}

impl Tally for std::sync::atomic::AtomicU64 {
    fn add(&self, bytes: u64) {
        self.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A writer that adds what it writes to `count` (the access log's bytes
/// out), whatever writes through it.
pub struct Counting<'a, W, T: ?Sized = std::sync::atomic::AtomicU64> {
    inner: W,
    count: &'a T,
}

impl<'a, W, T: Tally + ?Sized> Counting<'a, W, T> {
    pub fn new(inner: W, count: &'a T) -> Self {
        Counting { inner, count }
    }
}

/// Reads pass through uncounted: a tunnel's client is both read and
/// written through one `Counting`.
impl<W: AsyncRead + Unpin, T: ?Sized> AsyncRead for Counting<'_, W, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<W: AsyncWrite + Unpin, T: Tally + ?Sized> AsyncWrite for Counting<'_, W, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &polled {
            self.count.add(*n as u64);
        }
        polled
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_frame_is_copied_and_leaves_the_buffer_reusable() {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        buf.extend_from_slice(b"hello, rest");
        let start = buf.as_ptr();
        let taken = take_bytes(&mut buf, 5);
        assert_eq!(&taken[..], b"hello");
        assert_ne!(taken.as_ptr(), start, "a copy");
        assert_eq!(&buf[..], b", rest");
        buf.clear();
        release_if_empty(&mut buf);
        assert_eq!(
            buf.capacity(),
            0,
            "the emptied buffer went back to the spares"
        );
        let mut again = BytesMut::new();
        room(&mut again);
        assert!(
            again.capacity() >= READ_CHUNK,
            "the spare is whole again, the bytes taken from its front reclaimed"
        );
    }

    /// Over TLS on a pipe that holds 1 KiB, what `write_all` wrote all
    /// reaches the reader though the writer does nothing more: without
    /// the flush, the session kept the end (up to 64 KiB) for good.
    #[tokio::test]
    async fn a_tls_write_leaves_nothing_in_the_session() {
        const SENT: usize = 300_000;
        let (server_io, client_io) = tokio::io::duplex(1024);
        let (mut server, mut client) =
            crate::tls::testing::session_pair(server_io, client_io).await;
        let writer = tokio::spawn(async move {
            let data = vec![7u8; SENT];
            let written = write_all(&mut server, &data, Duration::from_secs(10)).await;
            assert!(written.is_ok(), "{written:?}");
            // Held, never polled again: only what was sent gets out.
            std::future::pending::<()>().await;
            drop(server);
        });
        let got = crate::tls::testing::bytes_arriving(&mut client, SENT).await;
        writer.abort();
        assert_eq!(got, SENT, "{got} of {SENT} bytes arrived");
    }

    #[test]
    fn a_large_frame_is_split_off_without_a_copy() {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        buf.extend_from_slice(&vec![7u8; COPY_UNDER + 10]);
        let start = buf.as_ptr();
        let taken = take_bytes(&mut buf, COPY_UNDER);
        assert_eq!(taken.as_ptr(), start, "the frame is the buffer's own bytes");
        assert_eq!(taken.len(), COPY_UNDER);
        assert_eq!(buf.len(), 10);
    }
}
