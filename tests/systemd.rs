//! baton under a real systemd (PID 1 of a throwaway sandbox), driven only
//! through `systemctl`: start, reloads under load, a broken reload, a binary
//! upgrade, restart with the fd store, stop outcomes, socket activation and
//! the watchdog, a new generation killed after it took over. The shipped
//! units are installed as they are.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::backend::{HttpBackend, TcpEcho};
use support::client;
use support::daemon::free_addrs;
use support::listening_inodes;
use support::load::{Load, Targets};
use support::sandbox::{text, upgrade_binary, Sandbox, UPGRADE_VERSION};

struct Ports {
    admin: SocketAddr,
    web: SocketAddr,
    raw: SocketAddr,
    /// For a listener a reload adds.
    extra: SocketAddr,
}

impl Ports {
    fn reserve() -> Ports {
        let p = free_addrs(4);
        Ports {
            admin: p[0],
            web: p[1],
            raw: p[2],
            extra: p[3],
        }
    }
}

/// `systemctl VERB baton` (a stop or a restart) with requests of an older
/// generation held by `backends`, let go only once the journal says the
/// serving generation waits for the older ones: a main that did not wait
/// would have exited first, and systemd's final SIGTERM to what is left of
/// the unit would have cut them.
fn stop_releasing_once_the_main_waits(sbx: &Sandbox, verb: &str, backends: &[&HttpBackend]) {
    const WAITS: &str = "waiting for the other generations to finish";
    let before = sbx.journal().matches(WAITS).count();
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let stopping = s.spawn(|| sbx.systemctl_ok(&[verb, "baton"]));
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while sbx.journal().matches(WAITS).count() == before
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            backends.iter().for_each(|b| b.release());
            stopping.join().expect("systemctl")
        });
    });
}

/// Installs baton with `config` and a drop-in adding `service` (a line
/// of `[Service]` keys) to the shipped unit, and starts it.
fn start_with_drop_in(sbx: &Sandbox, config: &str, service: &str) {
    sbx.install_baton(config);
    sbx.write(
        "/etc/systemd/system/baton.service.d/test.conf",
        &format!("[Service]\n{service}\n"),
    );
    sbx.systemctl_ok(&["daemon-reload"]);
    sbx.systemctl_ok(&["start", "baton"]);
}

