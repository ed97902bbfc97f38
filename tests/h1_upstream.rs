//! baton's own HTTP/1 path toward backends: connections kept and reused,
//! never written to once the backend closed them, a request the backend's
//! close raced sent again only when that is safe, and responses a
//! well-behaved server rarely sends (interim 1xx, close-delimited bodies,
//! extra bytes) handled as HAProxy or nginx would.

mod support;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::client;
use support::daemon::{Baton, Spec};
use support::raw::{ok, RawBackend, Seen, Then};

/// One worker: every client connection meets the same idle backend
/// connections (each worker keeps its own).
async fn baton_for(backend: &RawBackend) -> Baton {
    let spec = Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool("app", &[backend.addr]);
    Baton::start(spec).await
}

/// baton in front of `backend`, and a client connected to it.
async fn baton_and_client(backend: &RawBackend) -> (Baton, TcpStream) {
    let baton = baton_for(backend).await;
    let s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    (baton, s)
}

/// Reads one response head (lower-cased) from `s`.
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(support::TIMEOUT, s.read(&mut byte))
            .await
            .expect("a response head in time")
            .expect("read");
        assert_eq!(
            n,
            1,
            "closed mid-head after {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_backend_connection_serves_requests_in_turn() {
    let backend =
        RawBackend::start(|seen: &Seen| (ok(&seen.on_connection.to_string()), Then::KeepAlive))
            .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    for i in 0..20 {
        let answer = client::get(web, &format!("/{i}")).await.expect("answer");
        assert_eq!(answer.status, 200);
        assert_eq!(
            answer.body,
            i.to_string(),
            "the same backend connection, request {i}"
        );
    }
    assert_eq!(backend.accepted(), 1);
}

/// The backend closes each connection 50 ms after answering (its
/// keep-alive timeout); the next request comes 150 ms later and must never
/// be written to the closed connection. POSTs, which are never sent twice:
/// only the check before reuse can save them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_connection_the_backend_closed_is_never_used() {
    let backend =
        RawBackend::start(|_: &Seen| (ok("fine"), Then::CloseAfter(Duration::from_millis(50))))
            .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    for _ in 0..10 {
        let mut s = TcpStream::connect(web).await.expect("connect");
        s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
            .await
            .expect("write");
        let head = read_head(&mut s).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(backend.accepted(), 10, "a new connection each time");
}

/// The backend reads a second request on a kept connection and closes it
/// without a byte (the keep-alive race a backend's timeout causes): a GET
/// is sent again on a new connection; a POST, which may have had effects,
/// is a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_backend_close_raced_is_sent_again_only_when_safe() {
    let backend = RawBackend::start(|seen: &Seen| match seen.on_connection {
        0 => (ok("first"), Then::KeepAlive),
        _ => (Vec::new(), Then::Close),
    })
    .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    assert_eq!(client::get(web, "/a").await.expect("first").body, "first");
    let again = client::get(web, "/b").await.expect("the GET is sent again");
    assert_eq!((again.status, again.body.as_str()), (200, "first"));
    assert_eq!(backend.accepted(), 2);

    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        .await
        .expect("write");
    assert!(read_head(&mut s).await.starts_with("http/1.1 502"));
    let posts = backend
        .heads()
        .iter()
        .filter(|h| h.starts_with("POST"))
        .count();
    assert_eq!(posts, 1, "the POST reached the backend once");
}

/// A kept connection that broke off in the middle of a response head did
/// answer: the request is not sent again (the backend began answering
/// it), it is a 502, and the backend is not connected to a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_broken_off_on_a_kept_connection_is_a_502_not_a_retry() {
    let backend = RawBackend::start(support::raw::breaks_off_its_second_head).await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    assert_eq!(client::get(web, "/a").await.expect("first").body, "first");
    let cut = client::get(web, "/b").await.expect("answered");
    assert_eq!(cut.status, 502, "{cut:?}");
    assert_eq!(backend.accepted(), 1);
}

