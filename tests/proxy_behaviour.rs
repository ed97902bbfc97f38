//! What one connection sees through baton: TCP half-close, an HTTP upgrade
//! proxied both ways, forwarding headers, h2c, and clear errors for a dead
//! backend (502) and a malformed request (400).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::backend::{greeter, HttpBackend, TcpEcho};
use support::client::{self, read_until_closed};
use support::daemon::{Baton, Spec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_half_close_still_gets_the_reply() {
    let echo = TcpEcho::start().await;
    let baton = Baton::start(Spec::new().tcp("raw", "echo").pool("echo", &[echo.addr])).await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    s.write_all(b"ping before FIN").await.expect("write");
    s.shutdown().await.expect("half-close");
    // The backend only echoes; its reply and then its FIN must come back
    // through baton after our FIN went the other way.
    assert_eq!(read_until_closed(&mut s).await, "ping before FIN");
}

/// A TCP client may close its half at once and still read what a
/// server-speaks-first backend says (`nc -N`): its FIN before any byte
/// is not a client gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_client_that_closes_its_half_at_once_still_gets_the_greeting() {
    let (greets, _serving) = greeter().await;
    let baton = Baton::start(Spec::new().tcp("raw", "b").pool("b", &[greets])).await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    s.shutdown().await.expect("half-close");
    assert_eq!(read_until_closed(&mut s).await, "hi");
}

/// Once the backend closed, a client that keeps its half open (a pooled
/// socket left in CLOSE_WAIT) has the listener's `idle_timeout` of silence,
/// not `tunnel_timeout` (an hour): it held the backend's only place that
/// long, and the next client waited in line for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_tcp_tunnel_gives_its_place_back_at_idle_timeout() {
    let (greets, _serving) = greeter().await;
    let spec = Spec::new()
        .listener("raw", "tcp", "b", "idle_timeout = \"1s\"")
        .pool_with(
            "b",
            "max_connections_per_backend = 1\nqueue_timeout = \"5s\"",
            &[(greets, 1)],
        );
    let baton = Baton::start(spec).await;
    let raw = baton.addr("raw");
    let mut first = TcpStream::connect(raw).await.expect("connect");
    assert_eq!(read_until_closed(&mut first).await, "hi");
    // `first` stays open, its half never closed.
    let mut second = TcpStream::connect(raw).await.expect("connect");
    assert_eq!(read_until_closed(&mut second).await, "hi");
    drop(first);
}

/// A client that closes its half and waits longer than `idle_timeout`
/// for the answer (a job handed over, then EOF) gets it: the backend is at
/// work, and the tunnel waits for it under `tunnel_timeout`, as HAProxy's
/// does with no `timeout server-fin`. It was cut at `idle_timeout` with a
/// FIN, which read as a whole, empty answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_client_that_closed_its_half_waits_past_idle_timeout_for_the_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let backend = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut job = Vec::new();
                if s.read_to_end(&mut job).await.is_ok() {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    let _ = s.write_all(&[b"done: ", &job[..]].concat()).await;
                }
            });
        }
    });
    let spec = Spec::new()
        .listener("raw", "tcp", "b", "idle_timeout = \"1s\"")
        .pool("b", &[backend]);
    let baton = Baton::start(spec).await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    s.write_all(b"job").await.expect("write");
    s.shutdown().await.expect("half-close");
    assert_eq!(read_until_closed(&mut s).await, "done: job");
}