/// `pre_stop_delay` 2 s: past the 1.5 s a stop keeps its doors open for
/// connections the kernel held back (`defer_accept`), so the serving
/// generation's doors close when its pause ends. A test whose older
/// generation must outlive that pause gives it a longer drain (the first).
fn config(p: &Ports, backends: &[SocketAddr], echo: SocketAddr, extra: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{{ name = \"b{i}\", address = \"{a}\" }}"))
        .collect();
    format!(
        "[admin]\nlisten = \"{}\"\n\n[control]\nsocket = \"/run/baton/control.sock\"\n\n[shutdown]\npre_stop_delay = \"2s\"\ndrain_timeout = \"3s\"\n\n{extra}\n\
         [[listeners]]\nname = \"web\"\nbind = \"{}\"\npool = \"app\"\n\n[[listeners]]\nname = \"raw\"\nbind = \"{}\"\nprotocol = \"tcp\"\npool = \"echo\"\n\n\
         [[pools]]\nname = \"app\"\nbackends = [{}]\n\n[[pools]]\nname = \"echo\"\nbackends = [{{ name = \"e0\", address = \"{echo}\" }}]\n",
        p.admin,
        p.web,
        p.raw,
        list.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemctl_start_reload_upgrade_restart_and_stop() {
    let upgrade = tokio::task::spawn_blocking(upgrade_binary);
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, b, echo) = (
        HttpBackend::start("a").await,
        HttpBackend::start("b").await,
        TcpEcho::start().await,
    );
    let p = Ports::reserve();
    // An older generation's held request must outlive the serving one's
    // stop: its drain ends at the earlier of its reload's deadline and the
    // stop's (pause plus drain_timeout from the signal), and the request is
    // let go only after the serving generation's pause and drain. With the
    // reload's deadline 3 s from a reload made just before a stop, the
    // 2 s pause left it under a second, which a busy host took.
    let good = config(
        &p,
        &[a.addr, b.addr],
        echo.addr,
        "[reload]\ndrain_timeout = \"10s\"\n",
    )
    .replace("drain_timeout = \"3s\"", "drain_timeout = \"5s\"");
    sbx.install_baton(&good);

    // Start: active only once ready, with a STATUS line.
    sbx.systemctl_ok(&["start", "baton"]);
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    assert_eq!(
        client::get(p.admin, "/readyz")
            .await
            .expect("readyz")
            .status,
        200,
        "active means ready"
    );
    let status = text(&sbx.exec(&["systemctl", "status", "baton", "--no-pager"]));
    assert!(status.contains("Status: \"generation 1"), "{status}");
    let main = sbx.show("baton", "MainPID");
    let user = text(&sbx.exec(&["stat", "-c", "%U", &format!("/proc/{main}")]));
    assert_eq!(user.trim(), "baton", "the service runs as its own user");

    // The upgrade build first: on a cold tree it takes minutes, which a
    // load running meanwhile would slow and could outlast its own limit.
    let upgrade = upgrade.await.expect("build the upgrade binary");

    // Ten reloads under load: each one's new generation is the MainPID.
    let load = Load::start(Targets {
        http: Some(p.web),
        tcp: Some(p.raw),
        names: vec!["a", "b"],
    });
    sbx.progressed(&load, 50).await;
    for i in 0..10 {
        sbx.systemctl_ok(&["reload", "baton"]);
        let s = client::status(p.admin).await;
        assert_eq!(s["generations"][0]["number"], i + 2);
        assert_eq!(
            sbx.show("baton", "MainPID"),
            s["generations"][0]["pid"].to_string(),
            "systemd follows the new generation"
        );
        assert_eq!(sbx.show("baton", "ActiveState"), "active");
        sbx.progressed(&load, 30).await;
    }

    // A broken config: the reload fails with the reason in the journal, the
    // service stays active on the same generation.
    let main = sbx.show("baton", "MainPID");
    sbx.write(
        "/etc/baton/baton.toml",
        &good.replace("[shutdown]", "[shutdown]\nbogus_key = 1"),
    );
    let out = sbx.exec(&["systemctl", "reload", "baton"]);
    assert!(!out.status.success(), "a broken reload must fail");
    let journal = sbx.journal_holding("bogus_key");
    assert!(journal.contains("bogus_key"), "{journal}");
    // At the journal's error priority, apart from the info lines (the
    // line found above may be `baton reload`'s own, at info, and the new
    // generation's still on its way).
    let errors = sbx.journal_at_holding("err", "bogus_key");
    assert!(
        errors.contains("bogus_key") && !errors.contains("serving generation="),
        "{errors}"
    );
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    assert_eq!(sbx.show("baton", "MainPID"), main);
    // Counted by the daemon, which `ExecReload=` asked all the same.
    let metrics = client::metrics(p.admin).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "baton_reloads_total{result=\"failed\"} 1"),
        "{metrics}"
    );
    sbx.write("/etc/baton/baton.toml", &good);
    sbx.progressed(&load, 30).await;

    // Binary upgrade: a new file renamed over /usr/bin/baton, then reload.
    sbx.install_binary(&upgrade);
    sbx.systemctl_ok(&["reload", "baton"]);
    assert_eq!(client::status(p.admin).await["version"], UPGRADE_VERSION);
    sbx.progressed(&load, 30).await;

    // A listener added by a reload goes to the fd store: a restart keeps
    // its very sockets, even while the older generation still drains (the
    // new one's first update, sent before its MAINPID= landed, may have
    // been dropped; it is sent again when that one exits, or at the
    // restart, whichever comes first).
    let extra = format!(
        "{good}\n[[listeners]]\nname = \"extra\"\nbind = \"{}\"\npool = \"app\"\n",
        p.extra
    );
    sbx.write("/etc/baton/baton.toml", &extra);
    support::eventually("the older generations have exited", || async {
        client::status(p.admin).await["generations"]
            .as_array()
            .is_some_and(|g| g.len() == 1)
    })
    .await;
    let web = p.web;
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("a request held by the backend", || async {
        a.held() + b.held() == 1
    })
    .await;
    sbx.systemctl_ok(&["reload", "baton"]);
    let before = listening_inodes(p.extra.port());
    assert!(!before.is_empty(), "the added listener listens");
    assert_eq!(
        client::status(p.admin).await["generations"]
            .as_array()
            .map_or(0, Vec::len),
        2,
        "the older generation still drains"
    );

    // Restart after reloads (the main process is one systemd did not fork):
    // the fd store keeps the sockets open across the gap; a connection made
    // while no baton runs waits and is served.
    // The older generation still drains when the stop decides what stays
    // in the store.
    stop_releasing_once_the_main_waits(&sbx, "restart", &[&a, &b]);
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    assert_eq!(
        listening_inodes(p.extra.port()),
        before,
        "the added listener's sockets survived the restart"
    );
    // Told apart from a stop (which takes them out of the store).
    const RESTART: &str = "a restart: the listening sockets stay in systemd's fd store";
    let journal = sbx.journal_holding(RESTART);
    assert!(journal.contains(RESTART), "{journal}");
    sbx.progressed(&load, 50).await;
    load.stop().await.assert_clean();

    // A listener a reload removes leaves the fd store at once, while older
    // generations still drain: nothing goes on listening on its port. The
    // generation that had it took over from one that still drains (its
    // fd store update, kept to send again when that one exits, must not
    // keep the socket open either).
    // (2.9 s: within the 10 s reload drain_timeout of the first reload below.)
    let web = p.web;
    let slow = tokio::spawn(async move { client::get(web, "/slow/2900").await });
    support::eventually("slow request in flight", || async {
        a.active() + b.active() == 1
    })
    .await;
    sbx.systemctl_ok(&["reload", "baton"]);
    sbx.write("/etc/baton/baton.toml", &good);
    sbx.systemctl_ok(&["reload", "baton"]);
    support::eventually(
        "the removed listener's sockets are closed, systemd's copy too",
        || async { listening_inodes(p.extra.port()).is_empty() },
    )
    .await;
    let generations = client::status(p.admin).await["generations"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(generations, 3, "closed while both older generations drain");
    assert_eq!(slow.await.expect("join").expect("slow").status, 200);

    // start → reload → failed reload → stop: the stop is the ordered one
    // (a request in flight completes), not a SIGKILL. The request is the
    // old generation's, still draining: the main one, with nothing open,
    // exits only after it, or systemd's second SIGTERM to what is left of
    // the unit would force it.
    a.hold_again();
    b.hold_again();
    let slow = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("a request held by the backend", || async {
        a.held() + b.held() == 1
    })
    .await;
    sbx.systemctl_ok(&["reload", "baton"]);
    sbx.write(
        "/etc/baton/baton.toml",
        &good.replace("[shutdown]", "[shutdown]\nbogus_key = 1"),
    );
    assert!(!sbx.exec(&["systemctl", "reload", "baton"]).status.success());
    sbx.write("/etc/baton/baton.toml", &good);
    stop_releasing_once_the_main_waits(&sbx, "stop", &[&a, &b]);
    assert_eq!(
        slow.await
            .expect("join")
            .expect("slow request completes")
            .status,
        200
    );
    assert_eq!(sbx.show("baton", "Result"), "success", "{}", sbx.journal());

    // Stop with a request outliving the drain budget, after a reload: the
    // unit reports the new main's own exit code, 3.
    sbx.systemctl_ok(&["start", "baton"]);
    sbx.systemctl_ok(&["reload", "baton"]);
    let slow = tokio::spawn(async move { client::get(web, "/slow/10000").await });
    support::eventually("slow request in flight", || async {
        a.active() + b.active() == 1
    })
    .await;
    let _ = sbx.exec(&["systemctl", "stop", "baton"]);
    assert!(slow.await.expect("join").is_err());
    assert_eq!(
        sbx.show("baton", "Result"),
        "exit-code",
        "{}",
        sbx.journal()
    );
    assert_eq!(sbx.show("baton", "ExecMainStatus"), "3");

    let security = text(&sbx.exec(&["systemd-analyze", "security", "baton.service", "--no-pager"]));
    let score = security
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("")
        .to_string();
    println!("systemd-analyze security: {score}");
    let value: f64 = score
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or(10.0);
    assert!(value < 2.0, "{score}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_starts_baton_on_the_first_connection() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    sbx.install_baton(&config(&p, &[a.addr], echo.addr, ""));
    install_socket_unit(&sbx, p.web, "web");
    sbx.systemctl_ok(&["start", "baton.socket"]);
    assert_eq!(sbx.show("baton", "ActiveState"), "inactive");
    let answer = client::get(p.web, "/first")
        .await
        .expect("the first connection is served");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/first"));
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    let journal = sbx.journal_holding("adopting sockets from systemd");
    assert!(
        journal.contains("adopting sockets from systemd"),
        "{journal}"
    );
}

/// With `workers = 2`, a socket-activated listener needs a socket unit for
/// each shard, as `baton.socket` says: baton runs as its own user, and the
/// kernel lets only one user's sockets share a port, so baton cannot add
/// a shard beside root's socket. A second unit, `web#1`, gives every
/// worker its own, and baton adopts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_unit_for_each_shard_lets_every_worker_accept() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let two = format!("workers = 2\n{}", config(&p, &[a.addr], echo.addr, ""));
    sbx.install_baton(&two);
    install_socket_unit(&sbx, p.web, "web");
    install_socket_unit_as(&sbx, "baton-web1.socket", p.web, "web#1");
    sbx.systemctl_ok(&["start", "baton.socket", "baton-web1.socket"]);
    sbx.systemctl_ok(&["start", "baton"]);
    let answer = client::get(p.web, "/sharded").await.expect("served");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/sharded"));
    let journal = sbx.journal_holding("adopting sockets from systemd");
    assert!(
        journal.contains("sockets=2") && !journal.contains("cannot add a shard"),
        "{journal}"
    );
    // As the package's removal stops baton.socket: the copy goes with it
    // (else it would listen on, and start baton again, binary or not).
    sbx.systemctl_ok(&["stop", "baton", "baton.socket"]);
    assert_eq!(sbx.show("baton-web1.socket", "ActiveState"), "inactive");
}

