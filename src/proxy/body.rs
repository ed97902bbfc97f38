//! Body plumbing for the HTTP proxy: one boxed type for every body we hand
//! hyper, and a wrapper that keeps a guard alive until the body is done, so
//! "this connection is idle" means "its last response was fully written".

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

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

/// `inner`, holding `guard` until the body ends or is dropped.
pub struct Guarded<G> {
    inner: ProxyBody,
    guard: Option<G>,
}

impl<G: Send + Unpin + 'static> Guarded<G> {
    pub fn wrap(inner: ProxyBody, guard: G) -> ProxyBody {
        Guarded {
            inner,
            guard: Some(guard),
        }
        .boxed_unsync()
    }
}

impl<G: Unpin> Body for Guarded<G> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.guard = None;
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
