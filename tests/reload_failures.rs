//! A reload that cannot succeed changes nothing: a broken config, a new
//! generation that cannot bind, or one that hangs is refused or killed,
//! the running generation keeps serving without a failed request, the
//! reload reports why, and the next good reload works.

mod support;

use std::collections::HashMap;

use nix::sys::signal::Signal;
use support::backend::HttpBackend;
use support::daemon::{processes_for, signal, wait_exit, Baton, Spec};
use support::load::{baton_under_load, flowing_to_a};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_is_refused_with_78_naming_the_key() {
    let (_backend, baton, load) = baton_under_load("").await;
    let good = baton.config_text();
    let serving = baton.serving_pid().await;
    assert_eq!(last_reload_successful(&baton).await, Some(1.0), "a start");
    let cases = [
        (good.replace("[[pools]]", "[[pools]"), "TOML parse error"),
        (
            good.replace("[shutdown]", "[shutdown]\nbogus_key = 1"),
            "bogus_key",
        ),
        (
            good.replace("pool = \"app\"", "pool = \"ap\""),
            "listeners[0].pool: no pool named \"ap\"; did you mean \"app\"?",
        ),
    ];
    for (text, named) in &cases {
        baton.write_config(text);
        let r = baton.reload().await;
        assert_eq!(r.code, 78, "{r:?}");
        assert!(
            r.stderr.contains(named),
            "stderr must name {named:?}: {}",
            r.stderr
        );
        assert_eq!(
            baton.serving_pid().await,
            serving,
            "the running generation keeps serving"
        );
        load.progress(10).await;
    }
    // The two files TOML could read were sent to the daemon all the same,
    // which counted their failures (the shipped alert watches that); the
    // one whose control socket could not be read was not.
    assert_eq!(failed_reloads(&baton).await, 2.0);

    // SIGHUP takes the daemon's own path: the new generation reads the
    // broken file, reports it, exits 78, and the old one carries on.
    baton.write_config(&cases[1].0);
    signal(serving, Signal::SIGHUP);
    support::eventually("the daemon logs the refused reload", || async {
        baton.log().contains("bogus_key")
    })
    .await;
    support::eventually("the failed generation is gone", || async {
        processes_for(&baton.config) == vec![serving]
    })
    .await;
    assert_eq!(baton.serving_pid().await, serving);
    support::eventually("the failed reload by signal counted", || async {
        failed_reloads(&baton).await == 3.0
    })
    .await;
    load.progress(10).await;

    // Said until a reload succeeds (what the shipped alert watches).
    assert_eq!(last_reload_successful(&baton).await, Some(0.0));
    baton.write_config(&good);
    let new = baton.reload_ok().await;
    assert_ne!(new, serving);
    assert_eq!(last_reload_successful(&baton).await, Some(1.0));
    load.progress(10).await;
    load.stop().await.assert_clean();
}

/// `baton_last_reload_successful` as the serving generation says it.
async fn last_reload_successful(baton: &support::daemon::Baton) -> Option<f64> {
    let metrics = support::client::metrics(baton.admin).await;
    support::client::series(&metrics, "baton_last_reload_successful")
}

/// `baton_reloads_total{result="failed"}` as the daemon reports it.
async fn failed_reloads(baton: &support::daemon::Baton) -> f64 {
    let metrics = support::client::metrics(baton.admin).await;
    support::client::series(&metrics, "baton_reloads_total{result=\"failed\"}").unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_that_cannot_bind_is_rolled_back() {
    let (backend, baton, load) = baton_under_load("").await;
    let serving = baton.serving_pid().await;
    // From the daemons' ports: one let go of in the ephemeral range could
    // be taken by another test's connection before the reload binds it.
    let taken = support::daemon::free_addr();
    let squatter = std::net::TcpListener::bind(taken).expect("bind squatter");
    let spec = baton.spec().http("extra", "app");
    baton.write_spec(&spec, &HashMap::from([("extra".to_string(), taken)]));

    let r = baton.reload().await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr
            .contains(&format!("listener \"extra\" cannot bind {taken}: "))
            && r.stderr.contains("another process listens there"),
        "{}",
        r.stderr
    );
    assert_eq!(baton.serving_pid().await, serving);
    load.progress(10).await;

    drop(squatter);
    let r = baton.reload().await;
    assert_eq!(
        r.code, 0,
        "the next reload works once the address is free: {r:?}"
    );
    let extra = client_get(taken).await;
    assert_eq!(extra, HttpBackend::body_for("a", "/x"));
    load.progress(10).await;
    load.stop().await.assert_clean();
    drop(backend);
}

