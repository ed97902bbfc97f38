//! h2c (prior knowledge) clients: baton's own h2 server connection
//! (`conn`), whose streams go to backends on its HTTP/1 upstream
//! (`h1::relay`),
//! with the same leases, caps, queue, kept connections, timeouts and
//! passive health as HTTP/1 clients. Bodies stream in both directions;
//! nothing is buffered whole.
//!
//! Draining an h2 connection, per DESIGN.md: GOAWAY at once.
//!
//! The server's layers: the frames (`frame`), their header compression
//! (`hpack`), a request's head (`request`) and body (`recv`), and the
//! connection (`conn`), which polls each stream's exchange (`handle`) in
//! its own task.

pub mod clocks;
pub mod conn;
pub mod frame;
pub mod hpack;
pub mod opening;
pub mod record;
pub mod recv;
pub mod request;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, EXPECT, HOST};
use http::{Request, Response};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use self::clocks::{Clocks, Limits as ClockLimits, Verdict};
use self::opening::Watched;
use self::record::{Asked, Noted, StreamRecord};
use super::activity::{Busy, ConnState};
use super::body::{self, ClientBody, Guarded, Progress, ProxyBody};
use super::delivery::{self, Delivery};
use super::h1::head::{
    expectation_met, valid_authority, Framing, ResponseHead, MAX_FIELDS, MAX_HEAD,
};
use super::h1::record::{unserved, Unserved};
use super::h1::relay::{BackendWait, ClientPause, HeadFault, Relay, Silence};
use super::h1::rewrite::Outbound;
use super::h1::upstream;
use super::headers;
use super::longlived;
use super::pace;
use super::request_id::RequestId;
use super::web::{HttpProxy, Target};
use super::ProxyError;
use crate::access_log::Termination;
use crate::backend::idle::Check;
use crate::backend::{Backend, Lease};
use crate::lifecycle::drain::DrainWatch;
use crate::metrics;
use crate::proxy_protocol::send::Speaker;
use crate::proxy_protocol::Origin;
use crate::stream::ByteStream;
use conn::{Connection, Exchange, Limits};
use recv::{RecvBody, RecvError};
use request::ListTooLarge;

/// How often an h2 connection is PINGed, and how long the answer may take,
/// at most.
pub(super) const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
pub(super) const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// What a connection holds written and not yet taken by its socket before
/// it stops polling response bodies (and reading frames): two of the
/// largest frames baton sends (HAProxy holds one 16 KiB buffer a stream).
const H2_SEND_BUFFER: usize = 32 * 1024;
/// What a client may send of one stream's request body before baton reads
/// it (while the stream waits in line, connects, or its backend is slow to
/// take it): nginx's and HAProxy's 64 KiB.
const H2_STREAM_WINDOW: u32 = 64 * 1024;
/// The connection's window: given back as DATA arrives (what waits unread
/// is bounded by the streams' windows), it bounds only the bytes on their
/// way, and its WINDOW_UPDATEs go out a half at a time.
const H2_CONNECTION_WINDOW: u32 = 256 * 1024;
/// How long an idle h2 client has to close after GOAWAY (counted from the
/// later of the GOAWAY and the last byte baton wrote, with no stream open).
const H2_GOAWAY_GRACE: Duration = Duration::from_secs(1);
/// How long after GOAWAY was sent a stream the client opened before
/// GOAWAY reached it may still arrive. One later broke RFC 9113 §6.8 ("receivers of a GOAWAY
/// frame MUST NOT open additional streams"): a client that answers
/// keep-alive PINGs but not the GOAWAY's own, and goes on opening streams,
/// would hold a drain to its deadline. Such streams are refused
/// (REFUSED_STREAM: not processed, safe to retry elsewhere), and the
/// connection closes once those it was serving are done. HAProxy and nginx
/// allow none: their GOAWAY names the last stream at once.
const GOAWAY_CROSSING: Duration = Duration::from_secs(1);
/// The lead each stream's own stall clock (`conn`) has over the
/// connection's: a stall ends the streams it holds (each counted once),
/// and the whole connection only if frames still wait after that.
const STREAMS_FIRST: Duration = Duration::from_secs(1);

/// How long a connection closed quiet (see `Verdict::GoneQuiet`,
/// `Verdict::IdleThroughDrain`) has to write its last GOAWAY.
const LAST_WORD: Duration = Duration::from_millis(100);

/// How an h2 connection ended: whether what the client still sends is
/// read before the socket closes (see [`linger`]).
enum Ended {
    /// The client has had everything baton wrote, or stopped taking it.
    Well,
    /// Cut: a client that stopped reading, or never opened.
    Cut,
}

