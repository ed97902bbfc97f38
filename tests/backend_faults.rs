//! Backends that break the exchange: one that resets in the middle of a
//! response, and a TCP backend that closes its side first and keeps
//! reading. Raw sockets here, since a well-behaved HTTP server cannot be
//! made to misbehave on cue.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::backend::HttpBackend;
use support::client::{self, read_until_closed};
use support::daemon::{Baton, Spec};

/// What a raw `GET /big` on `addr` gets until the connection closes.
async fn get_big(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    read_until_closed(&mut s).await
}

/// Answers every request with a 200 promising 1000 bytes, sends 100, then
/// resets the connection (SO_LINGER 0).
async fn resetting_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                if support::raw::read_request(&mut s, &mut Vec::new())
                    .await
                    .is_none()
                {
                    return;
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                    .await;
                let _ = s.write_all(&[b'x'; 100]).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            });
        }
    });
    addr
}

/// Passive health (README): a response head later than `response_timeout`
/// counts against the backend as a failed check would (here `fall = 1`:
/// down at once, with the next active check a minute away); a response
/// broken off midway does not (a reset may be a kept connection's end,
/// or one request's trouble), so a backend that resets stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_timeout_marks_a_backend_down_and_a_reset_does_not() {
    let checks =
        "health = { kind = \"tcp\", interval = \"60s\", timeout = \"1s\", rise = 1, fall = 1 }";
    let (silent, _holding) = support::backend::silent().await;
    let resetting = resetting_backend().await;
    let spec = Spec::new()
        .listener("slow", "http", "quiet", "response_timeout = \"300ms\"")
        .http("web", "resets")
        .pool_with("quiet", checks, &[(silent, 1)])
        .pool_with("resets", checks, &[(resetting, 1)]);
    let baton = Baton::start(spec).await;
    let answer = client::get(baton.addr("slow"), "/")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 504);
    support::eventually("the silent backend down", || async {
        client::backend_state(baton.admin, "quiet-0").await == "down"
    })
    .await;
    let cut = get_big(baton.addr("web")).await;
    assert!(cut.starts_with("HTTP/1.1 200"), "{cut}");
    // Time for a verdict that should not come.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        client::backend_state(baton.admin, "resets-0").await,
        "up",
        "a response broken off is no health verdict"
    );
}

/// A pool of one backend whose checks come every `interval`, down after
/// two failures (`fall = 2`), up after `rise` passes, behind a listener whose
/// `response_timeout` is 300 ms: `/slow/2000` is a timeout there.
async fn timing_out(interval: &str, rise: u32) -> (HttpBackend, Baton) {
    let checks = format!(
        "health = {{ kind = \"tcp\", interval = \"{interval}\", timeout = \"1s\", rise = {rise}, fall = 2 }}"
    );
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", "response_timeout = \"300ms\"")
        .pool_with("app", &checks, &[(backend.addr, 1)]);
    let baton = Baton::start(spec).await;
    (backend, baton)
}

/// The status `path` is answered with.
async fn status_of(web: SocketAddr, path: &str) -> u16 {
    client::get(web, path).await.expect("an answer").status
}

/// Failures of real traffic take a backend down only `fall` in a row: an
/// answer between two response timeouts counts them from zero again. A
/// few slow requests among thousands answered (an export, a long poll)
/// took every backend down in turn, as they landed between two checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_failures_count_only_in_a_row() {
    let (_backend, baton) = timing_out("60s", 1).await;
    let web = baton.addr("web");
    for _ in 0..3 {
        assert_eq!(status_of(web, "/slow/2000").await, 504);
        assert_eq!(
            status_of(web, "/").await,
            200,
            "an answer between: still up"
        );
    }
    assert_eq!(status_of(web, "/slow/2000").await, 504);
    assert_eq!(status_of(web, "/slow/2000").await, 504);
    assert_eq!(
        client::backend_state(baton.admin, "app-0").await,
        "down",
        "two in a row"
    );
    assert_eq!(status_of(web, "/").await, 503);
}

