//! One request's way through baton: its body's first bytes are in hand
//! before a backend is chosen (a body malformed from its first byte reaches
//! no backend), then a backend connection (an idle one the backend kept,
//! or a new one), the head and body up, the response down, and the
//! backend connection back to its idle list when both sides keep it.
//! Failures are answered here with baton's own short error page while no
//! response byte has gone out, and end the connection after.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::time::Instant;

use super::alarm::Alarm;
use super::head::{Framing, RequestHead};
use super::io::{ack_promptly, read_some, release_if_empty, write_all, Counting, WriteFault};
use super::record::{Record, Trace};
use super::rewrite::{self, Outbound};
use super::transfer::{
    download, upload, watch_client, Delivered, Down, DownFault, RequestBody, UpFault, UpLimits,
};
use super::upgraded::{Switched, Tunnel};
use super::upstream::{connection, keep, Kept, Upstream};
use crate::access_log::{Phase, Termination};
use crate::backend::idle::Check;
use crate::backend::{Backend, Lease, NoLease, Pool};
use crate::lifecycle::drain::DrainWatch;
use crate::metrics::{self, UpstreamErrorKind};
use crate::proxy::request_id::RequestId;
use crate::proxy::web::HttpProxy;
use crate::proxy::{reset, ProxyError};
use crate::proxy_protocol::Origin;
use crate::stream::ByteStream;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A client connection between requests: its socket and what it sent
/// that no request has taken yet (a pipelined request).
pub struct Client<S> {
    pub stream: S,
    pub buf: BytesMut,
    /// Who it is from and to (a PROXY header's word, where one was taken).
    pub origin: Origin,
    /// Its address as forwarding headers write it.
    pub ip: String,
    /// The identity its TLS certificate proved, as
    /// `X-Forwarded-Client-Cert` writes it.
    pub certificate: Option<Box<str>>,
    /// A backend connection that carried its PROXY header, kept for its
    /// next request (`send_proxy`).
    pub kept: Option<Kept>,
    /// Whom its PROXY headers speak for, once one was sent (boxed: most
    /// connections send none, and an idle one holds only the pointer).
    pub speaker: Option<Box<crate::proxy_protocol::send::Speaker>>,
    /// The connection's one timer: its idle, head and response clocks.
    pub alarm: Alarm,
    /// The client may still be sending when its connection closes (its
    /// last request's body not read whole, a pipelined request, a body
    /// behind a head refused for what it asks): the close lingers long
    /// enough for it to finish and read the answer.
    pub upload_unread: bool,
    /// Its socket is set to reset when closed (a tunnel's backend failed):
    /// it is closed as it is, without the graceful close's FIN, which
    /// would reach the client first and pass the abort off as an end. Set
    /// only with `SO_LINGER` 0 ([`reset::once_taken`]): without it the
    /// close would be a FIN after all, and skip the graceful close's
    /// reading of what the client still sends.
    pub reset: bool,
}

impl<S> Client<S> {
    pub fn new(
        stream: S,
        buf: BytesMut,
        origin: Origin,
        certificate: Option<Box<str>>,
    ) -> Client<S> {
        Client {
            stream,
            buf,
            origin,
            ip: crate::proxy::headers::ip_text(origin.client.ip()),
            certificate,
            kept: None,
            speaker: None,
            alarm: Alarm::new(),
            upload_unread: false,
            reset: false,
        }
    }
}

/// Whether the client connection carries another request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    KeepAlive,
    Close,
}

/// How a request ended that got no answer of its own.
enum Failure {
    /// baton answers with an error page (no response byte went out yet).
    Answer(ProxyError),
    /// Nothing more can be said on this connection: it closes (who
    /// ended it, for the access log).
    Abort(Termination),
}

