//! h2 clients' streams on baton's own HTTP/1 upstream, the one HTTP/1
//! clients use: the same kept backend connections, the same check before
//! reuse and the same safe resend, request bodies framed for HTTP/1 as they
//! stream (chunked when no length was said), responses of every framing
//! turned into h2 frames (trailers too), both directions at once, and a
//! response that breaks off resetting the stream and blamed on the backend.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{Baton, Spec};
use support::raw::{ok, RawBackend, Seen, Then};

/// One worker: every stream meets the same idle backend connections.
async fn baton_for(backend: SocketAddr) -> Baton {
    let spec = Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool("app", &[backend]);
    Baton::start(spec).await
}

/// A request body the test feeds frame by frame.
struct Fed(mpsc::Receiver<Frame<Bytes>>);

impl http_body::Body for Fed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|f| f.map(Ok))
    }
}

type Boxed = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn h2(addr: SocketAddr) -> SendRequest<Boxed> {
    client::h2(addr).await
}

fn request(method: &str, addr: SocketAddr, path: &str, body: Boxed) -> hyper::Request<Boxed> {
    hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(body)
        .expect("request")
}

fn empty() -> Boxed {
    Empty::new().boxed()
}

/// Status, body and trailers of one answer.
async fn send(
    sender: &mut SendRequest<Boxed>,
    req: hyper::Request<Boxed>,
) -> (u16, String, Option<hyper::HeaderMap>) {
    let resp = tokio::time::timeout(support::TIMEOUT, sender.send_request(req))
        .await
        .expect("an answer in time")
        .expect("h2 response");
    let status = resp.status().as_u16();
    let collected = resp.into_body().collect().await.expect("whole body");
    let trailers = collected.trailers().cloned();
    let body = String::from_utf8_lossy(&collected.to_bytes()).into_owned();
    (status, body, trailers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_and_http1_clients_share_kept_backend_connections() {
    let backend =
        RawBackend::start(|seen: &Seen| (ok(&seen.on_connection.to_string()), Then::KeepAlive))
            .await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    for i in 0..10 {
        let (status, body, _) = send(&mut sender, request("GET", web, "/", empty())).await;
        assert_eq!((status, body), (200, i.to_string()), "stream {i}");
    }
    let answer = client::get(web, "/").await.expect("an HTTP/1 answer");
    assert_eq!(
        answer.body, "10",
        "the HTTP/1 client got the same connection"
    );
    assert_eq!(backend.accepted(), 1);
}

/// As for HTTP/1 clients: an event stream's quiet spells are timed by
/// `tunnel_timeout`, not `response_timeout`; past it the stream is reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_is_quiet_up_to_tunnel_timeout_not_response_timeout() {
    let backend = RawBackend::start(support::raw::one_event_then_quiet).await;
    let baton = Baton::start(
        Spec::new()
            .listener(
                "web",
                "http",
                "app",
                "response_timeout = \"1s\"\ntunnel_timeout = \"2s\"",
            )
            .pool("app", &[backend.addr]),
    )
    .await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let asked = std::time::Instant::now();
    let resp = tokio::time::timeout(
        support::TIMEOUT,
        sender.send_request(request("GET", web, "/events", empty())),
    )
    .await
    .expect("a head in time")
    .expect("h2 response");
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(
        first.data_ref().map(|d| d.as_ref()),
        Some(&b"data: 1\n\n"[..])
    );
    let rest = tokio::time::timeout(support::TIMEOUT, body.collect()).await;
    assert!(
        rest.as_ref().is_ok_and(Result::is_err),
        "reset at tunnel_timeout: {rest:?}"
    );
    assert!(
        asked.elapsed() >= Duration::from_millis(1900),
        "cut at tunnel_timeout (2 s), not response_timeout (1 s): {:?}",
        asked.elapsed()
    );
}

/// As for HTTP/1 clients: a kept connection that broke off in the middle
/// of a response head did answer, so the stream is not sent again: a 502,
/// and no second connection to the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_broken_off_on_a_kept_connection_is_a_502_not_a_retry() {
    let backend = RawBackend::start(support::raw::breaks_off_its_second_head).await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (status, body, _) = send(&mut sender, request("GET", web, "/a", empty())).await;
    assert_eq!((status, body.as_str()), (200, "first"));
    let (status, _, _) = send(&mut sender, request("GET", web, "/b", empty())).await;
    assert_eq!(status, 502);
    assert_eq!(backend.accepted(), 1);
}

