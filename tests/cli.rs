//! The command line as an operator meets it: `check` on the shipped example
//! and on broken files, `--version`, and usage errors.

use std::process::Command;

#[path = "support/skip.rs"]
mod skip;

const BIN: &str = env!("CARGO_BIN_EXE_baton");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run baton");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_shipped_example_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/baton.toml");
    let (code, stdout, stderr) = run(&["check", "-c", path]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("TimeoutStopSec=20"), "{stdout}");
    // The effective settings, defaults included, each said once.
    for said in [
        "reload.close_spread     none",
        "listener db timeouts: connect 2s, tunnel 1h, idle 1m",
        "admin.liveness_paths    /healthz",
        "admin.token_file        none",
        "listener web timeouts: header 10s, idle 1m, keepalive_drain_grace 1s, connect 2s, response 1m, tunnel 1h",
        "listener web forwarded replace, h2_max_concurrent_streams 100, body_min_rate none",
        "listener web route path_prefix /slow -> pool slowpool",
        "pool slowpool balance least_conn, max_connections_per_backend none",
        "pool pg health none (backends taken as up)",
        "pool pg tls none (plain TCP to the backends)",
        "pool app backend b 127.0.0.1:9002, weight 1",
    ] {
        assert!(stdout.contains(said), "{said:?} in\n{stdout}");
    }
}

/// A pool's TLS to its backends is said: the name checked and whether
/// it is checked at all.
#[test]
fn check_says_how_a_pool_speaks_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("baton.toml");
    for (tls, said) in [
        (
            "{ server_name = \"app.internal\", verify = false }",
            "pool app tls, server_name app.internal, verify false",
        ),
        (
            "{ verify = false }",
            "pool app tls, server_name each backend's host name, else its IP address, verify false",
        ),
    ] {
        std::fs::write(
            &path,
            format!("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:2\"\npool = \"app\"\n\n[[pools]]\nname = \"app\"\ntls = {tls}\nbackends = [{{ name = \"a\", address = \"127.0.0.1:1\" }}]\n"),
        )
        .expect("write");
        let (code, stdout, stderr) = run(&["check", "-c", path.to_str().expect("utf-8 path")]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains(said), "{said:?} in\n{stdout}");
    }
}

/// An access log named by standard error (`"/dev/stderr"`, as a
/// container's config may write it) is warned of as `"stderr"` is: access
/// lines would mix with baton's own log, and under systemd the file does
/// not open (journald's socket).
#[test]
fn check_warns_of_an_access_log_on_standard_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.toml");
    for written in ["stderr", "/dev/stderr", "/dev/fd/2"] {
        std::fs::write(
            &path,
            format!("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:2\"\npool = \"app\"\naccess_log = {{ path = \"{written}\" }}\n\n[[pools]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n"),
        )
        .expect("write");
        let (code, _, stderr) = run(&["check", "-c", path.to_str().expect("utf-8 path")]);
        assert_eq!(code, 0, "{written}: {stderr}");
        assert!(
            stderr.contains("listeners[0].access_log.path")
                && stderr.contains("stderr is baton's own log"),
            "{written}: {stderr}"
        );
    }
}

#[test]
fn check_lists_every_problem_with_its_key_and_exits_78() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "workers = 300\n[[listeners]]\nname = \"web\"\nbind = \"nowhere\"\npool = \"ap\"\n\n[[listeners]]\nname = \"db\"\nbind = \"127.0.0.1:2\"\nprotocol = \"tcp\"\npool = \"app\"\nbody_min_rate = -1\n\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n",
    )
    .expect("write");
    let (code, _, stderr) = run(&["check", "-c", path.to_str().expect("utf-8 path")]);
    assert_eq!(code, 78);
    assert!(stderr.contains("bad.toml"), "{stderr}");
    assert!(stderr.contains("listeners[0].bind"), "{stderr}");
    assert!(
        stderr.contains("workers: 300 is out of range (0 to 256)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("listeners[0].pool: no pool named \"ap\"; did you mean \"app\"?"),
        "{stderr}"
    );
    assert!(
        stderr.contains("listeners[1].body_min_rate: body_min_rate needs protocol = \"http\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("listeners[1].body_min_rate: -1 is out of range (0 to 1073741824)"),
        "{stderr}"
    );
}

/// A config at `dir/baton.toml` whose admin token is read from
/// `token_file`.
/// `baton reload --help` lists the budget flags under a heading saying
/// they are the daemon's, which a reload does not change: listed with the
/// rest, `--drain-timeout 30m` read as a longer drain for this reload.
#[test]
fn reload_help_says_its_budgets_are_the_daemons() {
    let (code, help, _) = run(&["reload", "--help"]);
    assert_eq!(code, 0, "{help}");
    let heading = help.find("a reload changes none");
    let flag = help.find("--drain-timeout");
    assert!(
        heading.is_some() && heading < flag && help.find("--pre-stop-delay") > heading,
        "{help}"
    );
}

fn config_with_token(dir: &std::path::Path, token_file: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("baton.toml");
    std::fs::write(
        &path,
        format!(
            "[admin]\ntoken_file = \"{}\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:2\"\npool = \"app\"\n\n[[pools]]\nname = \"app\"\nbackends = [{{ name = \"a\", address = \"127.0.0.1:1\" }}]\n",
            token_file.display()
        ),
    )
    .expect("write");
    path
}

/// A token no Authorization header can carry (non-ASCII, a control
/// character) would refuse every call: `check` warns, naming the key (a
/// warning: such a config served before, and must still start).
#[test]
fn check_warns_of_a_token_no_header_can_carry() {
    let dir = tempfile::tempdir().expect("tempdir");
    for token in ["pässwort\n", "a\u{7}b\n"] {
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).expect("token");
        let path = config_with_token(dir.path(), &token_file);
        let (code, stdout, stderr) = run(&["check", "-c", path.to_str().expect("utf-8 path")]);
        assert_eq!(code, 0, "{token:?}: {stderr}");
        let said = format!("{stdout}{stderr}");
        assert!(said.contains("admin.token_file"), "{said}");
        assert!(said.contains("not printable ASCII"), "{said}");
    }
}

/// A token every user of the host may read is warned of, naming the
/// file and its mode; one kept from others is not.
#[test]
fn check_warns_of_a_token_every_user_may_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("token");
    let path = config_with_token(dir.path(), &token_file);
    for (mode, warned) in [(0o644, true), (0o640, false), (0o600, false)] {
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(mode))
            .expect("chmod");
        let (code, stdout, stderr) = run(&["check", "-c", path.to_str().expect("utf-8 path")]);
        assert_eq!(code, 0, "{mode:o}: {stderr}");
        let said = format!("{stdout}{stderr}");
        let line = format!("may be read by every user of this host (mode {mode:04o})");
        assert_eq!(said.contains(&line), warned, "{mode:o}: {said}");
    }
}

