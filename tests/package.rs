//! The Debian package (`cargo deb`: metadata in Cargo.toml, maintainer
//! scripts in systemd/debian/) installed, upgraded, removed and purged with
//! apt in a throwaway real systemd (tests/support/sandbox.rs). An upgrade
//! under load is a reload: no request fails and the new generation runs the
//! new binary. Remove is baton's ordered stop; purge leaves no config and no
//! user. The packages wrap the binaries the tests build anyway (`cargo deb
//! --no-build`), so CI makes no release build. Root only, like the sandbox.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{free_addrs, BIN};
use support::load::{Load, Targets};
use support::sandbox::{text, upgrade_binary, Sandbox, UPGRADE_VERSION};

/// The cargo-deb the package is made and documented with, installed by
/// cargo when missing (as tests/fuzz/run.sh installs cargo-fuzz).
const CARGO_DEB: &str = "3.8.0";

/// What the postinst says when the reload onto a new version fails.
const RELOAD_FAILED: &str = "the reload onto the new version failed";
/// What the postinst says when an upgrade changed baton.service.
const UNIT_CHANGED: &str = "this upgrade changed baton.service";
const MASKED: &str = "baton.service is masked, so it was not reloaded";

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs a host command to its end, asserting it succeeded; what it printed.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", text(&out));
    text(&out)
}

fn have(command: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {command}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// cargo-deb, lintian and logrotate, each installed when missing (.ci/run
/// installs the last two first). Once per test binary: apt takes one lock.
fn tools() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let cargo_deb = Command::new(cargo()).args(["deb", "--version"]).output();
        if !cargo_deb.is_ok_and(|o| o.status.success()) {
            run(Command::new(cargo()).args([
                "install",
                "cargo-deb",
                "--version",
                CARGO_DEB,
                "--locked",
            ]));
        }
        let missing: Vec<&str> = ["lintian", "logrotate"]
            .into_iter()
            .filter(|c| !have(c))
            .collect();
        if !missing.is_empty() {
            run(Command::new("apt-get").args(["update", "-qq"]));
            run(Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"));
        }
    });
}

/// `cargo deb --no-build` around an already-built `binary`, into
/// target/package/STAGE/baton.deb. cargo-deb reads the asset
/// `target/release/baton` from `$CARGO_TARGET_DIR/release/baton`, so a
/// staging target dir holding the binary there packages it as it is
/// (stripped), with no release build.
fn package(binary: &Path, stage: &str, deb_version: Option<&str>) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/package")
        .join(stage);
    let staged = dir.join("release/baton");
    std::fs::create_dir_all(dir.join("release")).expect("staging dir");
    let _ = std::fs::remove_file(&staged);
    std::fs::hard_link(binary, &staged)
        .or_else(|_| std::fs::copy(binary, &staged).map(drop))
        .expect("stage the binary");
    let deb = dir.join("baton.deb");
    let mut cmd = Command::new(cargo());
    cmd.args([
        "deb",
        "--no-build",
        "--no-dbgsym",
        "--strip",
        "--fast",
        "-o",
    ])
    .arg(&deb)
    .env("CARGO_TARGET_DIR", &dir)
    .current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(version) = deb_version {
        cmd.args(["--deb-version", version]);
    }
    run(&mut cmd);
    deb
}

/// The package of this version (Cargo.toml's), built once per test binary.
fn package_a() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| package(Path::new(BIN), "a", None))
}

/// The package of the upgrade build, a version above this one.
fn package_b() -> PathBuf {
    package(&upgrade_binary(), "b", Some(UPGRADE_VERSION))
}

/// `apt-get -y ARGS` inside, with no one to answer a question.
fn apt(sbx: &Sandbox, args: &[&str]) -> Command {
    let mut all = vec!["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y"];
    all.extend_from_slice(args);
    sbx.command(&all)
}

/// [`apt`] run to its end, asserting it succeeded; what apt and the
/// maintainer scripts said.
fn apt_ok(sbx: &Sandbox, args: &[&str]) -> String {
    let out = apt(sbx, args).output().expect("run apt-get");
    sbx.succeeded(&format!("apt-get {args:?}"), out)
}

/// Whether `sh -c script` succeeds inside.
fn holds(sbx: &Sandbox, script: &str) -> bool {
    sbx.exec(&["sh", "-c", script]).status.success()
}

