//! Long-lived streams under a drain: upgraded connections (WebSocket and
//! others) and SSE responses would hold a drain's whole budget, so they are
//! ended when the drain begins (spread over `reload.close_spread` after a
//! reload), cleanly: a WebSocket gets a Close frame (1001 Going Away) at a
//! frame boundary of the server's stream, then a FIN; an SSE body ends at
//! an event boundary (one of stated length is a finite response, and runs
//! to its end). Each ending is a DEBUG line, counted in
//! `baton_long_lived_drained_total{kind}`; the drain says them all at INFO
//! with `expected=true` in one line, with the counts by kind.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::{FusedFuture, FutureExt};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::body::{BodyError, ProxyBody};
use super::h1::io::{read_lent, relay, release_if_empty};
use super::idle::{Activity, Observed};
use super::side::{side_of, Side, Sided};
use crate::lifecycle::drain::DrainWatch;
use crate::metrics::LongLivedKind;
use crate::wake_gate::{first_of, First};

/// Probes after 60 s of silence, every 10 s, 6 times, on a tunnel's two
/// sockets (TCP mode's, an upgraded connection's): a vanished peer is
/// found in about two minutes, long before `tunnel_timeout`'s default (an
/// hour, which a WebSocket whose backend's host died held its place for),
/// and a NAT or firewall that forgets idle flows keeps this one.
pub(super) fn keep_alive(stream: &tokio::net::TcpStream) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10))
        .with_retries(6);
    if let Err(err) = socket2::SockRef::from(stream).set_tcp_keepalive(&probes) {
        tracing::debug!(cause = %err, "cannot set TCP keep-alive");
    }
}

/// How long we wait for a frame (or an event) boundary, or for the client
/// to close after our Close frame, before cutting anyway.
pub const LINGER: Duration = Duration::from_secs(1);
/// A WebSocket Close frame from a server (unmasked), status 1001 Going Away.
const CLOSE_GOING_AWAY: [u8; 4] = [0x88, 0x02, 0x03, 0xe9];

/// Where a server-to-client WebSocket stream is: in a frame header (with
/// `have` bytes of it seen) or in a payload (`remaining` bytes to go).
#[derive(Debug, Default, Clone, Copy)]
pub struct FrameTracker {
    header: [u8; 14],
    have: usize,
    remaining: u64,
}

impl FrameTracker {
    /// True between frames: a Close frame written now is well-formed.
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.remaining == 0
    }

    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let take = self.remaining.min(data.len() as u64);
                self.remaining -= take;
                data = &data[take as usize..];
                continue;
            }
            self.header[self.have] = data[0];
            self.have += 1;
            data = &data[1..];
            if let Some(len) = self.header_complete() {
                self.have = 0;
                self.remaining = len;
            }
        }
    }

    /// The payload length once the header is complete.
    fn header_complete(&self) -> Option<u64> {
        if self.have < 2 {
            return None;
        }
        let masked = self.header[1] & 0x80 != 0;
        let len7 = self.header[1] & 0x7f;
        let ext = match len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let need = 2 + ext + if masked { 4 } else { 0 };
        if self.have < need {
            return None;
        }
        Some(match len7 {
            126 => u64::from(u16::from_be_bytes([self.header[2], self.header[3]])),
            127 => u64::from_be_bytes(self.header[2..10].try_into().unwrap_or([0; 8])),
            n => u64::from(n),
        })
    }
}