/// A client that closed its half and then vanished (a reset) while its
/// backend works reaches the backend as a reset at once: it was held until
/// the backend wrote, or `tunnel_timeout` ran out, the backend working on
/// for no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_clients_reset_after_its_fin_reaches_the_backend() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let backend = listener.local_addr().expect("addr");
    let (got_the_job, job_in) = tokio::sync::oneshot::channel();
    let reset_seen = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut job = Vec::new();
        s.read_to_end(&mut job)
            .await
            .expect("the job, then its FIN");
        let _ = got_the_job.send(job);
        // At work, silent: does the client's end come?
        let error = s.ready(tokio::io::Interest::ERROR);
        tokio::time::timeout(Duration::from_secs(3), error)
            .await
            .is_ok()
    });
    let baton = Baton::start(Spec::new().tcp("raw", "b").pool("b", &[backend])).await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    s.write_all(b"job").await.expect("write");
    s.shutdown().await.expect("half-close");
    // The job and its FIN reached the backend before the client's reset
    // (a fixed pause could come first on a loaded machine).
    let job = tokio::time::timeout(support::TIMEOUT, job_in)
        .await
        .expect("the job reached the backend in time")
        .expect("the backend read it");
    assert_eq!(job, b"job");
    support::reset(s);
    let seen = tokio::time::timeout(support::TIMEOUT, reset_seen)
        .await
        .expect("the backend's wait ends")
        .expect("backend");
    assert!(seen, "the backend saw no reset");
}

/// An echo backend that counts the connections it accepted.
async fn counting_echo() -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = s.read(&mut buf).await {
                    if s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// A TCP listener `raw` before a counting echo backend with one place
/// (`max_connections_per_backend = 1`, work in line up to
/// `queue_timeout`), and a client holding that place, echoed once:
/// `(baton, connections the backend accepted, the holder)`.
async fn one_place_held(queue_timeout: &str) -> (Baton, Arc<AtomicU64>, TcpStream) {
    let (echo, accepted) = counting_echo().await;
    let spec = Spec::new().tcp("raw", "b").pool_with(
        "b",
        &format!("max_connections_per_backend = 1\nqueue_timeout = \"{queue_timeout}\""),
        &[(echo, 1)],
    );
    let baton = Baton::start(spec).await;
    let mut holder = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    holder.write_all(b"mine").await.expect("write");
    assert_eq!(support::read_exactly(&mut holder, 4).await, b"mine");
    (baton, accepted, holder)
}

/// A TCP client that waits in line past `queue_timeout` (every backend at
/// its `max_connections_per_backend`) is closed and counted, as an HTTP
/// one is answered 503 (README); it never reaches the backend, and the
/// client holding the place goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_client_in_line_past_queue_timeout_is_closed_and_counted() {
    let (baton, accepted, mut holder) = one_place_held("300ms").await;
    let raw = baton.addr("raw");
    let mut waiting = TcpStream::connect(raw).await.expect("connect");
    waiting.write_all(b"never").await.expect("write");
    let (echoed, _) = support::read_to_the_end(&mut waiting).await;
    assert!(echoed.is_empty(), "{echoed:?}");
    assert_eq!(accepted.load(Ordering::Relaxed), 1, "the backend saw one");
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains("baton_queue_timeouts_total{pool=\"b\"} 1"),
        "{metrics}"
    );
    holder.write_all(b"still").await.expect("write");
    assert_eq!(support::read_exactly(&mut holder, 5).await, b"still");
}