/// A listener from `baton.socket` that a reload removes stops listening
/// (and one a restart keeps goes on):
/// systemd's socket unit keeps its copy of the socket open, and connections
/// queued there hung, nobody accepting them, until their clients gave up;
/// now they are refused at once, as where baton held the only copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_units_listener_a_reload_removes_refuses_connections() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let original = config(&p, &[a.addr], echo.addr, "");
    sbx.install_baton(&original);
    install_socket_unit(&sbx, p.web, "web");
    sbx.systemctl_ok(&["start", "baton.socket"]);
    sbx.systemctl_ok(&["start", "baton"]);
    let answer = client::get(p.web, "/before").await.expect("served");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/before"));
    // A restart passes the socket twice (the socket unit's, and the fd
    // store's copy under the same name): the copy left unclaimed is the
    // claimed socket, and must not be stopped.
    sbx.systemctl_ok(&["restart", "baton"]);
    let answer = client::get(p.web, "/restarted")
        .await
        .expect("served after a restart");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/restarted"));
    // The restarted process says it serves after the warning would have
    // come: once journald holds that, the warning's absence means it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut journal = sbx.journal();
    while journal.matches("serving generation=1").count() < 2
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
        journal = sbx.journal();
    }
    assert_eq!(
        journal.matches("serving generation=1").count(),
        2,
        "{journal}"
    );
    assert!(
        !journal.contains("that the config does not name"),
        "{journal}"
    );
    let web = format!(
        "[[listeners]]\nname = \"web\"\nbind = \"{}\"\npool = \"app\"\n\n",
        p.web
    );
    assert!(original.contains(&web), "{original}");
    sbx.write("/etc/baton/baton.toml", &original.replace(&web, ""));
    sbx.systemctl_ok(&["reload", "baton"]);
    let refused = connect_error(p.web).await;
    assert_eq!(
        refused,
        Some(std::io::ErrorKind::ConnectionRefused),
        "{}",
        sbx.journal()
    );
}

