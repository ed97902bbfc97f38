//! Tunnels (TCP mode, and HTTP connections upgraded to another protocol)
//! hold their client connection's place under `max_connections` for their
//! whole life, and are closed after `tunnel_timeout` with no traffic either
//! way; TCP mode sets keep-alive on both of its sockets. A client's
//! half-close loses nothing of the backend's half; a side's reset resets
//! the other side of an upgraded connection, as in TCP mode.

mod support;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::backend::{HttpBackend, TcpEcho};
use support::client;
use support::daemon::{Baton, Spec};
use support::raw::{self, RawBackend, Then};

/// Echoes `msg` through an established tunnel.
async fn echoes(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).await.expect("write through the tunnel");
    assert_eq!(support::read_exactly(s, msg.len()).await, msg);
}

/// Reads until the peer closes; true if it did within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgraded_connections_count_against_max_connections_while_they_live() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", "max_connections = 2")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let (mut first, head) = client::upgraded(web, "echo").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let (mut second, _) = client::upgraded(web, "echo").await;
    echoes(&mut first, b"one").await;
    echoes(&mut second, b"two").await;
    // Both places are taken by live tunnels: a third client waits in the
    // kernel's queue (or in a shard's hands, for a place), unserved.
    let third = tokio::spawn(async move { client::get(web, "/third").await });
    baton.until_connected("web", 3).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past the cap"
    );
    assert_eq!(
        backend.hits(),
        2,
        "only the two upgrades reached the backend"
    );
    // One tunnel ends: its place goes to the waiting client.
    drop(first);
    let answer = third
        .await
        .expect("join")
        .expect("served once a tunnel ended");
    assert_eq!(answer.status, 200);
    echoes(&mut second, b"still open").await;
}

/// Both of baton's sockets of a tunnel probe a silent peer (TCP
/// keep-alive), as TCP mode's do: a WebSocket whose backend's host died
/// held its place until `tunnel_timeout` (an hour by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_idle_both_ways_closes_at_tunnel_timeout_and_has_keep_alive() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", "tunnel_timeout = \"2s\"")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let (mut busy, _) = client::upgraded(web, "echo").await;
    let (mut idle, _) = client::upgraded(web, "echo").await;
    assert!(keep_alive_timers(web.port()) >= 1, "client side");
    assert!(keep_alive_timers(backend.addr.port()) >= 1, "backend side");
    // Traffic every 300 ms keeps a tunnel open well past the timeout (a
    // loaded machine's late turn of a second or more still within it).
    for _ in 0..12 {
        echoes(&mut busy, b"ping").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        closed_within(&mut idle, Duration::from_secs(3)).await,
        "the idle tunnel was closed"
    );
    echoes(&mut busy, b"still open").await;
}