/// How one try at a backend went.
enum Attempt {
    Answered {
        status: u16,
        after: After,
    },
    /// The backend switched protocols: the connection is a tunnel now.
    Upgraded(Switched),
    /// The connection failed before a byte came back: a reused one may
    /// have been closed by the backend while idle (a fresh one is tried),
    /// a new one closed by a backend that takes connections and drops
    /// them (another backend is tried), when the request is safe to send
    /// again. It holds the cause, for the answer if it is not sent again.
    Stale(String),
    Failed(Failure),
}

/// How an exchange left its client connection.
pub enum Served<'p> {
    /// Answered: the connection carries another request, or closes.
    Done(After),
    /// Switched to another protocol: the rest of the connection's life is
    /// the tunnel's (boxed by the caller at its own size, where inside the
    /// exchange it held the exchange's whole allocation for hours). Boxed
    /// until its run takes it in: most exchanges are not upgraded.
    Upgraded(Box<Tunnel<'p>>),
}

/// How a request that reached a backend ended.
enum Forwarded {
    Answered { status: u16, after: After },
    Upgraded { lease: Lease, switched: Switched },
}

/// Serves one request and says what is next for its connection.
pub async fn exchange<'p, S: ByteStream>(
    proxy: &'p HttpProxy,
    client: &mut Client<S>,
    head: RequestHead,
    drain: &DrainWatch,
    began: Instant,
) -> Served<'p> {
    let target = proxy.target_for(head.host(), head.path());
    let mut body = RequestBody::new(head.framing);
    let sent = head.values("x-request-id").next();
    let id = RequestId::from_client(sent, proxy.forwarded);
    let mut record = Record::new(
        proxy.access_log.as_ref(),
        head,
        target,
        client.origin.client,
        id,
        began,
    );
    let head = &record.head;
    let request = InFlight {
        head,
        body: &mut body,
        trace: &mut record.trace,
    };
    let outcome = match forward(proxy, client, request, &target.pool, drain).await {
        Ok(Forwarded::Answered { status, after }) => Ok((status, after, Termination::Completed)),
        Ok(Forwarded::Upgraded { lease, switched }) => {
            return Served::Upgraded(Box::new(Tunnel::new(
                record,
                lease,
                switched,
                body.received(),
            )))
        }
        Err(Failure::Abort(termination)) => Err(termination),
        Err(Failure::Answer(err)) => {
            if matches!(err, ProxyError::NoBackend { .. }) {
                super::super::no_backend(&proxy.listener, &target.pool.name);
            }
            let closes =
                err.is_client_fault() || drain.is_draining() || !head.keep_alive || !body.is_done();
            let status = err.status();
            let trace = &mut record.trace;
            let page = super::super::error_page(&target.pool.name, &err, &trace.request_id);
            let mut out = BytesMut::new();
            let head_len = rewrite::own_answer(status, &page, Some(head), closes, &mut out);
            let written = write_all(&mut client.stream, &out, proxy.idle_timeout).await;
            trace.status = Some(status.as_u16());
            let after = match written {
                Ok(()) => {
                    trace.bytes_out += out.len() as u64;
                    trace.head_out += head_len as u64;
                    if closes {
                        After::Close
                    } else {
                        After::KeepAlive
                    }
                }
                Err(_) => After::Close,
            };
            Ok((status.as_u16(), after, err.termination(&trace.marks)))
        }
    };
    release_if_empty(&mut client.buf);
    // A client still writing the body its answer came before gets the
    // time to finish it (one that was too slow with it does not), and so
    // does one whose next request came pipelined, its body maybe with it.
    let ended = match &outcome {
        Ok((_, _, termination)) | Err(termination) => *termination,
    };
    let slow = matches!(ended, Termination::ClientTimeout(_));
    client.upload_unread = (!body.is_done() && !slow) || !client.buf.is_empty();
    let body_bytes = body.received();
    let (status, after, termination) = match outcome {
        Ok(answered) => answered,
        Err(termination) => {
            // A body that ends with the connection and broke off ends it
            // with a reset: a close (or TLS's close_notify) would pass the
            // cut body off as whole, where a stated length or chunks let
            // the client see it cut.
            let cut = matches!(
                termination,
                Termination::BackendFailed(_) | Termination::BackendTimeout(_)
            );
            if cut && record.trace.until_close {
                reset::once_taken(client.stream.tcp()).await;
                client.reset = true;
            }
            // Its head went out before it broke off: it was answered, and
            // is counted.
            record.end(termination, body_bytes);
            return Served::Done(After::Close);
        }
    };
    record.trace.status = Some(status);
    record.end(termination, body_bytes);
    Served::Done(after)
}

