//! Behaviour driven through a daemon running inside the test process
//! (`support::in_process`): proxying, the admin API and the ordered stop,
//! each ending on the exit code `daemon::run` returns. These start faster
//! than the binary and leave no process behind; the lifecycle tests
//! (reloads, handoff, signals, systemd) keep spawning the real binary,
//! since a reload execs it.

mod support;

use std::net::SocketAddr;

use baton::exit::Exit;
use baton::lifecycle::signals::Command;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::backend::{HttpBackend, TcpEcho};
use support::client;
use support::daemon::Spec;
use support::in_process::InProcess;

/// An HTTP listener `web` over pool `app`, with a stop that drains at
/// once (no pre-stop pause: a negative delay is none) and would wait a
/// minute for what is in flight.
fn web(backends: &[SocketAddr]) -> Spec {
    Spec::default()
        .section("[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"60s\"\n")
        .http("web", "app")
        .pool("app", backends)
}

/// A daemon told to stop while its backend holds a `/gated` request,
/// returned once its drain has begun (past any pre-stop pause, with a
/// deadline in `/status`), with the request's task.
async fn stopping_with_a_request_in_flight() -> (
    HttpBackend,
    InProcess,
    tokio::task::JoinHandle<Result<client::Answer, String>>,
) {
    let backend = HttpBackend::start("a").await;
    let baton = InProcess::start(web(&[backend.addr])).await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    let request = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the backend holds the request", || async {
        backend.held() == 1
    })
    .await;
    baton.send(Command::Stop).await;
    support::eventually("/status shows a drain deadline", || async {
        let generation = &client::status(admin).await["generations"][0];
        generation["state"] == "draining" && generation["drain_deadline"].is_number()
    })
    .await;
    (backend, baton, request)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_every_backend_with_no_failure_and_a_stop_exits_clean() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let mut baton = InProcess::start(web(&[a.addr, b.addr])).await;
    let web = baton.addr("web");
    for i in 0..40 {
        let path = format!("/r/{i}");
        let answer = client::get(web, &path).await.expect("proxied");
        assert_eq!(answer.status, 200, "{path}");
        assert!(
            [
                HttpBackend::body_for("a", &path),
                HttpBackend::body_for("b", &path)
            ]
            .contains(&answer.body),
            "{path}: {}",
            answer.body
        );
    }
    assert_eq!(a.hits() + b.hits(), 40);
    assert!(a.hits() > 0 && b.hits() > 0, "both backends served");
    baton.send(Command::Stop).await;
    assert_eq!(baton.exited().await, Exit::Clean);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_listener_splices_both_ways() {
    let echo = TcpEcho::start().await;
    let spec = Spec::default()
        .section("[shutdown]\npre_stop_delay = \"-1s\"\n")
        .tcp("echo", "app")
        .pool("app", &[echo.addr]);
    let mut baton = InProcess::start(spec).await;
    let mut stream = tokio::net::TcpStream::connect(baton.addr("echo"))
        .await
        .expect("connect");
    stream.write_all(b"hello, baton").await.expect("write");
    stream.shutdown().await.expect("half-close");
    let mut echoed = Vec::new();
    tokio::time::timeout(support::TIMEOUT, stream.read_to_end(&mut echoed))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(echoed, b"hello, baton");
    baton.send(Command::Stop).await;
    assert_eq!(baton.exited().await, Exit::Clean);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_drained_through_the_admin_api_takes_no_new_request() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let mut baton = InProcess::start(web(&[a.addr, b.addr])).await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    client::drain(admin, "app-0").await;
    // Nothing was in flight on it, so its drain is over at once.
    assert_eq!(client::backend_state(admin, "app-0").await, "out");
    for i in 0..20 {
        let path = format!("/after-drain/{i}");
        let answer = client::get(web, &path).await.expect("proxied");
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, HttpBackend::body_for("b", &path));
    }
    assert_eq!((a.hits(), b.hits()), (0, 20));
    baton.send(Command::Stop).await;
    assert_eq!(baton.exited().await, Exit::Clean);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_the_request_in_flight_finish_then_exits_clean() {
    let (backend, mut baton, request) = stopping_with_a_request_in_flight().await;
    let readyz = client::get(baton.admin, "/readyz").await.expect("readyz");
    assert_eq!(
        (readyz.status, readyz.body.contains("\"draining\"")),
        (503, true)
    );
    backend.release();
    let answer = request.await.expect("request task").expect("answered");
    assert_eq!(answer.status, 200);
    assert_eq!(baton.exited().await, Exit::Clean);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_stop_while_draining_forces_exit_3() {
    let (_backend, mut baton, request) = stopping_with_a_request_in_flight().await;
    baton.send(Command::Stop).await;
    let exit = baton.exited().await;
    assert_eq!((exit, exit.code()), (Exit::Forced, 3));
    let answer = request.await.expect("request task");
    assert!(
        !matches!(&answer, Ok(a) if a.status == 200),
        "the forced request was not answered: {answer:?}"
    );
}