/// An answer counts when its head comes, not when its body ends: a
/// long response (an event stream here) whose head came before two
/// timeouts in a row does not take them back as it ends. Counted at the
/// body's end, it did, and a backend that stopped answering stayed up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_counts_at_its_head_not_at_its_end() {
    let (_backend, baton) = timing_out("60s", 1).await;
    let web = baton.addr("web");
    let mut events = TcpStream::connect(web).await.expect("connect");
    events
        .write_all(b"GET /sse HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .expect("write");
    let mut head = [0u8; 64];
    let n = events.read(&mut head).await.expect("the head");
    assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &head[..n]);
    assert_eq!(status_of(web, "/slow/2000").await, 504);
    drop(events);
    // The stream's end, seen at its next event (every 100 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status_of(web, "/slow/2000").await, 504);
    assert_eq!(
        client::backend_state(baton.admin, "app-0").await,
        "down",
        "two timeouts in a row since the last head"
    );
}

/// Failures of requests still in flight when a backend went down are not
/// left over for when its checks bring it back: it goes down again only
/// after `fall` new ones in a row. A burst of timeouts left some counted,
/// and the next single one took it down. (Two rules keep them apart, each
/// enough for this burst: failures while down are not counted, and the
/// count starts from zero when the checks bring it back; the test fails
/// with both broken.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_past_a_backends_fall_are_not_left_over_for_its_return() {
    // Back only after two checks, a second apart (0.9 s at least, with
    // their jitter): never within the burst, whose third request is sent
    // 50 ms after the first two are at the backend, so that it fails
    // while the backend is down (after the fall, not racing the two that
    // make it), and is given the backend before their 300 ms run out (a
    // fixed 100 ms pause from their start left a loaded machine little of
    // that).
    let (backend, baton) = timing_out("1s", 2).await;
    let web = baton.addr("web");
    let mut burst: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { client::get(web, "/slow/2000").await }))
        .collect();
    support::eventually("the first two at the backend", || async {
        backend.active() == 2
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    burst.push(tokio::spawn(
        async move { client::get(web, "/slow/2000").await },
    ));
    for answer in burst {
        assert_eq!(answer.await.expect("join").expect("an answer").status, 504);
    }
    assert_eq!(
        client::backend_state(baton.admin, "app-0").await,
        "down",
        "the burst took it down"
    );
    support::eventually("back up through its checks", || async {
        client::backend_state(baton.admin, "app-0").await == "up"
    })
    .await;
    assert_eq!(
        client::get(web, "/slow/2000")
            .await
            .expect("an answer")
            .status,
        504
    );
    // Read in the log, where checks bringing it back cannot hide a second
    // fall.
    let log = baton.log();
    let downs = log
        .lines()
        .filter(|l| l.contains("backend is down") && l.contains("backend=app-0"))
        .count();
    assert_eq!(downs, 1, "one failure since it came back: {log}");
}

/// A backend that never answers the handshake (its SYNs dropped: here a
/// listen queue of two, full) costs a request `connect_timeout`, not the
/// kernel's two minutes of SYN retries (and the listener's 3 s here, not
/// the default 2 s): answered 502 as a refused connect is, and counted as
/// a connect failure against that backend (README).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_answers_the_handshake_is_given_up_at_connect_timeout() {
    let full =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    full.bind(&any.into()).expect("bind");
    full.listen(1).expect("listen");
    let addr = full
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("address");
    let mut fillers = Vec::new();
    for _ in 0..2 {
        let filler = tokio::time::timeout(support::TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("a place in the queue in time")
            .expect("connect");
        fillers.push(filler);
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr))
            .await
            .is_err(),
        "the full queue drops a handshake"
    );
    let spec = Spec::new()
        .listener("web", "http", "app", "connect_timeout = \"3s\"")
        .pool("app", &[addr]);
    let baton = Baton::start(spec).await;
    let asked = std::time::Instant::now();
    let answer = tokio::time::timeout(support::TIMEOUT, client::get(baton.addr("web"), "/"))
        .await
        .expect("answered at connect_timeout")
        .expect("an answer");
    assert_eq!(answer.status, 502, "{}", answer.body);
    assert!(
        asked.elapsed() >= Duration::from_millis(2900),
        "the listener's connect_timeout: {:?}",
        asked.elapsed()
    );
    let metrics = client::metrics(baton.admin).await;
    let series = "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"connect\"}";
    assert!(
        client::series(&metrics, series).is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_reset_mid_response_aborts_the_client_connection_and_is_counted() {
    let healthy = HttpBackend::start("ok").await;
    let resetting = resetting_backend().await;
    let baton = Baton::start(
        Spec::new()
            .http("web", "app")
            .pool("app", &[resetting])
            .http("other", "fine")
            .pool("fine", &[healthy.addr]),
    )
    .await;
    let reply = get_big(baton.addr("web")).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    assert!(
        body.len() < 1000,
        "the client sees the response cut short ({} bytes), never a complete one",
        body.len()
    );
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"protocol\"} 1"
        ),
        "{metrics}"
    );
    let fine = client::get(baton.addr("other"), "/after")
        .await
        .expect("other traffic");
    assert_eq!(fine.status, 200);
}