/// The request an exchange carries, and what it notes on the way.
struct InFlight<'a> {
    head: &'a RequestHead,
    body: &'a mut RequestBody,
    trace: &'a mut Trace,
}

/// Waits in line for a place (`Pool::lease`). A client that goes away
/// meanwhile loses its place, and its request reaches no backend. Watched
/// only once its body is all in (`watched`): what it sends meanwhile is
/// then its next request, kept as once the request is sent (unread body
/// bytes are the upload's to read).
async fn in_line<S: ByteStream>(
    pool: &Pool,
    exclude: Option<usize>,
    client: &mut Client<S>,
    watched: bool,
) -> Result<Result<Lease, NoLease>, Failure> {
    tokio::select! {
        biased;
        leased = pool.lease(exclude) => Ok(leased),
        () = watch_client(&mut client.stream, &mut client.buf), if watched => {
            Err(Failure::Abort(Termination::ClientAborted(Phase::Queue)))
        }
    }
}

async fn forward<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    mut request: InFlight<'_>,
    pool: &Pool,
    drain: &DrainWatch,
) -> Result<Forwarded, Failure> {
    let head = request.head;
    if !request.body.is_done() {
        // A client that waits for a 100 before it uploads is told now that
        // no backend is up, not after its upload (HAProxy, which passes
        // the expectation on, answers at once too).
        if head.expect_continue && client.buf.is_empty() && pool.healthy_count() == 0 {
            let refused = ProxyError::refused(&pool.name, NoLease::NoBackend);
            return Err(Failure::Answer(refused));
        }
        first_body_bytes(proxy, client, head, request.body).await?;
    }
    // Sent again only with nothing to resend: no body, an idempotent
    // method (RFC 9110 §9.2.2: PUT and DELETE too, as nginx resends).
    let replayable = head.framing == Framing::Empty && head.method.is_idempotent();
    let check = Check::before_request(replayable);
    let mut failed: Option<(usize, ProxyError)> = None;
    let mut fresh_only = false;
    // A request sent again on a new connection keeps its place: given up,
    // it would go to whoever waits in line, and the request behind them.
    let mut kept: Option<Lease> = None;
    loop {
        let exclude = failed.as_ref().map(|f| f.0);
        let leased = match kept.take().or_else(|| pool.pick(exclude)) {
            Some(lease) => Ok(lease),
            None => in_line(pool, exclude, client, request.body.is_done()).await?,
        };
        let lease = match leased {
            Ok(lease) => lease,
            Err(refused) => {
                return Err(Failure::Answer(
                    failed.map_or_else(|| ProxyError::refused(&pool.name, refused), |f| f.1),
                ))
            }
        };
        let trace = &mut *request.trace;
        // Only a log line names the backend and reads the time: without
        // one, no count of the backend's that every worker would write
        // twice a request, nor a clock read (the mark still says which
        // step a failure came in).
        trace.marks.leased = Some(if proxy.access_log.is_some() {
            trace.backend = Some(Arc::clone(lease.shared()));
            Instant::now()
        } else {
            trace.marks.started
        });
        let upstream = match connection(
            client,
            lease.backend(),
            (!fresh_only).then_some(check),
            proxy.connect_timeout,
            &trace.request_id,
        )
        .await
        {
            Ok(upstream) => {
                trace.marks.got_connection(upstream.reused);
                upstream
            }
            // Nothing was sent: another backend may take it.
            Err(err) if failed.is_none() => {
                err.blame_and_retry(lease.backend(), Some(&trace.request_id));
                failed = Some((lease.backend().index, err));
                continue;
            }
            Err(err) => {
                err.blame(lease.backend(), Some(&trace.request_id));
                return Err(Failure::Answer(err));
            }
        };
        let reused = upstream.reused;
        match attempt(proxy, client, &mut request, &lease, upstream, drain).await {
            Attempt::Answered { status, after } => {
                return Ok(Forwarded::Answered { status, after })
            }
            Attempt::Upgraded(switched) => return Ok(Forwarded::Upgraded { lease, switched }),
            Attempt::Stale(_) if reused && replayable && !fresh_only => {
                tracing::debug!(pool = %lease.backend().pool, backend = %lease.backend().label, "a kept connection was closed under the request; sending it again on a new one");
                fresh_only = true;
                kept = Some(lease);
            }
            // A backend that takes connections and drops them (a dead
            // application behind a listener that still accepts): another
            // backend takes a request safe to send again, once, as after a
            // failed connect (nginx's `proxy_next_upstream error`).
            Attempt::Stale(cause) if replayable && failed.is_none() => {
                let err = ProxyError::closed_before_a_response(lease.backend(), &cause);
                err.blame_and_retry(lease.backend(), Some(&request.trace.request_id));
                failed = Some((lease.backend().index, err));
                fresh_only = false;
            }
            Attempt::Stale(cause) => {
                let err = ProxyError::closed_before_a_response(lease.backend(), &cause);
                err.blame(lease.backend(), Some(&request.trace.request_id));
                return Err(Failure::Answer(err));
            }
            Attempt::Failed(failure) => return Err(failure),
        }
    }
}

