//! Load balancing through the real binary: weighted distribution, least
//! connections, health checks, passive failures, and draining one backend
//! without failing a request.

mod support;

use support::backend::{HttpBackend, TcpEcho};
use support::client::{self, backend_state};
use support::daemon::{dead_addr, wait_exit, Baton, Spec};
use support::load::{Load, Targets};

const FAST_CHECKS: &str = "health = { kind = \"http\", path = \"/health\", interval = \"100ms\", timeout = \"500ms\", rise = 3, fall = 2 }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_round_robin_is_exact_over_6000_requests() {
    let (a, b, c) = (
        HttpBackend::start("a").await,
        HttpBackend::start("b").await,
        HttpBackend::start("c").await,
    );
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "balance = \"round_robin\"",
        &[(a.addr, 1), (b.addr, 2), (c.addr, 3)],
    );
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let mut conn = client::connect(web).await.expect("connect");
    for i in 0..6000 {
        let answer = client::send(&mut conn, web, &format!("/r/{i}"))
            .await
            .expect("request");
        assert_eq!(answer.status, 200);
    }
    assert_eq!((a.hits(), b.hits(), c.hits()), (1000, 2000, 3000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_conn_sends_new_work_away_from_a_busy_backend() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "balance = \"least_conn\"",
        &[(a.addr, 1), (b.addr, 1)],
    );
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    // Held until the fast ones are done, however long they take.
    let slow: Vec<_> = (0..3)
        .map(|i| tokio::spawn(async move { client::get(web, &format!("/gated?{i}")).await }))
        .collect();
    support::eventually("held requests arrived", || async {
        a.held() + b.held() == 3
    })
    .await;
    let (busy, idle) = if a.hits() >= 2 { (&a, &b) } else { (&b, &a) };
    let busy_before = busy.hits();
    // One kept-alive connection: each request is picked for only once the
    // one before it has let go of its backend. (On fresh connections a
    // request could be picked for while the previous one's task still held
    // its lease, a tie the picker may break either way.)
    let mut fast = client::connect(web).await.expect("connect");
    for i in 0..20 {
        assert_eq!(
            client::send(&mut fast, web, &format!("/fast/{i}"))
                .await
                .expect("fast")
                .status,
            200
        );
    }
    assert_eq!(
        busy.hits(),
        busy_before,
        "the backend holding slow requests got no new work"
    );
    assert!(idle.hits() >= 20);
    a.release();
    b.release();
    for s in slow {
        assert_eq!(s.await.expect("join").expect("slow").status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_a_backend_under_load_fails_nothing() {
    let (a, b, c) = (
        HttpBackend::start("a").await,
        HttpBackend::start("b").await,
        HttpBackend::start("c").await,
    );
    let echo = TcpEcho::start().await;
    let spec = Spec::new()
        .http("web", "app")
        .tcp("raw", "echo")
        .pool_with("app", FAST_CHECKS, &[(a.addr, 1), (b.addr, 1), (c.addr, 1)])
        .pool("echo", &[echo.addr]);
    let baton = Baton::start(spec).await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    let load = Load::start(Targets {
        http: Some(web),
        tcp: Some(baton.addr("raw")),
        names: vec!["a", "b", "c"],
    });
    load.progress(100).await;

    // A request that c holds until the test releases it, then c is drained
    // (by name, via the CLI): it is still in flight whenever the drain lands.
    a.release();
    b.release();
    let mut tries = 0;
    let held = loop {
        tries += 1;
        assert!(tries < 30, "round robin never sent a held request to c");
        let mut handle = tokio::spawn(async move { client::get(web, "/gated").await });
        let landed_on_c = tokio::select! {
            answered = &mut handle => {
                let answer = answered.expect("join").expect("a held request on a or b");
                assert_eq!(answer.status, 200);
                false
            }
            () = support::eventually("the held request reached c", || async { c.held() == 1 }) => true,
        };
        if landed_on_c {
            break handle;
        }
    };
    let out = baton_cli(&["backend", "drain", "app-2"], &baton.config).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is now draining"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Requests given to c just before the drain may still be on their way
    // to it: count once baton holds nothing for c but the held request.
    support::eventually("only the held request still leased to c", || async {
        client::backend_status(admin, "app-2").await["in_flight"] == 1
    })
    .await;
    let c_hits = c.hits();
    load.progress(200).await;
    assert_eq!(c.hits(), c_hits, "a draining backend takes no new work");
    assert_eq!(
        backend_state(admin, "app-2").await,
        "draining",
        "c holds a request"
    );
    c.release();
    let answer = held
        .await
        .expect("join")
        .expect("the held request on the drained backend completes");
    assert_eq!(answer.body, HttpBackend::body_for("c", "/gated"));
    support::eventually("c goes out once idle", || async {
        backend_state(admin, "app-2").await == "out"
    })
    .await;

    // Restore by index: it must pass `rise` checks before it gets traffic.
    let restored = client::restore(admin, "2").await;
    assert!(
        restored.body.contains("\"state\":\"down\""),
        "re-enters through the checks: {}",
        restored.body
    );
    support::eventually("c is up again", || async {
        backend_state(admin, "app-2").await == "up"
    })
    .await;
    support::eventually("c takes work again", || async { c.hits() > c_hits + 5 }).await;
    load.stop().await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_backend_costs_no_unsent_request_and_comes_back() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let spec =
        Spec::new()
            .http("web", "app")
            .pool_with("app", FAST_CHECKS, &[(a.addr, 1), (b.addr, 1)]);
    let baton = Baton::start(spec).await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    let load = Load::start(Targets {
        http: Some(web),
        tcp: None,
        names: vec!["a", "b"],
    });
    load.progress(100).await;
    let b_addr = b.addr;
    b.kill();
    support::eventually("b is marked down", || async {
        backend_state(admin, "app-1").await == "down"
    })
    .await;
    load.progress(200).await;
    let restarted = HttpBackend::start_on("b", b_addr).await;
    support::eventually("b is up again", || async {
        backend_state(admin, "app-1").await == "up"
    })
    .await;
    support::eventually("b serves again", || async { restarted.hits() > 5 }).await;
    let report = load.stop().await;
    // Only requests already sent to b when it died may fail (5 clients at
    // most have one in flight); none that had not reached it.
    assert!(report.failures.len() <= 5, "{:#?}", report.failures);
    for f in &report.failures {
        assert!(f.contains("502"), "only in-flight requests may fail: {f}");
    }
    // And only on b: a never failed.
    assert!(
        client::backend_status(admin, "app-0").await["last_error"].is_null(),
        "{}",
        client::backend_status(admin, "app-0").await
    );
    drop(a);
}

/// A pool whose backends the operator drained is not ready, and `/readyz`
/// says why: healthy or not, a drained backend takes no work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_a_pool_was_drained_by_the_operator() {
    let a = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[a.addr])).await;
    client::drain(baton.admin, "0").await;
    let ready = client::get(baton.admin, "/readyz").await.expect("readyz");
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(
        ready.body.contains(
            r#"{"detail":"0/1 backends healthy (1 drained by the operator)","name":"pool app","ok":false}"#
        ),
        "{}",
        ready.body
    );
}