/// How long a closed h2 connection's socket keeps reading what the client
/// sends while it takes its last responses: until a second passes without
/// a byte, two at most (an HTTP/1 connection's close is bounded alike: the
/// linger runs within the drain, whose deadline would count it forced).
const LINGER_SILENCE: Duration = Duration::from_secs(1);
const LINGER_MAX: Duration = Duration::from_secs(2);

/// Closes the socket of an h2 connection that ended well: its write side
/// first (after all baton wrote; under TLS, `close_notify` after the last
/// record: without
/// it a client's TLS library takes the close for a truncation), then what
/// the client still sends (WINDOW_UPDATEs and PING answers while it reads
/// its last responses) is read and dropped until it closes or falls
/// silent. Closed with those bytes unread, the socket would make the kernel
/// reset the connection, which discards what the client has not read yet:
/// a response's tail, cut at a reload. On the TCP socket itself, under TLS
/// too: what comes now is dropped unread, record or not.
async fn linger<S: ByteStream>(mut stream: S) {
    // Bounded: a TLS stream's shutdown waits for its buffered records to
    // go out, for good on a client that stopped reading.
    let _ = tokio::time::timeout(LINGER_SILENCE, stream.shutdown()).await;
    let socket = stream.tcp();
    let _ = socket2::SockRef::from(socket).shutdown(std::net::Shutdown::Write);
    // On the heap: inline, it would size every h2 connection's task for
    // its last moments (4 KiB of the 4.9 its future took).
    let mut sink = vec![0u8; 4096];
    let _ = tokio::time::timeout(LINGER_MAX, async {
        while let Ok(Ok(())) = tokio::time::timeout(LINGER_SILENCE, socket.readable()).await {
            match socket.try_read(&mut sink) {
                Ok(0) => return,
                Err(err) if err.kind() != std::io::ErrorKind::WouldBlock => return,
                _ => {}
            }
        }
    })
    .await;
}

/// A request body ready to go upstream.
struct Outgoing {
    body: ProxyBody,
    /// How the client's body is getting on; `None` for an empty body,
    /// which can be sent again.
    progress: Option<Arc<Progress>>,
}

impl Outgoing {
    fn empty() -> Outgoing {
        Outgoing {
            body: body::empty(),
            progress: None,
        }
    }
}

impl HttpProxy {
    pub(super) async fn serve_h2<S: ByteStream>(
        self: Arc<Self>,
        stream: S,
        seen: Vec<u8>,
        origin: Origin,
        drain: DrainWatch,
        opened: Instant,
    ) {
        let peer = origin.client;
        let state = Arc::new(ConnState::new(opened));
        // Formatted once per connection: every request forwards it.
        let client = Arc::new(H2Client {
            peer,
            ip: headers::ip_text(peer.ip()),
            speaker: self.sends_proxy.then(|| Speaker::of(&stream, origin)),
            certificate: self.client_identity(&stream),
        });
        let service = {
            let (proxy, state, drain) = (Arc::clone(&self), Arc::clone(&state), drain.clone());
            move |req: Request<RecvBody>| -> Exchange<ProxyBody> {
                // As the stream opens: one reset before its exchange runs
                // is counted too.
                let busy = state.open();
                let (proxy, drain) = (Arc::clone(&proxy), drain.clone());
                let client = Arc::clone(&client);
                crate::in_place::boxed(
                    || async move { proxy.handle(req, &client, busy, drain).await },
                )
            }
        };
        let (back, handed_back) = tokio::sync::oneshot::channel();
        let io = Watched::new(stream, seen, Arc::clone(&state), back);
        let ended = {
            let conn = Connection::new(io, &[], self.h2_limits(), service)
                .on_stall(self.on_stream_stall(peer))
                .on_refused(self.on_refused_stream(peer));
            tokio::pin!(conn);
            let mut clocks = Clocks::new(self.clock_limits(), Instant::now());
            let alarm = tokio::time::sleep_until(Instant::now());
            tokio::pin!(alarm);
            loop {
                // Made before the clocks are looked at: a change after is heard.
                let changed = state.changed();
                match clocks.look(&state, Instant::now()) {
                    Ok(next) if next != alarm.deadline() => alarm.as_mut().reset(next),
                    Ok(_) => {}
                    Err(verdict) => {
                        let flooded = verdict == Verdict::Flooded;
                        match self.judge(verdict, peer, &drain) {
                            // Closed quiet: the last GOAWAY first, as the
                            // socket takes it.
                            Some(Ended::Well) => {
                                conn.as_mut().refuse_new_streams();
                                let _ = tokio::time::timeout(LAST_WORD, conn.as_mut()).await;
                                break Ended::Well;
                            }
                            Some(ended) => break ended,
                            None if flooded => conn.as_mut().refuse_a_flood(),
                            None => conn.as_mut().graceful_shutdown(),
                        }
                        continue;
                    }
                }
                tokio::select! {
                    // The connection last: a change it made while polled
                    // (its last stream ended) woke this task already, and
                    // is heard first on the poll that follows, before the
                    // connection is polled again (in any order it was
                    // polled twice more, not once).
                    biased;
                    () = changed => {}
                    () = &mut alarm => {}
                    () = drain.draining(), if !clocks.draining() => {
                        conn.as_mut().graceful_shutdown();
                        clocks.drain_began(Instant::now());
                    }
                    result = conn.as_mut() => {
                        match result {
                            Ok(()) => break Ended::Well,
                            Err(err) => {
                                tracing::debug!(listener = %self.listener, client = %peer, cause = %err, "client connection ended with an error");
                                break Ended::Cut;
                            }
                        }
                    }
                }
            }
        };
        // The connection, dropped with the block above, handed it back.
        if let (Ended::Well, Ok(stream)) = (ended, handed_back.await) {
            linger(stream).await;
        }
    }

