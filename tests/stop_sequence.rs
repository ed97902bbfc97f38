//! The ordered stop on SIGTERM: readiness flips while traffic is still
//! served through the pre-stop pause, queued connections are served before
//! the doors close, keep-alive and h2 connections finish cleanly, long-lived
//! streams end at once and cleanly, and the exit code tells the truth.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{signal, wait_exit, Baton, NoFreeFd, Notifications, Spec};
use support::raw::{self, RawBackend, Then};

fn spec(shutdown: &str, backend: &HttpBackend, listener_extra: &str) -> Spec {
    Spec::default()
        .section(&format!("[shutdown]\n{shutdown}\n"))
        .listener("web", "http", "app", listener_extra)
        .pool("app", &[backend.addr])
}

/// No pre-stop pause and a drain budget no test waits out, before the
/// backend at `backend`.
fn sixty_seconds_to_drain(backend: std::net::SocketAddr) -> Spec {
    Spec::default()
        .section("[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"60s\"\n")
        .listener("web", "http", "app", "")
        .pool("app", &[backend])
}

fn assert_no_error_lines(baton: &Baton) {
    let log = baton.log();
    assert!(
        !log.contains("ERROR"),
        "a clean drain logs no ERROR:\n{log}"
    );
}

/// The long-lived streams a drain ended are said once, at INFO, with
/// their count by kind (`counts`, e.g. "websockets=3"), as the idle
/// closes are: a line each would be 10,000 lines at a reload.
fn said_long_lived_ended(baton: &Baton, counts: &str) {
    let log = baton.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ended long-lived stream") || l.contains("ended event stream"))
        .collect();
    assert_eq!(
        said.len(),
        1,
        "one line for the drain's long-lived ends:\n{log}"
    );
    assert!(
        said[0].contains("INFO")
            && said[0].contains("ended long-lived streams for the drain")
            && said[0].contains(counts)
            && said[0].contains("expected=true"),
        "{}",
        said[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_flips_first_and_traffic_is_served_through_the_pre_stop_pause() {
    let backend = HttpBackend::start("a").await;
    // Long enough for the look at /readyz, a request and /healthz on a
    // loaded machine.
    let baton = Baton::start(spec(
        "pre_stop_delay = \"4s\"\ndrain_timeout = \"10s\"",
        &backend,
        "",
    ))
    .await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    signal(baton.first_pid, Signal::SIGTERM);
    support::eventually("/readyz says draining", || async {
        client::get(admin, "/readyz")
            .await
            .is_ok_and(|a| a.status == 503 && a.body.contains("\"draining\""))
    })
    .await;
    // Still within the pause: new connections are accepted and served, and
    // liveness holds.
    let served = client::get(web, "/during-pre-stop")
        .await
        .expect("served during the pause");
    assert_eq!(served.status, 200);
    assert_eq!(
        client::get(admin, "/healthz")
            .await
            .expect("healthz")
            .status,
        200
    );
    support::eventually("doors closed after the pause", || async {
        TcpStream::connect(web).await.is_err()
    })
    .await;
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
    assert_no_error_lines(&baton);
}

/// A SIGHUP (or SIGUSR2) during the pre-stop pause does not end it: the
/// load balancer in front may still send traffic, and it is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_signal_does_not_cut_the_pre_stop_pause_short() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"6s\"\ndrain_timeout = \"10s\"",
        &backend,
        "",
    ))
    .await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    signal(baton.first_pid, Signal::SIGTERM);
    // The stop heard first: the pause began.
    support::eventually("/readyz says draining", || async {
        client::get(admin, "/readyz")
            .await
            .is_ok_and(|a| a.status == 503 && a.body.contains("\"draining\""))
    })
    .await;
    signal(baton.first_pid, Signal::SIGHUP);
    signal(baton.first_pid, Signal::SIGUSR2);
    support::eventually("both heard and ignored", || async {
        baton
            .log()
            .matches("ignored: this generation is stopping")
            .count()
            == 2
    })
    .await;
    let served = client::get(web, "/still-in-the-pause")
        .await
        .expect("served: the doors are still open");
    assert_eq!(served.status, 200);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

/// `n` connections to `web`, each with its request (`/queued/I`) sent.
async fn queue_requests(web: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut queued = Vec::new();
    for i in 0..n {
        let mut s = TcpStream::connect(web).await.expect("queued connect");
        s.write_all(
            format!("GET /queued/{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        queued.push(s);
    }
    queued
}

/// Each of [`queue_requests`]' connections gets its whole answer from
/// backend "a", none is reset.
async fn each_served_whole(queued: Vec<TcpStream>) {
    for (i, mut s) in queued.into_iter().enumerate() {
        let mut reply = String::new();
        tokio::time::timeout(support::TIMEOUT, s.read_to_string(&mut reply))
            .await
            .expect("in time")
            .expect("no reset");
        assert!(reply.starts_with("HTTP/1.1 200"), "queued {i}: {reply:?}");
        assert!(
            reply.ends_with(&HttpBackend::body_for("a", &format!("/queued/{i}"))),
            "{reply:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_connections_are_served_before_the_listener_closes() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"10s\"",
        &backend,
        "max_connections = 1",
    ))
    .await;
    let web = baton.addr("web");
    // One open connection takes the only slot, so the next ones wait in the
    // kernel's accept queue with their requests already sent.
    let mut holder = client::connect(web).await.expect("holder");
    assert_eq!(
        client::send(&mut holder, web, "/hold")
            .await
            .expect("holder request")
            .status,
        200
    );
    let queued = queue_requests(web, 10).await;
    // All ten in, requests sent: in the accept queues (or one in a second
    // shard's hands, waiting for the holder's place).
    baton.until_connected("web", 11).await;
    assert_eq!(
        backend.hits.load(Ordering::Relaxed),
        1,
        "the queued requests wait in the backlog"
    );

    signal(baton.first_pid, Signal::SIGTERM);
    each_served_whole(queued).await;
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
    assert_no_error_lines(&baton);
}

/// A stop that finds no fd free for its accept queue (a full fd table)
/// serves the queue as fds free up, within the drain, instead of closing
/// the socket on it, which resets every client in it. Here the fds come
/// free when the test lifts the limit, once the drain has begun. A client
/// that connects meanwhile is refused, as after any stop's doors close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_met_with_no_fd_free_at_the_stop_is_served_as_fds_free_up() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(
        spec(
            "pre_stop_delay = \"-1s\"\ndrain_timeout = \"10s\"",
            &backend,
            "",
        )
        .top("workers = 1"),
    )
    .await;
    let (pid, web) = (baton.first_pid, baton.addr("web"));
    let held = NoFreeFd::hold(pid);
    let queued = queue_requests(web, 3).await;
    support::eventually("the accept loop ran short of fds", || async {
        baton.log().contains("accept failed; backing off")
    })
    .await;
    signal(pid, Signal::SIGTERM);
    support::eventually("the doors closed and the drain began", || async {
        baton.log().contains("drain started")
    })
    .await;
    // Arriving now, past the doors, it joins no queue (whose socket stays
    // open for the wait): refused once the socket closes, where joining
    // the queue beyond what is served would have it reset.
    let late = tokio::spawn(TcpStream::connect(web));
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(held);
    each_served_whole(queued).await;
    assert_eq!(wait_exit(pid).await, Some(0), "{}", baton.log());
    let refused = tokio::time::timeout(support::TIMEOUT, late)
        .await
        .expect("in time")
        .expect("join")
        .map(|_| "connected");
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
}

/// Every notice to systemd leaves by one socket made at the start: a
/// generation whose fd table is full (a loaded one, just when it hands
/// over) still tells systemd. A socket made for each notice could not be
/// made then, and a reload's `MAINPID=` lost had systemd end the service
/// when the old generation exited; here, the stop's `STOPPING=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_without_a_free_fd_still_tells_systemd() {
    let notifications = Notifications::listen();
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
    let baton = Baton::spawn_under(spec, &[], &["env", &notifications.env]);
    baton.wait_ready().await;
    let pid = baton.first_pid;
    let held = NoFreeFd::hold(pid);
    notifications.mark("MARK");
    signal(pid, Signal::SIGTERM);
    // `STOPPING=1` comes first of all; the fds come back for the rest.
    support::eventually("the doors closed and the drain began", || async {
        baton.log().contains("drain started")
    })
    .await;
    drop(held);
    assert_eq!(wait_exit(pid).await, Some(0), "{}", baton.log());
    let said = notifications.said().await;
    let marked = said.iter().position(|s| s == "MARK");
    let stopping = said
        .iter()
        .rposition(|s| s.lines().any(|l| l == "STOPPING=1"));
    assert!(
        matches!((marked, stopping), (Some(m), Some(s)) if s > m),
        "no STOPPING=1 once the fds ran out: {said:?}\n{}",
        baton.log()
    );
}