/// An HTTP health check judges the final status: 2xx and 3xx healthy
/// (a health path that redirects), anything else a failure (a 503 while
/// the backend's database is down, a 404 where the path went away). Its
/// `Host` is the backend's address where no DNS name gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_check_takes_2xx_and_3xx_as_healthy_and_anything_else_as_failed() {
    use std::sync::atomic::{AtomicU16, Ordering};
    let status = std::sync::Arc::new(AtomicU16::new(200));
    let answering = std::sync::Arc::clone(&status);
    let backend = support::raw::RawBackend::start(move |_| {
        let code = answering.load(Ordering::SeqCst);
        let head = format!(
            "HTTP/1.1 {code} Whatever\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n"
        );
        (head.into_bytes(), support::raw::Then::Close)
    })
    .await;
    let spec = Spec::new()
        .http("web", "app")
        .pool_with("app", FAST_CHECKS, &[(backend.addr, 1)]);
    let baton = Baton::start(spec).await;
    let admin = baton.admin;
    // Asked of the backend by its address, as no DNS name is there.
    let host = format!("Host: {}\r\n", backend.addr);
    let heads = backend.heads();
    assert!(
        heads
            .iter()
            .any(|h| h.starts_with("GET /health HTTP/1.1\r\n") && h.contains(&host)),
        "{heads:?}"
    );
    for (code, state) in [(503, "down"), (302, "up"), (404, "down"), (204, "up")] {
        status.store(code, Ordering::SeqCst);
        support::eventually(&format!("{code}: {state}"), || async {
            backend_state(admin, "app-0").await == state
        })
        .await;
    }
}

/// An HTTP check asks with the `host` its pool's `health` names: a
/// backend of virtual hosts (nginx's `default_server` answering 404 to
/// any other name, Django's `ALLOWED_HOSTS`) failed every check asked by
/// its address, and its pool was down while its traffic was served well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_check_asks_for_the_host_its_pool_names() {
    let backend = support::raw::RawBackend::start(|seen| {
        let ours = seen
            .head
            .to_ascii_lowercase()
            .contains("\r\nhost: www.example.com\r\n");
        let code = if ours { 200 } else { 404 };
        let head = format!("HTTP/1.1 {code} Whatever\r\ncontent-length: 0\r\n\r\n");
        (head.into_bytes(), support::raw::Then::Close)
    })
    .await;
    let checks = FAST_CHECKS.replace(
        "kind = \"http\",",
        "kind = \"http\", host = \"www.example.com\",",
    );
    let spec = Spec::new()
        .http("web", "app")
        .pool_with("app", &checks, &[(backend.addr, 1)]);
    let baton = Baton::start(spec).await;
    assert_eq!(backend_state(baton.admin, "app-0").await, "up");
}

/// baton in front of `good` and `failing` (app-1) with fast HTTP checks,
/// once app-1 is down, and app-1 as `/status` shows it then.
async fn checked_down(
    good: &HttpBackend,
    failing: std::net::SocketAddr,
) -> (Baton, serde_json::Value) {
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        FAST_CHECKS,
        &[(good.addr, 1), (failing, 1)],
    );
    let baton = Baton::start(spec).await;
    let admin = baton.admin;
    support::eventually("app-1 is down", || async {
        backend_state(admin, "app-1").await == "down"
    })
    .await;
    let status = client::backend_status(admin, "app-1").await;
    (baton, status)
}