/// TCP clients that reset their connections while they wait in line for a
/// backend's only place give it up and reach no backend (as HTTP clients
/// do): they were served in turn, ahead of real clients, each an empty
/// backend connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_clients_that_leave_while_in_line_reach_no_backend() {
    let (baton, accepted, holder) = one_place_held("60s").await;
    let raw = baton.addr("raw");
    let mut byte = [0u8; 1];
    for _ in 0..5 {
        let ghost = TcpStream::connect(raw).await.expect("connect");
        // Taken by baton, in line, before it leaves (a pause could end
        // first on a loaded machine, and a ghost taken after the place
        // freed up would be served).
        support::client::until_serving(baton.admin, "raw", 2).await;
        socket2::SockRef::from(&ghost)
            .set_linger(Some(Duration::ZERO))
            .expect("SO_LINGER");
        drop(ghost);
        support::client::until_serving(baton.admin, "raw", 1).await;
    }
    // Gone for baton too (their places in line left), however slow the
    // turn.
    support::client::until_serving(baton.admin, "raw", 1).await;
    drop(holder);
    let mut after = TcpStream::connect(raw).await.expect("connect");
    after.write_all(b"c").await.expect("write");
    tokio::time::timeout(support::TIMEOUT, after.read_exact(&mut byte))
        .await
        .expect("served in time")
        .expect("echo");
    assert_eq!(&byte, b"c");
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        2,
        "the holder and the one after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_stream_carries_megabytes_both_ways_intact() {
    let echo = TcpEcho::start().await;
    let baton = Baton::start(Spec::new().tcp("raw", "echo").pool("echo", &[echo.addr])).await;
    let s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    let (mut read, mut write) = s.into_split();
    let sent: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let expected = sent.clone();
    let writer = tokio::spawn(async move {
        write.write_all(&sent).await.expect("write");
        write.shutdown().await.expect("half-close");
    });
    let mut back = Vec::new();
    tokio::time::timeout(support::TIMEOUT, read.read_to_end(&mut back))
        .await
        .expect("echoed in time")
        .expect("read");
    writer.await.expect("join");
    assert!(
        back == expected,
        "{} bytes back of {}",
        back.len(),
        expected.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_proxied_both_ways() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let (mut s, head) = client::upgraded(baton.addr("web"), "echo").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    for msg in [&b"first frame"[..], b"second frame"] {
        s.write_all(msg).await.expect("write upgraded");
        assert_eq!(support::read_exactly(&mut s, msg.len()).await, msg);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_reach_the_backend() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let answer = client::get(baton.addr("web"), "/who")
        .await
        .expect("request");
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer
            .headers
            .get("x-seen-forwarded-for")
            .map(|v| v.as_bytes()),
        Some(&b"127.0.0.1"[..])
    );
    assert!(answer
        .headers
        .get_all("via")
        .iter()
        .any(|v| v.as_bytes() == b"1.1 baton"));
}

/// What the backend saw of a raw request sent through `listener_keys`.
async fn headers_seen(listener_keys: &str, request: &str) -> String {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", listener_keys)
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    raw(baton.addr("web"), request.as_bytes()).await
}

/// An IPv4 client of a dual-stack socket systemd passes in (a socket unit's
/// `ListenStream=[::]:80` or bare port; baton's own IPv6 sockets are
/// v6-only) is forwarded as the IPv4 address it is: written
/// `::ffff:127.0.0.1`, a backend's trusted-proxy list of IPv4 blocks
/// missed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv4_client_of_a_dual_stack_socket_is_forwarded_as_ipv4() {
    use std::os::fd::AsRawFd;
    let port = support::daemon::free_addr().port();
    let dual =
        socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).expect("socket");
    dual.set_only_v6(false).expect("dual stack");
    let at = std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    dual.bind(&at.into()).expect("bind [::]");
    dual.listen(128).expect("listen");
    dual.set_cloexec(false).expect("inheritable");
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .bind("web", at)
        .pool("app", &[backend.addr]);
    // As systemd passes it: fd 3, named, LISTEN_PID the pid that execs baton.
    let script = format!(
        "export LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=web; exec \"$@\" 3<&{0} {0}<&-",
        dual.as_raw_fd()
    );
    let baton = Baton::spawn_under(spec, &[], &["bash", "-c", &script, "bash"]);
    drop(dual);
    baton.wait_ready().await;
    assert!(
        baton.log().contains("adopting sockets from systemd"),
        "{}",
        baton.log()
    );
    let seen = raw(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        b"GET /headers HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(seen.contains("x-forwarded-for: 127.0.0.1\n"), "{seen}");
}

