//! Clients that upload slowly, move a gigabyte, give up halfway or send a
//! body no one can parse: baton streams what is sound with flat memory,
//! refuses what is not with a 400, and lets go of the backend when the
//! client goes.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::backend::HttpBackend;
use support::client::read_until_closed;
use support::daemon::{rss_kib, Baton, Spec};

const GIB: u64 = 1 << 30;

async fn baton_with(backend: &HttpBackend, listener_keys: &str) -> Baton {
    Baton::start(
        Spec::new()
            .listener("web", "http", "app", listener_keys)
            .pool("app", &[backend.addr]),
    )
    .await
}

/// Reads a response head; returns it and any body bytes read past it.
async fn read_head<R: AsyncRead + Unpin>(s: &mut R) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            return (head, buf[end + 4..].to_vec());
        }
        let n = tokio::time::timeout(support::TIMEOUT, s.read(&mut chunk))
            .await
            .expect("a response head in time")
            .expect("read");
        assert!(
            n > 0,
            "closed before a head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Samples `pid`'s RSS every 50 ms while `work` runs; returns the peak.
async fn peak_rss_during<F: std::future::Future<Output = ()>>(pid: u32, work: F) -> u64 {
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(rss_kib(pid)));
    let seen = std::sync::Arc::clone(&peak);
    let sampler = tokio::spawn(async move {
        loop {
            seen.fetch_max(rss_kib(pid), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    work.await;
    sampler.abort();
    peak.load(Ordering::Relaxed).max(rss_kib(pid))
}

/// An h2c client that opens its windows wide, asks for large responses on
/// every stream it may open, and never reads does not make baton hold
/// much for it: h2 buffers a stream's response only up to a small bound
/// once the socket is full (hyper's default, 400 KiB a stream, let three
/// such connections pin over 100 MiB until the stall clock ran out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_client_that_never_reads_pins_little_memory() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let web = baton.addr("web");
    let before = rss_kib(baton.first_pid);
    let mut clients = Vec::new();
    let peak = peak_rss_during(baton.first_pid, async {
        for _ in 0..3 {
            let mut s = support::h2_raw::small_window_reader(web).await;
            let streams: Vec<u8> = (0..100)
                .flat_map(|i| support::h2_raw::get_on(2 * i + 1, "/bytes/10000000"))
                .collect();
            s.write_all(&streams).await.expect("requests");
            clients.push(s);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    })
    .await;
    let grew_mib = peak.saturating_sub(before) / 1024;
    assert!(
        grew_mib < 48,
        "RSS grew {grew_mib} MiB for 300 unread streams"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_outlives_the_header_timeout() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "header_timeout = \"1s\"\nidle_timeout = \"10s\"").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 25\r\n\r\n")
        .await
        .expect("head");
    // 25 bytes over 2.5 s: well past header_timeout, never idle for long.
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(b"u").await.expect("a body byte");
    }
    let (head, body) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(backend.uploads.last_bytes.load(Ordering::Relaxed), 25);
    assert!(String::from_utf8_lossy(&body).contains("received 25") || body.is_empty());
}

/// A body that trickles, never idle for long but below `body_min_rate`,
/// is cut with a 408 once it falls behind (a second for every `rate` bytes
/// after a first `header_timeout`), and its backend connection is let go:
/// a slow POST holds no backend for as long as it likes. The same
/// backend, at its cap of one connection, then serves a body that keeps
/// the pace with time to spare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_behind_body_min_rate_is_a_408_that_frees_its_backend() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener(
            "web",
            "http",
            "app",
            "header_timeout = \"1s\"\nbody_min_rate = 100",
        )
        .pool_with(
            "app",
            "max_connections_per_backend = 1\nqueue_timeout = \"30s\"",
            &[(backend.addr, 1)],
        );
    let baton = Baton::start(spec).await;
    let (mut slow_r, mut slow_w) = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect")
        .into_split();
    slow_w
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        .await
        .expect("head");
    // 10 bytes every 200 ms, 50 a second: behind from about 2 s in
    // (1 s + 50t/100 < t); the whole body would take 20 s.
    let trickle = async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if slow_w.write_all(&[b'u'; 10]).await.is_err() {
                break;
            }
        }
        std::future::pending::<()>().await;
    };
    let head = tokio::select! {
        (head, _) = read_head(&mut slow_r) => head,
        () = trickle => unreachable!(),
    };
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    support::eventually("the backend's upload cut", || async {
        backend.uploads.failed.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(backend.uploads.completed.load(Ordering::Relaxed), 0);
    // 300 bytes at 500 a second: held to 1 s + 3 s, it takes 0.6 s.
    let mut paced = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    paced
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 300\r\n\r\n")
        .await
        .expect("head");
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        paced.write_all(&[b'p'; 10]).await.expect("a body part");
    }
    let (head, _) = read_head(&mut paced).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(backend.uploads.last_bytes.load(Ordering::Relaxed), 300);
}