/// Waits until the body's first bytes are in and framed well (a 100
/// Continue first, if the client waits for one).
async fn first_body_bytes<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    head: &RequestHead,
    body: &mut RequestBody,
) -> Result<(), Failure> {
    if head.expect_continue && client.buf.is_empty() {
        write_all(&mut client.stream, CONTINUE, proxy.idle_timeout)
            .await
            .map_err(|_| Failure::Abort(Termination::ClientAborted(Phase::Request)))?;
    }
    body.take(&mut client.buf).map_err(|_| malformed_body())?;
    if !body.is_done() {
        ack_promptly(&client.stream);
    }
    loop {
        if !body.framed.is_empty() || body.is_done() {
            return Ok(());
        }
        match tokio::time::timeout(
            proxy.idle_timeout,
            read_some(&mut client.stream, &mut client.buf),
        )
        .await
        {
            Err(_) => return Err(Failure::Answer(client_timeout(proxy.idle_timeout))),
            Ok(Ok(0) | Err(_)) => {
                return Err(Failure::Abort(Termination::ClientAborted(Phase::Request)))
            }
            Ok(Ok(_)) => {}
        }
        body.take(&mut client.buf).map_err(|_| malformed_body())?;
    }
}

fn malformed_body() -> Failure {
    Failure::Answer(ProxyError::Client {
        why: "malformed or cut-off request body",
    })
}

fn client_timeout(limit: Duration) -> ProxyError {
    ProxyError::ClientTimeout {
        seconds: limit.as_secs_f64(),
    }
}

/// How the two directions of one try ended.
enum Pumped {
    Delivered(Delivered),
    Down(DownFault),
    Up(UpFault),
    ResponseTimeout,
    /// `response_timeout` ran out again during a 1xx begun since it was
    /// put off for one (see `pump`).
    InterimsPastTimeout,
    ClientGone,
}