/// A socket `baton.socket` passes that the config does not name stops
/// listening at the start, with a warning naming it: baton closed its
/// copy, and systemd's queued connections for nobody, which hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_units_socket_the_config_does_not_name_refuses_connections() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    sbx.install_baton(&config(&p, &[a.addr], echo.addr, ""));
    install_socket_unit(&sbx, p.extra, "stray");
    sbx.systemctl_ok(&["start", "baton.socket"]);
    sbx.systemctl_ok(&["start", "baton"]);
    let refused = connect_error(p.extra).await;
    let journal = sbx.journal_holding("sockets systemd passed that the config does not name");
    assert_eq!(
        refused,
        Some(std::io::ErrorKind::ConnectionRefused),
        "{journal}"
    );
    assert!(
        journal.contains("sockets systemd passed that the config does not name"),
        "{journal}"
    );
}

/// How a connect to `at` failed (bounded), or `None` if it was taken.
async fn connect_error(at: SocketAddr) -> Option<std::io::ErrorKind> {
    tokio::time::timeout(support::TIMEOUT, tokio::net::TcpStream::connect(at))
        .await
        .expect("connect answered")
        .err()
        .map(|e| e.kind())
}

/// Installs the shipped `baton.socket`, listening at `at` and naming its
/// socket `name`.
fn install_socket_unit(sbx: &Sandbox, at: SocketAddr, name: &str) {
    install_socket_unit_as(sbx, "baton.socket", at, name);
}

