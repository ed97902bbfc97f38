//! h2c clients under the same limits as HTTP/1 ones: the preface and the
//! first SETTINGS frame fall under `header_timeout`, a connection with no
//! stream open is closed at `idle_timeout` with GOAWAY, and the number of
//! streams a client may open at once is bounded (`h2_max_concurrent_streams`),
//! a `Host` field (what routes a request without `:authority`) must be a
//! plain authority, and a request's fields are bounded as an HTTP/1 head's
//! are (64 KiB, 128 fields), as on HTTP/1, and a client that resets most
//! of its streams before their responses (the "rapid reset" attack) is
//! cut.

mod support;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::backend::HttpBackend;
use support::daemon::{Baton, Spec};
use support::h2_raw::frames_of;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
const GOAWAY: u8 = 7;

async fn baton_with(listener_keys: &str) -> (HttpBackend, Baton) {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", listener_keys)
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    (backend, baton)
}

/// A connection to `web` with h2's preface and SETTINGS sent.
async fn opened(baton: &Baton) -> TcpStream {
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(&[PREFACE, SETTINGS].concat())
        .await
        .expect("write");
    s
}

/// An h2 connection's verdicts that log nothing (idle for
/// `idle_timeout`: a GOAWAY) take no place in the budget for lines about
/// clients' faults: they took one each, so forty idle connections were
/// said to have held back thirty lines that never were, and real lines in
/// their second (a refused head) were held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_h2_connections_take_no_place_in_the_log_budget_for_faults() {
    let (_backend, baton) = baton_with("idle_timeout = \"1s\"").await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(opened(&baton).await);
    }
    for s in &mut idle {
        assert!(
            until_closed(s, support::TIMEOUT).await.is_some(),
            "closed once idle"
        );
    }
    // What a second held back is said once that second is over, at the
    // next of the reports a second apart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = baton.log();
    assert!(!log.contains("held back"), "{log}");
}

/// A request's header block past its bounds ends the connection with
/// GOAWAY `ENHANCE_YOUR_CALM` (README): more than 32 CONTINUATION frames
/// (the "CONTINUATION flood" kind of attack), or more than 128 KiB in
/// all, however it is split; unbounded, one client could make baton hold
/// and decode a block of any size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_block_past_its_bounds_ends_the_connection() {
    use support::h2_raw::{continuation, headers_begun};
    const ENHANCE_YOUR_CALM: [u8; 4] = [0, 0, 0, 11];
    let (_backend, baton) = baton_with("").await;
    let many = [headers_begun(1, b"a")]
        .into_iter()
        .chain((0..40).map(|_| continuation(1, b"a")))
        .collect::<Vec<_>>()
        .concat();
    let large = [headers_begun(1, &[b'a'; 16_384])]
        .into_iter()
        .chain((0..8).map(|_| continuation(1, &[b'a'; 16_384])))
        .collect::<Vec<_>>()
        .concat();
    for (what, block) in [("41 frames", many), ("144 KiB", large)] {
        let mut s = opened(&baton).await;
        // Cut off before it is all written, maybe.
        let _ = s.write_all(&block).await;
        let goaway = last_goaway(&mut s, what).await;
        assert_eq!(goaway[4..8], ENHANCE_YOUR_CALM, "{what}");
    }
}

/// A header block left unfinished ends the connection at
/// `header_timeout` (GOAWAY `ENHANCE_YOUR_CALM`), another stream open or
/// not: with one open, no idle clock ran, and a client that sent a
/// CONTINUATION every half minute held up to 128 KiB of block a
/// connection for a quarter of an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_block_left_unfinished_ends_at_header_timeout() {
    use support::h2_raw::headers_begun;
    const ENHANCE_YOUR_CALM: [u8; 4] = [0, 0, 0, 11];
    let (backend, baton) = baton_with("header_timeout = \"1s\"").await;
    let mut s = opened(&baton).await;
    gated_on_stream_1(&mut s, &backend).await;
    s.write_all(&headers_begun(3, b"a")).await.expect("HEADERS");
    let goaway = last_goaway(&mut s, "an unfinished block").await;
    assert_eq!(goaway[4..8], ENHANCE_YOUR_CALM);
    backend.release();
}