    /// What a clock's verdict does: the connection's end, or `None` for a
    /// GOAWAY and the connection going on.
    fn judge(&self, verdict: Verdict, peer: SocketAddr, drain: &DrainWatch) -> Option<Ended> {
        let listener = &self.listener;
        // A place in the budget only for a line that is logged: the
        // verdicts that log nothing (an idle connection's end, each h2
        // connection has one) used it up, and held real lines back.
        let fault = crate::telemetry::may_say_client_fault;
        match verdict {
            Verdict::Stalled => {
                if fault() {
                    tracing::info!(%listener, client = %peer, "client took no response bytes within idle_timeout (and a second for its streams' own clocks); closing");
                }
                metrics::client_abort(listener, metrics::AbortReason::StalledReader);
                Some(Ended::Cut)
            }
            Verdict::OpeningOverdue => {
                if fault() {
                    tracing::info!(%listener, client = %peer, "no h2 preface and SETTINGS within header_timeout; closing");
                }
                Some(Ended::Cut)
            }
            // The last GOAWAY (new streams refused), and a grace for the
            // streams under way that the client did not reset; then the
            // cut.
            Verdict::Flooded => {
                if fault() {
                    tracing::info!(%listener, client = %peer, "client reset most of its streams before their responses (rapid reset); GOAWAY, closing in a second");
                }
                metrics::client_abort(listener, metrics::AbortReason::ResetFlood);
                None
            }
            Verdict::FloodCut => Some(Ended::Cut),
            Verdict::Idle => {
                tracing::debug!(%listener, client = %peer, "h2 connection without a stream for idle_timeout; GOAWAY");
                None
            }
            // Not under a request that crossed the GOAWAY, nor before what
            // was written for it went out.
            Verdict::GoneQuiet => {
                tracing::debug!(%listener, client = %peer, "h2 client did not close after GOAWAY; closing");
                Some(Ended::Well)
            }
            Verdict::IdleThroughDrain => {
                tracing::debug!(%listener, client = %peer, expected = true, "h2 connection idle through the drain's grace; closing");
                drain.closed_idle();
                Some(Ended::Well)
            }
        }
    }

    /// The connection's own clocks (see the constants above).
    fn clock_limits(&self) -> ClockLimits {
        ClockLimits {
            stall: self.idle_timeout + STREAMS_FIRST,
            opening: self.header_timeout,
            idle: self.idle_timeout,
            goaway_grace: H2_GOAWAY_GRACE,
            drain_grace: self.keepalive_drain_grace,
        }
    }

    /// What an h2 client is allowed (see the constants above).
    fn h2_limits(&self) -> Limits {
        Limits {
            max_streams: self.h2.max_streams,
            stream_window: H2_STREAM_WINDOW,
            connection_window: H2_CONNECTION_WINDOW,
            // An HTTP/1 head's bound (h2 counts 32 bytes more a field).
            max_header_list: MAX_HEAD as u32,
            send_buffer: H2_SEND_BUFFER,
            ping_interval: self.h2.ping_interval,
            ping_timeout: self.h2.ping_timeout,
            stall_limit: self.idle_timeout,
            goaway_crossing: GOAWAY_CROSSING,
            block_limit: self.header_timeout,
        }
    }