/// A request sent again on a new connection keeps the backend's place:
/// given up, it went to the request waiting in line, and the retry queued
/// behind it (a 503 at `queue_timeout` while `/slow` held the place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_again_keeps_its_place_at_a_full_backend() {
    let backend = RawBackend::start(support::raw::closes_under_b).await;
    let baton = Baton::start(support::raw::one_place(backend.addr)).await;
    let web = baton.addr("web");
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert!(read_head(&mut s).await.starts_with("http/1.1 200"));
    let mut first = [0u8; 5];
    s.read_exact(&mut first).await.expect("body");
    s.write_all(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    support::raw::queued_behind_b(&backend, web).await;
    let head = read_head(&mut s).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let mut again = [0u8; 5];
    s.read_exact(&mut again).await.expect("body");
    assert_eq!(&again, b"again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_responses_reach_an_http_1_1_client_only() {
    let backend = RawBackend::start(|_: &Seen| {
        let mut bytes =
            b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n".to_vec();
        bytes.extend(ok("done"));
        (bytes, Then::KeepAlive)
    })
    .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let early = read_head(&mut s).await;
    assert!(early.starts_with("http/1.1 103"), "{early}");
    assert!(early.contains("link: </style.css>; rel=preload"), "{early}");
    assert!(read_head(&mut s).await.starts_with("http/1.1 200"));

    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.expect("write");
    let reply = client::read_until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(!reply.contains("103"), "{reply}");
    assert!(reply.ends_with("done"), "{reply}");
}

/// A body that ends when the backend closes reaches a 1.1 client chunked,
/// and the client's connection stays open for its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_delimited_body_is_chunked_for_the_client_who_keeps_its_connection() {
    let backend = RawBackend::start(|_: &Seen| {
        (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end".to_vec(),
            Then::Close,
        )
    })
    .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    let mut conn = client::connect(web).await.expect("connect");
    for _ in 0..3 {
        let answer = client::send(&mut conn, web, "/").await.expect("answer");
        assert_eq!(answer.body, "until the end");
        assert_eq!(
            answer
                .headers
                .get("transfer-encoding")
                .map(|v| v.as_bytes()),
            Some(&b"chunked"[..])
        );
    }
    assert_eq!(backend.accepted(), 3);
}

/// Bytes after a complete response answer nothing, and a response that
/// states both a length and chunked coding is read chunked: neither
/// connection is kept, and each next request gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_connection_whose_framing_was_in_doubt_is_not_reused() {
    for (case, answer) in support::raw::unkeepable_answers() {
        let backend = RawBackend::start(move |seen: &Seen| (answer(seen), Then::KeepAlive)).await;
        let baton = baton_for(&backend).await;
        let web = baton.addr("web");
        for _ in 0..3 {
            let answer = client::get(web, "/").await.expect("answer");
            // Seen once in a full-suite run, a 502, not reproduced since: the
            // log says which backend read failed, for whoever sees it next.
            assert_eq!(
                answer.body,
                "answer 0",
                "{case}; baton's log:\n{}",
                baton.log()
            );
        }
        assert_eq!(backend.accepted(), 3, "{case}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_to_a_request_that_asked_for_no_upgrade_is_a_502() {
    let backend = RawBackend::start(|_: &Seen| {
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n".to_vec(), Then::KeepAlive)
    })
    .await;
    let baton = baton_for(&backend).await;
    let answer = client::get(baton.addr("web"), "/").await.expect("answer");
    assert_eq!(answer.status, 502);
}

/// A 101 must name, in its own Upgrade field and from HTTP/1.1, a
/// protocol the client offered (RFC 9110 §7.8): one that names none, or
/// another, or comes from HTTP/1.0 is a 502, not a tunnel to an unknown
/// protocol (whose frames baton would read as the client's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_to_no_protocol_the_client_offered_is_a_502() {
    for head in [
        "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: bar\r\nconnection: upgrade\r\n\r\n",
        "HTTP/1.0 101 Switching Protocols\r\nupgrade: foo\r\nconnection: upgrade\r\n\r\n",
    ] {
        let backend =
            RawBackend::start(move |_: &Seen| (head.as_bytes().to_vec(), Then::KeepAlive)).await;
        let baton = baton_for(&backend).await;
        let mut client = support::raw::upgrading(baton.addr("web")).await;
        let answer = read_head(&mut client).await;
        assert!(answer.starts_with("http/1.1 502"), "{head:?}: {answer}");
    }
    // Any protocol of the offer, in any case, is one.
    let backend = RawBackend::start(|_: &Seen| {
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: FOO\r\nconnection: upgrade\r\n\r\nhi"
                .to_vec(),
            Then::KeepAlive,
        )
    })
    .await;
    let baton = baton_for(&backend).await;
    let mut client = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    client
        .write_all(
            b"GET / HTTP/1.1\r\nhost: app\r\nconnection: upgrade\r\nupgrade: bar, foo\r\n\r\n",
        )
        .await
        .expect("upgrade");
    let answer = read_head(&mut client).await;
    assert!(answer.starts_with("http/1.1 101"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_and_1_0_gets_a_host() {
    let backend = RawBackend::start(|seen: &Seen| {
        let path = seen
            .head
            .split_whitespace()
            .nth(1)
            .unwrap_or("?")
            .to_string();
        (ok(&path), Then::KeepAlive)
    })
    .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\nGET /three HTTP/1.0\r\n\r\n")
        .await
        .expect("write");
    let replies = client::read_until_closed(&mut s).await;
    let bodies: Vec<&str> = replies
        .split("HTTP/1.1 200 OK")
        .skip(1)
        .map(|r| r.rsplit("\r\n\r\n").next().unwrap_or(""))
        .collect();
    assert_eq!(bodies, ["/one", "/two", "/three"], "{replies}");
    let heads = backend.heads();
    assert!(
        heads[2]
            .to_ascii_lowercase()
            .contains(&format!("host: {}", backend.addr)),
        "{}",
        heads[2]
    );
}

/// A response with an empty body says so (`content-length: 0`): the
/// client's keep-alive connection takes the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_body_keeps_its_length_and_the_connection() {
    let backend = RawBackend::start(|_: &Seen| {
        (
            b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n".to_vec(),
            Then::KeepAlive,
        )
    })
    .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    let mut conn = client::connect(web).await.expect("connect");
    for _ in 0..2 {
        let answer =
            tokio::time::timeout(Duration::from_secs(5), client::send(&mut conn, web, "/"))
                .await
                .expect("the empty body ends at once")
                .expect("answer");
        assert_eq!(answer.status, 302);
        assert_eq!(
            answer.headers.get("content-length").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
    }
}

/// baton's own error page to a HEAD request is a head alone: the next
/// response on the connection starts where the client expects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_answer_to_head_has_no_body() {
    let (dead, _reserved) = support::daemon::dead_addr();
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[dead])).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(
        b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("write");
    let first = read_head(&mut s).await;
    assert!(first.starts_with("http/1.1 502"), "{first}");
    assert!(first.contains("content-length: "), "{first}");
    let second = read_head(&mut s).await;
    assert!(
        second.starts_with("http/1.1 502"),
        "right after the first head: {second}"
    );
}

