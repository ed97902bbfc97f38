//! An h2 stream's exchange with a backend on the same HTTP/1 upstream as
//! HTTP/1 clients: a connection from the backend's idle list (or a new
//! one), the request head written from the request's parts, the body
//! framed for HTTP/1 as it streams, the response head parsed with
//! `httparse`, and its body decoded into frames for the h2 connection.
//! The connection goes back to the idle list after a clean end with
//! keep-alive on both sides.
//!
//! Nothing is spawned and nothing crosses a channel: the stream's own
//! future drives both directions until the response head is in, then the
//! response body does (a backend may answer while it still reads the
//! request, so the upload goes on as the body is polled).
//!
//! The data's way: `upload` writes the request (head, framed body, how long
//! the backend has taken no bytes); `download` turns the response into h2
//! frames and gives the connection back.

mod download;
mod upload;

pub use download::{ClientPause, ResponseBody, Silence};
pub use upload::BackendWait;

use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use http::request::Parts;
use http::{HeaderMap, Method, Response, StatusCode};
use http_body::Body;

use super::head::{self, BadResponse, Framing, Parsed, ResponseHead};
use super::io::poll_read_some;
use super::rewrite::Outbound;
use super::upstream::Upstream;
use crate::backend::idle::Check;
use crate::backend::Lease;
use crate::proxy::body::ProxyBody;
use crate::proxy::delivery::InterimHead;
use crate::proxy::headers;
use download::Decoding;
use upload::{UpFault, UpFraming, Upload};

/// Where the reading of a response head stands across polls.
#[derive(Default)]
struct HeadReading {
    /// Some byte of the response came back (a failure before any did is
    /// one a request may be sent again after).
    received: bool,
    /// How much of the head the last parse saw: one trickled in is parsed
    /// again only as `head::worth_parsing` says, as a client's is.
    parsed: usize,
}

/// One exchange on one backend connection.
pub struct Relay {
    up: Upstream,
    upload: Upload,
    /// Whether the upload waits on the backend, for the exchange's watch.
    backend_wait: Arc<BackendWait>,
    /// The connection may carry another exchange once this one ends well
    /// (false for one that began with a client's PROXY header).
    keepable: bool,
}

/// Why no usable response head came.
#[derive(Debug)]
pub enum HeadFault {
    /// The backend closed or failed; `nothing_received` when not one byte
    /// came back (a kept connection closed under the request).
    Backend {
        cause: String,
        nothing_received: bool,
    },
    BadHead(BadResponse),
    /// The client's body broke off (its fault, not the backend's).
    ClientBody,
    /// The backend closed or failed on a new connection, with not a byte
    /// of answer, while the request body was still going up.
    RequestCutOff(String),
}

impl Relay {
    /// Starts an exchange: the head of `parts`, rewritten for the backend
    /// as `to` says, is queued with the body's framing.
    pub fn new(
        up: Upstream,
        parts: &Parts,
        body: ProxyBody,
        to: &Outbound<'_>,
        keepable: bool,
    ) -> Relay {
        let framing = upload::request_framing(parts, &body);
        let mut out = BytesMut::with_capacity(512);
        upload::request_head(parts, to, framing, &mut out);
        Relay {
            up,
            upload: Upload::new(
                out,
                (!body.is_end_stream()).then_some(body),
                framing == UpFraming::Chunked,
            ),
            backend_wait: Arc::new(BackendWait::new()),
            keepable,
        }
    }

    /// Taken from the backend's idle list (it may have closed meanwhile).
    pub fn reused(&self) -> bool {
        self.up.reused
    }

    /// How the upload waits on the backend, as the exchange's watch reads it.
    pub fn backend_wait(&self) -> Arc<BackendWait> {
        Arc::clone(&self.backend_wait)
    }