/// The shipped socket unit as `unit`, bound to `at`, its socket named
/// `name`; a copy (another shard's) made part of `baton.socket`, as the
/// unit's comment says.
fn install_socket_unit_as(sbx: &Sandbox, unit: &str, at: SocketAddr, name: &str) {
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/baton.socket"))
            .expect("shipped socket unit");
    assert!(
        shipped.contains("FileDescriptorName=web\n")
            && shipped.contains("ListenStream=127.0.0.1:8080\n"),
        "{shipped}"
    );
    let mut socket = shipped
        .replace("ListenStream=127.0.0.1:8080", &format!("ListenStream={at}"))
        .replace(
            "FileDescriptorName=web\n",
            &format!("FileDescriptorName={name}\n"),
        );
    if unit != "baton.socket" {
        socket = socket.replace("[Unit]\n", "[Unit]\nPartOf=baton.socket\n");
    }
    sbx.write(&format!("/etc/systemd/system/{unit}"), &socket);
    sbx.systemctl_ok(&["daemon-reload"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_never_kills_a_healthy_baton_across_reloads() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    // Pings every 2 s: a loaded machine's late turn does not lapse them,
    // and a generation that never pinged would be killed within the run.
    start_with_drop_in(
        &sbx,
        &config(&p, &[a.addr], echo.addr, ""),
        "WatchdogSec=4s",
    );
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        sbx.systemctl_ok(&["reload", "baton"]);
    }
    // Twice WatchdogSec after the last reload: a last generation that never
    // pinged is killed by then.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(sbx.show("baton", "NRestarts"), "0", "{}", sbx.journal());
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    assert!(
        !sbx.journal().to_lowercase().contains("watchdog timeout"),
        "{}",
        sbx.journal()
    );
    assert_eq!(client::status(p.admin).await["generations"][0]["number"], 4);
}

/// `systemctl stop` under the shipped unit, soon after a reload: once the
/// doors close, a new connection is refused at once, as with no fd store,
/// instead of waiting in systemd's copy of the socket until the unit ends
/// and then being reset. The old generation exits during the stop's pause
/// (as it may: it outlives the handover by a second and a half), and its
/// exit must not put the sockets back in the store. (A restart keeps them
/// there: the test above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_refuses_new_connections_once_the_doors_close() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let text = config(&p, &[a.addr], echo.addr, "")
        .replace("pre_stop_delay = \"2s\"", "pre_stop_delay = \"3s\"");
    sbx.install_baton(&text);
    sbx.systemctl_ok(&["start", "baton"]);
    sbx.systemctl_ok(&["reload", "baton"]);
    let web = p.web;
    let slow = tokio::spawn(async move { client::get(web, "/slow/5000").await });
    support::eventually("slow request in flight", || async { a.active() == 1 }).await;
    let stop = tokio::task::spawn_blocking({
        let mut stop = sbx.command(&["systemctl", "stop", "baton"]);
        move || stop.output().expect("systemctl stop")
    });
    support::eventually("the old generation gone, the doors closed", || async {
        let status = client::status(p.admin).await;
        let generations = status["generations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        generations.len() == 1 && generations[0]["drain_deadline"].is_number()
    })
    .await;
    let late = tokio::net::TcpStream::connect(web).await;
    assert_eq!(
        late.as_ref().map_err(std::io::Error::kind).err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "a connection after the doors closed: {late:?}\n{}",
        sbx.journal()
    );
    assert!(listening_inodes(web.port()).is_empty(), "nothing listens");
    // Three seconds into the stop, past a tick of the periodic status
    // line, which must no longer say "serving" nor send READY=1.
    assert_eq!(sbx.show("baton", "StatusText"), "stopping: draining");
    let answer = slow.await.expect("join").expect("the request in flight");
    assert_eq!(answer.status, 200);
    sbx.succeeded("systemctl stop", stop.await.expect("join"));
    assert_eq!(sbx.show("baton", "Result"), "success", "{}", sbx.journal());
}

/// A unit whose `TimeoutStopSec=` is shorter than the config's stop
/// budgets (a drain raised in the config, or by a drop-in's
/// `Environment=`, without it) still stops in order: the stop asks
/// systemd for its whole budget (`EXTEND_TIMEOUT_USEC=`), and a request in
/// flight is answered. systemd SIGKILLed every generation at the unit's
/// limit, the request cut and the unit's `Result` a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_longer_than_the_units_timeout_stop_runs_to_its_end() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    start_with_drop_in(
        &sbx,
        &config(&p, &[a.addr], echo.addr, ""),
        "TimeoutStopSec=1",
    );
    let web = p.web;
    let slow = tokio::spawn(async move { client::get(web, "/slow/3000").await });
    support::eventually("slow request in flight", || async { a.active() == 1 }).await;
    let stop = tokio::task::spawn_blocking({
        let mut stop = sbx.command(&["systemctl", "stop", "baton"]);
        move || stop.output().expect("systemctl stop")
    });
    let answer = slow.await.expect("join").expect("the request in flight");
    assert_eq!(answer.status, 200, "{}", sbx.journal());
    sbx.succeeded("systemctl stop", stop.await.expect("join"));
    assert_eq!(sbx.show("baton", "Result"), "success", "{}", sbx.journal());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_with_a_pool_down_is_active_but_not_ready() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    // A second pool whose only backend refuses connections, checked.
    let down = free_addrs(1)[0];
    let text = format!(
        "{}\n[[pools]]\nname = \"db\"\nhealth = {{ kind = \"tcp\", interval = \"200ms\", timeout = \"500ms\" }}\nbackends = [{{ name = \"d0\", address = \"{down}\" }}]\n\n[[listeners]]\nname = \"dbl\"\nbind = \"{}\"\nprotocol = \"tcp\"\npool = \"db\"\n",
        config(&p, &[a.addr], echo.addr, ""),
        p.extra
    );
    sbx.install_baton(&text);
    sbx.systemctl_ok(&["start", "baton"]);
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    let ready = client::get(p.admin, "/readyz").await.expect("readyz");
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(ready.body.contains("pool db"), "{}", ready.body);
    // The healthy pool serves all the same.
    let answer = client::get(p.web, "/up").await.expect("served");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/up"));
    // A reload with the pool still down is over for systemd once the new
    // generation accepts, as a first start is: the unit is active again,
    // under the new main process, not "reloading" until the pool comes
    // back. (The old generation now ends the RELOADING=1 it sent with a
    // READY=1 beside the MAINPID=, as the protocol asks; systemd 252, which
    // these machines run, ends the reload here without it too.)
    let main = sbx.show("baton", "MainPID");
    let reload = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking({
            let out = sbx.command(&["systemctl", "reload", "baton"]);
            move || {
                let mut out = out;
                out.output().expect("systemctl reload")
            }
        }),
    )
    .await;
    let out = reload
        .unwrap_or_else(|_| panic!("systemctl reload hangs:\n{}", sbx.journal()))
        .expect("join");
    assert!(
        out.status.success(),
        "reload: {}",
        support::sandbox::text(&out)
    );
    support::eventually("the unit active under its new main process", || async {
        sbx.show("baton", "ActiveState") == "active" && sbx.show("baton", "MainPID") != main
    })
    .await;
}

