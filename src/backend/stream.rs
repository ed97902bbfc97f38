//! A connection to a backend: plain TCP, or TLS over it when the pool has
//! `tls`. Every way to a backend (HTTP/1 exchanges and h2 streams on the
//! same upstream, TCP mode, health checks) connects here, so a pool's TLS
//! is one setting, not four.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use std::net::SocketAddr;

use super::Backend;
use crate::stream::{session_readable, ByteStream};
use crate::tls::upstream::UpstreamTls;

/// A backend connection: plain TCP, or a TLS session over it.
pub type BackendStream = Link<TcpStream, Box<TlsStream<TcpStream>>>;

/// Why a connection to a backend was not made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectFault {
    #[error("no connection within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Refused(io::Error),
    /// baton ran short itself (fds, memory): not the backend's fault.
    #[error("{0} (baton's own shortage)")]
    Shortage(io::Error),
    /// Its text may hold the certificate's names, which the backend chose.
    #[error("TLS handshake: {}", crate::telemetry::printable(&.0.to_string()))]
    Handshake(io::Error),
}

impl Backend {
    /// Connects (and handshakes, for a TLS pool) within `limit`, for a
    /// client: `proxy_header` is its PROXY header when the pool sends one.
    pub async fn connect(
        &self,
        limit: Duration,
        proxy_header: Option<&[u8]>,
    ) -> Result<BackendStream, ConnectFault> {
        let tls = self.tls.as_deref().map(|tls| (tls, self.tls_host()));
        connect(self.address, tls, limit, proxy_header).await
    }

    /// The name a TLS member given by DNS is verified against, and tells
    /// by SNI, where its pool names none: the host it was resolved from,
    /// as nginx's `proxy_ssl_name` is the proxied host. Its address would
    /// be in no certificate of a host that has a name, and an SRV record's
    /// targets are hosts no one `server_name` could name.
    fn tls_host(&self) -> Option<&str> {
        let from = self.resolved_from.as_deref()?;
        let host = from.rsplit_once(':').map_or(from, |(host, _port)| host);
        Some(host.trim_end_matches('.'))
    }

    /// Connects on baton's own behalf (a health check): a pool that sends
    /// PROXY headers gets one that names no client.
    pub async fn connect_own(&self, limit: Duration) -> Result<BackendStream, ConnectFault> {
        let header = self.send_proxy.map(crate::proxy_protocol::send::local);
        self.connect(limit, header.as_deref()).await
    }
}

/// Connects to `address` (and handshakes, with `tls`: its settings and the
/// host DNS gave the address for, if it did) within `limit`. A
/// PROXY header goes first, before any TLS: it is for the backend's TCP
/// layer, as the one baton receives is for its own.
pub async fn connect(
    address: SocketAddr,
    tls: Option<(&UpstreamTls, Option<&str>)>,
    limit: Duration,
    proxy_header: Option<&[u8]>,
) -> Result<BackendStream, ConnectFault> {
    let connecting = async {
        let mut tcp = TcpStream::connect(address).await.map_err(|err| {
            if crate::shortage::is_own(&err) || crate::shortage::no_local_port(&err, address) {
                crate::metrics::shortage(crate::metrics::Shortage::Connect);
                ConnectFault::Shortage(err)
            } else {
                ConnectFault::Refused(err)
            }
        })?;
        let _ = tcp.set_nodelay(true);
        if let Some(header) = proxy_header {
            tcp.write_all(header).await.map_err(ConnectFault::Refused)?;
        }
        match tls {
            None => Ok(Link::Plain(tcp)),
            // Boxed: a plain connect's callers do not carry a handshake's
            // state (a rustls session) in their own futures.
            Some((tls, host)) => Box::pin(tls.connect(tcp, address, host))
                .await
                .map(|s| Link::Tls(Box::new(s)))
                .map_err(ConnectFault::Handshake),
        }
    };
    tokio::time::timeout(limit, connecting)
        .await
        .map_err(|_| ConnectFault::Timeout(limit))?
}

/// Plain or TLS: a backend stream, or one half of it split for an
/// exchange's two directions (TCP's own halves, or tokio's locked split
/// of a TLS session).
pub enum Link<P, T> {
    Plain(P),
    Tls(T),
}

/// Whether a connection that ended its exchange holds nothing the backend
/// sent past it, above the socket: a TLS session may hold decrypted bytes
/// a read did not take (more than its buffer had room for), or a
/// close_notify read with the last records, which a look at the socket
/// (`idle::still_open`) cannot see. Such a connection must not serve
/// another request: the bytes would be read as that request's response.
pub fn holds_nothing_back(stream: &mut BackendStream) -> bool {
    match stream {
        Link::Plain(_) => true,
        Link::Tls(s) => s
            .get_mut()
            .1
            .process_new_packets()
            .is_ok_and(|state| state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed()),
    }
}

