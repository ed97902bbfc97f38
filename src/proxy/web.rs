//! An HTTP listener's connections: each one's opening says its protocol.
//! HTTP/1 goes to baton's own path (`h1`); h2c (prior knowledge) to its
//! own h2 server (`h2`). This holds what both share: the listener's settings,
//! its routes and the pools they lead to.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::h1::io::{
    ack_promptly, linger_close, read_now, read_some, release_if_empty, write_all, Linger,
};
use super::h1::rewrite::own_answer;
use super::h2::{frame, H2_PING_INTERVAL, H2_PING_TIMEOUT};
use crate::access_log::AccessLog;
use crate::backend::Pool;
use crate::config::{Forwarded, ListenerConfig, RouteConfig};
use crate::lifecycle::drain::DrainWatch;
use crate::metrics::{self, RequestMetrics};
use crate::proxy::pace::MinPace;
use crate::proxy_protocol::Origin;
use crate::stream::ByteStream;

/// What a connection's first bytes say it speaks (they are read, and go
/// to that protocol's reader first).
enum Opening {
    /// The h2 client preface (and whatever followed it in the same read).
    H2(Vec<u8>),
    /// The first read of an HTTP/1 connection, kept as its read buffer.
    Http1(BytesMut),
    /// Nothing within `header_timeout`.
    Silent,
    /// Nothing through `keepalive_drain_grace` of a drain.
    Drained,
    Closed,
}

/// How long a silent client's 408 may wait for room to be written.
const SILENT_STALL: Duration = Duration::from_secs(1);

/// The h2 client preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads a connection's first bytes, as many as are there, until they
/// match the h2 preface or cannot (every HTTP/1 method differs from `PRI`
/// by its second byte at the latest). Bytes already waiting are taken
/// without arming a clock: the usual case for a new connection. A
/// connection that has sent nothing when `drained` resolves (a drain's
/// grace) is closed as an idle keep-alive one is: held to `header_timeout`,
/// a browser's preconnect would hold the drain to its deadline and count
/// as forced.
async fn opening<S: ByteStream>(
    stream: &mut S,
    deadline: Instant,
    drained: impl std::future::Future<Output = ()>,
) -> Opening {
    let mut seen = BytesMut::new();
    tokio::pin!(drained);
    loop {
        let read = match read_now(stream, &mut seen).await {
            Ok(Some(n)) => Ok(Ok(n)),
            Ok(None) if seen.is_empty() => tokio::select! {
                biased;
                read = tokio::time::timeout_at(deadline, read_some(stream, &mut seen)) => read,
                () = &mut drained => return Opening::Drained,
            },
            Ok(None) => tokio::time::timeout_at(deadline, read_some(stream, &mut seen)).await,
            Err(err) => Ok(Err(err)),
        };
        match read {
            // An h2 opening that stops short gets no HTTP/1 408.
            Err(_) if !seen.is_empty() => return Opening::Closed,
            Err(_) => return Opening::Silent,
            Ok(Ok(0) | Err(_)) => return Opening::Closed,
            Ok(Ok(_)) => {}
        }
        let compared = seen.len().min(PREFACE.len());
        if seen[..compared] != PREFACE[..compared] {
            return Opening::Http1(seen);
        }
        if seen.len() >= PREFACE.len() {
            let opening = seen.to_vec();
            seen.clear();
            release_if_empty(&mut seen);
            return Opening::H2(opening);
        }
        // A preface begun: its rest may wait for the ACK (`ack_promptly`).
        ack_promptly(stream);
    }
}

/// A pool as one listener sees it, with that listener's request metrics.
pub(super) struct Target {
    pub(super) pool: Arc<Pool>,
    pub(super) metrics: RequestMetrics,
}

/// What every h2 connection of a listener is served with.
pub(super) struct H2Settings {
    pub(super) max_streams: u32,
    pub(super) ping_interval: Duration,
    pub(super) ping_timeout: Duration,
}

pub struct HttpProxy {
    pub(super) listener: Arc<str>,
    /// Its routes, each `pool` an index into `targets`.
    routes: Vec<RouteConfig>,
    /// The pools its requests may go to: its own first, then its routes'.
    targets: Vec<Target>,
    pub(super) h2: H2Settings,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) keepalive_drain_grace: Duration,
    pub(super) header_timeout: Duration,
    /// Also the wait for a request body's first bytes, and how long a
    /// client may take no response bytes.
    pub(super) idle_timeout: Duration,
    pub(super) tunnel_timeout: Duration,
    /// What a request body must keep up while it holds a backend
    /// connection (`body_min_rate`), if anything.
    pub(super) body_pace: Option<MinPace>,
    pub(super) forwarded: Forwarded,
    /// The listener asks clients for certificates (`client_ca`).
    pub(super) checks_client_certs: bool,
    /// What `X-Forwarded-Proto` says: `https` on a TLS listener.
    pub(super) proto: &'static str,
    /// One of its pools sends PROXY headers (`send_proxy`): h2 connections
    /// then note whom their streams speak for.
    pub(super) sends_proxy: bool,
    /// Where each request is logged, if anywhere (`access_log`).
    pub(super) access_log: Option<AccessLog>,
}

