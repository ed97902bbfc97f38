//! A stream's request body as its exchange reads it: the DATA the
//! connection has taken for it, then trailers or the end, or the reset
//! that ended it. What the exchange reads is given back to the stream's
//! flow-control window by the connection (`released`), so a body that is
//! not read stops the client once its window is spent: the backpressure
//! an upload to a slow backend needs (the connection's window goes back
//! as DATA arrives, whoever reads it). Nothing wakes the connection when
//! bytes are read: bodies are read only inside its own poll (an exchange,
//! or the response body that carries the rest of an upload), and each of
//! its turns looks at what was released after polling them.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
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

/// How many gathered bytes make one chunk (`Inbox::push`).
const GATHERED_CHUNK: usize = 16 * 1024;

/// What the connection and the body share of one stream's upload.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    /// What came, in order, but for the `gathered` bytes after it.
    chunks: VecDeque<Bytes>,
    /// Payloads copied together since the last chunk.
    gathered: BytesMut,
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
    /// A DATA payload, copied into the `gathered` bytes rather than kept as
    /// the view of the connection's read buffer it came as: a view pins the
    /// whole allocation it came from (16 to 64 KiB, however small its
    /// share), and a payload of its own costs a slot. A client could make
    /// each byte of its window hold hundreds of bytes of baton's memory with
    /// one-byte frames, or each 16 KiB frame hold 64 KiB with whole frames,
    /// each in a read of its own (the rest of the read filled with DATA for
    /// a closed stream). Copied, what an upload holds unread is about what
    /// it carries, at most twice that (the gathered buffer grows by
    /// doubling).
    pub(super) fn push(&mut self, data: &[u8]) {
        if self.gathered.len() + data.len() > GATHERED_CHUNK {
            self.close_gathered();
        }
        self.gathered.extend_from_slice(data);
        self.wake_reader();
    }

    /// The gathered bytes become a chunk, in their place in the order.
    fn close_gathered(&mut self) {
        if !self.gathered.is_empty() {
            self.chunks.push_back(self.gathered.split().freeze());
        }
    }

    /// The next bytes to read, if any came.
    fn next_chunk(&mut self) -> Option<Bytes> {
        self.close_gathered();
        self.chunks.pop_front()
    }

    pub(super) fn end(&mut self, trailers: Option<HeaderMap>) {
        self.trailers = trailers;
        self.ended = true;
        self.wake_reader();
    }

    pub(super) fn fail(&mut self, why: RecvError) {
        self.failed.get_or_insert(why);
        self.chunks.clear();
        self.gathered = BytesMut::new();
        self.wake_reader();
    }

    /// What was read since the last call, for WINDOW_UPDATEs.
    pub(super) fn take_released(&mut self) -> u32 {
        std::mem::take(&mut self.released)
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
        if let Some(data) = inbox.next_chunk() {
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
                && inbox.gathered.is_empty()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Payloads, each a view of a 16 KiB read buffer (one-byte ones, then
    /// the whole buffer): the inbox keeps copies, in chunks of up to
    /// 16 KiB, in order, and no view of the buffer.
    #[test]
    fn payloads_are_copied_together_not_kept_as_views() {
        let read = Bytes::from((0..16_384u32).map(|i| i as u8).collect::<Vec<u8>>());
        let mut inbox = Inbox::default();
        for i in 0..read.len() {
            inbox.push(&read.slice(i..=i));
        }
        inbox.push(&read.slice(..));
        inbox.push(b"end");
        assert!(read.is_unique(), "a view of the read buffer was kept");
        let mut chunks = Vec::new();
        while let Some(chunk) = inbox.next_chunk() {
            chunks.push(chunk);
        }
        let sizes: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(sizes, [16_384, 16_384, 3]);
        assert_eq!(chunks[0], read);
        assert_eq!(chunks[1], read);
        assert_eq!(&chunks[2][..], b"end");
    }
}
