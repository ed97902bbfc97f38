//! The TLS handshake of an accepted connection: bounded by
//! `handshake_timeout` (a client that never finishes holds its place in
//! `max_connections` no longer), and counted as full, resumed, failed, or
//! aborted (closed before the client sent a byte).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::HandshakeKind;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::metrics::{self, TlsMetrics};

/// Terminates TLS for one listener.
pub struct Terminator {
    acceptor: TlsAcceptor,
    timeout: Duration,
    listener: Arc<str>,
    metrics: TlsMetrics,
    /// An HTTP listener's: a client that speaks plain HTTP to it is handed
    /// back for an answer it can read.
    answers_plain_http: bool,
}

/// How a handshake ended.
pub enum Handshake {
    /// The client's decrypted stream (boxed: see its `ByteStream` impl).
    Done(Box<TlsStream<TcpStream>>),
    /// The client sent plain HTTP (an `http://` URL with this port): its
    /// connection, untouched, for a 400 that says so where a TLS alert
    /// would reach it as garbage (nginx's "The plain HTTP request was sent
    /// to HTTPS port").
    PlainHttp(TcpStream),
    /// Failed or too slow (logged and counted), or closed before a byte.
    Failed(Failure),
    /// Silent until `idle_until` came (a drain's grace): closed quietly,
    /// as an idle keep-alive connection is.
    Idle,
}

/// Why a handshake failed, as the access log tells it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Closed before a byte (a balancer's TCP check).
    Silent,
    /// Not done within `handshake_timeout`.
    Slow,
    /// Refused: a TLS error, a lapsed client certificate.
    Refused,
}

/// Why a handshake did not begin, or failed.
enum Refused {
    PlainHttp(TcpStream),
    /// A PROXY protocol header (v1 or v2) where the listener expects none:
    /// a balancer in front sends one (HAProxy's `send-proxy`, an AWS NLB's
    /// proxy protocol) and the listener lacks `proxy_protocol`. Said so:
    /// v1's `PROXY` read as a plain HTTP request, v2's as a broken record.
    ProxyHeader,
    /// Closed (or reset) before the client sent a byte: a balancer's TCP
    /// check, a port scan. Counted apart, not logged: counted as failed
    /// handshakes, they read as a failure rate that climbs all day.
    Silent,
    /// Nothing came before the caller's `idle_until`.
    Idle,
    Tls(std::io::Error),
}

impl Terminator {
    pub fn new(
        listener: &str,
        config: Arc<rustls::ServerConfig>,
        timeout: Duration,
        answers_plain_http: bool,
    ) -> Terminator {
        Terminator {
            acceptor: TlsAcceptor::from(config),
            timeout,
            listener: Arc::from(listener),
            metrics: metrics::tls(listener),
            answers_plain_http,
        }
    }

    /// The handshake, within `handshake_timeout`; a plain HTTP client
    /// counts as a failed handshake too. A client that has sent nothing
    /// when `idle_until` resolves (a drain's grace: it would hold the
    /// drain to `handshake_timeout`, or to its deadline) is closed as idle.
    pub async fn handshake(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        idle_until: impl std::future::Future<Output = ()>,
    ) -> Handshake {
        let begun = self.begin(stream, idle_until);
        let (cause, ended) = match tokio::time::timeout(self.timeout, begun).await {
            Ok(Ok(tls)) => {
                let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
                match resumed.then(|| lapsed_client_certificate(&tls)).flatten() {
                    None => {
                        self.metrics.completed(resumed);
                        return Handshake::Done(Box::new(tls));
                    }
                    Some(lapsed) => (lapsed, Handshake::Failed(Failure::Refused)),
                }
            }
            Ok(Err(Refused::PlainHttp(stream))) => (
                "a plain HTTP request".to_string(),
                Handshake::PlainHttp(stream),
            ),
            Ok(Err(Refused::ProxyHeader)) => (
                "a PROXY protocol header, which this listener does not expect: if a balancer in front sends one, set its `proxy_protocol`".to_string(),
                Handshake::Failed(Failure::Refused),
            ),
            Ok(Err(Refused::Silent)) => {
                self.metrics.aborted.increment(1);
                return Handshake::Failed(Failure::Silent);
            }
            Ok(Err(Refused::Idle)) => return Handshake::Idle,
            Ok(Err(Refused::Tls(err))) => (err.to_string(), Handshake::Failed(Failure::Refused)),
            Err(_) => (
                format!("no handshake within {:?}", self.timeout),
                Handshake::Failed(Failure::Slow),
            ),
        };
        self.metrics.failed.increment(1);
        if crate::telemetry::may_say_client_fault() {
            tracing::info!(listener = %self.listener, client = %peer, %cause, "TLS handshake failed");
        }
        ended
    }