/// A failed HTTP check says what it asked and what came back, in
/// `/status` and in the line that takes the backend down (with its pool):
/// "status 404" alone did not say which path the check asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_check_names_its_request_and_the_answer() {
    let refusing = support::raw::RawBackend::start(|_| {
        let head = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        (head.as_bytes().to_vec(), support::raw::Then::Close)
    })
    .await;
    let good = HttpBackend::start("good").await;
    let (baton, status) = checked_down(&good, refusing.addr).await;
    assert_eq!(
        status["last_check"]["detail"], "GET /health answered 404",
        "{status}"
    );
    let log = baton.log();
    assert!(
        log.lines().any(|l| l.contains("backend is down")
            && l.contains("pool=app backend=app-1")
            && l.contains("GET /health answered 404")),
        "{log}"
    );
}

/// A check that connects and has no answer in time says so: an
/// application that accepts and hangs is told from a backend that cannot
/// be reached, which says `connect: no connection within` (the two limits
/// raced, and either could say "no answer").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_connects_and_hears_nothing_says_so() {
    let (hanging, _held) = support::backend::silent().await;
    let good = HttpBackend::start("good").await;
    let (_baton, status) = checked_down(&good, hanging).await;
    assert_eq!(
        status["last_check"]["detail"], "connected, but no answer within 500ms",
        "{status}"
    );
}

/// Health checks pause for a backend the operator drained (DESIGN): one
/// taken out for its maintenance is not probed meanwhile; they go on once
/// it is restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_pause_for_a_drained_backend() {
    let a = HttpBackend::start("a").await;
    let spec = Spec::new()
        .http("web", "app")
        .pool_with("app", FAST_CHECKS, &[(a.addr, 1)]);
    let baton = Baton::start(spec).await;
    let admin = baton.admin;
    let checks = || async move {
        let metrics = client::metrics(admin).await;
        let series = "baton_health_checks_total{pool=\"app\",backend=\"app-0\",result=\"ok\"}";
        client::series(&metrics, series).unwrap_or(0.0)
    };
    client::drain(admin, "0").await;
    support::eventually("a is out", || async {
        backend_state(admin, "app-0").await == "out"
    })
    .await;
    // A check under way as the drain came has ended by then.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let (counted, probed) = (checks().await, a.hits());
    // Ten intervals.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(checks().await, counted, "no check counted while drained");
    assert_eq!(a.hits(), probed, "no check reached the drained backend");
    client::restore(admin, "0").await;
    support::eventually("checks resume once restored", || async {
        checks().await > counted
    })
    .await;
}

/// A client that waits for `100 Continue` before its upload, with every
/// backend down, is answered 503 at once, with no 100 first: it was told
/// to send its body, only to have it refused after (HAProxy, which passes
/// the expectation on, answers at once too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_waiting_for_100_continue_with_every_backend_down_is_503_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = HttpBackend::start("a").await;
    let spec = Spec::new()
        .http("web", "app")
        .pool_with("app", FAST_CHECKS, &[(a.addr, 1)]);
    let baton = Baton::start(spec).await;
    a.kill();
    support::eventually("app-0 is down", || async {
        backend_state(baton.admin, "app-0").await == "down"
    })
    .await;
    let mut s = tokio::net::TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(
        b"PUT /f HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n",
    )
    .await
    .expect("head");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(support::TIMEOUT, s.read_exact(&mut byte))
            .await
            .expect("an answer in time")
            .expect("an answer");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_backend_down_http_is_503_and_readyz_names_the_pool() {
    let a = HttpBackend::start("a").await;
    let echo = TcpEcho::start().await;
    let spec = Spec::new()
        .http("web", "app")
        .tcp("raw", "echo")
        .pool_with("app", FAST_CHECKS, &[(a.addr, 1)])
        .pool_with("echo", "health = { kind = \"tcp\", interval = \"100ms\", timeout = \"500ms\", rise = 1, fall = 1 }", &[(echo.addr, 1)]);
    let baton = Baton::start(spec).await;
    a.kill();
    drop(echo);
    support::eventually("/readyz names the pool", || async {
        client::get(baton.admin, "/readyz").await.is_ok_and(|r| {
            r.status == 503
                && r.body
                    .contains(r#"{"detail":"0/1 backends healthy","name":"pool app","ok":false}"#)
        })
    })
    .await;
    support::eventually("echo pool down", || async {
        backend_state(baton.admin, "echo-0").await == "down"
    })
    .await;
    // The series the shipped alerts watch (BatonBackendDown,
    // BatonPoolWithoutBackend), and the checks that made the verdicts:
    // the first round's good one (it decides at once), two failed to fall.
    support::eventually("the down backend in /metrics", || async {
        let metrics = client::metrics(baton.admin).await;
        let of_a = |name: &str, label: &str| {
            let series = format!("{name}{{pool=\"app\",backend=\"app-0\",{label}}}");
            client::series(&metrics, &series)
        };
        of_a("baton_backend_state", "state=\"down\"") == Some(1.0)
            && of_a("baton_backend_state", "state=\"up\"") == Some(0.0)
            && of_a("baton_health_checks_total", "result=\"ok\"").is_some_and(|n| n >= 1.0)
            && of_a("baton_health_checks_total", "result=\"failed\"").is_some_and(|n| n >= 2.0)
    })
    .await;
    let answer = client::get(baton.addr("web"), "/")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 503);
    assert!(
        answer
            .body
            .starts_with("503 Service Unavailable\nrequest id: ")
            && !answer.body.contains("app"),
        "{}",
        answer.body
    );
    assert_eq!(
        client::get(baton.admin, "/healthz")
            .await
            .expect("healthz")
            .status,
        200
    );
    // TCP: closed at once, nothing echoed.
    let mut s = tokio::net::TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(
        support::TIMEOUT,
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut buf),
    )
    .await;
    assert!(read.is_ok() && buf.is_empty());
}