async fn attempt<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    request: &mut InFlight<'_>,
    lease: &Lease,
    mut up: Upstream,
    drain: &DrainWatch,
) -> Attempt {
    let (head, body) = (request.head, &mut *request.body);
    let backend = lease.backend();
    let mut out = BytesMut::with_capacity(head.bytes.len() + 256 + body.framed.len());
    let to = Outbound {
        client_ip: &client.ip,
        client_cert: client.certificate.as_deref(),
        checks_client_certs: proxy.checks_client_certs,
        forwarded: proxy.forwarded,
        proto: proxy.proto,
        backend_authority: backend.authority.as_str(),
        request_id: request.trace.request_id.as_bytes(),
    };
    rewrite::request(head, &to, &mut out);
    out.put_slice(&body.framed);
    body.framed.clear();
    match write_all(&mut up.stream, &out, proxy.response_timeout).await {
        Ok(()) => {}
        Err(WriteFault::Failed(e)) => return Attempt::Stale(e.to_string()),
        // Not a connection the backend closed: one that holds what it was
        // sent and takes no more, as a backend that stops taking an upload
        // (nginx's `proxy_send_timeout`, HAProxy's `timeout server`).
        Err(WriteFault::Stalled) => return timed_out(proxy, backend, &request.trace.request_id),
    }
    // Sent: not held through the response (and a tunnel's hour), up to
    // 128 KiB of a head and the body's first bytes.
    drop(out);
    let progress = &request.trace.attempt;
    progress
        .upload_done
        .store(body.is_done(), Ordering::Relaxed);
    let down = Down {
        request: head,
        backend,
        drain,
        listener: &proxy.listener,
        client_stall: proxy.idle_timeout,
        backend_silence: proxy.response_timeout,
        event_silence: proxy.tunnel_timeout,
        progress,
    };
    let pumped = pump(proxy, client, &mut up, body, &down).await;
    let written = progress.client_written.load(Ordering::Relaxed);
    // The upload runs beside the download, so its fault can come while a
    // head is half written: that counts as written too (looked at only
    // when the upload failed).
    let begun = matches!(pumped, Pumped::Up(_)) && progress.response_begun();
    let upload_done = progress.upload_done.load(Ordering::Relaxed);
    request.trace.note();
    match pumped {
        Pumped::Delivered(Delivered::Done {
            status,
            backend_reuse,
            client_reusable,
        }) => {
            if let (Some(check), true) = (backend_reuse, upload_done) {
                release_if_empty(&mut up.buf);
                keep(client, backend, up.stream, check);
            } else {
                // Given up on, as the h2 relay gives one up: a TLS
                // backend gets its `close_notify`.
                up.stream.close_quietly();
            }
            let after = if client_reusable && upload_done {
                After::KeepAlive
            } else {
                After::Close
            };
            Attempt::Answered { status, after }
        }
        Pumped::Delivered(Delivered::Upgraded { websocket }) => {
            Attempt::Upgraded(Switched { up, websocket })
        }
        // Not a byte of answer on a new connection, and the body still
        // going up: the backend would not take the whole request (`SR`),
        // not one it took and then failed. (On a kept connection it is
        // the race with the backend's idle close, `SH` as before.)
        Pumped::Down(DownFault::Backend {
            nothing_received: true,
            cause,
        }) if !written && !upload_done && !up.reused => {
            let err = ProxyError::RequestCutOff {
                backend: backend.name.clone(),
                cause,
            };
            err.blame(backend, Some(&request.trace.request_id));
            Attempt::Failed(Failure::Answer(err))
        }
        Pumped::Down(DownFault::Backend {
            nothing_received: true,
            cause,
        }) if !written => Attempt::Stale(cause),
        Pumped::Down(fault) => {
            let id = &request.trace.request_id;
            Attempt::Failed(down_failure(proxy, backend, fault, written, id))
        }
        Pumped::Up(fault) => Attempt::Failed(up_failure(proxy, backend, fault, begun)),
        Pumped::ResponseTimeout => timed_out(proxy, backend, &request.trace.request_id),
        // A 504 cannot follow a head cut in two: closed, blaming no one.
        Pumped::InterimsPastTimeout => {
            Attempt::Failed(Failure::Abort(Termination::BackendTimeout(Phase::Head)))
        }
        Pumped::ClientGone => {
            Attempt::Failed(Failure::Abort(Termination::ClientAborted(Phase::Head)))
        }
    }
}