/// While a reload is under way the unit stays `reloading` until the new
/// generation serves: the old generation's status lines (every 2 s) carry
/// no `READY=1` then, which would end systemd's reload state early (and
/// start the jobs queued behind the reload). The new generation here waits
/// half its `ready_timeout` (10 s) for a health check that hangs: far
/// longer than the two looks at the state take on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_way_keeps_the_unit_reloading_until_the_new_generation_serves() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let first = config(
        &p,
        &[a.addr],
        echo.addr,
        "[reload]\nready_timeout = \"20s\"\n",
    );
    sbx.install_baton(&first);
    sbx.systemctl_ok(&["start", "baton"]);
    let main = sbx.show("baton", "MainPID");
    // A backend that accepts (the kernel's backlog does) and never answers.
    let hangs = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let slow = format!(
        "{first}\n[[pools]]\nname = \"slow\"\nhealth = {{ kind = \"http\", interval = \"1s\", timeout = \"20s\" }}\nbackends = [{{ name = \"s0\", address = \"{}\" }}]\n",
        hangs.local_addr().expect("addr")
    );
    sbx.write("/etc/baton/baton.toml", &slow);
    sbx.systemctl_ok(&["kill", "--kill-whom=main", "-s", "HUP", "baton"]);
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            sbx.show("baton", "ActiveState"),
            "reloading",
            "{}",
            sbx.journal()
        );
    }
    support::eventually("the unit active under its new main process", || async {
        sbx.show("baton", "ActiveState") == "active" && sbx.show("baton", "MainPID") != main
    })
    .await;
    drop(hangs);
}

/// A reload that fails while a first start still waits for its first
/// health round (a check that hangs past half of `ready_timeout`) leaves
/// the unit `activating`: `READY=1` comes at the round's end. The failed
/// reload's `READY=1`, meant to end systemd's reload state, made the unit
/// active (and started what is ordered after it) before its backends were
/// ever checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_failed_during_a_first_start_leaves_the_unit_activating() {
    const FAILED: &str = "reload failed; this generation keeps serving";
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    // A backend that accepts (the kernel's backlog does) and never answers.
    let hangs = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    start_waiting_for_a_hanging_check(&sbx, &p, a.addr, echo.addr, &hangs).await;
    sbx.write("/etc/baton/baton.toml", "this is no config [");
    sbx.systemctl_ok(&["kill", "--kill-whom=main", "-s", "HUP", "baton"]);
    support::eventually("the reload failed", || async {
        sbx.journal().contains(FAILED)
    })
    .await;
    activating_until_the_round_is_over(&sbx).await;
    drop(hangs);
}

/// A reload that succeeds while a first start still waits for its first
/// health round leaves the unit `activating` too: the old generation
/// names the new one main without `READY=1`, and the new one says it at
/// its own first round's end, as the first start would have. Said at the
/// takeover, it made the unit active before its backends were checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_a_first_start_leaves_the_unit_activating() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let hangs = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    start_waiting_for_a_hanging_check(&sbx, &p, a.addr, echo.addr, &hangs).await;
    let main = sbx.show("baton", "MainPID");
    sbx.systemctl_ok(&["kill", "--kill-whom=main", "-s", "HUP", "baton"]);
    support::eventually("the new generation main", || async {
        sbx.show("baton", "MainPID") != main
    })
    .await;
    activating_until_the_round_is_over(&sbx).await;
    drop(hangs);
}

