//! Hostile or odd input never takes baton down: stray signals, garbage on
//! the control socket, a client that never speaks; and the control socket
//! is locked down (mode 0600).

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{signal, wait_exit, Baton, NoFreeFd, Spec};

async fn serving(baton: &Baton) {
    let a = client::get(baton.addr("web"), "/still")
        .await
        .expect("still serving");
    assert_eq!(a.status, 200);
}

/// One worker (every connection on one thread) before `backend`.
fn one_worker(backend: &HttpBackend) -> Spec {
    Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool("app", &[backend.addr])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_signals_do_not_kill_baton() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let pid = baton.serving_pid().await;
    for sig in [
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGPIPE,
        Signal::SIGUSR1,
    ] {
        signal(pid, sig);
        tokio::time::sleep(Duration::from_millis(50)).await;
        serving(&baton).await;
    }
    assert_eq!(baton.serving_pid().await, pid, "the same process serves on");
    assert!(baton.log().contains("ignored signal"), "{}", baton.log());
}

/// Whether `pid` has a handler installed for `sig` (`SigCgt` in
/// `/proc/PID/status`).
fn catches(pid: u32, sig: Signal) -> bool {
    signal_mask(pid, "SigCgt:", sig)
}

/// A baton whose start-up is held still (its config behind a FIFO nobody
/// writes yet: feed it the returned text) once its handlers of SIGHUP and
/// SIGTERM are in place.
async fn held_at_start() -> (HttpBackend, Baton, String) {
    let backend = HttpBackend::start("a").await;
    let (baton, config) =
        Baton::spawn_reading_a_fifo(Spec::new().http("web", "app").pool("app", &[backend.addr]));
    let pid = baton.first_pid;
    support::eventually("baton's signal handlers are in place", || async {
        catches(pid, Signal::SIGHUP) && catches(pid, Signal::SIGTERM)
    })
    .await;
    (backend, baton, config)
}

/// Whether `sig` is in `pid`'s signal mask `field` of `/proc/PID/status`
/// (`SigCgt:` caught, `SigBlk:` blocked).
fn signal_mask(pid: u32, field: &str, sig: Signal) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (sig as u64 - 1)) != 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_during_start_up_do_not_kill_baton_and_an_early_sighup_is_kept() {
    let (_backend, baton, config) = held_at_start().await;
    let pid = baton.first_pid;
    for sig in [
        Signal::SIGHUP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGPIPE,
    ] {
        signal(pid, sig);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    support::daemon::feed_fifo(&baton.config, &config).await;
    baton.wait_ready().await;
    serving(&baton).await;
    assert!(baton.log().contains("ignored signal"), "{}", baton.log());
    // The SIGHUP was kept, not lost: once serving, baton reloads.
    support::eventually("the early SIGHUP becomes a reload", || async {
        baton.log().contains("reload: starting the next generation")
    })
    .await;
}

/// The control socket reads one request line of 64 KiB at most, within
/// 5 s (README): a client that writes more with no newline, its
/// connection kept open, is refused at once (unbounded, the read went on
/// until it stopped), and one that sends nothing is told so at 5 s, not
/// held for the generation's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_requests_are_bounded_to_64_kib_and_5_s() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let socket = baton.dir.path().join("control.sock");
    let reply_within = |mut s: UnixStream, within: Duration| async move {
        let mut reply = Vec::new();
        let _ = tokio::time::timeout(within, s.read_to_end(&mut reply)).await;
        String::from_utf8_lossy(&reply).into_owned()
    };
    let (mut reading, mut writing) = UnixStream::connect(&socket)
        .await
        .expect("connect")
        .into_split();
    // Its write half stays open while the answer is read.
    let flood = tokio::spawn(async move {
        let _ = writing.write_all(&vec![b'x'; 100 * 1024]).await;
        writing
    });
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), reading.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.contains("malformed request"), "{reply:?}");
    drop(flood);
    let asked = std::time::Instant::now();
    let silent = UnixStream::connect(&socket).await.expect("connect");
    let reply = reply_within(silent, support::TIMEOUT).await;
    assert!(reply.contains("no request within 5s"), "{reply:?}");
    assert!(
        asked.elapsed() >= Duration::from_millis(4900),
        "{:?}",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_control_socket_input_is_refused_and_nothing_blocks() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let socket = baton.dir.path().join("control.sock");
    let mode = std::fs::metadata(&socket)
        .expect("control socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    // A client that connects and never sends anything holds nothing up.
    let _silent = UnixStream::connect(&socket).await.expect("connect");
    let answers = |payload: Vec<u8>| {
        let socket = socket.clone();
        async move {
            let mut s = UnixStream::connect(&socket).await.expect("connect");
            let _ = s.write_all(&payload).await;
            let _ = s.shutdown().await;
            let mut reply = String::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut reply)).await;
            reply
        }
    };
    let garbage = answers(b"\xff\xfe not json at all\n".to_vec()).await;
    assert!(garbage.contains("malformed request"), "{garbage}");
    let truncated = answers(br#"{"command":"rel"#.to_vec()).await;
    assert!(truncated.contains("\"ok\":false"), "{truncated}");
    // A megabyte with no newline: read up to 64 KiB, then refused (the
    // flood may cost the client its answer, never the daemon anything).
    let huge = answers(vec![b'x'; 1024 * 1024]).await;
    assert!(huge.is_empty() || huge.contains("\"ok\":false"), "{huge}");
    assert_eq!(baton.serving_pid().await, baton.serving_pid().await);
    let unknown = answers(b"{\"command\":\"explode\"}\n".to_vec()).await;
    assert!(unknown.contains("\"ok\":false"), "{unknown}");

    serving(&baton).await;
    let r = baton.reload().await;
    assert_eq!(r.code, 0, "a real reload still works: {r:?}");
    serving(&baton).await;

    // The handoff channel (still open to the old generation while it
    // drains) is a socketpair: the only named socket is the control one.
    let held = support::daemon::socket_inodes(baton.serving_pid().await);
    let unix = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    let named: Vec<&str> = unix
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let inode: u64 = f.get(6)?.parse().ok()?;
            held.contains(&inode).then(|| f.get(7).copied()).flatten()
        })
        .collect();
    let control = socket.display().to_string();
    assert!(
        named.iter().all(|p| *p == control),
        "named unix sockets: {named:?}"
    );
}