/// A token file that is a FIFO nobody writes to, or a device, is refused
/// naming the key (exit 78), as a certificate path is: `check` waited for
/// a writer for ever, and on `/dev/zero` read until memory ran out.
#[test]
fn a_token_file_that_is_not_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("token");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    for token_file in [fifo.as_path(), std::path::Path::new("/dev/zero")] {
        let path = config_with_token(dir.path(), token_file);
        let (code, stderr) =
            run_to_its_end(&["check", "-c", path.to_str().expect("utf-8 path")], "022");
        assert_eq!(code, Some(78), "{token_file:?}: {stderr}");
        assert!(
            stderr.contains("admin.token_file") && stderr.contains("is not a regular file"),
            "{stderr}"
        );
    }
}

/// An admin endpoint that sends a head and stalls mid-body does not hang
/// `baton status`: the whole answer has one deadline (10 s).
#[test]
fn status_gives_up_on_an_answer_that_stalls_mid_body() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let admin = listener.local_addr().expect("addr");
    let stalling = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut head = [0u8; 1024];
        let _ = conn.read(&mut head);
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"gen")
            .expect("write");
        // Held open, silent, until the client goes.
        let _ = conn.read(&mut head);
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("baton.toml");
    std::fs::write(&path, format!("[admin]\nlisten = \"{admin}\"\n")).expect("write");
    let mut child = Command::new(BIN)
        .args(["status", "-c", path.to_str().expect("utf-8 path")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run baton status");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("baton status still waits after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no whole answer within 10s"), "{stderr}");
    stalling.join().expect("join");
}

#[test]
fn a_missing_config_is_78_naming_the_file() {
    let (code, _, stderr) = run(&["check", "-c", "/nonexistent/baton.toml"]);
    assert_eq!(code, 78);
    assert!(stderr.contains("/nonexistent/baton.toml"), "{stderr}");
}

#[test]
fn version_names_the_commit() {
    let (code, stdout, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("(commit "), "{stdout}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["frobnicate"]).0, 2);
}

/// Out of range, a demo's figures are refused before anything starts:
/// they overflowed the clock's arithmetic, and the demo panicked with its
/// daemon left running.
#[test]
fn a_demo_s_figures_out_of_range_are_usage_errors() {
    let (code, _, stderr) = run(&["demo", "--reloads", "4294967295"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--reloads"), "{stderr}");
    let (code, _, stderr) = run(&["demo", "--duration", "300000000000y"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("at most a day"), "{stderr}");
}

/// README's first command, shorter: `baton demo` serves its clients across
/// live reloads with no failed request, every reload served, and baton
/// drained cleanly at its end (exit 0, else 1). Nothing ran it before: the
/// first thing a new user types could have broken unseen.
#[test]
fn the_demo_serves_across_its_reloads_without_a_failure() {
    let out = Command::new("timeout")
        .args(["120", BIN, "demo", "--duration", "4s", "--reloads", "2"])
        .output()
        .expect("run baton demo");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("reloads: 2/2 succeeded"), "{said}");
    assert!(said.contains("drained cleanly"), "{said}");
}

#[test]
fn reload_without_a_daemon_exits_69() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.toml");
    std::fs::write(
        &path,
        format!(
            "[control]\nsocket = \"{}/none.sock\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n[[pools]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n",
            dir.path().display()
        ),
    )
    .expect("write");
    let (code, _, stderr) = run(&["reload", "-c", path.to_str().expect("utf-8 path")]);
    assert_eq!(code, 69, "{stderr}");
    assert!(stderr.contains("cannot reach the daemon"), "{stderr}");
    // Most often it is not running; a config that moved control.socket
    // cannot reach the daemon that still listens at the old path: both
    // are said, and how to reload it in the second case.
    assert!(stderr.contains("is baton running"), "{stderr}");
    assert!(stderr.contains("kill -s HUP"), "{stderr}");
}

/// `baton status` and `baton backend` that reach no daemon at the admin
/// address exit 69 (DESIGN), as `reload` does: a monitoring script tells
/// "not running" from "broken". Over a unix socket and over TCP.
#[test]
fn status_and_backend_without_a_daemon_exit_69() {
    let dir = tempfile::tempdir().expect("tempdir");
    for admin in [
        format!("unix:{}/none.sock", dir.path().display()),
        "127.0.0.1:1".to_string(),
    ] {
        let config = config_with(dir.path(), &admin, &dir.path().join("control.sock"));
        let c = config.to_str().expect("utf-8 path");
        for args in [
            &["status", "-c", c][..],
            &["status", "--json", "-c", c][..],
            &["backend", "drain", "0", "-c", c][..],
        ] {
            let (code, _, stderr) = run(args);
            assert_eq!(code, 69, "{args:?}: {stderr}");
            assert!(stderr.contains("is baton running"), "{args:?}: {stderr}");
        }
    }
}

/// A listener that cannot be bound at a first start is a runtime failure,
/// exit 1 (DESIGN), which the shipped unit's `Restart=on-failure` retries
/// (a port not yet free), not 78, which it does not; the cause is named.
#[test]
fn a_first_start_whose_listener_cannot_bind_exits_1_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Held without SO_REUSEPORT: baton's bind beside it fails.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("address").port();
    let config = config_with(dir.path(), "127.0.0.1:0", &dir.path().join("control.sock"));
    let text = std::fs::read_to_string(&config).expect("read");
    let bound = text.replace(
        "bind = \"127.0.0.1:0\"",
        &format!("bind = \"127.0.0.1:{port}\""),
    );
    std::fs::write(&config, bound).expect("write");
    let (code, stderr) = run_to_its_end(&["run", "-c", config.to_str().expect("utf-8")], "022");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("listener \"web\" cannot bind 127.0.0.1:{port}"))
            && stderr.contains("another process listens there"),
        "{stderr}"
    );
    drop(held);
}

/// A control socket that cannot be made says what baton was doing, with
/// the key (a directory it could not create, as `/run/baton` for a user
/// who runs it by hand). `/sys` takes no directory from root either
/// (EPERM; EROFS where it is mounted read-only).
#[test]
fn a_control_socket_whose_directory_cannot_be_made_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let uncreatable = format!("/sys/baton-test-{}", std::process::id());
    let control = std::path::Path::new(&uncreatable).join("control.sock");
    let config = config_with(dir.path(), "127.0.0.1:0", &control);
    let (code, stderr) = run_to_its_end(&["run", "-c", config.to_str().expect("utf-8")], "022");
    assert_eq!(code, Some(1), "{stderr}");
    let said = format!(
        "control socket {} (control.socket): cannot create its directory {uncreatable}: ",
        control.display(),
    );
    assert!(stderr.contains(&said), "{stderr}");
}