impl HttpProxy {
    pub fn new(
        config: &ListenerConfig,
        pools: &[Arc<Pool>],
        access_log: Option<AccessLog>,
    ) -> HttpProxy {
        let h2 = H2Settings {
            max_streams: config.h2_max_concurrent_streams,
            // A dead peer (no PING answer) is found within idle_timeout
            // (at most 50 s), even with a stream open; a live one answers
            // and costs a frame.
            ping_interval: (config.idle_timeout / 2).min(H2_PING_INTERVAL),
            ping_timeout: (config.idle_timeout / 2).min(H2_PING_TIMEOUT),
        };
        metrics::client_aborts(&config.name);
        let (targets, routes) = targets_of(config, pools);
        HttpProxy {
            listener: Arc::from(config.name.as_str()),
            sends_proxy: targets.iter().any(|t| t.pool.send_proxy.is_some()),
            routes,
            targets,
            access_log,
            h2,
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            keepalive_drain_grace: config.keepalive_drain_grace,
            header_timeout: config.header_timeout,
            idle_timeout: config.idle_timeout,
            tunnel_timeout: config.tunnel_timeout,
            body_pace: MinPace::new(config.header_timeout, config.body_min_rate),
            forwarded: config.forwarded,
            checks_client_certs: config
                .tls
                .as_ref()
                .is_some_and(|tls| tls.client_auth.is_some()),
            proto: if config.tls.is_some() {
                "https"
            } else {
                "http"
            },
        }
    }

    /// Serves one client connection until it ends, the drain closes it, or
    /// the drain is forced (the task is then dropped by `DrainWatch`):
    /// HTTP/1 on baton's own path, h2c (prior knowledge) on its h2 server.
    pub async fn serve<S: ByteStream>(
        self: Arc<Self>,
        stream: S,
        origin: Origin,
        drain: DrainWatch,
    ) {
        let peer = origin.client;
        let opened = Instant::now();
        let mut stream = stream;
        // Over TLS, h2 only when the handshake agreed on it (ALPN), as the
        // listener's `alpn` allows: a listener without h2 must not serve it
        // to a client that sends the preface anyway. In plain text, h2c
        // with prior knowledge.
        let h2_agreed = stream.plain().is_some() || stream.alpn() == Some(b"h2");
        let drained = drain.grace_over(self.keepalive_drain_grace);
        match opening(&mut stream, opened + self.header_timeout, drained).await {
            // Boxed: an HTTP/1 connection's task does not carry the size
            // of an h2 connection's state (RSS per idle connection).
            Opening::H2(seen) if h2_agreed => {
                crate::in_place::boxed(|| self.serve_h2(stream, seen, origin, drain, opened)).await;
            }
            // The HTTP/1 path refuses the preface as a request.
            Opening::H2(seen) => {
                let seen = BytesMut::from(&seen[..]);
                super::h1::conn::serve(&self, stream, seen, origin, &drain, opened).await;
            }
            // A client that agreed on h2 must open with its preface (RFC
            // 9113 §3.4): HTTP/1 bytes instead get the connection error an
            // h2 client reads, not an HTTP/1 answer it would take for a
            // broken frame.
            Opening::Http1(_) if stream.alpn() == Some(b"h2") => {
                if crate::telemetry::may_say_client_fault() {
                    tracing::info!(listener = %self.listener, client = %peer, "agreed on h2 by ALPN, then sent no h2 preface; closing");
                }
                refuse_without_preface(stream, &drain).await;
            }
            Opening::Http1(seen) => {
                super::h1::conn::serve(&self, stream, seen, origin, &drain, opened).await;
            }
            Opening::Silent => {
                if crate::telemetry::may_say_client_fault() {
                    tracing::info!(listener = %self.listener, client = %peer, "no request head within header_timeout; 408");
                }
                // A client that agreed on h2 by ALPN would read an HTTP/1
                // answer as a broken frame: it gets the close alone.
                if stream.alpn() != Some(b"h2") {
                    let _ = write_all(&mut stream, super::h1::conn::TIMEOUT_RESPONSE, SILENT_STALL)
                        .await;
                }
                // Under TLS, close_notify: the close is not a truncation.
                let _ = tokio::time::timeout(SILENT_STALL, stream.shutdown()).await;
            }
            Opening::Drained => {
                tracing::debug!(listener = %self.listener, client = %peer, expected = true, "closing a connection that sent nothing, for the drain");
                drain.closed_idle();
                let _ = tokio::time::timeout(SILENT_STALL, stream.shutdown()).await;
            }
            Opening::Closed => {}
        }
    }