async fn client_get(addr: std::net::SocketAddr) -> String {
    support::client::get(addr, "/x")
        .await
        .expect("new listener serves")
        .body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_generation_is_killed_at_ready_timeout() {
    // Long enough for the second reload to come while the first waits,
    // however slowly this machine runs the CLI.
    let (_backend, baton, load) = baton_under_load("[reload]\nready_timeout = \"10s\"\n").await;
    let serving = baton.serving_pid().await;
    // The next generation stops itself (SIGSTOP) the moment it appears,
    // before it can say ready: the test cannot lose a race to catch it.
    let marker = baton.dir.path().join("hung.pid");
    baton.replace_executable(Some(&format!(
        "#!/bin/sh\necho $$ > {}\nkill -STOP $$\nexec {} \"$@\"\n",
        marker.display(),
        support::daemon::BIN
    )));
    let (r, second) = tokio::join!(baton.reload(), async {
        support::eventually("the hung generation started", || async { marker.exists() }).await;
        baton.reload().await
    });
    assert_eq!(second.code, 75, "one handoff at a time: {second:?}");
    assert!(
        second.stderr.contains("already under way"),
        "{}",
        second.stderr
    );
    assert_ne!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("not ready within 10s"), "{}", r.stderr);
    let hung: u32 = std::fs::read_to_string(&marker)
        .expect("the new process ran")
        .trim()
        .parse()
        .expect("pid");
    // Started detached, it is re-parented to the test (a subreaper).
    assert_eq!(
        wait_exit(hung).await,
        Some(128 + Signal::SIGKILL as i32),
        "the hung generation was killed"
    );
    assert_eq!(processes_for(&baton.config), vec![serving]);
    assert_eq!(baton.serving_pid().await, serving);
    load.progress(10).await;

    baton.replace_executable(None);
    let new = baton.reload_ok().await;
    assert_ne!(new, serving, "the next reload works");
    load.progress(10).await;
    load.stop().await.assert_clean();
}

/// A new generation that cannot listen on a socket it bound (another
/// process took the port between its bind and the go-ahead) fails the
/// reload while the old generation still accepts, naming the listener: it
/// used to log that the listener took no connections and take over without
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_new_listener_cannot_listen_fails_and_the_old_generation_serves_on() {
    let backend = HttpBackend::start("a").await;
    // The reload also gives `web` a second shard (`workers` 1 → 2): a
    // fresh socket in the old generation's SO_REUSEPORT group, which must
    // not listen before `extra` fails, or it would take connections the
    // failed generation resets.
    let spec = |extra_listener: bool| {
        let workers = if extra_listener { 2 } else { 1 };
        let base = Spec::new()
            .top(&format!("workers = {workers}"))
            .http("web", "app");
        if !extra_listener {
            return base.pool("app", &[backend.addr]);
        }
        // Its first health check waits at /gated until the test says.
        let gated = "health = { kind = \"http\", path = \"/gated\", interval = \"30s\", timeout = \"20s\", rise = 1, fall = 1 }";
        base.http("extra", "app")
            .pool_with("app", gated, &[(backend.addr, 1)])
    };
    let baton = Baton::start(spec(false)).await;
    let serving = baton.serving_pid().await;
    let load = flowing_to_a(baton.addr("web")).await;
    let extra = support::daemon::free_addr();
    baton.write_spec(&spec(true), &HashMap::from([("extra".to_string(), extra)]));
    let (r, _taker) = tokio::join!(baton.reload(), async {
        // The health round runs after every socket is bound.
        support::eventually("the new generation's health check waits", || async {
            backend.held() >= 1
        })
        .await;
        let taker = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        taker.set_reuse_address(true).expect("SO_REUSEADDR");
        taker
            .bind(&extra.into())
            .expect("bind beside the unlistening socket");
        taker.listen(16).expect("listen first");
        backend.release();
        taker
    });
    assert_ne!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains(&format!("listener \"extra\" cannot listen on {extra}")),
        "{}",
        r.stderr
    );
    assert_eq!(baton.serving_pid().await, serving);
    load.progress(20).await;
    load.stop().await.assert_clean();
}