/// An HTTP/1.0 client's response body has no framing but the connection's
/// end: one the backend breaks off ends the client's connection with a
/// reset, where a close (or TLS's close_notify) passed the cut body off as
/// the whole of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_broken_off_on_its_way_to_an_http_1_0_client_ends_in_a_reset() {
    let breaking = support::raw::RawBackend::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
            support::raw::Then::Close,
        )
    })
    .await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[breaking.addr])).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n")
        .await
        .expect("request");
    let mut got = Vec::new();
    let read = tokio::time::timeout(support::TIMEOUT, s.read_to_end(&mut got))
        .await
        .expect("ended in time");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
    assert!(
        read.is_err(),
        "a reset, not an end: {read:?} after {text:?}"
    );
}

/// Sends a greeting and its FIN at once, then reads until the client's FIN
/// and reports what it read.
async fn early_closing_backend() -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let _ = s.write_all(b"hello, then FIN").await;
        let _ = s.shutdown().await;
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got).await;
        let _ = tx.send(got);
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_backend_that_closes_first_still_hears_the_client() {
    let (backend, heard) = early_closing_backend().await;
    let baton = Baton::start(Spec::new().tcp("raw", "b").pool("b", &[backend])).await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    let mut greeting = Vec::new();
    tokio::time::timeout(support::TIMEOUT, s.read_to_end(&mut greeting))
        .await
        .expect("the backend's FIN reaches the client")
        .expect("read");
    assert_eq!(greeting, b"hello, then FIN");
    s.write_all(b"client speaks after the backend's FIN")
        .await
        .expect("the client's side is still open");
    s.shutdown().await.expect("client FIN");
    let heard = tokio::time::timeout(support::TIMEOUT, heard)
        .await
        .expect("the backend hears the client's FIN")
        .expect("backend report");
    assert_eq!(heard, b"client speaks after the backend's FIN");
}

/// In TCP mode a backend that resets the tunnel is the backend's failure:
/// counted against it (`baton_upstream_errors_total`), not taken for the
/// client's abort; and the client is reset too, after every byte the
/// backend sent before its reset: a FIN would pass the cut stream off as
/// a whole one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_reset_in_tcp_mode_is_the_backends_failure_and_resets_the_client() {
    let resetting = resetting_backend().await;
    let baton = Baton::start(
        Spec::new()
            .listener("raw", "tcp", "app", "")
            .pool("app", &[resetting]),
    )
    .await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let (got, ended) = support::read_to_the_end(&mut s).await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert_eq!(
        got.split_once("\r\n\r\n").map(|(_, body)| body.len()),
        Some(100),
        "every byte the backend sent before its reset: {got:?}"
    );
    assert_eq!(ended, Err(std::io::ErrorKind::ConnectionReset));
    let counted = "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"protocol\"} 1";
    support::eventually("the reset counted against the backend", || async {
        client::metrics(baton.admin).await.contains(counted)
    })
    .await;
}