/// baton's own answers carry a `Date` (RFC 9110 §6.6.1: a server with a
/// clock MUST send one in its 4xx), on HTTP/1 and h2, as nginx's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_s_own_answers_carry_a_date() {
    let (dead, _held) = support::daemon::dead_addr();
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[dead])).await;
    let web = baton.addr("web");
    let refused = raw(web, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").await;
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    let date = refused
        .lines()
        .find_map(|l| l.strip_prefix("date: "))
        .unwrap_or_else(|| panic!("no date: {refused}"));
    assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
    let mut h2 = client::h2::<Empty<Bytes>>(web).await;
    let req = hyper::Request::get(format!("http://{web}/"))
        .body(Empty::new())
        .expect("request");
    let answer = h2.send_request(req).await.expect("h2 answer");
    assert_eq!(answer.status(), 502);
    let date = answer.headers().get("date").and_then(|d| d.to_str().ok());
    assert!(
        date.is_some_and(|d| httpdate::parse_http_date(d).is_ok()),
        "{date:?}"
    );
}

/// A backend's response without a `Date` gets one on its way (RFC 9110
/// §6.6.1: a recipient with a clock MUST add one to a response it
/// forwards without), on HTTP/1 and h2, as nginx does, and so does one
/// whose `Date` is named in `Connection` (it stays on its hop); one that
/// has a `Date` of its own keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_without_a_date_gets_one_and_one_with_keeps_its_own() {
    use support::raw::{ok, RawBackend, Then};
    const OLD: &str = "Sun, 06 Nov 1994 08:49:37 GMT";
    let backend = RawBackend::start(|seen| {
        let dated = |extra: &str| {
            format!("HTTP/1.1 200 OK\r\n{extra}DATE: {OLD}\r\ncontent-length: 0\r\n\r\n")
                .into_bytes()
        };
        let answer = match seen.head.lines().next().unwrap_or_default() {
            l if l.contains("/dated") => dated(""),
            l if l.contains("/hop") => dated("Connection: Date\r\n"),
            _ => ok("undated"),
        };
        (answer, Then::KeepAlive)
    })
    .await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let web = baton.addr("web");
    let mut h2 = client::h2::<Empty<Bytes>>(web).await;
    for (path, own_kept) in [("/", false), ("/dated", true), ("/hop", false)] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let answer = raw(web, request.as_bytes()).await;
        let dates: Vec<&str> = answer
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("date:"))
            .map(|l| l[5..].trim())
            .collect();
        assert_eq!(dates.len(), 1, "{path}: {answer}");
        assert!(httpdate::parse_http_date(dates[0]).is_ok(), "{answer}");
        assert_eq!(dates[0] == OLD, own_kept, "{path}: {answer}");

        let req = hyper::Request::get(format!("http://{web}{path}"))
            .body(Empty::new())
            .expect("request");
        let answer = h2.send_request(req).await.expect("h2 answer");
        let dates: Vec<_> = answer.headers().get_all("date").iter().collect();
        assert_eq!(dates.len(), 1, "h2 {path}: {dates:?}");
        let date = dates[0].to_str().expect("text");
        assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
        assert_eq!(date == OLD, own_kept, "h2 {path}: {date}");
    }
}

/// With underscore spellings of the fields baton writes, which a
/// CGI-style backend reads as those fields.
const SPOOFED: &str = "GET /headers HTTP/1.1\r\nHost: app\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 7.7.7.7\r\nX-Real-IP: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nX-Forwarded-Proto: https\r\nX_Forwarded_For: 8.8.8.8\r\nX_Forwarded_Proto: gopher\r\nX_Request_Id: forged\r\nContent_Length: 99\r\nTransfer_Encoding: chunked\r\nX-Forwarded-Client-Cert: Hash=00;Subject=\"CN=admin\"\r\nX_Forwarded_Client_Cert: Hash=01\r\nX-Forwarded-Ssl: on\r\nX-Forwarded-Protocol: ssl\r\nX-Forwarded-Scheme: https\r\nX-Forwarded-Prefix: /admin\r\nFront-End-Https: on\r\nTrue-Client-IP: 6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\nX-Cluster-Client-IP: 6.6.6.6\r\nX-Client-IP: 6.6.6.6\r\nClient-IP: 6.6.6.6\r\nFastly-Client-IP: 6.6.6.6\r\nConnection: close\r\n\r\n";