/// A reload whose new generation binds a new shard of a listener (here
/// `workers` 1 → 2), then fails (killed while its first health round
/// waits on a check that hangs) loses no connection: the fresh shard
/// listens only once its generation accepts, so no connection waits in a
/// queue that closes with the failed generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_fails_after_binding_a_new_shard_loses_no_connection() {
    let backend = HttpBackend::start("a").await;
    let spec = |workers: u32, pool_keys: &str| {
        Spec::new()
            .top(&format!("workers = {workers}"))
            .http("web", "app")
            .pool_with("app", pool_keys, &[(backend.addr, 1)])
    };
    let baton = Baton::start(spec(1, "")).await;
    let serving = baton.serving_pid().await;
    let load = flowing_to_a(baton.addr("web")).await;
    let hanging_check = "health = { kind = \"http\", path = \"/gated\", interval = \"30s\", timeout = \"10s\", rise = 1, fall = 1 }";
    baton.write_spec(&spec(2, hanging_check), &HashMap::new());
    let (r, ()) = tokio::join!(baton.reload(), async {
        // The health round runs after every socket is bound.
        support::eventually("the new generation's health check waits", || async {
            backend.held() >= 1
        })
        .await;
        let new = baton.started_pids()[0];
        signal(new, Signal::SIGKILL);
    });
    assert_ne!(r.code, 0, "{r:?}");
    assert_eq!(baton.serving_pid().await, serving);
    backend.release();
    load.progress(20).await;
    load.stop().await.assert_clean();
}

/// A new generation whose fd limit cannot hold what the old one hands it
/// (the kernel cuts the fd list short) says so: the reload fails naming
/// the cause, where it said only that the new generation exited, and the
/// old generation serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_that_cannot_take_the_offer_says_why() {
    let (_backend, baton, load) = baton_under_load("").await;
    let serving = baton.serving_pid().await;
    baton.replace_executable(Some(&format!(
        "#!/bin/sh\nexec prlimit --nofile=12 {} \"$@\"\n",
        support::daemon::BIN
    )));
    let r = baton.reload().await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("cannot read the old generation's offer"),
        "{}",
        r.stderr
    );
    assert_eq!(baton.serving_pid().await, serving);
    load.progress(10).await;
    load.stop().await.assert_clean();
}

/// The PID namespace a test makes its own (root only).
const PID_NAMESPACE: [&str; 5] = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"];

/// Whether this test may make a PID namespace (root); else it is skipped.
fn pid_namespace_or_skipped() -> bool {
    let probe = [&PID_NAMESPACE[..], &["true"]].concat();
    support::possible_or_skipped(&probe, "root, for a PID namespace")
}

/// A shell named `tini` in `dir`, as PID 1 of a PID namespace, that runs
/// its command as its one child and exits when it does (as tini,
/// dumb-init and catatonit do).
fn under_a_tini(dir: &std::path::Path) -> Vec<String> {
    let tini = dir.join("tini");
    std::fs::copy("/bin/sh", &tini).expect("a shell named tini");
    let tini = tini.to_str().expect("path").to_string();
    PID_NAMESPACE
        .iter()
        .map(|s| s.to_string())
        .chain([tini, "-c".into(), "\"$0\" \"$@\" & wait $!".into()])
        .collect()
}

/// The children of `pid`, as this test's /proc numbers them.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The process group of `pid`, as /proc/PID/stat says.
fn group_of(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(2).map(str::to_string)
}

/// A request held on generation 1 (the backend's `/gated`), then a reload:
/// the request, still on its way.
async fn held_across_a_reload(
    baton: &Baton,
    backend: &HttpBackend,
) -> tokio::task::JoinHandle<Result<support::client::Answer, String>> {
    let web = baton.addr("web");
    let held = tokio::spawn(async move { support::client::get(web, "/gated").await });
    support::eventually("a request held on generation 1", || async {
        backend.held() == 1
    })
    .await;
    baton.reload_ok().await;
    held
}