/// A client too slow with its head that keeps sending after its 408 holds
/// its socket and its place in `max_connections` for a moment's linger,
/// not an upload's 30 s: only a client that may still be writing a body
/// lingers that long (an upload answered early, a body behind a head
/// refused for what it asks). Here the client trickles a byte every
/// 200 ms, each of which would start a long linger's wait afresh; its
/// writes fail once baton closed the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_too_slow_with_its_head_is_closed_after_a_brief_linger() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "header_timeout = \"1s\"").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\n")
        .await
        .expect("a head begun");
    let (head, _) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    let answered = tokio::time::Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(15), async {
        while s.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "still open 15 s after the 408");
    let held = answered.elapsed();
    assert!(
        held < Duration::from_secs(10),
        "held {held:?} after the 408: an upload's linger"
    );
}

/// A head refused for what it asks (here an `Expect` no one meets: 417)
/// may come with a body its client writes before it reads: the close
/// lingers long enough for the whole of it, a pause of 2 s halfway
/// included (a brief linger's 1 s would close over it, a reset that
/// fails the client's write and loses the 417).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_behind_a_refused_head_is_taken_before_the_close() {
    const BODY: usize = 8 << 20;
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let head =
        format!("POST /up HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nContent-Length: {BODY}\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("head");
    support::upload_with_a_pause(&mut s, BODY, Duration::from_secs(2)).await;
    let (got, ended) = support::read_to_the_end(&mut s).await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 417"), "{got}");
    assert_eq!(ended, Ok(()), "a FIN after the answer, not a reset");
}

/// A CRLF after a POST's body (some old clients send one; RFC 9112 §2.2
/// has servers ignore it) does not start the header clock, nor does one
/// whose CR and LF come in two segments: the connection waits for its
/// next request under `idle_timeout`, not a 408 at `header_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_line_between_requests_is_ignored() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "header_timeout = \"1s\"\nidle_timeout = \"10s\"").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi\r\n")
        .await
        .expect("request");
    let (head, _) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // And one whose CR and LF come apart: the lone CR started the clock.
    s.write_all(b"\r").await.expect("a lone CR");
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"\n").await.expect("its LF");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.write_all(b"GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("next request");
    let reply = read_until_closed(&mut s).await;
    assert!(!reply.contains("408"), "{reply}");
    assert!(
        reply.contains(&HttpBackend::body_for("a", "/next")),
        "{reply}"
    );
}

/// A client that waits for `100 Continue` before its body (curl does, for
/// bodies over 1 MiB) gets it: baton reads the body's first chunk before it
/// picks a backend, and reading is what makes the server say 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_expecting_100_continue_gets_it_and_its_upload_goes_through() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .expect("head");
    let (interim, _) = read_head(&mut s).await;
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    s.write_all(b"hello").await.expect("body");
    let (head, _) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(backend.uploads.last_bytes.load(Ordering::Relaxed), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_starts_is_a_408_at_idle_timeout() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "idle_timeout = \"1s\"").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
        .await
        .expect("head");
    let reply = read_until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply:?}");
    assert_eq!(backend.hits(), 0, "no backend was held for it");
}