/// A client that resets its TCP-mode connection resets the backend's too,
/// once the backend has read what the client sent before: a FIN would
/// tell the backend the client finished (a database would commit what it
/// was sent), where the client aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_in_tcp_mode_resets_the_backend() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let backend = listener.local_addr().expect("addr");
    const SENT: &[u8] = b"BEGIN; half of a transaction";
    let (read_tx, read) = tokio::sync::oneshot::channel();
    let (heard_tx, heard) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let mut got = [0u8; SENT.len()];
        let _ = read_tx.send(s.read_exact(&mut got).await.map(|_| got));
        let _ = heard_tx.send(support::read_to_the_end(&mut s).await);
    });
    let baton = Baton::start(Spec::new().tcp("raw", "b").pool("b", &[backend])).await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    s.write_all(SENT).await.expect("write");
    let read = tokio::time::timeout(support::TIMEOUT, read)
        .await
        .expect("the backend reads what the client sent")
        .expect("backend report")
        .expect("read");
    assert_eq!(read, SENT);
    support::reset(s);
    let (more, ended) = tokio::time::timeout(support::TIMEOUT, heard)
        .await
        .expect("the backend's connection ends")
        .expect("backend report");
    assert_eq!(more, b"");
    assert_eq!(ended, Err(std::io::ErrorKind::ConnectionReset));
}

/// A TCP connection whose backend refuses it is a connect failure, not "no
/// backend", even when that failure takes the pool's last backend down
/// (passive health, `fall = 1`); the next connection, which finds none
/// up, is "no backend". Before, TCP counted by the pool's health after the
/// failure and said "no backend" for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_connect_failure_that_takes_the_last_backend_down_is_not_no_backend() {
    // A listener the test holds and closes at once (the kernel completes
    // the health check's handshakes for it): dropped, its port refuses.
    let listening = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = listening.local_addr().expect("addr");
    let checks =
        "health = { kind = \"tcp\", interval = \"60s\", timeout = \"1s\", rise = 1, fall = 1 }";
    let baton = Baton::start(Spec::new().listener("raw", "tcp", "app", "").pool_with(
        "app",
        checks,
        &[(gone, 1)],
    ))
    .await;
    drop(listening);
    let refused = "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"connect\"} 1";
    let no_backend = "baton_no_backend_total{listener=\"raw\",pool=\"app\"}";
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    assert_eq!(read_until_closed(&mut s).await, "", "closed, nothing said");
    support::eventually("the refused connect counted", || async {
        client::metrics(baton.admin).await.contains(refused)
    })
    .await;
    let metrics = client::metrics(baton.admin).await;
    assert!(
        !metrics.contains(&format!("{no_backend} 1")),
        "a connect failure is not \"no backend\":\n{metrics}"
    );
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    assert_eq!(read_until_closed(&mut s).await, "");
    support::eventually("the next connection found no backend", || async {
        client::metrics(baton.admin)
            .await
            .contains(&format!("{no_backend} 1"))
    })
    .await;
}

/// A failed connect is retried once, on another backend, not on each
/// (README): with three dead backends a request costs two connects, not
/// three `connect_timeout`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connect_is_retried_once_not_on_every_backend() {
    let dead: Vec<_> = (0..3).map(|_| support::daemon::dead_addr()).collect();
    let addrs: Vec<SocketAddr> = dead.iter().map(|(a, _)| *a).collect();
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &addrs)).await;
    let answer = client::get(baton.addr("web"), "/").await.expect("answered");
    assert_eq!(answer.status, 502);
    let metrics = client::metrics(baton.admin).await;
    let connects: f64 = (0..3)
        .filter_map(|i| {
            let series = format!(
                "baton_upstream_errors_total{{pool=\"app\",backend=\"app-{i}\",kind=\"connect\"}}"
            );
            client::series(&metrics, &series)
        })
        .sum();
    assert_eq!(connects, 2.0, "{metrics}");
}