/// baton started under `wrapper` (in a PID namespace, where `keeper` is
/// the pid of `baton run` as this test sees it): a request held on
/// generation 1 across a reload is answered, the service outlives
/// generation 1's exit (the kernel ended the namespace with it, or its
/// init did, the new generation with them), and a terminal's Ctrl-C to
/// the keeper reaches the serving generation once: a request held across
/// it is answered, and the wrapper exits with the generation's 0. (In the
/// keeper's process group, as they first were, the generations heard it
/// from the terminal and again from the keeper, and a second stop signal
/// forces the drain.)
async fn a_reload_is_kept_under(wrapper: &[&str], keeper: fn(u32) -> Option<u32>) {
    if !pid_namespace_or_skipped() {
        return;
    }
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
    let baton = Baton::spawn_under(spec, &[], wrapper);
    // Ready, not only the admin port answering (it does from the first
    // instant): the request below met a listener not yet open, and its
    // refusal left the wait for it held to time out.
    baton.wait_ready().await;
    support::eventually("the keeper says so", || async {
        baton.log().contains("keeping generation 1")
    })
    .await;
    let web = baton.addr("web");
    let held = held_across_a_reload(&baton, &backend).await;
    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    baton.settled().await;
    let answer = support::client::get(web, "/after")
        .await
        .expect("served after generation 1 exited");
    assert_eq!(answer.status, 200);
    let keeper = keeper(baton.first_pid).expect("baton run's pid");
    let generations = children_of(keeper);
    assert!(!generations.is_empty(), "the keeper's children");
    for generation in generations {
        assert_ne!(
            group_of(generation),
            group_of(keeper),
            "in the keeper's group"
        );
    }
    backend.hold_again();
    let held = tokio::spawn(async move { support::client::get(web, "/gated").await });
    support::eventually("a request held across the stop", || async {
        backend.held() == 1
    })
    .await;
    let drains = baton.log().matches("drain started").count();
    signal(keeper, Signal::SIGINT);
    support::eventually("the stop's drain began", || async {
        baton.log().matches("drain started").count() > drains
    })
    .await;
    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    assert_eq!(wait_exit(baton.first_pid).await, Some(0), "{}", baton.log());
}

/// As PID 1 (a container without an init) `baton run` keeps its
/// generations: a reload's new one, started detached, was the old one's
/// child, and the kernel ends a PID namespace with its PID 1, at the end
/// of the old generation's drain (a reload was refused there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_baton_keeps_its_generations_across_a_reload() {
    a_reload_is_kept_under(&PID_NAMESPACE, |unshare| {
        children_of(unshare).first().copied()
    })
    .await;
}

/// Under the keeper, the serving generation killed (an out-of-memory kill)
/// while its predecessor drains with its doors closed: the keeper starts a
/// fresh generation, whose sockets take the next connections, and the
/// predecessor's request in flight is answered. Nothing listened until
/// the drain ended (30 s here), and then the keeper exited with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_keeper_a_serving_generation_killed_is_started_afresh() {
    if !pid_namespace_or_skipped() {
        return;
    }
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .section("[reload]\ndrain_timeout = \"30s\"\n")
        .http("web", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::spawn_under(spec, &[], &PID_NAMESPACE);
    support::eventually("the keeper keeps generation 1", || async {
        baton.log().contains("keeping generation 1")
            && support::client::get(baton.admin, "/readyz")
                .await
                .is_ok_and(|a| a.status == 200)
    })
    .await;
    let keeper = children_of(baton.first_pid)
        .first()
        .copied()
        .expect("keeper");
    let first = children_of(keeper).first().copied().expect("generation 1");
    let web = baton.addr("web");
    let held = held_across_a_reload(&baton, &backend).await;
    let second = children_of(keeper)
        .into_iter()
        .find(|&pid| pid != first)
        .expect("generation 2, the keeper's child too");
    // Within 5 s of generation 1's start: looked at once they are over.
    signal(second, Signal::SIGKILL);
    support::eventually("a fresh generation serves", || async {
        support::client::get(web, "/after")
            .await
            .is_ok_and(|a| a.status == 200)
    })
    .await;
    assert!(
        baton
            .log()
            .contains("none listens: starting generation 1 afresh"),
        "{}",
        baton.log()
    );
    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    signal(keeper, Signal::SIGTERM);
    assert!(
        wait_exit(baton.first_pid).await.is_some(),
        "the keeper ends at the stop"
    );
}

