//! PROXY protocol both ways, against the real binary: a listener believes
//! a header from a trusted peer (X-Forwarded-For, the header it sends on),
//! refuses the rest and counts why; a pool with `send_proxy` opens every
//! backend connection with the client's header, never shares one between
//! clients, and health checks say LOCAL.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{signal, wait_exit, Baton, Spec};
use support::proxied::{ProxiedBackend, Told};
use support::tls::{Authority, Issued};

const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// A v2 header for TCP over IPv4.
fn v2_header(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (source, destination) else {
        panic!("IPv4 only");
    };
    let mut h = V2_SIGNATURE.to_vec();
    h.extend_from_slice(&[0x21, 0x11, 0, 12]);
    h.extend_from_slice(&s.ip().octets());
    h.extend_from_slice(&d.ip().octets());
    h.extend_from_slice(&s.port().to_be_bytes());
    h.extend_from_slice(&d.port().to_be_bytes());
    h
}

/// `header` with a TLV of `kind` carrying `len` zero bytes after its
/// addresses, its length field counting it.
fn with_tlv(mut header: Vec<u8>, kind: u8, len: u16) -> Vec<u8> {
    header.push(kind);
    header.extend_from_slice(&len.to_be_bytes());
    header.resize(header.len() + usize::from(len), 0);
    let body = u16::try_from(header.len() - 16).expect("a v2 length");
    header[14..16].copy_from_slice(&body.to_be_bytes());
    header
}

/// LOCAL naming `family` with no address block (the family is ignored).
fn v2_local(family: u8) -> Vec<u8> {
    let mut h = V2_SIGNATURE.to_vec();
    h.extend_from_slice(&[0x20, family, 0, 0]);
    h
}

const ASK_HEADERS: &[u8] = b"GET /headers HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n";

/// Sends `first` then `request` on one connection; everything answered.
async fn exchange(addr: SocketAddr, first: &[u8], request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(first).await.expect("write header");
    s.write_all(request).await.expect("write request");
    client::read_until_closed(&mut s).await
}