/// The unit stays `activating` (looked at twice, half a second apart),
/// then turns active once the first health round is over.
async fn activating_until_the_round_is_over(sbx: &Sandbox) {
    for _ in 0..2 {
        assert_eq!(
            sbx.show("baton", "ActiveState"),
            "activating",
            "{}",
            sbx.journal()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    support::eventually("active once the round is over", || async {
        sbx.show("baton", "ActiveState") == "active"
    })
    .await;
}

/// Starts baton (without waiting) with a pool whose one backend, `hangs`,
/// accepts and never answers its 8 s check, and `ready_timeout` 2 s: the
/// first round is cut at 1 s, and `READY=1` waits for the check. Returns
/// once the journal says so.
async fn start_waiting_for_a_hanging_check(
    sbx: &Sandbox,
    p: &Ports,
    backend: SocketAddr,
    echo: SocketAddr,
    hangs: &std::net::TcpListener,
) {
    let text = format!(
        "{}\n[[pools]]\nname = \"slow\"\nhealth = {{ kind = \"http\", interval = \"1s\", timeout = \"8s\" }}\nbackends = [{{ name = \"s0\", address = \"{}\" }}]\n",
        config(p, &[backend], echo, "[reload]\nready_timeout = \"2s\"\n"),
        hangs.local_addr().expect("addr")
    );
    sbx.install_baton(&text);
    sbx.systemctl_ok(&["start", "--no-block", "baton"]);
    support::eventually("the start waits for its first health round", || async {
        sbx.journal()
            .contains("waiting for the first health round before READY=1")
    })
    .await;
}

/// An old generation names its successor (`MAINPID=`) for a moment after
/// the reload, not for its whole drain: once the successor is main,
/// systemd logs each such message from the old one as a warning, and a
/// drain held by a slow request wrote ten a second to the journal. Its
/// watchdog pings end then too (they wrote one every half `WatchdogSec`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_generation_stops_naming_its_successor() {
    const REFUSED: &str = "reception only permitted for main PID";
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    // systemd's own lines about the unit, which the sandbox keeps on its
    // console, into the journal as a host has them.
    sbx.systemctl_ok(&["log-target", "journal"]);
    let long_drain = "[reload]\ndrain_timeout = \"30s\"\n";
    // With the watchdog's pings (every second), which end with the naming
    // window too.
    start_with_drop_in(
        &sbx,
        &config(&p, &[a.addr], echo.addr, long_drain),
        "WatchdogSec=2s",
    );
    let web = p.web;
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("a request held by the backend", || async { a.held() == 1 }).await;
    sbx.systemctl_ok(&["reload", "baton"]);
    // Past the naming window (1.5 s from the reload's answer), and until
    // the journal holds all it brought (journald may lag on a loaded
    // machine).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut named = sbx.journal().matches(REFUSED).count();
    // Two seconds at most: a generation still naming past the window
    // keeps the count growing through them and the two after.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = sbx.journal().matches(REFUSED).count();
        if now == named {
            break;
        }
        named = now;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let journal = sbx.journal();
    assert_eq!(
        journal.matches(REFUSED).count(),
        named,
        "no MAINPID= nor WATCHDOG=1 from the old generation while it drains:\n{journal}"
    );
    let generations = client::status(p.admin).await["generations"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(generations, 2, "the old generation still drains");
    a.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
}

/// A new generation killed right after it took over: systemd restarts the
/// service (`Restart=on-failure`), which serves again on the sockets its
/// fd store kept. Whether systemd already took the new generation as its
/// main process (then its death is the main's) or not yet (the old one,
/// still main, hears it died without a word and exits 1 instead of 0), the
/// service must not end up stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_killed_after_it_took_over_restarts_the_service() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    sbx.install_baton(&config(&p, &[a.addr], echo.addr, ""));
    sbx.systemctl_ok(&["start", "baton"]);
    let main = sbx.show("baton", "MainPID");
    let mut reload = sbx
        .command(&["systemctl", "reload", "baton"])
        .spawn()
        .expect("systemctl reload");
    let mut serving = main.clone();
    support::eventually("the new generation serves", || {
        serving = active_pid(&sbx).unwrap_or_else(|| main.clone());
        let moved = serving != main;
        async move { moved }
    })
    .await;
    sbx.exec(&["kill", "-KILL", &serving]);
    // The reload fails if systemd took the new main already (it died
    // while `ExecReload=` ran), and succeeds if not: either is true.
    tokio::task::block_in_place(|| reload.wait()).expect("reload");
    support::eventually("the service restarted", || async {
        sbx.show("baton", "NRestarts") == "1" && sbx.show("baton", "ActiveState") == "active"
    })
    .await;
    assert_ne!(sbx.show("baton", "MainPID"), serving);
    let answer = client::get(p.web, "/")
        .await
        .expect("served after the restart");
    assert_eq!(answer.status, 200);
}

/// systemd (252, on cgroup v2 as a host runs it) takes the new
/// generation's `MAINPID=` at once, while `ExecReload=` still runs: a
/// command after `baton reload` (a notification, here a sleep that
/// outlasts the old generation) neither fails the reload nor restarts
/// the service. An older sandbox once showed otherwise, and `baton check`
/// warned of such commands; it no longer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_after_baton_reload_in_exec_reload_fails_nothing() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let config = config(&p, &[a.addr], echo.addr, "");
    start_with_drop_in(&sbx, &config, "ExecReload=/usr/bin/sleep 4");
    let old = sbx.show("baton", "MainPID");
    let mut reload = sbx
        .command(&["systemctl", "reload", "baton"])
        .spawn()
        .expect("systemctl reload");
    support::eventually("the new generation is the main process", || async {
        sbx.show("baton", "MainPID") != old
    })
    .await;
    assert_eq!(
        sbx.show("baton", "ActiveState"),
        "reloading",
        "ExecReload= still runs"
    );
    let new = sbx.show("baton", "MainPID");
    let done = tokio::task::block_in_place(|| reload.wait()).expect("reload");
    assert!(done.success(), "journal:\n{}", sbx.journal());
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    assert_eq!(sbx.show("baton", "NRestarts"), "0");
    assert_eq!(sbx.show("baton", "MainPID"), new);
    assert_eq!(client::get(p.web, "/").await.map(|a| a.status), Ok(200));
}

/// `pin_workers` under the shipped unit: each worker held to a CPU of its
/// own. The unit's `SystemCallFilter=~@resources` refused
/// `sched_setaffinity` (EPERM): every worker logged "cannot pin" at every
/// start and reload and ran on any CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_workers_are_pinned_under_the_shipped_unit() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: two workers pin to two CPUs, and this machine has one");
        return;
    }
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let config = format!(
        "workers = 2\npin_workers = true\n{}",
        config(&p, &[a.addr], echo.addr, "")
    );
    sbx.install_baton(&config);
    sbx.systemctl_ok(&["start", "baton"]);
    // Read inside the sandbox: its pids are its own namespace's.
    let main = sbx.show("baton", "MainPID");
    let script = format!(
        "for t in /proc/{main}/task/*; do case $(cat $t/comm) in baton-worker*) \
         sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' $t/status;; esac; done"
    );
    let listed = sbx.exec(&["sh", "-c", &script]);
    let cpus: Vec<String> = text(&listed).lines().map(str::to_string).collect();
    let journal = sbx.journal();
    assert!(!journal.contains("cannot pin"), "{journal}");
    assert_eq!(cpus.len(), 2, "{cpus:?}");
    assert!(
        cpus.iter().all(|c| c.parse::<usize>().is_ok()) && cpus[0] != cpus[1],
        "each worker on a CPU of its own: {cpus:?}"
    );
}