/// A header block on a stream the client closed, or on an id below one it
/// opened, ends the connection (GOAWAY `PROTOCOL_ERROR` for the id it
/// skipped, RFC 9113 §5.1.1): ignored, such blocks let a client make
/// baton decode blocks of 128 KiB for no stream, as long as it went on.
/// (Opening stream 5 closes 1 and 3, never used; trailers that cross
/// baton's own reset of their stream are let through: `tests/h2_server.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_blocks_on_closed_streams_end_the_connection() {
    use support::h2_raw::{get_on, post_on};
    const PROTOCOL_ERROR: [u8; 4] = [0, 0, 0, 1];
    const STREAM_CLOSED: [u8; 4] = [0, 0, 0, 5];
    let (_backend, baton) = baton_with("").await;
    for (what, late) in [
        ("a request on a skipped id", post_on(1, "/b")),
        ("a block ending a skipped id", get_on(3, "/a")),
    ] {
        let mut s = opened(&baton).await;
        let _ = s.write_all(&[get_on(5, "/a"), late].concat()).await;
        let goaway = last_goaway(&mut s, what).await;
        assert_eq!(goaway[4..8], PROTOCOL_ERROR, "{what}");
    }
    // Streams 1 and 3 opened in turn, 1 answered, its request ended: a
    // block more on it is the client's fault.
    let mut s = opened(&baton).await;
    s.write_all(&[get_on(1, "/a"), get_on(3, "/a")].concat())
        .await
        .expect("write");
    let mut answered = Vec::new();
    for _ in 0..50 {
        if support::h2_raw::ends_stream(&answered, 1) {
            break;
        }
        answered.extend(support::h2_raw::round_trip(&mut s).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(support::h2_raw::ends_stream(&answered, 1), "{answered:?}");
    let _ = s.write_all(&get_on(1, "/a")).await;
    let goaway = last_goaway(&mut s, "a block after both ends").await;
    assert_eq!(goaway[4..8], STREAM_CLOSED);
}

/// Sends `GET /gated` on stream 1 and waits until `backend` holds it.
async fn gated_on_stream_1(s: &mut TcpStream, backend: &HttpBackend) {
    s.write_all(&support::h2_raw::get("/gated"))
        .await
        .expect("GET");
    support::eventually("the backend holds stream 1", || async {
        backend.held() == 1
    })
    .await;
}

/// The payload of the GOAWAY baton sends before it closes `s`.
async fn last_goaway(s: &mut TcpStream, what: &str) -> Vec<u8> {
    let sent = until_closed(s, support::TIMEOUT)
        .await
        .unwrap_or_else(|| panic!("{what}: still open"));
    frames(&sent)
        .into_iter()
        .find(|(kind, _)| *kind == GOAWAY)
        .map(|(_, payload)| payload)
        .unwrap_or_else(|| panic!("{what}: no GOAWAY in {sent:?}"))
}

/// Everything baton sends until it closes, or `None` if it is still open
/// after `within`.
async fn until_closed(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(all),
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
        }
    }
}

/// The h2 frames in `bytes`: (type, payload).
fn frames(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    frames_of(bytes)
        .into_iter()
        .map(|(kind, _, payload)| (kind, payload))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preface_that_stops_short_is_closed_at_header_timeout() {
    let (_backend, baton) = baton_with("header_timeout = \"1s\"").await;
    for opening in [&PREFACE[..12], PREFACE] {
        let mut s = TcpStream::connect(baton.addr("web"))
            .await
            .expect("connect");
        s.write_all(opening).await.expect("write");
        let sent = until_closed(&mut s, Duration::from_secs(5)).await;
        let Some(sent) = sent else {
            panic!("{} bytes of opening held a connection", opening.len());
        };
        // An HTTP/1 408 would be a broken frame to an h2 client.
        assert!(!sent.starts_with(b"HTTP/"), "{sent:?}");
    }
}

/// The preface and the SETTINGS after it share one `header_timeout`,
/// counted from the connection's start: a preface that came late does not
/// win the SETTINGS a timeout of their own (3 s + 2.5 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_preface_leaves_settings_only_the_rest_of_header_timeout() {
    let (_backend, baton) = baton_with("header_timeout = \"3s\"").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let started = tokio::time::Instant::now();
    s.write_all(&PREFACE[..12]).await.expect("write");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    s.write_all(&PREFACE[12..]).await.expect("write");
    let left = Duration::from_millis(4500).saturating_sub(started.elapsed());
    assert!(
        until_closed(&mut s, left).await.is_some(),
        "closed at header_timeout from the start, not 3 s after the preface"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_connection_without_a_stream_gets_goaway_at_idle_timeout() {
    let (_backend, baton) = baton_with("idle_timeout = \"1s\"").await;
    let mut s = opened(&baton).await;
    let sent = until_closed(&mut s, Duration::from_secs(5))
        .await
        .expect("closed at idle_timeout");
    assert!(
        frames(&sent).iter().any(|(kind, _)| *kind == GOAWAY),
        "a GOAWAY before the close: {sent:?}"
    );
}

/// The GOAWAY goes out before the close, however long the connection was
/// quiet before its idle GOAWAY (here 3 s, three times the grace an idle
/// client has to close after it): the close waits for a grace after the
/// GOAWAY, not after the last byte before it. It used to be put out and
/// the connection closed in the same turn, most times before the GOAWAY
/// was written, so a client that sent a request then met a bare close
/// (most times, not always: four clients, so that one meets it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_quiet_for_long_gets_its_idle_goaway_before_the_close() {
    let (_backend, baton) = baton_with("idle_timeout = \"3s\"").await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(opened(&baton).await);
    }
    let closes = clients
        .iter_mut()
        .map(|s| until_closed(s, Duration::from_secs(8)));
    for sent in futures_util::future::join_all(closes).await {
        let sent = sent.expect("closed after idle_timeout");
        assert!(
            frames(&sent).iter().any(|(kind, _)| *kind == GOAWAY),
            "a GOAWAY before the close: {sent:?}"
        );
    }
}

