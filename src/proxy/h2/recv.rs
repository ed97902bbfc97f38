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

/// A DATA payload shorter than a whole frame (16 KiB: baton never allows
/// larger) is copied into the inbox's `gathered` bytes; a whole one is
/// kept as it came, a view of the connection's read buffer. A view pins
/// the whole buffer it came from (16 to 64 KiB), and a payload of its own
/// costs a slot and an allocation: a client that sent one-byte frames to
/// streams nobody reads yet would hold hundreds of bytes of baton's
/// memory for each byte of its window, not one.
const GATHERED_BELOW: usize = 16 * 1024;
/// How many gathered bytes make one chunk.
const GATHERED_CHUNK: usize = 16 * 1024;

/// What the connection and the body share of one stream's upload.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    /// What came, in order, but for the `gathered` bytes after it.
    chunks: VecDeque<Bytes>,
    /// Short payloads, copied together since the last chunk.
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
    pub(super) fn push(&mut self, data: Bytes) {
        if data.len() < GATHERED_BELOW {
            if self.gathered.len() + data.len() > GATHERED_CHUNK {
                self.close_gathered();
            }
            self.gathered.extend_from_slice(&data);
        } else {
            self.close_gathered();
            self.chunks.push_back(data);
        }
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

    /// One-byte payloads, each a view of a 16 KiB read buffer: the inbox
    /// keeps copies, a few chunks of them, and no view of the buffer.
    #[test]
    fn short_payloads_are_gathered_not_kept_as_views() {
        let read = Bytes::from((0..16_384u32).map(|i| i as u8).collect::<Vec<u8>>());
        let mut inbox = Inbox::default();
        for i in 0..read.len() {
            inbox.push(read.slice(i..=i));
        }
        assert!(read.is_unique(), "a view of the read buffer was kept");
        let whole = read.slice(..);
        inbox.push(whole);
        assert!(!read.is_unique(), "a long payload is kept as it came");
        let mut out = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = inbox.next_chunk() {
            out.extend_from_slice(&chunk);
            chunks += 1;
        }
        assert_eq!(chunks, 2);
        assert_eq!(out.len(), 2 * read.len());
        assert_eq!(&out[..read.len()], &read[..]);
        assert_eq!(&out[read.len()..], &read[..]);
    }

    /// Gathered bytes stay in their place among the chunks kept as they came.
    #[test]
    fn gathered_and_kept_payloads_are_read_in_order() {
        let mut inbox = Inbox::default();
        inbox.push(Bytes::from_static(b"ab"));
        inbox.push(Bytes::from(vec![b'c'; GATHERED_BELOW]));
        inbox.push(Bytes::from_static(b"d"));
        inbox.push(Bytes::from_static(b"e"));
        let mut out = Vec::new();
        while let Some(chunk) = inbox.next_chunk() {
            out.extend_from_slice(&chunk);
        }
        let mut want = b"ab".to_vec();
        want.extend(vec![b'c'; GATHERED_BELOW]);
        want.extend_from_slice(b"de");
        assert_eq!(out, want);
    }
}