/// A client that connected but has yet to send its request as the stop
/// begins is in no accept queue: the kernel holds it back until its first
/// bytes (`defer_accept`, on by default for HTTP). With no pre-stop pause
/// it is still served when it speaks: the stop ends the deferral and keeps
/// the doors open until the kernel has queued every connection it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_yet_to_speak_as_the_stop_begins_is_served_when_it_does() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"10s\"",
        &backend,
        // It speaks once the drain began: a connection that never spoke
        // is closed after the grace, and a loaded machine may be slow.
        "keepalive_drain_grace = \"5s\"",
    ))
    .await;
    let quiet = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    signal(baton.first_pid, Signal::SIGTERM);
    // It speaks only once the doors closed: the hardest moment.
    support::eventually("the doors closed and the drain started", || async {
        baton.log().contains("drain started")
    })
    .await;
    support::served_when_it_speaks(quiet).await;
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
    assert_no_error_lines(&baton);
}

/// A client that connects during the pre-stop pause, in the last second
/// before the doors close, and speaks only once they closed, is served:
/// the stop ended the deferral as it began, so its connection was queued
/// (and accepted) as its handshake completed, not held back past the
/// close (the kernel queues a silent one at the first SYN-ACK
/// retransmission, 1 s after its handshake).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connecting_late_in_the_pause_is_served_after_the_doors_close() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"3s\"\ndrain_timeout = \"10s\"",
        &backend,
        "keepalive_drain_grace = \"5s\"",
    ))
    .await;
    let signalled = tokio::time::Instant::now();
    signal(baton.first_pid, Signal::SIGTERM);
    // Under a second before the doors close, as a deferral left running
    // would queue it only a second after its handshake, past them.
    tokio::time::sleep_until(signalled + Duration::from_millis(2400)).await;
    let late = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect in the pause");
    support::eventually("the doors closed and the drain started", || async {
        baton.log().contains("drain started")
    })
    .await;
    support::served_when_it_speaks(late).await;
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_finish_cleanly() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"1s\"\ndrain_timeout = \"10s\"",
        &backend,
        "keepalive_drain_grace = \"3s\"",
    ))
    .await;
    let web = baton.addr("web");
    let mut busy = client::connect(web).await.expect("busy client");
    let mut idle = client::connect(web).await.expect("idle client");
    assert_eq!(
        client::send(&mut idle, web, "/idle/1")
            .await
            .expect("idle first")
            .status,
        200
    );
    signal(baton.first_pid, Signal::SIGTERM);
    // Back-to-back on one connection: every request answered, until one
    // answer says `Connection: close` once the drain begins.
    let mut n = 0;
    loop {
        n += 1;
        let a = client::send(&mut busy, web, &format!("/busy/{n}"))
            .await
            .expect("no request fails through the drain");
        assert_eq!(a.status, 200);
        if a.headers.get("connection").is_some_and(|v| v == "close") {
            break;
        }
        assert!(n < 100_000, "never told to close");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The idle connection is within its grace: a request on it is answered.
    let late = client::send(&mut idle, web, "/idle/2")
        .await
        .expect("idle connection still answers within the grace");
    assert_eq!(
        late.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
    assert_no_error_lines(&baton);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_grace() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"30s\"",
        &backend,
        "keepalive_drain_grace = \"500ms\"",
    ))
    .await;
    let web = baton.addr("web");
    let mut idle = client::connect(web).await.expect("connect");
    assert_eq!(
        client::send(&mut idle, web, "/one")
            .await
            .expect("request")
            .status,
        200
    );
    signal(baton.first_pid, Signal::SIGTERM);
    support::eventually("idle connection closed", || async { idle.is_closed() }).await;
    assert_eq!(
        wait_exit(baton.first_pid).await,
        Some(0),
        "exits long before its 30s budget"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_stream_completes_after_goaway() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"10s\"",
        &backend,
        "",
    ))
    .await;
    let web = baton.addr("web");
    let stream = TcpStream::connect(web).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2");
    let conn = tokio::spawn(conn);
    let req = hyper::Request::get(format!("http://{web}/slow/1500"))
        .body(Empty::<Bytes>::new())
        .expect("req");
    let slow = tokio::spawn(sender.send_request(req));
    support::eventually("stream reached the backend", || async {
        backend.hits.load(Ordering::Relaxed) == 1
    })
    .await;
    signal(baton.first_pid, Signal::SIGTERM);
    let resp = slow
        .await
        .expect("join")
        .expect("the open stream completes");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body, HttpBackend::body_for("a", "/slow/1500").as_bytes());
    // GOAWAY: the connection ends once its streams are done.
    let ended = tokio::time::timeout(support::TIMEOUT, conn)
        .await
        .expect("connection ends");
    assert!(ended.expect("join").is_ok(), "a clean h2 shutdown");
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