/// `baton reload` by a user the control socket (mode 0600) refuses says
/// so, not that the config may have moved the socket (exit 69 still: the
/// daemon was not reached); also when this user cannot read all the config
/// names (a key only root and the daemon may read), which is then a
/// warning, not the answer: the config may be good, read with the
/// daemon's rights (it was exit 78, "config invalid", without the hint).
#[test]
fn a_reload_the_control_socket_refuses_says_who_may() {
    use std::os::unix::fs::PermissionsExt;
    if !skip::root_or_skipped() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("control.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let key = dir.path().join("key.pem");
    std::fs::write(&key, "root's alone").expect("write");
    let listener_tls = [
        String::new(),
        format!(
            "tls = {{ certificates = [{{ cert = \"{0}\", key = \"{0}\" }}] }}\n",
            key.display()
        ),
    ];
    for (path, mode) in [
        (dir.path(), 0o755),
        (key.as_path(), 0o600),
        (socket.as_path(), 0o600),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    for tls in listener_tls {
        let config = dir.path().join("b.toml");
        std::fs::write(
            &config,
            format!(
                "[control]\nsocket = \"{}\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n{tls}[[pools]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n",
                socket.display()
            ),
        )
        .expect("write");
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let out = run_as_nobody(
            dir.path(),
            &["reload".as_ref(), "-c".as_ref(), config.as_ref()],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{stderr}");
        assert!(
            stderr.contains("admits root and the daemon's own user only")
                && !stderr.contains("kill -s HUP"),
            "{stderr}"
        );
        assert_eq!(
            stderr.contains("warning: config invalid as read here"),
            !tls.is_empty(),
            "{stderr}"
        );
        // Who was refused the key.
        assert_eq!(
            stderr.contains("Permission denied (os error 13) (read as uid 65534)"),
            !tls.is_empty(),
            "{stderr}"
        );
    }
}

/// `baton status` by a user a Unix admin socket's mode refuses says who
/// may, not that the daemon may be down (a monitoring user read that as
/// an outage); exit 69 still, as `reload` refused by its socket.
#[test]
fn a_status_the_admin_socket_refuses_says_who_may() {
    use std::os::unix::fs::PermissionsExt;
    if !skip::root_or_skipped() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&admin).expect("bind");
    let config = config_with(
        dir.path(),
        &format!("unix:{}", admin.display()),
        &dir.path().join("control.sock"),
    );
    for (path, mode) in [
        (dir.path(), 0o755),
        (config.as_path(), 0o644),
        (admin.as_path(), 0o600),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let out = run_as_nobody(
        dir.path(),
        &["status".as_ref(), "-c".as_ref(), config.as_ref()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("only root and the daemon's own user may connect")
            && !stderr.contains("is baton running"),
        "{stderr}"
    );
}

/// While baton is stopped (or before it binds), any local user may listen
/// on its unprivileged admin port: `baton backend`, run by root, sends the
/// token only to a holder who may read the token file (its folders
/// searchable, the file readable), and otherwise says who holds the port
/// (69, as for a daemon it cannot reach). An admin written as `0.0.0.0`
/// is reached on loopback, and looked at there.
#[test]
fn the_admin_token_goes_only_to_a_port_held_by_one_who_may_read_it() {
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    if !skip::root_or_skipped() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let squatter = listening_as(65534);
    let port = squatter.local_addr().expect("addr").port();
    let config = dir.path().join("b.toml");
    let drain = |listen: &str| {
        std::fs::write(
            &config,
            format!(
                "[admin]\nlisten = \"{listen}\"\ntoken_file = \"{}\"\n",
                token.display()
            ),
        )
        .expect("write");
        run(&[
            "backend",
            "drain",
            "app-0",
            "-c",
            config.to_str().expect("utf-8"),
        ])
    };
    let refused = |listen: &str| {
        let (code, _, stderr) = drain(listen);
        assert_eq!(code, 69, "{stderr}");
        assert!(
            stderr.contains(&format!(
                "the admin port 127.0.0.1:{port} is held by uid 65534 ("
            )) && stderr.contains("the admin token is not sent to it"),
            "{stderr}"
        );
    };
    refused(&format!("127.0.0.1:{port}"));
    refused(&format!("0.0.0.0:{port}"));
    // Its owner now, but in a folder only root may search.
    nix::unistd::chown(&token, Some(nix::unistd::Uid::from_raw(65534)), None).expect("chown");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    refused(&format!("127.0.0.1:{port}"));
    squatter.set_nonblocking(true).expect("nonblocking");
    assert_eq!(
        squatter.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "nothing was sent to the port's holder"
    );

    // The folder searchable: its owner may read it, and the token goes.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    squatter.set_nonblocking(false).expect("blocking");
    let holder = std::thread::spawn(move || {
        let (mut conn, _) = squatter.accept().expect("accept");
        let mut head = [0u8; 4096];
        let n = conn.read(&mut head).expect("read");
        conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            .expect("write");
        String::from_utf8_lossy(&head[..n]).to_lowercase()
    });
    let (code, _, stderr) = drain(&format!("127.0.0.1:{port}"));
    assert_eq!(code, 1, "{stderr}");
    let asked = holder.join().expect("join");
    assert!(asked.contains("authorization: bearer s3cret"), "{asked}");
}

/// A listener made as `uid` (its socket's owner in `/proc/net/tcp` is the
/// creating thread's filesystem uid, which only this thread changes).
fn listening_as(uid: u32) -> std::net::TcpListener {
    std::thread::spawn(move || {
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind")
    })
    .join()
    .expect("join")
}

/// A config this user may not read is said to be so, with who was
/// refused: it is no invalid config (exit 78 still, as DESIGN has it).
#[test]
fn a_config_the_user_may_not_read_is_not_called_invalid() {
    use std::os::unix::fs::PermissionsExt;
    if !skip::root_or_skipped() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_with(
        dir.path(),
        "127.0.0.1:9901",
        &dir.path().join("control.sock"),
    );
    for (path, mode) in [(dir.path(), 0o755), (config.as_path(), 0o600)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let out = run_as_nobody(
        dir.path(),
        &["check".as_ref(), "-c".as_ref(), config.as_ref()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    let said = format!(
        "baton: cannot read config {}: Permission denied (os error 13) (read as uid 65534)",
        config.display()
    );
    assert!(
        stderr.contains(&said) && !stderr.contains("invalid"),
        "{stderr}"
    );
}

/// Runs a copy of the binary in `dir` (which uid 65534 may run wherever
/// the checkout lives) as uid and gid 65534 with `args`. A spawn that
/// finds the fresh copy busy (ETXTBSY: another test's child, forked while
/// the copy was open for writing and not yet exec'd) is tried again.
fn run_as_nobody(dir: &std::path::Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let cli = dir.join("baton-cli");
    if !cli.exists() {
        std::fs::copy(BIN, &cli).expect("copy the binary");
        std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    for _ in 0..100 {
        match Command::new(&cli).args(args).uid(65534).gid(65534).output() {
            Err(err) if err.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            out => return out.expect("run baton as nobody"),
        }
    }
    panic!("the copy of the binary stayed busy for 2 s");
}

fn run_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run baton");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn line<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {stdout}"))
}

/// `baton reload` checks the config with the budgets the daemon reads
/// (flag, then `BATON_DRAIN_TIMEOUT`): `reload.close_spread` must be
/// shorter than `reload.drain_timeout`, which defaults to the stop's, so a
/// drop-in's environment that the daemon and `check` take it with made
/// `systemctl reload` refuse the config (78) before asking the daemon.
/// With no daemon here, a reload that gets as far as asking says it cannot
/// reach it (69).
#[test]
fn reload_checks_the_config_with_the_budgets_the_daemon_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.toml");
    let socket = dir.path().join("control.sock");
    std::fs::write(
        &path,
        format!("[control]\nsocket = \"{}\"\n[reload]\nclose_spread = \"30s\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n[[pools]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n", socket.display()),
    )
    .expect("write");
    let p = path.to_str().expect("utf-8 path");
    let env = [("BATON_DRAIN_TIMEOUT", "2m")];
    let (code, _, err) = run_env(&["check", "-c", p], &env);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_env(&["reload", "-c", p], &env);
    assert_eq!(code, 69, "asked the daemon: {err}");
    let (code, _, err) = run_env(&["reload", "-c", p, "--drain-timeout", "1m"], &[]);
    assert_eq!(code, 69, "asked the daemon: {err}");
    let (code, _, err) = run_env(&["reload", "-c", p], &[]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("reload.close_spread"), "{err}");
}

#[test]
fn budgets_follow_flag_over_env_over_file_with_0_default_and_negative_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.toml");
    std::fs::write(
        &path,
        "[shutdown]\npre_stop_delay = \"0\"\ndrain_timeout = \"7s\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n",
    )
    .expect("write");
    let p = path.to_str().expect("utf-8 path");
    let (_, out, _) = run_env(&["check", "-c", p], &[]);
    assert_eq!(
        line(&out, "shutdown.pre_stop_delay"),
        "shutdown.pre_stop_delay 5s",
        "0 means the default"
    );
    assert_eq!(
        line(&out, "shutdown.drain_timeout"),
        "shutdown.drain_timeout  7s",
        "the file"
    );
    let (_, out, _) = run_env(
        &["check", "-c", p],
        &[
            ("BATON_DRAIN_TIMEOUT", "9s"),
            ("BATON_PRE_STOP_DELAY", "-1s"),
        ],
    );
    assert_eq!(
        line(&out, "shutdown.drain_timeout"),
        "shutdown.drain_timeout  9s",
        "env beats file"
    );
    assert_eq!(
        line(&out, "shutdown.pre_stop_delay"),
        "shutdown.pre_stop_delay none",
        "negative is none"
    );
    // No pre-stop pause, but the HTTP listener defers accepting, so the
    // doors stay open 1.5 s: 1.5 + 9 + 5 s, rounded up.
    assert_eq!(line(&out, "TimeoutStopSec"), "TimeoutStopSec=16");
    let (_, out, _) = run_env(
        &["check", "-c", p, "--drain-timeout", "11s"],
        &[("BATON_DRAIN_TIMEOUT", "9s")],
    );
    assert_eq!(
        line(&out, "shutdown.drain_timeout"),
        "shutdown.drain_timeout  11s",
        "flag beats env"
    );
    // 250ms is under the 1.5 s the deferring listener's doors stay open:
    // 1.5s + 11s + 5s, and a whole second more, not less (systemd would
    // SIGKILL at 17 s a stop that needs 17.5).
    let (_, out, _) = run_env(
        &[
            "check",
            "-c",
            p,
            "--drain-timeout",
            "11s",
            "--pre-stop-delay",
            "250ms",
        ],
        &[],
    );
    assert_eq!(line(&out, "TimeoutStopSec"), "TimeoutStopSec=18");
    // A value that is no duration is the config's error (78, naming the
    // flag and its variable), not clap's usage error (2): a bad
    // `Environment=` line meets `RestartPreventExitStatus=78` rather than
    // a restart loop.
    for (args, env, named) in [
        (
            &["check", "-c", p, "--drain-timeout", "soon"][..],
            &[][..],
            "BATON_DRAIN_TIMEOUT",
        ),
        (
            &["check", "-c", p][..],
            &[("BATON_PRE_STOP_DELAY", "soon")][..],
            "BATON_PRE_STOP_DELAY",
        ),
    ] {
        let (code, _, err) = run_env(args, env);
        assert_eq!(code, 78, "{err}");
        assert!(err.contains(named) && err.contains("soon"), "{err}");
    }
}

#[test]
fn check_warns_when_the_unit_would_cut_a_drain_short() {
    let dir = tempfile::tempdir().expect("tempdir");
    let unit = dir.path().join("baton.service");
    std::fs::write(&unit, "[Service]\nTimeoutStopSec=8\n").expect("write unit");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/baton.toml");
    let u = unit.to_str().expect("utf-8 path");
    let (code, _, stderr) = run(&["check", "-c", example, "--unit", u]);
    assert_eq!(code, 0);
    assert!(
        stderr.contains("TimeoutStopSec=8") && stderr.contains("would kill baton mid-drain"),
        "{stderr}"
    );
    // systemd reads 0 as no timeout at all.
    for enough in [
        "TimeoutStopSec=25s",
        "TimeoutStopSec=0",
        "TimeoutSec=infinity",
    ] {
        std::fs::write(&unit, format!("[Service]\n{enough}\n")).expect("write unit");
        let (_, _, stderr) = run(&["check", "-c", example, "--unit", u]);
        assert!(!stderr.contains("warning"), "{enough}: {stderr}");
    }
    // None set: systemd's default, 90 s, is what a drain must fit.
    std::fs::write(&unit, "[Service]\nExecStart=/usr/bin/baton run\n").expect("write unit");
    let (_, _, stderr) = run(&["check", "-c", example, "--unit", u]);
    assert!(!stderr.contains("warning"), "{stderr}");
    let (_, _, stderr) = run(&["check", "-c", example, "--unit", u, "--drain-timeout", "2m"]);
    assert!(
        stderr.contains("the unit sets no TimeoutStopSec")
            && stderr.contains("would kill baton mid-drain")
            && !stderr.contains("TimeoutStartSec"),
        "{stderr}"
    );
    // The budget the unit runs the service with is the one checked: a
    // drop-in's variable, or a flag in ExecStart= (checked with its own,
    // `check` passed what the next start refused or cut short).
    let dropins = dir.path().join("baton.service.d");
    std::fs::create_dir(&dropins).expect("mkdir");
    let dropin = dropins.join("budget.conf");
    for (main, extra) in [
        ("", "[Service]\nEnvironment=\"BATON_DRAIN_TIMEOUT=2m\"\n"),
        ("ExecStart=/usr/bin/baton run --drain-timeout=2m\n", ""),
    ] {
        std::fs::write(&unit, format!("[Service]\nTimeoutStopSec=20\n{main}")).expect("unit");
        std::fs::write(&dropin, extra).expect("drop-in");
        let (code, _, stderr) = run(&["check", "-c", example, "--unit", u]);
        assert_eq!(code, 0, "{stderr}");
        assert!(
            stderr.contains("checked with 2m as --drain-timeout")
                && stderr.contains("TimeoutStopSec=20")
                && stderr.contains("would kill baton mid-drain"),
            "{stderr}"
        );
    }
    // Its own is checked with, and the unit's said beside it; and a file
    // of variables check does not read is said too.
    let (_, _, stderr) = run(&["check", "-c", example, "--unit", u, "--drain-timeout", "5s"]);
    assert!(
        stderr.contains("5s, given here; the unit runs the service with 2m")
            && !stderr.contains("would kill"),
        "{stderr}"
    );
    std::fs::write(&dropin, "[Service]\nEnvironmentFile=-/etc/default/baton\n").expect("drop-in");
    let (_, _, stderr) = run(&["check", "-c", example, "--unit", u]);
    assert!(stderr.contains("reads an EnvironmentFile="), "{stderr}");
}

/// `check`, run as root, sees a file system the service does not: it says
/// which paths baton would write that the shipped unit's sandbox keeps it
/// from (here a `/tmp` of the service's own, and `/etc` read-only), each
/// with its reason, and is quiet once a drop-in opens them.
#[test]
fn check_warns_of_writes_the_units_sandbox_forbids() {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let unit = dir.path().join("baton.service");
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/baton.service");
    std::fs::copy(shipped, &unit).expect("the shipped unit");
    let config = dir.path().join("baton.toml");
    let here = dir.path().display();
    let body = format!(
        "workers = 1\n[control]\nsocket = \"{here}/control.sock\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\naccess_log = {{ path = \"access.log\" }}\n[[listeners]]\nname = \"etc\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\naccess_log = {{ path = \"/etc/baton-test-access.log\" }}\n[[pools]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n"
    );
    std::fs::write(&config, body).expect("config");
    let (c, u) = (
        config.to_str().expect("utf-8"),
        unit.to_str().expect("utf-8"),
    );
    let (code, _, stderr) = run(&["check", "-c", c, "--unit", u]);
    assert_eq!(code, 0, "{stderr}");
    for (what, why) in [
        (
            format!("the control socket {here}/control.sock"),
            "PrivateTmp=yes",
        ),
        (
            format!("listener \"web\"'s access log {here}/access.log"),
            "PrivateTmp=yes",
        ),
        (
            "listener \"etc\"'s access log /etc/baton-test-access.log".to_string(),
            "ProtectSystem=strict",
        ),
    ] {
        let said = stderr.lines().find(|l| l.contains(&what));
        assert!(
            said.is_some_and(|l| l.contains(why)),
            "{what}, {why}: {stderr}"
        );
    }
    let dropins = dir.path().join("baton.service.d");
    std::fs::create_dir(&dropins).expect("drop-in folder");
    let open = format!("[Service]\nPrivateTmp=no\nReadWritePaths=\"{here}\" -/etc\n");
    std::fs::write(dropins.join("open.conf"), open).expect("drop-in");
    let (code, _, stderr) = run(&["check", "-c", c, "--unit", u]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("out of the service's reach"), "{stderr}");
}

/// The unit's open-file limit is held to what the listeners'
/// `max_connections` may take (two fds each, 1024 more): the example's
/// two listeners of 10,000 take 41,024.
#[test]
fn check_warns_of_an_open_file_limit_below_max_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let unit = dir.path().join("baton.service");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/baton.toml");
    let u = unit.to_str().expect("utf-8 path");
    let limited = "open files the listeners' max_connections";
    for (limit, warned) in [
        ("LimitNOFILE=1048576\n", false),
        ("LimitNOFILE=infinity\n", false),
        ("", false),
        ("LimitNOFILE=1024:65536\nLimitNOFILE=4096\n", true),
        ("LimitNOFILE=1024:41024\n", false),
        ("LimitNOFILE=41023\n", true),
    ] {
        std::fs::write(&unit, format!("[Service]\nTimeoutStopSec=60\n{limit}")).expect("unit");
        let (code, _, stderr) = run(&["check", "-c", example, "--unit", u]);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(stderr.contains(limited), warned, "{limit:?}: {stderr}");
    }
    assert!(
        run(&["check", "-c", example, "--unit", u])
            .2
            .contains("LimitNOFILE=41023 in"),
        "the setting named"
    );
}

/// Drop-ins count, applied after the unit file as systemd applies them
/// (an admin's override lives there: an upgrade replaces the unit file);
/// and a `TimeoutStartSec`, which bounds `ExecReload=`, shorter than what
/// `baton reload` waits is said too.
#[test]
fn check_reads_the_units_drop_ins_and_its_reload_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let unit = dir.path().join("baton.service");
    std::fs::write(&unit, "[Service]\nTimeoutStopSec=8\nTimeoutStartSec=40\n").expect("unit");
    let dropins = dir.path().join("baton.service.d");
    std::fs::create_dir(&dropins).expect("drop-in folder");
    std::fs::write(
        dropins.join("10-stop.conf"),
        "[Service]\nTimeoutStopSec=60\n",
    )
    .expect("drop-in");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/baton.toml");
    let u = unit.to_str().expect("utf-8 path");
    let (code, _, stderr) = run(&["check", "-c", example, "--unit", u]);
    assert_eq!(code, 0);
    assert!(
        !stderr.contains("warning"),
        "the drop-in raised it: {stderr}"
    );
    std::fs::write(dropins.join("20-both.conf"), "[Service]\nTimeoutSec = 15\n").expect("drop-in");
    let (_, _, stderr) = run(&["check", "-c", example, "--unit", u]);
    assert!(
        stderr.contains("TimeoutSec=15 in") && stderr.contains("would kill baton mid-drain"),
        "{stderr}"
    );
    assert!(
        stderr.contains("what `baton reload` waits") && stderr.contains("call failed a reload"),
        "{stderr}"
    );
    // One listener on one worker: 3 sockets (its shard, admin, control).
    let one = dir.path().join("one.toml");
    let body = "workers = 1\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n";
    std::fs::write(&one, body).expect("config");
    std::fs::write(
        dropins.join("30-store.conf"),
        "[Service]\nFileDescriptorStoreMax=2\n",
    )
    .expect("drop-in");
    let c = one.to_str().expect("utf-8 path");
    let (_, _, stderr) = run(&["check", "-c", c, "--unit", u]);
    assert!(
        stderr.contains("FileDescriptorStoreMax=2")
            && stderr.contains("below the 3 listening sockets"),
        "{stderr}"
    );
}

#[test]
fn a_remote_admin_without_a_token_is_refused_by_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.toml");
    let body = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n";
    std::fs::write(&path, format!("[admin]\nlisten = \"0.0.0.0:9901\"\n{body}")).expect("write");
    let p = path.to_str().expect("utf-8 path");
    let (code, _, stderr) = run(&["check", "-c", p]);
    assert_eq!(code, 78);
    assert!(
        stderr.contains("admin.listen: 0.0.0.0:9901 is not a loopback address"),
        "{stderr}"
    );
    std::fs::write(
        &path,
        format!("[admin]\nlisten = \"0.0.0.0:9901\"\nallow_remote_without_token = true\n{body}"),
    )
    .expect("write");
    assert_eq!(run(&["check", "-c", p]).0, 0);
}