/// What baton writes itself, spelled with `_`: never reaches a backend.
const UNDERSCORED_OWN: [&str; 3] = ["forged", "content_length", "transfer_encoding"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_follow_the_listener_mode() {
    let replaced = headers_seen("", SPOOFED).await;
    assert!(
        replaced.contains("x-forwarded-for: 127.0.0.1\n"),
        "{replaced}"
    );
    assert!(replaced.contains("x-forwarded-proto: http\n"), "{replaced}");
    assert!(replaced.contains("via: 1.1 baton\n"), "{replaced}");
    for spoof in [
        "6.6.6.6",
        "7.7.7.7",
        "8.8.8.8",
        "x-real-ip",
        "forwarded: ",
        "Hash=0",
        "x-forwarded-ssl",
        "x-forwarded-protocol",
        "x-forwarded-scheme",
        "/admin",
        "front-end-https",
        "true-client-ip",
        "cf-connecting-ip",
        "x-cluster-client-ip",
        "client-ip",
        "fastly-client-ip",
    ] {
        assert!(!replaced.contains(spoof), "{spoof} survived: {replaced}");
    }
    let appended = headers_seen("forwarded = \"append\"", SPOOFED).await;
    assert!(
        appended.contains("x-forwarded-for: 6.6.6.6, 7.7.7.7, 127.0.0.1\n"),
        "{appended}"
    );
    // A certificate's identity comes from the listener's handshake alone:
    // no client can chain one in; nor does any field but one
    // `X-Forwarded-Proto` say the scheme. What a trusted proxy before
    // baton says of the scheme its client used (a load balancer that ends
    // TLS: `https`) and of where the app is mounted goes on.
    for spoof in [
        "8.8.8.8",
        "gopher",
        "Hash=0",
        "x-forwarded-ssl",
        "x-forwarded-protocol",
        "x-forwarded-scheme",
        "front-end-https",
        "forwarded: ",
        "x-forwarded-proto: http\n",
    ] {
        assert!(!appended.contains(spoof), "{spoof} survived: {appended}");
    }
    assert_eq!(
        appended.matches("x-forwarded-proto: https\n").count(),
        1,
        "{appended}"
    );
    assert!(
        appended.contains("x-forwarded-prefix: /admin\n"),
        "{appended}"
    );
    let off = headers_seen("forwarded = \"off\"", SPOOFED).await;
    assert!(off.contains("x-forwarded-for: 6.6.6.6\n"), "{off}");
    assert!(off.contains("x-forwarded-prefix: /admin\n"), "{off}");
    assert!(off.contains("x-forwarded-proto: https\n"), "{off}");
    assert!(!off.contains("127.0.0.1"), "{off}");
    assert!(
        off.contains("x-forwarded-client-cert: Hash=00;Subject=\"CN=admin\"\n"),
        "{off}"
    );
    for seen in [&replaced, &appended, &off] {
        for own in UNDERSCORED_OWN {
            assert!(!seen.contains(own), "{own} survived: {seen}");
        }
    }
}

/// The same for an h2 client's request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscore_spellings_of_what_baton_writes_never_reach_a_backend_from_h2() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", "forwarded = \"append\"")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let mut sender = client::h2(baton.addr("web")).await;
    let req = hyper::Request::get(format!("http://{}/headers", baton.addr("web")))
        .header("x_forwarded_for", "8.8.8.8")
        .header("x_forwarded_proto", "gopher")
        .header("x_request_id", "forged")
        .header("content_length", "99")
        .header("transfer_encoding", "chunked")
        .header("x-forwarded-client-cert", "Hash=00")
        .header("x_forwarded_client_cert", "Hash=01")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("h2 response");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let seen = String::from_utf8_lossy(&body);
    assert!(seen.contains("x-forwarded-for: 127.0.0.1\n"), "{seen}");
    for spoof in UNDERSCORED_OWN
        .iter()
        .chain(&["8.8.8.8", "gopher", "Hash=0"])
    {
        assert!(!seen.contains(spoof), "{spoof} survived: {seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_follows_an_absolute_target_and_cannot_be_stripped() {
    let absolute = headers_seen(
        "",
        "GET http://real.example/headers HTTP/1.1\r\nHost: fake.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(absolute.contains("host: real.example\n"), "{absolute}");
    assert!(!absolute.contains("fake.example"), "{absolute}");
    let stripped = headers_seen(
        "",
        "GET /headers HTTP/1.1\r\nHost: app.example\r\nX-Gone: 1\r\nConnection: close, host, x-gone\r\n\r\n",
    )
    .await;
    assert!(stripped.contains("host: app.example\n"), "{stripped}");
    assert!(!stripped.contains("x-gone"), "{stripped}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upgrade_is_served_as_http_1_1_and_never_tunnelled() {
    let seen = headers_seen(
        "",
        "GET /headers HTTP/1.1\r\nHost: app\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(
        seen.contains("HTTP/1.1\n"),
        "the backend got HTTP/1.1: {seen}"
    );
    for gone in ["upgrade", "http2-settings"] {
        assert!(
            !seen.to_ascii_lowercase().contains(&format!("\n{gone}:")),
            "{gone}: {seen}"
        );
    }
}

/// Trailers are end-to-end: a request's reach the backend and a response's
/// reach a client that said it takes them (`TE: trailers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_travel_both_ways() {
    let backend_says = headers_seen(
        "",
        "POST /trailers HTTP/1.1\r\nHost: app\r\nTE: trailers\r\nTrailer: x-sum\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\nx-sum: 7\r\n\r\n",
    )
    .await;
    assert!(
        backend_says.contains("request trailers: x-sum=7"),
        "{backend_says}"
    );
    let tail = backend_says.rsplit("\r\n0\r\n").next().unwrap_or("");
    assert!(
        tail.to_ascii_lowercase().contains("x-checksum: 42"),
        "{backend_says}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let stream = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    for path in ["/h2/one", "/h2/two"] {
        let req = hyper::Request::get(format!("http://{}{path}", baton.addr("web")))
            .body(Empty::<Bytes>::new())
            .expect("request");
        let resp = sender.send_request(req).await.expect("h2 response");
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body, HttpBackend::body_for("a", path).as_bytes());
    }
}

/// An HTTP/1.0 client that asked to keep its connection hears baton's
/// own answer (a 502: the backend refuses) say it is kept, as a proxied
/// answer says it, and the connection serves its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_answer_tells_a_1_0_keep_alive_client_its_connection_is_kept() {
    let (dead, _reserved) = support::daemon::dead_addr();
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[dead])).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    for turn in 0..2 {
        s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
            .await
            .expect("write");
        let mut reply = Vec::new();
        let mut chunk = [0u8; 1024];
        // The whole answer: its head, then as many bytes as it says.
        let whole = |reply: &[u8]| {
            let text = String::from_utf8_lossy(reply).to_ascii_lowercase();
            let (head, body) = text.split_once("\r\n\r\n")?;
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))?
                .parse()
                .ok()?;
            (body.len() >= length).then(|| head.to_string())
        };
        let head = loop {
            if let Some(head) = whole(&reply) {
                break head;
            }
            let n = tokio::time::timeout(support::TIMEOUT, s.read(&mut chunk))
                .await
                .expect("an answer in time")
                .expect("read");
            assert_ne!(
                n,
                0,
                "turn {turn}: closed after {:?}",
                String::from_utf8_lossy(&reply)
            );
            reply.extend_from_slice(&chunk[..n]);
        };
        assert!(head.starts_with("http/1.1 502"), "{head}");
        assert!(head.contains("\r\nconnection: keep-alive"), "{head}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_is_a_502_that_tells_the_client_nothing_inside() {
    let (dead, _reserved) = support::daemon::dead_addr();
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[dead])).await;
    let answer = client::get(baton.addr("web"), "/")
        .await
        .expect("an answer, not a reset");
    assert_eq!(answer.status, 502);
    assert!(
        answer.body.starts_with("502 Bad Gateway\n"),
        "{}",
        answer.body
    );
    for secret in [
        "app-0",
        &dead.to_string(),
        "refused",
        &dead.port().to_string(),
    ] {
        assert!(
            !answer.body.contains(secret),
            "{secret} leaked: {}",
            answer.body
        );
    }
    // The request id ties the client's answer to the log, which has it all.
    let id = answer.page_request_id();
    let log = baton.log();
    let line = log
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("no log line with {id}: {log}"));
    assert!(
        line.contains("app-0") && line.contains(&dead.to_string()),
        "{line}"
    );
    let status = client::backend_status(baton.admin, "app-0").await;
    assert!(
        status["last_error"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("refused")),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_line_is_a_400() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET / HTTP/1.1 garbage here\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let reply = read_until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply:?}");
    assert_eq!(
        backend.hits.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "never forwarded"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        client::get(baton.addr("web"), "/ok")
            .await
            .expect("still serving")
            .status,
        200
    );
}