/// A response an h2c client is still taking when its stream ends is whole
/// after a drain: the connection closed once h2 had written everything to
/// the kernel, and with the client's frames unread (a real client sends
/// WINDOW_UPDATEs and PINGs as it reads, and answers the server's, which
/// lets h2's graceful close end at the last frame written) the close was
/// a reset, which threw away what the kernel still held for the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_response_still_being_read_is_whole_after_a_drain() {
    const SIZE: usize = 4 << 20;
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(sixty_seconds_to_drain(backend.addr)).await;
    let mut s = support::h2_raw::small_window_reader(baton.addr("web")).await;
    s.write_all(&support::h2_raw::get(&format!("/bytes/{SIZE}")))
        .await
        .expect("request");
    let mut got = vec![0u8; 4096];
    s.read_exact(&mut got)
        .await
        .expect("the server's first frames");
    signal(baton.first_pid, Signal::SIGTERM);
    let ended = support::h2_raw::read_while_pinging(&mut s, &mut got, SIZE).await;
    assert!(ended.is_ok(), "a close, not a reset: {ended:?}");
    assert_eq!(support::h2_raw::data_of_stream_1(&got), SIZE);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

/// An idle h2c connection whose client answers nothing (gone, or not
/// reading a pooled connection it does not use) is closed once it has
/// stayed idle through `keepalive_drain_grace` of the drain, as an idle
/// HTTP/1 one is: h2's own graceful close waits for an answer to its PING,
/// which held the drain to its deadline and made the stop a forced one
/// (exit 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2c_connection_that_answers_nothing_does_not_hold_the_drain() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"5s\"",
        &backend,
        "",
    ))
    .await;
    let mut silent = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    silent.write_all(PREFACE).await.expect("preface");
    silent.write_all(SETTINGS).await.expect("settings");
    // Served: the connection is an h2c one baton holds (it answers the
    // SETTINGS), and from here on the client reads and answers nothing.
    let mut first = [0u8; 9];
    silent
        .read_exact(&mut first)
        .await
        .expect("baton's SETTINGS");
    assert_eq!(first[3], 4, "a SETTINGS frame");
    signal(baton.first_pid, Signal::SIGTERM);
    assert_eq!(
        wait_exit(baton.first_pid).await,
        Some(0),
        "drained, not forced at the deadline"
    );
    // Before the close, the last GOAWAY named the last stream served
    // (none: 0), not only the first's "any" (2^31 - 1): a request the
    // client sent meanwhile is known unserved, to send again.
    let mut told = Vec::new();
    let _ = silent.read_to_end(&mut told).await;
    let settings_left = u32::from_be_bytes([0, first[0], first[1], first[2]]) as usize;
    let last_named = goaways(&told[settings_left.min(told.len())..]);
    assert_eq!(last_named, [(1 << 31) - 1, 0], "{told:?}");
}

/// The last stream each GOAWAY in `frames` (a server's, from a frame's
/// start) names.
fn goaways(frames: &[u8]) -> Vec<u32> {
    const GOAWAY: u8 = 7;
    support::h2_raw::frames_of(frames)
        .into_iter()
        .filter(|(kind, _, payload)| *kind == GOAWAY && payload.len() >= 4)
        .map(|(_, _, p)| u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff)
        .collect()
}

/// A connection's h2 streams are not connections: a reload that drains
/// one h2c connection with three streams in flight counts one drained
/// connection (it counted four).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_h2c_connection_counts_once_whatever_its_streams() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec("drain_timeout = \"10s\"", &backend, "")).await;
    let web = baton.addr("web");
    let stream = TcpStream::connect(web).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2");
    let conn = tokio::spawn(conn);
    let slow: Vec<_> = (0..3)
        .map(|_| {
            let mut sender = sender.clone();
            let req = hyper::Request::get(format!("http://{web}/slow/1500"))
                .body(Empty::<Bytes>::new())
                .expect("req");
            tokio::spawn(async move { sender.send_request(req).await })
        })
        .collect();
    support::eventually("three streams at the backend", || async {
        backend.hits.load(Ordering::Relaxed) == 3
    })
    .await;
    let old = baton.serving_pid().await;
    baton.reload_ok().await;
    for s in slow {
        assert_eq!(s.await.expect("join").expect("answer").status(), 200);
    }
    assert_eq!(wait_exit(old).await, Some(0));
    let counted = "baton_drained_connections_total{reason=\"reload\"} 1";
    support::eventually("one drained connection counted", || async {
        client::metrics(baton.admin).await.contains(counted)
    })
    .await;
    conn.abort();
}