/// A request refused with its body still coming: the client reads its
/// answer, and no backend sees any of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_with_a_body_behind_it_is_answered_and_never_forwarded() {
    let backend = RawBackend::start(|_: &Seen| (ok("never"), Then::KeepAlive)).await;
    let baton = baton_for(&backend).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let mut request =
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n".to_vec();
    request.extend(std::iter::repeat_n(b'x', 64 * 1024));
    s.write_all(&request).await.expect("write");
    // A close over the unread body would be a reset. The answer, already in
    // our socket, survives one (the kernel keeps what it received), so only
    // how the connection ended tells a lingering close from a plain one.
    let (reply, ended) = support::read_to_the_end(&mut s).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply:?}");
    assert_eq!(
        ended,
        Ok(()),
        "a FIN after the answer, not a reset: {reply:?}"
    );
    assert_eq!(backend.accepted(), 0);
}

/// A backend whose head never ends (field after field) is a 502 once the
/// head passes its bound, and counts against that backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_response_head_is_a_502() {
    let backend = RawBackend::start(|_: &Seen| {
        let mut bytes = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..20_000 {
            bytes.extend(format!("x-field-{i}: value\r\n").into_bytes());
        }
        (bytes, Then::KeepAlive)
    })
    .await;
    let baton = baton_for(&backend).await;
    let answer = client::get(baton.addr("web"), "/").await.expect("answer");
    assert_eq!(answer.status, 502);
    let status = client::backend_status(baton.admin, "app-0").await;
    assert!(
        status["last_error"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("too large")),
        "{status}"
    );
}

/// A chunked body that goes bad after its head was sent: the client's
/// connection is cut (it cannot be told otherwise), the failure is the
/// backend's, and the next client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_that_breaks_its_framing_cuts_the_client_and_blames_the_backend() {
    let backend = RawBackend::start(|seen: &Seen| {
        if seen.head.starts_with("GET /bad") {
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
                    .to_vec(),
                Then::KeepAlive,
            )
        } else {
            (ok("fine"), Then::KeepAlive)
        }
    })
    .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    assert!(
        client::get(web, "/bad").await.is_err(),
        "the client must not take a cut body as whole"
    );
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"protocol\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(
        client::get(web, "/next").await.expect("answer").body,
        "fine"
    );
}