/// The control socket is 0600, and behind that the daemon checks the
/// caller's uid itself: with every mode loosened, as a careless operator
/// might, another uid is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_is_refused_even_with_the_socket_open_to_it() {
    if !support::skip::root_or_skipped() {
        return;
    }
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let serving = baton.serving_pid().await;
    for (path, mode) in [
        (baton.dir.path().to_path_buf(), 0o755),
        (baton.config.clone(), 0o644),
        (baton.dir.path().join("control.sock"), 0o666),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    // A copy nobody can run wherever the checkout lives (a home directory
    // may be closed to other uids).
    let cli = baton.dir.path().join("baton-cli");
    std::fs::copy(support::daemon::BIN, &cli).expect("copy the binary");
    std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = tokio::process::Command::new(&cli)
        .args(["reload", "-c"])
        .arg(&baton.config)
        .uid(65534)
        .gid(65534)
        .output()
        .await
        .expect("run baton reload as nobody");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Not reached (69), as behind a socket whose mode refused the user,
    // and told who may.
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("uid 65534 may not control this daemon")
            && stderr.contains("admits root and the daemon's own user only"),
        "{stderr}"
    );
    assert_eq!(baton.serving_pid().await, serving, "nothing was reloaded");
}

/// CPU seconds `pid` has used (utime + stime).
fn cpu_seconds(pid: u32) -> f64 {
    support::daemon::cpu_ticks(pid) as f64 / support::daemon::ticks_per_second() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_fds_backs_off_without_spinning_and_recovers() {
    let backend = HttpBackend::start("a").await;
    // Four workers: four shards of the listener meet EMFILE together,
    // and the listener still warns once a second, not once per shard.
    let baton = Baton::spawn_under(
        Spec::new()
            .top("workers = 4")
            .http("web", "app")
            .pool("app", &[backend.addr]),
        &[],
        &["prlimit", "--nofile=64:64"],
    );
    baton.wait_ready().await;
    // Said at the start, as no `baton check` of a unit saw this limit.
    let log = baton.log();
    let said = log
        .lines()
        .find(|l| l.contains("WARN the open-file limit is below"));
    assert!(
        said.is_some_and(|l| l.contains("limit=64 needed=")),
        "{log}"
    );
    let pid = baton.first_pid;
    let web = baton.addr("web");
    let mut held = Vec::new();
    for _ in 0..200 {
        held.push(
            tokio::net::TcpStream::connect(web)
                .await
                .expect("the kernel completes the handshake"),
        );
    }
    support::eventually("baton hits EMFILE and says so", || async {
        baton.log().contains("accept failed; backing off")
    })
    .await;
    let warnings = || baton.log().matches("accept failed; backing off").count();
    let (before, warned_before) = (cpu_seconds(pid), warnings());
    let began = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_seconds(pid) - before;
    assert!(
        used < 0.5,
        "no busy loop while out of fds: {used:.2}s of CPU in 2s"
    );
    // Once a second over the time that passed (a loaded machine's sleep
    // may take longer than asked), one more at its edge.
    let most = began.elapsed().as_secs() as usize + 1;
    assert!(
        warnings() - warned_before <= most,
        "warned at most once a second for the whole listener:\n{}",
        baton.log()
    );
    drop(held);
    support::eventually("baton recovers once fds are free", || async {
        client::get(web, "/after")
            .await
            .is_ok_and(|a| a.status == 200)
    })
    .await;
}

/// The admin and control sockets meet a full fd table as the listeners
/// do: their accept loops retry every 100 ms while the connection waits in
/// the queue, warn once a second (they warned at each retry: ten lines a
/// second each), count the shortage at `accept`, and answer once fds free
/// up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_and_control_accepts_without_a_free_fd_warn_once_a_second_and_recover() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(one_worker(&backend)).await;
    let held = NoFreeFd::hold(baton.first_pid);
    let connected = std::time::Instant::now();
    let mut admin = tokio::net::TcpStream::connect(baton.admin)
        .await
        .expect("the kernel completes the handshake");
    let mut control = UnixStream::connect(baton.dir.path().join("control.sock"))
        .await
        .expect("connect");
    support::eventually("both accepts meet the shortage", || async {
        let log = baton.log();
        log.contains("admin accept failed") && log.contains("control accept failed")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = baton.log();
    // Once a second from the first, over the time that passed.
    let most = connected.elapsed().as_secs() as usize + 1;
    for what in ["admin accept failed", "control accept failed"] {
        let lines = log.matches(what).count();
        assert!(
            lines <= most,
            "{what}: {lines} lines, at most {most}:\n{log}"
        );
    }
    drop(held);
    admin
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let answer = client::read_until_closed(&mut admin).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    control
        .write_all(b"{\"command\":\"status\"}\n")
        .await
        .expect("request");
    let mut reply = Vec::new();
    control.read_to_end(&mut reply).await.expect("reply");
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.contains("\"ok\":true"), "{reply}");
    let metrics = client::metrics(baton.admin).await;
    let counted = client::series(&metrics, "baton_shortages_total{at=\"accept\"}");
    assert!(counted.is_some_and(|n| n >= 2.0), "{counted:?}\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_baton_stops_accepting_and_resumes_below_it() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", "max_connections = 2")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let mut first = client::connect(web).await.expect("first");
    let mut second = client::connect(web).await.expect("second");
    for c in [&mut first, &mut second] {
        assert_eq!(
            client::send(c, web, "/held").await.expect("held").status,
            200
        );
    }
    // The third waits in the kernel's backlog (or in a shard's hands, for
    // a place): not served, not refused.
    let third = tokio::spawn(async move { client::get(web, "/third").await });
    baton.until_connected("web", 3).await;
    assert!(
        !third.is_finished(),
        "a third connection must wait at the cap"
    );
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains("baton_listener_at_capacity_total{listener=\"web\"} 1"),
        "{metrics}"
    );
    drop(first);
    let answer = tokio::time::timeout(support::TIMEOUT, third)
        .await
        .expect("accepted below the cap")
        .expect("join");
    assert_eq!(answer.expect("third served").status, 200);
}