    async fn begin(
        &self,
        stream: TcpStream,
        idle_until: impl std::future::Future<Output = ()>,
    ) -> Result<TlsStream<TcpStream>, Refused> {
        let first = tokio::select! {
            // A byte that came wins over a grace that ran out with it.
            biased;
            first = first_byte(&stream) => first.map_err(Refused::Tls)?,
            () = idle_until => return Err(Refused::Idle),
        };
        let Some(first) = first else {
            return Err(Refused::Silent);
        };
        if proxy_header_begins(&stream, first).await {
            return Err(Refused::ProxyHeader);
        }
        // An ASCII capital begins an HTTP method; a TLS record never does
        // (a handshake record begins 0x16, an SSLv2-style hello has its
        // top bit set).
        if self.answers_plain_http && first.is_ascii_uppercase() {
            return Err(Refused::PlainHttp(stream));
        }
        self.acceptor.accept(stream).await.map_err(Refused::Tls)
    }
}

/// Why a resumed session's client certificate holds no more, if it does
/// not. Such a session is refused before it resumes (`tls::session`); this
/// stands behind that, should rustls' encoding of a session ever change
/// under it.
fn lapsed_client_certificate(tls: &TlsStream<TcpStream>) -> Option<String> {
    let leaf = tls.get_ref().1.peer_certificates()?.first()?;
    let now = crate::tls::unix_seconds(std::time::SystemTime::now());
    crate::tls::certs::leaf_lapsed(leaf, now)
        .map(|why| format!("a resumed session's client certificate {why}"))
}

/// PROXY protocol v2's signature. (Written again here: `proxy_protocol`
/// reads a certificate's name through this module, which therefore may
/// not import it back.)
const PROXY_V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// Whether what the client sent first is a PROXY protocol header (v1's
/// `PROXY `, v2's signature): looked at (peeked) only when its first byte
/// could begin one. One peek, of what came: a header in pieces shorter
/// than its first 6 (v1) or 12 (v2) bytes is not named (it is refused all
/// the same, only said to be something else in the log).
async fn proxy_header_begins(stream: &TcpStream, first: u8) -> bool {
    if first != b'P' && first != PROXY_V2_SIGNATURE[0] {
        return false;
    }
    let mut start = [0u8; 12];
    let Ok(seen) = stream.peek(&mut start).await else {
        return false;
    };
    let start = &start[..seen];
    start.starts_with(b"PROXY ") || start == PROXY_V2_SIGNATURE
}

/// The client's first byte, once it came; none if the connection closed
/// or was reset first (any other error is the handshake's to report).
/// Peeked, so the handshake reads it again: one more system call a TLS
/// connection, against the handshake's hundreds of microseconds of CPU.
async fn first_byte(stream: &TcpStream) -> Result<Option<u8>, std::io::Error> {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset};
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(first[0])),
        Err(err) if matches!(err.kind(), ConnectionReset | ConnectionAborted) => Ok(None),
        Err(err) => Err(err),
    }
}