#[test]
fn an_absurd_duration_is_refused_with_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.toml");
    std::fs::write(
        &path,
        "[shutdown]\ndrain_timeout = \"500000y\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\nresponse_timeout = 9999999999999\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n",
    )
    .expect("write");
    let p = path.to_str().expect("utf-8 path");
    for command in ["check", "run"] {
        let (code, _, stderr) = run(&[command, "-c", p]);
        assert_eq!(code, 78, "{command}: {stderr}");
        assert!(
            stderr.contains("shutdown.drain_timeout: duration \"500000y\" is longer than the longest allowed (365d)"),
            "{command}: {stderr}"
        );
        assert!(
            stderr.contains("listeners[0].response_timeout: duration \"9999999999999\" is longer"),
            "{command}: {stderr}"
        );
    }
}

/// `baton run` that must end on its own within 20 s (killed otherwise).
fn run_to_its_end(args: &[&str], umask: &str) -> (Option<i32>, String) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask}; exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run baton");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.code(), err);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    (None, "still running after 20 s".into())
}

/// A config in `dir` with its admin API at `admin` (as `admin.listen`
/// writes it) and its control socket at `control`.
fn config_with(
    dir: &std::path::Path,
    admin: &str,
    control: &std::path::Path,
) -> std::path::PathBuf {
    let path = dir.join("b.toml");
    std::fs::write(
        &path,
        format!(
            "[shutdown]\npre_stop_delay = \"-1s\"\n[admin]\nlisten = \"{admin}\"\n[control]\nsocket = \"{}\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n[[pools]]\nname = \"app\"\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n",
            control.display()
        ),
    )
    .expect("write");
    path
}

