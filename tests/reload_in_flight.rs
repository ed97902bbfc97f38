//! Work in flight across a reload finishes where it started: a slow request
//! completes from the old generation, an idle keep-alive connection still
//! takes its next request, and only work outliving the drain budget is
//! force-closed (exit 3), without touching the new generation.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::signal::Signal;
use support::backend::HttpBackend;
use support::client;
use support::daemon::{signal, wait_exit, Baton, Notifications, Spec};
use tokio::net::TcpStream;

async fn start(drain: &str) -> (HttpBackend, Baton) {
    start_with_grace(drain, "1s").await
}

/// A daemon whose listener gives idle keep-alive connections `grace` of a
/// drain: a test whose client speaks after a reload returned needs more
/// than the default second on a loaded machine (the CLI's exit and a
/// control round trip come first).
async fn start_with_grace(drain: &str, grace: &str) -> (HttpBackend, Baton) {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .section(&format!("[reload]\ndrain_timeout = \"{drain}\"\n"))
        .listener(
            "web",
            "http",
            "app",
            &format!("keepalive_drain_grace = \"{grace}\""),
        )
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    (backend, baton)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_across_a_reload_completes_from_the_old_generation() {
    let (backend, baton) = start("10s").await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let mut conn = client::connect(web).await.expect("connect");
    let slow = tokio::spawn(async move { client::send(&mut conn, web, "/gated").await });
    support::eventually("backend holds the request", || async {
        backend.held() == 1
    })
    .await;

    let new = baton.reload_ok().await;
    assert_ne!(new, old);
    backend.release();
    let answer = slow
        .await
        .expect("join")
        .expect("the held request must complete");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, HttpBackend::body_for("a", "/gated"));
    assert_eq!(
        answer.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..]),
        "a draining generation closes keep-alive after the response"
    );
    assert_eq!(
        wait_exit(old).await,
        Some(0),
        "old generation drained cleanly"
    );
    assert_eq!(
        client::get(web, "/after")
            .await
            .expect("new generation serves")
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_takes_its_next_request_after_a_reload() {
    let (_backend, baton) = start_with_grace("10s", "5s").await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let mut conn = client::connect(web).await.expect("connect");
    let first = client::send(&mut conn, web, "/one")
        .await
        .expect("first request");
    assert_eq!(first.status, 200);
    assert!(first.headers.get("connection").is_none());

    baton.reload_ok().await;
    // The connection is idle on the old generation; a client may send on it
    // at any moment, and that request must be answered, not reset.
    let second = client::send(&mut conn, web, "/two")
        .await
        .expect("request on the idle connection");
    assert_eq!(second.status, 200);
    assert_eq!(second.body, HttpBackend::body_for("a", "/two"));
    assert_eq!(
        second.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    assert_eq!(wait_exit(old).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_grace() {
    let (_backend, baton) = start("10s").await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let mut conn = client::connect(web).await.expect("connect");
    assert_eq!(
        client::send(&mut conn, web, "/one")
            .await
            .expect("request")
            .status,
        200
    );
    baton.reload_ok().await;
    // keepalive_drain_grace defaults to 1s: the old generation closes the
    // idle connection then, and exits without waiting for its drain budget.
    support::eventually("idle connection closed by the old generation", || async {
        conn.is_closed()
    })
    .await;
    assert_eq!(wait_exit(old).await, Some(0));
}

/// A connection that has sent nothing yet (a browser's preconnect) is
/// closed after the drain's grace, as an idle keep-alive one is, quietly
/// (no 408): held to `header_timeout`, it kept the old generation to its
/// drain budget and was counted forced (exit 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sent_nothing_is_closed_after_the_grace() {
    use tokio::io::AsyncReadExt;
    let (_backend, baton) = start("4s").await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let mut silent = tokio::net::TcpStream::connect(web).await.expect("connect");
    support::eventually("the old generation holds it", || async {
        support::daemon::client_connections(old, web.port()) == 1
    })
    .await;
    baton.reload_ok().await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), silent.read_to_end(&mut got)).await;
    assert!(
        matches!(read, Ok(Ok(0))),
        "closed quietly, nothing said: {read:?} {got:?}"
    );
    assert_eq!(wait_exit(old).await, Some(0), "drained, nothing forced");
}

/// The grace counts from the drain's start, not from when the connection
/// went idle: a client idle for long may be sending its next request just
/// as the drain begins (the request HAProxy and nginx lose on a reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_idle_since_before_the_drain_still_gets_its_grace() {
    let (_backend, baton) = start_with_grace("10s", "3s").await;
    let web = baton.addr("web");
    let mut conn = client::connect(web).await.expect("connect");
    let first = client::send(&mut conn, web, "/one").await.expect("request");
    assert_eq!(first.status, 200);
    // Idle past keepalive_drain_grace (3 s) before the drain begins.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    baton.reload_ok().await;
    let second = client::send(&mut conn, web, "/two")
        .await
        .expect("served within the grace");
    assert_eq!(second.status, 200);
    assert_eq!(
        second.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_outliving_the_drain_budget_is_forced_and_exits_3() {
    let (backend, baton) = start("1s").await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let slow = tokio::spawn(async move { client::get(web, "/slow/8000").await });
    support::eventually("backend saw the slow request", || async {
        backend.hits.load(Ordering::Relaxed) == 1
    })
    .await;

    let new = baton.reload_ok().await;
    assert_eq!(wait_exit(old).await, Some(3), "forced drain exits 3");
    let outcome = tokio::time::timeout(Duration::from_secs(5), slow)
        .await
        .expect("forced close ends the request")
        .expect("join");
    assert!(
        outcome.is_err(),
        "the forced request cannot have succeeded: {outcome:?}"
    );
    let fresh = client::get(web, "/fresh")
        .await
        .expect("new generation unaffected");
    assert_eq!(fresh.status, 200);
    assert_eq!(baton.serving_pid().await, new);
    assert!(
        baton.log().contains(
            "connections force-closed (their clients need longer than reload.drain_timeout)"
        ),
        "the log says the drain's deadline forced connections, and which key: {}",
        baton.log()
    );
    // What the shipped alert (BatonDrainsForced) watches, carried to the
    // serving generation.
    let admin = baton.admin;
    support::eventually("the forced connection counted", || async move {
        let metrics = client::metrics(admin).await;
        client::series(
            &metrics,
            "baton_drain_forced_connections_total{reason=\"reload\"}",
        ) == Some(1.0)
    })
    .await;
}

/// A port on `[::1]` nobody listens on, from those handed out for
/// daemons (free on 127.0.0.1 too).
fn ipv6_free_addr() -> std::net::SocketAddr {
    for _ in 0..10 {
        let port = support::daemon::free_addr().port();
        let addr = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free port on [::1]");
}

/// Listeners bound on IPv6 (`[::1]`, HTTP and TCP) before an IPv6 backend
/// are handed over by a reload as IPv4 ones are: the same kernel sockets,
/// serving all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_listeners_and_backends_serve_across_a_reload() {
    let v6_loopback = [
        "grep",
        "-q",
        "00000000000000000000000000000001",
        "/proc/net/if_inet6",
    ];
    if !support::possible_or_skipped(&v6_loopback, "IPv6 on loopback (::1)") {
        return;
    }
    let backend = support::raw::RawBackend::start_on("[::1]:0", |_| {
        (support::raw::ok("v6"), support::raw::Then::KeepAlive)
    })
    .await;
    let (web, raw) = (ipv6_free_addr(), ipv6_free_addr());
    let spec = Spec::new()
        .section(&format!(
            "[[listeners]]\nname = \"web6\"\nbind = \"{web}\"\npool = \"v6\"\n\n[[listeners]]\nname = \"raw6\"\nbind = \"{raw}\"\nprotocol = \"tcp\"\npool = \"v6\"\n\n[[pools]]\nname = \"v6\"\nbackends = [{{ address = \"{}\" }}]\n",
            backend.addr
        ));
    let baton = Baton::start(spec).await;
    let sockets = (
        support::listening_inodes(web.port()),
        support::listening_inodes(raw.port()),
    );
    assert!(
        !sockets.0.is_empty() && !sockets.1.is_empty(),
        "{sockets:?}"
    );
    let served = |addr| async move {
        let answer = client::get(addr, "/").await.expect("an answer");
        assert_eq!((answer.status, answer.body.as_str()), (200, "v6"), "{addr}");
    };
    for addr in [web, raw] {
        served(addr).await;
    }
    let old = baton.serving_pid().await;
    baton.reload_ok().await;
    assert_eq!(wait_exit(old).await, Some(0));
    for addr in [web, raw] {
        served(addr).await;
    }
    assert_eq!(
        (
            support::listening_inodes(web.port()),
            support::listening_inodes(raw.port())
        ),
        sockets,
        "the same sockets"
    );
}

/// What a reload tells systemd (DESIGN): `RELOADING=1`, then the new
/// generation's pid as `MAINPID=` and `READY=1`; the old generation, draining after it,
/// never says `STOPPING=1` (systemd would take the service as stopping),
/// which the stop alone says, once, after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_says_reloading_then_the_new_main_pid_and_only_a_stop_says_stopping() {
    let notifications = Notifications::listen();
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
    let baton = Baton::spawn_under(spec, &[], &["env", &notifications.env]);
    baton.wait_ready().await;
    let old = baton.first_pid;
    let new = baton.reload_ok().await;
    assert_eq!(wait_exit(old).await, Some(0));
    signal(new, Signal::SIGTERM);
    assert_eq!(wait_exit(new).await, Some(0));
    let said = notifications.said().await;
    let first = |what: &str| said.iter().position(|s| s.lines().any(|l| l == what));
    let reloading = first("RELOADING=1").unwrap_or_else(|| panic!("{said:?}"));
    let main = first(&format!("MAINPID={new}")).unwrap_or_else(|| panic!("{said:?}"));
    assert!(reloading < main, "{said:?}");
    // READY=1 ends systemd's reloading state.
    assert!(
        said[main..]
            .iter()
            .any(|s| s.lines().any(|l| l == "READY=1")),
        "{said:?}"
    );
    let stopping: Vec<usize> = said
        .iter()
        .enumerate()
        .filter(|(_, s)| s.lines().any(|l| l == "STOPPING=1"))
        .map(|(at, _)| at)
        .collect();
    assert_eq!(stopping.len(), 1, "{said:?}");
    assert!(stopping[0] > main, "{said:?}");
}

/// With `max_draining = 1`: generation 1 drains a request for `path`
/// after a reload, and generation 2 serves.
struct OneDraining {
    backend: HttpBackend,
    baton: Baton,
    first: u32,
    second: u32,
    on_first: tokio::task::JoinHandle<Result<client::Answer, String>>,
}

async fn one_draining(path: &'static str) -> OneDraining {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .section("[reload]\ndrain_timeout = \"60s\"\nmax_draining = 1\n")
        .http("web", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let first = baton.serving_pid().await;
    let on_first = tokio::spawn(async move { client::get(web, path).await });
    support::eventually("first slow request arrived", || async {
        backend.hits.load(Ordering::Relaxed) == 1
    })
    .await;
    let second = baton.reload_ok().await;
    OneDraining {
        backend,
        baton,
        first,
        second,
        on_first,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_draining_the_oldest_generation_is_forced() {
    let OneDraining {
        backend,
        baton,
        first,
        second,
        on_first,
    } = one_draining("/slow/30000").await;
    let web = baton.addr("web");
    let on_second = tokio::spawn(async move { client::get(web, "/slow/1500").await });
    support::eventually("second slow request arrived", || async {
        backend.hits.load(Ordering::Relaxed) == 2
    })
    .await;

    // Generation 1 drains; a reload now would make two draining, one too many.
    baton.reload_ok().await;
    assert_eq!(wait_exit(first).await, Some(3), "the oldest is forced");
    assert!(on_first.await.expect("join").is_err());
    assert!(
        baton.log().contains(
            "SIGUSR2 ended the drain (sent by the serving generation past reload.max_draining"
        ),
        "the log says why it was forced (not a deadline): {}",
        baton.log()
    );
    let answer = on_second
        .await
        .expect("join")
        .expect("generation 2 keeps draining normally");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/slow/1500"));
    assert_eq!(wait_exit(second).await, Some(0));
}

/// The oldest draining generation is forced only by a reload that
/// succeeds: a reload refused for a broken config adds no draining
/// generation, and the old one's work carries on to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reload_beyond_max_draining_forces_nobody() {
    let OneDraining {
        backend,
        baton,
        first,
        second,
        on_first,
    } = one_draining("/gated").await;

    // By SIGHUP: `baton reload` would refuse the file itself, and the
    // daemon would never try.
    let good = baton.config_text();
    baton.write_config(&format!("{good}\nno_such_key = 1\n"));
    signal(second, Signal::SIGHUP);
    support::eventually("the reload failed", || async {
        baton
            .log()
            .contains("reload failed; this generation keeps serving")
    })
    .await;
    // Held by the backend until now: a force would have cut it.
    backend.release();
    let answer = on_first
        .await
        .expect("join")
        .expect("generation 1 drains on, not forced");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/gated"));
    assert_eq!(wait_exit(first).await, Some(0), "drained, not forced");
    assert_eq!(baton.serving_pid().await, second);
}

/// Generation 1 with a `/gated` request the backend holds (released only
/// by the test), a reload drain of 60 s and a stop's of `stop_drain`.
async fn old_generation_holding_a_request(
    stop_drain: &str,
) -> (
    HttpBackend,
    Baton,
    u32,
    tokio::task::JoinHandle<Result<client::Answer, String>>,
) {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::default()
        .section("[reload]\ndrain_timeout = \"60s\"\n")
        .section(&format!(
            "[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"{stop_drain}\"\n"
        ))
        .http("web", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the backend holds the request", || async {
        backend.held() == 1
    })
    .await;
    (backend, baton, old, held)
}

/// A stop as systemd makes it (`KillMode=control-group`): SIGTERM to every
/// generation at once, then, once the main process has exited, SIGTERM
/// again to whatever is left. The serving generation exits only after the
/// older ones have drained, so that second signal, which a draining
/// generation takes as "force now", cuts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_of_every_generation_lets_the_old_ones_drain_before_the_main_exits() {
    let (backend, baton, old, held) = old_generation_holding_a_request("20s").await;
    let main = baton.reload_ok().await;

    signal(old, Signal::SIGTERM);
    signal(main, Signal::SIGTERM);
    // As systemd does: once the main process has exited, SIGTERM to what is
    // left of the unit (the old generation may have exited and wait to be
    // reaped: a signal to it is harmless then).
    let final_sigterm = tokio::spawn(async move {
        let code = wait_exit(main).await;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), Signal::SIGTERM);
        code
    });
    // The request ends once the main has drained its own and waits: a main
    // that did not wait would be gone by then, and its final SIGTERM would
    // have cut it.
    support::eventually("the main waits for the older generation", || async {
        baton
            .log()
            .contains("drained; waiting for the other generations to finish")
    })
    .await;
    backend.release();
    let answer = held
        .await
        .expect("join")
        .expect("the old generation's request completes");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/gated"));
    assert_eq!(final_sigterm.await.expect("join"), Some(0));
    assert_eq!(wait_exit(old).await, Some(0), "drained, not forced");
}