/// An HTTP listener `web` and its backend, with the serving pid and its
/// settled fd count before the test's traffic.
async fn counting_fds() -> (HttpBackend, Baton, u32, usize) {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let pid = baton.serving_pid().await;
    let before = support::daemon::settled_fd_count(pid).await;
    (backend, baton, pid, before)
}

/// The fd limit is the real cap on connections: an HTTP client connection
/// must cost one fd, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_connection_costs_one_fd() {
    let (_backend, baton, pid, before) = counting_fds().await;
    let web = baton.addr("web");
    let _held = client::kept_alive(web, "/", 50).await;
    let after = support::daemon::fd_count(pid);
    // 50 client sockets, plus the few pooled backend connections.
    assert!(
        after - before < 60,
        "{before} fds before, {after} with 50 connections"
    );
}

/// The same for h2c: a connection held a duplicate of its socket's fd, for
/// the linger of its close, two fds a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_client_connection_costs_one_fd() {
    let (_backend, baton, pid, before) = counting_fds().await;
    let web = baton.addr("web");
    let mut held = Vec::new();
    for _ in 0..50 {
        let mut h2 = client::h2::<http_body_util::Empty<bytes::Bytes>>(web).await;
        let get = hyper::Request::get(format!("http://{web}/"))
            .body(http_body_util::Empty::new())
            .expect("request");
        let answer = h2.send_request(get).await.expect("h2 response");
        assert_eq!(answer.status(), 200);
        held.push(h2);
    }
    let after = support::daemon::fd_count(pid);
    assert!(
        after - before < 60,
        "{before} fds before, {after} with 50 h2c connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_backend_is_a_504_at_response_timeout() {
    let (addr, keep) = support::backend::silent().await;
    let spec = Spec::new()
        .listener("web", "http", "app", "response_timeout = \"1s\"")
        .pool("app", &[addr]);
    let baton = Baton::start(spec).await;
    let answer = client::get(baton.addr("web"), "/")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 504);
    assert!(
        answer.body.starts_with("504 Gateway Timeout\n"),
        "{}",
        answer.body
    );
    assert!(
        client::backend_status(baton.admin, "app-0").await["last_error"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("did not answer within 1s")),
        "the detail is in /status"
    );
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains(
            "baton_upstream_errors_total{pool=\"app\",backend=\"app-0\",kind=\"timeout\"} 1"
        ),
        "{metrics}"
    );
    keep.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_head_gets_408_and_an_idle_keep_alive_outlives_the_head_timeout() {
    let backend = HttpBackend::start("a").await;
    let extra = "header_timeout = \"1s\"\nidle_timeout = \"5s\"";
    let baton = Baton::start(
        Spec::new()
            .listener("web", "http", "app", extra)
            .pool("app", &[backend.addr]),
    )
    .await;
    let web = baton.addr("web");

    // One header byte every 300 ms: answered 408 at header_timeout.
    let stream = tokio::net::TcpStream::connect(web).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    let dripping = tokio::spawn(async move {
        for b in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if write.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(support::TIMEOUT, read.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply:?}");
    dripping.abort();
    assert_eq!(backend.hits(), 0);

    // An idle keep-alive connection is not a slow head: it lives past the
    // 1 s header_timeout (up to idle_timeout) and takes its next request.
    let mut conn = client::connect(web).await.expect("connect");
    assert_eq!(
        client::send(&mut conn, web, "/one")
            .await
            .expect("first")
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        client::send(&mut conn, web, "/two")
            .await
            .expect("after 2.5 s idle")
            .status,
        200
    );

    // And at idle_timeout baton closes it (never sooner: timers do not
    // fire early).
    let mut s = tokio::net::TcpStream::connect(web).await.expect("connect");
    s.write_all(b"GET /three HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let answered = tokio::time::Instant::now();
    let reply = client::read_until_closed(&mut s).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(4900) && idle < support::TIMEOUT,
        "closed after {idle:?} idle; idle_timeout is 5 s"
    );
}

/// A client that asked for the close and sent no body is done: baton
/// closes at once (a FIN, nothing unread) instead of lingering for its
/// FIN, so a burst of one-request connections does not hold a socket
/// each for the linger time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asked_for_the_close_costs_no_socket_after_its_answer() {
    let (_backend, baton, pid, before) = counting_fds().await;
    let web = baton.addr("web");
    let mut held = Vec::new();
    for _ in 0..50 {
        let mut c = tokio::net::TcpStream::connect(web).await.expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.expect("answer, then EOF");
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
        // Still open on the client's side: only baton's close is measured.
        held.push(c);
    }
    let after = support::daemon::fd_count(pid);
    assert!(
        after.saturating_sub(before) < 10,
        "{before} fds before, {after} after 50 answered connections the clients keep open"
    );
}

/// logrotate's `systemctl kill --signal=USR1 baton`, and a reload's
/// `systemctl kill -s HUP baton`, reach every process of the unit, `baton
/// check` (run by hand or a deploy script) and `baton reload`
/// (ExecReload) among them: neither signal may kill a baton process that
/// does not handle it. Here `check` is held reading its config from a FIFO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_signals_kill_no_baton_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("baton.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    // Killed if the test fails first: blocked on its FIFO, it would
    // outlive the test, holding the harness's output open.
    let mut check = tokio::process::Command::new(support::daemon::BIN)
        .args(["check", "-c"])
        .arg(&fifo)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn check");
    let pid = check.id().expect("check's pid");
    let held = [Signal::SIGUSR1, Signal::SIGHUP, Signal::SIGUSR2];
    support::eventually("check holds SIGUSR1, SIGHUP and SIGUSR2", || async {
        held.iter().all(|&s| signal_mask(pid, "SigBlk:", s))
    })
    .await;
    for _ in 0..3 {
        held.iter().for_each(|&s| signal(pid, s));
    }
    std::fs::write(
        &fifo,
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\npool = \"app\"\n\n[[pools]]\nname = \"app\"\nbackends = [{ address = \"127.0.0.1:1\" }]\n",
    )
    .expect("feed the config");
    let status = check.wait().await.expect("wait");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// The admin port holds at most 256 connections at once (its fds are the
/// data plane's too): past it a newcomer makes the oldest give its place
/// up, so a probe is answered at once even when 256 kept-alive clients
/// hold every place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_connections_are_capped_and_a_probe_still_gets_a_place() {
    let (_backend, baton, pid, before) = counting_fds().await;
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(
            tokio::net::TcpStream::connect(baton.admin)
                .await
                .expect("connect"),
        );
    }
    // All 300 taken: each past the 256th made the oldest give its place
    // up (idle, it closes at once), which its client reads as an end.
    support::eventually(
        "the 44 oldest admin connections closed for newcomers",
        || {
            let ended = flood
                .iter()
                .filter(|s| match s.try_read(&mut [0u8; 256]) {
                    Ok(n) => n == 0,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                })
                .count();
            std::future::ready(ended >= 300 - 256)
        },
    )
    .await;
    let during = support::daemon::fd_count(pid);
    assert!(
        during - before <= 257,
        "{before} fds before, {during} with 300 admin connections (256 and one waiting for a place)"
    );
    drop(flood);
    let _kept = client::kept_alive(baton.admin, "/healthz", 256).await;
    let probe = tokio::time::timeout(
        Duration::from_secs(5),
        client::call(baton.admin, "GET", "/readyz", None),
    )
    .await
    .expect("a probe answered while 256 kept-alive clients hold every place")
    .expect("readyz");
    assert_eq!(probe.status, 200);
}

