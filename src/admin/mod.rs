//! The admin surface: probes, status and metrics over hyper, on its own
//! listener (handed over like any other, so no probe is refused during a
//! reload). It reads shared state through [`AdminShared`]'s narrow handles
//! and never reaches into connections.

mod bounded;
pub mod client;
mod generations;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use http::header::{HeaderValue, CONNECTION};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backend::Pool;
use crate::config::{AdminConfig, Protocol};
use crate::connection::ListenerStats;
use crate::lifecycle::Phase;

/// This generation, as `/status` reports it.
#[derive(Debug, Clone)]
pub struct GenerationInfo {
    pub number: u64,
    pub pid: u32,
    pub started_at: SystemTime,
}

/// One listener, as `/status` reports it.
pub struct ListenerView {
    pub name: String,
    pub bind: SocketAddr,
    pub protocol: Protocol,
    pub stats: Arc<ListenerStats>,
    /// The accept queues of its listening sockets.
    pub queues: Vec<Arc<crate::metrics::kernel::AcceptQueue>>,
}

impl ListenerView {
    /// Connections in the kernel accept queues of its sockets.
    pub fn backlog(&self) -> u64 {
        self.queues.iter().map(|q| q.waiting()).sum()
    }
}

/// What the data plane looks like once built (absent during start-up).
#[derive(Default)]
pub struct Topology {
    pub listeners: Vec<ListenerView>,
    pub pools: Vec<Arc<Pool>>,
}

/// Everything the admin server may read.
pub struct AdminShared {
    pub config: AdminConfig,
    pub generation: GenerationInfo,
    pub phase: watch::Receiver<Phase>,
    pub topology: RwLock<Arc<Topology>>,
    pub metrics: Option<PrometheusHandle>,
    /// What older generations reported (see `generations`).
    pub inherited: RwLock<crate::lifecycle::handoff::Report>,
    /// The listeners, pools and backends of our config: an inherited
    /// series naming any other is dropped (see `set_inherited`).
    pub configured: crate::metrics::exposition::Configured,
}

impl AdminShared {
    pub fn set_topology(&self, topology: Topology) {
        if let Ok(mut t) = self.topology.write() {
            *t = Arc::new(topology);
        }
    }

    fn topology(&self) -> Arc<Topology> {
        self.topology
            .read()
            .map(|t| Arc::clone(&t))
            .unwrap_or_default()
    }
}

/// Admin connections served at once, at most: past it the next waits in
/// the kernel's queue until one ends (each ends within `bounded::IDLE` of
/// going quiet). The fds and memory a flood of them could take are the
/// data plane's too.
const MAX_CONNECTIONS: usize = 256;

/// Serves admin requests until `stop`, then lets open ones finish briefly.
pub async fn serve(listener: TcpListener, state: Arc<AdminShared>, stop: CancellationToken) {
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (place, (stream, _)) = tokio::select! {
            // Once stopped, not one more connection is taken from a free
            // choice (the next generation answers from now on).
            biased;
            () = stop.cancelled() => break,
            taken = accept_within(&listener, &places) => match taken {
                Some(taken) => taken,
                None => break,
            },
        };
        answer(stream, Arc::clone(&state), Some(stop.clone()), Some(place));
    }
    // What was queued before the stop is answered, once, not reset by the
    // close.
    while let Ok(Ok((stream, _))) =
        tokio::time::timeout(std::time::Duration::ZERO, listener.accept()).await
    {
        answer(stream, Arc::clone(&state), None, None);
    }
}

/// The next connection once there is a place for it; `None` if the places
/// are gone (never: the semaphore is not closed).
async fn accept_within(
    listener: &TcpListener,
    places: &Arc<tokio::sync::Semaphore>,
) -> Option<(
    tokio::sync::OwnedSemaphorePermit,
    (tokio::net::TcpStream, SocketAddr),
)> {
    let place = Arc::clone(places).acquire_owned().await.ok()?;
    loop {
        match listener.accept().await {
            Ok(accepted) => return Some((place, accepted)),
            Err(err) => {
                tracing::warn!(cause = %err, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one admin connection in a task of its own. Once `stop` fires
/// (the next generation answers from then on) a kept-alive connection
/// finishes the request it is on and closes, an idle one closes at once:
/// a scraper on it reconnects to the next generation, instead of reading
/// this draining one's metrics and `/status` for the whole drain. A
/// connection that has not sent its first request yet is answered once,
/// with `Connection: close`, as one taken after the stop is (no `stop`).
/// `place` is its share of `MAX_CONNECTIONS`, held until it closes.
fn answer(
    stream: tokio::net::TcpStream,
    state: Arc<AdminShared>,
    stop: Option<CancellationToken>,
    place: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    tokio::spawn(async move {
        let _place = place;
        let served = Arc::new(AtomicBool::new(false));
        let (seen, stopped) = (Arc::clone(&served), stop.clone());
        let service = service_fn(move |req| {
            let state = Arc::clone(&state);
            seen.store(true, Ordering::Relaxed);
            let last = stopped.as_ref().is_none_or(CancellationToken::is_cancelled);
            async move {
                let mut response = routes::respond(&state, req);
                if last {
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(std::time::Duration::from_secs(10))
            .serve_connection(TokioIo::new(bounded::Bounded::new(stream)), service);
        tokio::pin!(conn);
        let stopping = async {
            match &stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            () = stopping => {
                if served.load(Ordering::Relaxed) {
                    conn.as_mut().graceful_shutdown();
                }
                conn.await
            }
        };
        if let Err(err) = ended {
            tracing::debug!(cause = %err, "admin connection ended with an error");
        }
    });
}