/// The stop's exit code counts what it cut in the older generations too:
/// a request of the old one that outlives the stop's deadline is forced
/// there, and the serving generation, with nothing of its own cut, still
/// exits 3 (systemd records that, not the old one's code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_that_cuts_an_older_generations_request_exits_3() {
    let (_backend, baton, old, held) = old_generation_holding_a_request("1s").await;
    let main = baton.reload_ok().await;
    signal(old, Signal::SIGTERM);
    signal(main, Signal::SIGTERM);
    assert_eq!(wait_exit(old).await, Some(3), "forced at the stop's end");
    assert!(held.await.expect("join").is_err());
    assert_eq!(wait_exit(main).await, Some(3), "the main says what was cut");
}

/// The same with a generation between them, drained already and waiting
/// for the oldest to exit (its counts reach the serving one only through
/// it): the stop keeps it waiting, so what the stop cuts in the oldest
/// still reaches the main, whose exit says so (it said 0: the middle one
/// left at the stop, and the oldest's count with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_that_cuts_the_oldest_of_three_generations_exits_3() {
    let (_backend, baton, old, held) = old_generation_holding_a_request("1s").await;
    let middle = baton.reload_ok().await;
    let main = baton.reload_ok().await;
    support::eventually(
        "the middle one drained and waits for the oldest",
        || async {
            baton
                .log()
                .contains("drain over; waiting for the older generation to exit")
        },
    )
    .await;
    for pid in [old, middle, main] {
        signal(pid, Signal::SIGTERM);
    }
    assert_eq!(wait_exit(old).await, Some(3), "forced at the stop's end");
    assert!(held.await.expect("join").is_err());
    assert!(wait_exit(middle).await.is_some(), "the middle one exited");
    assert_eq!(wait_exit(main).await, Some(3), "the main says what was cut");
}

