//! One h2 client connection, served by one task: frames read and acted on,
//! each stream's exchange polled in place (no task, channel or lock a
//! stream), responses written as their bodies and the client's windows
//! allow. HAProxy's h2 mux has the same shape; hyper's server spawned a
//! task for each stream and piped its body to the connection through the
//! `h2` crate's shared stream store.
//!
//! The exchange is the caller's: a function from a request to a future of
//! its response. What the client sends of a request body waits in the
//! stream's inbox until the exchange reads it; what it read is given back
//! to the stream's window (the connection's goes back as it arrives).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::super::delivery::{self, Delivery, Interims};
use super::super::h1::io;
use super::frame::{self, write, Frame, FrameError, HeaderBlock, Inbound, Reader, Reason};
use super::hpack::{self, Decoder, Listed};
use super::recv::{self, Inbox, RecvBody, RecvError, SharedInbox};
use super::request;

/// What baton allows a client, announced in its SETTINGS.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_streams: u32,
    /// What a client may send of one stream's body before it is read.
    pub stream_window: u32,
    /// The same for all streams together, of what is on its way: it goes
    /// back as DATA arrives, read or not.
    pub connection_window: u32,
    /// A request head's fields, with 32 bytes more each (RFC 9113 §6.5.2).
    pub max_header_list: u32,
    /// How much baton holds written and not yet taken by the socket
    /// before it stops polling response bodies and reading frames (see
    /// `read_room`).
    pub send_buffer: usize,
    /// A PING after this long without a frame from the client; the
    /// connection ends if its answer does not come within `ping_timeout`.
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
    /// How long a stream's response may wait for the client to take any of
    /// it (its window, or the socket) before the stream is reset: one
    /// stream starved while others move would otherwise hold its backend
    /// connection for good (nginx's `send_timeout` is per stream too).
    pub stall_limit: Duration,
    /// How long after a graceful close's GOAWAY a new stream may still
    /// come (opened before the client saw it); later ones are refused,
    /// whether or not the client answered the PING sent with the GOAWAY
    /// (RFC 9113 §6.8: it must open none after seeing it).
    pub goaway_crossing: Duration,
    /// How long a header block may stay unfinished (HEADERS without
    /// END_HEADERS, its CONTINUATIONs still to come): the listener's
    /// `header_timeout`.
    pub block_limit: Duration,
}

/// A stream's exchange: its response, once it has one.
pub type Exchange<B> = Pin<Box<dyn Future<Output = Response<B>> + Send>>;

/// How a connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("client connection: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Protocol(FrameError),
    #[error("client preface missing or wrong")]
    Preface,
    #[error("client closed the connection inside a frame")]
    Cut,
    #[error("client did not answer a PING within its timeout")]
    PingTimeout,
}

/// The payload of the PING that follows the first GOAWAY of a graceful
/// close: its answer says the client has seen the GOAWAY, and every
/// stream it opened before is in (RFC 9113 §6.8).
const SHUTDOWN_PING: [u8; 8] = *b"goaway!!";
const KEEPALIVE_PING: [u8; 8] = *b"alive?..";
/// The largest stream id: the first GOAWAY of a graceful close names it,
/// refusing nothing yet.
const ANY_STREAM: u32 = frame::MAX_WINDOW;
/// HPACK's table size baton keeps for a client's request heads, and the
/// size a client's table for response heads starts with (RFC 9113 §6.5.2).
const HEADER_TABLE: usize = 4096;
/// The output buffer an idle connection keeps (more, and it is dropped):
/// enough for a small response's frames, not what a download grew.
const OUT_KEPT_IDLE: usize = 1024;
/// The room for streams an idle connection keeps (more, and it is
/// dropped): a client that keeps up to 14 streams open (h2load's `-m10`)
/// does not make baton allocate it again for each burst (3 % more
/// instructions a request under callgrind when it did), a browser's page
/// load of dozens does not leave its room held.
const STREAMS_KEPT_IDLE: usize = 16;