/// An admin client that pipelines `/metrics` and never reads is cut off
/// once its responses have stopped moving for 10 s, rather than pinning
/// its connection (an fd, a task, its buffers) for the process's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_client_that_never_reads_is_cut_off() {
    let (_backend, baton, pid, before) = counting_fds().await;
    let mut stalled = tokio::net::TcpStream::connect(baton.admin)
        .await
        .expect("connect");
    let requests = b"GET /metrics HTTP/1.1\r\nhost: admin\r\n\r\n".repeat(4000);
    // As much as it takes before its own buffers fill (it is not reading).
    let _ = tokio::time::timeout(Duration::from_secs(2), stalled.write_all(&requests)).await;
    let mut first = [0u8; 5];
    stalled.read_exact(&mut first).await.expect("answering");
    assert_eq!(&first, b"HTTP/");
    // 10 s once the kernel stops taking the trickle it still takes from a
    // full receive buffer; within 30 s here every time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while support::daemon::fd_count(pid) > before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled admin connection is still open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    serving(&baton).await;
    drop(stalled);
}

/// A backend connect that fails because baton has no fd left is baton's
/// own shortage: the client gets a 503 (`RC`), and the backend is not
/// marked down for it, which `fall = 1` would do at one blamed failure;
/// the access log says `RC` (baton's shortage at the connect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_connect_without_a_free_fd_is_a_503_not_the_backends_fault() {
    let backend = HttpBackend::start("a").await;
    let checks = "health = { kind = \"http\", path = \"/\", interval = \"60s\", timeout = \"1s\", rise = 1, fall = 1 }";
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let logged = format!(
        "access_log = {{ path = \"{}\", format = \"json\" }}",
        log.display()
    );
    let baton = Baton::start(
        Spec::new()
            .top("workers = 1")
            .listener("web", "http", "app", &logged)
            .pool_with("app", checks, &[(backend.addr, 1)]),
    )
    .await;
    let (pid, web) = (baton.first_pid, baton.addr("web"));
    let settled = support::daemon::settled_fd_count(pid).await;
    let mut s = tokio::net::TcpStream::connect(web).await.expect("connect");
    support::eventually("baton accepted the client", || async {
        support::daemon::fd_count(pid) > settled
    })
    .await;
    let held = NoFreeFd::hold(pid);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let reply = client::read_until_closed(&mut s).await;
    drop(held);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(baton.log().contains("baton ran short"), "{}", baton.log());
    assert_eq!(client::backend_state(baton.admin, "app-0").await, "up");
    let after = client::get(web, "/after").await.expect("after");
    assert_eq!(after.status, 200);
    support::eventually("both requests logged", || async {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 2)
    })
    .await;
    let text = std::fs::read_to_string(&log).expect("access log");
    let short = text.lines().next().expect("the first line");
    assert!(
        short.contains("\"status\":503")
            && short.contains("\"termination\":\"RC\"")
            && short.contains("\"backend\":\"app-0\""),
        "{short}"
    );
}

/// A connect to an IPv4 backend that finds no local port left (every port
/// of `ip_local_port_range` toward it taken) is baton's shortage too: a
/// 503, counted, and the backend stays up, which `fall = 1` would end at
/// one blamed failure (churn through a `send_proxy` pool filling the range
/// marked a busy pool's backends down together). In a network namespace
/// of the test's own, whose port range it narrows to two ports once baton
/// serves.
#[test]
fn a_backend_connect_with_no_local_port_left_is_a_503_not_the_backends_fault() {
    if !support::possible_or_skipped(&["unshare", "-n", "true"], "a network namespace") {
        return;
    }
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace");
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip");
        assert!(up.success(), "ip link set lo up");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(no_local_port_left());
    })
    .join()
    .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked));
}