#[test]
fn a_control_path_that_is_not_a_socket_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.sock");
    let config = config_with(dir.path(), "127.0.0.1:0", &control);
    let c = config.to_str().expect("utf-8 path");

    std::fs::write(&control, "precious").expect("write a file");
    let (code, stderr) = run_to_its_end(&["run", "-c", c], "022");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("exists and is not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&control).expect("kept"), "precious");

    std::fs::remove_file(&control).expect("remove");
    let target = dir.path().join("target");
    std::fs::write(&target, "precious").expect("write the target");
    std::os::unix::fs::symlink(&target, &control).expect("symlink");
    let (code, stderr) = run_to_its_end(&["run", "-c", c], "022");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&target).expect("kept"), "precious");
    assert!(std::fs::symlink_metadata(&control)
        .expect("the link")
        .file_type()
        .is_symlink());
}

#[test]
fn the_control_socket_is_0600_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.sock");
    let config = config_with(dir.path(), "127.0.0.1:0", &control);
    let c = config.to_str().expect("utf-8 path").to_string();
    let daemon = std::thread::spawn(move || run_to_its_end(&["run", "-c", &c], "000"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !control.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&control)
        .expect("the socket")
        .permissions()
        .mode();
    let _ = Command::new("pkill")
        .args(["-TERM", "-f", config.to_str().expect("utf-8")])
        .status();
    let (end, stderr) = daemon.join().expect("join");
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    assert_eq!(end, Some(0), "{stderr}");
}