/// As for HTTP/1 clients: a backend connection whose framing was in doubt
/// (bytes past the response, a length and chunked coding together) is not
/// given to the next stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_connection_whose_framing_was_in_doubt_is_not_given_to_the_next_stream() {
    for (case, answer) in support::raw::unkeepable_answers() {
        let backend = RawBackend::start(move |seen: &Seen| (answer(seen), Then::KeepAlive)).await;
        let baton = baton_for(backend.addr).await;
        let web = baton.addr("web");
        let mut sender = h2(web).await;
        for i in 0..3 {
            let (status, body, _) = send(&mut sender, request("GET", web, "/", empty())).await;
            assert_eq!(
                (status, body.as_str()),
                (200, "answer 0"),
                "{case}, stream {i}"
            );
        }
        assert_eq!(backend.accepted(), 3, "{case}");
    }
}

/// As for HTTP/1 clients: a GET a backend's close raced is sent again on a
/// new connection; a POST, which may have had effects, is a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_a_backend_close_raced_is_sent_again_only_when_safe() {
    let backend = RawBackend::start(|seen: &Seen| match seen.on_connection {
        0 => (ok("first"), Then::KeepAlive),
        _ => (Vec::new(), Then::Close),
    })
    .await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (_, first, _) = send(&mut sender, request("GET", web, "/a", empty())).await;
    assert_eq!(first, "first");
    let again = send(&mut sender, request("GET", web, "/b", empty())).await;
    assert_eq!((again.0, again.1.as_str()), (200, "first"));
    assert_eq!(backend.accepted(), 2);

    // A POST, with a body or without one, may have had effects.
    for (i, body) in [Full::new(Bytes::from_static(b"hi")).boxed(), empty()]
        .into_iter()
        .enumerate()
    {
        let (_, first, _) = send(&mut sender, request("GET", web, "/again", empty())).await;
        assert_eq!(first, "first", "a kept connection again");
        let (status, _, _) = send(
            &mut sender,
            request("POST", web, &format!("/post/{i}"), body),
        )
        .await;
        assert_eq!(status, 502, "POST {i}");
        let posts = backend
            .heads()
            .iter()
            .filter(|h| h.starts_with(&format!("POST /post/{i} ")))
            .count();
        assert_eq!(posts, 1, "POST {i} reached the backend once");
    }
}

/// As for HTTP/1 clients: a stream sent again on a new connection keeps
/// the backend's place, instead of queueing behind the request it gave it to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sent_again_keeps_its_place_at_a_full_backend() {
    let backend = RawBackend::start(support::raw::closes_under_b).await;
    let baton = Baton::start(support::raw::one_place(backend.addr)).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (_, first, _) = send(&mut sender, request("GET", web, "/a", empty())).await;
    assert_eq!(first, "first");
    let b =
        tokio::spawn(async move { send(&mut sender, request("GET", web, "/b", empty())).await });
    support::raw::queued_behind_b(&backend, web).await;
    let (status, body, _) = b.await.expect("join");
    assert_eq!((status, body.as_str()), (200, "again"));
}

/// A body of unknown length goes up chunked, one with a length says it,
/// an empty POST says `content-length: 0`, and a GET says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_are_framed_for_http_1() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;

    let (tx, rx) = mpsc::channel(4);
    let streamed = send(
        &mut sender,
        request("POST", web, "/headers", Fed(rx).boxed()),
    );
    let feeding = async move {
        for part in ["hello ", "world"] {
            tx.send(Frame::data(Bytes::from(part))).await.expect("fed");
        }
    };
    let ((_, seen, _), ()) = tokio::join!(streamed, feeding);
    assert!(seen.contains("transfer-encoding: chunked"), "{seen}");
    assert!(!seen.contains("content-length"), "{seen}");

    let sized = hyper::Request::post(format!("http://{web}/upload"))
        .header("content-length", "11")
        .body(Full::new(Bytes::from_static(b"hello world")).boxed())
        .expect("request");
    let (_, said, _) = send(&mut sender, sized).await;
    assert_eq!(said, "received 11\n");

    let (_, seen, _) = send(&mut sender, request("POST", web, "/headers", empty())).await;
    assert!(seen.contains("content-length: 0"), "{seen}");
    // Via names the protocol baton received the request in.
    assert!(seen.contains("via: 2.0 baton"), "{seen}");
    // h2 may split cookies into fields of their own; HTTP/1 wants one line.
    let mut split = request("GET", web, "/headers", empty());
    split
        .headers_mut()
        .append("cookie", "a=1".parse().expect("value"));
    split
        .headers_mut()
        .append("cookie", "b=2".parse().expect("value"));
    let (_, seen, _) = send(&mut sender, split).await;
    assert_eq!(seen.matches("cookie:").count(), 1, "{seen}");
    assert!(seen.contains("cookie: a=1; b=2"), "{seen}");
    let (_, seen, _) = send(&mut sender, request("GET", web, "/headers", empty())).await;
    assert!(
        !seen.contains("content-length") && !seen.contains("transfer-encoding"),
        "{seen}"
    );
}