/// The idle clock starts again when the last stream ends: a connection
/// that served a request is closed `idle_timeout` later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_connection_whose_last_stream_ended_gets_goaway_at_idle_timeout() {
    let (_backend, baton) = baton_with("idle_timeout = \"1s\"").await;
    let web = baton.addr("web");
    let stream = TcpStream::connect(web).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let request = hyper::Request::get(format!("http://{web}/slow/300"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let answer = sender.send_request(request).await.expect("answer");
    assert_eq!(answer.status(), 200);
    drop(answer);
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "closed after idle_timeout without a stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_a_client_may_open_are_bounded() {
    for (keys, expected) in [("", 100u32), ("h2_max_concurrent_streams = 7", 7)] {
        let (_backend, baton) = baton_with(keys).await;
        let mut s = opened(&baton).await;
        let mut first = [0u8; 9];
        s.read_exact(&mut first)
            .await
            .expect("server SETTINGS header");
        assert_eq!(first[3], 4, "the server opens with SETTINGS");
        let len = u32::from_be_bytes([0, first[0], first[1], first[2]]) as usize;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.expect("server SETTINGS");
        let max_streams = payload
            .chunks(6)
            .find(|p| p.len() == 6 && u16::from_be_bytes([p[0], p[1]]) == 3)
            .map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
        assert_eq!(max_streams, Some(expected), "{keys:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_pings_is_cut_even_with_a_stream_open() {
    const PING: u8 = 6;
    let (_backend, baton) = baton_with("idle_timeout = \"1s\"").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let opening = [PREFACE, SETTINGS, &support::h2_raw::get("/slow/8000")].concat();
    s.write_all(&opening).await.expect("write");
    // The stream stays open for 8 s; the dead peer is found long before.
    let sent = until_closed(&mut s, Duration::from_secs(5))
        .await
        .expect("closed: nobody answered the PINGs");
    assert!(
        frames(&sent).iter().any(|(kind, _)| *kind == PING),
        "PINGed first: {sent:?}"
    );
}

/// A request that crossed the GOAWAY an idle connection got (h2's first
/// GOAWAY lets streams in until the client answers its PING) is served:
/// the connection was cut a second after its GOAWAY, whatever was in
/// flight, and a request sent just then was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_crossed_the_idle_goaway_is_answered() {
    const HEADERS: u8 = 1;
    let (_backend, baton) = baton_with("idle_timeout = \"1s\"").await;
    let mut s = opened(&baton).await;
    let mut client = PingAnswerer::default();
    while !client.seen(GOAWAY) {
        assert!(client.read(&mut s).await, "closed before a GOAWAY");
    }
    // Sent as if before the GOAWAY came: the PING after it is answered
    // after the request.
    s.write_all(&support::h2_raw::get("/slow/1500"))
        .await
        .expect("write");
    client.past_goaway = true;
    client.answer(&mut s).await;
    while client.read(&mut s).await {}
    assert!(client.seen(HEADERS), "the request was answered");
}

/// A client that answers keep-alive PINGs but not the one its drain's
/// GOAWAY sends, and goes on opening streams after it (RFC 9113 §6.8: it
/// must not), does not hold the drain to its deadline: its streams opened
/// past a second after GOAWAY are refused (REFUSED_STREAM), and the
/// connection closes once those served are done. The stop exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_opening_streams_after_goaway_does_not_hold_the_drain() {
    const HEADERS: u8 = 1;
    const RST_STREAM: u8 = 3;
    const REFUSED_STREAM: u32 = 7;
    let backend = HttpBackend::start("a").await;
    let spec = Spec::default()
        .section("[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"20s\"\n")
        .http("web", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let mut s = opened(&baton).await;
    let mut client = PingAnswerer::default();
    s.write_all(&support::h2_raw::get("/"))
        .await
        .expect("write");
    while !client.seen(HEADERS) {
        assert!(client.read(&mut s).await, "closed before an answer");
    }
    support::daemon::signal(baton.first_pid, nix::sys::signal::Signal::SIGTERM);
    let (mut next_stream, mut last_sent) = (3, tokio::time::Instant::now());
    let closed = tokio::time::timeout(Duration::from_secs(15), async {
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return,
                Ok(Ok(n)) => {
                    client.bytes.extend_from_slice(&buf[..n]);
                    client.answer(&mut s).await;
                }
                Err(_) => {}
            }
            if client.seen(GOAWAY) && last_sent.elapsed() >= Duration::from_millis(100) {
                let _ = s
                    .write_all(&support::h2_raw::get_on(next_stream, "/"))
                    .await;
                (next_stream, last_sent) = (next_stream + 2, tokio::time::Instant::now());
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "closed well before the drain's deadline");
    let refused = frames(&client.bytes)
        .iter()
        .filter(|(kind, payload)| {
            *kind == RST_STREAM && payload[..] == REFUSED_STREAM.to_be_bytes()
        })
        .count();
    assert!(refused > 0, "streams past GOAWAY refused");
    assert_eq!(
        support::daemon::wait_exit(baton.first_pid).await,
        Some(0),
        "{}",
        baton.log()
    );
}

/// A client that reads frames as they come and answers the PINGs, as real
/// clients do (baton's keep-alive closes a connection that does not);
/// those after a GOAWAY only once `past_goaway`.
#[derive(Default)]
struct PingAnswerer {
    bytes: Vec<u8>,
    answered: usize,
    past_goaway: bool,
}

impl PingAnswerer {
    /// Reads what came, answering the PINGs in it; false once closed.
    async fn read(&mut self, s: &mut TcpStream) -> bool {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(support::TIMEOUT, s.read(&mut buf))
            .await
            .expect("a frame or a close in time")
            .unwrap_or(0);
        self.bytes.extend_from_slice(&buf[..n]);
        self.answer(s).await;
        n > 0
    }

    async fn answer(&mut self, s: &mut TcpStream) {
        const PING: u8 = 6;
        let all = frames(&self.bytes);
        let goaway = all.iter().position(|(k, _)| *k == GOAWAY);
        let answerable = match goaway {
            Some(at) if !self.past_goaway => &all[..at],
            _ => &all[..],
        };
        let pings: Vec<&Vec<u8>> = answerable
            .iter()
            .filter(|(kind, payload)| *kind == PING && payload.len() == 8)
            .map(|(_, payload)| payload)
            .collect();
        for payload in pings.iter().skip(self.answered) {
            let mut ack = vec![0, 0, 8, PING, 1, 0, 0, 0, 0];
            ack.extend_from_slice(payload);
            let _ = s.write_all(&ack).await;
        }
        self.answered = self.answered.max(pings.len());
    }

    fn seen(&self, kind: u8) -> bool {
        frames(&self.bytes).iter().any(|(k, _)| *k == kind)
    }
}

/// A HEADERS frame (stream 1, END_STREAM | END_HEADERS) for `GET /` with
/// a `host` field of `host` and no `:authority`.
fn get_with_host(host: &[u8]) -> Vec<u8> {
    // A literal field, not indexed, of a literal name.
    get_with(&[&[0x00, 4][..], b"host"].concat(), host)
}

/// The same with `:authority` of `authority` (static table index 1).
fn get_with_authority(authority: &[u8]) -> Vec<u8> {
    get_with(&[0x01], authority)
}

/// `GET /` with one more field, `name` its HPACK literal's start (its
/// name, literal or indexed) and `value` written after it.
fn get_with(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x84]; // GET, http, :path /
    block.extend_from_slice(name);
    block.push(value.len() as u8);
    block.extend_from_slice(value);
    let len = block.len() as u32;
    let mut frame = len.to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[1, 0x5, 0, 0, 0, 1]);
    frame.extend_from_slice(&block);
    frame
}

/// The status byte (see `status_byte`) of stream 1 on a connection
/// opened with `request`.
async fn status_of_opening(baton: &Baton, request: &[u8]) -> Option<u8> {
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let opening = [PREFACE, SETTINGS, request].concat();
    s.write_all(&opening).await.expect("write");
    status_byte(&mut s).await
}

/// The first byte of the header block baton answers stream 1 with: the
/// static-table index of its `:status` (0x88 200, 0x8c 400).
async fn status_byte(s: &mut TcpStream) -> Option<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + support::TIMEOUT;
    loop {
        let answer = frames(&all)
            .into_iter()
            .find(|(kind, payload)| *kind == 1 && !payload.is_empty());
        if let Some((_, payload)) = answer {
            return payload.first().copied();
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => all.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

/// A malformed h2 request (an upper-case field name) is reset before it
/// becomes a request, so no access-log line tells of it: it is said in
/// baton's log, with why, the listener and the client, as an HTTP/1
/// client's malformed head is a 400 logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_h2_request_is_said_in_the_log() {
    let (backend, baton) = baton_with("").await;
    let upper = get_with(&[&[0x00, 7][..], b"X-Upper"].concat(), b"v");
    let mut s = opened(&baton).await;
    s.write_all(&upper).await.expect("write");
    support::eventually("the refusal said", || async {
        baton
            .log()
            .contains("h2 request refused before it reached a backend")
    })
    .await;
    let log = baton.log();
    let line = log
        .lines()
        .find(|l| l.contains("h2 request refused before it reached a backend"))
        .expect("the line");
    let client = s.local_addr().expect("the client's address");
    for said in [
        "cause=\"uppercase field name\"".to_string(),
        "listener=web".to_string(),
        format!("client={client}"),
    ] {
        assert!(line.contains(&said), "{said} in {line}");
    }
    assert_eq!(backend.hits(), 0);
}

/// Without `:authority`, `Host` routes the request: one with whitespace,
/// userinfo or a path in it is refused (400) and reaches no backend, where
/// it would have missed its host route and reached the default pool, whose
/// HTTP/1 parser trims it and reads another host than baton routed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_no_plain_authority_is_refused() {
    let (backend, baton) = baton_with("").await;
    for (host, status) in [
        (&b"app"[..], 0x88),
        (b"app ", 0x8c),
        (b"a@app", 0x8c),
        (b"app/x", 0x8c),
        (b"", 0x8c),
    ] {
        let answered = status_of_opening(&baton, &get_with_host(host)).await;
        assert_eq!(answered, Some(status), "{}", String::from_utf8_lossy(host));
    }
    assert_eq!(backend.hits(), 1, "only the plain host reached it");
}

/// `:authority` is held to what `Host` is: a name or an IP literal, and
/// digits after one colon. `app:x` or userinfo (RFC 9113
/// §8.3.1 forbids it) passed the `http` crate's parse and went to the
/// HTTP/1 backend as its `Host`, for it to read its own way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_that_is_no_plain_authority_is_refused() {
    let (backend, baton) = baton_with("").await;
    for (authority, status) in [(&b"app:8080"[..], 0x88), (b"app:x", 0x8c), (b"u@app", 0x8c)] {
        let answered = status_of_opening(&baton, &get_with_authority(authority)).await;
        assert_eq!(
            answered,
            Some(status),
            "{}",
            String::from_utf8_lossy(authority)
        );
    }
    assert_eq!(backend.hits(), 1, "only the plain authority reached it");
}