type TlsRead<'a> = tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>;
type TlsWrite<'a> = tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>;

impl<P: AsyncRead + Unpin, T: AsyncRead + Unpin> AsyncRead for Link<P, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(h) => Pin::new(h).poll_read(cx, buf),
            Link::Tls(h) => Pin::new(h).poll_read(cx, buf),
        }
    }
}

impl<P: AsyncWrite + Unpin, T: AsyncWrite + Unpin> AsyncWrite for Link<P, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(h) => Pin::new(h).poll_write(cx, data),
            Link::Tls(h) => Pin::new(h).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(h) => Pin::new(h).poll_flush(cx),
            Link::Tls(h) => Pin::new(h).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(h) => Pin::new(h).poll_shutdown(cx),
            Link::Tls(h) => Pin::new(h).poll_shutdown(cx),
        }
    }
}

impl ByteStream for BackendStream {
    type Reader<'a> = Link<tokio::net::tcp::ReadHalf<'a>, TlsRead<'a>>;
    type Writer<'a> = Link<tokio::net::tcp::WriteHalf<'a>, TlsWrite<'a>>;

    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>) {
        match self {
            Link::Plain(s) => {
                let (r, w) = s.split();
                (Link::Plain(r), Link::Plain(w))
            }
            Link::Tls(s) => {
                let (r, w) = tokio::io::split(s.as_mut());
                (Link::Tls(r), Link::Tls(w))
            }
        }
    }

    /// Decrypted bytes rustls already holds are ready now; otherwise the
    /// socket must have some.
    async fn readable(&mut self) -> io::Result<()> {
        match self {
            Link::Plain(s) => crate::stream::read_ready(s).await,
            Link::Tls(s) => {
                let (tcp, session) = s.get_mut();
                session_readable(tcp, session).await
            }
        }
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Tls(s) => s.get_ref().0,
        }
    }

    fn plain(&mut self) -> Option<&mut TcpStream> {
        match self {
            Link::Plain(s) => Some(s),
            Link::Tls(_) => None,
        }
    }
}

impl BackendStream {
    /// Closes a connection baton gives up on, a TLS one with its
    /// `close_notify` first, as nginx does: a TLS backend logs a close
    /// without one as a truncation ("unexpected eof", Java's "inbound
    /// closed before receiving peer's close_notify"). Best effort, never
    /// waiting: a kept connection's send buffer is empty, so the alert's
    /// few bytes (after any rustls still held) go at once; one given up on
    /// after an early answer, its upload cut off, may have no room for
    /// them, and closes without.
    pub fn close_quietly(self) {
        if let Link::Tls(mut s) = self {
            let (tcp, session) = s.get_mut();
            session.send_close_notify();
            let mut alert = Vec::new();
            if session.write_tls(&mut alert).is_ok() && !alert.is_empty() {
                let _ = tcp.try_write(&alert);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{holds_nothing_back, Link};

    /// Bytes a TLS backend sent past what a read took stay in the session,
    /// where the socket shows nothing: the connection is not kept for them.
    #[tokio::test]
    async fn a_tls_session_holding_bytes_is_not_kept() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (accepted, connected) =
            tokio::join!(listener.accept(), tokio::net::TcpStream::connect(addr));
        let (server_io, client_io) = (accepted.expect("accept").0, connected.expect("connect"));
        let (mut server, client) = crate::tls::testing::session_pair(server_io, client_io).await;
        let mut stream = Link::Tls(Box::new(client));
        assert!(holds_nothing_back(&mut stream), "a fresh session");
        server.write_all(b"abc").await.expect("send");
        server.flush().await.expect("flush");
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).await.expect("read");
        assert!(!holds_nothing_back(&mut stream), "two bytes held");
        let mut two = [0u8; 2];
        stream.read_exact(&mut two).await.expect("read the rest");
        assert!(holds_nothing_back(&mut stream), "all taken");
    }

    /// A certificate's names in a failed handshake reach a log line and
    /// `baton status`: a name holding a terminal's escape or a line break
    /// forges neither.
    #[test]
    fn a_handshake_fault_says_a_certificate_s_names_escaped() {
        let said =
            super::ConnectFault::Handshake(std::io::Error::other("valid for x\u{1b}[2J\nFORGED"));
        assert_eq!(
            said.to_string(),
            "TLS handshake: valid for x\\u{1b}[2J\\u{a}FORGED"
        );
    }
}