/// Sends raw bytes on a new connection and returns everything read back.
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    read_until_closed(&mut s).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_and_malformed_requests_are_refused_and_never_forwarded() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let web = baton.addr("web");
    // (Transfer-Encoding with Content-Length is not here: hyper's parser
    // drops the Content-Length and decodes the chunked body before baton
    // sees the request, which RFC 9112 6.3 asks of an intermediary; the
    // body is re-framed on the way out, so no backend reads it two ways.)
    let cases: [&[u8]; 6] = [
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        b"GET /\r\n\r\n",
        b"GET nope HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
        b"G\xffT / HTTP/1.1\r\nHost: x\r\n\r\n",
    ];
    for case in cases {
        let reply = raw(web, case).await;
        assert!(
            reply.starts_with("HTTP/1.1 400"),
            "{:?} got {reply:?}",
            String::from_utf8_lossy(case)
        );
    }
    // An expectation no one on the way meets (RFC 9110 §10.1.1).
    let reply = raw(
        web,
        b"POST / HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nContent-Length: 2\r\n\r\nhi",
    )
    .await;
    assert!(
        reply.starts_with("HTTP/1.1 417 Expectation Failed\r\n"),
        "{reply:?}"
    );
    assert_eq!(backend.hits(), 0, "nothing ambiguous reached the backend");
    let huge_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1024 * 1024)
    );
    let reply = raw(web, huge_header.as_bytes()).await;
    assert!(
        reply.starts_with("HTTP/1.1 431") || reply.starts_with("HTTP/1.1 400"),
        "{reply:?}"
    );
    // Past the head's bounds (README: 64 KiB, 128 fields): 431.
    let many_fields: String = (0..129).map(|i| format!("X-F{i}: v\r\n")).collect();
    let past_bounds = [
        format!("GET / HTTP/1.1\r\nHost: x\r\n{many_fields}\r\n"),
        format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(65 * 1024)
        ),
    ];
    for head in past_bounds {
        let reply = raw(web, head.as_bytes()).await;
        assert!(reply.starts_with("HTTP/1.1 431"), "{reply:?}");
    }
    assert_eq!(
        backend.hits(),
        0,
        "no head past the bounds reached the backend"
    );
    assert_eq!(
        client::get(web, "/fine")
            .await
            .expect("still serving")
            .status,
        200
    );
}