/// How the backend-to-client half ended.
enum DownEnd {
    BackendClosed,
    /// Both sides closed their halves, each passed on.
    BothClosed,
    /// At a frame boundary (or any byte, for other upgrades) once the
    /// drain asked: a WebSocket may get its Close frame.
    Drain,
    /// The drain asked and the stream did not reach a boundary, or the
    /// client took no bytes, within `LINGER`: cut without a Close frame
    /// (one written mid-frame would be garbage to the client).
    Cut,
    /// A side's connection failed (reset, most often): the other side is
    /// to be reset too, not closed with a FIN.
    Failed(Side),
}

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    /// Both sides closed, each FIN passed on (or the backend closed after
    /// the drain had asked), or the drain ended it. The last close toward
    /// the client (over TLS a close_notify a client that stopped reading
    /// holds back) is one the drain may end too.
    Closed,
    /// Nothing moved either way for `tunnel_timeout` (for the listener's
    /// `idle_timeout` once a side closed its half).
    Idle,
    /// This side's connection failed. Its peer is left for the caller to
    /// reset ([`super::reset::once_taken`]): a FIN would pass the abort
    /// off as a whole stream. The peer's write side is not shut, so no FIN
    /// goes ahead of that reset.
    Failed(Side),
}

/// Joins a client's and a backend's upgraded connections until both sides
/// closed (a FIN either way passed on, as in TCP mode) or one failed, the
/// drain ends the stream, or nothing moves either way for `limits.tunnel`
/// (for `limits.half_closed` once the backend closed its half and the
/// client does not close its own: as in TCP mode, and HAProxy's
/// `timeout client-fin`, it would hold its places for the hour; see
/// [`TunnelEnd`]). The caller holds the backend's lease meanwhile.
/// `frames` follows a WebSocket's frames (`frames_sent`), and is `None`
/// for other upgrades.
pub async fn tunnel<C, B>(
    client: C,
    backend: B,
    frames: Option<FrameTracker>,
    drain: DrainWatch,
    listener: &str,
    limits: TunnelLimits,
) -> TunnelEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = std::sync::Arc::new(Activity::default());
    let joined = joined(client, backend, frames, drain, listener, &activity);
    let idle = activity.idle_for_or(limits.tunnel, limits.half_closed);
    match first_of(joined, idle).await {
        First::Main(None) => TunnelEnd::Closed,
        First::Main(Some(side)) => TunnelEnd::Failed(side),
        First::Rare(()) => {
            // Within the budget for clients' faults: a client can leave
            // as many tunnels idle as it may open.
            if crate::telemetry::may_say_client_fault() {
                tracing::info!(listener = %listener, "no traffic either way within tunnel_timeout (idle_timeout once the backend closed its half); closing the tunnel");
            }
            TunnelEnd::Idle
        }
    }
}

/// A WebSocket's frames as the backend began them in `sent_down`, what it
/// sent past its 101 that the caller wrote to the client already: a frame
/// it began must end before a Close frame may be written. Taken before the
/// tunnel, so the caller's buffer can go back (an idle WebSocket held it,
/// 16 KiB or more, for the hour). `None` for other upgrades.
pub fn frames_sent(websocket: bool, sent_down: &[u8]) -> Option<FrameTracker> {
    websocket.then(|| {
        let mut frames = FrameTracker::default();
        frames.feed(sent_down);
        frames
    })
}

/// How long a tunnel may go with nothing moving either way: `tunnel`, or
/// `half_closed` once the backend closed its half.
#[derive(Debug, Clone, Copy)]
pub struct TunnelLimits {
    pub tunnel: Duration,
    pub half_closed: Duration,
}