    /// What a stream reset for its client's stall (to `peer`) tells.
    fn on_stream_stall(&self, peer: SocketAddr) -> Arc<dyn Fn() + Send + Sync> {
        let listener = Arc::clone(&self.listener);
        Arc::new(move || {
            if crate::telemetry::may_say_client_fault() {
                tracing::info!(listener = %listener, client = %peer, "client took none of a stream's response within idle_timeout; resetting the stream");
            }
            metrics::client_abort(&listener, metrics::AbortReason::StalledReader);
        })
    }

    /// A stream the connection refused itself. One it answered (431: a
    /// pseudo-field past the bound, so no request to hand on) is counted
    /// on the listener's own pool and logged, as an HTTP/1 head past the
    /// bound is (its bytes are 0: the answer's head is HPACK-coded among
    /// the connection's frames; its duration about 0, from the refusal, as
    /// `handle`'s 431 is); a reset one is only said.
    fn on_refused_stream(self: &Arc<Self>, peer: SocketAddr) -> Arc<conn::Refused> {
        let proxy = Arc::clone(self);
        Arc::new(move |stream, why, answered| {
            if crate::telemetry::may_say_client_fault() {
                tracing::info!(listener = %proxy.listener, client = %peer, stream, cause = why, "h2 request refused before it reached a backend");
            }
            if let Some(status) = answered {
                let refused = Unserved {
                    status: Some(status),
                    termination: Termination::Refused,
                    protocol: "HTTP/2.0",
                    bytes_in: 0,
                    bytes_out: 0,
                    body_out: 0,
                };
                let (log, metrics) = (proxy.access_log.as_ref(), &proxy.own_target().metrics);
                unserved(
                    log,
                    metrics,
                    &RequestId::new(),
                    peer,
                    refused,
                    Instant::now(),
                );
            }
        })
    }

    async fn handle(
        &self,
        req: Request<RecvBody>,
        client: &H2Client,
        mut busy: Busy,
        drain: DrainWatch,
    ) -> Response<ProxyBody> {
        let delivery = delivery::current();
        busy.runs(delivery.clone());
        let sent = req
            .headers()
            .get(headers::X_REQUEST_ID)
            .map(HeaderValue::as_bytes);
        let request_id = RequestId::from_client(sent, self.forwarded);
        let head_asked = req.method() == http::Method::HEAD;
        let host = req
            .uri()
            .host()
            .map(str::as_bytes)
            .or_else(|| req.headers().get(HOST).map(HeaderValue::as_bytes));
        let target = self.target_for(host, req.uri().path().as_bytes());
        // Made first: a stream the client resets while baton waits for the
        // backend (the connection then drops this future) still leaves its
        // line.
        let mut record = self.access_log.as_ref().map(|log| {
            let asked = Asked::of(&req);
            StreamRecord::new(
                log.clone(),
                asked,
                request_id.clone(),
                client.peer,
                &target.pool.name,
                drain.clone(),
                delivery.clone(),
            )
        });
        let mut spare = Noted::default();
        let checked = match refusal(&req) {
            Some(refused) => Err(refused),
            None => {
                busy.sent_on();
                let stream = Stream {
                    client,
                    request_id: &request_id,
                    noted: record.as_mut().map_or(&mut spare, StreamRecord::noted),
                    delivery: delivery.as_deref(),
                };
                self.forward(req, stream, target, &drain).await
            }
        };
        let marks = record.as_ref().map_or(spare.marks, StreamRecord::marks);
        if let Err(ProxyError::ClientLeft) = checked {
            // Nothing to answer, nor to count: the stream is gone.
            if let Some(record) = record.as_mut() {
                record.left_while_sending();
            }
            return Response::new(body::empty());
        }
        let (response, on_end) = match checked {
            Ok(r) => (r, Termination::Completed),
            Err(err) => {
                if matches!(err, ProxyError::NoBackend { .. }) {
                    super::no_backend(&self.listener, &target.pool.name);
                }
                let termination = err.termination(&marks);
                (
                    error_response(&target.pool.name, &err, &request_id, head_asked),
                    termination,
                )
            }
        };
        let status = response.status().as_u16();
        target.metrics.count(status);
        target
            .metrics
            .duration
            .record(marks.started.elapsed().as_secs_f64());
        if let Some(record) = record.as_mut() {
            record.answered(status, on_end);
        }
        busy.answered();
        response.map(|b| {
            let b = Guarded::wrap(b, busy);
            match record {
                Some(record) => Guarded::wrap(b, record),
                None => b,
            }
        })
    }