/// Probes are answered from the first instant of a first start, while the
/// first health round still runs: `/healthz` 200, `/readyz` 503
/// `starting`. A liveness probe with a short timeout must not restart a
/// host whose checks are slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_while_the_first_health_round_runs() {
    // Its queue takes the check's connection and nobody answers it: the
    // first round lasts the check's whole timeout (20 s).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent.local_addr().expect("addr");
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "health = { kind = \"http\", path = \"/health\", interval = \"30s\", timeout = \"20s\", rise = 1, fall = 1 }",
        &[(addr, 1)],
    );
    let baton = Baton::spawn(spec, &[]);
    let admin = baton.admin;
    support::eventually("the admin port is bound", || async {
        tokio::net::TcpStream::connect(admin).await.is_ok()
    })
    .await;
    let answered = |path: &'static str| async move {
        tokio::time::timeout(std::time::Duration::from_secs(5), client::get(admin, path))
            .await
            .unwrap_or_else(|_| panic!("{path} unanswered while the first health round runs"))
            .expect(path)
    };
    assert_eq!(answered("/healthz").await.status, 200);
    let ready = answered("/readyz").await;
    assert_eq!(ready.status, 503);
    assert!(ready.body.contains("starting"), "{}", ready.body);
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_waits_on_an_unhealthy_pool() {
    // A bound, non-listening socket keeps the port ours (refusing
    // connections) until the backend starts, so no other test takes it.
    let reserved =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    reserved
        .bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .expect("addr")
                .into(),
        )
        .expect("bind");
    let addr = reserved
        .local_addr()
        .expect("addr")
        .as_socket()
        .expect("inet");
    let spec = Spec::new()
        .http("web", "app")
        .pool_with("app", FAST_CHECKS, &[(addr, 1)]);
    let baton = Baton::spawn(spec, &[]);
    support::eventually("/readyz 503 naming the pool", || async {
        client::get(baton.admin, "/readyz")
            .await
            .is_ok_and(|r| r.status == 503 && r.body.contains("pool app"))
    })
    .await;
    assert_eq!(
        client::get(baton.admin, "/healthz")
            .await
            .expect("healthz")
            .status,
        200
    );
    drop(reserved);
    let _backend = HttpBackend::start_on("a", addr).await;
    baton.wait_ready().await;
}