/// The status of a GET with `fields` added, sent over h2c.
async fn status_with(web: std::net::SocketAddr, fields: &[(String, String)]) -> u16 {
    let mut sender = support::client::h2::<http_body_util::Empty<bytes::Bytes>>(web).await;
    let mut req = hyper::Request::get(format!("http://{web}/"))
        .body(http_body_util::Empty::new())
        .expect("request");
    for (name, value) in fields {
        req.headers_mut().append(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            value.parse().expect("value"),
        );
    }
    let answer = tokio::time::timeout(support::TIMEOUT, sender.send_request(req))
        .await
        .expect("an answer in time")
        .expect("h2 response");
    answer.status().as_u16()
}

/// A 20 KB cookie passes, as on HTTP/1 (hyper's own bound is 16 KiB);
/// 129 fields are a 431 that reaches no backend, as on HTTP/1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_fields_are_bounded_as_an_http1_heads() {
    let (backend, baton) = baton_with("").await;
    let web = baton.addr("web");
    let cookie = [("cookie".to_string(), "c".repeat(20_000))];
    assert_eq!(status_with(web, &cookie).await, 200);
    let many: Vec<(String, String)> = (0..129).map(|i| (format!("x-f{i}"), "v".into())).collect();
    // (The test backend, hyper's, takes at most 100 fields itself.)
    assert_eq!(status_with(web, &many[..90]).await, 200);
    assert_eq!(status_with(web, &many).await, 431);
    // Cookies a browser sent one to a field go up as one line: one field.
    let crumbs: Vec<(String, String)> = (0..150)
        .map(|i| ("cookie".to_string(), format!("c{i}=v")))
        .collect();
    assert_eq!(status_with(web, &crumbs).await, 200);
    let huge = [("x-huge".to_string(), "h".repeat(70_000))];
    assert_eq!(status_with(web, &huge).await, 431);
    assert_eq!(backend.hits(), 3, "only the heads within bounds reached it");
}