#[test]
fn check_shows_whom_a_listener_believes_and_what_a_pool_sends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pp.toml");
    std::fs::write(
        &path,
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\nproxy_protocol = { accept = \"v2\", trusted = [\"10.0.0.0/8\", \"::1\"], timeout = \"2s\" }\n\n[[pools]]\nname = \"app\"\nsend_proxy = \"v1\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n",
    )
    .expect("write");
    let (code, stdout, stderr) = run(&["check", "-c", path.to_str().expect("utf-8 path")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("listener web proxy_protocol accept v2, trusted [10.0.0.0/8, ::1/128], required, timeout 2s"),
        "{stdout}"
    );
    assert!(
        stdout.contains("pool app: 1 backend(s), send_proxy v1"),
        "{stdout}"
    );
}

/// `cd /etc/baton && baton check -c baton.toml`: a config named bare has
/// its relative paths beside it (its folder was taken as "", which no
/// access log's folder is).
#[test]
fn a_config_named_bare_finds_its_relative_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("bare.toml"),
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\naccess_log = { path = \"access.log\" }\n\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["check", "-c", "bare.toml"])
        .current_dir(dir.path())
        .output()
        .expect("run baton");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("listener web access_log access.log (json)"),
        "{stdout}"
    );
}

/// `baton check | head -1`, or `grep -q` under `pipefail`: a reader gone
/// before the output ends leaves the exit code the check's, not a panic's
/// 101 ("failed printing to stdout").
#[test]
fn check_into_a_closed_pipe_exits_with_its_outcome() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/baton.toml");
    // Close-on-exec (the child's stdout is a copy made for it): a read
    // end another test's child inherited would keep the pipe open.
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    drop(read);
    let out = Command::new(BIN)
        .args(["check", "-c", path])
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run baton");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A log setting baton cannot use is said on stderr, not taken silently.
#[test]
fn bad_log_settings_are_said() {
    let (code, _, stderr) = run_env(
        &["run", "-c", "/nonexistent/baton.toml"],
        &[("BATON_LOG", "info,=["), ("BATON_LOG_FORMAT", "xml")],
    );
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.contains("BATON_LOG=\"info,=[\" is not a log filter"),
        "{stderr}"
    );
    assert!(
        stderr.contains("BATON_LOG_FORMAT=\"xml\" is not auto, text or json"),
        "{stderr}"
    );
}

/// The shipped unit names no config file: baton's default is the same
/// path, and a drop-in's `Environment=BATON_CONFIG=` then reaches the
/// daemon and the reload alike (a `-c` flag would win over it,
/// silently). As DESIGN.md writes the commands.
#[test]
fn the_shipped_unit_leaves_the_config_path_to_baton_config() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/baton.service"
    ))
    .expect("the unit");
    let commands: Vec<&str> = unit.lines().filter(|l| l.starts_with("Exec")).collect();
    assert_eq!(
        commands,
        [
            "ExecStart=/usr/bin/baton run",
            "ExecReload=/usr/bin/baton reload",
        ]
    );
}