/// A drain that no backend of the new config takes is said: warned of
/// for a backend now named otherwise (its pool renamed, so its name too),
/// whose drain was dropped silently and which came back into rotation
/// with nothing said; a backend retired from the config is only noted,
/// though another pool's backend had its address all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_no_backend_takes_after_a_reload_is_said() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    // Pool `other` has `b` throughout; the first pool's name and members
    // are what the reloads change.
    let beside_other = |name: &str, members: &[std::net::SocketAddr]| {
        Spec::new()
            .http("web", name)
            .http("alt", "other")
            .pool(name, members)
            .pool("other", &[b.addr])
    };
    let baton = Baton::start(beside_other("app", &[a.addr, b.addr])).await;
    let admin = baton.admin;
    client::drain(admin, "app-0").await;
    client::drain(admin, "app-1").await;
    baton.write_spec(&beside_other("site", &[a.addr]), &Default::default());
    baton.reload_ok().await;
    assert_eq!(backend_state(admin, "site-0").await, "up");
    let log = baton.log();
    let said = |backend: &str, level: &str, words: &str| {
        log.lines().any(|l| {
            l.contains(level)
                && l.contains(words)
                && l.contains(&format!("pool=app backend={backend} "))
        })
    };
    assert!(
        said("app-0", " WARN ", "its drain is not carried") && log.contains("now_backend=site-0"),
        "{log}"
    );
    assert!(said("app-1", " INFO ", "left the config"), "{log}");
    assert!(
        !said("app-1", " WARN ", "its drain is not carried"),
        "{log}"
    );
    // Two backends that swap addresses: the drained machine is back in
    // rotation under the other name, which is warned of (it read as a
    // backend that only changed its address).
    client::drain(admin, "site-0").await;
    let swapped = beside_other("site", &[b.addr, a.addr]);
    baton.write_spec(&swapped, &Default::default());
    baton.reload_ok().await;
    let log = baton.log();
    assert!(
        log.lines().any(|l| l.contains(" WARN ")
            && l.contains("its drain is not carried")
            && l.contains("pool=site backend=site-0 ")
            && l.contains("now_backend=site-1")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_what_it_should_and_a_drain_survives_a_reload() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("token");
    let spec = Spec::new()
        .admin(&format!("token_file = \"{}\"", token_file.display()))
        .http("web", "app")
        .pool("app", &[a.addr, b.addr]);
    let baton = Baton::start(spec).await;
    let admin = baton.admin;
    let unsigned = client::call(admin, "POST", "/backends/app-0/drain", None)
        .await
        .expect("call");
    assert_eq!(unsigned.status, 401);
    assert_eq!(
        unsigned.headers["www-authenticate"], "Bearer",
        "RFC 9110 §11.6.1"
    );
    assert_eq!(
        client::call(admin, "POST", "/backends/app-0/drain", Some("wrong"))
            .await
            .expect("call")
            .status,
        401
    );
    let wrong_method = client::call(admin, "GET", "/backends/app-0/drain", Some("s3cret"))
        .await
        .expect("call");
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.headers["allow"], "POST");
    let on_status = client::call(admin, "POST", "/status", Some("s3cret"))
        .await
        .expect("call");
    assert_eq!(on_status.status, 405);
    assert_eq!(on_status.headers["allow"], "GET, HEAD");
    assert_eq!(
        client::call(admin, "POST", "/backends/nope/drain", Some("s3cret"))
            .await
            .expect("call")
            .status,
        404
    );
    assert_eq!(
        client::call(admin, "POST", "/backends/99/drain", Some("s3cret"))
            .await
            .expect("call")
            .status,
        404
    );
    assert_eq!(
        client::call(admin, "POST", "/backends/01/drain", Some("s3cret"))
            .await
            .expect("call")
            .status,
        400
    );
    // Negative and huge indexes: refused with a JSON error, no panic.
    for id in ["-1", "99999999999999999999999999"] {
        let refused = client::call(
            admin,
            "POST",
            &format!("/backends/{id}/drain"),
            Some("s3cret"),
        )
        .await
        .expect("call");
        assert!(
            refused.status == 400 || refused.status == 404,
            "{id}: {}",
            refused.status
        );
        assert!(
            refused
                .headers
                .get("content-type")
                .is_some_and(|v| v == "application/json"),
            "{id}: {:?}",
            refused.headers
        );
        assert!(refused.body.contains("\"error\""), "{id}: {}", refused.body);
    }
    // What a web page's form or script posts carries the browser's fields:
    // refused, token or not (a page on this host, or one that rebinds its
    // DNS name to it, reaches the loopback admin).
    for browser in [
        ("origin", "http://evil.example"),
        ("origin", "null"),
        ("sec-fetch-site", "cross-site"),
    ] {
        let refused = client::call_with(
            admin,
            "POST",
            "/backends/0/drain",
            Some("s3cret"),
            &[browser],
        )
        .await
        .expect("call");
        assert_eq!(refused.status, 403, "{browser:?}: {}", refused.body);
        assert!(refused.body.contains("web page"), "{}", refused.body);
    }
    assert_eq!(
        backend_state(admin, "app-0").await,
        "up",
        "a page drains nothing"
    );
    // A page whose DNS name was rebound to the loopback admin reads
    // nothing: its Host is a DNS name. Probes answer all.
    let as_host = |host: &'static str, path: &'static str| async move {
        client::call_with(admin, "GET", path, None, &[("host", host)])
            .await
            .expect("call")
            .status
    };
    assert_eq!(as_host("rebound.example:9901", "/status").await, 403);
    assert_eq!(as_host("rebound.example", "/metrics").await, 403);
    assert_eq!(as_host("127.0.0.1.nip.io.", "/status").await, 403);
    assert_eq!(as_host("rebound.example", "/healthz").await, 200);
    for host in [
        "localhost:9901",
        "127.0.0.1",
        "[::1]:9901",
        "app.localhost",
        "admin",
        "localhost.",
        "localhost4.localdomain4",
    ] {
        assert_eq!(as_host(host, "/status").await, 200, "{host}");
    }
    let drained = client::call_with(
        admin,
        "POST",
        "/backends/0/drain",
        Some("s3cret"),
        &[("sec-fetch-site", "none")],
    )
    .await
    .expect("call");
    assert_eq!(drained.status, 200, "{}", drained.body);
    assert!(drained
        .headers
        .get("content-type")
        .is_some_and(|v| v == "application/json"));
    support::eventually("a is out", || async {
        backend_state(admin, "app-0").await == "out"
    })
    .await;

    let old = baton.serving_pid().await;
    baton.reload_ok().await;
    assert_eq!(wait_exit(old).await, Some(0));
    assert_eq!(
        backend_state(admin, "app-0").await,
        "out",
        "an operator's drain survives a reload"
    );
    let metrics = client::metrics(admin).await;
    for (state, value) in [("out", 1.0), ("up", 0.0), ("draining", 0.0)] {
        let series =
            format!("baton_backend_state{{pool=\"app\",backend=\"app-0\",state=\"{state}\"}}");
        assert_eq!(client::series(&metrics, &series), Some(value), "{series}");
    }
    // `baton status` prints the same as a table, and `--json` raw.
    baton.settled().await;
    let out = baton_cli(&["status"], &baton.config).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains("app-0"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" out "), "{row}");
    assert!(
        table.contains("pool app (1/2 up)") && table.contains("kernel (this network namespace)"),
        "{table}"
    );
    let out = baton_cli(&["status", "--json"], &baton.config).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
    assert_eq!(v["generations"].as_array().map(Vec::len), Some(1));
    // A config broken outside `[admin]` (an edit under way, a certificate
    // gone) still finds the serving daemon: `status` and `backend` read
    // only what reaches it.
    let mut broken = baton.config_text();
    broken.push_str("\nnot_a_key = 1\n");
    baton.write_config(&broken);
    for args in [&["status"][..], &["backend", "drain", "0"][..]] {
        let out = baton_cli(args, &baton.config).await;
        assert!(
            out.status.success(),
            "{args:?} with a config broken elsewhere: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A refusal says what was asked and the API's own words.
    let out = baton_cli(&["backend", "drain", "nope"], &baton.config).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "baton: the admin API refused POST /backends/nope/drain (404): no backend named \"nope\""
    );
    // `status` reads no token, so a user who cannot read the token file
    // (a monitoring user; here, the file gone) still gets it; `backend`
    // needs it.
    std::fs::remove_file(&token_file).expect("remove the token");
    let out = baton_cli(&["status"], &baton.config).await;
    assert!(
        out.status.success(),
        "status without the token file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = baton_cli(&["backend", "restore", "0"], &baton.config).await;
    assert_eq!(out.status.code(), Some(78), "backend needs the token");
    let before = a.hits();
    for i in 0..10 {
        assert_eq!(
            client::get(baton.addr("web"), &format!("/{i}"))
                .await
                .expect("get")
                .status,
            200
        );
    }
    assert_eq!(a.hits(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_pick_pools_by_path_prefix_and_host() {
    let (main, slow, api) = (
        HttpBackend::start("main").await,
        HttpBackend::start("slow").await,
        HttpBackend::start("api").await,
    );
    let spec = Spec::new()
        .listener(
            "web",
            "http",
            "app",
            "routes = [ { path_prefix = \"/slow\", pool = \"slowpool\" }, { host = \"API.example.com\", pool = \"api\" }, { host = \"static.example.com.\", pool = \"slowpool\" } ]",
        )
        .pool("app", &[main.addr])
        .pool("slowpool", &[slow.addr])
        .pool("api", &[api.addr])
        .http("other", "spare")
        .pool("spare", &[main.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    assert_eq!(
        client::get(web, "/slow/1").await.expect("get").body,
        HttpBackend::body_for("slow", "/slow/1")
    );
    assert_eq!(
        client::get(web, "/other").await.expect("get").body,
        HttpBackend::body_for("main", "/other")
    );
    let mut conn = client::connect(web).await.expect("connect");
    let answer = client::send_with_host(&mut conn, "api.example.com:8080", "/v1")
        .await
        .expect("get");
    assert_eq!(answer.body, HttpBackend::body_for("api", "/v1"));
    // A final dot names the same host, in the request and in the route.
    let answer = client::send_with_host(&mut conn, "api.example.com.", "/v2")
        .await
        .expect("get");
    assert_eq!(answer.body, HttpBackend::body_for("api", "/v2"));
    let answer = client::send_with_host(&mut conn, "Static.example.com", "/v3")
        .await
        .expect("get");
    assert_eq!(answer.body, HttpBackend::body_for("slow", "/v3"));
    // Both the first route and the second match: the first wins.
    let answer = client::send_with_host(&mut conn, "api.example.com", "/slow/4")
        .await
        .expect("get");
    assert_eq!(answer.body, HttpBackend::body_for("slow", "/slow/4"));
    // A listener's request series are for the pools it may send to, each
    // once: not for every pool of the config (25 series a pair, carried
    // in every reload's report).
    let text = client::metrics(baton.admin).await;
    let pairs: std::collections::BTreeSet<String> = text
        .lines()
        .filter(|l| l.starts_with("baton_requests_total{"))
        .filter_map(|l| {
            let listener = l.split("listener=\"").nth(1)?.split('"').next()?;
            let pool = l.split("pool=\"").nth(1)?.split('"').next()?;
            Some(format!("{listener}>{pool}"))
        })
        .collect();
    assert_eq!(
        pairs.into_iter().collect::<Vec<_>>(),
        ["other>spare", "web>api", "web>app", "web>slowpool"],
        "{text}"
    );
}

/// `baton ARGS -c CONFIG`, run to its end.
async fn baton_cli(args: &[&str], config: &std::path::Path) -> std::process::Output {
    tokio::process::Command::new(support::daemon::BIN)
        .args(args)
        .arg("-c")
        .arg(config)
        .output()
        .await
        .expect("run baton")
}

/// A pool of `a` alone with one place (`max_connections_per_backend = 1`),
/// where work waits in line up to `queue_timeout`.
fn one_place(a: &HttpBackend, queue_timeout: &str) -> Spec {
    Spec::new().http("web", "app").pool_with(
        "app",
        &format!("max_connections_per_backend = 1\nqueue_timeout = \"{queue_timeout}\""),
        &[(a.addr, 1)],
    )
}

/// A `/gated` request through `web` holding `a`'s only place.
async fn hold_the_place(
    a: &HttpBackend,
    web: std::net::SocketAddr,
) -> tokio::task::JoinHandle<Result<client::Answer, String>> {
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the first request holds the only place", || async {
        a.held() == 1
    })
    .await;
    held
}

/// `max_connections_per_backend` caps what one backend is given at once:
/// further work waits in line and gets the first place that frees up, or a
/// 503 after `queue_timeout` (counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_at_its_cap_queues_work_then_refuses_it_at_queue_timeout() {
    let a = HttpBackend::start("a").await;
    // Well past the 300 ms the second request is watched waiting in line.
    let baton = Baton::start(one_place(&a, "3s")).await;
    let web = baton.addr("web");
    let held = hold_the_place(&a, web).await;
    let queued = tokio::spawn(async move { client::get(web, "/queued").await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!queued.is_finished(), "the second request waits in line");
    assert_eq!(a.hits(), 1, "the backend was given one request at a time");
    a.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    let answer = queued.await.expect("join").expect("queued");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/queued"));

    a.hold_again();
    let slow = hold_the_place(&a, web).await;
    let refused = client::get(web, "/refused").await.expect("an answer");
    assert_eq!(refused.status, 503);
    assert!(
        client::metrics(baton.admin)
            .await
            .contains("baton_queue_timeouts_total{pool=\"app\"} 1"),
        "counted"
    );
    a.release();
    assert_eq!(slow.await.expect("join").expect("slow").status, 200);
}

/// A retry (its first backend could not be reached) that times out in
/// line answers with the first failure, a 502: no queue timeout is
/// counted for it, as no client was refused for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_times_out_in_line_is_answered_and_counted_as_its_first_failure() {
    let a = HttpBackend::start("a").await;
    let (dead, _reserved) = dead_addr();
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "max_connections_per_backend = 1\nqueue_timeout = \"300ms\"",
        &[(dead, 1), (a.addr, 1)],
    );
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let held = hold_the_place(&a, web).await;
    let asked = std::time::Instant::now();
    let answer = client::get(web, "/retried").await.expect("an answer");
    assert_eq!(answer.status, 502, "{}", answer.body);
    assert!(
        asked.elapsed() >= std::time::Duration::from_millis(300),
        "the retry waited in line for queue_timeout"
    );
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains("baton_queue_timeouts_total{pool=\"app\"} 0"),
        "{metrics}"
    );
    a.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
}

/// Work waiting in line for a place is woken when a backend comes up, not
/// only when a place frees up on the busy one: it goes to the newcomer at
/// once instead of timing out behind the busy backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_in_line_goes_to_a_backend_that_comes_up() {
    let a = HttpBackend::start("a").await;
    let (b_addr, reserved) = dead_addr();
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "max_connections_per_backend = 1\nqueue_timeout = \"10s\"\nhealth = { kind = \"tcp\", interval = \"100ms\", timeout = \"500ms\", rise = 1, fall = 1 }",
        &[(a.addr, 1), (b_addr, 1)],
    );
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    support::eventually("b is down", || async {
        backend_state(baton.admin, "app-1").await == "down"
    })
    .await;
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the first request holds a's only place", || async {
        a.held() == 1
    })
    .await;
    let queued = tokio::spawn(async move { client::get(web, "/queued").await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!queued.is_finished(), "it waits in line");
    drop(reserved);
    let b = HttpBackend::start_on("b", b_addr).await;
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), queued)
        .await
        .expect("answered once b is up, well before queue_timeout")
        .expect("join")
        .expect("queued");
    assert_eq!(answer.body, HttpBackend::body_for("b", "/queued"));
    assert_eq!(b.hits(), 1);
    a.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
}

