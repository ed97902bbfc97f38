//! An h2 stream's exchange with a backend on the same HTTP/1 upstream as
//! HTTP/1 clients: a connection from the backend's idle list (or a new
//! one), the request head written from hyper's parts, the body framed for
//! HTTP/1 as it streams, the response head parsed with `httparse`, and its
//! body decoded into frames for hyper's h2 server. The connection goes back
//! to the idle list after a clean end with keep-alive on both sides.
//!
//! Nothing is spawned and nothing crosses a channel: the stream's own
//! future drives both directions until the response head is in, then the
//! response body does (a backend may answer while it still reads the
//! request, so the upload goes on as the body is polled).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, COOKIE, EXPECT, HOST};
use http::request::Parts;
use http::{Method, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;
use tokio::time::Instant;

use super::chunked::{self, Decoder, Piece};
use super::head::{self, BadResponse, Framing, Parsed, ResponseHead, Role};
use super::io::poll_read_some;
use super::upstream::Upstream;
use crate::backend::stream::BackendStream;
use crate::backend::Lease;
use crate::metrics::UpstreamErrorKind;
use crate::proxy::body::{BodyError, ProxyBody};
use crate::proxy::headers;

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
}

impl Relay {
    /// Starts an exchange: the head of `parts` (already rewritten for the
    /// backend) is queued with the body's framing.
    pub fn new(
        up: Upstream,
        parts: &Parts,
        body: ProxyBody,
        backend_authority: &str,
        keepable: bool,
    ) -> Relay {
        let framing = request_framing(parts, &body);
        let mut out = BytesMut::with_capacity(512);
        request_head(parts, backend_authority, framing, &mut out);
        Relay {
            up,
            upload: Upload {
                out,
                source: (!body.is_end_stream()).then_some(body),
                chunked: framing == UpFraming::Chunked,
                flushing: false,
            },
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
    /// responses (1xx) are read past.
    pub async fn response_head(&mut self, method: &Method) -> Result<ResponseHead, HeadFault> {
        let mut received = false;
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
            self.poll_head(cx, method, &mut received)
        })
        .await
    }

    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        received: &mut bool,
    ) -> Poll<Result<ResponseHead, HeadFault>> {
        let buf = &mut self.up.buf;
        loop {
            if !buf.is_empty() {
                match head::parse_response(buf, method) {
                    Err(bad) => return Poll::Ready(Err(HeadFault::BadHead(bad))),
                    Ok(Parsed::Complete(head)) => {
                        buf.advance(head.consumed);
                        if (100..200).contains(&head.status) && head.status != 101 {
                            continue;
                        }
                        return Poll::Ready(Ok(head));
                    }
                    Ok(Parsed::Partial) => {}
                }
            }
            let nothing_received = !*received;
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
                Ok(_) => *received = true,
            }
        }
    }

    /// The client's response: `head` as hyper's h2 server takes it, with
    /// a body read from this connection. The lease is held until the body
    /// ends.
    pub fn respond(
        self,
        head: &ResponseHead,
        lease: Lease,
    ) -> Result<Response<ResponseBody>, BadResponse> {
        if head.status == 101 {
            return Err(BadResponse::Malformed(
                "101 Switching Protocols to a request that asked for no upgrade",
            ));
        }
        let mut response = Response::new(());
        *response.status_mut() =
            StatusCode::from_u16(head.status).map_err(|_| BadResponse::Malformed("status code"))?;
        copy_fields(head, response.headers_mut())?;
        headers::add_via(response.headers_mut());
        // Chunked with a Content-Length too: answered right (chunked wins),
        // but a backend that says both is not trusted with another request.
        let both_framings =
            head.framing == Framing::Chunked && head.values("content-length").next().is_some();
        let mut body = ResponseBody {
            decoding: Decoding::new(head.framing),
            keeps: head.keep_alive && self.keepable && !both_framings,
            relay: Some(self),
            lease: Some(lease),
        };
        if body.decoding.done {
            body.finish();
        }
        Ok(response.map(|()| body))
    }
}

