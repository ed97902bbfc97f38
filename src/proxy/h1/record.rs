//! What one HTTP/1 exchange leaves in the access log: gathered as the
//! exchange goes ([`Trace`]), written once when it ends, however it ends.
//! The line is written by [`Record`]'s drop, so a task the drain deadline
//! cuts off mid-exchange still leaves its line (termination `K`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use crate::access_log::{AccessLog, Entry, Marks, Termination};
use crate::backend::Backend;
use crate::metrics::RequestMetrics;
use crate::proxy::request_id::RequestId;
use crate::proxy::web::Target;

use super::head::{RequestHead, Version};
use super::transfer::Progress;

/// One exchange's facts as they come in.
pub struct Trace {
    /// Sent to the backend as `X-Request-Id`, named on error pages and in
    /// the log line.
    pub request_id: RequestId,
    pub marks: Marks,
    pub backend: Option<Arc<Backend>>,
    /// The status that went to the client, once one did.
    pub status: Option<u16>,
    pub bytes_out: u64,
    /// How many of `bytes_out` were response heads (1xx, final, baton's
    /// own): the combined format's size is the rest.
    pub head_out: u64,
    /// Bytes the client sent through an upgraded connection's tunnel.
    pub tunnelled_in: u64,
    /// The response went to the client delimited by the connection's end
    /// (see `Progress::until_close`).
    pub until_close: bool,
    /// The attempt at a backend under way. Here, not in the attempt, so an
    /// exchange the drain deadline cuts off mid-response (its task dropped,
    /// `note` never reached) still logs and counts what went out.
    pub attempt: Progress,
}

impl Trace {
    /// An exchange's facts before any came in: its clock starts now, its
    /// request's first byte came at `began`.
    fn new(request_id: RequestId, began: Instant) -> Trace {
        Trace {
            request_id,
            marks: Marks::since(began),
            backend: None,
            status: None,
            bytes_out: 0,
            head_out: 0,
            tunnelled_in: 0,
            until_close: false,
            attempt: Progress::default(),
        }
    }

    /// Folds in what the attempt under way saw: when the response head
    /// came, the status and the bytes that went to the client; the next
    /// attempt starts afresh.
    pub fn note(&mut self) {
        let progress = std::mem::take(&mut self.attempt);
        if let Some(at) = progress.head_at.get() {
            self.marks.head = Some(*at);
        }
        // The status is the client's only once the head began to go out
        // (a drain's deadline may cut a head still waiting to be written).
        let status = progress.status.load(Ordering::Relaxed);
        let bytes_out = progress.bytes_out.load(Ordering::Relaxed);
        let went_out = bytes_out > 0 || progress.client_written.load(Ordering::Relaxed);
        if status != 0 && went_out {
            self.status = Some(status);
        }
        self.bytes_out += bytes_out;
        self.head_out += progress.head_out.load(Ordering::Relaxed);
        self.tunnelled_in += progress.tunnelled_in.load(Ordering::Relaxed);
        self.until_close |= progress.until_close.load(Ordering::Relaxed);
    }
}

/// An exchange's log line, written when it is dropped, and its count.
pub struct Record<'a> {
    log: Option<&'a AccessLog>,
    /// Owned, so an upgraded exchange's record can go on into its tunnel
    /// with it (the line is written at the tunnel's end).
    pub head: RequestHead,
    target: &'a Target,
    client: SocketAddr,
    pub trace: Trace,
    bytes_in: u64,
    termination: Option<Termination>,
}