/// The lintian warnings that stay, each with its reason in README
/// ("Install from the package"): any other warning, and any error, fails.
const KNOWN_WARNINGS: [&str; 2] = ["no-manual-page", "initial-upload-closes-no-bugs"];

fn lintian_is_clean(deb: &Path) {
    let out = Command::new("lintian")
        .arg(deb)
        .output()
        .expect("run lintian");
    let said = text(&out);
    println!("lintian:\n{said}");
    // 0: no error, 1: errors (which the lines below name); 2 is lintian
    // itself failing, which prints no tag and would pass for clean.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "lintian ran: {:?}\n{said}",
        out.status
    );
    for line in said
        .lines()
        .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
    {
        let tag = line.split_whitespace().nth(2).unwrap_or("");
        assert!(
            line.starts_with("W:") && KNOWN_WARNINGS.contains(&tag),
            "lintian: {line}\n{said}"
        );
    }
}

/// A first install: the user and its log folder exist, the unit is enabled
/// and not started (its config is to be edited first), and the shipped
/// config passes `baton check`.
fn first_install_enables_without_starting(sbx: &Sandbox) {
    assert!(holds(sbx, "getent passwd baton"), "the baton user");
    let logs = text(&sbx.exec(&["stat", "-c", "%U:%G %a", "/var/log/baton"]));
    assert_eq!(logs.trim(), "baton:baton 750", "as LogsDirectory= makes it");
    assert_eq!(
        text(&sbx.exec(&["systemctl", "is-enabled", "baton"])).trim(),
        "enabled"
    );
    assert_eq!(sbx.show("baton", "ActiveState"), "inactive");
    let check = sbx.exec(&["baton", "check", "-c", "/etc/baton/baton.toml"]);
    assert!(check.status.success(), "{}", text(&check));
    // What it writes lies within the installed unit's sandbox.
    assert!(
        !text(&check).contains("out of the service's reach"),
        "{}",
        text(&check)
    );
    let conffiles = text(&sbx.exec(&["dpkg-query", "-W", "-f", "${Conffiles}", "baton"]));
    for file in [
        "/etc/baton/baton.toml",
        "/etc/logrotate.d/baton",
        NEEDRESTART,
    ] {
        assert!(
            conffiles.contains(file),
            "{file} is a conffile: {conffiles}"
        );
    }
    // needrestart (run after apt on Debian and Ubuntu) reads it as Perl and
    // then leaves baton.service alone: the upgrade's reload is enough.
    let leaves_baton = format!(
        r#"our %nrconf; -r "{NEEDRESTART}" or die "unreadable"; do "{NEEDRESTART}"; die $@ if $@; my ($re) = keys %{{$nrconf{{override_rc}}}}; defined $re or die "no override_rc"; exit("baton.service" =~ $re && !$nrconf{{override_rc}}{{$re}} ? 0 : 1)"#
    );
    let out = sbx.exec(&["perl", "-e", &leaves_baton]);
    assert!(
        out.status.success(),
        "needrestart would restart baton: {}",
        text(&out)
    );
}

/// Where the package tells needrestart not to restart baton.
const NEEDRESTART: &str = "/etc/needrestart/conf.d/baton.conf";

/// The config the package installed with its three addresses moved: the
/// listener and admin to free ports, the placeholder backend to `backend`.
fn shipped_config_on(
    sbx: &Sandbox,
    admin: SocketAddr,
    web: SocketAddr,
    backend: SocketAddr,
) -> String {
    let out = sbx.exec(&["cat", "/etc/baton/baton.toml"]);
    let shipped = String::from_utf8_lossy(&out.stdout).into_owned();
    [
        ("127.0.0.1:8080", web),
        ("127.0.0.1:9901", admin),
        ("127.0.0.1:8081", backend),
    ]
    .into_iter()
    .fold(shipped, |config, (from, to)| {
        assert!(
            config.contains(from),
            "the shipped config has {from}: {config}"
        );
        config.replace(from, &to.to_string())
    })
}

/// logrotate's run, forced: the access log is renamed, and the
/// postrotate's `systemctl kill --signal=USR1` succeeds, whether or not
/// baton runs.
fn logrotate_forced(sbx: &Sandbox) {
    let out = sbx.exec(&["logrotate", "-f", "/etc/logrotate.d/baton"]);
    assert!(out.status.success(), "logrotate: {}", text(&out));
    assert!(holds(sbx, "test -s /var/log/baton/access.log.1"), "rotated");
}

