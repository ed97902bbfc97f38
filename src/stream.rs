//! What a connection's bytes travel on: plain TCP, or TLS over it, a
//! client's or a backend's. The HTTP/1 path, h2, TCP mode and backend
//! connections are written once against this trait (it sits below both
//! `proxy` and `backend`, so neither imports the other); each
//! kind of stream says how it is split for an exchange's upload and
//! download side by side, how to wait for bytes without holding a read
//! buffer, and which TCP socket lies under it.

use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type Reader<'a>: AsyncRead + Unpin + Send
    where
        Self: 'a;
    type Writer<'a>: AsyncWrite + Unpin + Send
    where
        Self: 'a;

    /// The reading and writing halves, both usable at once.
    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>);

    /// Resolves once a read would not wait (bytes, EOF or an error), so an
    /// idle connection waits holding no buffer.
    fn readable(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// The TCP socket under the stream.
    fn tcp(&self) -> &TcpStream;

    /// The plain TCP stream itself, when no layer sits between its bytes
    /// and the client's: TCP mode then copies with the kernel's readiness
    /// and no buffer held while idle.
    fn plain(&mut self) -> Option<&mut TcpStream>;

    /// The protocol the client's TLS handshake agreed on (ALPN), if any.
    fn alpn(&self) -> Option<&[u8]> {
        None
    }

    /// The name the client's TLS handshake asked for (SNI), if any.
    fn server_name(&self) -> Option<&str> {
        None
    }

    /// The certificate (DER) the client's TLS handshake presented, which
    /// the listener's `client_ca` verified, if any.
    fn client_certificate(&self) -> Option<&[u8]> {
        None
    }

    /// The TLS version the client's handshake agreed on (`TLSv1.3`, as
    /// OpenSSL names it), if the client speaks TLS.
    fn tls_version(&self) -> Option<&'static str> {
        None
    }

    /// The client's TLS handshake resumed an earlier session.
    fn resumed(&self) -> bool {
        false
    }
}

impl ByteStream for TcpStream {
    type Reader<'a> = ReadHalf<'a>;
    type Writer<'a> = WriteHalf<'a>;

    fn halves(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        self.split()
    }

    fn readable(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        read_ready(self)
    }

    fn tcp(&self) -> &TcpStream {
        self
    }

    fn plain(&mut self) -> Option<&mut TcpStream> {
        Some(self)
    }
}

/// Resolves once a TLS session has something to read: decrypted bytes
/// rustls already holds (or the peer's close) at once, else the socket's
/// readiness.
pub async fn session_readable<D>(
    tcp: &TcpStream,
    session: &mut rustls::ConnectionCommon<D>,
) -> io::Result<()> {
    let pending = session
        .process_new_packets()
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))?;
    if pending.plaintext_bytes_to_read() > 0 || pending.peer_has_closed() {
        return Ok(());
    }
    read_ready(tcp).await
}

/// Resolves once `tcp` has bytes, EOF or an error for a read. Through
/// `poll_read_ready`, which parks the task in the socket's one reader slot,
/// as a read does; `TcpStream::readable` queues a waiter under a lock
/// instead, a cost paid on every wait for the next request or burst (a
/// task reads each socket in one place at a time, so one slot is enough).
pub fn read_ready(tcp: &TcpStream) -> impl Future<Output = io::Result<()>> + Send + '_ {
    std::future::poll_fn(|cx| tcp.poll_read_ready(cx))
}

/// A TLS session shares one state for both directions, so its halves are
/// tokio's locked split (uncontended: one task drives both).
///
/// Boxed: a session is over a kilobyte, and a connection's task would
/// otherwise carry it inline in each of the nested futures it passes
/// through (measured: 17.8 KiB per idle TLS connection's task unboxed).
impl ByteStream for Box<TlsStream<TcpStream>> {
    type Reader<'a> = tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>;
    type Writer<'a> = tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>;

    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>) {
        tokio::io::split(self.as_mut())
    }

    /// Decrypted bytes rustls already holds are ready now; otherwise the
    /// socket must have some.
    async fn readable(&mut self) -> io::Result<()> {
        let (tcp, session) = self.get_mut();
        session_readable(tcp, session).await
    }

    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }

    fn plain(&mut self) -> Option<&mut TcpStream> {
        None
    }

    fn alpn(&self) -> Option<&[u8]> {
        self.get_ref().1.alpn_protocol()
    }

    fn server_name(&self) -> Option<&str> {
        self.get_ref().1.server_name()
    }

    /// The leaf of the chain the client presented (rustls keeps it through
    /// a resumption, sealed in the ticket).
    fn client_certificate(&self) -> Option<&[u8]> {
        let chain = self.get_ref().1.peer_certificates()?;
        chain.first().map(|leaf| leaf.as_ref())
    }

    fn tls_version(&self) -> Option<&'static str> {
        match self.get_ref().1.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_3 => Some("TLSv1.3"),
            rustls::ProtocolVersion::TLSv1_2 => Some("TLSv1.2"),
            _ => None,
        }
    }

    fn resumed(&self) -> bool {
        self.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    }
}

/// Whether the reactor has seen nothing come on `stream` since a read
/// last drained it (a read that came up short clears tokio's readiness),
/// asked without a syscall. `false` says only "ask the kernel": bytes or
/// an EOF came, or the readiness a full read left standing may be stale,
/// or the task is out of its scheduling budget (tokio then answers
/// "pending" whatever the readiness, which must not pass for "nothing").
/// What came since the reactor last looked is not seen: it looks at every
/// wait, and on a busy worker every few dozen task polls.
pub fn reactor_saw_nothing(stream: &TcpStream) -> bool {
    if !tokio::task::coop::has_budget_remaining() {
        return false;
    }
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    stream.poll_read_ready(&mut cx).is_pending()
}

/// Runs `check` with the task's scheduling budget spent (by ready answers
/// on `ready`, a socket with bytes waiting): whether it was spent, and
/// what `check` said.
#[cfg(test)]
pub async fn out_of_budget<T>(ready: &TcpStream, check: impl Fn() -> T) -> (bool, T) {
    std::future::poll_fn(|cx| {
        // Each ready answer spends a unit of the task's budget.
        for _ in 0..1000 {
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
            let _ = ready.poll_read_ready(cx);
        }
        let spent = !tokio::task::coop::has_budget_remaining();
        std::task::Poll::Ready((spent, check()))
    })
    .await
}
