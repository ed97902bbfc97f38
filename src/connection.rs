//! One client connection's frame: counted by the drain and in metrics while
//! it lives, then handed to the proxy for its protocol. What a connection
//! *does* lives in `proxy`; this only owns its bookkeeping and what comes
//! before the protocol: a PROXY header from a balancer in front, then, on
//! a TLS listener, the handshake.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::access_log::{Phase, Termination};
use crate::config::{ListenerConfig, Protocol};
use crate::in_place;
use crate::lifecycle::drain::DrainWatch;
use crate::listener::Accept;
use crate::metrics::ListenerMetrics;
use crate::proxy::{tcp::TcpProxy, web::HttpProxy};
use crate::proxy_protocol::receive::{Received, Refusal};
use crate::proxy_protocol::{self, Origin, ReceiveSettings};
use crate::stream::ByteStream;
use crate::tls::handshake::{Failure, Handshake, Terminator};

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

#[derive(Clone)]
pub enum Proxy {
    Http(Arc<HttpProxy>),
    Tcp(Arc<TcpProxy>),
}

/// Everything a listener's connections share.
pub struct Connections {
    pub config: Arc<ListenerConfig>,
    pub proxy: Proxy,
    /// TLS termination, when the listener has `tls`: the handshake runs in
    /// the connection's own task, holding its place in `max_connections`.
    pub tls: Option<Arc<Terminator>>,
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

pin_project_lite::pin_project! {
    /// A connection's future beside its place among the open ones, which
    /// goes back as the task ends and drops both. Not an async block that
    /// awaits the future and then drops the place: such a block keeps the
    /// future's arguments a second time (112 bytes a connection).
    struct Holding<F> {
        #[pin]
        serving: F,
        _open: Open,
    }
}

impl<F: Future<Output = ()>> Future for Holding<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.project().serving.poll(cx)
    }
}

impl Accept for Connections {
    fn alongside(&self, task: crate::listener::Alongside) {
        self.drain.spawn(task);
    }

    fn accepted(&self, stream: TcpStream, peer: SocketAddr, permit: Option<OwnedSemaphorePermit>) {
        self.metrics.accepted.increment(1);
        self.metrics.active.increment(1.0);
        self.stats.active.fetch_add(1, Ordering::Relaxed);
        let open = Open {
            stats: Arc::clone(&self.stats),
            metrics: self.metrics.clone(),
            _permit: permit,
        };
        let proxy = self.proxy.clone();
        let origin = Origin {
            client: proxy_protocol::canonical(peer),
            local: None,
        };
        match (&self.config.proxy_protocol, &self.tls) {
            // Each protocol's future boxed apart, as in `Proxy::serve`, and
            // here at the spawn (as every connection's task below): tokio
            // then moves a pointer into the task's cell and at each change
            // of the task's stage, not the state.
            (None, None) => match proxy {
                Proxy::Http(p) => {
                    let drain = self.drain.clone();
                    self.drain.spawn(in_place::boxed(move || Holding {
                        serving: p.serve(stream, origin, drain),
                        _open: open,
                    }));
                }
                Proxy::Tcp(p) => self.drain.spawn(in_place::boxed(move || Holding {
                    serving: p.serve(stream, origin, Instant::now()),
                    _open: open,
                })),
            },
            (receive, tls) => {
                let (receive, tls) = (receive.clone(), tls.clone());
                let listener = Arc::clone(&self.config);
                let drain = self.drain.clone();
                let accepted = Instant::now();
                self.drain.spawn(in_place::boxed(move || async move {
                    let admitted = match receive {
                        None => Some((stream, origin)),
                        Some(settings) => {
                            let admitted = in_place::boxed(|| {
                                admit(stream, origin, &settings, &listener, &drain)
                            })
                            .await;
                            match admitted {
                                Ok(admitted) => admitted,
                                Err(refusal) => {
                                    proxy.refused(origin.client, accepted, ended_by(refusal));
                                    None
                                }
                            }
                        }
                    };
                    if let Some((stream, origin)) = admitted {
                        match tls {
                            None => proxy.serve(stream, origin, drain, accepted).await,
                            Some(tls) => {
                                let idle = drain.grace_over(listener.keepalive_drain_grace);
                                match tls.handshake(stream, origin.client, idle).await {
                                    Handshake::Done(stream) => {
                                        proxy.serve(stream, origin, drain, accepted).await
                                    }
                                    Handshake::PlainHttp(stream) => {
                                        proxy.refuse_plain_http(stream, &drain).await
                                    }
                                    Handshake::Idle => {
                                        tracing::debug!(listener = %listener.name, client = %origin.client, expected = true, "no ClientHello through the drain's grace; closing");
                                        drain.closed_idle();
                                    }
                                    Handshake::Failed(failure) => {
                                        proxy.refused(origin.client, accepted, failed(failure));
                                    }
                                }
                            }
                        }
                    }
                    drop(open);
                }));
            }
        }
    }
}

