//! Body plumbing for the HTTP proxy: one boxed type for every body an h2
//! stream answers with, and a wrapper that keeps a guard alive until the body is done, so
//! "this connection is idle" means "its last response was fully written";
//! and the client's request body as it goes upstream.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use tokio::time::Instant;

use super::clock::SharedInstant;
use super::h2::recv::{RecvBody, RecvError};

/// Why a body broke off: the h2 connection's error for a client's body,
/// baton's own for a backend's response read on its HTTP/1 upstream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A response body cut by its client's upload, which stopped arriving
/// (`idle_timeout`) or broke off while the response came down: the
/// client's fault, which the access log must not lay on the backend.
#[derive(Debug, thiserror::Error)]
pub enum ClientUploadFault {
    #[error("the client's request body stopped arriving")]
    Stalled,
    #[error("the client's request body broke off")]
    BrokeOff,
}

/// A backend that sent no response body bytes within its bound
/// (`response_timeout`): a timeout (`sD` in the access log), not a break
/// (`SD`), as the HTTP/1 path logs it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendSilent(pub String);

pub type ProxyBody = UnsyncBoxBody<Bytes, BodyError>;

/// A short text body (error pages).
pub fn text(s: String) -> ProxyBody {
    Full::new(Bytes::from(s))
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// What a [`Guarded`] body's guard hears: the body breaking off midway,
/// the h2 connection asking for the next frame, a frame handed to it.
pub trait BodyGuard: Send + Unpin + 'static {
    fn body_failed(&mut self, _cause: &BodyError) {}
    fn asked(&mut self) {}
    /// A frame went to the connection, `bytes` of data in it.
    fn handed(&mut self, _bytes: usize) {}
    /// The body ended as it should (the guard is dropped next).
    fn ended(&mut self) {}
}

/// `inner`, holding `guard` until the body ends or is dropped.
pub struct Guarded<G: BodyGuard> {
    inner: ProxyBody,
    guard: Option<G>,
}

impl<G: BodyGuard> Guarded<G> {
    pub fn wrap(inner: ProxyBody, guard: G) -> ProxyBody {
        Guarded {
            inner,
            guard: Some(guard),
        }
        .boxed_unsync()
    }
}

/// The h2 connection stops polling a body that says it is at its end (the
/// last data frame carries END_STREAM), so such a body's end is seen here.
impl<G: BodyGuard> Drop for Guarded<G> {
    fn drop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            if self.inner.is_end_stream() {
                guard.ended();
            }
        }
    }
}

impl<G: BodyGuard> Body for Guarded<G> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(guard) = self.guard.as_mut() {
            guard.asked();
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Err(cause))) => {
                if let Some(mut guard) = self.guard.take() {
                    guard.body_failed(cause);
                }
            }
            Poll::Ready(Some(Ok(frame))) => {
                let bytes = frame.data_ref().map_or(0, Bytes::len);
                if let Some(guard) = self.guard.as_mut() {
                    guard.handed(bytes);
                }
            }
            Poll::Ready(None) => {
                if let Some(mut guard) = self.guard.take() {
                    guard.ended();
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How a client's request body is getting on, for the exchange that sends
/// it: whether it failed (a malformed or cut-off body is the client's fault,
/// 400, not the backend's 502), when its last bytes came, and when it was
/// all sent (the backend's `response_timeout` runs from then, never while
/// the client is still uploading).
pub struct Progress {
    failed: AtomicBool,
    /// The client went away while the body was coming (h2: it reset the
    /// stream, or its connection broke): no answer reaches it.
    client_left: AtomicBool,
    complete: AtomicBool,
    /// The last frame, then the end.
    last: SharedInstant,
    /// Data bytes received so far (the access log's bytes in).
    received: AtomicU64,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            failed: AtomicBool::new(false),
            client_left: AtomicBool::new(false),
            complete: AtomicBool::new(false),
            last: SharedInstant::at(Instant::now()),
            received: AtomicU64::new(0),
        }
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    fn took(&self, frame: &Frame<Bytes>) {
        let bytes = frame.data_ref().map_or(0, Bytes::len) as u64;
        self.received.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    pub fn client_left(&self) -> bool {
        self.client_left.load(Ordering::Relaxed)
    }

    fn moved(&self) {
        self.last.set_now();
    }

    /// When the last bytes came (or the body ended), and whether it ended.
    pub fn last(&self) -> (Instant, bool) {
        let complete = self.complete.load(Ordering::Acquire);
        // Set from the start, so never unset.
        let last = self.last.get().unwrap_or_else(Instant::now);
        (last, complete)
    }
}

/// A client's request body on its way to a backend: the frame read before
/// a backend was chosen, then the rest as it arrives, telling [`Progress`].
pub struct ClientBody {
    first: Option<Frame<Bytes>>,
    rest: RecvBody,
    progress: Arc<Progress>,
}

impl ClientBody {
    /// The body, and its progress.
    pub fn wrap(first: Frame<Bytes>, rest: RecvBody) -> (ProxyBody, Arc<Progress>) {
        let progress = Arc::new(Progress::new());
        progress.moved();
        progress.took(&first);
        let body = ClientBody {
            first: Some(first),
            rest,
            progress: Arc::clone(&progress),
        };
        body.note_end();
        (body.boxed_unsync(), progress)
    }

    fn note_end(&self) {
        if self.rest.is_end_stream() {
            self.ended();
        }
    }

    fn ended(&self) {
        self.progress.moved();
        self.progress.complete.store(true, Ordering::Release);
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        let polled = Pin::new(&mut self.rest).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.progress.took(frame);
                self.progress.moved();
                self.note_end();
            }
            Poll::Ready(Some(Err(err))) => {
                self.progress.failed.store(true, Ordering::Relaxed);
                // Its RST_STREAM (whatever the code), or its connection
                // gone: not a body it sent malformed.
                if matches!(err, RecvError::Reset(_)) {
                    self.progress.client_left.store(true, Ordering::Relaxed);
                }
            }
            Poll::Ready(None) => self.ended(),
            Poll::Pending => {}
        }
        polled.map_err(BodyError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(first));
        }
        hint.set_lower(rest.lower().saturating_add(first));
        hint
    }
}
