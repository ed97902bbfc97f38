//! baton's own h2 server connection (`proxy::h2::conn`) serving real
//! clients over loopback: hyper's h2 client (flow control both ways,
//! trailers), the `h2` crate's (resets), curl, and raw frames for what no
//! client library sends (malformed heads, too many streams, silence after
//! a PING). The exchange behind it is a small function of the test's.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use baton::proxy::h2::conn::{ConnError, Connection, Exchange, Limits};
use baton::proxy::h2::frame::{self, Frame, Inbound, Reader, Reason};
use baton::proxy::h2::hpack::{Decoder, Listed};
use baton::proxy::h2::recv::RecvBody;
use baton::proxy::h2::request::ListTooLarge;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame as BodyFrame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

const PATIENCE: Duration = Duration::from_secs(10);
/// `/big`'s body: this many 64 KiB chunks, each ready at once (64 GiB:
/// no test reads it to its end).
const BIG_CHUNKS: usize = 1 << 20;

type Reply = UnsyncBoxBody<Bytes, RecvErrorText>;
type RecvErrorText = Box<dyn std::error::Error + Send + Sync>;

fn limits() -> Limits {
    Limits {
        max_streams: 100,
        stream_window: 64 * 1024,
        connection_window: 256 * 1024,
        max_header_list: 16 * 1024,
        send_buffer: 32 * 1024,
        ping_interval: Duration::from_secs(30),
        ping_timeout: Duration::from_secs(20),
        stall_limit: Duration::from_secs(30),
        goaway_crossing: Duration::from_secs(1),
        block_limit: Duration::from_secs(10),
    }
}