/// A second stop signal to the serving generation while it drains forces
/// the older generations too, at once: it does not wait for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_forces_the_older_generations_too() {
    let (backend, baton, old, on_old) = old_generation_holding_a_request("60s").await;
    let main = baton.reload_ok().await;
    let web = baton.addr("web");
    let on_main = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the backend holds the new generation's request", || async {
        backend.held() == 2
    })
    .await;

    signal(main, Signal::SIGTERM);
    support::eventually("its drain started (the old one's was first)", || async {
        baton.log().matches("drain started").count() == 2
    })
    .await;
    signal(main, Signal::SIGTERM);
    assert_eq!(wait_exit(main).await, Some(3), "forced, long before 60 s");
    assert_eq!(wait_exit(old).await, Some(3), "forced too");
    assert!(on_main.await.expect("join").is_err());
    assert!(on_old.await.expect("join").is_err());
}

/// A backend drained in the serving generation shows `out` only once every
/// older generation is gone, not only the one it took over from: here the
/// middle one's shorter drain budget lets it exit while the oldest still
/// has a request on the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_every_older_generation_not_only_the_last() {
    let (backend, baton, oldest, held) = old_generation_holding_a_request("5s").await;
    let shorter = baton
        .config_text()
        .replace("drain_timeout = \"60s\"", "drain_timeout = \"1s\"");
    baton.write_config(&shorter);
    let middle = baton.reload_ok().await;
    baton.reload_ok().await;
    assert_eq!(wait_exit(middle).await, Some(0), "gone after its 1 s wait");

    client::drain(baton.admin, "app-0").await;
    let status = client::backend_status(baton.admin, "app-0").await;
    assert_eq!(
        status["state"], "draining",
        "the oldest still uses it: {status}"
    );

    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    assert_eq!(wait_exit(oldest).await, Some(0));
    support::eventually("out once the oldest is gone", || async {
        client::backend_status(baton.admin, "app-0").await["state"] == "out"
    })
    .await;
}