/// Whether baton closed `s` or sent GOAWAY: looked at without waiting,
/// what it sent meanwhile read into `seen` (its frames from the first).
fn told_to_stop(s: &TcpStream, seen: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                return frames(seen).iter().any(|(kind, _)| *kind == GOAWAY)
            }
            Err(_) => return true,
        }
    }
}

/// What baton sends on `s` until it closes (within 5 s), after `seen`: its
/// frames, and the first GOAWAY among them, which must come.
async fn goaway_and_close(
    s: &mut TcpStream,
    mut seen: Vec<u8>,
    reset: u64,
) -> (Vec<(u8, u32, Vec<u8>)>, (u8, u32, Vec<u8>)) {
    let rest = until_closed(s, Duration::from_secs(5)).await;
    assert!(rest.is_some(), "still open after {reset} streams reset");
    seen.extend(rest.unwrap_or_default());
    let told = frames_of(&seen);
    let goaway = told
        .iter()
        .find(|(kind, _, _)| *kind == GOAWAY)
        .cloned()
        .expect("GOAWAY before the close");
    (told, goaway)
}

/// The "rapid reset" attack (CVE-2023-44487), in the form h2's own bound
/// (20 resets waiting for the server at once) does not see: each stream
/// reset just after baton took it and sent it on, so each costs the
/// backend a request. At the 500th such stream the connection gets its
/// last GOAWAY (ENHANCE_YOUR_CALM, naming the last stream taken), a stream
/// opened after it is not served, nor sent to the backend (a graceful
/// close's second would have let the client go on), and the connection is
/// closed a second later, not served for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_resets_every_stream_it_opens_is_cut() {
    const FLOOD: u64 = 500;
    const RST_STREAM: u8 = 3;
    const REFUSED_STREAM: [u8; 4] = [0, 0, 0, 7];
    const ENHANCE_YOUR_CALM: [u8; 4] = [0, 0, 0, 11];
    let (backend, baton) = baton_with("").await;
    let mut s = opened(&baton).await;
    let (mut reset, mut seen) = (0, Vec::new());
    while !told_to_stop(&s, &mut seen) && reset < 2 * FLOOD {
        // Each stream's own: a loaded machine's 500 round trips may take
        // longer than one.
        let deadline = tokio::time::Instant::now() + support::TIMEOUT;
        let stream = 2 * reset as u32 + 1;
        let before = backend.hits();
        if s.write_all(&support::h2_raw::get_on(stream, "/slow/10000"))
            .await
            .is_err()
        {
            break;
        }
        // Reset once the backend has it (or baton said stop meanwhile).
        while backend.hits() == before && !told_to_stop(&s, &mut seen) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "stream {stream} never reached the backend"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let _ = s.write_all(&support::h2_raw::reset(stream)).await;
        reset += 1;
    }
    let after = 2 * reset as u32 + 1;
    let _ = s
        .write_all(&support::h2_raw::get_on(after, "/slow/10000"))
        .await;
    let (told, goaway) = goaway_and_close(&mut s, seen, reset).await;
    let last_named = u32::from_be_bytes(goaway.2[..4].try_into().expect("an id"));
    assert!(
        last_named < after && goaway.2[4..8] == ENHANCE_YOUR_CALM,
        "the last GOAWAY at once, telling why: {goaway:?}"
    );
    // Refused, or read by no one: the connection ends once its last
    // stream does.
    assert!(
        told.iter()
            .filter(|(_, id, _)| *id == after)
            .all(|frame| *frame == (RST_STREAM, after, REFUSED_STREAM.to_vec())),
        "stream {after}, opened after the GOAWAY, answered: {told:?}"
    );
    // Streams 1, 3, ... up to the last named may have reached it (one
    // read with the 500th reset may have taken the next), none after.
    assert!(
        backend.hits() <= u64::from(last_named).div_ceil(2),
        "{} streams reached the backend, the last named being {last_named}",
        backend.hits()
    );
    // A stream or two more may cross the GOAWAY on their way.
    assert!(
        (FLOOD..=FLOOD + 2).contains(&reset),
        "cut after {reset} streams reset, not {FLOOD}"
    );
    let metrics = support::client::metrics(baton.admin).await;
    assert!(
        metrics.contains("baton_client_aborts_total{listener=\"web\",reason=\"reset_flood\"} 1"),
        "{metrics}"
    );
}