fn text(body: &'static str) -> Reply {
    Full::new(Bytes::from_static(body.as_bytes()))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// What the test's exchange saw and holds.
#[derive(Default)]
struct Seen {
    /// Exchanges dropped before they ended (a reset stream's).
    dropped: AtomicUsize,
    /// Let `/slow` answer.
    release: Gate,
    /// `/bighead` exchanges that gave their response.
    big_heads: AtomicUsize,
    /// `/bighead` requests read: their exchanges made, polled or not.
    bighead_requests: AtomicUsize,
    /// Requests marked as past the field list's bound (answered 431).
    too_large: AtomicUsize,
}

/// Opens once and stays open: a waiter that comes after the opening goes
/// through at once. (A `Notify`'s `notify_waiters` reaches only waiters
/// already made, and on a loaded machine an exchange or a connection can
/// make its own after the test's fixed sleep.)
struct Gate(watch::Sender<bool>);

impl Default for Gate {
    fn default() -> Gate {
        Gate(watch::Sender::new(false))
    }
}

impl Gate {
    fn open(&self) {
        self.0.send_replace(true);
    }

    async fn passed(&self) {
        // The sender lives as long as the gate: the wait ends only open.
        let _ = self.0.subscribe().wait_for(|open| *open).await;
    }
}

/// Counts itself dropped unless disarmed.
struct DropCount(Arc<Seen>, bool);

impl Drop for DropCount {
    fn drop(&mut self) {
        if self.1 {
            self.0.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `/hello`: a short answer; `/bighead`: one with a 16 KiB field and no
/// body; `/echo`: the request body back, streamed;
/// `/trailers`: the body's length, and its trailers back as trailers;
/// `/broken`: a body that fails after its first bytes;
/// `/slow`: answers once the test releases it.
fn exchange(seen: Arc<Seen>) -> impl FnMut(Request<RecvBody>) -> Exchange<Reply> + Unpin {
    move |request: Request<RecvBody>| {
        let seen = Arc::clone(&seen);
        if request.uri().path() == "/bighead" {
            seen.bighead_requests.fetch_add(1, Ordering::SeqCst);
        }
        let too_large = request.extensions().get::<ListTooLarge>().is_some();
        Box::pin(async move {
            if too_large {
                seen.too_large.fetch_add(1, Ordering::SeqCst);
                let mut response = Response::new(text(""));
                *response.status_mut() = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
                return response;
            }
            let path = request.uri().path().to_string();
            let body = request.into_body();
            match path.as_str() {
                "/echo" => Response::new(body.map_err(RecvErrorText::from).boxed_unsync()),
                "/broken" => {
                    let frames = vec![
                        Ok(BodyFrame::data(Bytes::from_static(b"half"))),
                        Err(RecvErrorText::from("the backend broke off")),
                    ];
                    let stream = futures_util::stream::iter(frames);
                    Response::new(StreamBody::new(stream).boxed_unsync())
                }
                "/trailers" => {
                    let collected = body.collect().await.expect("whole body");
                    let trailers = collected.trailers().cloned().unwrap_or_default();
                    let length = collected.to_bytes().len();
                    let frames = vec![
                        Ok::<_, RecvErrorText>(BodyFrame::data(Bytes::from(length.to_string()))),
                        Ok(BodyFrame::trailers(trailers)),
                    ];
                    let stream = futures_util::stream::iter(frames);
                    Response::new(StreamBody::new(stream).boxed_unsync())
                }
                "/big" => {
                    let chunk = Bytes::from(vec![b'b'; 64 * 1024]);
                    let chunks = (0..BIG_CHUNKS)
                        .map(move |_| Ok::<_, RecvErrorText>(BodyFrame::data(chunk.clone())));
                    Response::new(
                        StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync(),
                    )
                }
                "/bighead" => {
                    seen.big_heads.fetch_add(1, Ordering::SeqCst);
                    let mut response = Response::new(text(""));
                    let value = "h".repeat(16 * 1024).parse().expect("value");
                    response.headers_mut().insert("x-big", value);
                    response
                }
                "/slow" => {
                    let mut guard = DropCount(Arc::clone(&seen), true);
                    seen.release.passed().await;
                    guard.1 = false;
                    Response::new(text("slow"))
                }
                _ => {
                    let mut response = Response::new(text("hello"));
                    response
                        .headers_mut()
                        .insert("x-served", "yes".parse().expect("value"));
                    response
                }
            }
        }) as Exchange<Reply>
    }
}

/// Serves each connection to `listener` with baton's h2 server; every
/// connection's outcome goes to the channel. `shutdown` starts a graceful
/// close of every connection.
fn serve(
    listener: TcpListener,
    limits: Limits,
    seen: Arc<Seen>,
    shutdown: Arc<Gate>,
) -> mpsc::UnboundedReceiver<Result<(), ConnError>> {
    let (ended, outcomes) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (seen, shutdown, ended) = (Arc::clone(&seen), Arc::clone(&shutdown), ended.clone());
            tokio::spawn(async move {
                let mut conn = Connection::new(socket, &[], limits, exchange(seen));
                let outcome = tokio::select! {
                    outcome = &mut conn => outcome,
                    () = shutdown.passed() => {
                        conn.graceful_shutdown();
                        (&mut conn).await
                    }
                };
                // Its streams' exchanges with it, before the outcome is told.
                drop(conn);
                let _ = ended.send(outcome);
            });
        }
    });
    outcomes
}

struct Server {
    addr: std::net::SocketAddr,
    seen: Arc<Seen>,
    shutdown: Arc<Gate>,
    outcomes: mpsc::UnboundedReceiver<Result<(), ConnError>>,
}

async fn server(limits: Limits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let seen = Arc::new(Seen::default());
    let shutdown = Arc::new(Gate::default());
    let outcomes = serve(listener, limits, Arc::clone(&seen), Arc::clone(&shutdown));
    Server {
        addr,
        seen,
        shutdown,
        outcomes,
    }
}

type Client = hyper::client::conn::http2::SendRequest<Reply>;

/// hyper's h2 client, with the protocol's default windows (64 KiB), not
/// hyper's (5 MiB), so that baton's sending runs out of them.
async fn hyper_client(addr: std::net::SocketAddr) -> Client {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    client
}

fn get(addr: std::net::SocketAddr, path: &str) -> Request<Reply> {
    Request::get(format!("http://{addr}{path}"))
        .body(text(""))
        .expect("request")
}

#[tokio::test]
async fn many_streams_at_once_are_answered() {
    let server = server(limits()).await;
    let client = hyper_client(server.addr).await;
    let mut answers = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let mut client = client.clone();
        let request = get(server.addr, "/hello");
        answers.spawn(async move {
            let response = client.send_request(request).await.expect("response");
            let served = response.headers().get("x-served").cloned();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (served, body)
        });
    }
    let answered = tokio::time::timeout(PATIENCE, answers.join_all())
        .await
        .expect("in time");
    assert_eq!(answered.len(), 50);
    for (served, body) in answered {
        assert_eq!(served.as_ref().map(|v| v.as_bytes()), Some(&b"yes"[..]));
        assert_eq!(body, "hello");
    }
}

/// 4 MiB up and back down on four streams at once: far more than the
/// windows baton grants (64 KiB a stream, 256 KiB the connection) and
/// than the client's (64 KiB), so both directions run on WINDOW_UPDATEs.
#[tokio::test]
async fn large_uploads_are_echoed_within_both_sides_windows() {
    let server = server(limits()).await;
    let client = hyper_client(server.addr).await;
    let mut echoes = tokio::task::JoinSet::new();
    for n in 0..4u8 {
        let mut client = client.clone();
        let sent: Vec<u8> = (0..4 * 1024 * 1024u32)
            .map(|i| (i % 251) as u8 ^ n)
            .collect();
        let chunks: Vec<Result<BodyFrame<Bytes>, RecvErrorText>> = sent
            .chunks(100_000)
            .map(|c| Ok(BodyFrame::data(Bytes::copy_from_slice(c))))
            .collect();
        let body = StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync();
        let request = Request::post(format!("http://{}/echo", server.addr))
            .body(body)
            .expect("request");
        echoes.spawn(async move {
            let response = client.send_request(request).await.expect("response");
            let back = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            back == sent
        });
    }
    let same = tokio::time::timeout(PATIENCE, echoes.join_all())
        .await
        .expect("in time");
    assert_eq!(same, [true; 4]);
}

