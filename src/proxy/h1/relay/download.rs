//! The response direction of a relayed exchange: the backend's head as
//! the h2 connection takes it, and its body decoded by its framing into h2
//! frames (trailers too); at a clean end with keep-alive on both sides the
//! connection goes back to the backend's idle list.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};

use super::super::chunked::{Decoder, Piece};
use super::super::head::{self, BadResponse, Field, Framing, ResponseHead, Role};
use super::super::io::{poll_read_some, release_if_empty, take_bytes};
use super::upload::{BackendWait, UpFault};
use super::Relay;
use crate::backend::idle::Check;
use crate::backend::Lease;
use crate::metrics::UpstreamErrorKind;
use crate::proxy::body::{BackendSilent, BodyError, ClientUploadFault, Progress};

/// A response head's fields as the h2 connection sends them (none for a
/// body with a transfer coding other than chunked): hop-by-hop
/// fields stay on their hop, `Transfer-Encoding` means nothing in h2, and a
/// `Content-Length` goes on only where it states the body's length (or a
/// HEAD's or a 304's would-be length): never on a 204 (RFC 9110 §8.6),
/// where an h2 client takes it for a body still owed.
pub(super) fn copy_fields(head: &ResponseHead, to: &mut HeaderMap) -> Result<(), BadResponse> {
    // h2 has no transfer codings: the body would go on coded with nothing
    // to say so (nginx answers 502 too).
    if head.coded {
        return Err(BadResponse::Malformed(
            "a transfer coding other than chunked",
        ));
    }
    // Repeats of one length are allowed in HTTP/1; h2 clients take one.
    let mut length_copied = false;
    copy_kept(head, to, |field, name| match field.role {
        Role::HopByHop => false,
        Role::Framing => {
            let length = name.eq_ignore_ascii_case(b"content-length")
                && head.framing != Framing::Chunked
                && head.status != 204
                && !length_copied;
            length_copied |= length;
            length
        }
        _ => true,
    })
}

/// An interim (1xx) head's fields as the h2 connection sends them: those
/// the HTTP/1 path passes on too (`Role::kept_in_interim`).
pub(super) fn interim_fields(head: &ResponseHead, to: &mut HeaderMap) -> Result<(), BadResponse> {
    copy_kept(head, to, |field, _| field.role.kept_in_interim())
}

/// The head's fields that `keep` keeps (given each with its name).
fn copy_kept(
    head: &ResponseHead,
    to: &mut HeaderMap,
    mut keep: impl FnMut(&Field, &[u8]) -> bool,
) -> Result<(), BadResponse> {
    to.reserve(head.fields.len());
    for field in &head.fields {
        let name = head.field_name(field);
        if !keep(field, name) {
            continue;
        }
        let name =
            HeaderName::from_bytes(name).map_err(|_| BadResponse::Malformed("field name"))?;
        // A view of the head's own bytes, not a copy: no allocation per field.
        let value = HeaderValue::from_maybe_shared(head.bytes.slice_ref(head.field_value(field)))
            .map_err(|_| BadResponse::Malformed("field value"))?;
        to.append(name, value);
    }
    Ok(())
}

/// A backend's response body, decoded by its framing into frames for the
/// h2 client; the connection goes back to the idle list at a clean end.
pub struct ResponseBody {
    /// `None` once the body has ended.
    relay: Option<Relay>,
    decoding: Decoding,
    /// The backend keeps the connection after this response, to be
    /// checked so before its next exchange (see [`Check::after_response`]).
    keeps: Option<Check>,
    lease: Option<Lease>,
    /// The watch on a request body still coming up (`None` once it is in,
    /// or for a body-less request).
    pause: Option<ClientPause>,
    silence: Silence,
}