/// A body that stops midway is the client's fault: 408 at `idle_timeout`,
/// never a 504 at `response_timeout` (which runs only once the request
/// was sent), never an upstream error, and never a health failure: three
/// such clients with `fall = 1` leave the backend up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_a_408_and_never_blames_the_backend() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener(
            "web",
            "http",
            "app",
            "idle_timeout = \"1s\"\nresponse_timeout = \"1s\"",
        )
        .pool_with(
            "app",
            "health = { kind = \"http\", path = \"/health\", interval = \"200ms\", timeout = \"5s\", rise = 1, fall = 1 }",
            &[(backend.addr, 1)],
        );
    let baton = Baton::start(spec).await;
    let stalled: Vec<_> = (0..3)
        .map(|_| {
            let web = baton.addr("web");
            tokio::spawn(async move {
                let mut s = TcpStream::connect(web).await.expect("connect");
                s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx")
                    .await
                    .expect("head and one byte");
                read_until_closed(&mut s).await
            })
        })
        .collect();
    for s in stalled {
        let reply = s.await.expect("join");
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply:?}");
    }
    let metrics = support::client::metrics(baton.admin).await;
    for kind in ["timeout", "connect", "protocol"] {
        assert!(
            metrics.contains(&format!(
                "baton_upstream_errors_total{{pool=\"app\",backend=\"app-0\",kind=\"{kind}\"}} 0"
            )),
            "{kind}: {metrics}"
        );
    }
    assert_eq!(
        support::client::backend_state(baton.admin, "app-0").await,
        "up"
    );
    assert_eq!(
        backend.uploads.completed.load(Ordering::Relaxed),
        0,
        "no backend got a whole request"
    );
}

/// 128 interim responses (103 Early Hints) of 48 KB each, 6 MB in all
/// (more than a loopback socket's send buffer grows to), then a 200.
fn hints_then_ok() -> String {
    let hint = format!(
        "HTTP/1.1 103 Early Hints\r\n{}\r\n",
        format!("link: <{}>\r\n", "x".repeat(8000)).repeat(6)
    );
    [
        hint.repeat(128),
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into(),
    ]
    .concat()
}

/// A client that takes none of the interim responses (103 Early Hints)
/// baton passes it holds the backend's final head back: `response_timeout`
/// running out meanwhile is the client's doing, and its own stall clock
/// (`idle_timeout`) cuts it. Counted against the backend, it was a timeout
/// and a passive health failure: a client could mark backends down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_takes_no_interim_responses_never_blames_the_backend() {
    let answer = hints_then_ok();
    let backend = support::raw::RawBackend::start(move |seen| {
        let bytes = if seen.head.contains("/health") {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()
        } else {
            answer.clone().into_bytes()
        };
        (bytes, support::raw::Then::KeepAlive)
    })
    .await;
    let spec = Spec::new()
        .listener(
            "web",
            "http",
            "app",
            "idle_timeout = \"3s\"\nresponse_timeout = \"1s\"",
        )
        .pool_with(
            "app",
            "health = { kind = \"http\", path = \"/health\", interval = \"200ms\", timeout = \"5s\", rise = 1, fall = 1 }",
            &[(backend.addr, 1)],
        );
    let baton = Baton::start(spec).await;
    let mut client = support::client::small_window(baton.addr("web")).await;
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    // Read nothing: the hints fill both sockets' buffers.
    support::eventually("the client is cut as a stalled reader", || async {
        support::client::metrics(baton.admin)
            .await
            .contains("baton_client_aborts_total{listener=\"web\",reason=\"stalled_reader\"} 1")
    })
    .await;
    let metrics = support::client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"timeout\"} 0"
        ),
        "{metrics}"
    );
    drop(client);
}