/// Uploads nobody reads yet (their exchanges wait, as behind a full
/// backend) hold what they were sent, up to their streams' windows: eight
/// of them hold 512 KiB, twice the connection's window, and another
/// stream's upload still goes on (the connection's window goes back as
/// DATA arrives, read or not).
#[tokio::test]
async fn unread_uploads_do_not_stall_the_others() {
    let server = server(limits()).await;
    let client = hyper_client(server.addr).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut client = client.clone();
        let body = Full::new(Bytes::from(vec![b'h'; 100_000]))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync();
        let request = Request::post(format!("http://{}/slow", server.addr))
            .body(body)
            .expect("request");
        held.push(tokio::spawn(async move {
            client.send_request(request).await.map(|r| r.status())
        }));
    }
    // Their windows (64 KiB each) fill.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut client = client.clone();
    let sent = vec![b'e'; 1024 * 1024];
    let body = Full::new(Bytes::from(sent.clone()))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let request = Request::post(format!("http://{}/echo", server.addr))
        .body(body)
        .expect("request");
    let echoed = tokio::time::timeout(PATIENCE, async {
        let response = client.send_request(request).await.expect("response");
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
    })
    .await
    .expect("the echo goes on beside the held uploads");
    assert!(echoed == sent);
    server.seen.release.open();
    for held in held {
        let status = tokio::time::timeout(PATIENCE, held)
            .await
            .expect("in time")
            .expect("task");
        assert_eq!(status.expect("answered"), StatusCode::OK);
    }
}

#[tokio::test]
async fn trailers_go_both_ways() {
    let server = server(limits()).await;
    let mut client = hyper_client(server.addr).await;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", "abc123".parse().expect("value"));
    let frames = vec![
        Ok::<_, RecvErrorText>(BodyFrame::data(Bytes::from_static(b"twelve bytes"))),
        Ok(BodyFrame::trailers(trailers)),
    ];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync();
    let request = Request::post(format!("http://{}/trailers", server.addr))
        .body(body)
        .expect("request");
    let response = tokio::time::timeout(PATIENCE, client.send_request(request))
        .await
        .expect("in time")
        .expect("response");
    let collected = response.into_body().collect().await.expect("body");
    let back = collected.trailers().cloned().expect("trailers");
    assert_eq!(
        back.get("x-checksum").map(|v| v.as_bytes()),
        Some(&b"abc123"[..])
    );
    assert_eq!(collected.to_bytes(), "12");
}