async fn no_local_port_left() {
    const RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
    let backend = HttpBackend::start("a").await;
    let checks =
        "health = { kind = \"tcp\", interval = \"60s\", timeout = \"1s\", rise = 1, fall = 1 }";
    let baton = Baton::spawn_under(
        Spec::new().top("workers = 1").http("web", "app").pool_with(
            "app",
            checks,
            &[(backend.addr, 1)],
        ),
        &[],
        &[],
    );
    baton.wait_ready().await;
    let wide = std::fs::read_to_string(RANGE).expect("port range");
    std::fs::write(RANGE, "40000 40001").expect("narrow the port range");
    // Clients from ports of their own, outside the range; each holds a
    // backend connection (and its port) until released.
    let mut held = Vec::new();
    let mut refused = None;
    for port in 50_000..50_010 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(([127, 0, 0, 1], port).into())
            .expect("bind a client port");
        let mut s = socket.connect(baton.addr("web")).await.expect("connect");
        s.write_all(b"GET /gated HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("request");
        let before = backend.held();
        let reached = async {
            while backend.held() <= before {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            () = reached => {}
            reply = client::read_until_closed(&mut s) => {
                refused = Some(reply);
                break;
            }
        }
        held.push(s);
    }
    std::fs::write(RANGE, wide).expect("widen the port range");
    let reply = refused.expect("a connect that found no port left");
    assert!(
        reply.starts_with("HTTP/1.1 503"),
        "{reply}\n{}",
        baton.log()
    );
    assert!(baton.log().contains("baton ran short"), "{}", baton.log());
    assert_eq!(client::backend_state(baton.admin, "app-0").await, "up");
    let metrics = client::metrics(baton.admin).await;
    let counted = client::series(&metrics, "baton_shortages_total{at=\"connect\"}");
    assert!(counted.is_some_and(|n| n >= 1.0), "{metrics}");
    backend.release();
    for mut s in held {
        let reply = client::read_until_closed(&mut s).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
}

/// Baton's own shortages are counted where they happened
/// (`baton_shortages_total{at}`), beside the throttled log lines: a
/// backend connect and an accept that met a full fd table, on `/metrics`
/// once fds free up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shortages_are_counted_where_they_happen() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(one_worker(&backend)).await;
    let (pid, web) = (baton.first_pid, baton.addr("web"));
    let settled = support::daemon::settled_fd_count(pid).await;
    let mut first = tokio::net::TcpStream::connect(web).await.expect("connect");
    support::eventually("baton accepted the client", || async {
        support::daemon::fd_count(pid) > settled
    })
    .await;
    // Both series there from the start, at 0 (an alert on them needs them).
    let metrics = client::metrics(baton.admin).await;
    for at in ["accept", "connect"] {
        let series = format!("baton_shortages_total{{at=\"{at}\"}}");
        assert_eq!(client::series(&metrics, &series), Some(0.0), "{metrics}");
    }
    let request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let held = NoFreeFd::hold(pid);
    first.write_all(request).await.expect("request");
    let reply = client::read_until_closed(&mut first).await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    let mut second = tokio::net::TcpStream::connect(web).await.expect("connect");
    second.write_all(request).await.expect("request");
    support::eventually("an accept met the shortage", || async {
        baton.log().contains("accept failed")
    })
    .await;
    drop(held);
    let reply = client::read_until_closed(&mut second).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let metrics = client::metrics(baton.admin).await;
    for at in ["accept", "connect"] {
        let counted = client::series(&metrics, &format!("baton_shortages_total{{at=\"{at}\"}}"));
        assert!(
            counted.is_some_and(|n| n >= 1.0),
            "at {at}: {counted:?}\n{metrics}"
        );
    }
}

/// A scrape on a kept connection (as Prometheus keeps one) while the fd
/// table is full: the process figures read `/proc/self` with an fd of
/// their own, and none free read as 0 open fds, no memory and no CPU time
/// (a falling CPU figure broke `rate()` over it). Now the last figures,
/// the limit the table is at, and `getrusage`'s CPU time, which needs no
/// fd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_at_a_full_fd_table_keeps_the_process_figures() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(one_worker(&backend)).await;
    let mut scraper = client::connect(baton.admin).await.expect("connect");
    let before = scrape(&mut scraper, baton.admin).await;
    let held = NoFreeFd::hold(baton.first_pid);
    let during = scrape(&mut scraper, baton.admin).await;
    drop(held);
    // CPU time too: a daemon serving has used some (getrusage counts in
    // microseconds), so a figure fallen to 0 with no fd free shows.
    assert!(before.iter().all(|f| *f > 0.0), "{before:?}");
    let [fds, resident, cpu] = during;
    assert!(
        fds >= before[0] && resident > 0.0 && cpu >= before[2],
        "{during:?} with no fd free, {before:?} before"
    );
}

/// The serving process's open fds, resident bytes and CPU seconds, from
/// a scrape on `scraper` (-1 for a series missing).
async fn scrape(
    scraper: &mut hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    admin: std::net::SocketAddr,
) -> [f64; 3] {
    let answer = client::send(scraper, admin, "/metrics")
        .await
        .expect("scrape");
    ["open_fds", "resident_memory_bytes", "cpu_seconds"].map(|name| {
        let series = format!("baton_process_{name}{{state=\"serving\"}}");
        client::series(&answer.body, &series).unwrap_or(-1.0)
    })
}

/// A health check baton cannot make for want of an fd says nothing of the
/// backend, and is said once a second at most: the backend keeps its
/// state (with `fall = 1` and `rise = 50`, one blamed check would hold it
/// down for five seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_without_a_free_fd_leaves_the_backend_up() {
    let backend = HttpBackend::start("a").await;
    let checks = "health = { kind = \"http\", path = \"/\", interval = \"100ms\", timeout = \"5s\", rise = 50, fall = 1 }";
    let baton = Baton::start(Spec::new().top("workers = 1").http("web", "app").pool_with(
        "app",
        checks,
        &[(backend.addr, 1)],
    ))
    .await;
    let held = NoFreeFd::hold(baton.first_pid);
    let began = std::time::Instant::now();
    support::eventually("a check meets the shortage", || async {
        baton.log().contains("health check not made")
    })
    .await;
    // Ten checks a second meet it: said once a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = baton.log();
    let (lines, most) = (
        log.matches("health check not made").count(),
        began.elapsed().as_secs() as usize + 1,
    );
    drop(held);
    assert!(lines <= most, "{lines} lines, at most {most}:\n{log}");
    assert_eq!(client::backend_state(baton.admin, "app-0").await, "up");
    let answer = client::get(baton.addr("web"), "/after")
        .await
        .expect("after");
    assert_eq!(answer.status, 200);
}