/// When a connection waiting for its PROXY header that has sent nothing
/// is idle: once the drain's grace is over, as a silent client is on an
/// HTTP listener or in a TLS handshake (it would hold the drain to
/// `proxy_protocol.timeout`). Never on a TCP listener whose header is
/// optional: it may serve a protocol whose server speaks first, whose
/// silent client is served at the timeout, as without a drain.
async fn idle_without_a_header(
    drain: &DrainWatch,
    listener: &ListenerConfig,
    settings: &ReceiveSettings,
) {
    if listener.protocol == Protocol::Tcp && !settings.required {
        return std::future::pending().await;
    }
    drain.grace_over(listener.keepalive_drain_grace).await;
}

/// Reads a PROXY header; a connection whose header is refused is closed
/// here, counted and logged (the refusal is returned for the access log),
/// and never reaches TLS or a backend. None: closed idle through a drain.
async fn admit(
    mut stream: TcpStream,
    socket: Origin,
    settings: &ReceiveSettings,
    config: &ListenerConfig,
    drain: &DrainWatch,
) -> Result<Option<(TcpStream, Origin)>, Refusal> {
    let listener = config.name.as_str();
    let idle = idle_without_a_header(drain, config, settings);
    match proxy_protocol::receive::receive(&mut stream, socket, settings, idle).await {
        Ok(Received::From(origin)) => Ok(Some((stream, origin))),
        Ok(Received::Idle) => {
            tracing::debug!(listener, client = %socket.client, expected = true, "no PROXY header through the drain's grace; closing");
            drain.closed_idle();
            Ok(None)
        }
        Err(refusal) => {
            crate::metrics::proxy_protocol_error(listener, refusal.label());
            if crate::telemetry::may_say_client_fault() {
                tracing::info!(listener, peer = %socket.client, cause = %refusal, "closed before serving");
            }
            Err(refusal)
        }
    }
}

/// A failed TLS handshake's access-log termination: as a refused PROXY
/// header's (a balancer's TCP check, closed before a byte, is `CR`).
fn failed(failure: Failure) -> Termination {
    match failure {
        Failure::Silent => Termination::ClientAborted(Phase::Request),
        Failure::Slow => Termination::ClientTimeout(Phase::Request),
        Failure::Refused => Termination::Refused,
    }
}

/// A refused PROXY header's access-log termination: the client's slowness
/// (`cR`) or leaving (`CR`), else baton's refusal (`PR`).
fn ended_by(refusal: Refusal) -> Termination {
    match refusal {
        Refusal::Timeout => Termination::ClientTimeout(Phase::Request),
        Refusal::Closed => Termination::ClientAborted(Phase::Request),
        _ => Termination::Refused,
    }
}

impl Proxy {
    /// A connection closed before it was served (its PROXY header or TLS
    /// handshake refused), accepted at `accepted`: a TCP listener's access
    /// log has a line for every connection. An HTTP listener's has one a
    /// request, and this connection made none.
    fn refused(&self, client: SocketAddr, accepted: Instant, termination: Termination) {
        if let Proxy::Tcp(p) = self {
            p.refused(client, accepted, termination);
        }
    }

    /// The proxy of listener `l` over the generation's `pools`.
    pub fn for_listener(
        l: &ListenerConfig,
        pools: &[Arc<crate::backend::Pool>],
        access_log: Option<crate::access_log::AccessLog>,
    ) -> Proxy {
        match l.protocol {
            Protocol::Http => Proxy::Http(Arc::new(HttpProxy::new(l, pools, access_log))),
            Protocol::Tcp => {
                let bytes = crate::metrics::tcp_listener(&l.name, &pools[l.pool].name);
                Proxy::Tcp(Arc::new(TcpProxy {
                    listener: Arc::from(l.name.as_str()),
                    bytes,
                    pool: Arc::clone(&pools[l.pool]),
                    connect_timeout: l.connect_timeout,
                    tunnel_timeout: l.tunnel_timeout,
                    half_closed_timeout: l.idle_timeout,
                    access_log,
                }))
            }
        }
    }

    /// A plain HTTP request on a TLS listener: answered by an HTTP one
    /// (only they ask for it, `Terminator::new`).
    async fn refuse_plain_http(self, stream: TcpStream, drain: &DrainWatch) {
        if let Proxy::Http(p) = self {
            p.refuse_plain_http(stream, drain).await;
        }
    }

    /// Each protocol's future is boxed: a task carries only the size of
    /// its own protocol's state, not the larger of the two (an idle HTTP
    /// connection would otherwise hold TCP mode's copy state, and back).
    /// Serves a connection accepted at `accepted` (a TCP line's time counts
    /// from it, as a refused one's does).
    async fn serve<S: ByteStream>(
        self,
        stream: S,
        origin: Origin,
        drain: DrainWatch,
        accepted: Instant,
    ) {
        match self {
            Proxy::Http(p) => in_place::boxed(|| p.serve(stream, origin, drain)).await,
            Proxy::Tcp(p) => in_place::boxed(|| p.serve(stream, origin, accepted)).await,
        }
    }
}
