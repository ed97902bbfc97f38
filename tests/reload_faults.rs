//! Faults around a handoff: a new generation killed right after it starts,
//! an old one killed while it drains, and a storm of reload requests. Each
//! leaves the serving generation as it was and the next reload working.

mod support;

use std::time::Duration;

use nix::sys::signal::Signal;
use support::client;
use support::daemon::{processes_for, signal, wait_exit};
use support::load::baton_under_load;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_killed_right_after_spawn_is_a_failed_reload_and_the_next_works() {
    let (_backend, baton, load) = baton_under_load("").await;
    let serving = baton.serving_pid().await;
    baton.replace_executable(Some("#!/bin/sh\nkill -KILL $$\n"));
    let r = baton.reload().await;
    assert_ne!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains("exited before it was ready")
            || r.stderr.contains("closed the handoff channel"),
        "{}",
        r.stderr
    );
    assert_eq!(baton.serving_pid().await, serving);
    load.progress(20).await;
    baton.replace_executable(None);
    assert_ne!(baton.reload_ok().await, serving, "the next reload works");
    load.progress(20).await;
    load.stop().await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_generation_killed_while_draining_troubles_nobody_else() {
    let (backend, baton, load) = baton_under_load("[reload]\ndrain_timeout = \"30s\"\n").await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let doomed = tokio::spawn(async move { client::get(web, "/slow/10000").await });
    support::eventually("slow request on the old generation", || async {
        backend.active() == 1
    })
    .await;
    let new = baton.reload_ok().await;
    signal(old, Signal::SIGKILL);
    assert_eq!(wait_exit(old).await, Some(128 + Signal::SIGKILL as i32));
    assert!(
        doomed.await.expect("join").is_err(),
        "only the killed process's own request is lost"
    );
    baton.settled().await;
    assert_eq!(baton.serving_pid().await, new);
    load.progress(50).await;
    load.stop().await.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_storm_completes_or_is_refused_and_leaves_one_process() {
    let (_backend, baton, load) = baton_under_load("[reload]\nmax_draining = 2\n").await;
    let mut asks = Vec::new();
    for _ in 0..20 {
        let config = baton.config.clone();
        asks.push(tokio::spawn(async move {
            tokio::process::Command::new(support::daemon::BIN)
                .args(["reload", "-c"])
                .arg(config)
                .output()
                .await
                .expect("baton reload")
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut codes = Vec::new();
    for a in asks {
        codes.push(a.await.expect("join").status.code().unwrap_or(-1));
    }
    assert!(
        codes.iter().all(|c| *c == 0 || *c == 75),
        "every reload completes or is refused with 75: {codes:?}"
    );
    assert!(codes.contains(&0));
    load.progress(50).await;
    load.stop().await.assert_clean();
    baton.settled().await;
    support::eventually("one baton process left", || async {
        processes_for(&baton.config).len() == 1
    })
    .await;
}
