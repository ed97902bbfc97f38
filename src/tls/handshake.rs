//! The TLS handshake of an accepted connection: bounded by
//! `handshake_timeout` (a client that never finishes holds its place in
//! `max_connections` no longer), and counted as full, resumed or failed.

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
    /// Failed or too slow (logged and counted).
    Failed,
}

/// Why a handshake did not begin, or failed.
enum Refused {
    PlainHttp(TcpStream),
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
    /// counts as a failed handshake too.
    pub async fn handshake(&self, stream: TcpStream, peer: SocketAddr) -> Handshake {
        let (cause, ended) = match tokio::time::timeout(self.timeout, self.begin(stream)).await {
            Ok(Ok(tls)) => {
                let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
                self.metrics.completed(resumed);
                return Handshake::Done(Box::new(tls));
            }
            Ok(Err(Refused::PlainHttp(stream))) => (
                "a plain HTTP request".to_string(),
                Handshake::PlainHttp(stream),
            ),
            Ok(Err(Refused::Tls(err))) => (err.to_string(), Handshake::Failed),
            Err(_) => (
                format!("no handshake within {:?}", self.timeout),
                Handshake::Failed,
            ),
        };
        self.metrics.failed.increment(1);
        if crate::telemetry::client_fault() {
            tracing::info!(listener = %self.listener, client = %peer, %cause, "TLS handshake failed");
        }
        ended
    }

    async fn begin(&self, stream: TcpStream) -> Result<TlsStream<TcpStream>, Refused> {
        if self.answers_plain_http && speaks_plain_text(&stream).await {
            return Err(Refused::PlainHttp(stream));
        }
        self.acceptor.accept(stream).await.map_err(Refused::Tls)
    }
}

/// Whether the client's first byte is an ASCII capital, as an HTTP
/// method's is: a TLS record's never is (a handshake record begins 0x16,
/// an SSLv2-style hello with its top bit set). Peeked, so the handshake
/// reads it again: one more system call a TLS connection, against the
/// handshake's hundreds of microseconds of CPU.
async fn speaks_plain_text(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(stream.peek(&mut first).await, Ok(1)) && first[0].is_ascii_uppercase()
}