/// A masked client text frame.
fn ws_frame(payload: &[u8]) -> Vec<u8> {
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x81, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// A WebSocket through baton to the echoing backend, which has echoed a
/// frame.
async fn echoing_websocket(web: std::net::SocketAddr) -> TcpStream {
    let (mut s, head) = client::upgraded(web, "websocket").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let frame = ws_frame(b"hello");
    s.write_all(&frame).await.expect("frame");
    let mut echoed = vec![0u8; frame.len()];
    s.read_exact(&mut echoed).await.expect("echo");
    assert_eq!(echoed, frame);
    s
}

/// What `s` gets next is a Close frame (1001, Going Away), then a clean end.
async fn closed_with_1001(mut s: TcpStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(support::TIMEOUT, s.read_to_end(&mut rest))
        .await
        .expect("closed in time");
    assert!(read.is_ok(), "a clean close, not a reset: {read:?}");
    assert_eq!(
        rest,
        [0x88, 0x02, 0x03, 0xe9],
        "a Close frame, 1001 Going Away"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_are_closed_with_1001_at_drain_start_and_said_once() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(sixty_seconds_to_drain(backend.addr)).await;
    let mut sockets = Vec::new();
    for _ in 0..3 {
        sockets.push(echoing_websocket(baton.addr("web")).await);
    }

    signal(baton.first_pid, Signal::SIGTERM);
    for s in sockets {
        closed_with_1001(s).await;
    }
    assert_eq!(
        wait_exit(baton.first_pid).await,
        Some(0),
        "exits well before its 60s budget"
    );
    said_long_lived_ended(&baton, "websockets=3 upgrades=0 event_streams=0");
    assert_no_error_lines(&baton);
}

/// A stop that reaches a generation still spreading its WebSockets' ends
/// over `reload.close_spread` ends the rest once its pre-stop pause is
/// over, each with its Close frame, and the stop is clean. Left to their
/// places in the spread (most past the stop's deadline here), they were cut
/// together at that deadline, unannounced, and the stop exited 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_the_websockets_a_reload_was_spreading_each_with_1001() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"1s\"\ndrain_timeout = \"3s\"\n[reload]\ndrain_timeout = \"120s\"\nclose_spread = \"100s\"",
        &backend,
        "",
    ))
    .await;
    let old = baton.serving_pid().await;
    let mut sockets = Vec::new();
    for _ in 0..6 {
        sockets.push(echoing_websocket(baton.addr("web")).await);
    }
    let main = baton.reload_ok().await;

    // As systemd stops the unit: SIGTERM to every generation at once.
    signal(old, Signal::SIGTERM);
    signal(main, Signal::SIGTERM);
    for s in sockets {
        closed_with_1001(s).await;
    }
    assert_eq!(wait_exit(old).await, Some(0), "nothing forced");
    assert_eq!(wait_exit(main).await, Some(0), "nothing cut anywhere");
}

/// A WebSocket frame the backend began in the same read as its 101 is
/// followed to its end: the drain finds the stream mid-frame and cuts it
/// after `LINGER` rather than write a Close frame into the frame's payload
/// (which the client would read as payload bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_begun_with_the_101_gets_no_close_frame_inside_it() {
    // A binary frame of 4000 bytes, 100 of them sent; the rest never comes.
    let mut begun = vec![0x82, 0x7e, 0x0f, 0xa0];
    begun.extend_from_slice(&[0x7f; 100]);
    let sent = begun.clone();
    let backend = RawBackend::start(move |_| {
        let mut bytes = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n".to_vec();
        bytes.extend_from_slice(&sent);
        (bytes, Then::CloseAfter(Duration::from_secs(60)))
    })
    .await;
    let baton = Baton::start(sixty_seconds_to_drain(backend.addr)).await;
    let (mut s, head) = client::upgraded(baton.addr("web"), "websocket").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let mut first = vec![0u8; begun.len()];
    s.read_exact(&mut first).await.expect("the frame's start");
    signal(baton.first_pid, Signal::SIGTERM);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(support::TIMEOUT, s.read_to_end(&mut rest))
        .await
        .expect("closed in time");
    assert_eq!(rest, b"", "nothing written into the unfinished frame");
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

/// A client that stops reading its upgraded connection does not hold the
/// drain: baton's pending write to it is given up a moment after the
/// drain begins, and the stop is clean (exit 0, nothing forced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_whose_client_stopped_reading_ends_at_drain_start() {
    let backend = RawBackend::start(|_| {
        let stream = vec![b'x'; 32 << 20];
        (
            raw::switched(&stream),
            Then::CloseAfter(Duration::from_secs(60)),
        )
    })
    .await;
    let baton = Baton::start(sixty_seconds_to_drain(backend.addr)).await;
    let s = raw::upgrading(baton.addr("web")).await;
    // Never read: once the tunnel's bytes fill its receive buffer,
    // baton's write to it waits.
    // Its receive buffer is full once what it holds stops growing.
    let held = || async {
        let mut look = vec![0u8; 4 << 20];
        let peeked = tokio::time::timeout(Duration::from_millis(100), s.peek(&mut look)).await;
        peeked.ok().and_then(Result::ok).unwrap_or(0)
    };
    support::eventually("the tunnel's bytes pile up unread", || async {
        let before = held().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        before >= 16 << 10 && held().await == before
    })
    .await;
    signal(baton.first_pid, Signal::SIGTERM);
    assert_eq!(
        wait_exit(baton.first_pid).await,
        Some(0),
        "exits well before its 60s budget, nothing forced"
    );
    said_long_lived_ended(&baton, "websockets=0 upgrades=1 event_streams=0");
    drop(s);
}

