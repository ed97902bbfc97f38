//! The request direction of a relayed exchange: the HTTP/1 head written
//! from hyper's parts, the client's body framed as it comes (its next frame
//! asked for only once the last is written: backpressure), and how long
//! the backend has taken no bytes.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, COOKIE, EXPECT, HOST};
use http::request::Parts;
use http::Method;
use http_body::{Body, Frame};
use tokio::io::AsyncWrite;
use tokio::time::Instant;

use super::super::chunked;
use super::super::rewrite::put_field;
use crate::backend::stream::BackendStream;
use crate::proxy::body::ProxyBody;
use crate::proxy::clock::SharedInstant;

/// How a request body goes up.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum UpFraming {
    /// No body (and the method needs no length said).
    None,
    /// As the client's `Content-Length` says (h2 holds the client to it),
    /// or `Content-Length: 0` for a bodiless method that takes a body.
    Length,
    /// Chunked: the length is not known in advance.
    Chunked,
}

pub(super) fn request_framing(parts: &Parts, body: &ProxyBody) -> UpFraming {
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
pub(super) fn request_head(
    parts: &Parts,
    backend_authority: &str,
    framing: UpFraming,
    out: &mut BytesMut,
) {
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

/// Whether the upload waits for the backend to take bytes, and since when;
/// and when it last stopped waiting. While it waits, the client's body is
/// not read (backpressure), so a client that sends nothing then is not the
/// one stalling: the exchange's watch charges the backend instead, and
/// counts the client's pause only from when the backend took bytes again.
pub struct BackendWait {
    /// Since when it waits (unset while it does not).
    since: SharedInstant,
    /// When it last stopped waiting (the start if never).
    last_moved: SharedInstant,
}

impl BackendWait {
    pub(super) fn new() -> BackendWait {
        let start = Instant::now();
        BackendWait {
            since: SharedInstant::unset(start),
            last_moved: SharedInstant::at(start),
        }
    }

    /// Notes what a write or flush to the backend did, and passes it on.
    fn note<T>(&self, polled: Poll<T>) -> Poll<T> {
        match polled {
            Poll::Pending => self.since.set_now_if_unset(),
            Poll::Ready(_) => {
                if self.since.clear() {
                    self.last_moved.set_now();
                }
            }
        }
        polled
    }

    /// How long the backend has taken no bytes, if it is being waited on.
    pub fn waiting_for(&self) -> Option<Duration> {
        self.since.get().map(|since| since.elapsed())
    }

    /// When the backend last took bytes after a wait (the start if never).
    pub fn last_moved(&self) -> Instant {
        self.last_moved.get().unwrap_or_else(Instant::now)
    }
}

/// Why the upload stopped.
pub(super) enum UpFault {
    /// The client's body broke off.
    Client,
    /// The backend took no more bytes.
    Backend,
}

/// The request direction: framed bytes not written yet, and the client's
/// body still to come.
pub(super) struct Upload {
    pub(super) out: BytesMut,
    /// `None` once the client's body has ended.
    pub(super) source: Option<ProxyBody>,
    chunked: bool,
    /// Written out, now being flushed (a TLS session holds bytes back).
    pub(super) flushing: bool,
}

impl Upload {
    pub(super) fn new(out: BytesMut, source: Option<ProxyBody>, chunked: bool) -> Upload {
        Upload {
            out,
            source,
            chunked,
            flushing: false,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.source.is_none() && self.out.is_empty() && !self.flushing
    }

    /// Writes what it can without waiting; `Ready(Ok)` once all is sent.
    /// The client's body is asked for its next frame only when the last
    /// one is written, so a slow backend slows the client (backpressure).
    pub(super) fn poll(
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
                    let kept = trailers
                        .iter()
                        .filter(|(name, _)| chunked::trailer_forwarded(name.as_str().as_bytes()));
                    for (name, value) in kept {
                        put_field(name.as_str().as_bytes(), value.as_bytes(), &mut lines);
                    }
                    chunked::last_chunk(&lines, &mut self.out);
                    self.chunked = false;
                }
            }
        }
    }
}
