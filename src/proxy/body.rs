//! Body plumbing for the HTTP proxy: one boxed type for every body we hand
//! hyper, and a wrapper that keeps a guard alive until the body is done, so
//! "this connection is idle" means "its last response was fully written";
//! and the client's request body as it goes upstream.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;

pub type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;

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

/// What a [`Guarded`] body's guard hears if the body breaks off midway.
pub trait BodyGuard: Send + Unpin + 'static {
    fn body_failed(&mut self, _cause: &hyper::Error) {}
}

/// `inner`, holding `guard` until the body ends or is dropped.
pub struct Guarded<G> {
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

impl<G: BodyGuard> Body for Guarded<G> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Err(cause))) => {
                if let Some(mut guard) = self.guard.take() {
                    guard.body_failed(cause);
                }
            }
            Poll::Ready(None) => self.guard = None,
            _ => {}
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

/// A client's request body on its way to a backend: the frame read before
/// a backend was chosen, then the rest as it arrives. It remembers whether
/// it failed, because a backend request that dies of a malformed or cut-off
/// client body is the client's fault (400), not the backend's (502).
pub struct ClientBody {
    first: Option<Frame<Bytes>>,
    rest: Incoming,
    failed: Arc<AtomicBool>,
}

impl ClientBody {
    /// The body, and the flag that turns true if it fails.
    pub fn wrap(first: Frame<Bytes>, rest: Incoming) -> (ProxyBody, Arc<AtomicBool>) {
        let failed = Arc::new(AtomicBool::new(false));
        let body = ClientBody {
            first: Some(first),
            rest,
            failed: Arc::clone(&failed),
        };
        (body.boxed_unsync(), failed)
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        let polled = Pin::new(&mut self.rest).poll_frame(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            self.failed.store(true, Ordering::Relaxed);
        }
        polled
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