/// An h2 client's request trailers reach the backend as HTTP/1 trailers,
/// less those that would reframe, reroute or misattribute the request were
/// the backend to merge them into its head: the same rule as an HTTP/1
/// client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_trailers_go_on_without_framing_or_routing_fields() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (tx, rx) = mpsc::channel(4);
    let sent = send(
        &mut sender,
        request("POST", web, "/trailers", Fed(rx).boxed()),
    );
    let feeding = async move {
        tx.send(Frame::data(Bytes::from_static(b"hello")))
            .await
            .expect("fed");
        let mut trailers = hyper::HeaderMap::new();
        for (name, value) in [
            ("x-sum", "7"),
            ("content-length", "999"),
            ("host", "elsewhere"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-request-id", "forged"),
            ("x-forwarded-client-cert", "Hash=00"),
        ] {
            trailers.insert(name, value.parse().expect("value"));
        }
        tx.send(Frame::trailers(trailers)).await.expect("fed");
    };
    let ((status, said, _), ()) = tokio::join!(sent, feeding);
    assert_eq!(
        (status, said.as_str()),
        (200, "request trailers: x-sum=7 \n")
    );
}

/// Chunked with trailers, close-delimited, after an interim 103, and a
/// HEAD's length: each reaches the h2 client as the backend meant it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_framing_reaches_an_h2_client() {
    let backend = RawBackend::start(|seen: &Seen| {
        let path = seen.head.split(' ').nth(1).unwrap_or("");
        match path {
            "/chunked" => (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 7\r\n\r\n".to_vec(),
                Then::KeepAlive,
            ),
            "/until-close" => (b"HTTP/1.1 200 OK\r\n\r\nall of it".to_vec(), Then::Close),
            // Trailers h2 would refuse, and a length said twice.
            "/odd" => (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nconnection: x\r\nx-sum: 2\r\n\r\n".to_vec(),
                Then::KeepAlive,
            ),
            "/old" => (
                b"HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\nold".to_vec(),
                Then::Close,
            ),
            "/twice" => (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok".to_vec(),
                Then::KeepAlive,
            ),
            "/hints" => {
                let mut bytes = b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n".to_vec();
                bytes.extend(ok("after hints"));
                (bytes, Then::KeepAlive)
            }
            // A length a 204 must not carry (RFC 9110 §8.6): an h2 client
            // takes it for a body still owed, and resets the stream.
            "/no-content" => (
                b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n".to_vec(),
                Then::Close,
            ),
            _ => (b"HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n".to_vec(), Then::KeepAlive),
        }
    })
    .await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (status, body, trailers) =
        send(&mut sender, request("GET", web, "/chunked", empty())).await;
    assert_eq!((status, body.as_str()), (200, "hello world"));
    let trailers = trailers.expect("trailers");
    assert_eq!(trailers.get("x-sum").map(|v| v.as_bytes()), Some(&b"7"[..]));
    let (_, body, _) = send(&mut sender, request("GET", web, "/until-close", empty())).await;
    assert_eq!(body, "all of it");
    let old = sender
        .send_request(request("GET", web, "/old", empty()))
        .await
        .expect("h2 response");
    let via = old.headers().get("via").map(|v| v.as_bytes().to_vec());
    assert_eq!(
        via.as_deref(),
        Some(&b"1.0 baton"[..]),
        "the backend's version"
    );
    let (_, body, trailers) = send(&mut sender, request("GET", web, "/odd", empty())).await;
    let trailers = trailers.expect("trailers");
    assert_eq!((body.as_str(), trailers.len()), ("ok", 1), "{trailers:?}");
    let resp = sender
        .send_request(request("GET", web, "/twice", empty()))
        .await
        .expect("answered");
    assert_eq!(resp.headers().get_all("content-length").iter().count(), 1);
    let (status, body, _) = send(&mut sender, request("GET", web, "/hints", empty())).await;
    assert_eq!((status, body.as_str()), (200, "after hints"));
    let resp = sender
        .send_request(request("HEAD", web, "/head", empty()))
        .await
        .expect("HEAD answered");
    assert_eq!(
        resp.headers().get("content-length").map(|v| v.as_bytes()),
        Some(&b"42"[..])
    );
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(body.is_empty());
    let resp = sender
        .send_request(request("GET", web, "/no-content", empty()))
        .await
        .expect("204 answered");
    assert_eq!(resp.status(), 204);
    assert_eq!(resp.headers().get("content-length"), None);
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("no body")
        .to_bytes();
    assert!(body.is_empty());
}