/// One stream's state.
struct Stream<B> {
    /// The request body's inbox while the request is coming (`None` for
    /// a request that ended with its head).
    inbox: Option<SharedInbox>,
    /// Whether the request's END_STREAM came.
    request_ended: bool,
    /// What the client may still send on the stream, and what was read of
    /// it and not yet given back.
    recv_window: i64,
    recv_unacked: u32,
    /// Content-Length, and the DATA that came.
    expected: Option<u64>,
    received: u64,
    /// What the client's window for this stream still takes.
    send_window: i64,
    send: Sending<B>,
    /// Whether a frame of its response waits for the client, since when.
    delivery: Arc<Delivery>,
}

enum Sending<B> {
    /// The exchange is under way (aborted with this if the stream ends).
    Waiting(AbortHandle),
    /// The head went out; the body follows, `pending` what it gave that
    /// the windows did not take yet.
    Body { body: B, pending: Option<Bytes> },
}

/// What one stream's turn at sending did.
enum Step {
    /// A frame went out (or the body gave an empty one): it may have more.
    Moved,
    /// Nothing now: its body, or the client's window, is not ready.
    Waiting,
    /// Its response ended with this turn.
    Ended,
    /// It is no longer sending (reset, or ended before).
    Gone,
}

/// An exchange, tagged with its stream, polled with the stream's delivery
/// lent to it; without one, the anchor of `anchored`.
struct Tagged<B> {
    stream: u32,
    exchange: Option<Exchange<B>>,
    delivery: Arc<Delivery>,
}

impl<B> Future for Tagged<B> {
    type Output = (u32, Response<B>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(u32, Response<B>)> {
        let this = &mut *self;
        let stream = this.stream;
        let Some(exchange) = this.exchange.as_mut() else {
            return Poll::Pending;
        };
        let polled = delivery::lend(&this.delivery, || exchange.as_mut().poll(cx));
        polled.map(|r| (stream, r))
    }
}

/// The set of a connection's exchanges, holding an anchor that is never
/// ready and never woken. `FuturesUnordered` wakes its task again each
/// time one call has polled every future in it and the last stayed
/// pending (its guard against starving other tasks), which is every time
/// a connection's new streams all get their first poll at once: the
/// whole connection was polled again one turn of the runtime later with
/// nothing to do, and the next responses then went out over more and
/// smaller polls, each stream's on its own. The anchor keeps that call
/// from ever having polled every future. Measured (h2load `-c64 -m10`,
/// the proxy alone on a core, three interleaved runs): a fifth fewer
/// polls, p99 from 10.4 to 7.4 ms (HAProxy's 7.6), the rate the same
/// within the runs' spread.
fn anchored<B>() -> FuturesUnordered<Abortable<Tagged<B>>> {
    let mut exchanges = FuturesUnordered::new();
    let anchor = Tagged {
        stream: 0,
        exchange: None,
        delivery: Arc::new(Delivery::new()),
    };
    exchanges.push(Abortable::new(anchor, AbortHandle::new_pair().1));
    // Its one poll, which takes it out of the set's queue for good (else
    // the first batch of streams would be polled along with it, all of
    // the set at once).
    let pending = exchanges
        .poll_next_unpin(&mut Context::from_waker(Waker::noop()))
        .is_pending();
    debug_assert!(pending, "the anchor is never ready");
    exchanges
}

/// Where a graceful close stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Closing {
    Open,
    /// GOAWAY naming any stream and a PING went out, then.
    Announced(Instant),
    /// The second GOAWAY named the last stream served, this one, and any
    /// later GOAWAY names it again (RFC 9113 §6.8: the id never goes up).
    /// A stream refused since still raises `highest`, so that its late
    /// frames are taken as a closed stream's, not an idle one's.
    Final(u32),
}

/// The size of the dynamic table response heads are encoded against, as
/// the client knows it. baton's encoder uses no table, but a client that
/// lowers SETTINGS_HEADER_TABLE_SIZE below the size a table starts with
/// must be told of a size within it at the start of the next field block
/// (RFC 7541 §4.2): nghttp2's clients answer a block without it with
/// COMPRESSION_ERROR (`h2load --header-table-size 0` failed every request).
#[derive(Clone, Copy, PartialEq, Eq)]
enum TableSize {
    /// 4,096, what every table starts with.
    Initial,
    /// The client lowered it: the next block says 0 first.
    UpdateDue,
    /// Said to be 0, within any size the client may set later.
    Zero,
}