impl<'a> Record<'a> {
    pub(in crate::proxy) fn new(
        log: Option<&'a AccessLog>,
        head: RequestHead,
        target: &'a Target,
        client: SocketAddr,
        request_id: RequestId,
        began: Instant,
    ) -> Record<'a> {
        Record {
            log,
            bytes_in: head.bytes.len() as u64,
            head,
            target,
            client,
            trace: Trace::new(request_id, began),
            termination: None,
        }
    }

    /// How the exchange ended; `body_bytes` of the request were read.
    /// Counted when a status went to the client (a head that went out
    /// before the exchange broke off too).
    pub fn end(&mut self, termination: Termination, body_bytes: u64) {
        self.termination = Some(termination);
        self.bytes_in += body_bytes;
        self.count();
    }

    /// Counts the exchange by its status, and its time from request head
    /// to response head (to now for an answer of baton's own), as the h2
    /// path counts a stream's: a body that streams on is not the
    /// request's latency.
    fn count(&self) {
        let Some(status) = self.trace.status else {
            return;
        };
        let metrics = &self.target.metrics;
        metrics.count(status);
        let marks = &self.trace.marks;
        let head = marks.head.unwrap_or_else(Instant::now);
        metrics
            .duration
            .record(head.saturating_duration_since(marks.started).as_secs_f64());
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        if self.termination.is_none() {
            // Cut off (a drain's deadline): what the attempt under way saw
            // was never folded in, nor the exchange counted.
            self.trace.note();
            self.count();
        }
        let Some(log) = self.log else {
            return;
        };
        let head = &self.head;
        let t = &self.trace;
        log.write(&Entry {
            request_id: &t.request_id,
            client: self.client,
            pool: &self.target.pool.name,
            backend: t.backend.as_deref().map(|b| b.label.as_str()),
            method: head.method.as_str(),
            target: text(head.target()),
            protocol: match head.version {
                Version::Http10 => "HTTP/1.0",
                Version::Http11 => "HTTP/1.1",
            },
            status: t.status,
            bytes_in: self.bytes_in + t.tunnelled_in,
            bytes_out: t.bytes_out,
            body_out: t.bytes_out.saturating_sub(t.head_out),
            marks: t.marks,
            termination: self
                .termination
                .unwrap_or(Termination::Drained(t.marks.phase())),
            referer: head.values("referer").next(),
            user_agent: head.values("user-agent").next(),
        });
    }
}

/// Request bytes as log text (a parsed head's are ASCII).
fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or("-")
}

/// How a request baton did not serve ended, for its line.
pub struct Unserved {
    /// baton's answer; none when the client left before one.
    pub status: Option<u16>,
    pub termination: Termination,
    /// The request's protocol as the access log names it.
    pub protocol: &'static str,
    /// The bytes read with the refused head (all of it that came, and
    /// whatever followed it in the same reads).
    pub bytes_in: u64,
    /// The answer's bytes, if they were written.
    pub bytes_out: u64,
    /// Of those, its body's.
    pub body_out: u64,
}

/// A request that ended before baton had a head it would serve: refused
/// (`400`/`431`: `PR`; no whole head within `header_timeout`, `408`:
/// `cR`), counted on its listener's own target with its time from the
/// head's first byte (`started`) to the answer, as every request is; or
/// left by its client in the middle of its head (`CR`, no answer, not
/// counted: as HAProxy logs a `<BADREQ>`, so a proxy in front that cuts
/// requests short leaves a trace). Its line: no pool, no backend, and
/// nothing of the request worth logging but its size.
pub fn unserved(
    log: Option<&AccessLog>,
    metrics: &RequestMetrics,
    request_id: &str,
    client: SocketAddr,
    unserved: Unserved,
    started: Instant,
) {
    let Unserved {
        status,
        termination,
        protocol,
        bytes_in,
        bytes_out,
        body_out,
    } = unserved;
    if let Some(status) = status {
        metrics.count(status);
        metrics.duration.record(started.elapsed().as_secs_f64());
    }
    let Some(log) = log else {
        return;
    };
    let marks = Marks::since(started);
    log.write(&Entry {
        request_id,
        client,
        pool: "-",
        backend: None,
        method: "-",
        target: "-",
        protocol,
        status,
        bytes_in,
        bytes_out,
        body_out,
        marks,
        termination,
        referer: None,
        user_agent: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> Trace {
        Trace::new(RequestId::new(), Instant::now())
    }

    /// A backend's status is the exchange's only once its head began to go
    /// out: one cut off (a drain's deadline) while the head waited to be
    /// written is logged and counted without it.
    #[test]
    fn a_status_counts_once_its_head_began_to_go_out() {
        let mut waiting = trace();
        waiting.attempt.status.store(200, Ordering::Relaxed);
        waiting.note();
        assert_eq!(waiting.status, None);

        let mut going = trace();
        going.attempt.status.store(200, Ordering::Relaxed);
        going.attempt.bytes_out.store(10, Ordering::Relaxed);
        going.note();
        assert_eq!((going.status, going.bytes_out), (Some(200), 10));

        let mut went = trace();
        went.attempt.status.store(101, Ordering::Relaxed);
        went.attempt.client_written.store(true, Ordering::Relaxed);
        went.note();
        assert_eq!(went.status, Some(101));
        went.attempt.bytes_out.store(5, Ordering::Relaxed);
        went.note();
        assert_eq!(
            (went.status, went.bytes_out),
            (Some(101), 5),
            "kept across attempts"
        );
    }
}