/// A backend that answers as it reads (an echo): the upload goes on while
/// the response streams down, each part echoed before the next is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_may_answer_while_the_request_still_streams_up() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let echo = hyper::service::service_fn(
                |req: hyper::Request<hyper::body::Incoming>| async move {
                    Ok::<_, Infallible>(hyper::Response::new(req.into_body()))
                },
            );
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), echo),
            );
        }
    });
    let baton = baton_for(addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (tx, rx) = mpsc::channel(1);
    tx.send(Frame::data(Bytes::from_static(b"one")))
        .await
        .expect("fed");
    let resp = tokio::time::timeout(
        support::TIMEOUT,
        sender.send_request(request("POST", web, "/echo", Fed(rx).boxed())),
    )
    .await
    .expect("the head before the body ends")
    .expect("h2 response");
    let mut body = resp.into_body();
    for (part, next) in [("one", Some("two")), ("two", None)] {
        let mut got = Vec::new();
        while got.len() < part.len() {
            let frame = tokio::time::timeout(support::TIMEOUT, body.frame())
                .await
                .expect("an echo in time")
                .expect("a frame")
                .expect("no error");
            got.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref()));
        }
        assert_eq!(got, part.as_bytes());
        match next {
            Some(next) => tx.send(Frame::data(Bytes::from(next))).await.expect("fed"),
            None => break,
        }
    }
    drop(tx);
    let rest = tokio::time::timeout(support::TIMEOUT, body.collect())
        .await
        .expect("the end in time")
        .expect("whole");
    assert!(rest.to_bytes().is_empty());
}

/// The body broke off after the head: the stream is reset (the
/// client must not take a short body for a whole one) and the backend is
/// charged with a protocol error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_breaks_off_resets_the_stream_and_blames_the_backend() {
    let served = std::sync::atomic::AtomicU64::new(0);
    let backend = RawBackend::start(move |_: &Seen| {
        match served.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
            0 => (
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten..".to_vec(),
                Then::Close,
            ),
            _ => (ok("whole"), Then::KeepAlive),
        }
    })
    .await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    // The head and the short body come at once, so h2 may drop the
    // queued head with the reset: either way the answer must fail.
    let answer = tokio::time::timeout(support::TIMEOUT, async {
        let resp = sender
            .send_request(request("GET", web, "/", empty()))
            .await?;
        resp.into_body().collect().await.map(|_| ())
    })
    .await
    .expect("the end in time");
    assert!(answer.is_err(), "a short body must not look whole");
    support::eventually("the backend blamed", || async {
        client::metrics(baton.admin).await.lines().any(|l| {
            l.starts_with("baton_upstream_errors_total")
                && l.contains("kind=\"protocol\"")
                && l.ends_with(" 1")
        })
    })
    .await;
    // The connection is still good for the next stream.
    let (status, _, _) = send(&mut sender, request("GET", web, "/", empty())).await;
    assert_eq!(status, 200);
}