/// A response head's fields as hyper's h2 server sends them: hop-by-hop
/// fields stay on their hop, `Transfer-Encoding` means nothing in h2, and a
/// `Content-Length` goes on only where it states the body's length (or a
/// HEAD's or a 304's would-be length).
fn copy_fields(head: &ResponseHead, to: &mut HeaderMap) -> Result<(), BadResponse> {
    to.reserve(head.fields.len());
    // Repeats of one length are allowed in HTTP/1; h2 clients take one.
    let mut length_copied = false;
    for field in &head.fields {
        let name = head.field_name(field);
        let keep = match field.role {
            Role::HopByHop => false,
            Role::Framing => {
                let length = name.eq_ignore_ascii_case(b"content-length")
                    && head.framing != Framing::Chunked
                    && !length_copied;
                length_copied |= length;
                length
            }
            _ => true,
        };
        if !keep {
            continue;
        }
        let name =
            HeaderName::from_bytes(name).map_err(|_| BadResponse::Malformed("field name"))?;
        let value = HeaderValue::from_bytes(head.field_value(field))
            .map_err(|_| BadResponse::Malformed("field value"))?;
        to.append(name, value);
    }
    Ok(())
}

/// How a request body goes up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UpFraming {
    /// No body (and the method needs no length said).
    None,
    /// As the client's `Content-Length` says (h2 holds the client to it),
    /// or `Content-Length: 0` for a bodiless method that takes a body.
    Length,
    /// Chunked: the length is not known in advance.
    Chunked,
}

fn request_framing(parts: &Parts, body: &ProxyBody) -> UpFraming {
    let has_length = parts.headers.contains_key(CONTENT_LENGTH);
    if has_length {
        return UpFraming::Length;
    }
    if !body.is_end_stream() {
        return UpFraming::Chunked;
    }
    // A POST with no body still says so, as HTTP/1 clients do: some
    // servers refuse one without a length (411).
    let takes_body = [Method::POST, Method::PUT, Method::PATCH].contains(&parts.method);
    if takes_body {
        UpFraming::Length
    } else {
        UpFraming::None
    }
}

/// `METHOD origin-form HTTP/1.1`, the fields, and the framing. h2 may
/// split `Cookie` into many fields: HTTP/1 gets them joined in one line
/// (RFC 9113 §8.2.3). A request without `:authority` or `Host` names the
/// backend, as HTTP/1.1 needs a Host. `Expect` stays here: the body was
/// asked for already (hyper answers 100-continue when it is read).
fn request_head(parts: &Parts, backend_authority: &str, framing: UpFraming, out: &mut BytesMut) {
    out.put_slice(parts.method.as_str().as_bytes());
    out.put_u8(b' ');
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    let mut cookies = parts.headers.get_all(COOKIE).iter().peekable();
    let has_cookies = cookies.peek().is_some();
    for (name, value) in &parts.headers {
        if name != COOKIE && name != EXPECT {
            put_field(name.as_str().as_bytes(), value.as_bytes(), out);
        }
    }
    if has_cookies {
        out.put_slice(b"cookie: ");
        for (i, cookie) in cookies.enumerate() {
            if i > 0 {
                out.put_slice(b"; ");
            }
            out.put_slice(cookie.as_bytes());
        }
        out.put_slice(b"\r\n");
    }
    if !parts.headers.contains_key(HOST) {
        put_field(b"host", backend_authority.as_bytes(), out);
    }
    match framing {
        UpFraming::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        UpFraming::Length if !parts.headers.contains_key(CONTENT_LENGTH) => {
            out.put_slice(b"content-length: 0\r\n");
        }
        UpFraming::Length | UpFraming::None => {}
    }
    out.put_slice(b"\r\n");
}