/// A client that sent more than baton reads (here: bytes after a request
/// that closes the connection) still gets its whole answer: baton shuts its
/// side and reads the rest before closing, since a close over unread bytes
/// is a reset, and a reset throws away what the client has not received yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_over_unread_bytes_does_not_destroy_the_answer() {
    const BODY: usize = 8 << 20;
    let backend = RawBackend::start(|_: &Seen| {
        let mut bytes = format!("HTTP/1.1 200 OK\r\ncontent-length: {BODY}\r\n\r\n").into_bytes();
        bytes.resize(bytes.len() + BODY, b'x');
        (bytes, Then::KeepAlive)
    })
    .await;
    let (_baton, mut s) = baton_and_client(&backend).await;
    let mut request = b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec();
    request.resize(request.len() + 256 * 1024, b'z');
    s.write_all(&request).await.expect("write");
    // Not reading yet: much of the answer may still wait in baton's socket
    // as it closes. How much is the machine's doing; how the connection
    // ended is not: a close over the unread 256 KiB is a reset, bytes lost
    // or not.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (got, ended) = support::read_to_the_end(&mut s).await;
    let head_end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |i| i + 4);
    assert_eq!(got.len() - head_end, BODY, "the whole body arrived");
    assert_eq!(ended, Ok(()), "a FIN after the answer, not a reset");
}

/// A body with a transfer coding other than chunked (`gzip, chunked`)
/// keeps it named for an HTTP/1.1 client, which can take it; an HTTP/1.0
/// or h2 client cannot (neither has transfer codings), and gets a 502
/// rather than a coded body with nothing to say so, as from nginx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coding_goes_only_to_a_client_that_can_take_it() {
    let backend = RawBackend::start(|_: &Seen| {
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nzzzzz\r\n0\r\n\r\n"
                .to_vec(),
            Then::KeepAlive,
        )
    })
    .await;
    let baton = baton_for(&backend).await;
    let web = baton.addr("web");
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET /11 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let reply = client::read_until_closed(&mut s).await.to_ascii_lowercase();
    assert!(reply.starts_with("http/1.1 200"), "{reply}");
    assert!(
        reply.contains("transfer-encoding: gzip, chunked\r\n"),
        "{reply}"
    );
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET /10 HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let reply = client::read_until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 502"), "{reply}");
    let mut h2 = client::h2::<http_body_util::Empty<bytes::Bytes>>(web).await;
    let request = hyper::Request::get(format!("http://{web}/h2"))
        .body(http_body_util::Empty::new())
        .expect("request");
    let answer = tokio::time::timeout(support::TIMEOUT, h2.send_request(request))
        .await
        .expect("an answer in time")
        .expect("h2 response");
    assert_eq!(answer.status(), 502);
}

/// A backend that sends its head and the start of its body, then nothing
/// (a stuck application, a host gone without a reset): after
/// `response_timeout` of silence the client's connection is cut (`sD`)
/// and a timeout counted, as nginx's `proxy_read_timeout` does, instead
/// of holding it, its place and the backend connection for as long as
/// the client waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_silent_mid_body_is_cut_after_response_timeout() {
    let (_backend, spec) = support::raw::silent_mid_body().await;
    let baton = Baton::start(spec).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let mut reply = Vec::new();
    let closed = tokio::time::timeout(support::TIMEOUT, s.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        closed.is_ok(),
        "still open after {:?}: {reply:?}",
        support::TIMEOUT
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert!(reply.ends_with("\r\n\r\nhello"), "{reply:?}");
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"timeout\"} 1"
        ),
        "{metrics}"
    );
}