/// A backend drained while the older generation still has work on it
/// stays `draining` in the newer one until that work is done, not `out` at
/// once: an operator waiting for `out` to redeploy it would cut the older
/// generation's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_carried_across_a_reload_is_out_only_once_the_older_generations_work_ends() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let spec = Spec::new()
        .http("web", "app")
        .pool("app", &[a.addr, b.addr]);
    let baton = Baton::start(spec).await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { client::get(web, "/gated").await }))
        .collect();
    support::eventually("a request held on each backend", || async {
        a.held() == 1 && b.held() == 1
    })
    .await;
    client::drain(admin, "app-0").await;
    assert_eq!(backend_state(admin, "app-0").await, "draining");
    baton.reload_ok().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        backend_state(admin, "app-0").await,
        "draining",
        "generation 1 still has a request on it"
    );
    let again = client::call(admin, "POST", "/backends/app-0/drain", None)
        .await
        .expect("drain again");
    assert!(
        again.body.contains("\"draining\""),
        "said again, still draining: {}",
        again.body
    );
    a.release();
    b.release();
    for h in held {
        assert_eq!(h.await.expect("join").expect("held").status, 200);
    }
    support::eventually("out once generation 1 is done", || async {
        backend_state(admin, "app-0").await == "out"
    })
    .await;
}