async fn joined<C, B>(
    client: C,
    backend: B,
    frames: Option<FrameTracker>,
    drain: DrainWatch,
    listener: &str,
    activity: &std::sync::Arc<Activity>,
) -> Option<Side>
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (client_read, mut client_write) = tokio::io::split(client);
    let (backend_read, backend_write) = tokio::io::split(backend);
    let mut client_read = Observed::new(
        Sided::new(client_read, Side::Client),
        std::sync::Arc::clone(activity),
    );
    let mut backend_write = Sided::new(backend_write, Side::Backend);
    let backend_read = Sided::new(backend_read, Side::Backend);
    let mut backend_read = Observed::new(backend_read, std::sync::Arc::clone(activity));
    let websocket = frames.is_some();
    let kind = if websocket {
        LongLivedKind::WebSocket
    } else {
        LongLivedKind::Upgrade
    };
    // Fused: the drain may have asked before the backend closed, and is
    // looked at again after.
    let ending = drain.long_lived_ending().fuse();
    tokio::pin!(ending);
    let end = {
        let up = async {
            if let Err(err) = relay(&mut client_read, &mut backend_write).await {
                return Err(side_of(&err).unwrap_or(Side::Client));
            }
            let _ = backend_write.shutdown().await;
            Ok(())
        };
        tokio::pin!(up);
        let (end, up_running) = {
            // One copy for the half's whole life: bytes it holds while the
            // client is slow to take them go on after the client's half-close.
            let down = pump_down(
                &mut backend_read,
                &mut client_write,
                frames,
                ending.as_mut(),
            );
            tokio::pin!(down);
            tokio::select! {
                end = &mut down => (end, true),
                up_end = &mut up => (match up_end {
                    // The client closed its side: let the backend finish its
                    // answer.
                    Ok(()) => down.await,
                    // The backend would take no more (it reset, crashed, or
                    // closed under what the client sent): what it sent before
                    // is still owed to the client, and then its failure, which
                    // the way down's reads would take for a FIN (see
                    // `side::both_ways`).
                    Err(Side::Backend) => match down.await {
                        DownEnd::BackendClosed => DownEnd::Failed(Side::Backend),
                        end => end,
                    },
                    Err(Side::Client) => DownEnd::Failed(Side::Client),
                }, false),
            }
        };
        match end {
            DownEnd::BackendClosed if up_running && !ending.is_terminated() => {
                activity.backend_closed();
                client_goes_on(up, &mut client_write, ending.as_mut()).await
            }
            end => end,
        }
    };
    match end {
        DownEnd::Drain | DownEnd::Cut => {
            // Bounded: a client that stops reading does not hold the drain.
            let _ = tokio::time::timeout(LINGER, async {
                if websocket && matches!(end, DownEnd::Drain) {
                    let _ = client_write.write_all(&CLOSE_GOING_AWAY).await;
                }
                let _ = client_write.shutdown().await;
            })
            .await;
            // Read what the client still sends (its Close reply) so closing
            // the socket does not turn into a reset.
            // On the heap: inline, it would add 4 KiB to every long-lived
            // stream's task for its whole life.
            let mut sink = vec![0u8; 4096];
            let _ = tokio::time::timeout(LINGER, async {
                while matches!(client_read.read(&mut sink).await, Ok(n) if n > 0) {}
            })
            .await;
            drain.ended_long_lived(kind);
            tracing::debug!(listener = %listener, kind = kind.as_str(), expected = true, "ended long-lived stream for drain");
        }
        DownEnd::BackendClosed => {
            // What is left is the client's end of it: over TLS a
            // close_notify, which waits for room a client that stopped
            // reading keeps from it. The idle clock's shorter limit bounds
            // it, as a half-closed TCP-mode session's (it was the tunnel's
            // hour), and a drain ends it as the other long-lived streams
            // (it was forced at the drain's deadline).
            // (A drain that had asked already, before the backend's end,
            // gives it `LINGER` more; one that asks now ends it, counted.)
            activity.backend_closed();
            let closed = client_write.shutdown();
            tokio::pin!(closed);
            let cut = ending.is_terminated()
                || tokio::select! {
                    _ = closed.as_mut() => false,
                    () = ending.as_mut() => {
                        drain.ended_long_lived(kind);
                        tracing::debug!(listener = %listener, kind = kind.as_str(), expected = true, "ended long-lived stream for drain");
                        true
                    }
                };
            if cut {
                let _ = tokio::time::timeout(LINGER, closed).await;
            }
        }
        DownEnd::BothClosed => {}
        DownEnd::Failed(side) => return Some(side),
    }
    None
}