fn counted(metrics: &str, listener: &str, reason: &str) -> u64 {
    let key = format!(
        "baton_proxy_protocol_errors_total{{listener=\"{listener}\",reason=\"{reason}\"}} "
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn spec_receiving(receive: &str, backend: SocketAddr) -> Spec {
    Spec::new()
        .listener(
            "web",
            "http",
            "app",
            &format!("proxy_protocol = {{ {receive} }}"),
        )
        .pool("app", &[backend])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_header_names_the_client() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec_receiving("trusted = [\"127.0.0.0/8\"]", backend.addr)).await;
    let web = baton.addr("web");
    let told: SocketAddr = "203.0.113.7:40000".parse().expect("addr");
    let v1 = format!(
        "PROXY TCP4 203.0.113.7 {} 40000 {}\r\n",
        web.ip(),
        web.port()
    );
    // A v2 header with 12 KiB of TLVs (a NOOP's padding here) is taken
    // whole, as HAProxy takes one up to its 16 KiB buffer.
    let padded = with_tlv(v2_header(told, web), 0x04, 12 * 1024);
    for first in [v1.clone().into_bytes(), v2_header(told, web), padded] {
        let seen = exchange(web, &first, ASK_HEADERS).await;
        assert!(seen.contains("x-forwarded-for: 203.0.113.7\n"), "{seen}");
    }
    // LOCAL (the balancer's own health check): the socket's own address,
    // also when it names a family and sends no addresses.
    for family in [0x00, 0x11] {
        let seen = exchange(web, &v2_local(family), ASK_HEADERS).await;
        assert!(seen.contains("x-forwarded-for: 127.0.0.1\n"), "{seen}");
    }
    // A header split across segments is waited for, not misread.
    let mut s = TcpStream::connect(web).await.expect("connect");
    let header = v2_header(told, web);
    s.write_all(&header[..5]).await.expect("write");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    s.write_all(&header[5..]).await.expect("write");
    s.write_all(ASK_HEADERS).await.expect("write");
    let seen = client::read_until_closed(&mut s).await;
    assert!(seen.contains("x-forwarded-for: 203.0.113.7\n"), "{seen}");
    // The header and the request in one write (one segment): the request's
    // bytes after the header are the request's, none taken with it.
    for header in [v1.as_bytes(), &v2_header(told, web)] {
        let seen = exchange(web, &[header, ASK_HEADERS].concat(), b"").await;
        assert!(seen.contains("x-forwarded-for: 203.0.113.7\n"), "{seen}");
    }
    assert_eq!(backend.hits(), 8);
}

/// The access log names the client a trusted header told of, not the
/// balancer in front that sent it (README), in both formats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_names_the_client_a_header_told_of() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = HttpBackend::start("a").await;
    let logged = |format: &str| {
        let log = dir.path().join(format!("{format}.log"));
        let keys = format!(
            "proxy_protocol = {{ trusted = [\"127.0.0.0/8\"] }}\naccess_log = {{ path = \"{}\", format = \"{format}\" }}",
            log.display()
        );
        (keys, log)
    };
    let (json_keys, json_log) = logged("json");
    let (combined_keys, combined_log) = logged("combined");
    let spec = Spec::new()
        .listener("web", "http", "app", &json_keys)
        .listener("other", "http", "app", &combined_keys)
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let told: SocketAddr = "203.0.113.7:40000".parse().expect("addr");
    for listener in ["web", "other"] {
        let at = baton.addr(listener);
        let seen = exchange(at, &v2_header(told, at), ASK_HEADERS).await;
        assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    }
    support::daemon::signal(baton.first_pid, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(support::daemon::wait_exit(baton.first_pid).await, Some(0));
    let json_line = std::fs::read_to_string(&json_log).expect("the JSON log");
    let line: serde_json::Value = serde_json::from_str(json_line.trim()).expect("one JSON line");
    assert_eq!(line["client"], "203.0.113.7:40000", "{line}");
    let combined_line = std::fs::read_to_string(&combined_log).expect("the combined log");
    assert!(
        combined_line.starts_with("203.0.113.7 - - ["),
        "{combined_line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_headers_close_the_connection_and_are_counted() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(spec_receiving(
        "accept = \"v1\", trusted = [\"127.0.0.1\"], timeout = \"300ms\"",
        backend.addr,
    ))
    .await;
    let web = baton.addr("web");
    let before = client::metrics(baton.admin).await;
    for reason in [
        "untrusted",
        "malformed",
        "missing",
        "timeout",
        "version",
        "closed",
    ] {
        let series =
            format!("baton_proxy_protocol_errors_total{{listener=\"web\",reason=\"{reason}\"}} 0");
        assert!(
            before.lines().any(|l| l == series),
            "{series}, from the start:\n{before}"
        );
    }
    let cases: [(&str, Vec<u8>); 4] = [
        (
            "malformed",
            b"PROXY TCP4 203.0.113.999 1.2.3.4 1 2\r\n".to_vec(),
        ),
        ("missing", Vec::new()),
        (
            "version",
            v2_header("203.0.113.7:1".parse().expect("a"), web),
        ),
        ("timeout", b"PROXY TCP4 203.0.1".to_vec()),
    ];
    for (reason, first) in &cases {
        let request: &[u8] = if *reason == "timeout" {
            b""
        } else {
            ASK_HEADERS
        };
        let answer = exchange(web, first, request).await;
        assert_eq!(answer, "", "{reason}: closed without an answer");
    }
    // Silent from the start: the same timeout (the first byte is waited
    // for within it, not for ever).
    let mut silent = TcpStream::connect(web).await.expect("connect");
    assert_eq!(
        client::read_until_closed(&mut silent).await,
        "",
        "closed at the timeout"
    );
    // Gone before a whole header.
    let mut s = TcpStream::connect(web).await.expect("connect");
    s.write_all(b"PROXY TCP4").await.expect("write");
    drop(s);
    let metrics_have_all = || async {
        let m = client::metrics(baton.admin).await;
        [
            ("malformed", 1),
            ("missing", 1),
            ("version", 1),
            ("timeout", 2),
            ("closed", 1),
        ]
        .iter()
        .all(|(r, n)| counted(&m, "web", r) == *n)
    };
    support::eventually("each refusal counted once", metrics_have_all).await;
    assert_eq!(backend.hits(), 0, "nothing refused reached the backend");
    assert!(baton.log().contains("PROXY header"), "{}", baton.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_trusted_peers_may_send_a_header() {
    let backend = HttpBackend::start("a").await;
    // 127.0.0.1 is not trusted here; headers are optional.
    let baton = Baton::start(spec_receiving(
        "trusted = [\"10.0.0.0/8\"], required = false",
        backend.addr,
    ))
    .await;
    let web = baton.addr("web");
    let plain = exchange(web, b"", ASK_HEADERS).await;
    assert!(plain.contains("x-forwarded-for: 127.0.0.1\n"), "{plain}");
    let spoofed = exchange(
        web,
        &v2_header("6.6.6.6:1".parse().expect("a"), web),
        ASK_HEADERS,
    )
    .await;
    assert_eq!(
        spoofed, "",
        "an untrusted peer's header closes the connection"
    );
    let m = client::metrics(baton.admin).await;
    assert_eq!(counted(&m, "web", "untrusted"), 1, "{m}");
    assert_eq!(backend.hits(), 1);
}

/// Where a header is optional, a client that closes its half having sent
/// nothing (`nc -N` reading a server-speaks-first greeting) is served as
/// it would be without `proxy_protocol`, not refused as a header cut
/// short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_header_lets_a_client_that_closed_its_half_read_the_greeting() {
    let (greets, _serving) = support::backend::greeter().await;
    let spec = Spec::new()
        .listener(
            "raw",
            "tcp",
            "b",
            // Longer than the test waits: served at the close, not after.
            "proxy_protocol = { trusted = [\"127.0.0.0/8\"], required = false, timeout = \"60s\" }",
        )
        .pool("b", &[greets]);
    let baton = Baton::start(spec).await;
    let mut s = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    s.shutdown().await.expect("half-close");
    assert_eq!(client::read_until_closed(&mut s).await, "hi");
    let m = client::metrics(baton.admin).await;
    assert_eq!(counted(&m, "raw", "closed"), 0, "{m}");
}

/// During a stop's drain, a connection that has sent nothing of its
/// PROXY header by `keepalive_drain_grace` is idle, as a silent client
/// is on an HTTP listener without PROXY: it is closed, and the stop is
/// prompt and clean (it was held to `proxy_protocol.timeout`, 60 s here,
/// and forced at the drain's deadline with exit 3). One whose header and
/// request come within the grace is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_through_the_drains_grace_is_closed_not_waited_for() {
    let backend = HttpBackend::start("a").await;
    // A grace far longer than the 300 ms the late client takes.
    let keys = "proxy_protocol = { trusted = [\"127.0.0.0/8\"], timeout = \"60s\" }\nkeepalive_drain_grace = \"3s\"";
    let baton = Baton::start(
        Spec::default()
            .section("[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"30s\"\n")
            .listener("web", "http", "app", keys)
            .pool("app", &[backend.addr]),
    )
    .await;
    let web = baton.addr("web");
    let mut silent = TcpStream::connect(web).await.expect("connect");
    let mut late = TcpStream::connect(web).await.expect("connect");
    baton.until_connected("web", 2).await;
    let stopped = std::time::Instant::now();
    signal(baton.first_pid, Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let header = v2_header(
        "198.51.100.7:4000".parse().expect("addr"),
        "203.0.113.1:443".parse().expect("addr"),
    );
    late.write_all(&header).await.expect("header");
    late.write_all(ASK_HEADERS).await.expect("request");
    let answer = client::read_until_closed(&mut late).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(client::read_until_closed(&mut silent).await, "");
    assert_eq!(wait_exit(baton.first_pid).await, Some(0), "nothing forced");
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "not held to the drain's deadline: {:?}",
        stopped.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_comes_before_tls() {
    let ca = Authority::new();
    let cert = ca.issue("a", &["a.example.com"]);
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener(
            "web",
            "http",
            "app",
            &format!(
                "proxy_protocol = {{ trusted = [\"127.0.0.1\"] }}\n{}",
                Issued::listener_tls(&[&cert], "")
            ),
        )
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let mut tcp = TcpStream::connect(web).await.expect("connect");
    tcp.write_all(&v2_header("198.51.100.4:5".parse().expect("a"), web))
        .await
        .expect("header");
    let tls = ca
        .client(&["http/1.1"])
        .handshake(tcp, "a.example.com")
        .await
        .expect("handshake after the header");
    let mut sender = client::http1_over(tls).await.expect("http1");
    let answer = client::send(&mut sender, web, "/headers")
        .await
        .expect("served");
    assert!(
        answer.body.contains("x-forwarded-for: 198.51.100.4\n"),
        "{}",
        answer.body
    );
}

/// A pool sending `version` headers to `backend`, behind an HTTP listener
/// and a TCP one.
fn spec_sending(version: &str, backend: SocketAddr, listener_keys: &str) -> Spec {
    Spec::new()
        .listener("web", "http", "app", listener_keys)
        .listener("raw", "tcp", "app", listener_keys)
        .pool_with(
            "app",
            &format!("send_proxy = \"{version}\""),
            &[(backend, 1)],
        )
}

async fn two_requests_on_one_connection(addr: SocketAddr) -> (SocketAddr, Vec<String>) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let me = stream.local_addr().expect("local");
    let mut sender = client::http1_over(stream).await.expect("http1");
    let mut bodies = Vec::new();
    for _ in 0..2 {
        bodies.push(
            client::send(&mut sender, addr, "/")
                .await
                .expect("served")
                .body,
        );
    }
    (me, bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_gets_backend_connections_of_its_own() {
    let backend = ProxiedBackend::start().await;
    let baton = Baton::start(spec_sending("v2", backend.addr, "")).await;
    let web = baton.addr("web");
    let (a, a_bodies) = two_requests_on_one_connection(web).await;
    let (b, b_bodies) = two_requests_on_one_connection(web).await;
    // One backend connection per client, reused for its second request.
    assert_eq!(a_bodies, ["connection 0", "connection 0"]);
    assert_eq!(b_bodies, ["connection 1", "connection 1"]);
    let told = backend.clients();
    assert_eq!(told.len(), 2, "{told:?}");
    for (t, client) in told.iter().zip([a, b]) {
        let Told::Client {
            source,
            destination,
            tlvs,
        } = t
        else {
            panic!("{t:?}");
        };
        assert_eq!(*source, client);
        assert_eq!(*destination, web);
        assert!(
            tlvs.iter().any(|(kind, _)| *kind == 0x05),
            "a unique id: {tlvs:?}"
        );
    }
    // A client's backend connection ends with the client's.
    support::eventually("private connections closed", || async {
        backend.open() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_mode_and_a_received_header_are_passed_on() {
    let backend = ProxiedBackend::start().await;
    let baton = Baton::start(spec_sending(
        "v1",
        backend.addr,
        "proxy_protocol = { trusted = [\"127.0.0.1\"] }",
    ))
    .await;
    let raw = baton.addr("raw");
    let told: SocketAddr = "203.0.113.9:4321".parse().expect("addr");
    let reached: SocketAddr = "192.0.2.1:443".parse().expect("addr");
    let answer = exchange(
        raw,
        &v2_header(told, reached),
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.ends_with("connection 0"), "{answer}");
    assert_eq!(
        backend.clients(),
        [Told::Client {
            source: told,
            destination: reached,
            tlvs: Vec::new()
        }],
        "v1 names what the balancer in front said"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_and_health_checks_speak_for_whom_they_should() {
    let backend = ProxiedBackend::start().await;
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "send_proxy = \"v2\"\nhealth = { kind = \"http\", path = \"/health\", interval = \"200ms\", timeout = \"1s\", rise = 1, fall = 1 }",
        &[(backend.addr, 1)],
    );
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    assert!(
        backend.told().contains(&Told::Local),
        "health checks send LOCAL: {:?}",
        backend.told()
    );
    let stream = TcpStream::connect(web).await.expect("connect");
    let me = stream.local_addr().expect("local");
    let mut sender = client::h2_over(stream).await.expect("h2 handshake");
    for _ in 0..3 {
        let req = hyper::Request::get(format!("http://{web}/"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let resp = sender.send_request(req).await.expect("stream served");
        assert_eq!(resp.status(), 200);
    }
    let clients = backend.clients();
    assert_eq!(clients.len(), 3, "a connection per stream: {clients:?}");
    assert!(clients
        .iter()
        .all(|t| matches!(t, Told::Client { source, .. } if *source == me)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_tells_the_backend_the_client_alpn_and_sni() {
    let ca = Authority::new();
    let cert = ca.issue("a", &["a.example.com"]);
    let backend = ProxiedBackend::start().await;
    let spec = Spec::new()
        .listener("web", "http", "app", &Issued::listener_tls(&[&cert], ""))
        .pool_with("app", "send_proxy = \"v2\"", &[(backend.addr, 1)]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let tls = ca
        .client(&["http/1.1"])
        .connect(web, "a.example.com")
        .await
        .expect("handshake");
    let mut sender = client::http1_over(tls).await.expect("http1");
    client::send(&mut sender, web, "/").await.expect("served");
    let clients = backend.clients();
    let [Told::Client { tlvs, .. }] = clients.as_slice() else {
        panic!("{:?}", backend.told());
    };
    assert!(tlvs.contains(&(0x01, b"http/1.1".to_vec())), "{tlvs:?}");
    assert!(
        tlvs.contains(&(0x02, b"a.example.com".to_vec())),
        "{tlvs:?}"
    );
}

/// `PP2_TYPE_SSL` of a v2 header: what the client's TLS session says.
fn ssl_tlv(told: &Told) -> Option<Vec<u8>> {
    let Told::Client { tlvs, .. } = told else {
        return None;
    };
    tlvs.iter()
        .find(|(kind, _)| *kind == 0x20)
        .map(|(_, value)| value.clone())
}

/// `PP2_TYPE_SSL`'s value: `flags`, verify 0, the version, and `cn`.
fn ssl_value(flags: u8, cn: Option<&str>) -> Vec<u8> {
    let mut value = vec![flags, 0, 0, 0, 0, 0x21, 0, 7];
    value.extend_from_slice(b"TLSv1.3");
    if let Some(cn) = cn {
        value.push(0x22);
        value.extend_from_slice(&u16::try_from(cn.len()).expect("short").to_be_bytes());
        value.extend_from_slice(cn.as_bytes());
    }
    value
}

/// v2 tells a backend what HAProxy's `send-proxy-v2-ssl-cn` does: the
/// client spoke TLS, which version, and whether it presented a
/// certificate (verified, as `client_ca` requires) on this connection or
/// only in the session it resumed, with the certificate's common name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_tells_the_backend_the_clients_tls_and_certificate() {
    let ca = Authority::new();
    let cert = ca.issue("a", &["a.example.com"]);
    let me = ca.issue("me", &["client.example.com"]);
    let backend = ProxiedBackend::start().await;
    let tls = Issued::listener_tls(
        &[&cert],
        &format!(
            ", client_ca = \"{}\", client_auth = \"optional\"",
            ca.ca_pem().display()
        ),
    );
    let spec = Spec::new().listener("web", "http", "app", &tls).pool_with(
        "app",
        "send_proxy = \"v2\"",
        &[(backend.addr, 1)],
    );
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    // The same client twice (it resumes its session the second time),
    // then one without a certificate.
    let with_cert = ca.client_as(&["http/1.1"], Some(&me));
    for client in [&with_cert, &with_cert, &ca.client(&["http/1.1"])] {
        let tls = client
            .connect(web, "a.example.com")
            .await
            .expect("handshake");
        let mut sender = client::http1_over(tls).await.expect("http1");
        client::send(&mut sender, web, "/").await.expect("served");
    }
    let seen: Vec<Option<Vec<u8>>> = backend.clients().iter().map(ssl_tlv).collect();
    let cn = Some("rcgen self signed cert");
    assert_eq!(
        seen,
        [
            Some(ssl_value(0x01 | 0x02 | 0x04, cn)),
            Some(ssl_value(0x01 | 0x04, cn)),
            Some(ssl_value(0x01, None)),
        ]
    );
}