/// A drain posted after a reload, while the older generation still has a
/// request on the backend, stays `draining` until that generation's work
/// ends, not `out` at once because the serving generation has nothing in
/// flight there: an operator who stops the backend at `out` cuts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_posted_after_a_reload_waits_for_the_older_generations_work() {
    let a = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[a.addr])).await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("a request held on a", || async { a.held() == 1 }).await;
    baton.reload_ok().await;
    client::drain(admin, "app-0").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        backend_state(admin, "app-0").await,
        "draining",
        "generation 1 still has a request on it"
    );
    a.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    support::eventually("out once generation 1 is done", || async {
        backend_state(admin, "app-0").await == "out"
    })
    .await;
}

/// A client that goes away while its request waits in line loses its
/// place, and its request reaches no backend (as nginx does not send a
/// request whose client closed, and HAProxy's `abortonclose`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_left_while_in_line_reaches_no_backend() {
    use tokio::io::AsyncWriteExt;
    let a = HttpBackend::start("a").await;
    // Longer than any wait below: the ghost leaves its place, not timed out.
    let baton = Baton::start(one_place(&a, "60s")).await;
    let web = baton.addr("web");
    let held = hold_the_place(&a, web).await;
    let mut ghost = tokio::net::TcpStream::connect(web).await.expect("connect");
    ghost
        .write_all(b"GET /ghost HTTP/1.1\r\nhost: app\r\n\r\n")
        .await
        .expect("request");
    // Taken by baton (a pause could end first on a loaded machine, and a
    // ghost taken after the place freed up would be served), then gone
    // for baton too (its place in line left), however slow the turn.
    client::until_serving(baton.admin, "web", 2).await;
    drop(ghost);
    client::until_serving(baton.admin, "web", 1).await;
    a.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    let after = client::get(web, "/after").await.expect("answer");
    assert_eq!(after.status, 200);
    assert_eq!(
        a.hits(),
        2,
        "the gated request and the one after, not the ghost"
    );
}