/// A length an HTTP/1 backend could read another way (two of them, not a
/// plain number, or more digits than an HTTP/1 client may send), CONNECT,
/// and a standard method in another case (`head`, which a backend that
/// folds case answers without a body) are refused; no backend sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_an_http_1_backend_could_misread_are_refused() {
    let backend = RawBackend::start(|_: &Seen| (ok("seen"), Then::KeepAlive)).await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    // A POST of "hi" with these fields.
    let post = |fields: &[(&'static str, &str)]| {
        let mut req = request(
            "POST",
            web,
            "/",
            Full::new(Bytes::from_static(b"hi")).boxed(),
        );
        for (name, value) in fields {
            req.headers_mut()
                .append(*name, value.parse().expect("value"));
        }
        req
    };
    for lengths in [
        &["2", "2"][..],
        &["+2"],
        &["0x2"],
        &["00000000000000000002"],
    ] {
        let mut sender = h2(web).await;
        let fields: Vec<(&'static str, &str)> =
            lengths.iter().map(|l| ("content-length", *l)).collect();
        let req = post(&fields);
        // h2 itself may reset such a stream first; either way, no 2xx.
        let answer = tokio::time::timeout(support::TIMEOUT, sender.send_request(req))
            .await
            .expect("an answer in time");
        if let Ok(resp) = answer {
            assert_eq!(resp.status(), 400, "{lengths:?}");
        }
    }
    let mut sender = h2(web).await;
    let connect = hyper::Request::builder()
        .method("CONNECT")
        .uri(format!("{web}"))
        .body(empty())
        .expect("request");
    let answer = tokio::time::timeout(support::TIMEOUT, sender.send_request(connect))
        .await
        .expect("an answer in time");
    if let Ok(resp) = answer {
        assert_eq!(resp.status(), 400);
    }
    for method in ["head", "Get", "connect"] {
        let mut sender = h2(web).await;
        let req = request(method, web, "/", empty());
        let answer = tokio::time::timeout(support::TIMEOUT, sender.send_request(req))
            .await
            .expect("an answer in time");
        if let Ok(resp) = answer {
            assert_eq!(resp.status(), 400, "{method}");
        }
    }
    // An expectation no one on the way meets: 417, as on the HTTP/1 path.
    let mut sender = h2(web).await;
    let resp = sender
        .send_request(post(&[("expect", "foo")]))
        .await
        .expect("an answer");
    assert_eq!(resp.status(), 417);
    assert!(backend.heads().is_empty(), "{:?}", backend.heads());
}

/// baton's own answer to a HEAD it could not serve has no body, as on the
/// HTTP/1 path: DATA on a HEAD's answer is a stream error to nghttp2's
/// clients, which saw a reset where baton said 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_baton_could_not_serve_gets_its_status_without_a_body() {
    let dead: SocketAddr = "127.0.0.1:1".parse().expect("address");
    let baton = baton_for(dead).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (status, body, _) = send(&mut sender, request("HEAD", web, "/", empty())).await;
    assert_eq!((status, body.as_str()), (502, ""));
    let (status, body, _) = send(&mut sender, request("GET", web, "/", empty())).await;
    assert_eq!(status, 502);
    assert!(body.contains("request id"), "{body}");
    // Each is said in baton's log, under its request id, the HEAD too.
    support::eventually("both answers in the log", || async {
        baton.log().matches("answered with an error").count() == 2
    })
    .await;
}

/// A backend that reads the head and then no more: the upload fills the
/// sockets between them and baton stops reading the client's body. That
/// stall is the backend's (504, a timeout charged to it), not the
/// client's 408, though the client too has sent nothing since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_takes_no_upload_is_a_504_not_the_client_s_408() {
    let addr = support::raw::deaf_after_head().await;
    let spec = Spec::new()
        .top("workers = 1")
        .listener(
            "web",
            "http",
            "app",
            "response_timeout = \"1s\"\nidle_timeout = \"1s\"",
        )
        .pool("app", &[addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (tx, rx) = mpsc::channel(1);
    let feeding = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        // 64 MiB at most: far more than loopback sockets hold.
        for _ in 0..1024 {
            if tx.send(Frame::data(chunk.clone())).await.is_err() {
                return;
            }
        }
    });
    let (status, _, _) = send(&mut sender, request("POST", web, "/", Fed(rx).boxed())).await;
    feeding.abort();
    assert_eq!(status, 504);
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("baton_upstream_errors_total")
                && l.contains("kind=\"timeout\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
}