/// An event stream's quiet spells are timed by `tunnel_timeout`, not
/// `response_timeout` (README): events (or heartbeats) may come less often
/// than a response's bytes would, and cutting the stream then counted a
/// backend timeout for a backend doing its job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_is_quiet_up_to_tunnel_timeout_not_response_timeout() {
    let backend = RawBackend::start(support::raw::one_event_then_quiet).await;
    let spec = Spec::new()
        .listener("web", "http", "app", "response_timeout = \"1s\"")
        .listener(
            "short",
            "http",
            "app",
            "response_timeout = \"1s\"\ntunnel_timeout = \"2s\"",
        )
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let first_event = |listener: &'static str| {
        let addr = baton.addr(listener);
        async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .expect("request");
            let head = read_head(&mut s).await;
            assert!(head.starts_with("http/1.1 200"), "{head}");
            s
        }
    };
    let mut quiet = first_event("web").await;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.ends_with(b"data: 1\n\n\r\n") {
        let n = tokio::time::timeout(support::TIMEOUT, quiet.read(&mut buf))
            .await
            .expect("the first event in time")
            .expect("read");
        assert!(n > 0, "closed before its first event");
        got.extend_from_slice(&buf[..n]);
    }
    let more = tokio::time::timeout(Duration::from_secs(3), quiet.read(&mut buf)).await;
    assert!(
        more.is_err(),
        "open and quiet past response_timeout: {more:?}"
    );
    let asked = std::time::Instant::now();
    let mut short = first_event("short").await;
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(support::TIMEOUT, short.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "cut at tunnel_timeout");
    assert!(
        asked.elapsed() >= Duration::from_millis(1900),
        "cut at tunnel_timeout (2 s), not response_timeout (1 s): {:?}",
        asked.elapsed()
    );
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"timeout\"} 1"
        ),
        "one timeout, the short listener's: {metrics}"
    );
}

/// A backend that takes none of an upload is answered 504 at
/// `response_timeout` from when it stopped taking bytes, not after a
/// second `response_timeout` spent waiting for a head it will not send.
/// (The bound has room: 5 s is the fixed time, the old one 10 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_takes_no_upload_is_a_504_at_response_timeout() {
    let deaf = support::raw::deaf_after_head().await;
    let spec = Spec::new()
        .top("workers = 1")
        .listener("web", "http", "app", "response_timeout = \"5s\"")
        .pool("app", &[deaf]);
    let baton = Baton::start(spec).await;
    let stream = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let (mut read, mut write) = stream.into_split();
    let started = std::time::Instant::now();
    let uploading = tokio::spawn(async move {
        let head = "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n";
        write.write_all(head.as_bytes()).await.expect("head");
        let chunk = vec![b'x'; 64 * 1024];
        while write.write_all(&chunk).await.is_ok() {}
    });
    let mut reply = vec![0u8; 12];
    tokio::time::timeout(support::TIMEOUT, read.read_exact(&mut reply))
        .await
        .expect("an answer in time")
        .expect("read");
    let took = started.elapsed();
    uploading.abort();
    assert_eq!(&reply, b"HTTP/1.1 504");
    assert!(took < Duration::from_secs(8), "504 after {took:?}");
}

