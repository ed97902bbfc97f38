//! The core promise: 20 reloads in a row under steady HTTP keep-alive,
//! HTTP new-connection and TCP load lose nothing, and leave no leaked fds
//! or processes behind.

mod support;

use support::backend::{HttpBackend, TcpEcho};
use support::daemon::{processes_for, settled_fd_count, wait_exit, Baton, Spec};
use support::load::{Load, Targets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_fail_nothing_and_leak_nothing() {
    let a = HttpBackend::start("a").await;
    let b = HttpBackend::start("b").await;
    let echo = TcpEcho::start().await;
    let spec = Spec::new()
        .http("web", "app")
        .tcp("raw", "echo")
        .pool("app", &[a.addr, b.addr])
        .pool("echo", &[echo.addr]);
    let baton = Baton::start(spec).await;

    // Baseline: the first reload's generation, before any traffic reaches it.
    let mut old = baton.serving_pid().await;
    let first_new = baton.reload_ok().await;
    assert_eq!(
        wait_exit(old).await,
        Some(0),
        "generation 1 must drain cleanly"
    );
    baton.settled().await;
    let baseline_fds = settled_fd_count(first_new).await;
    old = first_new;

    let load = Load::start(Targets {
        http: Some(baton.addr("web")),
        tcp: Some(baton.addr("raw")),
        names: vec!["a", "b"],
    });
    load.progress(50).await;
    for _ in 0..19 {
        let new = baton.reload_ok().await;
        assert_ne!(new, old);
        load.progress(30).await;
        assert_eq!(
            wait_exit(old).await,
            Some(0),
            "an old generation must drain and exit 0"
        );
        old = new;
    }
    let report = load.stop().await;
    report.assert_clean();

    // One more reload with no traffic, so idle backend connections of the
    // loaded generation do not count: the handoff path itself must not leak.
    let last = baton.reload_ok().await;
    assert_eq!(wait_exit(old).await, Some(0));
    baton.settled().await;
    assert_eq!(
        settled_fd_count(last).await,
        baseline_fds,
        "fds of generation 22 vs generation 2"
    );
    assert_eq!(
        processes_for(&baton.config),
        vec![last],
        "exactly one baton process remains"
    );
    assert!(
        !baton.log().contains("ERROR"),
        "a clean reload logs no ERROR:\n{}",
        baton.log()
    );
}