/// Once the response is under way no exchange watch runs any more, yet a
/// request body that stops arriving for `idle_timeout` still ends the
/// stream (as it ends an HTTP/1 exchange), instead of holding its backend
/// connection for as long as the client keeps the connection alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_stops_after_the_response_began_ends_at_idle_timeout() {
    let backend = RawBackend::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
            Then::CloseAfter(std::time::Duration::from_secs(60)),
        )
    })
    .await;
    let (baton, _dir, log) = logging_to_a_file("idle_timeout = \"1s\"", backend.addr).await;
    let (resp, held) = post_held_open(baton.addr("web")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.data_ref().map(|d| d.as_ref()), Some(&b"hello"[..]));
    // The client says no more and keeps its body open (`held`).
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
        .await
        .expect("the stream ends within a few idle_timeouts");
    assert!(
        matches!(ended, Some(Err(_))),
        "reset, not a clean end: {ended:?}"
    );
    drop(held);
    // The client's pause, logged as such: not the backend's failure.
    let line = logged(&log).await;
    assert!(line.contains("\"termination\":\"cD\""), "{line}");
}

/// A backend silent mid-body (head and five bytes of a hundred, then
/// nothing): after `response_timeout` the h2 stream is reset and a
/// timeout counted and logged (`sD`), as on the HTTP/1 path, instead of
/// holding the stream, the backend connection and its place for as long
/// as the client waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_silent_mid_body_resets_the_stream_after_response_timeout() {
    let (backend, _) = support::raw::silent_mid_body().await;
    let (baton, _dir, log) = logging_to_a_file("response_timeout = \"1s\"", backend.addr).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let response = sender
        .send_request(request("GET", web, "/x", empty()))
        .await
        .expect("h2 response head");
    assert_eq!(response.status(), 200);
    let body = tokio::time::timeout(support::TIMEOUT, response.into_body().collect()).await;
    let body =
        body.unwrap_or_else(|_| panic!("the stream still open after {:?}", support::TIMEOUT));
    assert!(body.is_err(), "the stream is reset, not ended: {body:?}");
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"timeout\"} 1"
        ),
        "{metrics}"
    );
    let line = logged(&log).await;
    assert!(line.contains("\"termination\":\"sD\""), "{line}");
}

/// A backend that closes with no answer while the client's body is still
/// going up: a 502, logged as a request the backend would not take (`SR`),
/// as on the HTTP/1 path, not as one it took and then failed (`SH`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_closes_during_the_upload_is_a_502_logged_sr() {
    let curt = support::raw::closes_after_head().await;
    let (baton, _dir, log) = logging_to_a_file("", curt).await;
    let (resp, held) = post_held_open(baton.addr("web")).await;
    assert_eq!(resp.status(), 502);
    drop(held);
    let line = logged(&log).await;
    assert!(line.contains("\"termination\":\"SR\""), "{line}");
}

/// What keeps a POST's body open: its sender, and the connection's (the
/// client closes a connection whose every sender is gone).
type HeldOpen = (mpsc::Sender<Frame<Bytes>>, SendRequest<Boxed>);

/// A POST to `web` over h2 whose body sent `part` and stays open while
/// the returned [`HeldOpen`] is held: its response head, and that.
async fn post_held_open(web: SocketAddr) -> (hyper::Response<hyper::body::Incoming>, HeldOpen) {
    let mut sender = h2(web).await;
    let (tx, rx) = mpsc::channel(4);
    tx.send(Frame::data(Bytes::from_static(b"part")))
        .await
        .expect("fed");
    let resp = tokio::time::timeout(
        support::TIMEOUT,
        sender.send_request(request("POST", web, "/", Fed(rx).boxed())),
    )
    .await
    .expect("a head in time")
    .expect("h2 response");
    (resp, (tx, sender))
}

/// A baton whose `web` listener (with `keys` besides) writes JSON
/// access-log lines to a file, in front of `backend`: it, the file's
/// folder (kept while the test runs) and the file.
async fn logging_to_a_file(
    keys: &str,
    backend: SocketAddr,
) -> (Baton, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let keys = format!(
        "{keys}\naccess_log = {{ path = \"{}\", format = \"json\" }}",
        log.display()
    );
    let spec = Spec::new()
        .top("workers = 1")
        .listener("web", "http", "app", &keys)
        .pool("app", &[backend]);
    (Baton::start(spec).await, dir, log)
}

/// The access log's text, once it holds a line.
async fn logged(log: &std::path::Path) -> String {
    support::eventually("the stream's access-log line", || async {
        std::fs::read_to_string(log).is_ok_and(|t| !t.is_empty())
    })
    .await;
    std::fs::read_to_string(log).expect("access log")
}