/// A backend that takes no more of a request's head (it reads nothing,
/// and the head outgrows the sockets' buffers) is answered 504 at
/// `response_timeout`, as one that stops taking an upload is: a timeout
/// charged to it, not a connection it closed (a 502, after the request
/// was sent again). In a network namespace of the test's own, whose send
/// buffers are 4 KiB, so that a 60 KiB head cannot all go up.
#[test]
fn a_backend_that_takes_no_request_head_is_a_504_at_response_timeout() {
    use std::io::{Read, Write};
    if !support::possible_or_skipped(&["unshare", "-n", "true"], "a network namespace") {
        return;
    }
    let deaf: std::net::SocketAddr = "127.0.0.1:8000".parse().expect("address");
    let spec = Spec::new()
        .top("workers = 1")
        .listener("web", "http", "app", "response_timeout = \"2s\"")
        .pool("app", &[deaf]);
    let small_buffers = "ip link set lo up && cd /proc/sys/net/ipv4 \
                         && echo 4096 4096 4096 >tcp_wmem && echo 4096 4096 4096 >tcp_rmem \
                         && exec \"$0\" \"$@\"";
    let baton = Baton::spawn_under(spec, &[], &["unshare", "-n", "sh", "-c", small_buffers]);
    let (at, pid, log) = (baton.addr("web"), baton.first_pid, baton.log_path());
    let answer = std::thread::spawn(move || {
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        support::netns::enter_network_namespace_of(pid, &said);
        let listener = std::net::TcpListener::bind(deaf).expect("the deaf backend");
        // Accepted and held, never read.
        let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        support::netns::wait_listening(at, &said);
        let mut client = std::net::TcpStream::connect(at).expect("connect");
        let big = "x".repeat(60 * 1024);
        let head =
            format!("GET / HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
        client.write_all(head.as_bytes()).expect("send");
        client
            .set_read_timeout(Some(support::TIMEOUT))
            .expect("a bound");
        let mut answer = String::new();
        let read = client.read_to_string(&mut answer);
        drop(held);
        read.map(|_| answer)
    })
    .join()
    .expect("the client thread")
    .expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
}

/// The time an upload waits on its backend is not the client's: a body
/// sent as fast as it can be but for a 2 ms pause every 256 KiB, held 5 s
/// by a backend that took none of it at first, is not behind a 4 MiB/s
/// `body_min_rate` with a grace of 1 s (counted, that wait would put it
/// behind once the sockets' 8 MB or so are counted for, at about 3 s, and
/// its next pause would end it; the rate is half what a loaded machine's
/// debug build still sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_an_upload_waits_on_its_backend_is_not_held_against_its_pace() {
    let addr = support::raw::slow_to_read_the_body(Duration::from_secs(5)).await;
    let spec = Spec::new()
        .top("workers = 1")
        .listener(
            "web",
            "http",
            "app",
            "header_timeout = \"1s\"\nbody_min_rate = 4194304",
        )
        .pool("app", &[addr]);
    let baton = Baton::start(spec).await;
    let stream = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let (mut read, mut write) = stream.into_split();
    let uploading = tokio::spawn(async move {
        let head = "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 16777216\r\n\r\n";
        write.write_all(head.as_bytes()).await.expect("head");
        let chunk = vec![b'x'; 64 * 1024];
        for i in 0..256 {
            write.write_all(&chunk).await.expect("a body part");
            if i % 4 == 3 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        write
    });
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    while !reply.ends_with(b"\r\n\r\nok") {
        let n = tokio::time::timeout(support::TIMEOUT, read.read(&mut buf))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&buf[..n]);
    }
    assert!(
        reply.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    uploading.await.expect("the whole body went up");
}

/// A backend that refuses an upload from its head (a 413 before a byte of
/// it) and reads no more: a client that writes its whole body before it
/// reads (Python's `http.client`, Java's `HttpURLConnection`) still gets
/// the answer, its writes taken, even with a pause of 2 s halfway (a long
/// linger's wait is 5 s; any other close's 1 s in all). baton reads and
/// drops the rest of the body after its answer, as nginx's
/// `lingering_close` does, rather than closing over it: that close was a
/// reset, the client's write failed and the answer was lost with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_refused_from_its_head_gets_its_answer_once_written_whole() {
    const BODY: usize = 32 << 20;
    let addr = support::raw::answers_after_head(
        b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 3\r\n\r\nbig",
    )
    .await;
    let spec = Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool("app", &[addr]);
    let baton = Baton::start(spec).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let head = format!("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("head");
    support::upload_with_a_pause(&mut s, BODY, Duration::from_secs(2)).await;
    let (got, ended) = support::read_to_the_end(&mut s).await;
    let got = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(got.starts_with("http/1.1 413"), "{got}");
    assert!(got.ends_with("\r\n\r\nbig"), "{got}");
    assert_eq!(ended, Ok(()), "a FIN after the answer, not a reset");
}

/// A backend that answers before it read the request's body, and never
/// reads it, takes what is left of it for its next request. A backend
/// connection whose answer came before baton had sent the whole request is
/// not kept, so a body shaped as a request never answers another client
/// (here the upload ends while the answer's body is still coming, which
/// once let the connection be kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_answered_before_the_whole_request_is_not_reused() {
    let addr = support::raw::answers_before_the_body().await;
    let spec = Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool("app", &[addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");

    let smuggled = support::raw::SMUGGLED;
    let mut a = TcpStream::connect(web).await.expect("connect");
    a.write_all(
        format!(
            "POST /early HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\nxx",
            2 + smuggled.len()
        )
        .as_bytes(),
    )
    .await
    .expect("head and the body's start");
    let head = read_head(&mut a).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    // The rest of the body, while the answer's body is still coming.
    a.write_all(smuggled.as_bytes()).await.expect("the rest");
    let mut body = [0u8; 5];
    tokio::time::timeout(support::TIMEOUT, a.read_exact(&mut body))
        .await
        .expect("the answer's body in time")
        .expect("the answer's body");
    assert_eq!(&body, b"early");

    let b = client::get(web, "/b").await.expect("answered");
    assert_eq!(b.body, "/b", "another client's answer: {b:?}");
}