    async fn forward(
        &self,
        req: Request<RecvBody>,
        stream: Stream<'_>,
        target: &Target,
        drain: &DrainWatch,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let client = stream.client;
        let (parts, incoming) = req.into_parts();
        // While the body's first frame is awaited, a stream dropped was
        // cut while its client sent; a body that turned out empty is not
        // coming any more, and one that started is followed by `upload`.
        stream.noted.body_expected = !incoming.is_end_stream();
        // A client that waits for 100 (Continue) before its body gets it
        // as the body is asked for, as on the HTTP/1 path (`refusal` let
        // no other expectation through).
        if stream.noted.body_expected && parts.headers.contains_key(EXPECT) {
            if let Some(delivery) = stream.delivery {
                delivery.interim((100, HeaderMap::new()));
            }
        }
        let outgoing = self.client_body(incoming).await?;
        stream.noted.upload = outgoing.progress.clone();
        if stream.noted.upload.is_none() {
            stream.noted.body_expected = false;
        }
        // Sent again on a new connection when a kept one was closed under
        // it only if that is safe, as for HTTP/1: no body, an idempotent
        // method.
        // (A failed connect sent nothing: another backend may always take it.)
        let replayable = outgoing.progress.is_none() && parts.method.is_idempotent();
        let check = Check::before_request(replayable);
        let mut body = Some(outgoing.body);
        let mut failed: Option<(usize, ProxyError)> = None;
        let mut fresh_only = false;
        let pool = &target.pool;
        // A request sent again on a new connection keeps its place (as on
        // the HTTP/1 path).
        let mut kept: Option<Lease> = None;
        loop {
            let leased = match kept.take() {
                Some(lease) => Ok(lease),
                None => pool.lease(failed.as_ref().map(|f| f.0)).await,
            };
            let lease = match leased {
                Ok(lease) => lease,
                // Nobody else to try: the first failure is the answer.
                Err(refused) => {
                    return Err(
                        failed.map_or_else(|| ProxyError::refused(&pool.name, refused), |f| f.1)
                    )
                }
            };
            stream.noted.marks.leased = Some(Instant::now());
            // Only a log line names it (see the HTTP/1 exchange).
            if self.access_log.is_some() {
                stream.noted.backend = Some(Arc::clone(lease.shared()));
            }
            let backend = lease.backend();
            // A connection that speaks for one client is never shared.
            let header = match (&client.speaker, backend.send_proxy) {
                (Some(speaker), Some(version)) => Some(speaker.header(version, stream.request_id)),
                _ => None,
            };
            let reuse = (!fresh_only).then_some(check);
            let up = match upstream::open(backend, header.as_deref(), reuse, self.connect_timeout)
                .await
            {
                Ok(up) => up,
                Err(err) => {
                    if failed.is_none() {
                        err.blame_and_retry(backend, Some(stream.request_id));
                        failed = Some((backend.index, err));
                        continue;
                    }
                    err.blame(backend, Some(stream.request_id));
                    return Err(err);
                }
            };
            stream.noted.marks.got_connection(up.reused);
            let reused = up.reused;
            let sent = body.take().unwrap_or_else(body::empty);
            let to = Outbound {
                client_ip: &client.ip,
                client_cert: client.certificate.as_deref(),
                checks_client_certs: self.checks_client_certs,
                forwarded: self.forwarded,
                proto: self.proto,
                backend_authority: backend.authority.as_str(),
                request_id: stream.request_id.as_bytes(),
            };
            let relay = Relay::new(up, &parts, sent, &to, header.is_none());
            let progress = outgoing.progress.as_deref();
            match self
                .send(
                    relay,
                    &parts.method,
                    backend,
                    progress,
                    stream.delivery,
                    stream.request_id,
                )
                .await
            {
                Ok((head, relay)) => {
                    backend.answered();
                    let came = Instant::now();
                    let pause = outgoing.progress.clone();
                    let response =
                        self.respond(&head, relay, lease, drain, pause, stream.request_id);
                    // A head refused here never reached the client (`SH`).
                    if response.is_ok() {
                        stream.noted.marks.head = Some(came);
                    }
                    return response;
                }
                Err(Sent::Stale(_)) if reused && replayable && !fresh_only => {
                    tracing::debug!(pool = %backend.pool, backend = %backend.label, "a kept connection was closed under the request; sending it again on a new one");
                    fresh_only = true;
                    body = Some(body::empty());
                    kept = Some(lease);
                }
                // Another backend takes it, as on the HTTP/1 path.
                Err(Sent::Stale(cause)) if replayable && failed.is_none() => {
                    let err = ProxyError::closed_before_a_response(backend, &cause);
                    err.blame_and_retry(backend, Some(stream.request_id));
                    failed = Some((backend.index, err));
                    fresh_only = false;
                    body = Some(body::empty());
                }
                Err(Sent::Stale(cause)) => {
                    let err = ProxyError::closed_before_a_response(backend, &cause);
                    err.blame(backend, Some(stream.request_id));
                    return Err(err);
                }
                Err(Sent::Failed(err)) => return Err(err),
            }
        }
    }

