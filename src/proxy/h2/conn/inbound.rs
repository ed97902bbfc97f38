//! What comes from the client: frames read while there is room for
//! their answers, each acted on (a new stream's exchange started, its
//! body handed to its inbox, windows and settings applied).

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures_util::future::{AbortHandle, Abortable};
use http::Request;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::super::frame::{self, write, Frame, FrameError, HeaderBlock, Inbound, Reason};
use super::super::hpack::{self, Listed};
use super::super::recv::{self, Inbox, RecvBody, RecvError};
use super::super::request;
use super::{
    begin_block, protocol, Closing, ConnError, Connection, Delivery, Exchange, Sending, Stream,
    TableSize, Tagged, HEADER_TABLE, KEEPALIVE_PING, SHUTDOWN_PING,
};
use crate::proxy::h1::io;

impl<S, F, B> Connection<S, F, B>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Request<RecvBody>) -> Exchange<B> + Unpin,
    B: Body<Data = Bytes> + Unpin,
{
    /// Frames are read while what waits to go out fills less than the send
    /// buffer, and the answers reading wrote (PING and SETTINGS acks,
    /// resets, heads baton answers itself) less than half of it: however
    /// many a client asks for, the exchanges and bodies, polled up to the
    /// whole buffer, have room. A client that sent PINGs and read their
    /// answers a few bytes at a time kept the buffer full of them, and no
    /// exchange was polled again: their timeouts never ran, and each held
    /// its backend connection for good. (Bounding all reading at half
    /// stalled it for a download to a slow client, whose socket took less
    /// than that at each wake-up.)
    pub(super) fn read_room(&self) -> bool {
        let unsent = self.out.len() - self.sent;
        unsent < self.limits.send_buffer && self.answers.min(unsent) < self.limits.send_buffer / 2
    }

    pub(super) fn read_frames(&mut self, cx: &mut Context<'_>) -> Result<bool, ConnError> {
        let mut moved = false;
        self.opened_this_pass = 0;
        while !self.read_closed && self.read_room() {
            if !self.preface {
                if self.read.len() < frame::PREFACE.len() {
                    if !frame::PREFACE.starts_with(&self.read) {
                        return Err(ConnError::Preface);
                    }
                } else if &self.read[..frame::PREFACE.len()] != frame::PREFACE {
                    return Err(ConnError::Preface);
                } else {
                    self.read.advance(frame::PREFACE.len());
                    self.preface = true;
                    continue;
                }
            } else {
                if self.opened_this_pass >= self.limits.max_streams {
                    // The exchanges opened so far get their first poll
                    // (and those reset since are dropped) before more
                    // are read: a batch of HEADERS and RST_STREAMs, which
                    // asks for no answer, cannot pile up exchanges.
                    return Ok(moved);
                }
                let (written, unsent) = (self.out.len(), self.out.len() - self.sent);
                // What was counted and has gone out since is no longer.
                self.answers = self.answers.min(unsent);
                match self.reader.next(&mut self.read) {
                    Ok(Some(inbound)) => {
                        if matches!(inbound, Inbound::Block(_)) {
                            // The next unfinished block's clock is its own.
                            self.block_alarm = None;
                        }
                        let done = self.on_inbound(inbound);
                        self.answers += self.out.len() - written;
                        done?;
                        moved = true;
                        continue;
                    }
                    Ok(None) => {}
                    // No RST_STREAM names a stream never opened (RFC
                    // 9113 §6.4): a fault on one is the connection's.
                    Err(FrameError::Stream(stream, _, why)) if stream > self.highest => {
                        return Err(protocol(Reason::PROTOCOL_ERROR, why));
                    }
                    Err(FrameError::Stream(stream, reason, _)) => {
                        self.reset(stream, reason);
                        self.answers += self.out.len() - written;
                        moved = true;
                        continue;
                    }
                    Err(err) => return Err(ConnError::Protocol(err)),
                }
            }
            match io::poll_read_some(&mut self.io, cx, &mut self.read) {
                Poll::Ready(Ok(0)) => {
                    self.read_closed = true;
                    if !self.read.is_empty() || self.reader.inside_block() {
                        return Err(ConnError::Cut);
                    }
                    // Nothing more comes: the responses of streams whose
                    // requests came whole go on. An upload under way is
                    // cut; a stream not answered yet is reset (CANCEL:
                    // its request was not whole), as no response can
                    // answer it; one answered early (a 413 before the
                    // body) keeps its answer.
                    let cut: Vec<(u32, bool)> = self
                        .streams
                        .iter()
                        .filter(|(_, stream)| stream.inbox.is_some() && !stream.request_ended)
                        .map(|(id, stream)| (*id, matches!(stream.send, Sending::Waiting(_))))
                        .collect();
                    for (id, unanswered) in cut {
                        if unanswered {
                            self.reset(id, Reason::CANCEL);
                        } else if let Some(inbox) =
                            self.streams.get(&id).and_then(|s| s.inbox.as_ref())
                        {
                            recv::lock(inbox).fail(RecvError::Reset(Reason::CANCEL));
                        }
                    }
                    return Ok(true);
                }
                Poll::Ready(Ok(_)) => {
                    self.last_read = Instant::now();
                    moved = true;
                }
                Poll::Ready(Err(err)) => return Err(err.into()),
                Poll::Pending => return Ok(moved),
            }
        }
        Ok(moved)
    }

    fn on_inbound(&mut self, inbound: Inbound) -> Result<(), ConnError> {
        let frame = match inbound {
            Inbound::Frame(Frame::Settings(settings)) => {
                self.settled = true;
                return self.apply(settings);
            }
            _ if !self.settled => {
                let why = "first frame not SETTINGS";
                return Err(protocol(Reason::PROTOCOL_ERROR, why));
            }
            Inbound::Block(block) => return self.on_header_block(block),
            Inbound::Frame(frame) => frame,
        };
        match frame {
            Frame::Data {
                stream,
                data,
                flow,
                end_stream,
            } => self.on_data(stream, data, flow, end_stream)?,
            Frame::Reset { stream, reason } => {
                if stream > self.highest {
                    return Err(protocol(
                        Reason::PROTOCOL_ERROR,
                        "RST_STREAM on an idle stream",
                    ));
                }
                if !self.streams.contains_key(&stream) {
                    self.closed_by_baton.ended(stream);
                }
                self.end_stream(stream, RecvError::Reset(reason));
            }
            Frame::WindowUpdate { stream, increment } => self.on_window(stream, increment)?,
            Frame::Ping {
                ack: false,
                payload,
            } => write::ping(&mut self.out, payload, true),
            Frame::Ping { ack: true, payload } => self.on_ping_answer(payload),
            Frame::GoAway { .. } => self.client_goaway = true,
            Frame::Continuation { .. } => {
                let why = "CONTINUATION without HEADERS";
                return Err(protocol(Reason::PROTOCOL_ERROR, why));
            }
            Frame::Headers { .. } | Frame::Settings(_) => {
                unreachable!("the reader hands header blocks and SETTINGS apart")
            }
            Frame::SettingsAck | Frame::Priority | Frame::Unknown { .. } => {}
        }
        Ok(())
    }

    fn apply(&mut self, settings: frame::Settings) -> Result<(), ConnError> {
        let lowered = settings
            .header_table_size
            .is_some_and(|size| (size as usize) < HEADER_TABLE);
        if lowered && self.table_size == TableSize::Initial {
            self.table_size = TableSize::UpdateDue;
        }
        if let Some(size) = settings.max_frame_size {
            self.peer_max_frame = size as usize;
        }
        if let Some(window) = settings.initial_window_size {
            let delta = i64::from(window) - self.peer_initial_window;
            self.peer_initial_window = i64::from(window);
            for stream in self.streams.values_mut() {
                stream.send_window += delta;
                if stream.send_window > i64::from(frame::MAX_WINDOW) {
                    let why = "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream's window";
                    return Err(protocol(Reason::FLOW_CONTROL_ERROR, why));
                }
            }
        }
        write::settings_ack(&mut self.out);
        Ok(())
    }

    fn on_header_block(&mut self, block: HeaderBlock) -> Result<(), ConnError> {
        // Room for a usual request's fields without growing.
        let mut fields = Vec::with_capacity(16);
        let limit = self.limits.max_header_list as usize;
        let listed = self
            .decoder
            .decode(&block.block, limit, &mut fields)
            .map_err(|_| protocol(Reason::COMPRESSION_ERROR, "header block does not decode"))?;
        let id = block.stream;
        if self.streams.contains_key(&id) {
            if listed == Listed::TooLarge {
                self.reset_ending(id, Reason::PROTOCOL_ERROR, block.end_stream);
            } else {
                self.on_trailers(id, fields, block.end_stream);
            }
            return Ok(());
        }
        if id.is_multiple_of(2) {
            let why = "HEADERS on a stream the client may not open";
            return Err(protocol(Reason::PROTOCOL_ERROR, why));
        }
        if id <= self.highest {
            return self.on_closed_block(id, block.end_stream);
        }
        if let Closing::Announced(at) = self.closing {
            if at.elapsed() > self.limits.goaway_crossing {
                // Naming the last stream served, not this one.
                self.refuse_new_streams();
            }
        }
        self.highest = id;
        self.opened += 1;
        if matches!(self.closing, Closing::Final(_))
            || self.streams.len() >= self.limits.max_streams as usize
        {
            self.said_reset(id, Reason::REFUSED_STREAM, !block.end_stream);
            return Ok(());
        }
        let mut head = match request::head(fields) {
            Ok(head) if !(block.end_stream && head.content_length.is_some_and(|l| l > 0)) => head,
            // The fields kept stop short of a pseudo-field (a path past
            // the bound): no request to hand on, so answered here alone.
            _ if listed == Listed::TooLarge => {
                self.said_refused(id, "its fields past the bound (431)", Some(431));
                self.answer_at_once(id, 431, block.end_stream);
                return Ok(());
            }
            refused => {
                let why = refused
                    .err()
                    .unwrap_or("a Content-Length with no body to come");
                self.said_refused(id, why, None);
                self.said_reset(id, Reason::PROTOCOL_ERROR, !block.end_stream);
                return Ok(());
            }
        };
        if listed == Listed::TooLarge {
            head.parts.extensions.insert(request::ListTooLarge);
        }
        let inbox = (!block.end_stream).then(|| Arc::new(Mutex::new(Inbox::default())));
        let body = RecvBody::new(inbox.clone(), head.content_length);
        let exchange = (self.service)(Request::from_parts(head.parts, body));
        let (abort, registration) = AbortHandle::new_pair();
        let delivery = Arc::new(Delivery::of_stream(id, Arc::clone(&self.interims)));
        let tagged = Tagged {
            stream: id,
            exchange: Some(exchange),
            delivery: Arc::clone(&delivery),
        };
        self.exchanges.push(Abortable::new(tagged, registration));
        self.opened_this_pass += 1;
        self.streams.insert(
            id,
            Stream {
                inbox,
                request_ended: block.end_stream,
                recv_window: i64::from(self.limits.stream_window),
                recv_unacked: 0,
                expected: head.content_length,
                received: 0,
                send_window: self.peer_initial_window,
                send: Sending::Waiting(abort),
                delivery,
            },
        );
        Ok(())
    }

    /// A header block on a stream closed already, decoded to keep the
    /// table in step. On one baton closed, it may be the request's
    /// trailers, on their way as it closed: ignored (RFC 9113 §5.1), once,
    /// for trailers end a stream; a block that does not end it is a new
    /// request on a used id (§5.1.1). Otherwise the client knew the stream
    /// closed: a connection error, STREAM_CLOSED (§5.1), or PROTOCOL_ERROR
    /// where it skipped ids, as the id may be one it never opened (§5.1.1;
    /// which ids it skipped is not kept). Ignored, such blocks let a client
    /// make baton decode 128 KiB for no stream, as long as it went on.
    fn on_closed_block(&mut self, id: u32, end_stream: bool) -> Result<(), ConnError> {
        if self.closed_by_baton.crossing(id) {
            if !end_stream {
                let why = "a new request on a used stream id";
                return Err(protocol(Reason::PROTOCOL_ERROR, why));
            }
            self.closed_by_baton.ended(id);
            return Ok(());
        }
        if self.opened < self.highest.div_ceil(2) {
            let why = "a header block on a stream id below one opened";
            return Err(protocol(Reason::PROTOCOL_ERROR, why));
        }
        let why = "a header block on a stream the client closed";
        Err(protocol(Reason::STREAM_CLOSED, why))
    }

    /// A header block on an open stream: its request's trailers, which end
    /// it. Anything else there is a stream error.
    fn on_trailers(&mut self, id: u32, fields: Vec<hpack::Field>, end_stream: bool) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.request_ended {
            // Half-closed by the client: only WINDOW_UPDATE, PRIORITY and
            // RST_STREAM may come (RFC 9113 §5.1).
            self.reset(id, Reason::STREAM_CLOSED);
            return;
        }
        let trailers = match (&stream.inbox, end_stream) {
            (Some(_), true) => request::trailers(fields).ok(),
            _ => None,
        };
        let Some(trailers) = trailers else {
            self.reset_ending(id, Reason::PROTOCOL_ERROR, end_stream);
            return;
        };
        if stream.expected.is_some_and(|e| e != stream.received) {
            self.reset_ending(id, Reason::PROTOCOL_ERROR, end_stream);
            return;
        }
        stream.request_ended = true;
        if let Some(inbox) = &stream.inbox {
            recv::lock(inbox).end(Some(trailers));
        }
    }

    /// Answers a stream with `status` and no body, from baton itself (a
    /// head too large to take: 431, as for HTTP/1).
    fn answer_at_once(&mut self, id: u32, status: u16, request_ended: bool) {
        begin_block(&mut self.block, &mut self.table_size);
        hpack::encode::status(status, &mut self.block);
        hpack::encode::field(b"content-length", b"0", &mut self.block);
        write::headers(
            &mut self.out,
            id,
            &self.block,
            true,
            self.peer_max_frame as u32,
        );
        if !request_ended {
            self.said_reset(id, Reason::NO_ERROR, true);
        }
    }

    fn on_data(
        &mut self,
        id: u32,
        data: Bytes,
        flow: u32,
        end_stream: bool,
    ) -> Result<(), ConnError> {
        let flow_i = i64::from(flow);
        self.recv_window -= flow_i;
        if self.recv_window < 0 {
            let why = "DATA beyond the connection's window";
            return Err(protocol(Reason::FLOW_CONTROL_ERROR, why));
        }
        // The connection's window goes back as DATA arrives, read or not
        // (nginx's rule): what waits unread is bounded by each stream's
        // window, and uploads queued for a backend, unread, must not hold
        // the window the one being read needs (four would fill 256 KiB).
        self.recv_unacked += flow;
        let Some(stream) = self.streams.get_mut(&id) else {
            if id > self.highest {
                return Err(protocol(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
            }
            // Crossing baton's close of the stream (see `closed`), or
            // sent after the client's own end of it.
            if !self.closed_by_baton.data_crossing(id) {
                let why = "DATA on a stream the client closed";
                return Err(protocol(Reason::STREAM_CLOSED, why));
            }
            if end_stream {
                self.closed_by_baton.ended(id);
            }
            return Ok(());
        };
        // Padding is given back at once.
        let padding = flow - data.len() as u32;
        stream.recv_window -= flow_i;
        stream.recv_unacked += padding;
        let fault = if stream.recv_window < 0 {
            Some(Reason::FLOW_CONTROL_ERROR)
        } else if stream.request_ended {
            Some(Reason::STREAM_CLOSED)
        } else {
            stream.received += data.len() as u64;
            let over = stream.expected.is_some_and(|e| stream.received > e);
            let short = end_stream && stream.expected.is_some_and(|e| stream.received != e);
            (over || short).then_some(Reason::PROTOCOL_ERROR)
        };
        if let Some(reason) = fault {
            let may_send = !end_stream && !stream.request_ended;
            if reason == Reason::PROTOCOL_ERROR {
                self.end_stream(id, RecvError::Length);
            }
            self.said_reset(id, reason, may_send);
            self.end_stream(id, RecvError::Reset(reason));
            return Ok(());
        }
        let Some(inbox) = &stream.inbox else {
            return Ok(());
        };
        let mut held = recv::lock(inbox);
        // Nobody reads it any more: dropped.
        if Arc::strong_count(inbox) > 1 && !data.is_empty() {
            held.push(&data);
        }
        if end_stream {
            held.end(None);
            drop(held);
            stream.request_ended = true;
        }
        Ok(())
    }

    /// Ends a stream the client reset or broke: its exchange is dropped
    /// (with whatever it held: a backend connection, a lease), its upload
    /// fails with `why`.
    pub(super) fn end_stream(&mut self, id: u32, why: RecvError) {
        let Some(stream) = self.streams.remove(&id) else {
            return;
        };
        if let Sending::Waiting(abort) = &stream.send {
            abort.abort();
        }
        if let Some(inbox) = &stream.inbox {
            recv::lock(inbox).fail(why);
        }
    }

    /// Resets a stream from baton's side.
    pub(super) fn reset(&mut self, id: u32, reason: Reason) {
        self.reset_ending(id, reason, false);
    }

    /// The same, for a frame that may have ended the stream itself
    /// (`ended_now`), which the stream does not know yet: its client then
    /// sends no more on it.
    fn reset_ending(&mut self, id: u32, reason: Reason, ended_now: bool) {
        let may_send = !ended_now && self.streams.get(&id).is_some_and(|s| !s.request_ended);
        self.said_reset(id, reason, may_send);
        self.end_stream(id, RecvError::Reset(reason));
    }

    /// Writes RST_STREAM on `id`. If its client may still be sending on
    /// it, what it sent before it saw the reset is let through (`closed`).
    pub(super) fn said_reset(&mut self, id: u32, reason: Reason, may_send: bool) {
        write::reset(&mut self.out, id, reason);
        if may_send {
            self.closed_by_baton.remember(id);
        }
    }

    fn on_window(&mut self, id: u32, increment: u32) -> Result<(), ConnError> {
        let max = i64::from(frame::MAX_WINDOW);
        if id == 0 {
            self.send_window += i64::from(increment);
            if self.send_window > max {
                let why = "WINDOW_UPDATE overflows the connection's window";
                return Err(protocol(Reason::FLOW_CONTROL_ERROR, why));
            }
            return Ok(());
        }
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.send_window += i64::from(increment);
            if stream.send_window > max {
                self.reset(id, Reason::FLOW_CONTROL_ERROR);
            }
        } else if id > self.highest {
            return Err(protocol(
                Reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        Ok(())
    }

    /// A request baton refused before it became one (malformed, RFC 9113
    /// §8.1.1: its stream reset; or its fields past the bound: 431,
    /// `answered`), told to whoever listens (the proxy says it, with the
    /// listener and the client, within the budget for clients' faults,
    /// and counts and logs a 431): it reaches no exchange, where an HTTP/1
    /// client's malformed head is a 400 logged (a client probing for
    /// smuggling shapes over h2 left no trace).
    fn said_refused(&self, stream: u32, why: &str, answered: Option<u16>) {
        if let Some(told) = &self.on_refused {
            told(stream, why, answered);
        }
    }

    fn on_ping_answer(&mut self, payload: [u8; 8]) {
        if payload == SHUTDOWN_PING {
            self.refuse_new_streams();
        } else if payload == KEEPALIVE_PING {
            self.ping_sent = None;
        }
    }
}
