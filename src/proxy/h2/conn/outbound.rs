//! What goes to the client: exchanges polled for their heads, bodies
//! sent a frame a stream in turn as the windows allow, windows granted,
//! and the send buffer flushed to the socket.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures_util::stream::StreamExt;
use http::{Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use super::super::frame::{write, FrameError, Reason};
use super::super::hpack;
use super::super::recv::{self, RecvBody, RecvError};
use super::{begin_block, encode_fields, Closing, ConnError, Connection, Exchange, Sending, Step};

impl<S, F, B> Connection<S, F, B>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Request<RecvBody>) -> Exchange<B> + Unpin,
    B: Body<Data = Bytes> + Unpin,
{
    /// Responses whose exchanges are done: their heads go out, while the
    /// send buffer has room. Past it the exchanges wait (a flush that
    /// makes room wakes the connection): a client that reads nothing
    /// cannot make baton hold every stream's head (up to 64 KiB each)
    /// beyond what the socket took, only the bound and one head.
    pub(super) fn poll_exchanges(&mut self, cx: &mut Context<'_>) -> bool {
        let mut moved = false;
        while self.out.len() - self.sent < self.limits.send_buffer {
            let Poll::Ready(Some(done)) = self.exchanges.poll_next_unpin(cx) else {
                break;
            };
            moved = true;
            if let Ok((id, response)) = done {
                self.start_response(id, response);
            }
        }
        self.write_interims() || moved
    }

    /// Writes the interim heads the exchanges handed over, each as a
    /// HEADERS frame without END_STREAM, for streams still waiting for
    /// their final head (one reset meanwhile takes none). Dropped while the
    /// send buffer is full: they are hints, and a client that reads nothing
    /// must not make baton hold them. Says whether any went out.
    fn write_interims(&mut self) -> bool {
        let mut wrote = false;
        for (id, (status, fields)) in self.interims.take() {
            let waiting = self
                .streams
                .get(&id)
                .is_some_and(|s| matches!(s.send, Sending::Waiting(_)));
            let room = self.out.len() - self.sent < self.limits.send_buffer;
            if !(waiting && room) {
                continue;
            }
            begin_block(&mut self.block, &mut self.table_size);
            hpack::encode::status(status, &mut self.block);
            encode_fields(&fields, &mut self.block);
            let max_frame = self.peer_max_frame as u32;
            write::headers(&mut self.out, id, &self.block, false, max_frame);
            wrote = true;
        }
        wrote
    }

    /// The final head (after the interim ones handed over before it),
    /// then the body in turn with the others.
    fn start_response(&mut self, id: u32, response: Response<B>) {
        self.write_interims();
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let (parts, body) = response.into_parts();
        begin_block(&mut self.block, &mut self.table_size);
        hpack::encode::status(parts.status.as_u16(), &mut self.block);
        encode_fields(&parts.headers, &mut self.block);
        let end = body.is_end_stream();
        write::headers(
            &mut self.out,
            id,
            &self.block,
            end,
            self.peer_max_frame as u32,
        );
        stream.send = Sending::Body {
            body,
            pending: None,
        };
        if end {
            self.done.push(id);
        } else {
            self.sending.push_back(id);
        }
    }

    /// Response bodies, as far as the windows and the send buffer allow:
    /// streams take turns, a frame each, so a fast download on a wide
    /// window cannot fill the buffer at every turn while the others wait
    /// (and their clocks run as if their client did not read). A turn cut
    /// short by a full buffer resumes with the stream it stopped at.
    pub(super) fn send_bodies(&mut self, cx: &mut Context<'_>) -> bool {
        let mut moved = false;
        loop {
            let mut any = false;
            for _ in 0..self.sending.len() {
                if self.out.len() - self.sent >= self.limits.send_buffer {
                    self.blocked = true;
                    return moved;
                }
                let Some(id) = self.sending.pop_front() else {
                    break;
                };
                match self.send_frame(id, cx) {
                    Step::Moved => {
                        any = true;
                        self.sending.push_back(id);
                    }
                    Step::Waiting => self.sending.push_back(id),
                    Step::Ended => any = true,
                    // Reset at once: among the ended streams, one still
                    // uploading got a second RST_STREAM (NO_ERROR).
                    Step::Broke => {
                        self.reset(id, Reason::INTERNAL_ERROR);
                        any = true;
                    }
                    Step::Gone => {}
                }
            }
            if !any {
                return moved;
            }
            moved = true;
        }
    }

    /// One frame of stream `id`'s response, if it has one to send now.
    fn send_frame(&mut self, id: u32, cx: &mut Context<'_>) -> Step {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Step::Gone;
        };
        let Sending::Body { body, pending } = &mut stream.send else {
            return Step::Gone;
        };
        if pending.is_none() {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => {
                        // Held until the client's windows take it: its
                        // wait is the stream's stall clock, whatever the
                        // body (an exchange's guard tells the same).
                        stream.delivery.handed();
                        *pending = Some(data);
                    }
                    Ok(_) => return Step::Moved,
                    Err(frame) => {
                        let trailers = frame.into_trailers().unwrap_or_default();
                        begin_block(&mut self.block, &mut self.table_size);
                        encode_fields(&trailers, &mut self.block);
                        let max = self.peer_max_frame as u32;
                        write::headers(&mut self.out, id, &self.block, true, max);
                        self.done.push(id);
                        return Step::Ended;
                    }
                },
                Poll::Ready(None) => {
                    write::data_head(&mut self.out, id, 0, true);
                    self.done.push(id);
                    return Step::Ended;
                }
                Poll::Ready(Some(Err(_))) => return Step::Broke,
                Poll::Pending => return Step::Waiting,
            }
        }
        let Some(data) = pending else {
            return Step::Waiting;
        };
        let room = stream
            .send_window
            .min(self.send_window)
            .min(self.peer_max_frame as i64);
        if room <= 0 {
            self.blocked = true;
            return Step::Waiting;
        }
        let n = (room as usize).min(data.len());
        let last = n == data.len() && body.is_end_stream();
        write::data_head(&mut self.out, id, n, last);
        self.out.extend_from_slice(&data[..n]);
        data.advance(n);
        stream.send_window -= n as i64;
        self.send_window -= n as i64;
        if data.is_empty() {
            stream.delivery.asked();
            *pending = None;
        }
        if last {
            self.done.push(id);
            return Step::Ended;
        }
        Step::Moved
    }

    /// Streams whose responses ended: gone, and an upload still coming
    /// stopped (RST_STREAM NO_ERROR, RFC 9113 §8.1).
    pub(super) fn finish_streams(&mut self) {
        while let Some(id) = self.done.pop() {
            let Some(stream) = self.streams.remove(&id) else {
                continue;
            };
            if let Some(inbox) = &stream.inbox {
                if !stream.request_ended {
                    recv::lock(inbox).fail(RecvError::Reset(Reason::NO_ERROR));
                }
            }
            if !stream.request_ended {
                self.said_reset(id, Reason::NO_ERROR, true);
            }
        }
    }

    /// WINDOW_UPDATEs, once half a window is due: a stream's for what its
    /// exchange read, the connection's for what arrived.
    pub(super) fn grant_windows(&mut self) {
        for (&id, stream) in self.streams.iter_mut() {
            let Some(inbox) = &stream.inbox else {
                continue;
            };
            stream.recv_unacked += recv::lock(inbox).take_released();
            if !stream.request_ended && stream.recv_unacked >= self.limits.stream_window / 2 {
                write::window_update(&mut self.out, id, stream.recv_unacked);
                stream.recv_window += i64::from(stream.recv_unacked);
                stream.recv_unacked = 0;
            }
        }
        // Half the window arrived (`on_data`).
        if self.recv_unacked >= self.limits.connection_window / 2 {
            write::window_update(&mut self.out, 0, self.recv_unacked);
            self.recv_window += i64::from(self.recv_unacked);
            self.recv_unacked = 0;
        }
    }

    pub(super) fn flush(&mut self, cx: &mut Context<'_>) -> Result<bool, ConnError> {
        let mut moved = false;
        while self.sent < self.out.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.out[self.sent..]) {
                Poll::Ready(Ok(0)) => {
                    return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into())
                }
                Poll::Ready(Ok(n)) => {
                    self.sent += n;
                    self.unflushed = true;
                    moved = true;
                }
                Poll::Ready(Err(err)) => return Err(err.into()),
                Poll::Pending => {
                    // What went out is dropped once it is as much as the
                    // bound on what waits: `out` stays within twice that.
                    if self.sent >= self.limits.send_buffer {
                        self.out.drain(..self.sent);
                        self.sent = 0;
                    }
                    return Ok(moved);
                }
            }
        }
        self.out.clear();
        self.sent = 0;
        if self.unflushed {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(err)) => return Err(err.into()),
                Poll::Pending => {}
            }
        }
        Ok(moved)
    }

    /// A connection error, or a PING unanswered: GOAWAY with its reason,
    /// written if the socket takes it now.
    pub(super) fn fail(&mut self, err: &ConnError, cx: &mut Context<'_>) {
        let reason = match err {
            ConnError::Protocol(FrameError::Connection(reason, _)) => *reason,
            ConnError::Protocol(FrameError::Stream(..)) | ConnError::Preface => {
                Reason::PROTOCOL_ERROR
            }
            // A client silent past the PING's timeout may only be slow:
            // it is told the connection ends, as an idle one is.
            ConnError::PingTimeout => Reason::NO_ERROR,
            ConnError::Io(_) | ConnError::Cut => return,
        };
        let last = match self.closing {
            Closing::Final(last) => last,
            _ => self.highest,
        };
        write::goaway(&mut self.out, last, reason);
        let _ = self.flush(cx);
        for id in self.streams.keys().copied().collect::<Vec<_>>() {
            self.end_stream(id, RecvError::Reset(reason));
        }
    }
}