/// A backend that takes connections and drops them unanswered (a dead
/// application behind a listener that still accepts) beside a good one: a
/// GET it drops is sent to the other, once, as after a failed connect
/// (nginx's `proxy_next_upstream error`), over HTTP/1 and h2; a POST with
/// a body, which may have been acted on, is not. Half the GETs got a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_a_new_connection_dropped_unanswered_goes_to_another_backend() {
    let dropping =
        support::raw::RawBackend::start(|_| (Vec::new(), support::raw::Then::Close)).await;
    let good = HttpBackend::start("a").await;
    // One worker: its round robin alternates, so every other POST meets
    // the dropping backend.
    let spec = Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool("app", &[dropping.addr, good.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    for i in 0..10 {
        let answer = client::get(web, &format!("/r/{i}"))
            .await
            .expect("answered");
        assert_eq!(answer.status, 200, "HTTP/1 GET {i}");
    }
    let mut h2 = client::h2::<http_body_util::Empty<bytes::Bytes>>(web).await;
    for i in 0..10 {
        let req = hyper::Request::get(format!("http://{web}/r/{i}"))
            .body(http_body_util::Empty::new())
            .expect("request");
        let answer = h2.send_request(req).await.expect("h2 answer");
        assert_eq!(answer.status(), 200, "h2 GET {i}");
    }
    assert!(
        dropping.accepted() >= 10,
        "the dropping backend had its share"
    );
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(web).await.expect("connect");
        s.write_all(
            b"POST /r HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        )
        .await
        .expect("request");
        let answer = read_until_closed(&mut s).await;
        statuses.push(answer.get(9..12).unwrap_or("").to_string());
    }
    statuses.sort();
    assert_eq!(statuses, ["200", "502"], "a POST is not sent again");
}

/// Every request to a dead backend of a pool without health checks fails
/// the same way: its lines are logged ten a second at most, and how many
/// were held back is said once their second is over (unbounded, two lines
/// a request filled the journal, whose own rate limit then dropped
/// baton's other lines, and stderr is written in the worker's thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backends_failures_are_logged_within_a_budget() {
    // Two: each request is tried on both (a retry line, then the rest).
    let (dead, _reserved) = support::daemon::dead_addr();
    let (other, _also) = support::daemon::dead_addr();
    // Two workers: one budget a process, not a worker.
    let baton = Baton::start(
        Spec::new()
            .top("workers = 2")
            .http("web", "app")
            .pool("app", &[dead, other]),
    )
    .await;
    let web = baton.addr("web");
    const REQUESTS: usize = 200;
    let started = std::time::Instant::now();
    for i in 0..REQUESTS {
        let answer = client::get(web, &format!("/{i}")).await.expect("answered");
        assert_eq!(answer.status, 502, "{answer:?}");
    }
    let seconds = started.elapsed().as_secs() as usize + 1;
    // At WARN, as some of the lines it stands for: a log kept at WARN
    // says that more were held back.
    support::eventually("the held-back lines counted", || async {
        baton
            .log()
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("lines about backends' faults held back"))
    })
    .await;
    let log = baton.log();
    let lines = log
        .lines()
        .filter(|l| {
            [
                "backend request failed",
                "sending it to another backend",
                "answered with an error",
            ]
            .iter()
            .any(|said| l.contains(said))
        })
        .count();
    assert!(lines > 0, "some are logged:\n{log}");
    assert!(
        lines <= 10 * seconds,
        "{lines} lines for {REQUESTS} failed requests in under {seconds} s:\n{log}"
    );
}

