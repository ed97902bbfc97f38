//! A stream's request body as its exchange reads it: the DATA the
//! connection has taken for it, then trailers or the end, or the reset
//! that ended it. What the exchange reads is given back to the client's
//! flow-control windows by the connection (`released`), so a body that is
//! not read stops the client once its window is spent: the backpressure
//! an upload to a slow backend needs. Nothing wakes the connection when
//! bytes are read: bodies are read only inside its own poll (an exchange,
//! or the response body that carries the rest of an upload), and each of
//! its turns looks at what was released after polling them.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::frame::Reason;

/// Why a request body ended short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The client reset the stream (its reason), or broke the connection.
    #[error("the client ended the stream ({0:?})")]
    Reset(Reason),
    /// DATA added up to more or less than the stated Content-Length.
    #[error("request body length differs from its content-length")]
    Length,
}

/// What the connection and the body share of one stream's upload.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    chunks: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    ended: bool,
    failed: Option<RecvError>,
    /// Bytes read and not yet given back to the windows.
    released: u32,
    reader: Option<Waker>,
}

pub(super) type SharedInbox = Arc<Mutex<Inbox>>;

pub(super) fn lock(inbox: &SharedInbox) -> MutexGuard<'_, Inbox> {
    // A panic while holding it leaves nothing half-written worth refusing.
    inbox
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Inbox {
    pub(super) fn push(&mut self, data: Bytes) {
        self.chunks.push_back(data);
        self.wake_reader();
    }

    pub(super) fn end(&mut self, trailers: Option<HeaderMap>) {
        self.trailers = trailers;
        self.ended = true;
        self.wake_reader();
    }

    pub(super) fn fail(&mut self, why: RecvError) {
        self.failed.get_or_insert(why);
        self.chunks.clear();
        self.wake_reader();
    }

    /// What was read since the last call, for WINDOW_UPDATEs.
    pub(super) fn take_released(&mut self) -> u32 {
        std::mem::take(&mut self.released)
    }

    /// Bytes taken and not yet read.
    pub(super) fn unread(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }

    fn wake_reader(&mut self) {
        if let Some(waker) = self.reader.take() {
            waker.wake();
        }
    }
}

/// The request body an exchange reads.
pub struct RecvBody {
    inbox: Option<SharedInbox>,
    /// The stated length, for `size_hint`.
    length: Option<u64>,
}

impl RecvBody {
    pub(super) fn new(inbox: Option<SharedInbox>, length: Option<u64>) -> RecvBody {
        RecvBody { inbox, length }
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = RecvError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RecvError>>> {
        let Some(inbox) = &self.inbox else {
            return Poll::Ready(None);
        };
        let mut inbox = lock(inbox);
        if let Some(why) = inbox.failed {
            return Poll::Ready(Some(Err(why)));
        }
        if let Some(data) = inbox.chunks.pop_front() {
            inbox.released += data.len() as u32;
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = inbox.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if inbox.ended {
            return Poll::Ready(None);
        }
        inbox.reader = Some(cx.waker().clone());
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inbox.as_ref().is_none_or(|inbox| {
            let inbox = lock(inbox);
            inbox.ended
                && inbox.chunks.is_empty()
                && inbox.trailers.is_none()
                && inbox.failed.is_none()
        })
    }

    fn size_hint(&self) -> SizeHint {
        match (self.length, &self.inbox) {
            (_, None) => SizeHint::with_exact(0),
            (Some(length), _) => SizeHint::with_exact(length),
            (None, _) => SizeHint::default(),
        }
    }
}