/// A client that stops taking response bytes (HTTP/1: a full socket; h2:
/// a window at zero) is cut at `idle_timeout`, counted as a client abort,
/// and its backend connection goes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_and_frees_its_backend() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "idle_timeout = \"1s\"").await;
    let web = baton.addr("web");

    // HTTP/1: asks for 1 GiB and reads nothing.
    let mut h1 = TcpStream::connect(web).await.expect("connect");
    h1.write_all(format!("GET /bytes/{GIB} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("request");

    // h2: a stream window of zero, so no body byte may ever be sent.
    let stream = TcpStream::connect(web).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .adaptive_window(false)
            .handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let h2_conn = tokio::spawn(conn);
    let request = hyper::Request::get(format!("http://{web}/bytes/1000000"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let response = sender
        .send_request(request)
        .await
        .expect("h2 response head");
    assert_eq!(response.status(), 200);
    within_3s("both streams reach the backend", || {
        backend.connections() == 2
    })
    .await;

    // Both are cut, and the backend streams to nobody any more.
    let mut sink = vec![0u8; 1 << 16];
    let h1_cut = tokio::time::timeout(support::TIMEOUT, async {
        loop {
            match h1.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                // Draining what sits in the socket buffers, once cut.
                Ok(_) => {}
            }
        }
    });
    // Reading now would take bytes: wait for the cut first.
    support::eventually("both slow readers cut", || async {
        support::client::metrics(baton.admin)
            .await
            .contains("baton_client_aborts_total{listener=\"web\",reason=\"stalled_reader\"} 2")
    })
    .await;
    h1_cut.await.expect("the HTTP/1 connection was closed");
    let _ = tokio::time::timeout(support::TIMEOUT, h2_conn)
        .await
        .expect("h2 connection ended");
    within_3s("the backend connections are released", || {
        backend.connections() == 0
    })
    .await;
}

/// One h2 stream starved of its window while others on the same connection
/// keep moving: the connection's own clock sees bytes move, but the
/// starved stream is reset at `idle_timeout`, counted, and its backend
/// connection let go, while the connection and its other streams go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_starved_of_window_is_reset_while_its_neighbours_move() {
    use http_body_util::BodyExt;
    let backend = HttpBackend::start("a").await;
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("access.log");
    let keys = format!(
        "idle_timeout = \"1s\"\naccess_log = {{ path = \"{}\", format = \"json\" }}",
        log.display()
    );
    let baton = baton_with(&backend, &keys).await;
    let web = baton.addr("web");
    let stream = TcpStream::connect(web).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(16 << 20)
            .adaptive_window(false)
            .handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let get = |path: String| {
        hyper::Request::get(format!("http://{web}{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request")
    };
    // Its body is never read, so its window closes after 64 KiB.
    let starved = sender
        .clone()
        .send_request(get(format!("/bytes/{GIB}")))
        .await
        .expect("the starved stream's head");
    assert_eq!(starved.status(), 200);
    let neighbour = |i: usize| {
        let (sender, request) = (sender.clone(), get(format!("/neighbour/{i}")));
        async move {
            let mut sender = sender;
            let answer = sender
                .send_request(request)
                .await
                .expect("a neighbour's head");
            assert_eq!(answer.status(), 200);
            answer
                .into_body()
                .collect()
                .await
                .expect("a neighbour's body");
        }
    };
    // A neighbour every 200 ms, each read whole, at least 3 s and until
    // the starved stream is counted cut: bytes keep moving on the
    // connection throughout, so its own clock cannot be what cut it.
    let stalled = "baton_client_aborts_total{listener=\"web\",reason=\"stalled_reader\"} 1";
    let deadline = tokio::time::Instant::now() + support::TIMEOUT;
    for i in 0.. {
        neighbour(i).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        if i >= 15
            && support::client::metrics(baton.admin)
                .await
                .contains(stalled)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the starved stream was never counted cut"
        );
    }
    // The connection goes on.
    neighbour(usize::MAX).await;
    let cut = tokio::time::timeout(support::TIMEOUT, starved.into_body().collect())
        .await
        .expect("the starved stream ends");
    assert!(cut.is_err(), "the starved stream was reset, not completed");
    within_3s(
        "its backend connection is let go (the neighbours' one stays)",
        || backend.connections() == 1,
    )
    .await;
    support::eventually("its access-log line says the client timed out", || async {
        std::fs::read_to_string(&log).is_ok_and(|text| {
            text.lines().any(|l| {
                l.contains(&format!("\"/bytes/{GIB}\"")) && l.contains("\"termination\":\"cD\"")
            })
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_streams_up_and_down_with_flat_memory() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let web = baton.addr("web");
    let pid = baton.serving_pid().await;
    let before = rss_kib(pid);

    let upload = async {
        let mut s = TcpStream::connect(web).await.expect("connect");
        let head = format!("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {GIB}\r\n\r\n");
        s.write_all(head.as_bytes()).await.expect("head");
        let block = vec![b'u'; 256 * 1024];
        for _ in 0..GIB / block.len() as u64 {
            s.write_all(&block).await.expect("upload block");
        }
        let (head, _) = read_head(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    };
    let up_peak = peak_rss_during(pid, upload).await;
    assert_eq!(backend.uploads.last_bytes.load(Ordering::Relaxed), GIB);

    let download = async {
        let mut s = TcpStream::connect(web).await.expect("connect");
        let get = format!("GET /bytes/{GIB} HTTP/1.1\r\nHost: x\r\n\r\n");
        s.write_all(get.as_bytes()).await.expect("request");
        let (head, first) = read_head(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut got = first.len() as u64;
        let mut buf = vec![0u8; 256 * 1024];
        let mut paused = false;
        while got < GIB {
            let n = s.read(&mut buf).await.expect("download");
            assert!(n > 0, "closed after {got} bytes");
            got += n as u64;
            // A reader that stops for a second: baton must stop reading
            // the backend too, not buffer what it keeps sending.
            if !paused && got > 64 << 20 {
                paused = true;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        assert_eq!(got, GIB);
    };
    let down_peak = peak_rss_during(pid, download).await;

    let limit = before + 32 * 1024;
    assert!(
        up_peak < limit && down_peak < limit,
        "RSS grew: {before} KiB idle, {up_peak} KiB peak uploading, {down_peak} KiB downloading"
    );
}

/// Waits up to 3 s for `check`: a backend connection let go because its
/// client was cut, not closed later for another reason (the idle sweep
/// closes a kept one after 4 s; a backend streaming to nobody ends its
/// body at last). A bound on time, kept for that: 3 s is far above what a
/// release takes even on a loaded machine.
async fn within_3s(what: &str, check: impl Fn() -> bool) {
    for _ in 0..150 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within 3 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_releases_its_backend_connection() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let web = baton.addr("web");

    // Waiting for the response.
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET /slow/60000 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    support::eventually("the backend works on it", || async {
        backend.active() == 1
    })
    .await;
    drop(s);
    within_3s("the backend request is cancelled", || {
        backend.active() == 0 && backend.connections() == 0
    })
    .await;

    // Halfway through an upload.
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
        .await
        .expect("head");
    s.write_all(&vec![b'u'; 1 << 20]).await.expect("some body");
    support::eventually("the backend reads the upload", || async {
        backend.active() == 1
    })
    .await;
    drop(s);
    within_3s("the upload is cut at the backend", || {
        backend.uploads.failed.load(Ordering::Relaxed) == 1 && backend.connections() == 0
    })
    .await;

    // Halfway through a download.
    let mut s = TcpStream::connect(web).await.expect("connect");
    let get = format!("GET /bytes/{GIB} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(get.as_bytes()).await.expect("request");
    let _ = read_head(&mut s).await;
    drop(s);
    within_3s("the download's backend connection closes", || {
        backend.connections() == 0
    })
    .await;
    assert_eq!(backend.uploads.completed.load(Ordering::Relaxed), 0);
}

/// An h2 upload of no stated length that its client resets midway with
/// NO_ERROR never reaches the backend as a whole request. hyper ends such
/// a request body as if it were complete (RFC 9113 §8.1 lets a server
/// stop a client's upload that way once it has answered), and the last
/// chunk went up, making the backend take the first part for all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_upload_reset_with_no_error_is_cut_at_the_backend_not_ended() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let opening = [
        support::h2_raw::opening(),
        support::h2_raw::post_on(1, "/upload"),
        support::h2_raw::data_on(1, b"the first part"),
    ]
    .concat();
    s.write_all(&opening).await.expect("write");
    support::eventually("the backend reads the upload", || async {
        backend.active() == 1
    })
    .await;
    s.write_all(&support::h2_raw::reset_with(1, 0))
        .await
        .expect("reset");
    within_3s("the upload is cut at the backend", || backend.active() == 0).await;
    assert_eq!(backend.uploads.failed.load(Ordering::Relaxed), 1);
    assert_eq!(backend.uploads.completed.load(Ordering::Relaxed), 0);
    // The connection serves on.
    support::h2_raw::round_trip(&mut s).await;
}

/// The same reset before any DATA: no backend gets the request. hyper's
/// end of the body made it a whole one with an empty body, sent at once on
/// a kept backend connection (a `PUT` that empties a file), before hyper
/// looked for the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_request_reset_with_no_error_before_its_body_reaches_no_backend() {
    use support::h2_raw;
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    // A request first, so a kept backend connection waits idle.
    s.write_all(&[h2_raw::opening(), h2_raw::get_on(1, "/")].concat())
        .await
        .expect("write");
    support::eventually(
        "the backend answered and its connection is kept",
        || async { backend.hits() == 1 && backend.active() == 0 && backend.connections() == 1 },
    )
    .await;
    s.write_all(&[h2_raw::post_on(3, "/upload"), h2_raw::reset_with(3, 0)].concat())
        .await
        .expect("write");
    h2_raw::round_trip(&mut s).await;
    // A whole upload after it, on the same connection, comes through.
    s.write_all(
        &[
            h2_raw::post_on(5, "/upload"),
            h2_raw::last_data_on(5, b"12345"),
        ]
        .concat(),
    )
    .await
    .expect("write");
    support::eventually("the whole upload reached the backend", || async {
        backend.uploads.completed.load(Ordering::Relaxed) > 0
    })
    .await;
    h2_raw::round_trip(&mut s).await;
    assert_eq!(backend.uploads.completed.load(Ordering::Relaxed), 1);
    assert_eq!(backend.uploads.last_bytes.load(Ordering::Relaxed), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_chunk_size_is_a_400_and_no_backend_gets_the_request_whole() {
    let backend = HttpBackend::start("a").await;
    let baton = baton_with(&backend, "").await;
    let web = baton.addr("web");

    // The first chunk is malformed: nothing is forwarded at all.
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
        .await
        .expect("request");
    let reply = read_until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply:?}");
    assert_eq!(backend.hits(), 0, "never forwarded");

    // A later chunk is malformed: the backend's copy is cut off, and the
    // client still hears 400 since no response had begun.
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    )
    .await
    .expect("request");
    support::eventually("the backend reads the upload", || async {
        backend.active() == 1
    })
    .await;
    s.write_all(b"-3\r\nbad\r\n0\r\n\r\n")
        .await
        .expect("bad chunk");
    let reply = read_until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply:?}");
    within_3s("the backend saw the body fail", || {
        backend.uploads.failed.load(Ordering::Relaxed) == 1
    })
    .await;
    assert_eq!(backend.uploads.completed.load(Ordering::Relaxed), 0);
    let metrics = support::client::metrics(baton.admin).await;
    assert!(
        metrics.contains("code=\"4xx\"} 2") && metrics.contains("code=\"5xx\"} 0"),
        "both counted as client errors, not upstream ones: {metrics}"
    );
    assert!(
        metrics.contains("kind=\"protocol\"} 0"),
        "no upstream error counted: {metrics}"
    );
}

/// A request body that turns bad while a response head is half written
/// (here a 103 the client is slow to take) closes the connection: a 400
/// of baton's own after it would land inside that head, the client
/// reading the start of one response and then another. HAProxy and nginx
/// never start a status line after a partial one either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_turns_bad_mid_response_closes_instead_of_answering() {
    let answer = hints_then_ok();
    // It answers once it has the head, while the body still comes.
    let backend = support::raw::RawBackend::start(move |_| {
        (answer.clone().into_bytes(), support::raw::Then::KeepAlive)
    })
    .await;
    let spec = Spec::new()
        .listener("web", "http", "app", "idle_timeout = \"10s\"")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let mut client = support::client::small_window(baton.addr("web")).await;
    client
        .write_all(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        )
        .await
        .expect("request");
    // The hints have begun to arrive.
    tokio::time::timeout(support::TIMEOUT, client.peek(&mut [0u8; 1]))
        .await
        .expect("the first hint's bytes in time")
        .expect("peek");
    // baton's write of one waits for this client, which reads nothing:
    // what baton queued for it stops growing (the backend has megabytes of
    // hints more, so a baton between two of them would queue more at once).
    let (web, me) = (
        baton.addr("web").port(),
        client.local_addr().expect("local address").port(),
    );
    let mut last = (0, std::time::Instant::now());
    support::eventually("baton's write to the client waits", || {
        let queued = support::send_queue(web, me).unwrap_or(0);
        if queued != last.0 {
            last = (queued, std::time::Instant::now());
        }
        std::future::ready(queued > 0 && last.1.elapsed() >= Duration::from_millis(300))
    })
    .await;
    client.write_all(b"zz\r\n").await.expect("a bad chunk size");
    let mut reply = Vec::new();
    let closed = tokio::time::timeout(support::TIMEOUT, client.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(closed.is_ok(), "the connection closes");
    assert!(reply.starts_with("HTTP/1.1 103 Early Hints\r\n"));
    // Bytes of the response went out: no answer of baton's own, neither
    // inside a head nor after whole ones.
    assert!(
        !reply.contains("HTTP/1.1 400"),
        "baton answered after its response began: {}",
        reply
            .get(reply.len().saturating_sub(300)..)
            .unwrap_or(&reply)
    );
    let mid_head = reply
        .match_indices("HTTP/1.1 ")
        .find(|(at, _)| *at != 0 && !reply[..*at].ends_with("\r\n\r\n"));
    assert!(
        mid_head.is_none(),
        "a status line inside a head: {}",
        &reply[reply.len().saturating_sub(300)..]
    );
}