/// The same attack with each stream reset in the very write that opened
/// it: its exchange never runs (nor reaches a backend: a read that splits
/// a pair lets that one run), yet it cost baton a decode and a few
/// allocations, and such streams went on without end. They count as
/// streams sent on and reset: the last GOAWAY (ENHANCE_YOUR_CALM) comes,
/// and the close a second later. Fifty pairs a write, under the hundred
/// streams a read pass takes (whose last runs before its reset is read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_resets_each_stream_as_it_opens_it_is_cut() {
    const ENHANCE_YOUR_CALM: [u8; 4] = [0, 0, 0, 11];
    let (backend, baton) = baton_with("").await;
    let mut s = opened(&baton).await;
    let mut seen = Vec::new();
    let mut streams = (1u32..).step_by(2);
    // Up to twice the bound.
    for _ in 0..20 {
        if told_to_stop(&s, &mut seen) {
            break;
        }
        let batch: Vec<u8> = streams
            .by_ref()
            .take(50)
            .flat_map(|id| {
                [
                    support::h2_raw::get_on(id, "/slow/10000"),
                    support::h2_raw::reset(id),
                ]
                .concat()
            })
            .collect();
        if s.write_all(&batch).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = u64::from(streams.next().unwrap_or(1) / 2);
    let (_, goaway) = goaway_and_close(&mut s, seen, sent).await;
    assert_eq!(goaway.2[4..8], ENHANCE_YOUR_CALM, "{goaway:?}");
    // Under a quarter of the bound: most streams counted never ran (a
    // loaded baton reading two writes at once lets a few more run).
    assert!(
        backend.hits() < 125,
        "{} streams reached the backend: the cut came from others",
        backend.hits()
    );
    let metrics = support::client::metrics(baton.admin).await;
    assert!(
        metrics.contains("baton_client_aborts_total{listener=\"web\",reason=\"reset_flood\"} 1"),
        "{metrics}"
    );
}