/// A stream the client resets drops its exchange at once; the connection
/// serves the next.
#[tokio::test]
async fn a_reset_stream_drops_its_exchange_and_the_connection_goes_on() {
    let server = server(limits()).await;
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let (h2, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(connection);
    let mut h2 = h2.ready().await.expect("ready");
    let slow = Request::get(format!("http://{}/slow", server.addr))
        .body(())
        .expect("request");
    let (_response, mut stream) = h2.send_request(slow, false).expect("send");
    // The exchange is under way once its drop would count.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.seen.dropped.load(Ordering::SeqCst), 0);
    stream.send_reset(h2::Reason::CANCEL);
    let dropped = async {
        while server.seen.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, dropped)
        .await
        .expect("the exchange dropped");
    let mut h2 = h2.ready().await.expect("ready");
    let hello = Request::get(format!("http://{}/hello", server.addr))
        .body(())
        .expect("request");
    let (response, _) = h2.send_request(hello, true).expect("send");
    let response = tokio::time::timeout(PATIENCE, response)
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
}

/// GOAWAY, then the stream under way is answered, a stream opened after
/// the client saw it (it answered the PING that follows) is refused by
/// the server, and the connection ends well. A raw client: hyper's would
/// refuse the late stream itself.
#[tokio::test]
async fn a_graceful_close_answers_what_is_under_way() {
    let mut server = server(limits()).await;
    let mut raw = Raw::open(server.addr).await;
    raw.request(1, &slow()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown.open();
    let mut last_named = Vec::new();
    while last_named.len() < 2 {
        match raw.next_in_time().await {
            Some(Inbound::Frame(Frame::GoAway {
                last_stream,
                reason,
            })) => {
                assert_eq!(reason, Reason::NO_ERROR);
                last_named.push(last_stream);
            }
            other => panic!("expected GOAWAY, got {other:?}"),
        }
    }
    // The highest stream id, 2^31 - 1, names no stream in particular.
    assert_eq!(
        last_named,
        [(1 << 31) - 1, 1],
        "first no stream, then the last served"
    );
    raw.request(3, &GET_HELLO).await;
    raw.expect_reset(
        3,
        Reason::REFUSED_STREAM,
        "a stream after GOAWAY is refused",
    )
    .await;
    server.seen.release.open();
    let answered = raw.next_in_time().await;
    assert!(
        matches!(&answered, Some(Inbound::Block(block)) if block.stream == 1),
        "the stream under way is answered: {answered:?}"
    );
    let outcome = tokio::time::timeout(PATIENCE, server.outcomes.recv())
        .await
        .expect("ended");
    assert!(matches!(outcome, Some(Ok(()))), "{outcome:?}");
    assert_eq!(server.seen.dropped.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn curl_is_answered() {
    let server = server(limits()).await;
    let output = tokio::process::Command::new("curl")
        .args(["-s", "-i", "--max-time", "10", "--http2-prior-knowledge"])
        .arg(format!("http://{}/hello", server.addr))
        .kill_on_drop(true)
        .output()
        .await
        .expect("curl runs");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert!(out.contains("x-served: yes"), "{out}");
    assert!(out.ends_with("hello"), "{out}");
}

/// HEADERS with END_HEADERS and END_STREAM on `stream`, its block literal
/// fields without indexing, names as given.
fn request_frame(out: &mut Vec<u8>, stream: u32, fields: &[(&[u8], &[u8])]) {
    head_frame(out, stream, fields, true);
}

/// The same, with END_STREAM only if `end_stream`: a body may follow.
fn head_frame(out: &mut Vec<u8>, stream: u32, fields: &[(&[u8], &[u8])], end_stream: bool) {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name);
        block.push(value.len() as u8);
        block.extend_from_slice(value);
    }
    frame::write::headers(out, stream, &block, end_stream, 16_384);
}

/// Counts the wake-ups of the task it stands for.
#[derive(Default)]
struct WakeCount(AtomicUsize);

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A batch of new streams whose exchanges all wait leaves the connection
/// asleep until one of them is woken: it does not wake itself to be
/// polled again for nothing (as `FuturesUnordered` does once one call has
/// polled every future it holds, which spread the streams of a busy
/// connection over more and smaller polls).
#[tokio::test]
async fn streams_that_all_wait_do_not_wake_their_connection() {
    let seen = Arc::new(Seen::default());
    let (server_io, mut client_io) = tokio::io::duplex(64 * 1024);
    let mut hello = frame::PREFACE.to_vec();
    frame::write::settings(&mut hello, &[]);
    for stream in [1, 3, 5] {
        request_frame(&mut hello, stream, &slow());
    }
    client_io.write_all(&hello).await.expect("write");
    let mut conn = Connection::new(server_io, &[], limits(), exchange(Arc::clone(&seen)));
    let wakes = Arc::new(WakeCount::default());
    let waker = Waker::from(Arc::clone(&wakes));
    let polled = Pin::new(&mut conn).poll(&mut Context::from_waker(&waker));
    assert!(polled.is_pending(), "{polled:?}");
    assert_eq!(conn.open_streams(), 3);
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        0,
        "woken with nothing to do"
    );
    seen.release.open();
    assert!(wakes.0.load(Ordering::SeqCst) > 0, "woken for its answers");
}

/// Once the last GOAWAY named a stream, a GOAWAY that follows (a
/// connection error) names it again, not a stream refused since: the id
/// never goes up (RFC 9113 §6.8), and a client would take the refused one
/// for maybe served.
#[tokio::test]
async fn a_connection_error_after_the_last_goaway_names_the_same_last_stream() {
    let server = server(limits()).await;
    let mut raw = Raw::open(server.addr).await;
    raw.request(1, &slow()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown.open();
    let mut goaways = 0;
    while goaways < 2 {
        let next = raw.next_in_time().await;
        assert!(
            matches!(next, Some(Inbound::Frame(Frame::GoAway { .. }))),
            "{next:?}"
        );
        goaways += 1;
    }
    raw.request(3, &GET_HELLO).await;
    raw.expect_reset(3, Reason::REFUSED_STREAM, "a stream after GOAWAY")
        .await;
    raw.connection_fault_names_last(1).await;
}

/// `GET /slow`: its answer waits for `seen.release`.
fn slow() -> Vec<(&'static [u8], &'static [u8])> {
    let mut slow = GET_HELLO.to_vec();
    slow[3] = (b":path", b"/slow");
    slow
}

/// A second header block on a stream whose request already ended (the
/// client half-closed it) resets it with STREAM_CLOSED (RFC 9113 §5.1).
#[tokio::test]
async fn a_header_block_after_the_request_ended_is_stream_closed() {
    let server = server(limits()).await;
    let mut raw = Raw::open(server.addr).await;
    raw.request(1, &slow()).await;
    raw.request(1, &GET_HELLO).await;
    raw.expect_reset(1, Reason::STREAM_CLOSED, "a block after the end")
        .await;
}

/// Frames on a stream the client closed itself, by its RST_STREAM or by
/// its END_STREAM once the response ended too, are no race but its fault:
/// GOAWAY `STREAM_CLOSED` (RFC 9113 §5.1; h2spec's 5.1/8, 9, 11 and 12);
/// a request on an id below one it opened, `PROTOCOL_ERROR` (§5.1.1,
/// h2spec's 5.1.1/2). All were ignored, and a client could have baton
/// decode header blocks for no stream as long as it went on.
#[tokio::test]
async fn frames_on_a_stream_the_client_closed_end_the_connection() {
    let server = server(limits()).await;
    let post = [(&b":method"[..], &b"POST"[..]), GET_HELLO[1], GET_HELLO[2]];
    let (mut data, mut headers) = (Vec::new(), Vec::new());
    frame::write::data_head(&mut data, 1, 1, true);
    data.push(b'x');
    request_frame(&mut headers, 1, &GET_HELLO);
    for (what, after) in [("DATA", &data), ("HEADERS", &headers)] {
        let mut raw = Raw::open(server.addr).await;
        let mut opened = Vec::new();
        head_frame(&mut opened, 1, &post, false);
        frame::write::reset(&mut opened, 1, Reason::CANCEL);
        raw.send(&[opened, after.clone()].concat()).await;
        let why = format!("{what} after the client's RST_STREAM");
        raw.expect_goaway(Reason::STREAM_CLOSED, &why).await;

        let mut raw = Raw::open(server.addr).await;
        raw.request(1, &GET_HELLO).await;
        raw.answered(1).await;
        raw.send(after).await;
        let why = format!("{what} after both ends");
        raw.expect_goaway(Reason::STREAM_CLOSED, &why).await;
    }
    let mut raw = Raw::open(server.addr).await;
    raw.request(5, &GET_HELLO).await;
    raw.request(3, &GET_HELLO).await;
    raw.expect_goaway(Reason::PROTOCOL_ERROR, "an id skipped")
        .await;
}

/// What a client sent on a stream before it saw baton close it crosses
/// the close, however baton closed it (refused past `max_streams`,
/// answered before the upload ended, its response body broken): DATA,
/// then trailers that end the stream, are let through and the connection
/// serves on (RFC 9113 §5.1: "MUST ignore"); once the client ended the
/// stream, more DATA on it is its fault, as is a new request on the id.
/// A broken body's stream is reset once (it was reset again, NO_ERROR,
/// with the streams that ended).
#[tokio::test]
async fn frames_crossing_batons_close_are_let_through_until_the_clients_end() {
    let post = |path: &'static [u8]| {
        [
            (&b":method"[..], &b"POST"[..]),
            GET_HELLO[1],
            GET_HELLO[2],
            (b":path", path),
        ]
    };
    let refusing = server(Limits {
        max_streams: 1,
        ..limits()
    })
    .await;
    let mut raw = Raw::open(refusing.addr).await;
    raw.request(1, &slow()).await;
    raw.send(&opening(3, &post(b"/hello"))).await;
    assert_eq!(raw.until_reset(3).await, Reason::REFUSED_STREAM);
    raw.crossing_is_let_through(3).await;
    raw.send(&opening(5, &post(b"/hello"))).await;
    assert_eq!(raw.until_reset(5).await, Reason::REFUSED_STREAM);
    raw.send(&opening(5, &post(b"/hello"))).await;
    raw.expect_goaway(Reason::PROTOCOL_ERROR, "a new request on the id")
        .await;

    let server = server(limits()).await;
    for (path, reason) in [
        (&b"/hello"[..], Reason::NO_ERROR),
        (b"/broken", Reason::INTERNAL_ERROR),
    ] {
        let mut raw = Raw::open(server.addr).await;
        raw.send(&opening(1, &post(path))).await;
        assert_eq!(raw.until_reset(1).await, reason, "{reason:?}");
        raw.crossing_is_let_through(1).await;
        let mut late = Vec::new();
        frame::write::data_head(&mut late, 1, 1, true);
        late.push(b'x');
        raw.send(&late).await;
        raw.expect_goaway(Reason::STREAM_CLOSED, "DATA after the trailers")
            .await;
    }
}

/// HEADERS without END_STREAM: a request whose body follows.
fn opening(stream: u32, fields: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    head_frame(&mut out, stream, fields, false);
    out
}

/// A raw client: the preface, an empty SETTINGS, then what the test writes.
struct Raw {
    socket: TcpStream,
    read: BytesMut,
    reader: Reader,
}

impl Raw {
    async fn open(addr: std::net::SocketAddr) -> Raw {
        Raw::open_with(addr, &[]).await
    }

    /// With `settings`; a stream window among them is granted to the
    /// connection too.
    async fn open_with(addr: std::net::SocketAddr, settings: &[(u16, u32)]) -> Raw {
        let mut socket = TcpStream::connect(addr).await.expect("connect");
        let mut hello = frame::PREFACE.to_vec();
        frame::write::settings(&mut hello, settings);
        if let Some((_, window)) = settings.iter().find(|(id, _)| *id == 4) {
            frame::write::window_update(&mut hello, 0, window - 65_535);
        }
        socket.write_all(&hello).await.expect("write");
        Raw {
            socket,
            read: BytesMut::new(),
            reader: Reader::new(1 << 20, 1 << 20),
        }
    }

    /// A request without a body on `stream` (`request_frame`).
    async fn request(&mut self, stream: u32, fields: &[(&[u8], &[u8])]) {
        let mut out = Vec::new();
        request_frame(&mut out, stream, fields);
        self.socket.write_all(&out).await.expect("write");
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.socket.write_all(bytes).await.expect("write");
    }

    /// Reads until the response on `stream` ended.
    async fn answered(&mut self, stream: u32) {
        loop {
            match self.next_in_time().await {
                Some(Inbound::Block(head)) if head.stream == stream && head.end_stream => return,
                Some(Inbound::Frame(Frame::Data {
                    stream: on,
                    end_stream: true,
                    ..
                })) if on == stream => return,
                Some(_) => {}
                None => panic!("closed before stream {stream} was answered"),
            }
        }
    }

    /// Frames until one resets `stream`: its reason.
    async fn until_reset(&mut self, stream: u32) -> Reason {
        loop {
            match self.next_in_time().await {
                Some(Inbound::Frame(Frame::Reset { stream: on, reason })) if on == stream => {
                    return reason
                }
                Some(_) => {}
                None => panic!("closed before stream {stream} was reset"),
            }
        }
    }

    /// Sends DATA on `stream`, closed by the server, then trailers that
    /// end it, then a PING: the PING's answer is the next frame (no
    /// GOAWAY, no second reset).
    async fn crossing_is_let_through(&mut self, stream: u32) {
        let mut crossing = Vec::new();
        frame::write::data_head(&mut crossing, stream, 1, false);
        crossing.push(b'x');
        head_frame(&mut crossing, stream, &[(b"x-trailer", b"1")], true);
        frame::write::ping(&mut crossing, *b"crossed!", false);
        self.send(&crossing).await;
        let want = Frame::Ping {
            ack: true,
            payload: *b"crossed!",
        };
        assert_eq!(self.next_in_time().await, Some(Inbound::Frame(want)));
    }

    /// Frames until GOAWAY, which gives `reason`.
    async fn expect_goaway(&mut self, reason: Reason, what: &str) {
        loop {
            match self.next_in_time().await {
                Some(Inbound::Frame(Frame::GoAway { reason: got, .. })) => {
                    assert_eq!(got, reason, "{what}");
                    return;
                }
                Some(_) => {}
                None => panic!("closed without GOAWAY: {what}"),
            }
        }
    }

    /// `next`, PINGs answered, within the test's patience.
    async fn next_in_time(&mut self) -> Option<Inbound> {
        tokio::time::timeout(PATIENCE, self.next(true))
            .await
            .expect("in time")
    }

    /// The next frame resets `stream` for `reason`.
    async fn expect_reset(&mut self, stream: u32, reason: Reason, what: &str) {
        let next = self.next_in_time().await;
        assert_eq!(
            next,
            Some(Inbound::Frame(Frame::Reset { stream, reason })),
            "{what}"
        );
    }

    /// Sends a fault of the connection's (PRIORITY making stream 9, never
    /// opened, depend on itself): GOAWAY, PROTOCOL_ERROR, naming `last`.
    async fn connection_fault_names_last(&mut self, last: u32) {
        let priority = [0, 0, 5, 0x2, 0, 0, 0, 0, 9, 0, 0, 0, 9, 16];
        self.socket.write_all(&priority).await.expect("write");
        let goaway = self.next_in_time().await;
        let want = Frame::GoAway {
            last_stream: last,
            reason: Reason::PROTOCOL_ERROR,
        };
        assert_eq!(goaway, Some(Inbound::Frame(want)));
    }

    /// The next frame from the server that is not SETTINGS, WINDOW_UPDATE
    /// or a PING (answered when `answer_pings`); `None` once it closed.
    async fn next(&mut self, answer_pings: bool) -> Option<Inbound> {
        loop {
            match self.reader.next(&mut self.read).expect("valid frames") {
                Some(Inbound::Frame(
                    Frame::Settings(_) | Frame::SettingsAck | Frame::WindowUpdate { .. },
                )) => {}
                Some(Inbound::Frame(Frame::Ping {
                    ack: false,
                    payload,
                })) => {
                    if answer_pings {
                        let mut out = Vec::new();
                        frame::write::ping(&mut out, payload, true);
                        self.socket.write_all(&out).await.expect("write");
                    }
                }
                Some(other) => return Some(other),
                None => match self.socket.read_buf(&mut self.read).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                },
            }
        }
    }
}