/// `GET path` on the admin Unix socket at `socket`: the status line's code
/// and the body, or `None` if nothing answered.
fn admin_over_unix(socket: &std::path::Path, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let code = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

/// Polls `socket`'s `path` until `wanted` holds of its answer (20 s at most).
fn admin_until(
    socket: &std::path::Path,
    path: &str,
    wanted: impl Fn(u16, &str) -> bool,
) -> Option<(u16, String)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        match admin_over_unix(socket, path) {
            Some((code, body)) if wanted(code, &body) => return Some((code, body)),
            _ => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    None
}

/// DESIGN's `listen = "unix:/run/baton/admin.sock"`: probes, `/status` and
/// `baton status` on a Unix socket, made 0600 whatever the umask, the same
/// socket across a reload (the next generation answers on it, after the
/// first retired), gone after the stop, and `baton check` says where it
/// is. Behind the mode, another uid is refused even with the socket open
/// to all (as root only: acting as another uid needs it; CI runs as root).
#[test]
fn the_admin_api_answers_on_a_unix_socket_across_a_reload() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("admin.sock");
    let admin = format!("unix:{}", socket.display());
    let config = config_with(dir.path(), &admin, &dir.path().join("control.sock"));
    let c = config.to_str().expect("utf-8 path");
    let (code, stdout, stderr) = run(&["check", "-c", c]);
    assert_eq!(code, 0, "{stderr}");
    assert!(line(&stdout, "admin.listen").contains(&admin), "{stdout}");

    let log = dir.path().join("baton.log");
    let mut first_generation = first_generation(c, "000", &log);
    let ready = admin_until(&socket, "/readyz", |code, _| code == 200);
    let first = admin_over_unix(&socket, "/status");
    let inode = std::fs::metadata(&socket).map(|m| m.ino()).ok();
    let mode = std::fs::metadata(&socket)
        .map(|m| m.permissions().mode() & 0o777)
        .ok();
    let _ = kill(Pid::from_raw(first_generation.id() as i32), Signal::SIGHUP);
    let reloaded = admin_until(&socket, "/status", |_, body| body.contains("\"number\":2"));
    // The first generation retires at once (it has nothing to drain):
    // what it does then must leave the socket to the second.
    let retiring_deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let drained = || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("drained; exiting"));
    while !drained() && std::time::Instant::now() < retiring_deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let after_retiring = drained().then(|| admin_over_unix(&socket, "/readyz"));
    let (status_code, status_out, status_err) = run(&["status", "--json", "-c", c]);
    let inode_after = std::fs::metadata(&socket).map(|m| m.ino()).ok();
    let stranger = status_as_another_uid(dir.path(), &config, &socket);
    let second = reloaded
        .as_ref()
        .and_then(|(_, body)| generation_pid(body, 2));
    let stopped = second.map(|pid| {
        let _ = kill(pid, Signal::SIGTERM);
        exit_code_within(pid, std::time::Duration::from_secs(20))
    });
    // It exits once the second has (it speaks for the service then).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while matches!(first_generation.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Killed only if it still runs (then its exit code is none).
    let _ = first_generation.kill();
    let retired = first_generation.wait().ok().and_then(|s| s.code());
    kill_daemons_of(&config);

    assert!(ready.is_some(), "no /readyz 200 on the Unix socket");
    assert!(first.is_some_and(|(code, _)| code == 200), "/status");
    assert_eq!(mode, Some(0o600), "the socket's mode");
    assert!(reloaded.is_some(), "the reload's generation answers on it");
    let after_retiring = after_retiring.expect("the first generation drained within 20 s");
    let answered = after_retiring.map(|(code, _)| code);
    assert_eq!(answered, Some(200), "after the first generation retired");
    assert_eq!(inode_after, inode, "the same socket, handed over");
    assert_eq!(status_code, 0, "baton status: {status_err}");
    assert!(status_out.contains("\"number\":2"), "{status_out}");
    // Refused with a reason (exit 1: the daemon answered), not a bare
    // close.
    if let Some((code, stderr)) = stranger {
        assert_eq!(code, Some(1), "uid 65534's baton status: {stderr}");
        assert!(
            stderr.contains("403") && stderr.contains("uid 65534"),
            "{stderr}"
        );
    }
    assert_eq!(
        stopped,
        Some(Some(0)),
        "the second generation's exit code, stopped"
    );
    assert_eq!(retired, Some(0), "the first's, retired");
    assert!(!socket.exists(), "the socket's path goes with the stop");
}

/// `baton status` run as uid 65534 against the admin socket at `socket`,
/// with every mode on its way loosened (as a careless operator, or
/// systemd's `SocketMode=0666`, might): its exit code and stderr. `None`
/// when not root.
fn status_as_another_uid(
    dir: &std::path::Path,
    config: &std::path::Path,
    socket: &std::path::Path,
) -> Option<(Option<i32>, String)> {
    use std::os::unix::fs::PermissionsExt;
    if !skip::root_or_skipped() {
        return None;
    }
    for (path, mode) in [(dir, 0o755), (config, 0o644), (socket, 0o666)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let out = run_as_nobody(dir, &["status".as_ref(), "-c".as_ref(), config.as_ref()]);
    Some((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `baton run -c config` in the background under `umask`, outside
/// systemd, its log (every generation's) in `log`. The generations its
/// reloads start are its children: this process becomes their subreaper,
/// to wait for them once it exits.
fn first_generation(config: &str, umask: &str, log: &std::path::Path) -> std::process::Child {
    nix::sys::prctl::set_child_subreaper(true).expect("subreaper");
    Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask}; exec \"$0\" run -c \"$1\""))
        .arg(BIN)
        .arg(config)
        .env_remove("NOTIFY_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("run baton")
}

/// Kills whatever `baton run` of `config` a failed test left running (a
/// generation it could not find to stop), so none outlives the test.
fn kill_daemons_of(config: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let wanted = config.as_os_str().as_encoded_bytes();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline.split(|&b| b == 0).any(|arg| arg == wanted) {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The pid of generation `number` in a `/status` body.
fn generation_pid(status: &str, number: u64) -> Option<nix::unistd::Pid> {
    let status: serde_json::Value = serde_json::from_str(status).ok()?;
    let generations = status["generations"].as_array()?;
    let found = generations.iter().find(|g| g["number"] == number)?;
    Some(nix::unistd::Pid::from_raw(found["pid"].as_i64()? as i32))
}

/// A reload that moves the admin socket from one path to another serves
/// it at the new one and removes the old one's file (nothing answers
/// there once the old generation is gone, and `baton status` with an old
/// config would meet a dead socket rather than no file); one that moves
/// it to an address answers there, and removes the last path's file.
#[test]
fn a_reload_that_moves_the_admin_socket_removes_the_old_file() {
    use nix::sys::signal::{kill, Signal};
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.sock");
    let (first_path, second_path) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let config = config_with(
        dir.path(),
        &format!("unix:{}", first_path.display()),
        &control,
    );
    let c = config.to_str().expect("utf-8 path");
    let mut first_generation = first_generation(c, "022", &dir.path().join("baton.log"));
    let ready = admin_until(&first_path, "/readyz", |code, _| code == 200);

    config_with(
        dir.path(),
        &format!("unix:{}", second_path.display()),
        &control,
    );
    let (to_path, _, to_path_err) = run(&["reload", "-c", c]);
    let first_left = first_path.exists();
    let at_second = admin_until(&second_path, "/status", |_, body| {
        body.contains("\"number\":2")
    });

    config_with(dir.path(), &address.to_string(), &control);
    let (to_address, _, to_address_err) = run(&["reload", "-c", c]);
    let second_left = second_path.exists();
    let (status_code, status, status_err) = run(&["status", "--json", "-c", c]);
    let third = generation_pid(&status, 3);
    let stopped = third.map(|pid| {
        let _ = kill(pid, Signal::SIGTERM);
        exit_code_within(pid, std::time::Duration::from_secs(20))
    });
    let _ = first_generation.kill();
    let _ = first_generation.wait();
    kill_daemons_of(&config);

    assert!(
        ready.is_some(),
        "no /readyz 200 at {}",
        first_path.display()
    );
    assert_eq!(to_path, 0, "the reload to another path: {to_path_err}");
    assert!(at_second.is_some(), "generation 2 answers at the new path");
    assert!(
        !first_left,
        "the first path's file is gone once generation 2 serves"
    );
    assert_eq!(to_address, 0, "the reload to an address: {to_address_err}");
    assert!(
        !second_left,
        "the second path's file is gone once generation 3 serves"
    );
    assert_eq!(status_code, 0, "baton status over TCP: {status_err}");
    assert_eq!(stopped, Some(Some(0)), "generation 3's exit code, stopped");
}

/// `pid`'s exit code (a child of this process's, as its subreaper, once
/// its parent exits), or `None` if it is still running after `within`
/// (then it is killed).
fn exit_code_within(pid: nix::unistd::Pid, within: std::time::Duration) -> Option<i32> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return Some(code),
            // Not this process's child until the generation before exits.
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            _ => return None,
        }
    }
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = waitpid(pid, None);
    None
}

/// The admin socket's `unix:` needs a path, not the control socket's; and
/// neither path may be longer than a Unix socket's address holds (the
/// bind would fail only at the start, or at a reload).
#[test]
fn unix_socket_paths_are_their_own_and_fit_a_socket_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.sock");
    let too_long = format!("/run/{}.sock", "b".repeat(100));
    let body = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n";
    for (listen, control, problem) in [
        (
            "unix:".to_string(),
            control.display().to_string(),
            "admin.listen: \"unix:\" needs the socket's path",
        ),
        (
            format!("unix:{}", control.display()),
            control.display().to_string(),
            "is control.socket's path too",
        ),
        (
            format!("unix:{too_long}"),
            control.display().to_string(),
            "admin.listen: /run/bbb",
        ),
        (
            "127.0.0.1:0".to_string(),
            too_long.clone(),
            "control.socket: /run/bbb",
        ),
    ] {
        let path = dir.path().join("b.toml");
        let text =
            format!("[admin]\nlisten = \"{listen}\"\n[control]\nsocket = \"{control}\"\n{body}");
        std::fs::write(&path, text).expect("write");
        let (code, _, stderr) = run(&["check", "-c", path.to_str().expect("utf-8")]);
        assert_eq!(code, 78, "{listen}: {stderr}");
        assert!(stderr.contains(problem), "{listen}: {stderr}");
    }
}