/// Reads an HTTP/1 event stream until `event` is in; returns all it read.
async fn read_until_event(s: &mut TcpStream, event: &str) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains(event) {
        let n = s.read(&mut buf).await.expect("read events");
        assert!(n > 0, "the stream ended before {event:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

/// An HTTP/1 event stream through `baton` read until `event` is in, then
/// a stop: all the client read once the stream ended (cleanly, in time).
async fn event_stream_through_a_stop(baton: &Baton, event: &str) -> String {
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET /sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut seen = read_until_event(&mut s, event).await;
    signal(baton.first_pid, Signal::SIGTERM);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(support::TIMEOUT, s.read_to_end(&mut rest))
        .await
        .expect("ends in time");
    assert!(read.is_ok(), "a clean end: {read:?}");
    seen.extend_from_slice(&rest);
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_ends_at_an_event_boundary() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(sixty_seconds_to_drain(backend.addr)).await;
    let text = event_stream_through_a_stop(&baton, "data: 3").await;
    // Chunked encoding: the last data chunk is a whole event, then the
    // terminating zero-length chunk.
    assert!(text.ends_with("\n\n\r\n0\r\n\r\n"), "{text:?}");
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
    said_long_lived_ended(&baton, "websockets=0 upgrades=0 event_streams=1");
}

/// An h2 client's event stream whose events end in CRLF CRLF ends at the
/// drain too, at an event boundary, as an HTTP/1 client's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_event_stream_with_crlf_events_ends_at_an_event_boundary() {
    let backend = RawBackend::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: TEXT/EVENT-STREAM\r\ntransfer-encoding: chunked\r\n\r\nb\r\ndata: 1\r\n\r\n\r\n".to_vec(),
            Then::CloseAfter(Duration::from_secs(60)),
        )
    })
    .await;
    h2_event_stream_through_a_stop(backend.addr, b"data: 1\r\n\r\n").await;
}

/// An h2 client's event stream from `backend` read until what came ends
/// with `until`, then a stop: the stream ends cleanly, in time, and the
/// stop is clean (exit 0, well before its 60 s budget).
async fn h2_event_stream_through_a_stop(backend: std::net::SocketAddr, until: &[u8]) {
    let baton = Baton::start(sixty_seconds_to_drain(backend)).await;
    let web = baton.addr("web");
    let mut sender = client::h2::<Empty<Bytes>>(web).await;
    let req = hyper::Request::get(format!("http://{web}/events"))
        .body(Empty::new())
        .expect("req");
    let resp = sender.send_request(req).await.expect("h2 response");
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    while !seen.ends_with(until) {
        let frame = body.frame().await.expect("a frame").expect("data");
        seen.extend_from_slice(frame.data_ref().expect("data"));
    }
    signal(baton.first_pid, Signal::SIGTERM);
    let rest = tokio::time::timeout(support::TIMEOUT, body.collect())
        .await
        .expect("ends in time")
        .expect("a clean end, not a reset");
    assert!(rest.to_bytes().is_empty());
    assert_eq!(wait_exit(baton.first_pid).await, Some(0), "nothing forced");
    said_long_lived_ended(&baton, "websockets=0 upgrades=0 event_streams=1");
}

/// A backend whose event stream stops short of an event boundary after
/// its first event (a comment heartbeat without its blank line), then
/// sends nothing more for a minute.
async fn event_stream_short_of_a_boundary() -> RawBackend {
    RawBackend::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n5\r\n: hb\n\r\n".to_vec(),
            Then::CloseAfter(Duration::from_secs(60)),
        )
    })
    .await
}

/// An event stream that never reaches an event boundary after the drain
/// began ends where it is a second later, as a WebSocket without a frame
/// boundary does (a client drops an event cut short): it held the drain
/// to its deadline, counted as forced (exit 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_short_of_a_boundary_ends_a_second_into_the_drain() {
    let backend = event_stream_short_of_a_boundary().await;
    let baton = Baton::start(sixty_seconds_to_drain(backend.addr)).await;
    let text = event_stream_through_a_stop(&baton, ": hb").await;
    assert!(text.ends_with(": hb\n\r\n0\r\n\r\n"), "{text:?}");
    assert_eq!(wait_exit(baton.first_pid).await, Some(0), "nothing forced");
    said_long_lived_ended(&baton, "websockets=0 upgrades=0 event_streams=1");
}

/// The same for an h2 client's event stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_event_stream_short_of_a_boundary_ends_a_second_into_the_drain() {
    let backend = event_stream_short_of_a_boundary().await;
    h2_event_stream_through_a_stop(backend.addr, b": hb\n").await;
}

/// A backend whose every answer is an event stream of stated length (two
/// 9-byte events): the first event at once, the second once `rest` says.
async fn event_stream_of_stated_length(
    rest: tokio::sync::watch::Receiver<bool>,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut rest = rest.clone();
            tokio::spawn(async move {
                if raw::read_request(&mut s, &mut Vec::new()).await.is_none() {
                    return;
                }
                let first = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 18\r\n\r\ndata: 1\n\n";
                s.write_all(first).await.expect("head and first event");
                let _ = rest.wait_for(|go| *go).await;
                s.write_all(b"data: 2\n\n").await.expect("second event");
                let _ = s.read(&mut [0u8; 64]).await;
            });
        }
    });
    addr
}

/// An event stream whose backend stated its length is a finite response:
/// a drain serves it to its end, to HTTP/1 and h2 clients alike, where
/// ending it at an event boundary left the client short of that length
/// (an HTTP/1 client took the close for a cut; an h2 client's library
/// takes a body short of its Content-Length for a malformed response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_of_stated_length_is_served_whole_through_a_drain() {
    let (go, rest) = tokio::sync::watch::channel(false);
    let backend = event_stream_of_stated_length(rest).await;
    let baton = Baton::start(sixty_seconds_to_drain(backend)).await;
    let web = baton.addr("web");
    let mut h1 = TcpStream::connect(web).await.expect("connect");
    h1.write_all(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut seen = read_until_event(&mut h1, "data: 1").await;
    let mut sender = client::h2::<Empty<Bytes>>(web).await;
    let req = hyper::Request::get(format!("http://{web}/events"))
        .body(Empty::new())
        .expect("req");
    let mut h2 = sender
        .send_request(req)
        .await
        .expect("h2 response")
        .into_body();
    let first = h2.frame().await.expect("a frame").expect("data");
    assert_eq!(
        first.data_ref().map(|d| d.as_ref()),
        Some(&b"data: 1\n\n"[..])
    );
    signal(baton.first_pid, Signal::SIGTERM);
    support::eventually("the drain began", || async {
        baton.log().contains("drain started")
    })
    .await;
    // Long enough for a stream the drain ends to have ended.
    tokio::time::sleep(Duration::from_millis(300)).await;
    go.send_replace(true);
    let mut rest = Vec::new();
    tokio::time::timeout(support::TIMEOUT, h1.read_to_end(&mut rest))
        .await
        .expect("ends in time")
        .expect("read to the end");
    seen.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&seen);
    assert!(text.ends_with("\r\n\r\ndata: 1\n\ndata: 2\n\n"), "{text:?}");
    let rest = tokio::time::timeout(support::TIMEOUT, h2.collect())
        .await
        .expect("ends in time")
        .expect("a whole body, not a malformed one");
    assert_eq!(rest.to_bytes(), &b"data: 2\n\n"[..]);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