/// A reload that adds health checks to a pool lets their first round
/// decide: a backend that was taken for healthy unchecked, and is down,
/// is out at once, not after `fall` more failures (the unchecked
/// generation's "healthy" was carried over as a check's verdict).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_added_by_a_reload_decide_at_their_first_round() {
    let a = HttpBackend::start("a").await;
    let (dead, _held) = support::daemon::dead_addr();
    let spec = Spec::new()
        .http("web", "app")
        .pool_with("app", "", &[(a.addr, 1), (dead, 1)]);
    let baton = Baton::start(spec).await;
    let admin = baton.admin;
    assert_eq!(backend_state(admin, "app-1").await, "up", "unchecked");
    let checked = Spec::new().http("web", "app").pool_with(
        "app",
        "health = { kind = \"tcp\", interval = \"20s\", timeout = \"1s\", rise = 2, fall = 3 }",
        &[(a.addr, 1), (dead, 1)],
    );
    baton.write_spec(&checked, &Default::default());
    baton.reload_ok().await;
    assert_eq!(backend_state(admin, "app-1").await, "down");
    assert_eq!(backend_state(admin, "app-0").await, "up");
}

/// A reload that changes what a pool's checks ask (here the path) lets
/// the new check's first round decide: the old check's verdict, carried
/// at the go-ahead, overwrote it, and a backend the new check fails kept
/// its traffic until `fall` more intervals went by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_check_decides_at_its_first_round() {
    let backend = support::raw::RawBackend::start(|seen| {
        let code = if seen.head.starts_with("GET /ready ") {
            503
        } else {
            200
        };
        let head = format!("HTTP/1.1 {code} Whatever\r\ncontent-length: 0\r\n\r\n");
        (head.into_bytes(), support::raw::Then::Close)
    })
    .await;
    let checks = |path: &str| {
        format!("health = {{ kind = \"http\", path = \"{path}\", interval = \"30s\", timeout = \"1s\", rise = 1, fall = 3 }}")
    };
    let spec = |path: &str| {
        Spec::new()
            .http("web", "app")
            .pool_with("app", &checks(path), &[(backend.addr, 1)])
    };
    let baton = Baton::start(spec("/health")).await;
    let admin = baton.admin;
    assert_eq!(backend_state(admin, "app-0").await, "up");
    baton.write_spec(&spec("/ready"), &Default::default());
    baton.reload_ok().await;
    assert_eq!(backend_state(admin, "app-0").await, "down");
}

/// A backend's failures in a row go on counting across a reload (and so
/// its passes while down, the same carried streak): reset at each
/// reload, a backend failing its checks would never reach `fall` under
/// reloads closer together than `fall` intervals, nor a recovered one
/// `rise`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_carries_a_backends_health_streak() {
    let b = HttpBackend::start("b").await;
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "health = { kind = \"http\", path = \"/health\", interval = \"4s\", timeout = \"1s\", rise = 2, fall = 5 }",
        &[(b.addr, 1)],
    );
    let baton = Baton::start(spec).await;
    let admin = baton.admin;
    assert_eq!(backend_state(admin, "app-0").await, "up");
    b.kill();
    let failures = || async {
        client::backend_status(admin, "app-0").await["consecutive_failures"]
            .as_u64()
            .unwrap_or(0)
    };
    support::eventually("two failed checks", || async { failures().await >= 2 }).await;
    baton.reload_ok().await;
    // The old generation's streak at the go-ahead is carried over the new
    // one's own first check (2, or 3 with the old one's third before it,
    // and 4 with a check of the new one's since); a streak reset by the
    // reload reads 0, or 1 once a check came since.
    let carried = failures().await;
    assert!(
        (2..5).contains(&carried),
        "failures in a row after the reload: {carried}"
    );
    assert_eq!(backend_state(admin, "app-0").await, "up", "not yet at fall");
}