/// An HTTP listener to `backend` whose reload drains for 30 s, and
/// `shutdown`'s keys: a draining generation that is then stopped ends at
/// its stop's deadline, which is what these tests look at.
fn stopped_while_draining(shutdown: &str, backend: &HttpBackend) -> Spec {
    Spec::default()
        .section("[reload]\ndrain_timeout = \"30s\"\n")
        .section(&format!("[shutdown]\n{shutdown}\n"))
        .http("web", "app")
        .pool("app", &[backend.addr])
}

/// With `pre_stop_delay` under 1.5 s, a stop keeps a deferring listener's
/// doors open 1.5 s anyway (its held-back connections), and a draining
/// generation that is stopped counts that pause too: its drain ends with
/// the serving generation's, where it ended 1.5 s earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_draining_generation_counts_the_held_back_wait_as_its_pause() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(stopped_while_draining(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"2s\"",
        &backend,
    ))
    .await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    let old = baton.serving_pid().await;
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the request held by the backend", || async {
        backend.held() == 1
    })
    .await;
    baton.reload_ok().await;
    let signalled = support::unix_now();
    signal(old, Signal::SIGTERM);
    let deadline = || async {
        client::status(admin).await["generations"][1]["drain_deadline"]
            .as_f64()
            .unwrap_or(f64::MAX)
    };
    // The stop's deadline, not the reload's 30 s, once a report brings it.
    let after = std::cell::Cell::new(f64::MAX);
    support::eventually(
        "the stop's deadline in the old generation's report",
        || async {
            after.set(deadline().await - signalled);
            after.get() < 10.0
        },
    )
    .await;
    let after_signal = after.get();
    // 1.5 s of pause and 2 s of drain from the signal's handling, which
    // comes after `signalled`; without the pause counted, 2 s (more only
    // if handling the signal took over a second).
    assert!(
        after_signal > 3.0,
        "the old generation's drain ends {after_signal} s after the signal"
    );
    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    assert_eq!(wait_exit(old).await, Some(0), "drained in time");
}