fn put_field(name: &[u8], value: &[u8], out: &mut BytesMut) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// Each field as an HTTP/1 line (the names are lower-case, as h2 has them).
fn put_fields(fields: &HeaderMap, out: &mut BytesMut) {
    for (name, value) in fields {
        put_field(name.as_str().as_bytes(), value.as_bytes(), out);
    }
}

/// Whether the upload waits for the backend to take bytes, and since when;
/// and when it last stopped waiting. While it waits, the client's body is
/// not read (backpressure), so a client that sends nothing then is not the
/// one stalling: the exchange's watch charges the backend instead, and
/// counts the client's pause only from when the backend took bytes again.
pub struct BackendWait {
    origin: Instant,
    /// Nanoseconds after `origin`: since when it waits (`NOT_WAITING` if it
    /// does not), and when it last stopped waiting.
    since: AtomicU64,
    last_moved: AtomicU64,
}

const NOT_WAITING: u64 = u64::MAX;

impl BackendWait {
    fn new() -> BackendWait {
        BackendWait {
            origin: Instant::now(),
            since: AtomicU64::new(NOT_WAITING),
            last_moved: AtomicU64::new(0),
        }
    }

    fn nanos(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(NOT_WAITING - 1)
    }

    /// Notes what a write or flush to the backend did, and passes it on.
    fn note<T>(&self, polled: Poll<T>) -> Poll<T> {
        match polled {
            Poll::Pending => {
                if self.since.load(Ordering::Relaxed) == NOT_WAITING {
                    self.since.store(self.nanos(), Ordering::Relaxed);
                }
            }
            Poll::Ready(_) => {
                if self.since.swap(NOT_WAITING, Ordering::Relaxed) != NOT_WAITING {
                    self.last_moved.store(self.nanos(), Ordering::Relaxed);
                }
            }
        }
        polled
    }

    /// How long the backend has taken no bytes, if it is being waited on.
    pub fn waiting_for(&self) -> Option<Duration> {
        let since = self.since.load(Ordering::Relaxed);
        (since != NOT_WAITING).then(|| {
            self.origin
                .elapsed()
                .saturating_sub(Duration::from_nanos(since))
        })
    }

    /// When the backend last took bytes after a wait (the start if never).
    pub fn last_moved(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_moved.load(Ordering::Relaxed))
    }
}

/// Why the upload stopped.
enum UpFault {
    /// The client's body broke off.
    Client,
    /// The backend took no more bytes.
    Backend,
}

/// The request direction: framed bytes not written yet, and the client's
/// body still to come.
struct Upload {
    out: BytesMut,
    /// `None` once the client's body has ended.
    source: Option<ProxyBody>,
    chunked: bool,
    /// Written out, now being flushed (a TLS session holds bytes back).
    flushing: bool,
}

impl Upload {
    fn is_done(&self) -> bool {
        self.source.is_none() && self.out.is_empty() && !self.flushing
    }

    /// Writes what it can without waiting; `Ready(Ok)` once all is sent.
    /// The client's body is asked for its next frame only when the last
    /// one is written, so a slow backend slows the client (backpressure).
    fn poll(
        &mut self,
        stream: &mut BackendStream,
        wait: &BackendWait,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UpFault>> {
        loop {
            if !self.out.is_empty() {
                let written = Pin::new(&mut *stream).poll_write(cx, &self.out);
                match ready!(wait.note(written)) {
                    Ok(0) | Err(_) => return Poll::Ready(Err(UpFault::Backend)),
                    Ok(n) => self.out.advance(n),
                }
                self.flushing = self.out.is_empty();
                continue;
            }
            if self.flushing {
                let flushed = Pin::new(&mut *stream).poll_flush(cx);
                ready!(wait.note(flushed)).map_err(|_| UpFault::Backend)?;
                self.flushing = false;
                continue;
            }
            let Some(source) = self.source.as_mut() else {
                return Poll::Ready(Ok(()));
            };
            match ready!(Pin::new(source).poll_frame(cx)) {
                Some(Ok(frame)) => self.frame(frame),
                None => {
                    if self.chunked {
                        chunked::last_chunk(&[], &mut self.out);
                    }
                    self.source = None;
                }
                Some(Err(_)) => {
                    self.source = None;
                    return Poll::Ready(Err(UpFault::Client));
                }
            }
        }
    }

    fn frame(&mut self, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) if self.chunked => {
                chunked::chunk_header(data.len(), &mut self.out);
                self.out.put_slice(&data);
                self.out.put_slice(chunked::CHUNK_END);
            }
            Ok(data) => self.out.put_slice(&data),
            Err(frame) => {
                // Trailers end the body; only a chunked one can carry them.
                if let (Ok(trailers), true) = (frame.into_trailers(), self.chunked) {
                    let mut lines = BytesMut::new();
                    put_fields(&trailers, &mut lines);
                    chunked::last_chunk(&lines, &mut self.out);
                    self.chunked = false;
                }
            }
        }
    }
}