/// The request id an error page gives the client is in baton's log on the
/// line that names the backend and why it failed (a refused connect, then
/// the retry on the other backend, and its failure too): what a user
/// reports leads to the cause, not only to "answered with an error".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_pages_request_id_leads_to_the_backends_failure() {
    let (dead, _held) = support::daemon::dead_addr();
    let (also_dead, _also_held) = support::daemon::dead_addr();
    let spec = Spec::new()
        .http("web", "app")
        .pool("app", &[dead, also_dead]);
    let baton = Baton::start(spec).await;
    let answer = client::get(baton.addr("web"), "/").await.expect("answered");
    assert_eq!(answer.status, 502, "{answer:?}");
    let id = answer.page_request_id();
    support::eventually("both failures said under the page's id", || async {
        let log = baton.log();
        let ours = |l: &&str| l.contains(&format!("request_id={id} ")) && l.contains("refused");
        let (retried, gave_up): (Vec<&str>, Vec<&str>) = log
            .lines()
            .filter(ours)
            .filter(|l| l.contains("backend request failed"))
            .partition(|l| l.contains("sending it to another backend"));
        retried.len() == 1 && gave_up.len() == 1
    })
    .await;
}

/// A TCP session whose first backend refuses says so as the HTTP path
/// does: the failure with the other backend still to try, then the last
/// failure (it said "backend request failed" twice, as if it gave up at
/// the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_sessions_failed_connect_says_another_backend_is_tried() {
    let (dead, _held) = support::daemon::dead_addr();
    let (also_dead, _also_held) = support::daemon::dead_addr();
    let spec = Spec::new()
        .tcp("raw", "app")
        .pool("app", &[dead, also_dead]);
    let baton = Baton::start(spec).await;
    let mut session = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    assert_eq!(read_until_closed(&mut session).await, "");
    support::eventually("both failures said", || async {
        let log = baton.log();
        let (retried, gave_up): (Vec<&str>, Vec<&str>) = log
            .lines()
            .filter(|l| l.contains("backend request failed") && l.contains("refused"))
            .partition(|l| l.contains("sending it to another backend"));
        retried.len() == 1 && gave_up.len() == 1
    })
    .await;
}

/// A backend that sends 1xx (102 Processing) without end, faster than its
/// client takes them: its `response_timeout` is put off for the 1xx being
/// written when it ran out (the client's to take: its own stall clock
/// judges that), and when it runs out again during another, the exchange
/// ends and both connections close (a 504 cannot follow a head cut in
/// two; charged to no one, as a client reading a few 1xx slowly looks the
/// same). The clock was put off at every turn, and the client got 1xx for
/// as long as the backend went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_sending_interim_responses_without_end_is_cut_off() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let backend = listener.local_addr().expect("addr");
    let cut_off = std::sync::Arc::new(tokio::sync::Notify::new());
    let told = std::sync::Arc::clone(&cut_off);
    tokio::spawn(async move {
        let chunk = "HTTP/1.1 102 Processing\r\n\r\n".repeat(1000);
        while let Ok((mut s, _)) = listener.accept().await {
            let (chunk, told) = (chunk.clone(), std::sync::Arc::clone(&told));
            tokio::spawn(async move {
                let mut head = Vec::new();
                let _ = support::raw::read_request(&mut s, &mut head).await;
                while s.write_all(chunk.as_bytes()).await.is_ok() {}
                told.notify_one();
            });
        }
    });
    let spec = Spec::new()
        .listener("web", "http", "app", "response_timeout = \"1s\"")
        .pool("app", &[backend]);
    let baton = Baton::start(spec).await;
    let mut client = client::small_window(baton.addr("web")).await;
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    // Slower than loopback: baton's writes wait for it, and one is under
    // way whenever the clock runs out. Bounded: 30 s at most.
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 16 * 1024];
        for _ in 0..3000 {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    });
    let closed = tokio::time::timeout(support::TIMEOUT, cut_off.notified()).await;
    reader.abort();
    assert!(closed.is_ok(), "the backend's 1xx went on for 20 s");
    // Not blamed: the clock ran out while a 1xx was being written (it
    // always is, the backend's bytes always waiting for the client).
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"timeout\"} 0"
        ),
        "{metrics}"
    );
}