/// The backend closed its half (its FIN passed on to `client` here) and the
/// client has not:
/// what the client still sends goes to the backend until it closes too, as
/// TCP mode and HAProxy pass a half-close on (a protocol whose server ends
/// its output first and then reads the rest lost it), or until the drain
/// asks (a cut: the client has its FIN already). A backend that takes no
/// more (it closed whole, or crashed) fails the tunnel, as in TCP mode:
/// the client is reset, not told its last bytes went through.
async fn client_goes_on<U, W, E>(up: Pin<&mut U>, client: &mut W, ending: Pin<&mut E>) -> DownEnd
where
    U: Future<Output = Result<(), Side>>,
    W: AsyncWrite + Unpin,
    E: Future<Output = ()>,
{
    // The FIN goes out beside the way up: over TLS it waits for room a
    // client that does not read keeps from it.
    let fin = async {
        let _ = client.shutdown().await;
        std::future::pending().await
    };
    tokio::select! {
        up_end = up => match up_end {
            Ok(()) => DownEnd::BothClosed,
            Err(side) => DownEnd::Failed(side),
        },
        () = ending => DownEnd::Cut,
        never = fin => never,
    }
}

/// Copies backend → client; once `ending` fires, stops at the next frame
/// boundary (a WebSocket's, followed by `frames`) or after the bytes in
/// hand (other upgrades), and within `LINGER` whatever the client takes.
async fn pump_down<R, W, E>(
    backend: &mut R,
    client: &mut W,
    frames: Option<FrameTracker>,
    mut ending: Pin<&mut E>,
) -> DownEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    E: Future<Output = ()>,
{
    let websocket = frames.is_some();
    let mut tracker = frames.unwrap_or_default();
    // Lent while bytes are on their way (`read_lent`): an idle stream holds
    // no buffer.
    let mut buf = BytesMut::new();
    // Set when the drain asks: the stream ends by then.
    let mut deadline: Option<tokio::time::Instant> = None;
    let linger = || Some(tokio::time::Instant::now() + LINGER);
    loop {
        let read = tokio::select! {
            read = read_lent(backend, &mut buf) => read,
            () = ending.as_mut(), if deadline.is_none() => {
                if !websocket || tracker.at_boundary() {
                    return DownEnd::Drain;
                }
                deadline = linger();
                continue;
            }
            () = until(deadline) => return DownEnd::Cut,
        };
        let n = match read {
            Ok(0) => return DownEnd::BackendClosed,
            Ok(n) => n,
            Err(_) => return DownEnd::Failed(Side::Backend),
        };
        // Written piece by piece so the drain is heard while the client is
        // slow to take them.
        let mut sent = 0;
        while sent < n {
            tokio::select! {
                written = client.write(&buf[sent..n]) => match written {
                    Ok(0) | Err(_) => return DownEnd::Failed(Side::Client),
                    Ok(w) => sent += w,
                },
                () = ending.as_mut(), if deadline.is_none() => deadline = linger(),
                () = until(deadline) => return DownEnd::Cut,
            }
        }
        // Over TLS the session holds back what the socket did not take:
        // out now, not with the backend's next message.
        loop {
            tokio::select! {
                flushed = client.flush() => match flushed {
                    Ok(()) => break,
                    Err(_) => return DownEnd::Failed(Side::Client),
                },
                () = ending.as_mut(), if deadline.is_none() => deadline = linger(),
                () = until(deadline) => return DownEnd::Cut,
            }
        }
        tracker.feed(&buf[..n]);
        buf.clear();
        release_if_empty(&mut buf);
        if deadline.is_some() && (!websocket || tracker.at_boundary()) {
            return DownEnd::Drain;
        }
    }
}

/// Sleeps until `deadline`, or for ever without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The last bytes of an event stream: whether they end an event (a blank
/// line, with any of the three line ends the format allows). Both paths'
/// event streams end at such a boundary when the drain asks.
#[derive(Debug, Clone, Copy)]
pub struct EventTail([u8; 4]);

impl Default for EventTail {
    /// Before its first byte a stream is between events.
    fn default() -> Self {
        EventTail(*b"\r\n\r\n")
    }
}

impl EventTail {
    pub fn saw(&mut self, data: &[u8]) {
        for b in data.iter().rev().take(4).rev() {
            self.0 = [self.0[1], self.0[2], self.0[3], *b];
        }
    }