/// `Max open files` of `/proc/PID/limits`: (soft, hard).
fn open_files_limits(pid: &str) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open files line");
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

/// A shell's soft open-file limit (often 1024) would refuse clients with
/// EMFILE long before the host's: baton raises it to the hard limit as it
/// starts, as HAProxy does, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_to_the_hard_one() {
    let backend = HttpBackend::start("a").await;
    let (_, hard) = open_files_limits("self");
    let lowered = format!("--nofile=256:{hard}");
    let baton = Baton::spawn_under(
        Spec::new().http("web", "app").pool("app", &[backend.addr]),
        &[],
        &["prlimit", &lowered],
    );
    baton.wait_ready().await;
    let (soft, its_hard) = open_files_limits(&baton.first_pid.to_string());
    assert_eq!(
        (soft.as_str(), its_hard.as_str()),
        (hard.as_str(), hard.as_str())
    );
    assert!(
        baton.log().contains("raised the open-file limit"),
        "{}",
        baton.log()
    );
}

/// A generation grows its table of open files as it starts, to what its
/// listeners may hold (a client's fd and a backend's for each of
/// `max_connections`): grown by doubling under a burst of connections, each
/// step would stall its worker for an RCU grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fd_table_is_grown_as_a_generation_starts() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(
        Spec::new()
            .listener("web", "http", "app", "max_connections = 3000")
            .pool("app", &[backend.addr]),
    )
    .await;
    let pid = baton.first_pid.to_string();
    let (soft, _) = open_files_limits(&pid);
    let soft: u64 = soft.parse().unwrap_or(u64::MAX);
    let size = support::daemon::fd_table_size(baton.first_pid);
    let asked = 2 * 3000 + 1024;
    assert!(size >= soft.min(asked), "FDSize {size}, soft limit {soft}");
    let highest = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .expect("some fd");
    assert!(
        highest < soft.min(asked) - 1,
        "the fd that grew it is given back: fd {highest} open"
    );
}

/// A journal that stalls (its stream socket full: a slow disk, journald
/// busy) stalls no request: a line logged meanwhile waits, and the worker
/// that logged it goes on serving (a plain write blocked it, and every
/// connection on it); the line reaches the journal once it reads again,
/// after what was there before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_journal_stalls_no_request() {
    use std::os::fd::AsRawFd;
    let backend = HttpBackend::start("a").await;
    let (stderr, journal) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    // The same socket as baton's stderr: what it sends fills the same room.
    let filler = stderr.try_clone().expect("dup");
    let baton = Baton::spawn_logging_to(one_worker(&backend), stderr.into());
    // Its start-up lines wait in the socket, unread, as the filler will.
    baton.wait_ready().await;
    let mut filled = 0;
    let flags = nix::sys::socket::MsgFlags::MSG_DONTWAIT;
    while let Ok(n) = nix::sys::socket::send(filler.as_raw_fd(), &[b'.'; 4096], flags) {
        filled += n;
        assert!(filled < 64 << 20, "the socket takes no more at some point");
    }
    journal
        .set_nonblocking(true)
        .expect("the test's own end, not baton's");
    logs_into_a_full_stderr(&baton, filled, journal).await;
}

/// The same through a pipe (a log collector's, a container runtime's,
/// `baton run 2>&1 | logger`): a full pipe stalls no request either (a
/// plain write blocked on it), and the held line comes after what the
/// pipe held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_log_pipe_stalls_no_request() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let backend = HttpBackend::start("a").await;
    // Close-on-exec, as the test's other fds: baton's stderr is a copy
    // made for it, and another test's child keeps none of these.
    let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    // The same pipe as baton's stderr, opened anew: O_NONBLOCK on this
    // file description alone (a dup shares baton's, which a plain write
    // then would not wait on either).
    let mut filler = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", writer.as_raw_fd()))
        .expect("the pipe's write end, opened again");
    let baton = Baton::spawn_logging_to(one_worker(&backend), writer);
    baton.wait_ready().await;
    let mut filled = 0;
    while let Ok(n) = filler.write(&[b'.'; 4096]) {
        filled += n;
        assert!(filled < 64 << 20, "the pipe takes no more at some point");
    }
    assert!(filled > 0, "the pipe filled");
    let flags = nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&reader, nix::fcntl::FcntlArg::F_SETFL(flags)).expect("the test's own end");
    logs_into_a_full_stderr(&baton, filled, std::fs::File::from(reader)).await;
}

/// A terminal whose output is stopped (Ctrl-S; `tcflow(TCOOFF)`) stalls
/// no request: a write to it waits until output resumes, and a worker
/// that wrote its line so stopped serving every connection it held. The
/// line comes once output resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_terminal_stalls_no_request() {
    use nix::sys::termios::{tcflow, FlowArg};
    let backend = HttpBackend::start("a").await;
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let terminal = pty.slave.try_clone().expect("dup");
    let baton = Baton::spawn_logging_to(one_worker(&backend), pty.slave);
    let flags = nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_SETFL(flags))
        .expect("the test's own end");
    let screen = std::fs::File::from(pty.master);
    baton.wait_ready().await;
    tcflow(&terminal, FlowArg::TCOOFF).expect("Ctrl-S");
    logs_and_serves_on(&baton).await;
    tcflow(&terminal, FlowArg::TCOON).expect("Ctrl-Q");
    reads_the_line_after(screen, 0).await;
}

/// A request head refused (a line logged) while `baton`'s stderr holds
/// `filled` bytes no one read: the worker that logged serves on, and
/// what `stderr` (its other end, non-blocking) reads has the line after
/// those bytes.
async fn logs_into_a_full_stderr(
    baton: &Baton,
    filled: usize,
    stderr: impl std::io::Read + Send + 'static,
) {
    logs_and_serves_on(baton).await;
    reads_the_line_after(stderr, filled).await;
}