/// What a client may send before baton reads it (while its stream waits
/// in line, connects, or its backend is slow to take the body) is bounded
/// as nginx bounds it: 64 KiB a stream (SETTINGS_INITIAL_WINDOW_SIZE, not
/// hyper's 1 MiB) on each of its streams (at most 100 by default, tested
/// above; nginx: 128), as the connection's window goes back as DATA
/// arrives. The first grant of the connection's
/// window stays at 256 KiB (65,535 bytes and a WINDOW_UPDATE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_client_may_send_unread_is_bounded() {
    let (_backend, baton) = baton_with("").await;
    let mut s = opened(&baton).await;
    // Everything baton sent before its PING's answer: its SETTINGS and
    // first grants, whatever the machine's load.
    let seen = support::h2_raw::round_trip(&mut s).await;
    let frames = frames(&seen);
    let settings: Vec<(u16, u32)> = frames
        .iter()
        .filter(|(kind, _)| *kind == 4)
        .flat_map(|(_, payload)| {
            payload
                .chunks_exact(6)
                .map(|e| {
                    (
                        u16::from_be_bytes([e[0], e[1]]),
                        u32::from_be_bytes([e[2], e[3], e[4], e[5]]),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!settings.is_empty(), "baton's SETTINGS: {frames:?}");
    let stream_window = settings
        .iter()
        .rev()
        .find(|(id, _)| *id == 4)
        .map_or(65_535, |(_, value)| *value);
    assert!(stream_window <= 64 * 1024, "stream window {stream_window}");
    let opened_more: u32 = frames
        .iter()
        .filter(|(kind, _)| *kind == 8)
        .map(|(_, p)| u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff)
        .sum();
    let connection_window = 65_535 + opened_more;
    assert!(
        connection_window <= 256 * 1024,
        "connection window {connection_window}"
    );
}

/// A connection to `web`, h2 opened, whose stream 1 holds the one
/// connection its backend may have (`/gated`, until `release`): uploads
/// opened on it next wait in line, their bodies unread.
async fn behind_a_held_backend() -> (HttpBackend, Baton, TcpStream) {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(support::raw::one_place_waiting(backend.addr, "60s")).await;
    let mut s = opened(&baton).await;
    s.write_all(&support::h2_raw::get_on(1, "/gated"))
        .await
        .expect("write");
    let deadline = tokio::time::Instant::now() + support::TIMEOUT;
    while backend.held() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "/gated never came");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    support::h2_raw::round_trip(&mut s).await;
    (backend, baton, s)
}

/// Uploads waiting in line for a backend, sent in one-byte DATA frames:
/// what baton keeps of them is about what they carry (four streams of
/// 60,000 bytes), not a slot and a view of its read buffer for every byte
/// (which held over 10 MiB for the same 240,000 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_in_one_byte_frames_hold_about_what_they_carry() {
    const STREAMS: usize = 4;
    const BYTES: usize = 60_000;
    let (backend, baton, mut s) = behind_a_held_backend().await;
    let before = support::daemon::rss_kib(baton.first_pid);
    let mut frames = Vec::new();
    for stream in (3..).step_by(2).take(STREAMS) {
        frames.extend(support::h2_raw::post_on(stream, "/upload"));
        for _ in 0..BYTES {
            frames.extend(support::h2_raw::data_on(stream, b"u"));
        }
    }
    s.write_all(&frames).await.expect("write");
    support::h2_raw::round_trip(&mut s).await;
    let grown = support::daemon::rss_kib(baton.first_pid).saturating_sub(before);
    backend.release();
    assert!(
        grown < 4 * 1024,
        "{} bytes queued in one-byte frames grew baton by {grown} KiB",
        STREAMS * BYTES
    );
}

/// The stream's window is what bounds an upload waiting in line, now that
/// the connection's goes back as DATA arrives: a byte past its 64 KiB
/// resets the stream (FLOW_CONTROL_ERROR), and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_past_its_streams_window_is_reset() {
    const RST_STREAM: u8 = 3;
    const FLOW_CONTROL_ERROR: [u8; 4] = [0, 0, 0, 3];
    let (backend, _baton, mut s) = behind_a_held_backend().await;
    let mut frames = support::h2_raw::post_on(3, "/upload");
    for _ in 0..4 {
        frames.extend(support::h2_raw::data_on(3, &[b'u'; 16 * 1024]));
    }
    s.write_all(&frames).await.expect("write");
    support::h2_raw::round_trip(&mut s).await;
    s.write_all(&support::h2_raw::data_on(3, b"!"))
        .await
        .expect("write");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + support::TIMEOUT;
    while !frames_of(&seen).contains(&(RST_STREAM, 3, FLOW_CONTROL_ERROR.to_vec())) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("RST_STREAM in time")
            .expect("read");
        assert_ne!(n, 0, "closed: {:?}", frames_of(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    support::h2_raw::round_trip(&mut s).await;
    backend.release();
}

/// A client that closes its half with its upload unfinished (`shutdown`
/// while it still reads, or TLS's close_notify) gets its stream reset
/// (CANCEL): its request was never whole, and no response may say it was
/// served (an empty 200 went out, followed by RST_STREAM(NO_ERROR), which
/// a client takes as a whole answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_by_the_clients_half_close_is_reset_not_answered() {
    const HEADERS: u8 = 1;
    const RST_STREAM: u8 = 3;
    const CANCEL: [u8; 4] = [0, 0, 0, 8];
    let (_backend, baton) = baton_with("").await;
    let mut s = opened(&baton).await;
    let mut frames = support::h2_raw::post_on(1, "/upload");
    frames.extend(support::h2_raw::data_on(1, b"part of a body"));
    s.write_all(&frames).await.expect("write");
    s.shutdown().await.expect("half-close");
    let seen = until_closed(&mut s, support::TIMEOUT)
        .await
        .expect("closed in time");
    let on_stream_1: Vec<_> = frames_of(&seen)
        .into_iter()
        .filter(|(_, stream, _)| *stream == 1)
        .collect();
    assert!(
        !on_stream_1.iter().any(|(kind, _, _)| *kind == HEADERS),
        "answered: {on_stream_1:?}"
    );
    assert!(
        on_stream_1.contains(&(RST_STREAM, 1, CANCEL.to_vec())),
        "{on_stream_1:?}"
    );
}

/// An h2 connection with no stream open holds no buffer: a thousand, each
/// idle after one answered request, grow baton by under 12 KiB each (8 in
/// this debug build; 15 when each held its 16 KiB read buffer, the room of
/// its last streams, and a linger buffer inline in its task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_h2_connections_hold_no_buffers() {
    const CONNECTIONS: usize = 1000;
    let (_backend, baton) = baton_with("").await;
    let web = baton.addr("web");
    let mut held = Vec::new();
    // The first also opens the backend connection and warms the
    // allocator's caches: counted before.
    let mut before = 0;
    for n in 0..=CONNECTIONS {
        if n == 1 {
            before = support::daemon::rss_kib(baton.first_pid);
        }
        let mut sender = support::client::h2::<http_body_util::Empty<bytes::Bytes>>(web).await;
        let request = hyper::Request::get(format!("http://{web}/"))
            .body(http_body_util::Empty::new())
            .expect("request");
        let response = sender.send_request(request).await.expect("answer");
        assert_eq!(response.status(), 200);
        held.push((sender, response));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let per = support::daemon::rss_kib(baton.first_pid).saturating_sub(before) / CONNECTIONS as u64;
    assert!(per < 12, "{per} KiB an idle h2 connection");
}

/// A client that sends PINGs and takes nothing it is sent cannot keep
/// its connection's exchanges from being polled: their clocks still run
/// (here `response_timeout`, 8 s, on a request the backend holds), and
/// the backend connection is let go. With the send buffer full of PING
/// answers, no exchange was polled again, and each held its backend
/// connection as long as the client went on. The flood is seen stalled
/// before the clock ran out: one slow to start would let the timeout
/// come first, and the test pass without the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_answers_a_client_does_not_read_stall_no_exchange() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const WRITES: usize = 256;
    let (backend, baton) = baton_with("response_timeout = \"8s\"").await;
    let mut s = support::h2_raw::small_window_reader(baton.addr("web")).await;
    gated_on_stream_1(&mut s, &backend).await;
    // Far past what the sockets' buffers take, in PINGs (17 bytes each,
    // as their answers are), none of whose answers is read; the writes
    // stop once baton stops reading.
    let pings: Vec<u8> = (0..4096u64)
        .flat_map(|i| support::h2_raw::ping(i.to_be_bytes()))
        .collect();
    let (_, mut writer) = s.into_split();
    let all = WRITES * pings.len();
    // Bytes the socket took, as it took them.
    let written = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&written);
    let flood = tokio::spawn(async move {
        for _ in 0..WRITES {
            let mut sent = 0;
            while sent < pings.len() {
                match writer.write(&pings[sent..]).await {
                    Ok(0) | Err(_) => return writer,
                    Ok(n) => {
                        sent += n;
                        counted.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
        }
        writer
    });
    support::eventually("the flood stalled", || async {
        let before = written.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = written.load(Ordering::Relaxed);
        after > 0 && after == before && after < all
    })
    .await;
    let timed_out =
        "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"timeout\"} 1";
    assert!(
        !support::client::metrics(baton.admin)
            .await
            .contains(timed_out),
        "the exchange timed out before the flood stalled: nothing was shown"
    );
    support::eventually("the exchange timed out all the same", || async {
        support::client::metrics(baton.admin)
            .await
            .contains(timed_out)
    })
    .await;
    flood.abort();
}
