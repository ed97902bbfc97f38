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
}

impl Terminator {
    pub fn new(listener: &str, config: Arc<rustls::ServerConfig>, timeout: Duration) -> Terminator {
        Terminator {
            acceptor: TlsAcceptor::from(config),
            timeout,
            listener: Arc::from(listener),
            metrics: metrics::tls(listener),
        }
    }

    /// The client's decrypted stream (boxed: see its `ByteStream` impl),
    /// or None (logged and counted) if the handshake failed or took longer
    /// than `handshake_timeout`.
    pub async fn handshake(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Option<Box<TlsStream<TcpStream>>> {
        let cause = match tokio::time::timeout(self.timeout, self.acceptor.accept(stream)).await {
            Ok(Ok(tls)) => {
                let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
                self.metrics.completed(resumed);
                return Some(Box::new(tls));
            }
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no handshake within {:?}", self.timeout),
        };
        self.metrics.failed.increment(1);
        if crate::telemetry::client_fault() {
            tracing::info!(listener = %self.listener, client = %peer, %cause, "TLS handshake failed");
        }
        None
    }
}