/// A request head refused (a line logged), then a request served by the
/// same worker (`baton` has one).
async fn logs_and_serves_on(baton: &Baton) {
    let web = baton.addr("web");
    let mut bad = tokio::net::TcpStream::connect(web).await.expect("connect");
    bad.write_all(b"NOT HTTP AT ALL\r\n\r\n")
        .await
        .expect("send");
    let refused = client::read_until_closed(&mut bad).await;
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    let served = tokio::time::timeout(Duration::from_secs(5), client::get(web, "/after")).await;
    assert!(
        served.is_ok_and(|a| a.is_ok_and(|a| a.status == 200)),
        "the worker that logged serves on"
    );
}

/// What `stderr` reads has the line about the refused head, after the
/// `filled` bytes that were there before it.
async fn reads_the_line_after(stderr: impl std::io::Read + Send + 'static, filled: usize) {
    let read = tokio::task::spawn_blocking(move || read_for(stderr, support::TIMEOUT))
        .await
        .expect("reader");
    let text = String::from_utf8_lossy(&read);
    let line = text.find("refused a request head");
    assert!(
        line.is_some_and(|at| at >= filled),
        "the held line comes after the {filled} bytes before it: {:?}",
        text.trim_start_matches('.')
    );
}

/// What `journal` reads within `within`, up to the line about a refused
/// head.
fn read_for(mut journal: impl std::io::Read, within: Duration) -> Vec<u8> {
    let until = std::time::Instant::now() + within;
    let mut read = Vec::new();
    let mut buf = [0u8; 65536];
    while std::time::Instant::now() < until
        && !String::from_utf8_lossy(&read).contains("refused a request head")
    {
        match journal.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => read.extend_from_slice(&buf[..n]),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    read
}

/// A client that sends garbage as fast as it can connect does not write a
/// log line each time: ten lines a second at most, and once the second is
/// over a line of its own says how many were held back, so none goes
/// uncounted: for 30 bad heads, lines and held-back counts add up to
/// exactly 30, with fewer than 30 lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_requests_is_logged_ten_lines_a_second_and_counted() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    // All at once: well over ten within a second, however loaded the
    // machine.
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..30 {
        let web = baton.addr("web");
        flood.spawn(async move {
            let mut s = tokio::net::TcpStream::connect(web).await.expect("connect");
            s.write_all(b"NOT HTTP AT ALL\r\n\r\n").await.expect("send");
            client::read_until_closed(&mut s).await
        });
    }
    while let Some(answer) = flood.join_next().await {
        let answer = answer.expect("a client");
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    let counted = || {
        let log = baton.log();
        let lines = log
            .lines()
            .filter(|l| l.contains("refused a request head"))
            .count() as u64;
        let held_back: u64 = log
            .lines()
            .filter_map(|l| l.split("held_back=").nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        (lines, held_back)
    };
    support::eventually("every refusal logged or counted", || async {
        let (lines, held_back) = counted();
        lines + held_back >= 30
    })
    .await;
    let (lines, held_back) = counted();
    assert!(lines < 30, "every fault logged: {lines}");
    assert_eq!(lines + held_back, 30, "{}", baton.log());
    serving(&baton).await;
}

/// An admin request head is held to 16 KiB: one of 20 KiB is refused
/// (431), where hyper's default let each of the 256 admin connections
/// buffer about 400 KiB of a head that never ends. The same probe, short,
/// is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_request_head_is_held_to_16_kib() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let long = format!(
        "GET /healthz HTTP/1.1\r\nhost: admin\r\nx-filler: {}\r\n\r\n",
        "a".repeat(20 * 1024)
    );
    let mut s = tokio::net::TcpStream::connect(baton.admin)
        .await
        .expect("connect");
    // The head may be refused before all of it is written.
    let _ = s.write_all(long.as_bytes()).await;
    let answer = client::read_until_closed(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}");
    assert_eq!(
        client::get(baton.admin, "/healthz")
            .await
            .expect("healthz")
            .status,
        200
    );
}

/// A SIGHUP and then a SIGTERM that come during a first start are a stop,
/// not a reload begun and then abandoned: commands are heard in the order
/// they came, and the reload spawned a new generation into the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_then_a_stop_during_a_first_start_is_a_stop() {
    let (_backend, baton, config) = held_at_start().await;
    let pid = baton.first_pid;
    signal(pid, Signal::SIGHUP);
    signal(pid, Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    support::daemon::feed_fifo(&baton.config, &config).await;
    assert_eq!(
        support::daemon::wait_exit(pid).await,
        Some(0),
        "{}",
        baton.log()
    );
    assert!(
        !baton.log().contains("reload: starting the next generation"),
        "{}",
        baton.log()
    );
}

/// A socket passed as systemd passes one, with names that do not match
/// the sockets (a hand-set environment: two names for one), is ignored
/// with a warning that says why, and closed: it stayed open in baton,
/// unowned, listening with no one to accept what it took. baton binds
/// its own and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_socket_whose_names_do_not_match_is_closed() {
    a_wrongly_passed_socket_is_closed(
        "LISTEN_FDS=1 LISTEN_FDNAMES=web:extra",
        "LISTEN_FDNAMES has 2 names for the 1 sockets of LISTEN_FDS",
    )
    .await;
}

/// The same where `LISTEN_FDS` counts more sockets than were passed: the
/// one passed is closed, and the warning names the fd missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_socket_counted_with_others_not_passed_is_closed() {
    a_wrongly_passed_socket_is_closed(
        "LISTEN_FDS=2 LISTEN_FDNAMES=web:extra",
        "LISTEN_FDS passes 2 sockets from fd 3, but fd 4 is not open",
    )
    .await;
}