    pub fn at_boundary(&self) -> bool {
        let last2 = &self.0[2..];
        last2 == b"\n\n" || last2 == b"\r\r" || self.0 == *b"\r\n\r\n"
    }
}

/// Whether a `Content-Type` value names an event stream (SSE): the media
/// type in any case (RFC 9110 §8.3.1), alone or before its parameters
/// (`;`, after optional whitespace), not a longer type that starts alike.
pub fn is_event_stream(content_type: &[u8]) -> bool {
    const EVENT_STREAM: &[u8] = b"text/event-stream";
    let Some((start, rest)) = content_type.split_at_checked(EVENT_STREAM.len()) else {
        return false;
    };
    start.eq_ignore_ascii_case(EVENT_STREAM)
        && matches!(rest.trim_ascii_start().first(), None | Some(b';'))
}

/// An SSE response body that ends at the first event boundary after the
/// drain asks long-lived streams to end.
pub struct SseBody {
    inner: ProxyBody,
    ending: Pin<Box<dyn Future<Output = ()> + Send>>,
    ending_fired: bool,
    /// Runs from the drain's word: a stream whose backend never reaches an
    /// event boundary (comment heartbeats without a blank line, an event
    /// written in pieces) is ended where it is once it runs out, as a
    /// WebSocket without a frame boundary is (a client drops an event cut
    /// short); it held the drain to its deadline, counted as forced.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    tail: EventTail,
    listener: std::sync::Arc<str>,
    drain: DrainWatch,
}

impl SseBody {
    pub fn wrap(inner: ProxyBody, drain: DrainWatch, listener: std::sync::Arc<str>) -> ProxyBody {
        use http_body_util::BodyExt;
        let watch = drain.clone();
        SseBody {
            inner,
            ending: Box::pin(async move { watch.long_lived_ending().await }),
            ending_fired: false,
            linger: None,
            tail: EventTail::default(),
            listener,
            drain,
        }
        .boxed_unsync()
    }