/// Under a container's minimal init (`docker run --init`'s tini), which
/// exits when its one child does, `baton run` keeps its generations: the
/// old one's exit at the end of its drain ended the init and the
/// namespace, the new generation with them (README recommended tini for
/// reloads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_tini_baton_keeps_its_generations_across_a_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let init = under_a_tini(dir.path());
    let init: Vec<&str> = init.iter().map(String::as_str).collect();
    a_reload_is_kept_under(&init, |unshare| {
        let tini = children_of(unshare).first().copied()?;
        children_of(tini).first().copied()
    })
    .await;
}

/// Under a tini with a shell between it and `baton run` (an entrypoint
/// script that did not `exec` baton), which exits with baton, as tini then
/// does: `baton run` keeps its generations too. (It took only a PID 1 for
/// its parent to be one that ends the namespace.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_tini_and_a_shell_baton_keeps_its_generations_across_a_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut init = under_a_tini(dir.path());
    init.extend(["sh", "-c", "\"$0\" \"$@\"; exit $?"].map(String::from));
    let init: Vec<&str> = init.iter().map(String::as_str).collect();
    a_reload_is_kept_under(&init, |unshare| {
        let tini = children_of(unshare).first().copied()?;
        let shell = children_of(tini).first().copied()?;
        children_of(shell).first().copied()
    })
    .await;
}

/// Where no keeper runs (told so), a reload as PID 1, or under an init
/// that exits with baton, fails at once, saying why, and baton serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_keeper_a_reload_that_would_end_the_namespace_is_refused() {
    if !pid_namespace_or_skipped() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let not_kept = ["env", "BATON_KEPT=1"];
    let as_pid_1 = [&PID_NAMESPACE[..], &not_kept].concat();
    let tini = under_a_tini(dir.path());
    let under_tini: Vec<&str> = tini.iter().map(String::as_str).chain(not_kept).collect();
    let a_shell = ["sh", "-c", "\"$0\" \"$@\"; exit $?"];
    let under_tini_and_a_shell: Vec<&str> = tini
        .iter()
        .map(String::as_str)
        .chain(a_shell)
        .chain(not_kept)
        .collect();
    for (wrapper, why) in [
        (as_pid_1, "runs as PID 1"),
        (under_tini, "PID 1 is \"tini\""),
        (under_tini_and_a_shell, "PID 1 is \"tini\""),
    ] {
        let backend = HttpBackend::start("a").await;
        let spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
        let baton = Baton::spawn_under(spec, &[], &wrapper);
        support::eventually("the admin port answers", || async {
            support::client::get(baton.admin, "/healthz").await.is_ok()
        })
        .await;
        let r = baton.reload().await;
        assert_eq!(r.code, 1, "{r:?}");
        assert!(r.stderr.contains(why), "{r:?}");
        let answer = support::client::get(baton.addr("web"), "/after")
            .await
            .expect("still served");
        assert_eq!(answer.status, 200);
    }
}

/// A SIGHUP that reaches a generation draining after a reload (its pid
/// read a moment before, or `--kill-whom=main` before `MAINPID=` landed)
/// is no reload: said at WARN, naming the serving generation to send it
/// to, and no further generation starts. (Not passed on: `systemctl kill
/// -s HUP baton` reaches the serving one too, and would reload twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_to_a_draining_generation_names_the_serving_one() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let web = baton.addr("web");
    let held = tokio::spawn(async move { support::client::get(web, "/gated").await });
    support::eventually("a request held on generation 1", || async {
        backend.held() == 1
    })
    .await;
    let serving = baton.reload_ok().await;
    signal(baton.first_pid, Signal::SIGHUP);
    let said = "SIGHUP ignored: this generation is draining";
    support::eventually("the draining generation says so", || async {
        baton.log().contains(said)
    })
    .await;
    let log = baton.log();
    let line = log.lines().find(|l| l.contains(said)).unwrap_or_default();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&format!("serving={serving}")), "{line}");
    assert_eq!(baton.serving_pid().await, serving, "no reload");
    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
}