    /// Sends the request while it waits for the response head; interim
    /// responses (1xx) go to `interim` as the h2 connection takes them
    /// (one whose fields h2 cannot carry is read past).
    pub async fn response_head(
        &mut self,
        method: &Method,
        interim: &mut (dyn FnMut(InterimHead) + Send),
    ) -> Result<ResponseHead, HeadFault> {
        let mut reading = HeadReading::default();
        let mut upload_broken = false;
        std::future::poll_fn(|cx| {
            if !upload_broken && !self.upload.is_done() {
                match self
                    .upload
                    .poll(&mut self.up.stream, &self.backend_wait, cx)
                {
                    Poll::Ready(Err(UpFault::Client)) => {
                        return Poll::Ready(Err(HeadFault::ClientBody))
                    }
                    // The backend may have answered before it stopped
                    // reading: its answer, or its close, decides.
                    Poll::Ready(Err(UpFault::Backend)) => upload_broken = true,
                    Poll::Ready(Ok(())) | Poll::Pending => {}
                }
            }
            match self.poll_head(cx, method, &mut reading, interim) {
                // Not a byte of answer on a new connection while the body
                // went up (on a kept one: the race with the backend's idle
                // close, sent again where that is safe).
                Poll::Ready(Err(HeadFault::Backend {
                    nothing_received: true,
                    cause,
                })) if self.upload.body_going_up() && !self.up.reused => {
                    Poll::Ready(Err(HeadFault::RequestCutOff(cause)))
                }
                polled => polled,
            }
        })
        .await
    }

    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        reading: &mut HeadReading,
        interim: &mut (dyn FnMut(InterimHead) + Send),
    ) -> Poll<Result<ResponseHead, HeadFault>> {
        let buf = &mut self.up.buf;
        loop {
            if !buf.is_empty() && head::worth_parsing(buf, reading.parsed) {
                reading.parsed = buf.len();
                match head::parse_response(buf, method) {
                    Err(bad) => return Poll::Ready(Err(HeadFault::BadHead(bad))),
                    Ok(Parsed::Complete(head)) => {
                        buf.advance(head.consumed);
                        reading.parsed = 0;
                        if (100..200).contains(&head.status) && head.status != 101 {
                            let mut fields = HeaderMap::new();
                            if download::interim_fields(&head, &mut fields).is_ok() {
                                headers::add_via(&mut fields, via(head.version));
                                interim((head.status, fields));
                            }
                            continue;
                        }
                        return Poll::Ready(Ok(head));
                    }
                    Ok(Parsed::Partial) => {}
                }
            }
            let nothing_received = !reading.received;
            match ready!(poll_read_some(&mut self.up.stream, cx, buf)) {
                Ok(0) => {
                    return Poll::Ready(Err(HeadFault::Backend {
                        cause: "connection closed before a complete response head".into(),
                        nothing_received,
                    }))
                }
                Err(e) => {
                    return Poll::Ready(Err(HeadFault::Backend {
                        cause: e.to_string(),
                        nothing_received,
                    }))
                }
                Ok(_) => reading.received = true,
            }
        }
    }

    /// The client's response: `head` as the h2 connection takes it, with
    /// a body read from this connection. The lease is held until the body
    /// ends; `pause` watches a request body still coming up meanwhile.
    pub fn respond(
        self,
        head: &ResponseHead,
        lease: Lease,
        pause: Option<ClientPause>,
        silence: Silence,
    ) -> Result<Response<ResponseBody>, BadResponse> {
        if head.status == 101 {
            return Err(BadResponse::Malformed(
                "101 Switching Protocols to a request that asked for no upgrade",
            ));
        }
        let mut response = Response::new(());
        *response.status_mut() =
            StatusCode::from_u16(head.status).map_err(|_| BadResponse::Malformed("status code"))?;
        download::copy_fields(head, response.headers_mut())?;
        headers::add_date_if_missing(response.headers_mut());
        headers::add_via(response.headers_mut(), via(head.version));
        // Chunked with a Content-Length too: answered right (chunked wins),
        // but a backend that says both is not trusted with another request.
        // Nor one that answered before it had the whole request: it may
        // not have read the rest, and would take it for the next request.
        let both_framings =
            head.framing == Framing::Chunked && head.values("content-length").next().is_some();
        let answered_early = !self.upload.is_done();
        let keeps = (head.keep_alive && self.keepable && !both_framings && !answered_early)
            .then(|| Check::after_response(head.framing == Framing::Empty));
        let body = ResponseBody::new(
            self,
            Decoding::new(head.framing),
            keeps,
            lease,
            pause,
            silence,
        );
        Ok(response.map(|()| body))
    }
}

/// baton's `Via` on a response the backend sent in `version`.
fn via(version: head::Version) -> &'static str {
    match version {
        head::Version::Http10 => "1.0 baton",
        head::Version::Http11 => "1.1 baton",
    }
}