/// A plain HTTP listener delays its ACKs until the answer (a new
/// connection's request then costs no ACK of its own), so baton must ACK
/// at once whenever it waits for more of a request: a client holding its
/// next bytes until the last are acknowledged (Nagle, on by default) would
/// otherwise wait for the kernel's delayed ACK, 40 ms, at every head or
/// body it sends in two writes. Run in a network namespace of the test's
/// own, whose TCP counters see only this test: each request, sent in two
/// writes (a head split in two places, a head and then its body of each
/// framing), must go once in three tries without the delayed-ACK timer
/// firing. Without the prompt ACKs every try fires it; a try may also
/// fire it when baton was not scheduled within 40 ms on a loaded machine.
#[test]
fn a_request_sent_in_two_writes_is_acknowledged_without_delay() {
    if !support::possible_or_skipped(&["unshare", "-n", "true"], "a network namespace") {
        return;
    }
    let backend: std::net::SocketAddr = "127.0.0.1:1".parse().expect("address");
    let spec = Spec::new().http("web", "app").pool("app", &[backend]);
    let in_its_own_namespace = [
        "unshare",
        "-n",
        "sh",
        "-c",
        "ip link set lo up && exec \"$0\" \"$@\"",
    ];
    let baton = Baton::spawn_under(spec, &[], &in_its_own_namespace);
    let (at, pid, log) = (baton.addr("web"), baton.first_pid, baton.log_path());
    let requests: [[&[u8]; 2]; 4] = [
        [b"GET / HTTP/1.1\r\nHost: a\r\n", b"Connection: close\r\n\r\n"],
        [b"GET / HTTP/1.1\r\nHost: a\r\nConnec", b"tion: close\r\n\r\n"],
        [
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
            b"hello",
        ],
        [
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
        ],
    ];
    let fired = std::thread::spawn(move || {
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        support::netns::enter_network_namespace_of(pid, &said);
        support::netns::wait_listening(at, &said);
        requests.map(|writes| {
            (0..3)
                .map(|_| {
                    let before = delayed_acks(pid);
                    let mut client = std::net::TcpStream::connect(at).expect("connect");
                    for part in writes {
                        std::io::Write::write_all(&mut client, part).expect("send");
                    }
                    let mut answer = String::new();
                    std::io::Read::read_to_string(&mut client, &mut answer).expect("answer");
                    assert!(answer.starts_with("HTTP/1.1 50"), "{answer}");
                    delayed_acks(pid) - before
                })
                .min()
                .unwrap_or(u64::MAX)
        })
    })
    .join()
    .expect("the client thread");
    assert_eq!(fired, [0; 4], "delayed ACKs, fewest of three tries");
}