/// Established connections on `port` (either end) with a keep-alive
/// timer running, as `ss` lists them.
fn keep_alive_timers(port: u16) -> usize {
    let ss = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established"])
        .output()
        .expect("ss");
    let ss = String::from_utf8_lossy(&ss.stdout);
    ss.lines()
        .filter(|l| l.contains(&format!(":{port} ")) && l.contains("timer:(keepalive"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_connection_idle_both_ways_closes_at_tunnel_timeout_and_has_keep_alive() {
    let echo = TcpEcho::start().await;
    let spec = Spec::new()
        .listener("raw", "tcp", "echo", "tunnel_timeout = \"2s\"")
        .pool("echo", &[echo.addr]);
    let baton = Baton::start(spec).await;
    let raw = baton.addr("raw");
    let mut busy = TcpStream::connect(raw).await.expect("connect");
    let mut idle = TcpStream::connect(raw).await.expect("connect");
    echoes(&mut idle, b"hello").await;
    // Both of baton's sockets for this connection probe a silent peer.
    assert!(keep_alive_timers(raw.port()) >= 1, "client side");
    assert!(keep_alive_timers(echo.addr.port()) >= 1, "backend side");
    for _ in 0..12 {
        echoes(&mut busy, b"ping").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        closed_within(&mut idle, Duration::from_secs(3)).await,
        "the idle connection was closed"
    );
    echoes(&mut busy, b"still open").await;
}

/// A client that half-closes an upgraded connection while baton waits to
/// write to it (it reads slowly) still gets every byte the backend sent,
/// in order: the backend's half goes on from where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_close_from_a_slow_reader_loses_nothing_of_the_backends_half() {
    const LEN: usize = 32 << 20;
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let sent = pattern.clone();
    let backend = RawBackend::start(move |_| (raw::switched(&sent), Then::Close)).await;
    let spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let mut s = raw::upgrading(baton.addr("web")).await;
    // Unread meanwhile: baton's writes to this client wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.shutdown().await.expect("half-close");
    let mut got = Vec::new();
    tokio::time::timeout(support::TIMEOUT, s.read_to_end(&mut got))
        .await
        .expect("the whole stream in time")
        .expect("read");
    let body = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| &got[at + 4..])
        .expect("a response head");
    assert_eq!(body.len(), LEN, "every byte");
    assert!(body == &pattern[..], "in order");
}

/// An upgraded connection whose client closed its half waits for the
/// backend's answer past `idle_timeout` (under `tunnel_timeout`), as a
/// TCP-mode one does: only the backend's half-close starts the shorter
/// limit, for a client that never closes its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_client_that_closed_its_half_waits_past_idle_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let backend = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut buf = Vec::new();
        raw::read_request(&mut s, &mut buf)
            .await
            .expect("upgrade request");
        s.write_all(&raw::switched(b"")).await.expect("101");
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.expect("the client's half");
        tokio::time::sleep(Duration::from_secs(3)).await;
        s.write_all(b"late answer").await.expect("answer");
    });
    let spec = Spec::new()
        .listener("web", "http", "app", "idle_timeout = \"1s\"")
        .pool("app", &[backend]);
    let baton = Baton::start(spec).await;
    let mut s = raw::upgrading(baton.addr("web")).await;
    let mut head = Vec::new();
    // Read as a request is: a head, and no body.
    raw::read_request(&mut s, &mut head).await.expect("the 101");
    s.shutdown().await.expect("half-close");
    assert_eq!(client::read_until_closed(&mut s).await, "late answer");
}

/// A TCP tunnel that the reload's drain deadline forces closed is reset,
/// not ended with a FIN, which would pass the cut stream off as whole to
/// a protocol with no framing of its own; and its bytes are counted in
/// `baton_tcp_bytes_total` all the same (they were counted only when a
/// tunnel ended by itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tcp_tunnel_is_reset_and_its_bytes_counted() {
    // An echo that says how its one connection ended: a reset, or a FIN.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let echo = listener.local_addr().expect("addr");
    let backend_end = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => s.write_all(&buf[..n]).await.expect("echo"),
                Err(err) => return Err(err.kind()),
            }
        }
    });
    let spec = Spec::new()
        .section("[reload]\ndrain_timeout = \"1s\"\n")
        .listener("raw", "tcp", "echo", "")
        .pool("echo", &[echo]);
    let baton = Baton::start(spec).await;
    let mut tunnel = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    echoes(&mut tunnel, b"0123456789").await;
    let old = baton.serving_pid().await;
    baton.reload_ok().await;
    assert_eq!(
        support::daemon::wait_exit(old).await,
        Some(3),
        "the tunnel outlived the drain"
    );
    let mut byte = [0u8; 1];
    let read = tunnel.read(&mut byte).await;
    assert_eq!(
        read.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "the cut tunnel reset, not closed as if it had ended"
    );
    assert_eq!(
        backend_end.await.expect("join"),
        Err(std::io::ErrorKind::ConnectionReset),
        "the backend's end reset too"
    );
    let counted = "baton_tcp_bytes_total{listener=\"raw\",direction=\"to_backend\"} 10";
    support::eventually("the forced tunnel's bytes counted", || async {
        client::metrics(baton.admin).await.contains(counted)
    })
    .await;
    drop(tunnel);
}