/// Passes baton a listening socket at fd 3 (and nothing at fd 4) with
/// `LISTEN_PID` its own and `variables`, and asserts the warning `said`,
/// the socket closed in baton, and the config's listener serving.
async fn a_wrongly_passed_socket_is_closed(variables: &str, said: &str) {
    use std::os::fd::{AsRawFd, FromRawFd};
    let passed = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let link = |pid: &str, fd: &str| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok();
    let socket = link("self", &passed.as_raw_fd().to_string()).expect("the socket's inode");
    // Inheritable, and above 3 (`3<&3 3<&-` would close it).
    let inherited = nix::fcntl::fcntl(&passed, nix::fcntl::FcntlArg::F_DUPFD(10)).expect("dup");
    // SAFETY: just made by F_DUPFD, owned only here.
    let inherited = unsafe { std::os::fd::OwnedFd::from_raw_fd(inherited) };
    drop(passed);
    let backend = HttpBackend::start("a").await;
    let script = format!(
        "export LISTEN_PID=$$ {variables}; exec \"$@\" 3<&{0} {0}<&- 4<&-",
        inherited.as_raw_fd()
    );
    let baton = Baton::spawn_under(one_worker(&backend), &[], &["bash", "-c", &script, "bash"]);
    drop(inherited);
    baton.wait_ready().await;
    assert!(baton.log().contains(said), "{}", baton.log());
    let pid = baton.first_pid.to_string();
    let kept: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("baton's fds")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|fd| link(&pid, fd).as_ref() == Some(&socket))
        .collect();
    assert!(
        kept.is_empty(),
        "the passed socket is still open: fd {kept:?}"
    );
    let answer = client::get(baton.addr("web"), "/").await.expect("served");
    assert_eq!(answer.status, 200);
}

/// With its fd table full (clients holding every fd it may open), baton
/// still answers `/healthz`, probe after probe: an fd held in reserve
/// takes each (an orchestrator whose liveness probe goes unanswered
/// restarts the process, every connection lost). And `baton reload` is
/// answered, with why it failed, not left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_fd_table_still_answers_liveness_probes_and_reloads() {
    let backend = HttpBackend::start("a").await;
    // Clients that send nothing keep their fds for the test's length.
    let spec = Spec::new()
        .top("workers = 1")
        .listener("web", "http", "app", "header_timeout = \"60s\"")
        .pool("app", &[backend.addr]);
    let baton = Baton::spawn_under(spec, &[], &["prlimit", "--nofile=128"]);
    baton.wait_ready().await;
    let web = baton.addr("web");
    let mut held = Vec::new();
    for _ in 0..160 {
        held.push(tokio::net::TcpStream::connect(web).await.expect("connect"));
    }
    support::eventually("baton's fd table full", || async {
        baton.log().contains("accept failed; backing off")
    })
    .await;
    // First, while the admin surface holds its spare and no fd comes
    // free: the control socket's own spare takes it.
    let reload = tokio::time::timeout(Duration::from_secs(5), baton.reload())
        .await
        .expect("the reload answered at once");
    assert_ne!(reload.code, 0, "no fds for a new generation: {reload:?}");
    assert!(
        reload.stderr.to_lowercase().contains("too many open files"),
        "{reload:?}"
    );
    // Apart, as an orchestrator's probes come: the reserve is held again
    // in between, not left given up to the data plane's next accept.
    for probe in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let answer =
            tokio::time::timeout(Duration::from_secs(5), client::get(baton.admin, "/healthz"))
                .await;
        assert!(
            answer.is_ok_and(|a| a.is_ok_and(|a| a.status == 200)),
            "probe {probe} unanswered"
        );
    }
    for reload in 0..2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let answer = tokio::time::timeout(Duration::from_secs(5), baton.reload())
            .await
            .unwrap_or_else(|_| panic!("reload {reload} not answered within 5 s"));
        assert_ne!(answer.code, 0, "no fds for a new generation: {answer:?}");
        assert!(
            answer.stderr.to_lowercase().contains("too many open files"),
            "{answer:?}"
        );
    }
    drop(held);
}

/// A cgroup of the pids controller made for one test (v1's hierarchy or
/// v2's, whichever this host has), removed when dropped; `None` where
/// there is none to make one in.
struct PidsCgroup(std::path::PathBuf);

impl PidsCgroup {
    fn new(name: &str) -> Option<PidsCgroup> {
        let v2_has_pids = std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "pids"));
        let parent = match std::path::Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists() {
            true => "/sys/fs/cgroup/pids",
            false if v2_has_pids => "/sys/fs/cgroup",
            false => return None,
        };
        let dir = std::path::Path::new(parent).join(name);
        std::fs::create_dir(&dir).ok()?;
        Some(PidsCgroup(dir))
    }

    /// Moves `pid` in and lets it make no more threads or processes.
    fn hold_at_its_count(&self, pid: u32) {
        let write = |file: &str, value: &str| {
            std::fs::write(self.0.join(file), value)
                .unwrap_or_else(|e| panic!("{file} of {}: {e}", self.0.display()));
        };
        write("cgroup.procs", &pid.to_string());
        let current = std::fs::read_to_string(self.0.join("pids.current")).expect("pids.current");
        write("pids.max", current.trim());
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// At its limit of threads (a cgroup's `pids.max` reached: a unit's
/// `TasksMax`), baton needs no new one for a scrape or a stop: `/metrics`
/// answers, a reload fails saying why, and a stop writes out its access
/// log and exits 0 (tokio's
/// blocking pool panicked when it could not make one: the scrape's reply
/// was empty, every later scrape waited for good, and the stop exited 101
/// with its last log lines lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_thread_limit_baton_still_scrapes_and_stops_cleanly() {
    let name = format!("baton-test-{}", std::process::id());
    let Some(cgroup) = PidsCgroup::new(&name) else {
        support::skipped_on_this_host("a pids cgroup of its own (root, a pids controller)");
        return;
    };
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(one_worker(&backend)).await;
    let pid = baton.first_pid;
    cgroup.hold_at_its_count(pid);
    for _ in 0..2 {
        let scrape = tokio::time::timeout(support::TIMEOUT, client::get(baton.admin, "/metrics"))
            .await
            .expect("scraped in time")
            .expect("a scrape");
        assert_eq!(scrape.status, 200);
    }
    let reload = baton.reload().await;
    assert_ne!(reload.code, 0, "no process to be had: {reload:?}");
    assert!(
        reload.stderr.contains("no thread to start it from"),
        "{reload:?}"
    );
    signal(pid, Signal::SIGTERM);
    assert_eq!(wait_exit(pid).await, Some(0), "{}", baton.log());
    drop(cgroup);
}