/// How long the backend may send no body bytes while the stream waits for
/// them (`response_timeout`; an event stream's `tunnel_timeout`), as on
/// the HTTP/1 path: a backend stuck mid-body would otherwise hold the
/// stream, its backend connection and lease for as long as the client
/// waits. The timer is armed only while a read waits, and kept to be
/// reset, not made again, at the next wait.
pub struct Silence {
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl Silence {
    pub fn new(limit: Duration) -> Silence {
        Silence {
            limit,
            timer: None,
            armed: false,
        }
    }

    /// Ready once the backend has been silent for the limit since the
    /// read began waiting.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.armed {
            let deadline = tokio::time::Instant::now() + self.limit;
            match self.timer.as_mut() {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.armed = true;
        }
        match self.timer.as_mut() {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// Bytes (or the end) came: the next wait starts a new clock.
    fn heard(&mut self) {
        self.armed = false;
    }
}

/// How long the client's request body may pause while the response comes
/// down: no exchange watch runs after the response head, and a client that
/// keeps its connection alive (PINGs answered) but sends no more would
/// hold the backend connection for good. The HTTP/1 path's `idle_timeout`
/// holds here too.
pub struct ClientPause {
    progress: Arc<Progress>,
    idle_timeout: Duration,
    check: Pin<Box<tokio::time::Sleep>>,
}

impl ClientPause {
    pub fn new(progress: Arc<Progress>, idle_timeout: Duration) -> ClientPause {
        let check = Box::pin(tokio::time::sleep(idle_timeout));
        ClientPause {
            progress,
            idle_timeout,
            check,
        }
    }

    /// Whether the body has paused for `idle_timeout` (counted, as before
    /// the head, from its last bytes or the backend's last taking, and not
    /// while the backend is the one that takes nothing); else the next
    /// look is set for when it would have.
    fn stalled(&mut self, backend: &BackendWait, cx: &mut Context<'_>) -> bool {
        let (last, complete) = self.progress.last();
        if complete {
            return false;
        }
        let now = tokio::time::Instant::now();
        let due = match backend.waiting_for() {
            Some(_) => now + self.idle_timeout,
            None => last.max(backend.last_moved()) + self.idle_timeout,
        };
        if due <= now {
            return true;
        }
        self.check.as_mut().reset(due);
        let _ = self.check.as_mut().poll(cx);
        false
    }
}

/// Where a response body is in its framing.
pub(super) struct Decoding {
    framing: Framing,
    /// Bytes to come of a `Content-Length` body.
    remaining: u64,
    decoder: Option<Decoder>,
    done: bool,
}

impl Decoding {
    pub(super) fn new(framing: Framing) -> Decoding {
        Decoding {
            remaining: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            decoder: (framing == Framing::Chunked).then(Decoder::new),
            done: framing == Framing::Empty,
            framing,
        }
    }

    /// The next frame `buf` holds, if any; marks the end when it sees it.
    fn take_frame(&mut self, buf: &mut BytesMut) -> Result<Option<Frame<Bytes>>, String> {
        match self.framing {
            Framing::Empty => {
                self.done = true;
                Ok(None)
            }
            Framing::Length(_) => {
                let n = buf
                    .len()
                    .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                self.remaining -= n as u64;
                self.done = self.remaining == 0;
                Ok((n > 0).then(|| Frame::data(take_bytes(buf, n))))
            }
            Framing::Chunked => self.take_chunk(buf),
            Framing::UntilClose => {
                Ok((!buf.is_empty()).then(|| Frame::data(take_bytes(buf, buf.len()))))
            }
        }
    }

    fn take_chunk(&mut self, buf: &mut BytesMut) -> Result<Option<Frame<Bytes>>, String> {
        let Some(decoder) = self.decoder.as_mut() else {
            return Ok(None);
        };
        loop {
            let (used, piece) = decoder
                .decode(buf)
                .map_err(|e| format!("bad chunked body: {e}"))?;
            match piece {
                Some(Piece::Data(range)) => {
                    let data = take_bytes(buf, used).slice(range);
                    return Ok(Some(Frame::data(data)));
                }
                Some(Piece::End { trailers }) => {
                    buf.advance(used);
                    self.done = true;
                    return Ok(trailer_frame(&trailers));
                }
                None if used == 0 => return Ok(None),
                None => buf.advance(used),
            }
        }
    }
}

impl ResponseBody {
    pub(super) fn new(
        relay: Relay,
        decoding: Decoding,
        keeps: Option<Check>,
        lease: Lease,
        pause: Option<ClientPause>,
        silence: Silence,
    ) -> ResponseBody {
        let mut body = ResponseBody {
            relay: Some(relay),
            decoding,
            keeps,
            lease: Some(lease),
            pause,
            silence,
        };
        // A body-less response ends here: the connection goes back at once.
        if body.decoding.done {
            body.finish();
        }
        body
    }

    /// The body ended as its framing says: the connection goes back to the
    /// idle list if both sides keep it and the request went up whole, else
    /// it ends as a TLS session should, with a `close_notify` (an h2
    /// stream's under `send_proxy` is never kept: dropped, each was a
    /// truncation in the backend's log).
    fn finish(&mut self) {
        let (Some(mut relay), Some(lease)) = (self.relay.take(), self.lease.take()) else {
            return;
        };
        release_if_empty(&mut relay.up.buf);
        match (
            self.keeps,
            relay.upload.is_done() && relay.up.buf.is_empty(),
        ) {
            (Some(check), true) => lease.backend().idle.put(relay.up.stream, check),
            _ => relay.up.stream.close_quietly(),
        }
    }

    /// The body broke off: the backend's failure, charged once.
    fn broke_off(&mut self, cause: String) -> BodyError {
        self.failed(UpstreamErrorKind::Protocol, cause)
    }

    fn failed(&mut self, kind: UpstreamErrorKind, cause: String) -> BodyError {
        self.decoding.done = true;
        self.relay = None;
        if let Some(lease) = self.lease.take() {
            let backend = lease.backend();
            backend.upstream_failed(kind, &format!("response broke off: {cause}"), false);
            if crate::telemetry::may_say_backend_fault() {
                tracing::warn!(pool = %backend.pool, backend = %backend.label, %cause, "backend response broke off; resetting the stream");
            }
        }
        match kind {
            UpstreamErrorKind::Timeout => Box::new(BackendSilent(cause)),
            _ => cause.into(),
        }
    }

    /// Keeps the upload going (a backend may stream its answer while it
    /// reads); the client's body breaking off ends the exchange.
    fn poll_upload(&mut self, cx: &mut Context<'_>) -> Result<(), BodyError> {
        let Some(relay) = self.relay.as_mut() else {
            return Ok(());
        };
        if relay.upload.is_done() {
            return Ok(());
        }
        if let Some(pause) = self.pause.as_mut() {
            if pause.stalled(&relay.backend_wait, cx) {
                self.decoding.done = true;
                self.relay = None;
                if crate::telemetry::may_say_client_fault() {
                    tracing::info!("request body stopped arriving while the response came down; resetting the stream");
                }
                return Err(ClientUploadFault::Stalled.into());
            }
        }
        match relay
            .upload
            .poll(&mut relay.up.stream, &relay.backend_wait, cx)
        {
            Poll::Ready(Err(UpFault::Client)) => {
                self.decoding.done = true;
                self.relay = None;
                Err(ClientUploadFault::BrokeOff.into())
            }
            Poll::Ready(Err(UpFault::Backend)) => {
                // It stopped reading: this response may still end well,
                // but the connection carries nothing more.
                self.keeps = None;
                relay.upload.source = None;
                relay.upload.out = bytes::BytesMut::new();
                relay.upload.flushing = false;
                Ok(())
            }
            Poll::Ready(Ok(())) | Poll::Pending => Ok(()),
        }
    }
}

/// Trailer lines (CRLF-terminated, validated by the decoder) as a frame.
fn trailer_frame(lines: &[u8]) -> Option<Frame<Bytes>> {
    if lines.is_empty() {
        return None;
    }
    let mut section = Vec::with_capacity(lines.len() + 2);
    section.extend_from_slice(lines);
    section.extend_from_slice(b"\r\n");
    let mut slots = [httparse::EMPTY_HEADER; head::MAX_FIELDS];
    let Ok(httparse::Status::Complete((_, fields))) = httparse::parse_headers(&section, &mut slots)
    else {
        return None;
    };
    // The decoder kept no hop-by-hop field: h2 refuses a
    // connection-specific one anywhere, and it would reset a stream whose
    // body came whole.
    let mut map = HeaderMap::with_capacity(fields.len());
    for field in fields {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(field.name.as_bytes()),
            HeaderValue::from_bytes(field.value),
        ) {
            map.append(name, value);
        }
    }
    Some(Frame::trailers(map))
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Err(cause) = this.poll_upload(cx) {
            return Poll::Ready(Some(Err(cause)));
        }
        loop {
            let Some(up) = this.relay.as_mut().map(|r| &mut r.up) else {
                return Poll::Ready(None);
            };
            match this.decoding.take_frame(&mut up.buf) {
                Err(cause) => return Poll::Ready(Some(Err(this.broke_off(cause)))),
                Ok(Some(frame)) => {
                    if this.decoding.done {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(None) if this.decoding.done => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
            }
            let read = match poll_read_some(&mut up.stream, cx, &mut up.buf) {
                Poll::Ready(read) => read,
                Poll::Pending => {
                    ready!(this.silence.poll_expired(cx));
                    let cause = format!("no body bytes within {:?}", this.silence.limit);
                    return Poll::Ready(Some(Err(this.failed(UpstreamErrorKind::Timeout, cause))));
                }
            };
            this.silence.heard();
            match read {
                Ok(0) if this.decoding.framing == Framing::UntilClose => {
                    this.decoding.done = true;
                    this.keeps = None;
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(0) => return Poll::Ready(Some(Err(this.broke_off("closed mid-body".into())))),
                Err(e) => return Poll::Ready(Some(Err(this.broke_off(e.to_string())))),
                Ok(_) => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoding.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoding.framing {
            Framing::Length(_) => SizeHint::with_exact(self.decoding.remaining),
            Framing::Empty => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