/// A backend's response body, decoded by its framing into frames for the
/// h2 client; the connection goes back to the idle list at a clean end.
pub struct ResponseBody {
    /// `None` once the body has ended.
    relay: Option<Relay>,
    decoding: Decoding,
    /// The backend keeps the connection after this response.
    keeps: bool,
    lease: Option<Lease>,
}

/// Where a response body is in its framing.
struct Decoding {
    framing: Framing,
    /// Bytes to come of a `Content-Length` body.
    remaining: u64,
    decoder: Option<Decoder>,
    done: bool,
}

impl Decoding {
    fn new(framing: Framing) -> Decoding {
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
                Ok((n > 0).then(|| Frame::data(buf.split_to(n).freeze())))
            }
            Framing::Chunked => self.take_chunk(buf),
            Framing::UntilClose => Ok((!buf.is_empty()).then(|| Frame::data(buf.split().freeze()))),
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
                    let data = buf.split_to(used).freeze().slice(range);
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
    /// The body ended as its framing says: the connection goes back to the
    /// idle list if both sides keep it and the request went up whole.
    fn finish(&mut self) {
        let (Some(relay), Some(lease)) = (self.relay.take(), self.lease.take()) else {
            return;
        };
        if self.keeps && relay.upload.is_done() && relay.up.buf.is_empty() {
            lease.backend().idle.put(relay.up.stream);
        }
    }

    /// The body broke off: the backend's failure, charged once.
    fn broke_off(&mut self, cause: String) -> BodyError {
        self.decoding.done = true;
        self.relay = None;
        if let Some(lease) = self.lease.take() {
            let backend = lease.backend();
            backend.upstream_failed(
                UpstreamErrorKind::Protocol,
                &format!("response broke off: {cause}"),
                false,
            );
            tracing::warn!(backend = %backend.name, %cause, "backend response broke off; resetting the stream");
        }
        cause.into()
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
        match relay
            .upload
            .poll(&mut relay.up.stream, &relay.backend_wait, cx)
        {
            Poll::Ready(Err(UpFault::Client)) => {
                self.decoding.done = true;
                self.relay = None;
                Err("the client's request body broke off".into())
            }
            Poll::Ready(Err(UpFault::Backend)) => {
                // It stopped reading: this response may still end well,
                // but the connection carries nothing more.
                self.keeps = false;
                relay.upload.source = None;
                relay.upload.out.clear();
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
    let mut map = HeaderMap::with_capacity(fields.len());
    // h2 refuses a connection-specific field anywhere, trailers included:
    // one would reset a stream whose body came whole.
    let hop_by_hop = |name: &str| {
        headers::HOP_BY_HOP
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
    };
    for field in fields.iter().filter(|f| !hop_by_hop(f.name)) {
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
            match ready!(poll_read_some(&mut up.stream, cx, &mut up.buf)) {
                Ok(0) if this.decoding.framing == Framing::UntilClose => {
                    this.decoding.done = true;
                    this.keeps = false;
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