/// ACKs the kernel sent because its delayed-ACK timer fired, in `pid`'s
/// network namespace (`TcpExt: DelayedACKs`).
fn delayed_acks(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/netstat")).expect("netstat");
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().expect("names"), lines.next().expect("values"));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "DelayedACKs")
        .and_then(|(_, value)| value.parse().ok())
        .expect("DelayedACKs")
}

/// A backend that writes its response head a byte at a time, each in a
/// segment of its own, then `ok`.
async fn trickling_backend(head: String) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let head = head.clone();
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                for byte in head.as_bytes() {
                    if stream.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                let _ = stream.write_all(b"ok").await;
            });
        }
    });
    addr
}

/// A response head that arrives a byte at a time (a backend that writes
/// it so) is read whole, fields and all, by the HTTP/1 path and the h2
/// one: it is parsed again only once a line has ended or it has doubled,
/// not after every byte, and never missed at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_trickled_a_byte_at_a_time_is_read_whole() {
    let fields: String = (0..20).map(|i| format!("X-Field-{i}: {i}\r\n")).collect();
    let head = format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 2\r\n\r\n");
    let backend = trickling_backend(head).await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend])).await;
    let web = baton.addr("web");
    let answer = client::get(web, "/").await.expect("HTTP/1.1");
    assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));
    assert_eq!(
        answer.headers.get("x-field-19").map(|v| v.as_bytes()),
        Some(&b"19"[..])
    );
    let mut h2 = client::h2(web).await;
    let req = hyper::Request::get(format!("http://{web}/"))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = h2.send_request(req).await.expect("h2 response");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("x-field-19").map(|v| v.as_bytes()),
        Some(&b"19"[..])
    );
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"ok");
}