/// A download whose body is always ready, on windows that never close
/// (2 GiB), does not keep another stream's response from going out: the
/// streams take turns. Taking turns one after another, the second would
/// wait for the first's window to run out.
#[tokio::test]
async fn a_fast_download_leaves_room_for_the_others() {
    let server = server(limits()).await;
    let mut raw = Raw::open_with(server.addr, &[(4, frame::MAX_WINDOW)]).await;
    let mut big = GET_HELLO.to_vec();
    big[3] = (b":path", b"/big");
    raw.request(1, &big).await;
    let mut downloaded = 0;
    let mut asked = false;
    while downloaded < 64 * 1024 * 1024 {
        let next = raw.next_in_time().await;
        match next {
            Some(Inbound::Frame(Frame::Data {
                stream: 1, data, ..
            })) => {
                downloaded += data.len();
                if !asked && downloaded > 1024 * 1024 {
                    raw.request(3, &GET_HELLO).await;
                    asked = true;
                }
            }
            Some(Inbound::Frame(Frame::Data {
                stream: 3,
                data,
                end_stream: true,
                ..
            })) => {
                assert_eq!(data, "hello");
                return;
            }
            Some(Inbound::Block(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    panic!("64 MiB of the download went out before a 5-byte answer");
}

const GET_HELLO: [(&[u8], &[u8]); 4] = [
    (b":method", b"GET"),
    (b":scheme", b"http"),
    (b":authority", b"example.test"),
    (b":path", b"/hello"),
];

/// A malformed head resets its stream alone; a head past the list's
/// bound reaches the exchange marked so (which answers 431: the proxy's,
/// counted and logged); streams past the bound are refused.
#[tokio::test]
async fn malformed_and_excess_streams_are_refused_one_by_one() {
    let server = server(Limits {
        max_streams: 1,
        ..limits()
    })
    .await;
    let mut raw = Raw::open(server.addr).await;
    let mut upper = GET_HELLO.to_vec();
    upper.push((b"X-Upper", b"v"));
    raw.request(1, &upper).await;
    raw.expect_reset(1, Reason::PROTOCOL_ERROR, "an upper-case field name")
        .await;
    // 150 fields of 138 bytes each as h2 counts them: past 16 KiB.
    let long = vec![b'v'; 100];
    let mut large = GET_HELLO.to_vec();
    for _ in 0..150 {
        large.push((b"x-long", &long));
    }
    raw.request(3, &large).await;
    let Some(Inbound::Block(block)) = raw.next_in_time().await else {
        panic!("a response head");
    };
    assert_eq!(block.stream, 3);
    assert_eq!(&block.block[..5], b"\x08\x03431", ":status 431, a literal");
    assert_eq!(server.seen.too_large.load(Ordering::SeqCst), 1, "marked");
    // `/slow` holds the only stream the bound allows; the next is refused.
    raw.request(5, &slow()).await;
    raw.request(7, &GET_HELLO).await;
    raw.expect_reset(7, Reason::REFUSED_STREAM, "a stream past the bound")
        .await;
}

/// A frame's fault on a stream it has opened resets that stream alone; on
/// a stream it never opened (no RST_STREAM may name one) it ends the
/// connection with GOAWAY.
#[tokio::test]
async fn a_faulty_frame_resets_its_stream_or_ends_the_connection() {
    let server = server(limits()).await;
    let mut raw = Raw::open(server.addr).await;
    raw.request(1, &slow()).await;
    // WINDOW_UPDATE of 0 on stream 1, open: a stream error.
    let zero = [0, 0, 4, 0x8, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    raw.socket.write_all(&zero).await.expect("write");
    let reset = raw.next_in_time().await;
    let want = Frame::Reset {
        stream: 1,
        reason: Reason::PROTOCOL_ERROR,
    };
    assert_eq!(reset, Some(Inbound::Frame(want)));
    raw.connection_fault_names_last(1).await;
}

/// A client that answers no PING is cut once `ping_timeout` passes, even
/// with a stream open.
#[tokio::test]
async fn a_client_that_answers_no_ping_is_cut() {
    let mut server = server(Limits {
        ping_interval: Duration::from_millis(200),
        ping_timeout: Duration::from_millis(200),
        ..limits()
    })
    .await;
    let mut raw = Raw::open(server.addr).await;
    raw.request(1, &slow()).await;
    let outcome = tokio::time::timeout(PATIENCE, server.outcomes.recv())
        .await
        .expect("ended");
    assert!(
        matches!(outcome, Some(Err(ConnError::PingTimeout))),
        "{outcome:?}"
    );
    assert_eq!(
        server.seen.dropped.load(Ordering::SeqCst),
        1,
        "the stream's exchange dropped"
    );
    let mut answering = Raw::open(server.addr).await;
    answering.request(1, &GET_HELLO).await;
    let head = tokio::time::timeout(PATIENCE, answering.next(true))
        .await
        .expect("in time");
    assert!(matches!(head, Some(Inbound::Block(_))), "{head:?}");
}

/// `GET /hello` on stream 1, then on stream 3, each once the last was
/// answered: their response heads' field blocks as written.
async fn heads_of_1_and_3(raw: &mut Raw) -> Vec<(u32, Bytes)> {
    let mut heads = Vec::new();
    for stream in [1, 3] {
        raw.request(stream, &GET_HELLO).await;
        loop {
            match raw.next_in_time().await {
                Some(Inbound::Block(head)) if head.stream == stream => {
                    heads.push((stream, head.block));
                    break;
                }
                Some(_) => {}
                None => return heads,
            }
        }
    }
    heads
}

/// A client that lowers SETTINGS_HEADER_TABLE_SIZE below the 4,096 a table
/// starts with is told the table's new size at the start of the next field
/// block, once (RFC 7541 §4.2): nghttp2's clients (`h2load
/// --header-table-size 0`) end the connection with COMPRESSION_ERROR on a
/// block without it. A client that keeps the default hears none.
#[tokio::test]
async fn a_lowered_header_table_size_is_answered_with_a_size_update() {
    let server = server(limits()).await;
    let is_update = |block: &[u8]| block.first().is_some_and(|b| b & 0xE0 == 0x20);
    let mut lowered = Raw::open_with(server.addr, &[(1, 0)]).await;
    let heads = heads_of_1_and_3(&mut lowered).await;
    assert_eq!(heads.len(), 2, "both answered");
    assert_eq!(heads[0].1.first(), Some(&0x20), "a size update to 0 first");
    assert_eq!(heads[0].1.get(1), Some(&0x88), ":status 200 after it");
    assert!(!is_update(&heads[1].1), "once: {:?}", heads[1].1);
    for (stream, block) in &heads {
        let mut fields = Vec::new();
        let listed = Decoder::new(0).decode(block, 1 << 20, &mut fields);
        assert_eq!(listed, Ok(Listed::Whole), "stream {stream}'s head decodes");
    }

    let mut default = Raw::open(server.addr).await;
    let heads = heads_of_1_and_3(&mut default).await;
    assert_eq!(heads.len(), 2, "both answered");
    assert!(heads.iter().all(|(_, b)| !is_update(b)), "{heads:?}");
}

/// A client that reads nothing while its streams' responses come with
/// large heads: baton holds the send buffer's bound and one head beyond
/// what the socket took, the other exchanges waiting with their responses
/// (HAProxy holds a buffer a stream); once the client reads, every one is
/// answered. Before, each stream's head went into the buffer as its
/// response came: 100 streams of 64 KiB heads held 6.4 MiB a connection.
#[tokio::test]
async fn a_client_that_reads_nothing_holds_back_response_heads() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let seen = Arc::new(Seen::default());
    let serving = Arc::clone(&seen);
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.expect("accept");
        // A fixed send buffer (no autotuning): what the kernel takes of
        // the heads is small and known.
        socket2::SockRef::from(&socket)
            .set_send_buffer_size(16 * 1024)
            .expect("SO_SNDBUF");
        let _ = Connection::new(socket, &[], limits(), exchange(serving)).await;
    });
    let client = tokio::net::TcpSocket::new_v4().expect("socket");
    client.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut raw = Raw {
        socket: client.connect(addr).await.expect("connect"),
        read: BytesMut::new(),
        reader: Reader::new(1 << 20, 1 << 20),
    };
    // All in one write, so read in one pass: every stream opened before
    // any response came.
    let mut hello = frame::PREFACE.to_vec();
    frame::write::settings(&mut hello, &[]);
    let mut big = GET_HELLO.to_vec();
    big[3] = (b":path", b"/bighead");
    for stream in (1..200).step_by(2) {
        request_frame(&mut hello, stream, &big);
    }
    raw.socket.write_all(&hello).await.expect("write");
    // Its requests all read (each one's exchange made as its HEADERS
    // were): the pass that read them polled what the send buffer had room
    // for, where a server without that bound polled every one.
    tokio::time::timeout(PATIENCE, async {
        while seen.bighead_requests.load(Ordering::SeqCst) < 100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every request read");
    // The heads that fit went out meanwhile; the rest wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answered_unread = seen.big_heads.load(Ordering::SeqCst);
    let mut heads = 0;
    while heads < 100 {
        match raw.next_in_time().await {
            Some(Inbound::Block(_)) => heads += 1,
            Some(_) => {}
            None => break,
        }
    }
    assert!(
        answered_unread < 20,
        "{answered_unread} of 100 responses taken while the client read nothing"
    );
    assert_eq!(heads, 100, "every stream answered once the client reads");
}