    fn finish(&mut self) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.drain.ended_long_lived(LongLivedKind::Sse);
        tracing::debug!(listener = %self.listener, kind = "sse", expected = true, "ended event stream for drain");
        Poll::Ready(None)
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if !self.ending_fired && self.ending.as_mut().poll(cx).is_ready() {
            self.ending_fired = true;
            self.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        if self.ending_fired && self.tail.at_boundary() {
            return self.finish();
        }
        if let Some(linger) = &mut self.linger {
            if linger.as_mut().poll(cx).is_ready() {
                return self.finish();
            }
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let data = data.clone();
                self.tail.saw(&data);
            }
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

#[cfg(test)]
mod tests {
    use super::{is_event_stream, FrameTracker};

    /// A message the backend sends reaches a TLS client whole while the
    /// backend sends nothing more (over a pipe that holds 1 KiB, the TLS
    /// session kept its end until the next message).
    #[tokio::test]
    async fn a_message_reaches_a_tls_client_whole_before_the_next() {
        use tokio::io::AsyncWriteExt;
        const MESSAGE: usize = 200_000;
        let (server_io, client_io) = tokio::io::duplex(1024);
        let (mut to_client, mut client) =
            crate::tls::testing::session_pair(server_io, client_io).await;
        let (mut backend, mut from_backend) = tokio::io::duplex(64 * 1024);
        let pump = tokio::spawn(async move {
            let ending = std::future::pending::<()>();
            tokio::pin!(ending);
            super::pump_down(&mut from_backend, &mut to_client, None, ending).await;
        });
        // Sent while the client reads, and then the backend stays open.
        let sender = tokio::spawn(async move {
            backend
                .write_all(&vec![7u8; MESSAGE])
                .await
                .expect("backend sends");
            std::future::pending::<()>().await;
            drop(backend);
        });
        let got = crate::tls::testing::bytes_arriving(&mut client, MESSAGE).await;
        pump.abort();
        sender.abort();
        assert_eq!(got, MESSAGE, "{got} of {MESSAGE} bytes arrived");
    }

    /// A tunnel (not a WebSocket) between the two pipes, with a drain that
    /// never begins, `tunnel` and `half_closed` seconds its limits.
    fn plain_tunnel(
        client_side: tokio::io::DuplexStream,
        backend_side: tokio::io::DuplexStream,
        tunnel: u64,
        half_closed: u64,
    ) -> tokio::task::JoinHandle<super::TunnelEnd> {
        let drain = crate::lifecycle::drain::Drain::new(1);
        let tunnel = drained_tunnel(client_side, backend_side, &drain, tunnel, half_closed);
        tokio::spawn(async move {
            let end = tunnel.await;
            drop(drain);
            end.expect("tunnel")
        })
    }

    /// The same under `drain`.
    fn drained_tunnel(
        client_side: tokio::io::DuplexStream,
        backend_side: tokio::io::DuplexStream,
        drain: &crate::lifecycle::drain::Drain,
        tunnel: u64,
        half_closed: u64,
    ) -> tokio::task::JoinHandle<super::TunnelEnd> {
        let limits = super::TunnelLimits {
            tunnel: std::time::Duration::from_secs(tunnel),
            half_closed: std::time::Duration::from_secs(half_closed),
        };
        let watch = drain.watch();
        tokio::spawn(async move {
            super::tunnel(client_side, backend_side, None, watch, "test", limits).await
        })
    }

    /// A backend that closed after sending still has all it sent reach the
    /// client when a write to it then fails (the client sent more), and
    /// the failure after it.
    #[tokio::test]
    async fn what_a_backend_sent_before_closing_reaches_the_client_after_a_write_to_it_failed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const SENT: usize = 64 * 1024;
        // The client's pipe holds 1 KiB: the rest waits in the tunnel.
        let (client_side, mut client) = tokio::io::duplex(1024);
        let (backend_side, mut backend) = tokio::io::duplex(2 * SENT);
        backend
            .write_all(&[7u8; SENT])
            .await
            .expect("backend sends");
        drop(backend);
        let tunnel = plain_tunnel(client_side, backend_side, 60, 60);
        client.write_all(b"late").await.expect("client sends");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("read");
        assert_eq!(got.len(), SENT, "every byte the backend sent");
        assert_eq!(
            tunnel.await.expect("tunnel"),
            super::TunnelEnd::Failed(super::Side::Backend),
            "and then its failure, to pass on"
        );
    }

    /// A backend that ends its output first has its FIN passed on, and
    /// still gets what the client sends after it, and the client's FIN: a
    /// half-close is passed on as in TCP mode (the tunnel ended at the
    /// backend's FIN, and dropped the rest).
    #[tokio::test]
    async fn a_backends_half_close_is_passed_on_and_the_client_still_sends() {
        use tokio::io::AsyncWriteExt;
        let (client_side, mut client) = tokio::io::duplex(1024);
        let (backend_side, mut backend) = tokio::io::duplex(1024);
        let tunnel = plain_tunnel(client_side, backend_side, 60, 60);
        backend.write_all(b"answer").await.expect("backend sends");
        backend.shutdown().await.expect("the backend's FIN");
        let got = to_end(&mut client).await;
        assert_eq!(got, b"answer", "the answer, then the backend's FIN");
        client.write_all(b"the rest").await.expect("client sends");
        client.shutdown().await.expect("the client's FIN");
        let rest = to_end(&mut backend).await;
        assert_eq!(rest, b"the rest", "what the client sent after it");
        assert_eq!(tunnel.await.expect("tunnel"), super::TunnelEnd::Closed);
    }

    /// `tunnel` ends as `expected`, within 10 s (of paused time) of
    /// `started`: far from the hour its own limit would take.
    async fn ends_soon(
        tunnel: tokio::task::JoinHandle<super::TunnelEnd>,
        started: tokio::time::Instant,
        expected: super::TunnelEnd,
    ) {
        assert_eq!(tunnel.await.expect("tunnel"), expected);
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }

    /// Everything `side` reads until its end, within a few seconds.
    async fn to_end(side: &mut tokio::io::DuplexStream) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let read = side.read_to_end(&mut got);
        tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("an end within 5 s")
            .expect("read");
        got
    }