/// A backend that switches protocols before it has the whole request
/// (an upgrade asked with a body, the backend reading its head alone) is
/// a 502, with nothing of its 101 passed on: the rest of the body would
/// reach it as the new protocol's bytes. The client got the 101, then the
/// connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_before_the_whole_request_went_up_is_a_502() {
    let backend = support::raw::answers_after_head(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await;
    let spec = Spec::new().http("web", "app").pool("app", &[backend]);
    let baton = Baton::start(spec).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(
        b"POST /up HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\nContent-Length: 100\r\n\r\nten bytes.",
    )
    .await
    .expect("write");
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(support::TIMEOUT, s.read(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
}

/// A backend that switches its first connection to protocol `echo` and
/// hands the raw connection to `after`.
async fn switching_backend<F, Fut>(after: F) -> SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read_exact(&mut byte).await.is_err() {
                return;
            }
            head.push(byte[0]);
        }
        let switched =
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
        if s.write_all(switched).await.is_ok() {
            after(s).await;
        }
    });
    addr
}

/// A backend that resets an upgraded connection resets the client's too,
/// after every byte it sent before, and the failure is counted against
/// it: closed with a FIN, the client took the cut stream for a whole one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_reset_in_an_upgraded_tunnel_resets_the_client() {
    const SENT: &[u8] = b"half of a message";
    let (reached_tx, reached) = tokio::sync::oneshot::channel::<()>();
    let backend = switching_backend(|mut s| async move {
        if s.write_all(SENT).await.is_ok() {
            // Reset once the client has it: taken by baton after the
            // reset, the kernel would have discarded it.
            let _ = reached.await;
            support::reset(s);
        }
    })
    .await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend])).await;
    let (mut s, head) = client::upgraded(baton.addr("web"), "echo").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let got = support::read_exactly(&mut s, SENT.len()).await;
    assert_eq!(got, SENT, "every byte sent before the reset");
    let _ = reached_tx.send(());
    let (rest, ended) = support::read_to_the_end(&mut s).await;
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(ended, Err(std::io::ErrorKind::ConnectionReset));
    let counted = "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"protocol\"} 1";
    support::eventually("the reset counted against the backend", || async {
        client::metrics(baton.admin).await.contains(counted)
    })
    .await;
    support::eventually("the reset said in baton's log", || async {
        baton
            .log()
            .contains("backend broke off an upgraded connection")
    })
    .await;
}

/// A client that resets an upgraded connection resets the backend's too,
/// once the backend read what the client sent before: a FIN would tell
/// the backend the client was done, where it aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_in_an_upgraded_tunnel_resets_the_backend() {
    const SENT: &[u8] = b"half of a message";
    let (read_tx, read) = tokio::sync::oneshot::channel();
    let (heard_tx, heard) = tokio::sync::oneshot::channel();
    let backend = switching_backend(|mut s| async move {
        let mut got = [0u8; SENT.len()];
        let _ = read_tx.send(s.read_exact(&mut got).await.map(|_| got));
        let _ = heard_tx.send(support::read_to_the_end(&mut s).await);
    })
    .await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend])).await;
    let (mut s, head) = client::upgraded(baton.addr("web"), "echo").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
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

/// An idle upgraded tunnel holds no buffer, nor the exchange that switched
/// it: a read's buffer is lent while bytes are on their way, each way, and
/// the tunnel runs outside the exchange's allocation. A thousand, each idle
/// after one echo, grow baton by under 10 KiB each (8 in this debug build;
/// 10 while the exchange's box lived as long as its tunnel; 22 when each
/// held a 16 KiB buffer down and `tokio::io::copy`'s 8 KiB up for its life).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upgraded_tunnels_hold_no_buffers() {
    const TUNNELS: usize = 1000;
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let mut held = Vec::new();
    // The first warms the allocator's caches: counted before.
    let mut before = 0;
    for n in 0..=TUNNELS {
        if n == 1 {
            before = support::daemon::rss_kib(baton.first_pid);
        }
        let (mut tunnel, head) = client::upgraded(web, "echo").await;
        assert!(head.starts_with("http/1.1 101"), "{head}");
        echoes(&mut tunnel, b"x").await;
        held.push(tunnel);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let per = support::daemon::rss_kib(baton.first_pid).saturating_sub(before) / TUNNELS as u64;
    assert!(per < 10, "{per} KiB an idle upgraded tunnel");
}