/// `status` and `backend` read only `[admin]` to find the daemon: one that
/// does not load is a config error (78) naming its key, not "the daemon
/// cannot be reached" (69), which would send an SRE looking for a daemon
/// the command never looked for.
#[test]
fn status_and_backend_with_an_admin_section_that_does_not_load_exit_78() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.toml");
    std::fs::write(&path, "[admin]\nlisten = \"nowhere\"\n").expect("write");
    let p = path.to_str().expect("utf-8 path");
    for args in [
        &["status", "-c", p][..],
        &["backend", "drain", "0", "-c", p][..],
    ] {
        let (code, _, stderr) = run(args);
        assert_eq!(code, 78, "{args:?}: {stderr}");
        assert!(stderr.contains("admin.listen"), "{args:?}: {stderr}");
    }
}

/// Another local user's flood of connections to the admin Unix socket
/// (open to all, as systemd's `SocketMode=0666` leaves it) takes no admin
/// place: each is refused before it would take one, so an allowed
/// caller's kept-alive connection is not made to give its place up (300
/// refused connections used to take all 256 and close it). Root only.
#[test]
fn refused_unix_peers_take_no_admin_place() {
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !skip::root_or_skipped() {
        return;
    }
    // Under /tmp, which uid 65534 may traverse whatever TMPDIR says.
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let socket = dir.path().join("admin.sock");
    let config = config_with(
        dir.path(),
        &format!("unix:{}", socket.display()),
        &dir.path().join("control.sock"),
    );
    let log = dir.path().join("baton.log");
    let mut daemon = first_generation(config.to_str().expect("utf-8 path"), "022", &log);
    let ready = admin_until(&socket, "/healthz", |code, _| code == 200);
    for (path, mode) in [(dir.path(), 0o755), (socket.as_path(), 0o666)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let ask = |kept: &mut std::os::unix::net::UnixStream| -> Option<String> {
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut answer = vec![0u8; 4096];
        let n = kept.read(&mut answer).ok()?;
        Some(String::from_utf8_lossy(&answer[..n]).into_owned())
    };
    let mut kept = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
    kept.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let first = ask(&mut kept);
    // 300 connections made as uid 65534, held while `sleep` runs.
    let path = std::ffi::CString::new(socket.as_os_str().as_encoded_bytes()).expect("path");
    let mut flood = Command::new("sleep");
    flood.arg("3").uid(65534).gid(65534);
    // SAFETY: runs in the forked child (as uid 65534) before exec: only
    // socket(2) and connect(2), on memory prepared before the fork.
    unsafe {
        flood.pre_exec(move || {
            let mut addr: nix::libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = nix::libc::AF_UNIX as nix::libc::sa_family_t;
            for (slot, &b) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
                *slot = b as nix::libc::c_char;
            }
            for _ in 0..300 {
                let fd = nix::libc::socket(nix::libc::AF_UNIX, nix::libc::SOCK_STREAM, 0);
                nix::libc::connect(
                    fd,
                    std::ptr::addr_of!(addr).cast(),
                    std::mem::size_of::<nix::libc::sockaddr_un>() as nix::libc::socklen_t,
                );
            }
            Ok(())
        });
    }
    let mut flooding = flood.spawn().expect("flood as uid 65534");
    // Connections are taken in the order they came: one made after the
    // flood's is answered only once all 300 were taken.
    let behind = admin_over_unix(&socket, "/healthz");
    let after = ask(&mut kept);
    let _ = flooding.kill();
    let _ = flooding.wait();
    let _ = daemon.kill();
    let _ = daemon.wait();
    kill_daemons_of(&config);
    assert!(ready.is_some(), "no /healthz on the Unix socket");
    assert!(
        behind.is_some_and(|(code, _)| code == 200),
        "root's request behind the flood"
    );
    assert!(
        first.is_some_and(|a| a.starts_with("HTTP/1.1 200")),
        "the kept connection's first answer"
    );
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        after
            .as_deref()
            .is_some_and(|a| a.starts_with("HTTP/1.1 200")),
        "the kept connection after the flood: {after:?}\n{logged}"
    );
    assert!(
        logged.contains("admin connection refused"),
        "the flood reached the socket, and was refused:\n{logged}"
    );
}