/// Runs the upload (while the body lasts) and the download side by side;
/// once the request is all sent, the response head must come within
/// `response_timeout`, and a client that goes away ends the exchange.
async fn pump<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    up: &mut Upstream,
    body: &mut RequestBody,
    down: &Down<'_>,
) -> Pumped {
    let (mut client_r, client_w) = client.stream.halves();
    let mut client_w = Counting::new(client_w, &down.progress.bytes_out);
    let (mut backend_r, mut backend_w) = up.stream.halves();
    let downloading = download(&mut backend_r, &mut up.buf, &mut client_w, down);
    tokio::pin!(downloading);
    // When the response head is due: `response_timeout` after the request
    // went up whole.
    let mut head_due = Instant::now() + proxy.response_timeout;
    if !body.is_done() {
        let limits = UpLimits {
            client_pause: proxy.idle_timeout,
            backend_stall: proxy.response_timeout,
            pace: proxy.body_pace,
        };
        // Said as the last write ends, not when this select next looks:
        // the download, polled first, may meet a head meanwhile, and a 101
        // is taken only for a request that went up whole.
        let uploading = async {
            let sent = upload(
                &mut client_r,
                &mut client.buf,
                &mut backend_w,
                body,
                &limits,
            )
            .await;
            if sent.is_ok() {
                down.progress.upload_done.store(true, Ordering::Relaxed);
            }
            sent
        };
        tokio::pin!(uploading);
        tokio::select! {
            sent = &mut uploading => match sent {
                Ok(()) => {
                    head_due = Instant::now() + proxy.response_timeout;
                }
                // It may have answered early: its answer decides. One that
                // took no bytes for `response_timeout` has had its time: a
                // head not in by now is not waited for again (a 504 then,
                // not after twice the timeout).
                Err(UpFault::BackendGone(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                    head_due = Instant::now();
                }
                Err(UpFault::BackendGone(_)) => head_due = Instant::now() + proxy.response_timeout,
                Err(fault) => return Pumped::Up(fault),
            },
            got = &mut downloading => return delivered(got),
        }
    }
    let gone = watch_client(&mut client_r, &mut client.buf);
    tokio::pin!(gone);
    let mut clock = true;
    // The response heads' bytes as they stood when the clock was last put
    // off for a 1xx being written.
    let mut put_off_at: Option<u64> = None;
    loop {
        tokio::select! {
            // A head already in wins over a clock that ran out with it.
            biased;
            got = &mut downloading => return delivered(got),
            () = &mut gone => return Pumped::ClientGone,
            () = client.alarm.until(head_due), if clock => {
                let heads = down.progress.head_out.load(Ordering::Relaxed);
                if down.progress.interim_writing.load(Ordering::Relaxed) {
                    // A client that takes no 1xx bytes holds the final
                    // head back: its own stall clock, in that write,
                    // judges it; counted against the backend, it let a
                    // client mark backends down. Put off for that one
                    // 1xx alone: one begun since is a backend sending
                    // 1xx without end (the client got them as long as it
                    // went on) or a client reading a few of them slowly;
                    // baton cannot tell which, so the exchange ends
                    // there, charged to no one.
                    if put_off_at.is_some_and(|at| at != heads) {
                        return Pumped::InterimsPastTimeout;
                    }
                    put_off_at = Some(heads);
                    head_due = Instant::now() + proxy.response_timeout;
                    continue;
                }
                if down.progress.head_at.get().is_none() {
                    return Pumped::ResponseTimeout;
                }
                clock = false;
            }
        }
    }
}

/// A backend that had `response_timeout` and let it pass: a 504, and a
/// timeout charged to it.
fn timed_out(proxy: &HttpProxy, backend: &Backend, request_id: &str) -> Attempt {
    let err = ProxyError::Timeout {
        backend: backend.name.clone(),
        seconds: proxy.response_timeout.as_secs_f64(),
    };
    err.blame(backend, Some(request_id));
    Attempt::Failed(Failure::Answer(err))
}

fn delivered(got: Result<Delivered, DownFault>) -> Pumped {
    match got {
        Ok(d) => Pumped::Delivered(d),
        Err(fault) => Pumped::Down(fault),
    }
}

fn down_failure(
    proxy: &HttpProxy,
    backend: &Backend,
    fault: DownFault,
    written: bool,
    request_id: &str,
) -> Failure {
    let cause = match fault {
        DownFault::Client(WriteFault::Stalled) => {
            if crate::telemetry::may_say_client_fault() {
                tracing::info!(listener = %proxy.listener, "client took no response bytes within idle_timeout; closing");
            }
            metrics::client_abort(&proxy.listener, metrics::AbortReason::StalledReader);
            return Failure::Abort(Termination::ClientTimeout(Phase::Data));
        }
        DownFault::Client(WriteFault::Failed(_)) => {
            return Failure::Abort(Termination::ClientAborted(Phase::Data))
        }
        DownFault::BrokeOff(cause) => {
            backend.upstream_failed(
                UpstreamErrorKind::Protocol,
                &format!("response broke off: {cause}"),
                false,
            );
            if crate::telemetry::may_say_backend_fault() {
                tracing::warn!(pool = %backend.pool, backend = %backend.label, %cause, "backend response broke off; aborting the client connection");
            }
            return Failure::Abort(Termination::BackendFailed(Phase::Data));
        }
        DownFault::Silent(limit) => {
            backend.upstream_failed(
                UpstreamErrorKind::Timeout,
                &format!("no response body bytes within {limit:?}"),
                false,
            );
            if crate::telemetry::may_say_backend_fault() {
                tracing::warn!(pool = %backend.pool, backend = %backend.label, ?limit, "backend sent no body bytes within its limit; aborting the client connection");
            }
            return Failure::Abort(Termination::BackendTimeout(Phase::Data));
        }
        DownFault::Backend { cause, .. } => cause,
        DownFault::BadHead(bad) => bad.to_string(),
    };
    let err = ProxyError::Upstream {
        backend: backend.name.clone(),
        cause,
    };
    err.blame(backend, Some(request_id));
    if written {
        Failure::Abort(Termination::BackendFailed(Phase::Data))
    } else {
        Failure::Answer(err)
    }
}

fn up_failure(proxy: &HttpProxy, backend: &Backend, fault: UpFault, written: bool) -> Failure {
    // What the client is answered, or, once the response has begun and it
    // is too late to answer, how the closed connection is logged: a body
    // that stopped or fell behind is the client's timeout (`cD`, as on
    // h2), a bad one its fault in the data's phase.
    let (err, too_late) = match fault {
        UpFault::Malformed(_) => (
            ProxyError::Client {
                why: "malformed or cut-off request body",
            },
            Termination::ClientAborted(Phase::Data),
        ),
        UpFault::Stalled => {
            // Unanswered, the error page logs it (`proxy::error_page`).
            if written && crate::telemetry::may_say_client_fault() {
                tracing::info!(listener = %proxy.listener, pool = %backend.pool, backend = %backend.label, "request body stopped arriving after the response began; closing");
            }
            (
                client_timeout(proxy.idle_timeout),
                Termination::ClientTimeout(Phase::Data),
            )
        }
        UpFault::TooSlow => {
            let rate = proxy.body_pace.map_or(0, |p| p.bytes_per_second());
            if written && crate::telemetry::may_say_client_fault() {
                tracing::info!(listener = %proxy.listener, pool = %backend.pool, backend = %backend.label, rate, "request body fell behind body_min_rate after the response began; closing");
            }
            (
                ProxyError::BodyTooSlow { rate },
                Termination::ClientTimeout(Phase::Data),
            )
        }
        UpFault::ClientGone => {
            let phase = if written { Phase::Data } else { Phase::Request };
            return Failure::Abort(Termination::ClientAborted(phase));
        }
        UpFault::BackendGone(_) => {
            return Failure::Abort(Termination::BackendFailed(Phase::Request))
        }
    };
    if written {
        Failure::Abort(too_late)
    } else {
        Failure::Answer(err)
    }
}
