//! What one h2 stream leaves in the access log. Its response body carries
//! the record (a body guard), so the line is written when the body ends,
//! breaks off, or is dropped unfinished (the client reset the stream or
//! went away, or took none of it for `idle_timeout`), with the bytes that
//! went out by then.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{HeaderMap, REFERER, USER_AGENT};
use http::Request;

use crate::access_log::{AccessLog, Entry, Marks, Phase, Termination};
use crate::backend::Backend;
use crate::lifecycle::drain::DrainWatch;
use crate::proxy::body::{BackendSilent, BodyError, BodyGuard, ClientUploadFault, Progress};
use crate::proxy::delivery::Delivery;
use crate::proxy::request_id::RequestId;

/// Where a stream got to, filled in as it goes.
#[derive(Default)]
pub struct Noted {
    pub marks: Marks,
    pub backend: Option<Arc<Backend>>,
    /// The client's request body, once one started.
    pub upload: Option<Arc<Progress>>,
    /// The request's head did not end its stream: a body (maybe empty)
    /// is to come.
    pub body_expected: bool,
}

impl Noted {
    /// Whether the request's body is still coming: then a stream dropped
    /// without an answer (its client's reset, a forced drain) was cut
    /// while the client sent (`R`), wherever the exchange had got to.
    fn sending(&self) -> bool {
        match &self.upload {
            Some(progress) => !progress.last().1,
            None => self.body_expected,
        }
    }
}

/// A stream's log line, written when its response body is done with.
pub struct StreamRecord {
    log: AccessLog,
    /// Tells a stream cut by a forced drain from one the client left.
    drain: DrainWatch,
    request_id: RequestId,
    client: SocketAddr,
    pool: String,
    method: String,
    target: String,
    referer: Option<Box<[u8]>>,
    user_agent: Option<Box<[u8]>>,
    noted: Noted,
    /// The response's status, once there is a response.
    status: Option<u16>,
    bytes_out: u64,
    /// What the line says once the body ended as it should.
    on_end: Termination,
    /// Set when the body ended or broke; unset, the client left.
    termination: Option<Termination>,
    /// Whether the client took the response: a stream ended because it
    /// took none for `idle_timeout` says so (`cD`).
    delivery: Option<Arc<Delivery>>,
}

/// What a request says of itself, taken before it is sent on.
pub struct Asked {
    method: String,
    target: String,
    referer: Option<Box<[u8]>>,
    user_agent: Option<Box<[u8]>>,
}

impl Asked {
    pub fn of<B>(req: &Request<B>) -> Asked {
        // Copied as far as the line will show them (about 2 KiB each): a
        // copy of a 64 KiB target or user agent was held for the stream's
        // life.
        let header = |headers: &HeaderMap, name| {
            headers
                .get(name)
                .map(|v| crate::access_log::kept_for_the_line(v.as_bytes()).into())
        };
        let target = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().to_string(), ToString::to_string);
        Asked {
            method: req.method().to_string(),
            target: crate::access_log::kept_for_the_line_text(&target).to_string(),
            referer: header(req.headers(), REFERER),
            user_agent: header(req.headers(), USER_AGENT),
        }
    }
}

impl StreamRecord {
    pub fn new(
        log: AccessLog,
        asked: Asked,
        request_id: RequestId,
        client: SocketAddr,
        pool: &str,
        drain: DrainWatch,
        delivery: Option<Arc<Delivery>>,
    ) -> StreamRecord {
        StreamRecord {
            log,
            drain,
            request_id,
            client,
            pool: pool.to_string(),
            method: asked.method,
            target: asked.target,
            referer: asked.referer,
            user_agent: asked.user_agent,
            noted: Noted::default(),
            status: None,
            bytes_out: 0,
            on_end: Termination::Completed,
            termination: None,
            delivery,
        }
    }

    /// What `forward` notes as the stream goes.
    pub fn noted(&mut self) -> &mut Noted {
        &mut self.noted
    }

    pub fn marks(&self) -> Marks {
        self.noted.marks
    }

    /// The client went away while its body was coming: no answer reaches
    /// it, and the line says it left while sending (`CR`), unless a forced
    /// drain broke its connection (`KR`).
    pub fn left_while_sending(&mut self) {
        self.termination = Some(if self.drain.is_forced() {
            Termination::Drained(Phase::Request)
        } else {
            Termination::ClientAborted(Phase::Request)
        });
    }

    /// The response is ready: its status, and what the line says if its
    /// body then ends as it should.
    pub fn answered(&mut self, status: u16, on_end: Termination) {
        self.status = Some(status);
        self.on_end = on_end;
    }

    /// Ended because the client took none of the response (its last frame,
    /// which ended the body, may be the one that waited); else as the body
    /// ended or broke; else dropped unfinished: cut by a forced drain, or
    /// the client left (a reset stream, a closed connection), waiting for
    /// the response or taking it.
    fn termination(&self) -> Termination {
        if self.delivery.as_deref().is_some_and(Delivery::timed_out) {
            return Termination::ClientTimeout(Phase::Data);
        }
        self.termination.unwrap_or_else(|| {
            let phase = if self.status.is_some() {
                Phase::Data
            } else if self.noted.sending() {
                Phase::Request
            } else {
                self.noted.marks.phase()
            };
            if self.drain.is_forced() {
                Termination::Drained(phase)
            } else {
                Termination::ClientAborted(phase)
            }
        })
    }
}

impl BodyGuard for StreamRecord {
    fn body_failed(&mut self, cause: &BodyError) {
        self.termination = Some(match cause.downcast_ref::<ClientUploadFault>() {
            Some(ClientUploadFault::Stalled) => Termination::ClientTimeout(Phase::Data),
            Some(ClientUploadFault::BrokeOff) => Termination::ClientAborted(Phase::Data),
            None if cause.is::<BackendSilent>() => Termination::BackendTimeout(Phase::Data),
            None => Termination::BackendFailed(Phase::Data),
        });
    }

    fn handed(&mut self, bytes: usize) {
        self.bytes_out += bytes as u64;
    }

    fn ended(&mut self) {
        self.termination = Some(self.on_end);
    }
}

impl Drop for StreamRecord {
    fn drop(&mut self) {
        let noted = &self.noted;
        self.log.write(&Entry {
            request_id: &self.request_id,
            client: self.client,
            pool: &self.pool,
            backend: noted.backend.as_deref().map(|b| b.label.as_str()),
            method: &self.method,
            target: &self.target,
            protocol: "HTTP/2.0",
            status: self.status,
            bytes_in: noted.upload.as_deref().map_or(0, Progress::received),
            bytes_out: self.bytes_out,
            body_out: self.bytes_out,
            marks: noted.marks,
            termination: self.termination(),
            referer: self.referer.as_deref(),
            user_agent: self.user_agent.as_deref(),
        });
    }
}