/// The pid of the generation `/status` shows active, if it answers.
fn active_pid(sbx: &Sandbox) -> Option<String> {
    let out = sbx.exec(&["baton", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let generations = status["generations"].as_array()?;
    let active = generations.iter().find(|g| g["state"] == "active")?;
    Some(active["pid"].to_string())
}

/// Reloads from 4 workers to 2 and back under load lose nothing. Each
/// listener keeps its 4 shards: a shard dropped at a reload left
/// systemd's fd store, but systemd let its copy go a moment after the old
/// generation closed its own, and meanwhile the kernel gave the socket its
/// share of new connections (`SO_REUSEPORT`), which nobody accepted and
/// systemd's close reset (3 to 17 failed requests in every run of these 32
/// reloads, without `net.ipv4.tcp_migrate_req`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_to_fewer_workers_lose_no_connection() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let with_workers =
        |n: usize| format!("workers = {n}\n{}", config(&p, &[a.addr], echo.addr, ""));
    sbx.install_baton(&with_workers(4));
    sbx.systemctl_ok(&["start", "baton"]);
    let load = Load::start(Targets {
        http: Some(p.web),
        tcp: Some(p.raw),
        names: vec!["a"],
    });
    sbx.progressed(&load, 50).await;
    for workers in [2, 4].repeat(16) {
        sbx.write("/etc/baton/baton.toml", &with_workers(workers));
        sbx.systemctl_ok(&["reload", "baton"]);
        sbx.progressed(&load, 30).await;
    }
    load.stop().await.assert_clean();
    assert_eq!(listening_inodes(p.web.port()).len(), 4, "every shard kept");
}

/// A listener renamed across a restart keeps its sockets, and its old
/// name leaves systemd's fd store: systemd keeps one entry a socket,
/// under the name it first got, so left there the old entry held the
/// sockets listening after the renamed listener was removed, taking
/// connections nobody would accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_renamed_across_a_restart_leaves_no_socket_behind() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let original = config(&p, &[a.addr], echo.addr, "");
    sbx.install_baton(&original);
    sbx.systemctl_ok(&["start", "baton"]);
    let shards = listening_inodes(p.raw.port());
    assert!(!shards.is_empty());
    let renamed = original.replace("name = \"raw\"", "name = \"wire\"");
    assert_ne!(renamed, original);
    sbx.write("/etc/baton/baton.toml", &renamed);
    sbx.systemctl_ok(&["restart", "baton"]);
    assert_eq!(
        listening_inodes(p.raw.port()),
        shards,
        "the same sockets, kept across the restart under the new name"
    );
    let wire = format!(
        "[[listeners]]\nname = \"wire\"\nbind = \"{}\"\nprotocol = \"tcp\"\npool = \"echo\"\n\n",
        p.raw
    );
    assert!(renamed.contains(&wire), "{renamed}");
    sbx.write("/etc/baton/baton.toml", &renamed.replace(&wire, ""));
    sbx.systemctl_ok(&["reload", "baton"]);
    support::eventually("nothing listens where the removed listener was", || async {
        listening_inodes(p.raw.port()).is_empty()
    })
    .await;
}

/// An invalid config fails the start with 78 from the main process, which
/// `RestartPreventExitStatus=78` keeps from a restart loop (systemd
/// weighs only the main process's status there: an `ExecStartPre=` check
/// that failed was restarted every 100 ms until the start limit, which
/// then refused a start of the mended config too); once mended, the
/// service starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_fails_the_start_once_without_a_restart_loop() {
    let Some(sbx) = Sandbox::boot() else { return };
    let (a, echo) = (HttpBackend::start("a").await, TcpEcho::start().await);
    let p = Ports::reserve();
    let good = config(&p, &[a.addr], echo.addr, "");
    sbx.install_baton(&good.replace("pool = \"app\"", "pool = \"ap\""));
    let start = sbx.exec(&["systemctl", "start", "baton"]);
    assert!(!start.status.success(), "{}", text(&start));
    let state: Vec<String> = [
        "ActiveState",
        "SubState",
        "Result",
        "ExecMainStatus",
        "NRestarts",
    ]
    .iter()
    .map(|property| sbx.show("baton", property))
    .collect();
    assert_eq!(
        state,
        ["failed", "failed", "exit-code", "78", "0"],
        "no restart is due\njournal:\n{}",
        sbx.journal()
    );
    const CAUSE: &str = "listeners[0].pool: no pool named \"ap\"";
    let journal = sbx.journal_holding(CAUSE);
    assert!(journal.contains(CAUSE), "the cause, named:\n{journal}");
    sbx.write("/etc/baton/baton.toml", &good);
    sbx.systemctl_ok(&["start", "baton"]);
    let answer = client::get(p.web, "/up").await.expect("served");
    assert_eq!(answer.body, HttpBackend::body_for("a", "/up"));
}