/// Feeds `tx` 10 bytes every 200 ms (50 a second), 100 times at most or
/// until the stream ends, counting in `sent` the parts it sent.
fn trickle(
    tx: mpsc::Sender<Frame<Bytes>>,
    sent: Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..TRICKLED_PARTS {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            if tx
                .send(Frame::data(Bytes::from_static(b"uuuuuuuuuu")))
                .await
                .is_err()
            {
                return;
            }
            sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    })
}

/// The parts of a whole trickled body.
const TRICKLED_PARTS: usize = 100;

/// An h2 body below `body_min_rate` (50 bytes a second against 100, after
/// a first `header_timeout` of 1 s) gets a 408 once it falls behind,
/// before any response head (the backend reads the whole body first),
/// and the backend's upload is cut rather than held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_body_behind_body_min_rate_is_a_408() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener(
            "web",
            "http",
            "app",
            "header_timeout = \"1s\"\nbody_min_rate = 100",
        )
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let mut sender = h2(web).await;
    let (tx, rx) = mpsc::channel(1);
    let sent = Arc::default();
    let feeding = trickle(tx, Arc::clone(&sent));
    let (status, body, _) = send(
        &mut sender,
        request("POST", web, "/upload", Fed(rx).boxed()),
    )
    .await;
    // Counted, not asked whether the feeder ended: it ends too when the
    // answer drops the body, which raced this look (CI saw it fail so).
    let parts = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        parts < TRICKLED_PARTS,
        "the whole body went up at 50 bytes a second"
    );
    feeding.abort();
    assert_eq!(status, 408, "{body}");
    assert!(body.contains("408"), "{body}");
    support::eventually("the backend's upload cut", || async {
        backend
            .uploads
            .failed
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    })
    .await;
}

/// The time an upload waits on its backend is not the client's: a body
/// sent at full speed whenever it can be, but held 3 s by a backend that
/// took none of it at first, is not behind a 2 MiB/s `body_min_rate` with
/// a grace of 1 s (counted, that wait, with the 2 MB or so the sockets
/// took before it, would put it behind at about 2 s). The
/// client sends with `TCP_NODELAY`, as curl and browsers do: with Nagle's
/// algorithm each of its 16 KiB frames waited for baton's delayed ACK, a
/// pace of 1.6 MB/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_an_h2_upload_waits_on_its_backend_is_not_held_against_its_pace() {
    let addr = support::raw::slow_to_read_the_body(std::time::Duration::from_secs(3)).await;
    let spec = Spec::new()
        .top("workers = 1")
        .listener(
            "web",
            "http",
            "app",
            "header_timeout = \"1s\"\nbody_min_rate = 2097152",
        )
        .pool("app", &[addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let stream = tokio::net::TcpStream::connect(web).await.expect("connect");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let mut sender = client::h2_over(stream).await.expect("h2 handshake");
    let (tx, rx) = mpsc::channel(1);
    let chunks = 256;
    let feeding = tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        for _ in 0..chunks {
            if tx.send(Frame::data(chunk.clone())).await.is_err() {
                return;
            }
        }
    });
    let mut req = request("POST", web, "/", Fed(rx).boxed());
    req.headers_mut()
        .insert("content-length", (chunks * 64 * 1024).into());
    let (status, body, _) = send(&mut sender, req).await;
    feeding.abort();
    assert_eq!((status, body.as_str()), (200, "ok"));
}

/// An h2 client of the `h2` crate, which shows interim responses (hyper's
/// reads past them).
async fn interim_aware(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    sender.ready().await.expect("ready")
}

/// The next interim response of `response`, within the tests' timeout.
async fn next_interim(response: &mut h2::client::ResponseFuture) -> hyper::Response<()> {
    let polled = std::future::poll_fn(|cx| response.poll_informational(cx));
    tokio::time::timeout(support::TIMEOUT, polled)
        .await
        .expect("an interim response in time")
        .expect("an interim response before the final one")
        .expect("h2")
}