    /// A backend that closed whole after its answer fails the tunnel once
    /// a write of what the client still sends finds it gone, as in TCP
    /// mode: the client is reset, not told those bytes went through.
    #[tokio::test]
    async fn a_backend_gone_after_its_fin_fails_the_tunnel_when_written_to() {
        use tokio::io::AsyncWriteExt;
        let (client_side, mut client) = tokio::io::duplex(1024);
        let (backend_side, backend) = tokio::io::duplex(1024);
        let tunnel = plain_tunnel(client_side, backend_side, 60, 60);
        drop(backend);
        assert!(to_end(&mut client).await.is_empty(), "the backend's FIN");
        client.write_all(b"late").await.expect("client sends");
        assert_eq!(
            tunnel.await.expect("tunnel"),
            super::TunnelEnd::Failed(super::Side::Backend)
        );
    }

    /// Once the backend closed its half, the client's way up still ends
    /// when the drain asks long-lived streams to end, not at its limits.
    #[tokio::test(start_paused = true)]
    async fn a_tunnel_whose_backend_closed_its_half_ends_at_the_drain() {
        use tokio::io::AsyncWriteExt;
        let (client_side, mut client) = tokio::io::duplex(1024);
        let (backend_side, mut backend) = tokio::io::duplex(1024);
        let drain = crate::lifecycle::drain::Drain::new(1);
        let tunnel = drained_tunnel(client_side, backend_side, &drain, 3600, 3600);
        backend.shutdown().await.expect("the backend's FIN");
        to_end(&mut client).await;
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(!tunnel.is_finished(), "ended before the client's FIN");
        drain.begin(std::time::Duration::ZERO);
        let started = tokio::time::Instant::now();
        ends_soon(tunnel, started, super::TunnelEnd::Closed).await;
    }

    /// A backend that closed its half, with a client that neither sends
    /// nor closes, ends the tunnel after the half-closed limit too.
    #[tokio::test(start_paused = true)]
    async fn a_tunnel_whose_backend_closed_its_half_ends_after_the_shorter_limit() {
        use tokio::io::AsyncWriteExt;
        let (client_side, mut client) = tokio::io::duplex(1024);
        let (backend_side, mut backend) = tokio::io::duplex(1024);
        let tunnel = plain_tunnel(client_side, backend_side, 3600, 2);
        let started = tokio::time::Instant::now();
        backend.shutdown().await.expect("the backend's FIN");
        to_end(&mut client).await;
        // Passed on at once, not with the tunnel's end at the limit.
        let fin = started.elapsed();
        assert!(fin < std::time::Duration::from_millis(100), "{fin:?}");
        ends_soon(tunnel, started, super::TunnelEnd::Idle).await;
    }

    /// A client side whose close never completes (over TLS, a
    /// close_notify that a client which stopped reading holds back):
    /// reads, writes and flushes go to the pipe.
    struct CloseHeldBack(tokio::io::DuplexStream);

    impl tokio::io::AsyncRead for CloseHeldBack {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for CloseHeldBack {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Pending
        }
    }