/// A baton with `shutdown` keys and a request for `path` (`/slow/MS`, or
/// `/gated` until released) in flight on it, arrived at the backend.
async fn slow_request_in_flight(
    shutdown: &str,
    path: &'static str,
) -> (
    HttpBackend,
    Baton,
    tokio::task::JoinHandle<Result<client::Answer, String>>,
) {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(shutdown, &backend, "")).await;
    let web = baton.addr("web");
    let slow = tokio::spawn(async move { client::get(web, path).await });
    support::eventually("slow request arrived", || async {
        backend.hits.load(Ordering::Relaxed) == 1
    })
    .await;
    (backend, baton, slow)
}

/// A reload ends a WebSocket as its drain starts, with a Close frame
/// (`close_spread` none by default), as a stop does, and the drain is
/// clean: counted as drained, nothing forced, and no error counted
/// anywhere (DESIGN: what a drain ends is not an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_ends_a_websocket_with_1001_and_counts_no_error() {
    let backend = HttpBackend::start("a").await;
    // (A reload's drain has the stop's budget.)
    let baton = Baton::start(sixty_seconds_to_drain(backend.addr)).await;
    let old = baton.serving_pid().await;
    let s = echoing_websocket(baton.addr("web")).await;
    baton.reload_ok().await;
    closed_with_1001(s).await;
    assert_eq!(wait_exit(old).await, Some(0), "drained, long before 60 s");
    baton.settled().await;
    let admin = baton.admin;
    support::eventually("the drain's counts carried", || async move {
        let metrics = client::metrics(admin).await;
        [
            ("baton_long_lived_drained_total{kind=\"websocket\"}", 1.0),
            (
                "baton_drain_forced_connections_total{reason=\"reload\"}",
                0.0,
            ),
            ("baton_drain_duration_seconds_count{reason=\"reload\"}", 1.0),
        ]
        .iter()
        .all(|(series, value)| client::series(&metrics, series) == Some(*value))
    })
    .await;
    let metrics = client::metrics(admin).await;
    let errors: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("baton_upstream_errors_total")
                || l.starts_with("baton_client_aborts_total")
        })
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert_no_error_lines(&baton);
}

/// Through a stop's drain the admin server still answers (it closes last,
/// DESIGN): the probes on the paths the config names (a load balancer's
/// or Kubernetes' own) and only there, liveness 200 and readiness 503
/// `draining`, and the metrics with the connection still open. Closed
/// with the doors, a long drain's liveness probes would fail and an
/// orchestrator kill the process mid-drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_and_metrics_answer_through_a_stops_drain_on_the_configured_paths() {
    let backend = HttpBackend::start("a").await;
    let spec = spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"30s\"",
        &backend,
        "",
    )
    .admin("liveness_paths = [\"/livez\", \"/ping\"]\nreadiness_paths = [\"/ready\"]");
    let baton = Baton::spawn(spec, &[]);
    let admin = baton.admin;
    support::eventually("ready on /ready", || async {
        client::get(admin, "/ready")
            .await
            .is_ok_and(|a| a.status == 200)
    })
    .await;
    let probes = [
        ("/livez", 200),
        ("/ping", 200),
        ("/healthz", 404),
        ("/readyz", 404),
    ];
    for (path, status) in probes {
        let answer = client::get(admin, path).await.expect(path);
        assert_eq!(answer.status, status, "{path}");
    }
    // Held through the drain, however long the looks take.
    let web = baton.addr("web");
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the request is held", || async { backend.held() == 1 }).await;
    signal(baton.first_pid, Signal::SIGTERM);
    support::eventually("drain started", || async {
        baton.log().contains("drain started")
    })
    .await;
    let ready = client::get(admin, "/ready").await.expect("ready");
    assert_eq!(ready.status, 503);
    assert!(ready.body.contains("\"draining\""), "{}", ready.body);
    for (path, status) in probes {
        let answer = client::get(admin, path).await.expect(path);
        assert_eq!(answer.status, status, "{path} through the drain");
    }
    let metrics = client::get(admin, "/metrics").await.expect("metrics");
    assert_eq!(metrics.status, 200);
    let open: f64 = metrics
        .body
        .lines()
        .filter(|l| l.starts_with("baton_connections_active{listener=\"web\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(open, 1.0, "{}", metrics.body);
    assert_eq!(backend.held(), 1, "the request still held");
    backend.release();
    assert_eq!(held.await.expect("join").expect("answered").status, 200);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

/// SIGINT (Ctrl-C in a terminal, some container runtimes' stop) and
/// SIGQUIT (nginx's graceful stop) are the ordered stop too, not their
/// default action (an exit, a core dump, that resets every connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_and_sigquit_are_the_ordered_stop() {
    for stop in [Signal::SIGINT, Signal::SIGQUIT] {
        let (_backend, baton, slow) = slow_request_in_flight(
            "pre_stop_delay = \"-1s\"\ndrain_timeout = \"10s\"",
            "/slow/1000",
        )
        .await;
        signal(baton.first_pid, stop);
        let answer = slow.await.expect("join").expect("the request completes");
        assert_eq!(answer.body, HttpBackend::body_for("a", "/slow/1000"));
        assert_eq!(wait_exit(baton.first_pid).await, Some(0), "{stop}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_outliving_the_drain_is_forced_with_exit_3() {
    let (_backend, baton, slow) = slow_request_in_flight(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"1s\"",
        "/slow/10000",
    )
    .await;
    signal(baton.first_pid, Signal::SIGTERM);
    assert_eq!(wait_exit(baton.first_pid).await, Some(3));
    assert!(slow.await.expect("join").is_err());
    assert!(baton.log().contains("force-closed"));
}

/// A second stop signal forces at once, SIGINT as SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_signal_forces_at_once() {
    for second in [Signal::SIGTERM, Signal::SIGINT] {
        let (_backend, baton, slow) = slow_request_in_flight(
            "pre_stop_delay = \"-1s\"\ndrain_timeout = \"60s\"",
            "/slow/30000",
        )
        .await;
        signal(baton.first_pid, Signal::SIGTERM);
        support::eventually("drain started", || async {
            baton.log().contains("drain started")
        })
        .await;
        signal(baton.first_pid, second);
        assert_eq!(
            wait_exit(baton.first_pid).await,
            Some(3),
            "forced by {second}, long before the 60s budget"
        );
        assert!(slow.await.expect("join").is_err());
    }
}

/// `run --drain-timeout` and `BATON_DRAIN_TIMEOUT` (a unit's
/// `Environment=`) override the file for the daemon, and for every
/// generation a reload starts from the same command line and environment:
/// with the file's 30 s, a 10 s request would be served and the exit 0;
/// with the override's 1 s it is forced, exit 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_timeout_given_to_run_holds_for_the_generations_after_a_reload() {
    let backend = HttpBackend::start("a").await;
    let shutdown = "pre_stop_delay = \"-1s\"\ndrain_timeout = \"30s\"";
    for (args, wrapper) in [
        (&["--drain-timeout", "1s"][..], &[][..]),
        (&[][..], &["env", "BATON_DRAIN_TIMEOUT=1s"][..]),
    ] {
        let baton = Baton::spawn_under(spec(shutdown, &backend, ""), args, wrapper);
        baton.wait_ready().await;
        let serving = baton.reload_ok().await;
        let web = baton.addr("web");
        let before = backend.hits.load(Ordering::Relaxed);
        let slow = tokio::spawn(async move { client::get(web, "/slow/10000").await });
        support::eventually("the slow request arrived", || async {
            backend.hits.load(Ordering::Relaxed) > before
        })
        .await;
        signal(serving, Signal::SIGTERM);
        assert_eq!(wait_exit(serving).await, Some(3), "{args:?} {wrapper:?}");
        assert!(slow.await.expect("join").is_err());
    }
}

/// A second SIGTERM during the pre-stop pause cuts it short; with nothing
/// open the exit is still 0 (3 means connections were forced closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_in_the_pause_with_nothing_open_exits_0() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"60s\"\ndrain_timeout = \"60s\"",
        &backend,
        "",
    ))
    .await;
    signal(baton.first_pid, Signal::SIGTERM);
    support::eventually("the pre-stop pause began", || async {
        baton.log().contains("stopping")
    })
    .await;
    signal(baton.first_pid, Signal::SIGTERM);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}