/// One client connection: a future that ends when the connection does.
pub struct Connection<S, F, B> {
    io: S,
    service: F,
    limits: Limits,
    read: BytesMut,
    reader: Reader,
    decoder: Decoder,
    preface: bool,
    /// Whether the client's first SETTINGS came (it must come first).
    settled: bool,
    out: Vec<u8>,
    /// How much of `out` the socket took.
    sent: usize,
    unflushed: bool,
    /// A response head being encoded (kept for its capacity).
    block: Vec<u8>,
    /// Where the encoder's table size stands with the client's.
    table_size: TableSize,
    streams: HashMap<u32, Stream<B>>,
    exchanges: FuturesUnordered<Abortable<Tagged<B>>>,
    /// Streams done this turn, removed after it.
    done: Vec<u32>,
    /// Streams whose response bodies are under way, in their turn.
    sending: VecDeque<u32>,
    /// The highest stream the client opened.
    highest: u32,
    /// Header blocks that came on streams closed already, and the streams
    /// the client opened (taken or refused; see `on_header_block`).
    late_blocks: u32,
    opened: u32,
    /// Streams opened by this turn's reading (see `read_frames`).
    opened_this_pass: u32,
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_window: i64,
    recv_window: i64,
    recv_unacked: u32,
    closing: Closing,
    client_goaway: bool,
    read_closed: bool,
    last_read: Instant,
    ping_sent: Option<Instant>,
    alarm: Pin<Box<Sleep>>,
    /// Whether a stream's response stopped with a frame unsent, and the
    /// alarm for the first such frame's `stall_limit`.
    blocked: bool,
    stall_alarm: Option<Pin<Box<Sleep>>>,
    /// Set while a header block is unfinished at the end of a turn's
    /// reading (see `watch_block`).
    block_alarm: Option<Pin<Box<Sleep>>>,
    /// Bytes of answers reading wrote to `out`, as far as they may still
    /// be unsent (see `read_room`).
    answers: usize,
    on_stall: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Interim (1xx) heads the exchanges handed over, to write.
    interims: Arc<Interims>,
}