/// A backend's interim responses reach an h2 client before the final one,
/// as HEADERS of their own: 103 Early Hints with its `Link`, which
/// browsers act on over h2 only, then the 200 and its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_hints_reach_an_h2_client_before_the_response() {
    let backend = RawBackend::start(|_| {
        let mut bytes = b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n".to_vec();
        bytes.extend(ok("after hints"));
        (bytes, Then::KeepAlive)
    })
    .await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = interim_aware(web).await;
    let get = hyper::Request::get(format!("http://{web}/page"))
        .body(())
        .expect("request");
    let (mut response, _) = sender.send_request(get, true).expect("sent");
    let hints = next_interim(&mut response).await;
    assert_eq!(hints.status(), 103);
    assert_eq!(
        hints.headers().get("link").map(|v| v.as_bytes()),
        Some(&b"</a.css>; rel=preload"[..])
    );
    let response = tokio::time::timeout(support::TIMEOUT, response)
        .await
        .expect("a response in time")
        .expect("h2 response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut text = Vec::new();
    while let Some(data) = body.data().await {
        text.extend_from_slice(&data.expect("data"));
    }
    assert_eq!(text, b"after hints");
}

/// An h2 client that waits for `100 (Continue)` before its body gets it
/// (curl waits a second for it otherwise), and its upload goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_client_expecting_100_continue_gets_it() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_for(backend.addr).await;
    let web = baton.addr("web");
    let mut sender = interim_aware(web).await;
    let post = hyper::Request::post(format!("http://{web}/upload"))
        .header("expect", "100-continue")
        .body(())
        .expect("request");
    let (mut response, mut upload) = sender.send_request(post, false).expect("sent");
    let go_on = next_interim(&mut response).await;
    assert_eq!(go_on.status(), 100);
    upload
        .send_data(Bytes::from_static(b"hello"), true)
        .expect("the body");
    let response = tokio::time::timeout(support::TIMEOUT, response)
        .await
        .expect("a response in time")
        .expect("h2 response");
    assert_eq!(response.status(), 200);
    assert_eq!(
        backend
            .uploads
            .last_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        5
    );
}

/// Eight uploads of 200 KiB on one h2 connection to a backend capped at
/// one connection: the seven in line keep what they were sent unread
/// (64 KiB each, more than the connection's first window of 256 KiB in
/// all), and the one the backend serves still gets its bytes, so each is
/// answered in its turn, long before `queue_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_queued_for_a_capped_backend_do_not_stall_the_one_it_serves() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(support::raw::one_place_waiting(backend.addr, "60s")).await;
    let web = baton.addr("web");
    let sender = h2(web).await;
    let mut uploads = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let mut sender = sender.clone();
        uploads.spawn(async move {
            let body = Full::new(Bytes::from(vec![b'u'; 200 * 1024])).boxed();
            send(&mut sender, request("POST", web, "/upload", body)).await
        });
    }
    for (status, body, _) in uploads.join_all().await {
        assert_eq!((status, body.as_str()), (200, "received 204800\n"));
    }
}

/// As on the HTTP/1 path (`h1_upstream`): a backend connection whose
/// answer came before the stream's whole body was sent is not kept, so a
/// body shaped as a request never answers another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_answered_before_the_whole_request_is_not_reused() {
    let baton = baton_for(support::raw::answers_before_the_body().await).await;
    let web = baton.addr("web");
    let smuggled = support::raw::SMUGGLED;
    let mut sender = h2(web).await;
    let (tx, rx) = mpsc::channel(4);
    tx.send(Frame::data(Bytes::from_static(b"xx")))
        .await
        .expect("fed");
    let req = hyper::Request::builder()
        .method("POST")
        .uri(format!("http://{web}/early"))
        .header("content-length", 2 + smuggled.len())
        .body(Fed(rx).boxed())
        .expect("request");
    let resp = tokio::time::timeout(support::TIMEOUT, sender.send_request(req))
        .await
        .expect("the head before the body ends")
        .expect("h2 response");
    assert_eq!(resp.status(), 200);
    // The rest of the body, while the answer's body is still coming.
    tx.send(Frame::data(Bytes::from_static(smuggled.as_bytes())))
        .await
        .expect("fed");
    drop(tx);
    let body = tokio::time::timeout(support::TIMEOUT, resp.into_body().collect())
        .await
        .expect("the end in time")
        .expect("whole");
    assert_eq!(&body.to_bytes()[..], b"early");

    let b = client::get(web, "/b").await.expect("answered");
    assert_eq!(b.body, "/b", "another client's answer: {b:?}");
}