    /// The request body to send upstream. Its first frame is awaited before
    /// a backend is chosen, so a body malformed from its first byte (the
    /// usual smuggling attempt) reaches no backend at all.
    async fn client_body(&self, incoming: RecvBody) -> Result<Outgoing, ProxyError> {
        if incoming.is_end_stream() {
            return Ok(Outgoing::empty());
        }
        let mut incoming = incoming;
        let first = tokio::time::timeout(self.idle_timeout, incoming.frame())
            .await
            .map_err(|_| ProxyError::ClientTimeout {
                seconds: self.idle_timeout.as_secs_f64(),
            })?;
        match first {
            // END_STREAM alone, in an empty DATA frame.
            None => Ok(Outgoing::empty()),
            Some(Err(RecvError::Reset(_))) => Err(ProxyError::ClientLeft),
            Some(Err(_)) => Err(ProxyError::Client {
                why: "malformed request body",
            }),
            Some(Ok(frame)) => {
                let (body, progress) = ClientBody::wrap(frame, incoming);
                Ok(Outgoing {
                    body,
                    progress: Some(progress),
                })
            }
        }
    }

    /// One try at one backend: the request goes up while the response
    /// head is awaited. The client's body `progress` tells a request that
    /// died of its own body (400), of a body that stopped coming (408), or
    /// of a client that left while sending it (no answer), from one the
    /// backend broke; `response_timeout` runs only once the whole request
    /// was sent.
    async fn send(
        &self,
        mut relay: Relay,
        method: &http::Method,
        backend: &Backend,
        progress: Option<&Progress>,
        delivery: Option<&Delivery>,
        request_id: &str,
    ) -> Result<(ResponseHead, Relay), Sent> {
        let backend_wait = relay.backend_wait();
        let watch = self.watch_exchange(progress, &backend_wait, &backend.name);
        let mut interim = |head| {
            if let Some(delivery) = delivery {
                delivery.interim(head);
            }
        };
        let outcome = tokio::select! {
            // A head already in wins over a watch whose clock ran out with
            // it.
            biased;
            head = relay.response_head(method, &mut interim) => Ok(head),
            stalled = watch => Err(stalled),
        };
        let err = match outcome {
            Ok(Ok(head)) => return Ok((head, relay)),
            Ok(Err(_)) if progress.is_some_and(Progress::client_left) => {
                return Err(Sent::Failed(ProxyError::ClientLeft))
            }
            Ok(Err(HeadFault::ClientBody)) => {
                return Err(Sent::Failed(ProxyError::Client {
                    why: "malformed or cut-off request body",
                }))
            }
            Ok(Err(_)) if progress.is_some_and(Progress::failed) => {
                return Err(Sent::Failed(ProxyError::Client {
                    why: "malformed or cut-off request body",
                }))
            }
            Err(err @ (ProxyError::ClientTimeout { .. } | ProxyError::BodyTooSlow { .. })) => {
                return Err(Sent::Failed(err));
            }
            Ok(Err(HeadFault::Backend {
                nothing_received: true,
                cause,
            })) => return Err(Sent::Stale(cause)),
            Ok(Err(HeadFault::Backend { cause, .. })) => ProxyError::Upstream {
                backend: backend.name.clone(),
                cause,
            },
            Ok(Err(HeadFault::BadHead(bad))) => ProxyError::Upstream {
                backend: backend.name.clone(),
                cause: bad.to_string(),
            },
            Ok(Err(HeadFault::RequestCutOff(cause))) => ProxyError::RequestCutOff {
                backend: backend.name.clone(),
                cause,
            },
            Err(err) => err,
        };
        err.blame(backend, Some(request_id));
        Err(Sent::Failed(err))
    }

