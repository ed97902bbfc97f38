//! L4 proxying: pick a backend, connect within `connect_timeout` (one retry
//! on another backend when the connect fails: nothing was sent yet), then
//! copy both ways until both sides are done. `copy_bidirectional` forwards a
//! FIN as a write shutdown, so a half-closed client still gets its reply.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::backend::{Lease, Pool};
use crate::metrics;

pub struct TcpProxy {
    pub listener: Arc<str>,
    pub pool: Arc<Pool>,
    pub connect_timeout: Duration,
}

impl TcpProxy {
    pub async fn serve(&self, mut client: TcpStream, peer: SocketAddr) {
        let Some((mut upstream, lease)) = self.connect().await else {
            if self.pool.healthy_count() == 0 {
                metrics::no_backend(&self.listener, &self.pool.name);
            }
            tracing::info!(listener = %self.listener, client = %peer, pool = %self.pool.name, "no backend reachable; closing");
            return;
        };
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((to_backend, to_client)) => {
                metrics::tcp_bytes(&self.listener, to_backend, to_client)
            }
            Err(err) => {
                tracing::debug!(listener = %self.listener, backend = %lease.backend().name, cause = %err, "tcp stream ended with an error")
            }
        }
    }

    async fn connect(&self) -> Option<(TcpStream, Lease)> {
        let mut failed = None;
        for _ in 0..2 {
            // No backend up: the connection is closed at once.
            let lease = self.pool.pick(failed)?;
            let backend = lease.backend();
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(backend.address))
                .await
            {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Some((stream, lease));
                }
                Ok(Err(err)) => {
                    tracing::warn!(backend = %backend.name, address = %backend.address, cause = %err, "backend connect failed");
                    backend.observe_passive_failure(&err.to_string());
                    metrics::upstream_error(
                        &backend.pool,
                        &backend.name,
                        metrics::UpstreamErrorKind::Connect,
                    );
                }
                Err(_) => {
                    tracing::warn!(backend = %backend.name, address = %backend.address, "backend connect timed out");
                    backend.observe_passive_failure("connect timed out");
                    metrics::upstream_error(
                        &backend.pool,
                        &backend.name,
                        metrics::UpstreamErrorKind::Timeout,
                    );
                }
            }
            failed = Some(backend.index);
        }
        None
    }
}