/// Waits until the access log (`/var/log/baton/access.log`) has lines.
async fn access_log_written(sbx: &Sandbox, what: &str) {
    support::eventually(what, || async {
        holds(sbx, "test -s /var/log/baton/access.log")
    })
    .await;
}

/// After the upgrade: the new binary serves as a new main process, and
/// systemd saw a reload (the same invocation), not a failure or a restart.
async fn upgraded_in_place(sbx: &Sandbox, admin: SocketAddr, old_main: &str, invocation: &str) {
    let status = client::status(admin).await;
    assert_eq!(status["version"], UPGRADE_VERSION);
    assert_eq!(status["generations"][0]["number"], 2);
    assert_eq!(
        sbx.show("baton", "InvocationID"),
        invocation,
        "not restarted"
    );
    let main = sbx.show("baton", "MainPID");
    assert_ne!(main, old_main, "a new generation is the main process");
    assert_eq!(status["generations"][0]["pid"].to_string(), main);
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    assert_eq!(sbx.show("baton", "Result"), "success");
    assert_eq!(sbx.show("baton", "NRestarts"), "0");
    let version = text(&sbx.exec(&["baton", "--version"]));
    assert!(version.contains(UPGRADE_VERSION), "{version}");
    let installed = text(&sbx.exec(&["dpkg-query", "-W", "-f", "${Version}", "baton"]));
    assert_eq!(installed, UPGRADE_VERSION);
}

/// An upgrade that lands while baton is still starting (its first health
/// round waits 14 s, under half of `ready_timeout`, on a backend that
/// accepts and never answers) reloads it
/// once started: the start runs the old binary, and a reload during it
/// was merged into the start and did nothing (systemd 252), so the old
/// version served on with no word said. Back on `config` after.
async fn an_upgrade_during_a_start_reloads_once_started(
    sbx: &Sandbox,
    config: &str,
    admin: SocketAddr,
) {
    let (silent_addr, holding) = support::backend::silent().await;
    sbx.systemctl_ok(&["stop", "baton"]);
    apt_ok(sbx, &["install", "--allow-downgrades", "/root/baton_A.deb"]);
    let hanging = config.replace(
        "health = { kind = \"tcp\", interval = \"2s\", timeout = \"1s\" }",
        "health = { kind = \"http\", path = \"/\", interval = \"2s\", timeout = \"14s\" }",
    );
    assert_ne!(hanging, config, "the shipped pool's check");
    let backend = config
        .split("address = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the pool's backend");
    sbx.write(
        "/etc/baton/baton.toml",
        &hanging.replace(backend, &silent_addr.to_string()),
    );
    sbx.systemctl_ok(&["start", "--no-block", "baton"]);
    support::eventually("baton is starting", || async {
        sbx.show("baton", "ActiveState") == "activating"
    })
    .await;
    let said = apt_ok(sbx, &["install", "/root/baton_B.deb"]);
    assert!(said.contains("waiting for the start under way"), "{said}");
    assert_eq!(client::status(admin).await["version"], UPGRADE_VERSION);
    holding.abort();
    sbx.write("/etc/baton/baton.toml", config);
    sbx.systemctl_ok(&["reload", "baton"]);
    support::eventually("ready again on the first config", || async {
        client::get(admin, "/readyz")
            .await
            .is_ok_and(|answer| answer.status == 200)
    })
    .await;
}

/// A reload that fails during the package step (a config the new binary
/// refuses): the apt run fails and says why, the old generation serves on,
/// and once the config is mended dpkg's next configure reloads.
async fn a_failed_reload_keeps_serving(sbx: &Sandbox, config: &str, web: SocketAddr) {
    let main = sbx.show("baton", "MainPID");
    sbx.write(
        "/etc/baton/baton.toml",
        &config.replace("[admin]", "[admin]\nbogus_key = 1"),
    );
    let out = apt(sbx, &["install", "--reinstall", "/root/baton_B.deb"])
        .output()
        .expect("run apt-get");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "apt says the upgrade did not take: {said}"
    );
    assert!(said.contains(RELOAD_FAILED), "{said}");
    // The config refused is one a restart or a reboot would fail on too.
    assert!(
        said.contains("a restart or a reboot would start it on that config"),
        "{said}"
    );
    assert!(!said.contains(UNIT_CHANGED), "the same unit file: {said}");
    assert_eq!(sbx.show("baton", "MainPID"), main);
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
    let answer = client::get(web, "/after-failed-reload")
        .await
        .expect("served");
    assert_eq!(answer.status, 200);
    sbx.write("/etc/baton/baton.toml", config);
    // Mended, the package's configuring is taken up again: it reloads.
    sbx.succeeded(
        "dpkg --configure -a",
        sbx.exec(&["dpkg", "--configure", "-a"]),
    );
    assert_ne!(sbx.show("baton", "MainPID"), main, "reloaded at last");
    assert_eq!(sbx.show("baton", "ActiveState"), "active");
}