    /// Resolves with the exchange's failure if the client's body stops for
    /// `idle_timeout` or falls behind `body_min_rate` (408), or once it is
    /// all sent, if the response head does not follow within
    /// `response_timeout` (504). While the upload waits on the backend the
    /// client's body is not read, so a backend that takes no bytes for
    /// `response_timeout` is the one that failed (504), the client's pause
    /// counts only from its last bytes or the backend's, whichever came
    /// later, and its pace only over the time it was not held back.
    async fn watch_exchange(
        &self,
        progress: Option<&Progress>,
        backend_wait: &BackendWait,
        backend: &str,
    ) -> ProxyError {
        let timeout = || ProxyError::Timeout {
            backend: backend.to_string(),
            seconds: self.response_timeout.as_secs_f64(),
        };
        let sent_at = loop {
            let Some((last, complete)) = progress.map(Progress::last) else {
                break Instant::now();
            };
            if complete {
                break last;
            }
            let waited = backend_wait.waiting_for();
            if waited.is_some_and(|w| w >= self.response_timeout) {
                if crate::telemetry::may_say_backend_fault() {
                    tracing::info!(
                        backend,
                        "the backend took no request bytes within response_timeout; 504"
                    );
                }
                return timeout();
            }
            let paused_since = last.max(backend_wait.last_moved());
            if waited.is_none() && paused_since.elapsed() >= self.idle_timeout {
                return ProxyError::ClientTimeout {
                    seconds: self.idle_timeout.as_secs_f64(),
                };
            }
            // How long the body may still take at its least pace, counted
            // (like its pauses) only while the backend is not waited on.
            let pace_left = match (self.body_pace, progress) {
                (Some(pace), Some(progress)) => {
                    let left = pace.allowance(progress.received(), backend_wait.clients_time());
                    if left.is_zero() && waited.is_none() {
                        return ProxyError::BodyTooSlow {
                            rate: pace.bytes_per_second(),
                        };
                    }
                    Some(left.max(pace::LOOK_AGAIN))
                }
                _ => None,
            };
            // Looked at again when something could be due, not before: the
            // client's pause, or the backend's wait (which may end at once,
            // and the client's pause count from then); the body's end, if
            // it comes meanwhile, starts a response clock due later still
            // (`response_timeout` from then), and so does a wait on the
            // backend that begins meanwhile. Every one is after `now`.
            let now = Instant::now();
            let next = match waited {
                Some(waited) => (now + self.response_timeout.saturating_sub(waited))
                    .min(now + self.idle_timeout),
                None => paused_since + self.idle_timeout,
            };
            let pace_due = pace_left.map_or(next, |left| now + left);
            tokio::time::sleep_until(next.min(pace_due).min(now + self.response_timeout)).await;
        };
        tokio::time::sleep_until(sent_at + self.response_timeout).await;
        timeout()
    }

    /// Turns the backend's response into the client's; its body holds the
    /// lease until it ends, and ends the stream if the client's `upload`
    /// stops meanwhile.
    fn respond(
        &self,
        head: &ResponseHead,
        relay: Relay,
        lease: Lease,
        drain: &DrainWatch,
        upload: Option<Arc<Progress>>,
        request_id: &str,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let backend = Arc::clone(lease.shared());
        let pause = upload.map(|progress| ClientPause::new(progress, self.idle_timeout));
        let event_stream = head
            .values("content-type")
            .next()
            .is_some_and(longlived::is_event_stream);
        let silence = Silence::new(if event_stream {
            self.tunnel_timeout
        } else {
            self.response_timeout
        });
        let response = relay.respond(head, lease, pause, silence).map_err(|bad| {
            let err = ProxyError::Upstream {
                backend: backend.name.clone(),
                cause: bad.to_string(),
            };
            err.blame(&backend, Some(request_id));
            err
        })?;
        // One of stated length runs to its end, as on the HTTP/1 path: an
        // h2 client takes a body short of its Content-Length for a
        // malformed response (RFC 9113 §8.1.1).
        let ends_for_drain = event_stream && !matches!(head.framing, Framing::Length(_));
        let (drain, listener) = (drain.clone(), Arc::clone(&self.listener));
        Ok(response.map(|b| {
            let body = b.boxed_unsync();
            if ends_for_drain {
                longlived::SseBody::wrap(body, drain, listener)
            } else {
                body
            }
        }))
    }
}

/// What one h2 client connection's streams share.
struct H2Client {
    /// Who it is (a PROXY header's word, where one was taken).
    peer: SocketAddr,
    /// Its address as X-Forwarded-For writes it, formatted once.
    ip: String,
    /// Whom its backend connections speak for, when a pool sends PROXY
    /// headers (`None` when none of the listener's pools does).
    speaker: Option<Speaker>,
    /// The identity its certificate proved, as `X-Forwarded-Client-Cert`
    /// writes it, made once.
    certificate: Option<String>,
}

/// One stream as `forward` carries it: its connection's client, its id,
/// what it notes for the access log, and where its interim responses go.
struct Stream<'a> {
    client: &'a H2Client,
    request_id: &'a str,
    noted: &'a mut Noted,
    delivery: Option<&'a Delivery>,
}

/// Why a try at a backend got no response.
enum Sent {
    /// The connection was closed under the request before a byte came
    /// back: a new connection (after a kept one) or another backend (after
    /// a new one) may take it, when that is safe. It holds the cause.
    Stale(String),
    Failed(ProxyError),
}