    /// A tunnel whose client closed its half first, then its backend
    /// answered and closed: what is left is the close toward the client,
    /// which it holds back; `half_closed` seconds the shorter limit.
    async fn close_held_back(
        drain: &crate::lifecycle::drain::Drain,
        half_closed: u64,
    ) -> tokio::task::JoinHandle<super::TunnelEnd> {
        use tokio::io::AsyncWriteExt;
        let (client_side, mut client) = tokio::io::duplex(1024);
        let (backend_side, mut backend) = tokio::io::duplex(1024);
        let limits = super::TunnelLimits {
            tunnel: std::time::Duration::from_secs(3600),
            half_closed: std::time::Duration::from_secs(half_closed),
        };
        let watch = drain.watch();
        let client_side = CloseHeldBack(client_side);
        let tunnel = tokio::spawn(async move {
            super::tunnel(client_side, backend_side, None, watch, "test", limits).await
        });
        client.shutdown().await.expect("the client's FIN");
        assert!(to_end(&mut backend).await.is_empty(), "passed on");
        backend.write_all(b"answer").await.expect("backend sends");
        drop(backend);
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!tunnel.is_finished(), "held by the close");
        tunnel
    }

    /// That close waits no longer than the half-closed limit (it waited
    /// the tunnel's hour).
    #[tokio::test(start_paused = true)]
    async fn a_close_the_client_holds_back_ends_after_the_shorter_limit() {
        let drain = crate::lifecycle::drain::Drain::new(1);
        let tunnel = close_held_back(&drain, 5).await;
        let started = tokio::time::Instant::now();
        ends_soon(tunnel, started, super::TunnelEnd::Idle).await;
    }

    /// A drain ends that close as it ends the other long-lived streams,
    /// and counts it (it was forced at the drain's deadline).
    #[tokio::test(start_paused = true)]
    async fn a_close_the_client_holds_back_is_ended_by_the_drain() {
        let drain = crate::lifecycle::drain::Drain::new(1);
        let tunnel = close_held_back(&drain, 3600).await;
        drain.begin(std::time::Duration::ZERO);
        let started = tokio::time::Instant::now();
        ends_soon(tunnel, started, super::TunnelEnd::Closed).await;
        assert_eq!(drain.long_lived_ended().upgrades, 1);
    }

    /// A client that closed its half waits for the backend's answer under
    /// the tunnel's own limit, not the half-closed one: the backend may be
    /// at work (HAProxy waits `timeout tunnel` with no `server-fin`).
    #[tokio::test(start_paused = true)]
    async fn a_tunnel_whose_client_closed_its_half_waits_under_the_tunnel_limit() {
        use tokio::io::AsyncWriteExt;
        let (client_side, mut client) = tokio::io::duplex(1024);
        let (backend_side, _backend) = tokio::io::duplex(1024);
        let tunnel = plain_tunnel(client_side, backend_side, 3600, 2);
        client.shutdown().await.expect("the client's FIN");
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(!tunnel.is_finished(), "ended at the half-closed limit");
        let ended = tokio::time::timeout(std::time::Duration::from_secs(4600), tunnel);
        let end = ended.await.expect("ended at the tunnel's limit");
        assert_eq!(end.expect("tunnel"), super::TunnelEnd::Idle);
    }

    #[test]
    fn frame_boundaries_are_tracked_across_splits() {
        let mut t = FrameTracker::default();
        assert!(t.at_boundary());
        // A 5-byte text frame, fed in pieces.
        t.feed(&[0x81]);
        assert!(!t.at_boundary());
        t.feed(&[0x05, b'h', b'e']);
        assert!(!t.at_boundary());
        t.feed(b"llo");
        assert!(t.at_boundary());
        // A 300-byte frame with a 16-bit length, then a masked empty frame.
        let mut frame = vec![0x82, 126, 0x01, 0x2c];
        frame.extend(std::iter::repeat_n(0u8, 300));
        frame.extend([0x89, 0x80, 1, 2, 3, 4]);
        t.feed(&frame[..100]);
        assert!(!t.at_boundary());
        t.feed(&frame[100..]);
        assert!(t.at_boundary());
    }

    #[test]
    fn an_event_stream_is_known_in_any_case_and_with_parameters() {
        assert!(is_event_stream(b"text/event-stream"));
        assert!(is_event_stream(b"Text/Event-Stream; charset=utf-8"));
        assert!(is_event_stream(b"text/event-stream ;charset=utf-8"));
        assert!(!is_event_stream(b"text/event-streams"));
        assert!(!is_event_stream(b"text/event"));
        assert!(!is_event_stream(b"text/html"));
    }
}