/// Idle keep-alive connections a drain closes are said at INFO, once for
/// the drain with their count (DESIGN: connections a drain ends are logged
/// at INFO, `expected=true`), not a line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_says_how_many_idle_connections_it_closed() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"10s\"",
        &backend,
        "",
    ))
    .await;
    let web = baton.addr("web");
    let _idle = client::kept_alive(web, "/", 3).await;
    signal(baton.first_pid, Signal::SIGTERM);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
    let log = baton.log();
    let said = log
        .lines()
        .find(|l| l.contains("closed idle keep-alive connections for the drain"))
        .unwrap_or_else(|| panic!("no line for the idle closes in\n{log}"));
    assert!(
        said.contains("INFO") && said.contains("connections=3") && said.contains("expected=true"),
        "{said}"
    );
}

/// A stop during a first start, while the first health round still runs,
/// tells systemd nothing more once it said `STOPPING=1`: the round, ending
/// during the pre-stop pause, sent `READY=1`, which moves a unit still
/// starting to running while baton shuts down (found by review). The
/// notifications go to a socket of the test's own, as systemd's would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_before_the_first_health_round_ends_is_never_followed_by_ready() {
    let notifications = Notifications::listen();
    // Its queue takes the check's connection and nobody answers: the first
    // round lasts the check's timeout (3 s), past the 1 s a start waits for
    // it (half of `ready_timeout`) and into the pre-stop pause (4 s).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let spec = Spec::default()
        .section("[shutdown]\npre_stop_delay = \"4s\"\ndrain_timeout = \"2s\"\n")
        .section("[reload]\nready_timeout = \"2s\"\n")
        .http("web", "app")
        .pool_with(
            "app",
            "health = { kind = \"http\", path = \"/health\", interval = \"30s\", timeout = \"3s\", rise = 1, fall = 1 }",
            &[(silent.local_addr().expect("addr"), 1)],
        );
    let baton = Baton::spawn_under(spec, &[], &["env", &notifications.env]);
    support::eventually("serving, the first health round still running", || async {
        baton.log().contains("waiting for the first health round")
    })
    .await;
    signal(baton.first_pid, Signal::SIGTERM);
    let code = wait_exit(baton.first_pid).await;
    let said = notifications.said().await;
    assert_eq!(code, Some(0), "log:\n{}", baton.log());
    let stopping = said
        .iter()
        .position(|s| s.contains("STOPPING=1"))
        .unwrap_or_else(|| panic!("no STOPPING=1 in {said:?}"));
    assert!(
        said[stopping..].iter().all(|s| !s.contains("READY=1")),
        "READY=1 after STOPPING=1: {said:?}"
    );
    assert!(
        baton.log().contains("backend is down"),
        "the round ended during the stop: {}",
        baton.log()
    );
    drop(silent);
}

