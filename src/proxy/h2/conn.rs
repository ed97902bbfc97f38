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
//!
//! This file holds the connection's state and its turn; what comes in is
//! `inbound`, what goes out `outbound`, and its timers `clocks`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::super::delivery::{self, Delivery, Interims};
use super::super::h1::io;
use super::frame::{self, write, FrameError, Reader, Reason};
use super::hpack::{self, Decoder};
use super::recv::{self, RecvBody, RecvError, SharedInbox};
use closed::ClosedByBaton;

mod clocks;
mod closed;
mod inbound;
mod outbound;

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
/// The response-head buffer an idle connection keeps (more, and it is
/// dropped): a usual head's encoding, not the largest one it ever sent.
const BLOCK_KEPT_IDLE: usize = 1024;
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
    /// Its response body failed: the stream is to be reset.
    Broke,
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

/// What a connection tells of a request it refused: its stream, why, and
/// the status baton answered it with if it answered it (431) rather than
/// reset it.
pub type Refused = dyn Fn(u32, &str, Option<u16>) + Send + Sync;

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
    /// The streams the client opened (taken or refused): fewer than the
    /// odd ids up to `highest` means it skipped some (see
    /// `on_closed_block`).
    opened: u32,
    /// Streams baton closed before their client ended them, whose frames
    /// may still cross the close.
    closed_by_baton: ClosedByBaton,
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
    on_refused: Option<Arc<Refused>>,
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
            opened: 0,
            closed_by_baton: ClosedByBaton::new(limits.max_streams),
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
            on_refused: None,
            interims: Arc::default(),
        }
    }

    /// Told each time a stream is reset for its client's stall.
    pub fn on_stall(mut self, told: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.on_stall = Some(told);
        self
    }

    /// Told of each request refused before it reached an exchange: the
    /// stream, and why (see `said_refused`).
    pub fn on_refused(mut self, told: Arc<Refused>) -> Self {
        self.on_refused = Some(told);
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
            // A large head once (up to 64 KiB) is not held for good.
            if self.block.capacity() > BLOCK_KEPT_IDLE {
                self.block = Vec::new();
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