/// Why a request is refused before it goes anywhere: a field list larger
/// than an HTTP/1 head may be (`MAX_HEAD`, announced as
/// SETTINGS_MAX_HEADER_LIST_SIZE; the connection marks it) or more fields
/// than an HTTP/1 client may send (431), an `Expect` other than
/// `100-continue` (417), or an `ambiguity` (400).
fn refusal<B>(req: &Request<B>) -> Option<ProxyError> {
    if req.extensions().get::<ListTooLarge>().is_some() {
        return Some(ProxyError::ListTooLarge {
            max: MAX_HEAD as u32,
        });
    }
    // Browsers send each cookie as a field of its own (RFC 9113 §8.2.3);
    // they go up joined, as one line, and count as one.
    // Looked for only past the bound: most requests are far under it.
    let headers = req.headers();
    let crumbs = || headers.get_all(COOKIE).iter().count().saturating_sub(1);
    if headers.len() > MAX_FIELDS && headers.len() - crumbs() > MAX_FIELDS {
        return Some(ProxyError::TooManyFields { max: MAX_FIELDS });
    }
    // An expectation no one on the way will meet: 417, as on the HTTP/1
    // path (`100-continue` is all a proxy's next hop can be asked).
    let unmet = |v: &HeaderValue| !expectation_met(v.as_bytes());
    if headers.get_all(EXPECT).iter().any(unmet) {
        return Some(ProxyError::ExpectationFailed);
    }
    ambiguity(req).map(|why| ProxyError::Client { why })
}

/// A request two parties could read two ways (the stuff of request
/// smuggling) that the h2 layer lets through: refused, never forwarded.
fn ambiguity<B>(req: &Request<B>) -> Option<&'static str> {
    let mut hosts = req.headers().get_all(HOST).iter();
    if let Some(host) = hosts.next() {
        if hosts.next().is_some() {
            return Some("more than one Host header");
        }
        // It routes a request without `:authority`, and an HTTP/1 backend
        // would trim or read otherwise what a plain authority is not.
        if !valid_authority(host.as_bytes()) {
            return Some("invalid Host header");
        }
    }
    // Written as the backend's `Host`: held to what `Host` is (no
    // userinfo, RFC 9113 §8.3.1; digits after one colon).
    if let Some(authority) = req.uri().authority() {
        if !valid_authority(authority.as_str().as_bytes()) {
            return Some("invalid :authority");
        }
    }
    if req.method() == http::Method::CONNECT {
        return Some("CONNECT: baton is no forward proxy");
    }
    if crate::proxy::h1::head::standard_method_in_another_case(req.method().as_str().as_bytes()) {
        return Some("a standard method in another case");
    }
    // The length goes to an HTTP/1 backend as written: it must have one
    // meaning there too.
    let mut lengths = req.headers().get_all(CONTENT_LENGTH).iter();
    if let Some(length) = lengths.next() {
        let digits = length.as_bytes();
        // Nineteen digits at most, as an HTTP/1 client's: a backend with a
        // bound of its own on digits would read a longer one otherwise.
        let digits_ok = (1..=19).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit);
        if lengths.next().is_some() || !digits_ok {
            return Some("invalid or repeated Content-Length");
        }
    }
    // Written as the HTTP/1 request target: origin-form, or `*` for OPTIONS.
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let asterisk = req.method() == http::Method::OPTIONS && target == "*";
    if !target.starts_with('/') && !asterisk {
        return Some("invalid request target");
    }
    None
}

/// baton's own answer to a request that failed. The client learns the
/// status and a request id, never a backend's name, address or OS error:
/// those go to the log under the same id (and the backend's `last_error`
/// in `/status`). A HEAD (`head_asked`) gets no body, as from the HTTP/1
/// path: DATA on a HEAD's answer is a stream error to h2 clients, which
/// saw a reset (nghttp2's) or a failed body (hyper's) where a 502 was said.
fn error_response(
    pool: &str,
    err: &ProxyError,
    request_id: &str,
    head_asked: bool,
) -> Response<ProxyBody> {
    // Made (and so logged) for a HEAD too; only not sent.
    let page = super::error_page(pool, err, request_id);
    let page = match head_asked {
        true => body::empty(),
        false => body::text(page),
    };
    let mut response = Response::new(page);
    *response.status_mut() = err.status();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    // As the HTTP/1 path's own answers (`rewrite::own_answer`).
    headers::add_date_if_missing(response.headers_mut());
    headers::add_via(response.headers_mut(), "1.1 baton");
    response
}