/// SIGTERM to a draining old generation keeps its drain going to the end
/// the stop itself would have: its pre-stop pause plus its drain budget
/// (DESIGN: the earlier of its own deadline and the stop's), not the drain
/// budget alone, which cut work off while a serving generation stopped at
/// the same moment would still be in its pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_generation_that_is_stopped_keeps_the_stops_whole_deadline() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(stopped_while_draining(
        "pre_stop_delay = \"8s\"\ndrain_timeout = \"1s\"",
        &backend,
    ))
    .await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let mut conn = client::connect(web).await.expect("connect");
    let slow = tokio::spawn(async move { client::send(&mut conn, web, "/slow/6000").await });
    support::eventually("backend saw the slow request", || async {
        backend.hits.load(Ordering::Relaxed) == 1
    })
    .await;
    baton.reload_ok().await;
    signal(old, Signal::SIGTERM);
    let answer = slow
        .await
        .expect("join")
        .expect("slow request must complete");
    assert_eq!(answer.status, 200);
    assert_eq!(
        wait_exit(old).await,
        Some(0),
        "old generation drained cleanly"
    );
}

/// A reload that raises the stop's budget reaches every generation still
/// draining, not only the one it took over from: the oldest here, two
/// reloads back, keeps its request to the stop's new end (its successor
/// passes the budget down). It kept the budget its own successor said,
/// and cut the request at a stop still seconds from its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_budget_a_later_reload_raised_reaches_the_oldest_generation() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(stopped_while_draining(
        "pre_stop_delay = \"-1s\"\ndrain_timeout = \"1s\"",
        &backend,
    ))
    .await;
    let web = baton.addr("web");
    let oldest = baton.serving_pid().await;
    let mut conn = client::connect(web).await.expect("connect");
    let held = tokio::spawn(async move { client::send(&mut conn, web, "/gated").await });
    support::eventually("the request held by the backend", || async {
        backend.held() == 1
    })
    .await;
    let middle = baton.reload_ok().await;
    let raised = baton
        .config_text()
        .replace("drain_timeout = \"1s\"", "drain_timeout = \"10s\"");
    baton.write_config(&raised);
    let main = baton.reload_ok().await;
    support::eventually("the budget passed down to the oldest", || async {
        baton.log().contains("a later reload set the stop's budget")
    })
    .await;
    for pid in [oldest, middle, main] {
        signal(pid, Signal::SIGTERM);
    }
    // Past the end of a stop under the old budget (1.5 s of held-back
    // pause and 1 s of drain), well within the new one's 11.5 s.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    backend.release();
    let answer = held.await.expect("join").expect("the request answered");
    assert_eq!(answer.status, 200);
    assert_eq!(wait_exit(oldest).await, Some(0), "drained in time");
    assert_eq!(wait_exit(main).await, Some(0), "nothing was cut");
}

/// A client that connected to a listener a reload removes, and has yet to
/// send its request, is in no accept queue: the kernel holds it back until
/// its first bytes (`defer_accept`, on for HTTP). The old generation ends
/// the deferral as it closes that listener and keeps the socket open until
/// the kernel queued it, then serves it: answered when it speaks, where it
/// was reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_yet_to_speak_on_a_listener_a_reload_removes_is_served_when_it_does() {
    let backend = HttpBackend::start("a").await;
    let both = Spec::new()
        .http("web", "app")
        .listener("old", "http", "app", "keepalive_drain_grace = \"5s\"")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(both).await;
    let quiet = TcpStream::connect(baton.addr("old"))
        .await
        .expect("connect");
    baton.write_spec(
        &Spec::new().http("web", "app").pool("app", &[backend.addr]),
        &HashMap::new(),
    );
    baton.reload_ok().await;
    support::served_when_it_speaks(quiet).await;
}
