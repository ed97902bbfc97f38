//! One client connection's frame: counted by the drain and in metrics while
//! it lives, then handed to the proxy for its protocol. What a connection
//! *does* lives in `proxy`; this only owns its bookkeeping.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::config::ListenerConfig;
use crate::lifecycle::drain::DrainWatch;
use crate::listener::Accept;
use crate::metrics::ListenerMetrics;
use crate::proxy::{http::HttpProxy, tcp::TcpProxy};

/// Open-connection count of one listener, read by `/status`.
#[derive(Default)]
pub struct ListenerStats {
    active: AtomicUsize,
}

impl ListenerStats {
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }
}

pub enum Proxy {
    Http(Arc<HttpProxy>),
    Tcp(Arc<TcpProxy>),
}

/// Everything a listener's connections share.
pub struct Connections {
    pub config: Arc<ListenerConfig>,
    pub proxy: Proxy,
    pub drain: DrainWatch,
    pub stats: Arc<ListenerStats>,
    pub metrics: ListenerMetrics,
}

/// Held for a connection's whole life: undoes the counts when it ends.
struct Open {
    stats: Arc<ListenerStats>,
    metrics: ListenerMetrics,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.stats.active.fetch_sub(1, Ordering::Relaxed);
        self.metrics.active.decrement(1.0);
    }
}

impl Accept for Connections {
    fn accepted(&self, stream: TcpStream, peer: SocketAddr, permit: Option<OwnedSemaphorePermit>) {
        let _ = stream.set_nodelay(true);
        self.metrics.accepted.increment(1);
        self.metrics.active.increment(1.0);
        self.stats.active.fetch_add(1, Ordering::Relaxed);
        let open = Open {
            stats: Arc::clone(&self.stats),
            metrics: self.metrics.clone(),
            _permit: permit,
        };
        let drain = self.drain.clone();
        match &self.proxy {
            Proxy::Http(p) => {
                let p = Arc::clone(p);
                self.drain.spawn(async move {
                    p.serve(stream, peer, drain).await;
                    drop(open);
                });
            }
            Proxy::Tcp(p) => {
                let p = Arc::clone(p);
                self.drain.spawn(async move {
                    p.serve(stream, peer).await;
                    drop(open);
                });
            }
        }
    }
}