/// A stop signal during a first start that waits on a slow backend (the
/// first health round may take half of `ready_timeout`) ends that wait:
/// the generation was never ready, so it serves the connection that
/// queued meanwhile (its sockets listen from the start) and exits 0
/// without the pre-stop pause. It used to wait out the round and then
/// the pause, 30 s each here: a minute, past this config's
/// `TimeoutStopSec` (45 s), after which systemd kills it. Nor does it say
/// `READY=1` on its way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_first_start_waits_for_neither_its_backends_nor_the_pause() {
    let backend = HttpBackend::start("a").await;
    // Its queue takes the check's connection and nobody answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let spec = Spec::default()
        .section("[shutdown]\npre_stop_delay = \"30s\"\ndrain_timeout = \"10s\"\n")
        .section("[reload]\nready_timeout = \"60s\"\n")
        .http("web", "app")
        .pool("app", &[backend.addr])
        .pool_with(
            "slow",
            "health = { kind = \"http\", path = \"/health\", interval = \"30s\", timeout = \"30s\", rise = 1, fall = 1 }",
            &[(silent.local_addr().expect("addr"), 1)],
        );
    let notifications = Notifications::listen();
    let baton = Baton::spawn_under(spec, &[], &["env", &notifications.env]);
    let (_check, _) = tokio::time::timeout(support::TIMEOUT, silent.accept())
        .await
        .expect("the first health round began")
        .expect("accept");
    // Its sockets listen from the start: the request waits in the queue.
    let queued = queue_requests(baton.addr("web"), 1).await;
    signal(baton.first_pid, Signal::SIGTERM);
    each_served_whole(queued).await;
    assert_eq!(
        wait_exit(baton.first_pid).await,
        Some(0),
        "exited within {:?}; log:\n{}",
        support::TIMEOUT,
        baton.log()
    );
    assert!(
        baton
            .log()
            .contains("stop signal during start-up: not waiting for the first health round"),
        "{}",
        baton.log()
    );
    notifications.stopping_never_ready().await;
}

/// A stop whose access log cannot be written out (a FIFO nobody reads, as
/// a hung disk) after a forced drain still exits before systemd's
/// `TimeoutStopSec` (`baton check` prints it: pre-stop pause, drain, and
/// 5 s), with a margin, so that its SIGKILL never takes the exit code: the
/// flush gets what is left of the stop, not a fixed 5 s of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_access_log_never_takes_a_stop_past_timeout_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("access.log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    // Opened first, so baton's open for writing does not wait for a reader;
    // held and never read.
    use std::os::unix::fs::OpenOptionsExt;
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&fifo)
        .expect("reader");
    let backend = HttpBackend::start("a").await;
    let access_log = format!("access_log = {{ path = \"{}\" }}", fifo.display());
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"1s\"",
        &backend,
        &access_log,
    ))
    .await;
    let web = baton.addr("web");
    // 64 lines of over 4 KiB: four times what the pipe holds.
    let long_path = format!("/{}", "x".repeat(4096));
    for _ in 0..64 {
        let answer = client::get(web, &long_path).await.expect("logged request");
        assert_eq!(answer.status, 200);
    }
    let slow = tokio::spawn(async move { client::get(web, "/slow/30000").await });
    support::eventually("slow request arrived", || async {
        backend.hits.load(Ordering::Relaxed) == 65
    })
    .await;
    let timeout_stop = Duration::from_secs(1 + 5);
    let signalled = std::time::Instant::now();
    signal(baton.first_pid, Signal::SIGTERM);
    assert_eq!(wait_exit(baton.first_pid).await, Some(3), "forced");
    let took = signalled.elapsed();
    // Aimed about 3 s in (TimeoutStopSec less its margins); the contract
    // is the kill, with half a second to spare.
    assert!(
        took < timeout_stop - Duration::from_millis(500),
        "exited {took:?} after SIGTERM; systemd kills at {timeout_stop:?}"
    );
    assert!(slow.await.expect("join").is_err());
    assert!(baton.log().contains("access log not written out"));
}

/// An idle keep-alive connection whose client sends an empty line now and
/// then (ignored before a request line, RFC 9112 §2.2) still counts as
/// idle and is closed once the drain's grace is over: the grace began
/// again at every such line, and the connection held the drain to its
/// budget (forced, exit 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_lines_do_not_stretch_an_idle_connections_drain_grace() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"8s\"",
        &backend,
        "keepalive_drain_grace = \"1s\"\nidle_timeout = \"1m\"",
    ))
    .await;
    let mut kept = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    kept.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("request");
    let mut answer = [0u8; 12];
    tokio::time::timeout(support::TIMEOUT, kept.read_exact(&mut answer))
        .await
        .expect("an answer in time")
        .expect("an answer");
    signal(baton.first_pid, Signal::SIGTERM);
    let started = tokio::time::Instant::now();
    // An empty line every 300 ms until closed (a write fails), or past
    // the drain's budget.
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if kept.write_all(b"\r\n").await.is_err() {
            closed = true;
            break;
        }
    }
    assert_eq!(
        wait_exit(baton.first_pid).await,
        Some(0),
        "closed at its grace, nothing forced (closed by the client's side: {closed})"
    );
}

/// An admin connection open at a stop that has not asked yet gets its one
/// answer (503: stopping), not a reset by the exit: the exit waits a
/// second at most for the admin's last answers. (A TCP listener: no
/// pause for held-back connections, so the exit comes at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_connection_open_at_a_stop_gets_its_one_answer() {
    let echo = support::backend::TcpEcho::start().await;
    // (`Spec::new` has no pre-stop pause.)
    let spec = Spec::new().tcp("raw", "echo").pool("echo", &[echo.addr]);
    let baton = Baton::start(spec).await;
    let mut probe = TcpStream::connect(baton.admin).await.expect("connect");
    // Answered only once the admin took `probe` (the kernel hands
    // connections over in the order they came).
    let after = client::get(baton.admin, "/healthz").await.expect("healthz");
    assert_eq!(after.status, 200);
    signal(baton.first_pid, Signal::SIGTERM);
    // Asked once the admin's doors are closed: before, a live admin would
    // answer 503 too, whether or not the exit waits for it.
    let admin = baton.admin;
    support::eventually("the admin listener closed", || async move {
        TcpStream::connect(admin).await.is_err()
    })
    .await;
    probe
        .write_all(b"GET /readyz HTTP/1.1\r\nhost: admin\r\n\r\n")
        .await
        .expect("request");
    let answer = client::read_until_closed(&mut probe).await.to_lowercase();
    assert!(answer.starts_with("http/1.1 503"), "{answer:?}");
    assert_eq!(wait_exit(baton.first_pid).await, Some(0));
}