impl<S, F, B> Connection<S, F, B>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Request<RecvBody>) -> Exchange<B> + Unpin,
    B: Body<Data = Bytes> + Unpin,
{
    /// Serves `io`, whose first bytes (`seen`, read already to tell h2
    /// from HTTP/1) are the client's preface.
    pub fn new(io: S, seen: &[u8], limits: Limits, service: F) -> Connection<S, F, B> {
        let mut out = Vec::with_capacity(128);
        write::settings(
            &mut out,
            &[
                (0x3, limits.max_streams),
                (0x4, limits.stream_window),
                (0x6, limits.max_header_list),
            ],
        );
        let default_window = 65_535;
        let grown = limits.connection_window.saturating_sub(default_window);
        if grown > 0 {
            write::window_update(&mut out, 0, grown);
        }
        let now = Instant::now();
        Connection {
            io,
            service,
            limits,
            read: BytesMut::from(seen),
            reader: Reader::new(
                frame::DEFAULT_MAX_FRAME,
                2 * limits.max_header_list as usize,
            ),
            decoder: Decoder::new(HEADER_TABLE),
            preface: false,
            settled: false,
            out,
            sent: 0,
            unflushed: false,
            block: Vec::with_capacity(256),
            table_size: TableSize::Initial,
            streams: HashMap::new(),
            exchanges: anchored(),
            done: Vec::new(),
            sending: VecDeque::new(),
            highest: 0,
            late_blocks: 0,
            opened: 0,
            opened_this_pass: 0,
            peer_max_frame: frame::DEFAULT_MAX_FRAME as usize,
            peer_initial_window: i64::from(default_window),
            send_window: i64::from(default_window),
            recv_window: i64::from(limits.connection_window.max(default_window)),
            recv_unacked: 0,
            closing: Closing::Open,
            client_goaway: false,
            read_closed: false,
            last_read: now,
            ping_sent: None,
            alarm: Box::pin(tokio::time::sleep_until(now + limits.ping_interval)),
            blocked: false,
            stall_alarm: None,
            block_alarm: None,
            answers: 0,
            on_stall: None,
            interims: Arc::default(),
        }
    }

    /// Told each time a stream is reset for its client's stall.
    pub fn on_stall(mut self, told: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.on_stall = Some(told);
        self
    }

    /// Starts a graceful close: GOAWAY at once, naming no last stream yet
    /// (streams the client opened before it sees it are still served),
    /// then the real last stream once the client answers the PING sent
    /// with it. The connection ends when its streams are done.
    pub fn graceful_shutdown(&mut self) {
        if self.closing == Closing::Open {
            write::goaway(&mut self.out, ANY_STREAM, Reason::NO_ERROR);
            write::ping(&mut self.out, SHUTDOWN_PING, false);
            self.closing = Closing::Announced(Instant::now());
        }
    }

    /// The second GOAWAY, naming the last stream served: any later one is
    /// refused. Also written before a close baton decides on a client that
    /// did not answer the first, so that a request on its way is known
    /// unserved and may be sent again (RFC 9113 §6.8).
    pub fn refuse_new_streams(&mut self) {
        self.last_goaway(Reason::NO_ERROR);
    }

    /// For a client found flooding (rapid reset): the last GOAWAY at once,
    /// ENHANCE_YOUR_CALM, where a graceful close would give it a second
    /// more of streams opened and reset, each sent on to a backend.
    pub fn refuse_a_flood(&mut self) {
        self.last_goaway(Reason::ENHANCE_YOUR_CALM);
    }

    /// GOAWAY naming the last stream served, once: streams opened later
    /// are refused.
    fn last_goaway(&mut self, reason: Reason) {
        if !matches!(self.closing, Closing::Final(_)) {
            write::goaway(&mut self.out, self.highest, reason);
            self.closing = Closing::Final(self.highest);
        }
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// One pass over everything that can move; whether anything did.
    fn turn(&mut self, cx: &mut Context<'_>) -> Result<bool, ConnError> {
        let mut moved = self.read_frames(cx)?;
        self.watch_block(cx)?;
        moved |= self.poll_exchanges(cx);
        moved |= self.send_bodies(cx);
        self.watch_stalls(cx);
        self.finish_streams();
        self.grant_windows();
        self.keep_alive(cx)?;
        moved |= self.flush(cx)?;
        Ok(moved)
    }

    /// A connection with no stream open and nothing held to read or to
    /// write gives its buffers back as it waits: a client that keeps its
    /// connection between page loads costs its socket and state, not a
    /// 16 KiB read buffer and the room its last burst of streams took
    /// (HTTP/1 connections hold no buffer while idle either). The read
    /// buffer goes to the worker's stock of spares, which the next read
    /// of any connection takes from (`h1::io`).
    fn release_when_idle(&mut self) {
        if self.streams.is_empty() && self.read.is_empty() && self.out.is_empty() {
            io::release_if_empty(&mut self.read);
            if self.out.capacity() > OUT_KEPT_IDLE {
                self.out = Vec::new();
            }
            if self.streams.capacity() > STREAMS_KEPT_IDLE {
                self.streams = HashMap::new();
                self.sending = VecDeque::new();
                self.done = Vec::new();
            }
        }
    }

    fn finished(&self) -> bool {
        let no_more =
            self.read_closed || self.client_goaway || matches!(self.closing, Closing::Final(_));
        no_more && self.streams.is_empty() && self.sent == self.out.len() && !self.unflushed
    }

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
    fn read_room(&self) -> bool {
        let unsent = self.out.len() - self.sent;
        unsent < self.limits.send_buffer && self.answers.min(unsent) < self.limits.send_buffer / 2
    }

    fn read_frames(&mut self, cx: &mut Context<'_>) -> Result<bool, ConnError> {
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
                self.reset(id, Reason::PROTOCOL_ERROR);
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
            // A stream closed already, maybe by baton's reset while these
            // trailers were on their way: ignored (RFC 9113 §5.1), its
            // block decoded above to keep the table in step. Trailers end
            // a stream, once: a block that does not (a new request on a
            // used id, RFC 9113 §5.1.1), or more such blocks than streams
            // it opened (ids it skipped are none), is no race but a client
            // making baton decode blocks for no stream.
            self.late_blocks += 1;
            if !block.end_stream || self.late_blocks > self.opened {
                let why = "a header block on a stream closed already";
                return Err(protocol(Reason::PROTOCOL_ERROR, why));
            }
            return Ok(());
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
            write::reset(&mut self.out, id, Reason::REFUSED_STREAM);
            return Ok(());
        }
        let mut head = match request::head(fields) {
            Ok(head) if !(block.end_stream && head.content_length.is_some_and(|l| l > 0)) => head,
            // The fields kept stop short of a pseudo-field (a path past
            // the bound): no request to hand on, so answered here alone.
            _ if listed == Listed::TooLarge => {
                self.answer_at_once(id, 431, block.end_stream);
                return Ok(());
            }
            _ => {
                write::reset(&mut self.out, id, Reason::PROTOCOL_ERROR);
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
            self.reset(id, Reason::PROTOCOL_ERROR);
            return;
        };
        if stream.expected.is_some_and(|e| e != stream.received) {
            self.reset(id, Reason::PROTOCOL_ERROR);
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
            write::reset(&mut self.out, id, Reason::NO_ERROR);
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
            if reason == Reason::PROTOCOL_ERROR {
                self.end_stream(id, RecvError::Length);
            }
            self.reset(id, reason);
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
    fn end_stream(&mut self, id: u32, why: RecvError) {
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
    fn reset(&mut self, id: u32, reason: Reason) {
        write::reset(&mut self.out, id, reason);
        self.end_stream(id, RecvError::Reset(reason));
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

    fn on_ping_answer(&mut self, payload: [u8; 8]) {
        if payload == SHUTDOWN_PING {
            self.refuse_new_streams();
        } else if payload == KEEPALIVE_PING {
            self.ping_sent = None;
        }
    }

    /// Responses whose exchanges are done: their heads go out, while the
    /// send buffer has room. Past it the exchanges wait (a flush that
    /// makes room wakes the connection): a client that reads nothing
    /// cannot make baton hold every stream's head (up to 64 KiB each)
    /// beyond what the socket took, only the bound and one head.
    fn poll_exchanges(&mut self, cx: &mut Context<'_>) -> bool {
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
    fn send_bodies(&mut self, cx: &mut Context<'_>) -> bool {
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
                Poll::Ready(Some(Err(_))) => {
                    write::reset(&mut self.out, id, Reason::INTERNAL_ERROR);
                    self.done.push(id);
                    return Step::Ended;
                }
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

    /// Resets each stream whose response has had a frame waiting for the
    /// client for `stall_limit` (see [`Limits::stall_limit`]). Looked at
    /// only while some response is held up, and then on one alarm for the
    /// first one due: nothing while bytes move.
    fn watch_stalls(&mut self, cx: &mut Context<'_>) {
        if !self.blocked && self.stall_alarm.is_none() {
            return;
        }
        self.blocked = false;
        let limit = self.limits.stall_limit;
        loop {
            let now = Instant::now();
            let stalled: Vec<u32> = self
                .streams
                .iter()
                .filter(|(_, s)| s.delivery.waiting_since().is_some_and(|t| t + limit <= now))
                .map(|(&id, _)| id)
                .collect();
            for id in stalled {
                if let Some(stream) = self.streams.get(&id) {
                    stream.delivery.time_out();
                }
                if let Some(told) = &self.on_stall {
                    told();
                }
                self.reset(id, Reason::CANCEL);
            }
            let first = self
                .streams
                .values()
                .filter_map(|s| s.delivery.waiting_since())
                .min();
            let Some(first) = first else {
                self.stall_alarm = None;
                return;
            };
            let due = first + limit;
            let alarm = self
                .stall_alarm
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if alarm.deadline() != due {
                alarm.as_mut().reset(due);
            }
            if alarm.as_mut().poll(cx).is_pending() {
                return;
            }
        }
    }

    /// Streams whose responses ended: gone, and an upload still coming
    /// stopped (RST_STREAM NO_ERROR, RFC 9113 §8.1).
    fn finish_streams(&mut self) {
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
                write::reset(&mut self.out, id, Reason::NO_ERROR);
            }
        }
    }

    /// WINDOW_UPDATEs, once half a window is due: a stream's for what its
    /// exchange read, the connection's for what arrived.
    fn grant_windows(&mut self) {
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

    /// A header block left unfinished must end within `block_limit` of
    /// the turn that first saw it so: otherwise the connection ends
    /// (`ENHANCE_YOUR_CALM`). With another stream open no idle clock runs,
    /// and a CONTINUATION every half minute (under the PING's interval)
    /// held up to 128 KiB of block per connection for a quarter of an
    /// hour. A block whose frames come together never sets the alarm.
    fn watch_block(&mut self, cx: &mut Context<'_>) -> Result<(), ConnError> {
        // Not counted while baton itself reads nothing (its room full):
        // the block's next frame may be waiting, unread.
        if !self.reader.inside_block() || !self.read_room() {
            self.block_alarm = None;
            return Ok(());
        }
        let limit = self.limits.block_limit;
        let alarm = self
            .block_alarm
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if alarm.as_mut().poll(cx).is_ready() {
            let why = "a header block left unfinished past header_timeout";
            return Err(protocol(Reason::ENHANCE_YOUR_CALM, why));
        }
        Ok(())
    }

    /// A PING once the client has been silent for `ping_interval`; the
    /// connection ends if no answer comes within `ping_timeout`. The alarm
    /// is moved only when it fires (no timer work while frames come).
    fn keep_alive(&mut self, cx: &mut Context<'_>) -> Result<(), ConnError> {
        // A client that closed its side can answer no PING.
        if self.read_closed {
            return Ok(());
        }
        while self.alarm.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let next = match self.ping_sent {
                Some(sent) if now >= sent + self.limits.ping_timeout => {
                    return Err(ConnError::PingTimeout);
                }
                Some(sent) => sent + self.limits.ping_timeout,
                None if now >= self.last_read + self.limits.ping_interval => {
                    write::ping(&mut self.out, KEEPALIVE_PING, false);
                    self.ping_sent = Some(now);
                    now + self.limits.ping_timeout
                }
                None => self.last_read + self.limits.ping_interval,
            };
            self.alarm.as_mut().reset(next);
        }
        Ok(())
    }

    fn flush(&mut self, cx: &mut Context<'_>) -> Result<bool, ConnError> {
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
    fn fail(&mut self, err: &ConnError, cx: &mut Context<'_>) {
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

impl<S, F, B> Future for Connection<S, F, B>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Request<RecvBody>) -> Exchange<B> + Unpin,
    B: Body<Data = Bytes> + Unpin,
{
    type Output = Result<(), ConnError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match this.turn(cx) {
                Ok(true) => {}
                Ok(false) if this.finished() => return Poll::Ready(Ok(())),
                Ok(false) => {
                    this.release_when_idle();
                    return Poll::Pending;
                }
                Err(err) => {
                    this.fail(&err, cx);
                    return Poll::Ready(Err(err));
                }
            }
        }
    }
}

impl<S, F, B> Drop for Connection<S, F, B> {
    /// Uploads still read by nothing learn the connection is gone.
    fn drop(&mut self) {
        for stream in self.streams.values() {
            if let Some(inbox) = &stream.inbox {
                recv::lock(inbox).fail(RecvError::Reset(Reason::CANCEL));
            }
        }
    }
}

fn protocol(reason: Reason, why: &'static str) -> ConnError {
    ConnError::Protocol(FrameError::Connection(reason, why))
}

/// Starts a field block: first, once, the table size update a lowered
/// SETTINGS_HEADER_TABLE_SIZE calls for (every block is written after that
/// SETTINGS' acknowledgement, which `apply` writes at once).
fn begin_block(block: &mut Vec<u8>, table_size: &mut TableSize) {
    block.clear();
    if *table_size == TableSize::UpdateDue {
        hpack::encode::table_size_zero(block);
        *table_size = TableSize::Zero;
    }
}

/// A response's fields, without those that mean something to one HTTP/1
/// connection only (RFC 9113 §8.2.2).
fn encode_fields(headers: &HeaderMap, block: &mut Vec<u8>) {
    for (name, value) in headers {
        let connection_specific = matches!(
            name.as_str(),
            "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
        );
        if !connection_specific {
            hpack::encode::field(name.as_str().as_bytes(), value.as_bytes(), block);
        }
    }
}