/// An upgrade while an admin has masked the running unit: systemd refuses
/// a masked unit's reload, and the apt run failed, saying the new version
/// refused the config. It says the unit is masked and succeeds; the
/// running baton serves on, not reloaded, and the mask is the admin's
/// still.
async fn a_masked_unit_is_not_reloaded_and_said_so(sbx: &Sandbox, web: SocketAddr) {
    let main = sbx.show("baton", "MainPID");
    sbx.systemctl_ok(&["mask", "baton"]);
    let said = apt_ok(sbx, &["install", "--reinstall", "/root/baton_B.deb"]);
    assert!(said.contains(MASKED), "{said}");
    assert!(!said.contains(RELOAD_FAILED), "{said}");
    assert_eq!(sbx.show("baton", "LoadState"), "masked");
    assert_eq!(sbx.show("baton", "MainPID"), main, "not reloaded");
    let answer = client::get(web, "/while-masked").await.expect("served");
    assert_eq!(answer.status, 200);
    sbx.systemctl_ok(&["unmask", "baton"]);
}

/// A remove that fails after its prerm stopped baton (dpkg then runs
/// `postinst abort-remove`, as here by hand): baton runs again, and the
/// socket unit, which did not run, still does not.
async fn an_aborted_remove_starts_baton_again(sbx: &Sandbox, admin: SocketAddr) {
    let main = sbx.show("baton", "MainPID");
    let script = |name: &str, arg: &str| {
        let path = format!("/var/lib/dpkg/info/baton.{name}");
        sbx.succeeded(&format!("{name} {arg}"), sbx.exec(&[&path, arg]));
    };
    script("prerm", "remove");
    assert_eq!(sbx.show("baton", "ActiveState"), "inactive");
    script("postinst", "abort-remove");
    assert_eq!(
        sbx.show("baton", "ActiveState"),
        "active",
        "{}",
        sbx.journal()
    );
    assert_ne!(sbx.show("baton", "MainPID"), main, "started anew");
    assert_eq!(sbx.show("baton.socket", "ActiveState"), "inactive");
    assert!(!holds(sbx, "test -e /run/baton.stopped-for-remove"));
    support::eventually("ready again", || async {
        client::get(admin, "/readyz")
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
}

/// Remove, with a request held in flight until baton's stop has reached
/// its drain (`/status` shows a drain deadline): the request completes, and
/// the unit's last main process, the upgraded one, exited 0 (drained, not
/// forced: that is 3).
async fn remove_drains(sbx: &Sandbox, admin: SocketAddr, web: SocketAddr, backend: &HttpBackend) {
    let main = sbx.show("baton", "MainPID");
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("a request in flight", || async { backend.held() == 1 }).await;
    let mut remove = tokio::process::Command::from(apt(sbx, &["remove", "baton"]));
    let release = async {
        support::eventually("the stop's drain", || async {
            client::status(admin).await["generations"][0]["drain_deadline"].is_number()
        })
        .await;
        backend.release();
    };
    let (removed, ()) = tokio::join!(remove.output(), release);
    sbx.succeeded("apt-get remove", removed.expect("run apt-get"));
    let answer = held
        .await
        .expect("join")
        .expect("the held request completes");
    assert_eq!(answer.status, 200);
    assert_eq!(sbx.show("baton", "ActiveState"), "inactive");
    assert_eq!(sbx.show("baton", "ExecMainPID"), main, "{}", sbx.journal());
    assert_eq!(
        sbx.show("baton", "ExecMainStatus"),
        "0",
        "{}",
        sbx.journal()
    );
    assert_eq!(sbx.show("baton", "Result"), "success", "{}", sbx.journal());
}

/// The package made an admin token that the shipped config names: a
/// backend call without it is refused (any local user reaches a loopback
/// port), root's `baton backend` sends it, and only root and the service's
/// user may read it (the baton group reads the access logs).
async fn the_backend_api_asks_the_installed_token(sbx: &Sandbox, admin: SocketAddr) {
    assert!(
        holds(
            sbx,
            "test \"$(stat -c '%a %U %G' /etc/baton/admin.token)\" = '400 baton root'"
        ),
        "the token's owner and mode"
    );
    let anonymous = client::call(admin, "POST", "/backends/placeholder/drain", None)
        .await
        .expect("call");
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    let state =
        || async { client::status(admin).await["pools"][0]["backends"][0]["state"].clone() };
    let drained = sbx.exec(&["baton", "backend", "drain", "placeholder"]);
    assert!(
        drained.status.success(),
        "baton backend drain: {}",
        text(&drained)
    );
    let now = state().await;
    assert!(now == "draining" || now == "out", "{now}");
    let restored = sbx.exec(&["baton", "backend", "restore", "placeholder"]);
    assert!(
        restored.status.success(),
        "baton backend restore: {}",
        text(&restored)
    );
    // Restored, it is up again once a health check passed.
    support::eventually("the backend restored", || async { state().await == "up" }).await;
}

/// Purge: no config, no logs, no unit links left; the baton user and
/// group stay (Debian keeps system users: a file chowned to baton outside
/// the folders a purge removes would go to the next user given its id).
fn purged(sbx: &Sandbox) {
    files_purged(sbx);
    assert!(holds(sbx, "getent passwd baton"), "the user is kept");
    assert!(holds(sbx, "getent group baton"), "the group is kept");
}

/// Purge's files: no config, no logs, no unit links left.
fn files_purged(sbx: &Sandbox) {
    for gone in [
        "/etc/baton",
        "/var/log/baton",
        "/etc/logrotate.d/baton",
        NEEDRESTART,
        "/etc/systemd/system/baton.service",
        "/etc/systemd/system/multi-user.target.wants/baton.service",
        "/etc/systemd/system/sockets.target.wants/baton.socket",
        "/etc/systemd/system/baton.socket",
        "/usr/lib/sysusers.d/baton.conf",
        "/var/lib/baton",
    ] {
        assert!(
            !holds(sbx, &format!("test -e {gone} || test -L {gone}")),
            "{gone} is left"
        );
    }
}

/// A sandbox that is a host as a package meets it: without the
/// policy-rc.d of container images (this machine's says 101, "do not", to
/// every action, which deb-systemd-invoke obeys: no reload, no stop).
fn host() -> Option<Sandbox> {
    let sbx = Sandbox::boot()?;
    let out = sbx.exec(&["rm", "-f", "/usr/sbin/policy-rc.d"]);
    assert!(out.status.success(), "{}", text(&out));
    tools();
    Some(sbx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apt_upgrade_under_load_is_a_reload_and_remove_drains() {
    let Some(sbx) = host() else { return };
    let b_deb = tokio::task::spawn_blocking(package_b);
    let a_deb = package_a();
    lintian_is_clean(a_deb);

    sbx.copy_in(a_deb, "/root/baton_A.deb");
    apt_ok(&sbx, &["install", "/root/baton_A.deb"]);
    first_install_enables_without_starting(&sbx);
    // An admin's opt-in to socket activation, which the purge must undo.
    sbx.systemctl_ok(&["enable", "baton.socket"]);

    let backend = HttpBackend::start("a").await;
    let p = free_addrs(2);
    let (admin, web) = (p[0], p[1]);
    let config = shipped_config_on(&sbx, admin, web, backend.addr);
    sbx.write("/etc/baton/baton.toml", &config);
    sbx.systemctl_ok(&["start", "baton"]);
    let ready = client::get(admin, "/readyz").await.expect("readyz");
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        client::status(admin).await["version"],
        env!("CARGO_PKG_VERSION")
    );
    the_backend_api_asks_the_installed_token(&sbx, admin).await;

    // The upgrade's package first: on a cold tree its build takes minutes,
    // which the load would slow and could outlast the load's own limit
    // (a CI run failed so: "the load itself ended (limit 600s)").
    let b_deb = b_deb.await.expect("package the upgrade");
    let load = Load::start(Targets {
        http: Some(web),
        tcp: None,
        names: vec!["a"],
    });
    sbx.progressed(&load, 50).await;
    let main = sbx.show("baton", "MainPID");
    let invocation = sbx.show("baton", "InvocationID");
    access_log_written(&sbx, "the access log has lines").await;
    logrotate_forced(&sbx);
    access_log_written(&sbx, "baton reopened a new access log (SIGUSR1)").await;
    assert!(
        holds(
            &sbx,
            "test \"$(stat -c %a /var/log/baton/access.log)\" = 640"
        ),
        "the access log is group-readable (the unit's UMask)"
    );
    assert_eq!(sbx.show("baton", "MainPID"), main, "SIGUSR1 cost nothing");
    sbx.progressed(&load, 30).await;

    // The upgrade, while the load runs, over a unit file that differs
    // from the one it brings (as a new version's would).
    sbx.copy_in(&b_deb, "/root/baton_B.deb");
    assert!(holds(
        &sbx,
        "echo '# before the upgrade' >>/lib/systemd/system/baton.service && systemctl daemon-reload"
    ));
    let token = || sbx.exec(&["cat", "/etc/baton/admin.token"]).stdout;
    let token_before = token();
    let said = apt_ok(&sbx, &["install", "/root/baton_B.deb"]);
    assert_eq!(token(), token_before, "the upgrade keeps the admin token");
    assert!(!said.contains(RELOAD_FAILED), "{said}");
    assert!(said.contains(UNIT_CHANGED), "{said}");
    sbx.progressed(&load, 50).await;
    upgraded_in_place(&sbx, admin, &main, &invocation).await;
    load.stop().await.assert_clean();
    an_upgrade_during_a_start_reloads_once_started(&sbx, &config, admin).await;

    a_failed_reload_keeps_serving(&sbx, &config, web).await;
    a_masked_unit_is_not_reloaded_and_said_so(&sbx, web).await;
    an_aborted_remove_starts_baton_again(&sbx, admin).await;

    remove_drains(&sbx, admin, web, &backend).await;
    assert!(!holds(&sbx, "test -e /usr/bin/baton"));
    logrotate_forced(&sbx);

    apt_ok(&sbx, &["purge", "baton"]);
    purged(&sbx);
}

/// Runs `script` as in a chroot or an image build, where systemd is not PID
/// 1: in a mount namespace of its own whose /run is empty, so the
/// maintainer scripts find no /run/systemd/system (nor systemd's sockets).
fn without_systemd(sbx: &Sandbox, script: &str) {
    let out = sbx.exec(&[
        "unshare",
        "--mount",
        "sh",
        "-c",
        &format!("mount -t tmpfs tmpfs /run && {script}"),
    ]);
    assert!(out.status.success(), "{script}: {}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_systemd_running_an_install_enables_and_a_purge_cleans_up() {
    let Some(sbx) = host() else { return };
    sbx.copy_in(package_a(), "/root/baton_A.deb");
    without_systemd(
        &sbx,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y /root/baton_A.deb",
    );
    assert!(holds(&sbx, "getent passwd baton"), "the baton user");
    assert!(
        holds(
            &sbx,
            "test -L /etc/systemd/system/multi-user.target.wants/baton.service"
        ),
        "enabled: it starts at the next boot"
    );
    assert_eq!(sbx.show("baton", "ActiveState"), "inactive");
    // A key the admin gave the service user, outside /etc/baton.
    assert!(holds(
        &sbx,
        "install -o baton -m 0400 /dev/null /root/key.pem"
    ));
    without_systemd(&sbx, "dpkg --purge baton");
    purged(&sbx);
    assert!(
        holds(&sbx, "test \"$(stat -c %U /root/key.pem)\" = baton"),
        "the key is still baton's, not a deleted user's id"
    );

    // A baton user an admin made before the install, with its home where
    // earlier versions kept a note: the purge leaves its home and what is
    // in it.
    assert!(holds(
        &sbx,
        "userdel baton && useradd --system --user-group --create-home --home-dir /var/lib/baton baton && touch /var/lib/baton/theirs"
    ));
    install_and_purge(&sbx);
    assert!(
        holds(&sbx, "test -e /var/lib/baton/theirs"),
        "its home is kept"
    );
    assert!(holds(&sbx, "userdel --remove baton"));
    files_purged(&sbx);
}

/// Installs package A and purges it, without systemd running.
fn install_and_purge(sbx: &Sandbox) {
    without_systemd(
        sbx,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y /root/baton_A.deb && dpkg --purge baton",
    );
}