    /// A client that sent plain HTTP to this TLS listener: a 400 it can
    /// read, saying why, then a lingering close (its request is unread).
    /// Counted as a failed handshake, not a request: it never became one.
    pub async fn refuse_plain_http(&self, mut stream: TcpStream, drain: &DrainWatch) {
        let page = "400 Bad Request\nthis port speaks HTTPS: the request came as plain HTTP\n";
        let mut answer = BytesMut::new();
        own_answer(StatusCode::BAD_REQUEST, page, None, true, &mut answer);
        if write_all(&mut stream, &answer, SILENT_STALL).await.is_ok() {
            linger_close(&mut stream, Linger::Brief, drain).await;
        }
    }

    /// The identity `stream`'s client certificate proved, as
    /// `X-Forwarded-Client-Cert` writes it: made once per connection, for
    /// every request on it. None where the listener forwards nothing
    /// (`forwarded = "off"`).
    pub(super) fn client_identity<S: ByteStream>(&self, stream: &S) -> Option<String> {
        if self.forwarded == Forwarded::Off {
            return None;
        }
        stream
            .client_certificate()
            .map(crate::tls::identity::forwarded_client_cert)
    }

    /// The listener's own pool: where a request refused before its head
    /// could be routed is counted.
    pub(super) fn own_target(&self) -> &Target {
        &self.targets[OWN_TARGET]
    }

    /// The pool a request goes to: the first route matching its host and
    /// path, else the listener's.
    pub(super) fn target_for(&self, host: Option<&[u8]>, path: &[u8]) -> &Target {
        if self.routes.is_empty() {
            return self.own_target();
        }
        // Compared in place: routing costs no allocation per request.
        // A final dot (`example.com.`, the fully qualified name) names the
        // same host: nginx drops it too.
        let host = host
            .and_then(|h| std::str::from_utf8(h).ok())
            .map(crate::config::strip_port)
            .map(|h| h.strip_suffix('.').unwrap_or(h));
        let chosen = self
            .routes
            .iter()
            .find(|r| {
                r.path_prefix
                    .as_deref()
                    .is_none_or(|p| path.starts_with(p.as_bytes()))
                    && r.host
                        .as_deref()
                        .is_none_or(|h| host.is_some_and(|sent| sent.eq_ignore_ascii_case(h)))
            })
            .map_or(OWN_TARGET, |r| r.pool);
        &self.targets[chosen]
    }
}

/// Where the listener's own pool is among its targets.
const OWN_TARGET: usize = 0;

/// The listener's targets (its own pool first, then each other pool its
/// routes name, once), each with its request metrics, and its routes
/// pointing into them. Only these: a listener's series for every pool of
/// the config were 25 a pair at zero, made, rendered at every scrape and
/// carried in every reload's report (500 listeners and 200 pools made a
/// report past the handoff's 64 MiB bound: no reload).
fn targets_of(config: &ListenerConfig, pools: &[Arc<Pool>]) -> (Vec<Target>, Vec<RouteConfig>) {
    let mut used = vec![config.pool];
    let routes = config
        .routes
        .iter()
        .map(|route| {
            let local = used
                .iter()
                .position(|&p| p == route.pool)
                .unwrap_or_else(|| {
                    used.push(route.pool);
                    used.len() - 1
                });
            RouteConfig {
                pool: local,
                ..route.clone()
            }
        })
        .collect();
    let targets = used
        .iter()
        .map(|&p| Target {
            pool: Arc::clone(&pools[p]),
            metrics: metrics::requests(&config.name, &pools[p].name),
        })
        .collect();
    (targets, routes)
}

/// Ends a connection whose client agreed on h2 and sent something else
/// than its preface: SETTINGS and GOAWAY with PROTOCOL_ERROR, then a
/// lingering close (what it sent is unread). Apart from `serve`, whose
/// every state would otherwise make room for the frames' buffer.
async fn refuse_without_preface<S: ByteStream>(mut stream: S, drain: &DrainWatch) {
    let mut refusal = Vec::new();
    frame::write::settings(&mut refusal, &[]);
    frame::write::goaway(&mut refusal, 0, frame::Reason::PROTOCOL_ERROR);
    if write_all(&mut stream, &refusal, SILENT_STALL).await.is_ok() {
        linger_close(&mut stream, Linger::Brief, drain).await;
    }
}
