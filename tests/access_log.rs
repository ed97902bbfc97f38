//! The access log against the real binary: one well-formed line per
//! request across 20 reloads under load and a logrotate-style rename with
//! SIGUSR1 in the middle; the request id the backend got is the one logged
//! (and a trusted client's own is kept); termination states say who ended
//! an exchange; TCP listeners log a line per connection; combined format.

mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::backend::{HttpBackend, TcpEcho};
use support::client;
use support::daemon::{processes_for, signal, wait_exit, Baton, Spec};
use support::h2_raw;
use support::load::{Load, Targets};

/// Every line of the files, each parsed as JSON (a line that is not is a
/// failure naming it).
fn json_lines(files: &[PathBuf]) -> Vec<Value> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines() {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line:?}", file.display()));
            out.push(value);
        }
    }
    out
}

fn log_key(path: &Path, format: &str) -> String {
    format!(
        "access_log = {{ path = \"{}\", format = \"{format}\" }}",
        path.display()
    )
}

/// Backend "a" behind listener "web", which logs in `format` to `log`.
struct Logged {
    dir: tempfile::TempDir,
    log: PathBuf,
    backend: HttpBackend,
    baton: Baton,
}

async fn logging(format: &str) -> Logged {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", &log_key(&log, format))
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    Logged {
        dir,
        log,
        backend,
        baton,
    }
}

async fn stop_and_wait(baton: &Baton) {
    for pid in processes_for(&baton.config) {
        signal(pid, Signal::SIGTERM);
        assert_eq!(wait_exit(pid).await, Some(0), "a clean stop");
    }
}

/// A listener `web` before `backend`, its JSON access lines to `path`.
fn logging_to(path: &str, backend: &HttpBackend) -> Spec {
    let keys = format!("access_log = {{ path = \"{path}\", format = \"json\" }}");
    Spec::new()
        .listener("web", "http", "app", &keys)
        .pool("app", &[backend.addr])
}

/// `path = "stdout"` writes the lines to the process's standard output (a
/// container's log, journald's stream), one a request, the generation a
/// reload starts too (it inherits the same stdout); baton's own log goes
/// to stderr, so every line of stdout is an access line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_lines_go_to_stdout_when_it_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("stdout");
    let backend = HttpBackend::start("a").await;
    let spec = logging_to("stdout", &backend);
    let into_file = format!("exec \"$0\" \"$@\" > {}", out.display());
    let baton = Baton::spawn_under(spec, &[], &["sh", "-c", &into_file]);
    baton.wait_ready().await;
    let web = baton.addr("web");
    assert_eq!(client::get(web, "/before").await.expect("get").status, 200);
    baton.reload_ok().await;
    assert_eq!(client::get(web, "/after").await.expect("get").status, 200);
    stop_and_wait(&baton).await;
    let lines = json_lines(&[out]);
    let statuses: Vec<&Value> = lines.iter().map(|l| &l["status"]).collect();
    assert_eq!(statuses, [200, 200], "{lines:?}");
}

/// `path = "/dev/stdout"`, as containers' configs write it (or
/// `/dev/fd/1`), is standard output too: opened as a file, it failed
/// where stdout is a socket (under systemd, journald's stream; here a TCP
/// one, bash's `/dev/tcp`), with ENXIO, and baton did not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_stdout_is_standard_output_even_as_a_socket() {
    for path in ["/dev/stdout", "/dev/fd/1"] {
        logs_to_standard_output_as_a_socket(path).await;
    }
}

async fn logs_to_standard_output_as_a_socket(path: &str) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let backend = HttpBackend::start("a").await;
    let spec = logging_to(path, &backend);
    let into_socket = format!("exec \"$0\" \"$@\" > /dev/tcp/127.0.0.1/{port}");
    let baton = Baton::spawn_under(spec, &[], &["bash", "-c", &into_socket]);
    let (mut stdout, _) = tokio::time::timeout(support::TIMEOUT, listener.accept())
        .await
        .expect("stdout connected in time")
        .expect("accept");
    baton.wait_ready().await;
    let answer = client::get(baton.addr("web"), "/one").await.expect("get");
    assert_eq!(answer.status, 200);
    stop_and_wait(&baton).await;
    let mut text = String::new();
    tokio::time::timeout(support::TIMEOUT, stdout.read_to_string(&mut text))
        .await
        .expect("stdout closed in time")
        .expect("read");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert_eq!(lines.len(), 1, "{path}: {text}");
    assert_eq!(lines[0]["target"], "/one", "{path}: {text}");
}

/// An HTTP/1 upload that stops once the response has begun is cut at
/// `idle_timeout` (no 408 of baton's own written into the response under
/// way), logged as the client's timeout in the data's phase, `cD`, as on
/// h2 (it said `CD`, a client that went away), and never blamed on the
/// backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_stops_after_the_response_began_is_the_clients_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    // It answers the head at once and the rest of the body only once the
    // upload is whole, which it never is.
    let backend = support::raw::answers_before_the_body().await;
    let keys = format!("idle_timeout = \"1s\"\n{}", log_key(&log, "json"));
    let spec = Spec::new()
        .listener("web", "http", "app", &keys)
        .pool("app", &[backend]);
    let baton = Baton::start(spec).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"POST /early HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nten bytes.")
        .await
        .expect("write");
    let (answer, _) = support::read_to_the_end(&mut s).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains("408"), "{answer}");
    let metrics = client::metrics(baton.admin).await;
    for kind in ["timeout", "protocol"] {
        let none = format!(
            "baton_upstream_errors_total{{pool=\"app\",backend=\"app-0\",kind=\"{kind}\"}} 0"
        );
        assert!(metrics.contains(&none), "{metrics}");
    }
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    let terminations: Vec<&Value> = lines.iter().map(|l| &l["termination"]).collect();
    assert_eq!(terminations, ["cD"], "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_line_per_request_across_reloads_and_a_rotation() {
    let Logged {
        dir,
        log,
        backend,
        baton,
    } = logging("json").await;
    let load = Load::start(Targets {
        http: Some(baton.addr("web")),
        tcp: None,
        names: vec!["a"],
    });
    load.progress(50).await;
    let rotated = dir.path().join("access.log.1");
    for i in 0..20 {
        baton.reload_ok().await;
        load.progress(20).await;
        if i == 9 {
            // logrotate: rename, then SIGUSR1 to every generation.
            std::fs::rename(&log, &rotated).expect("rename");
            for pid in processes_for(&baton.config) {
                signal(pid, Signal::SIGUSR1);
            }
            load.progress(20).await;
        }
    }
    let report = load.stop().await;
    report.assert_clean();
    baton.settled().await;
    stop_and_wait(&baton).await;

    let lines = json_lines(&[rotated.clone(), log.clone()]);
    assert!(
        std::fs::metadata(&rotated).expect("rotated").len() > 0
            && std::fs::metadata(&log).expect("reopened").len() > 0,
        "lines before and after the rotation"
    );
    // Every request that reached baton left exactly one line (each was
    // served by the one backend); those the load counted as answered
    // completed, and a loop stopped mid-request left at most one other.
    assert_eq!(lines.len() as u64, backend.hits(), "one line per request");
    let completed = lines.iter().filter(|l| l["termination"] == "--").count() as u64;
    assert!(completed >= report.ok, "{completed} < {}", report.ok);
    assert!(
        lines.len() as u64 - completed <= 5,
        "only stopped loops left others"
    );
    let ids: HashSet<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().expect("request_id"))
        .collect();
    assert_eq!(ids.len(), lines.len(), "request ids are unique");
    let generations: HashSet<u64> = lines
        .iter()
        .map(|l| l["generation"].as_u64().expect("generation"))
        .collect();
    assert!(
        generations.len() >= 15,
        "lines from many generations: {generations:?}"
    );
    for l in &lines {
        for key in [
            "time", "client", "listener", "pool", "method", "target", "protocol",
        ] {
            assert!(l[key].is_string(), "{key} in {l}");
        }
        assert_eq!(l["listener"], "web");
        assert!(l["total_ms"].is_number(), "{l}");
        if l["termination"] == "--" {
            assert_eq!(l["status"], 200, "{l}");
            assert_eq!(l["backend"], "app-0", "{l}");
            assert!(l["bytes_out"].as_u64().is_some_and(|b| b > 0), "{l}");
        }
    }
}

/// The `X-Request-Id` the backend received, from its `/headers` echo.
fn sent_id(echo: &str) -> String {
    echo.lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap_or_else(|| panic!("no x-request-id in {echo}"))
        .to_string()
}

async fn raw(addr: SocketAddr, request: impl AsRef<[u8]>) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_ref()).await.expect("write");
    client::read_until_closed(&mut s).await
}

/// An upload whose backend connection, kept from the request before,
/// closes under it without a byte of answer is `SH`, as every failure on
/// a kept connection before its answer (the race with the backend's own
/// keep-alive close), not `SR`: that one says the backend would not take
/// the request, which only a new connection shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_on_a_kept_backend_connection_is_sh_not_sr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = support::raw::closes_under_its_second_head().await;
    let spec = Spec::new()
        .listener("web", "http", "app", &log_key(&log, "json"))
        .pool("app", &[backend]);
    let baton = Baton::start(spec).await;
    // One client connection for both: its worker's kept backend
    // connection takes the second.
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .expect("write");
    let mut first = Vec::new();
    while !first.ends_with(b"first") {
        let mut chunk = [0u8; 1024];
        match tokio::time::timeout(support::TIMEOUT, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => first.extend_from_slice(&chunk[..n]),
            other => panic!("the first answer: {other:?} after {first:?}"),
        }
    }
    s.write_all(b"POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhalf.")
        .await
        .expect("write");
    let (cut, _) = support::read_to_the_end(&mut s).await;
    let cut = String::from_utf8_lossy(&cut);
    assert!(cut.starts_with("HTTP/1.1 502"), "{cut}");
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    let terminations: Vec<&Value> = lines.iter().map(|l| &l["termination"]).collect();
    assert_eq!(terminations, ["--", "SH"], "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_gets_the_request_id_that_is_logged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener("web", "http", "app", &log_key(&log, "json"))
        .listener(
            "trusting",
            "http",
            "app",
            &format!("forwarded = \"append\"\n{}", log_key(&log, "json")),
        )
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let ask = "GET /headers HTTP/1.1\r\nHost: a\r\nX-Request-Id: from-the-client\r\nConnection: close\r\n\r\n";
    let replaced = sent_id(&raw(baton.addr("web"), ask).await);
    assert_ne!(
        replaced, "from-the-client",
        "a listener that trusts nothing makes its own"
    );
    let kept = sent_id(&raw(baton.addr("trusting"), ask).await);
    assert_eq!(kept, "from-the-client");
    // An h2 stream: its line is written once its response body is done.
    let web = baton.addr("web");
    let tcp = TcpStream::connect(web).await.expect("connect");
    let h2 = client::h2_get_over(tcp, &web.to_string(), "/headers")
        .await
        .expect("h2c");
    let over_h2 = sent_id(&h2.body);
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    let logged: Vec<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().expect("id"))
        .collect();
    assert_eq!(
        logged,
        [replaced.as_str(), "from-the-client", over_h2.as_str()]
    );
    for line in &lines {
        assert_eq!(
            line["backend"], "app-0",
            "each line names its backend: {line}"
        );
    }
    let h2_line = &lines[2];
    assert_eq!(h2_line["protocol"], "HTTP/2.0");
    assert_eq!(h2_line["status"], 200);
    assert_eq!(h2_line["termination"], "--");
    assert_eq!(h2_line["bytes_out"].as_u64(), Some(h2.body.len() as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_states_say_who_ended_the_exchange() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = HttpBackend::start("a").await;
    let echo = TcpEcho::start().await;
    let (dead, _reserved) = support::daemon::dead_addr();
    let cut_off = |then| {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nhello".to_vec();
        move |_: &support::raw::Seen| (answer.clone(), then)
    };
    let broken = support::raw::RawBackend::start(cut_off(support::raw::Then::Close)).await;
    let stalls = support::raw::RawBackend::start(cut_off(support::raw::Then::CloseAfter(
        std::time::Duration::from_secs(60),
    )))
    .await;
    // Reads the request and closes without a byte of answer.
    let mute = support::raw::RawBackend::start(|_| (Vec::new(), support::raw::Then::Close)).await;
    let keys = format!("response_timeout = \"300ms\"\n{}", log_key(&log, "json"));
    let fading = HttpBackend::start("f").await;
    let spec = Spec::new()
        .listener("web", "http", "app", &keys)
        .listener("gone", "http", "dead", &log_key(&log, "json"))
        .listener("raw", "tcp", "echo", &log_key(&log, "json"))
        .listener("deadtcp", "tcp", "dead", &log_key(&log, "json"))
        .listener(
            "idle",
            "tcp",
            "echo",
            &format!("tunnel_timeout = \"300ms\"\n{}", log_key(&log, "json")),
        )
        .listener(
            "slowhead",
            "http",
            "app",
            &format!("header_timeout = \"300ms\"\n{}", log_key(&log, "json")),
        )
        .listener("capped", "http", "one", &log_key(&log, "json"))
        .listener("broken", "http", "broken", &log_key(&log, "json"))
        .listener("fading", "http", "fading", &log_key(&log, "json"))
        .listener("stalls", "http", "stalls", &keys)
        .listener("mute", "http", "mute", &log_key(&log, "json"))
        .listener("curt", "http", "curt", &log_key(&log, "json"))
        .pool("app", &[backend.addr])
        .pool("dead", &[dead])
        .pool("echo", &[echo.addr])
        .pool_with(
            "one",
            "max_connections_per_backend = 1\nqueue_timeout = \"300ms\"",
            &[(backend.addr, 1)],
        )
        .pool("broken", &[broken.addr])
        .pool_with(
            "fading",
            "health = { kind = \"tcp\", interval = \"100ms\", timeout = \"500ms\", rise = 1, fall = 1 }",
            &[(fading.addr, 1)],
        )
        .pool("stalls", &[stalls.addr])
        .pool("mute", &[mute.addr])
        .pool("curt", &[support::raw::closes_after_head().await]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    assert_eq!(client::get(web, "/ok").await.expect("ok").status, 200);
    // Backends that break a response off after its head: closing midway
    // (`SD`), falling silent past response_timeout (`sD`).
    for (listener, cut) in [("broken", "SD"), ("stalls", "sD")] {
        let answer = raw(baton.addr(listener), "GET /cut HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{cut}: {answer}");
    }
    // A backend that failed before its response head: 502.
    // (A 502 keeps the client's connection: it asks for the close.)
    let unanswered = raw(
        baton.addr("mute"),
        "GET /mute HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(unanswered.starts_with("HTTP/1.1 502"), "{unanswered}");
    // One that closed while the body was still going up: 502, the request
    // not taken (`SR`).
    let cut_off = raw(
        baton.addr("curt"),
        "POST /mute HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhalf.",
    )
    .await;
    assert!(cut_off.starts_with("HTTP/1.1 502"), "{cut_off}");
    // A pool whose one backend went down: 503, no backend up.
    fading.kill();
    support::eventually("the fading backend down", || async {
        client::backend_state(baton.admin, "fading-0").await == "down"
    })
    .await;
    let none_up = client::get(baton.addr("fading"), "/").await.expect("503");
    assert_eq!(none_up.status, 503);
    // A head that does not come whole within header_timeout: 408.
    let half = raw(baton.addr("slowhead"), "GET /half HTTP/1.1\r\nHost: a\r\n").await;
    assert!(half.starts_with("HTTP/1.1 408"), "{half}");
    // A head its client leaves half sent: no answer, a line all the same.
    let mut gone = TcpStream::connect(web).await.expect("connect");
    gone.write_all(b"GET /gone HTTP/1.1\r\nHost: a\r\n")
        .await
        .expect("write");
    gone.shutdown().await.expect("shutdown");
    assert_eq!(client::read_until_closed(&mut gone).await, "");
    // The capped pool's one place held: the next request times out in line.
    let capped = baton.addr("capped");
    let held = tokio::spawn(async move { client::get(capped, "/gated").await });
    support::eventually("the place is held", || async { backend.held() == 1 }).await;
    let in_line = client::get(capped, "/in-line").await.expect("503");
    assert_eq!(in_line.status, 503);
    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
    assert_eq!(
        client::get(web, "/slow/2000").await.expect("504").status,
        504
    );
    let refused_head =
        "GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
    let bad = raw(web, refused_head).await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    let down = client::get(baton.addr("gone"), "/").await.expect("502");
    assert_eq!(down.status, 502);
    let mut tcp = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    tcp.write_all(b"ping").await.expect("write");
    tcp.shutdown().await.expect("shutdown");
    assert_eq!(client::read_until_closed(&mut tcp).await, "ping");
    let mut refused = TcpStream::connect(baton.addr("deadtcp"))
        .await
        .expect("connect");
    assert_eq!(client::read_until_closed(&mut refused).await, "");
    // Quiet past tunnel_timeout: cut, and the line still counts its bytes.
    let mut quiet = TcpStream::connect(baton.addr("idle"))
        .await
        .expect("connect");
    quiet.write_all(b"hello").await.expect("write");
    assert_eq!(client::read_until_closed(&mut quiet).await, "hello");
    stop_and_wait(&baton).await;

    let lines = json_lines(&[log]);
    let seen: Vec<(String, Value, String)> = lines
        .iter()
        .map(|l| {
            (
                l["listener"].as_str().unwrap_or("").to_string(),
                l["status"].clone(),
                l["termination"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let expect = [
        ("web", Value::from(200), "--"),
        ("web", Value::from(504), "sH"),
        ("web", Value::from(400), "PR"),
        ("web", Value::Null, "CR"),
        ("gone", Value::from(502), "SC"),
        ("raw", Value::Null, "--"),
        ("deadtcp", Value::Null, "SC"),
        ("idle", Value::Null, "cD"),
        ("slowhead", Value::from(408), "cR"),
        ("capped", Value::from(200), "--"),
        ("capped", Value::from(503), "RQ"),
        ("broken", Value::from(200), "SD"),
        ("stalls", Value::from(200), "sD"),
        ("fading", Value::from(503), "SQ"),
        ("mute", Value::from(502), "SH"),
        ("curt", Value::from(502), "SR"),
    ];
    for (listener, status, termination) in &expect {
        assert!(
            seen.iter()
                .any(|(l, s, t)| l == listener && s == status && t == termination),
            "{listener} {status} {termination} in {seen:?}"
        );
    }
    assert_eq!(lines.len(), expect.len(), "{seen:?}");
    // The timings are each step's own (as HAProxy's Tw, Tc and Tr): to a
    // backend picked, then to a connection in hand, then to the response's
    // head; together no more than the whole, which counts from the head's
    // first byte. (Compared with each other, they flaked: a connect can
    // take longer than the answer after it.) A request cut before its head
    // has no head's mark.
    let ms = |line: &Value, key: &str| line[key].as_f64();
    let completed = lines
        .iter()
        .find(|l| l["listener"] == "web" && l["termination"] == "--")
        .expect("the completed line");
    let steps: Vec<Option<f64>> = ["queue_ms", "connect_ms", "response_ms", "total_ms"]
        .iter()
        .map(|key| ms(completed, key))
        .collect();
    let steps: Vec<f64> = steps.into_iter().flatten().collect();
    assert_eq!(steps.len(), 4, "{completed}");
    assert!(steps[..3].iter().sum::<f64>() <= steps[3], "{completed}");
    let timed_out = lines
        .iter()
        .find(|l| l["termination"] == "sH")
        .expect("the timed-out line");
    assert!(ms(timed_out, "connect_ms").is_some(), "{timed_out}");
    assert!(timed_out["response_ms"].is_null(), "{timed_out}");
    assert!(
        ms(timed_out, "total_ms").is_some_and(|t| t >= 300.0),
        "{timed_out}"
    );
    // A refused head's line counts the head as read and the answer.
    let refused_line = lines
        .iter()
        .find(|l| l["termination"] == "PR")
        .expect("refused line");
    assert_eq!(
        (
            refused_line["bytes_in"].as_u64(),
            refused_line["bytes_out"].as_u64()
        ),
        (Some(refused_head.len() as u64), Some(bad.len() as u64)),
        "{refused_line}"
    );
    let tcp_line = lines
        .iter()
        .find(|l| l["listener"] == "raw")
        .expect("tcp line");
    assert_eq!(tcp_line["protocol"], "TCP");
    assert_eq!(
        (
            tcp_line["bytes_in"].as_u64(),
            tcp_line["bytes_out"].as_u64()
        ),
        (Some(4), Some(4))
    );
    // A TCP connection to a backend that refused it names the backend.
    let refused = lines
        .iter()
        .find(|l| l["listener"] == "deadtcp")
        .expect("refused line");
    assert_eq!(refused["backend"], "dead-0", "{refused}");
    let cut = lines
        .iter()
        .find(|l| l["listener"] == "idle")
        .expect("cut line");
    let cut_bytes = (cut["bytes_in"].as_u64(), cut["bytes_out"].as_u64());
    assert_eq!(cut_bytes, (Some(5), Some(5)), "{cut}");
}

/// The body of a whole HTTP/1 answer: what follows its head.
fn body_of(answer: &str) -> &str {
    answer
        .split_once("\r\n\r\n")
        .map_or_else(|| panic!("no head in {answer:?}"), |(_, body)| body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_format_is_what_log_tools_read() {
    let Logged {
        dir: _dir,
        log,
        backend,
        baton,
    } = logging("combined").await;
    // A user agent past ASCII, not UTF-8 (obs-text, which a field value
    // may carry): escaped, not hidden as "-".
    let request = b"GET /page?q=1 HTTP/1.1\r\nHost: a\r\nReferer: http://r.example/\r\nUser-Agent: test \"agent\" \xFF\r\nConnection: close\r\n\r\n";
    let answer = raw(baton.addr("web"), request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let refused = raw(
        baton.addr("web"),
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n",
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    // A long user agent is cut at 2 KiB, and said to be.
    let odd = [
        &b"GET /p?q=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: "[..],
        &[b'u'; 5000],
        b"\r\nConnection: close\r\n\r\n",
    ]
    .concat();
    raw(baton.addr("web"), odd).await;
    // A client gone before its answer: a number still (nginx's 499), where
    // `-` made log tools drop the line.
    let mut gone = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    gone.write_all(b"GET /slow/3000 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .expect("request");
    support::eventually("the request reached the backend", || async {
        backend.active() == 1
    })
    .await;
    drop(gone);
    support::eventually("the backend let go", || async { backend.active() == 0 }).await;
    stop_and_wait(&baton).await;
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[3].contains("] \"GET /slow/3000 HTTP/1.1\" 499 0 "),
        "{}",
        lines[3]
    );
    assert!(
        lines[2].contains("] \"GET /p?q=1 HTTP/1.1\" 200 "),
        "{}",
        lines[2]
    );
    let cut = format!(" \"{}...\"", "u".repeat(2048));
    assert!(lines[2].ends_with(&cut), "{}", lines[2]);
    let line = lines[0];
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    // The size is the body's alone, as Apache's `%b` and nginx's
    // `$body_bytes_sent` count it: log tools sum it as content served.
    let served = format!(
        "] \"GET /page?q=1 HTTP/1.1\" 200 {} ",
        body_of(&answer).len()
    );
    assert!(line.contains(&served), "{line} (answer {answer:?})");
    assert!(
        line.ends_with(" \"http://r.example/\" \"test \\x22agent\\x22 \\xFF\""),
        "{line}"
    );
    let refusal = format!("] \"- - HTTP/1.1\" 400 {} ", body_of(&refused).len());
    assert!(
        lines[1].contains(&refusal),
        "{} (answer {refused:?})",
        lines[1]
    );
}

/// An h2 stream the client gives up on while baton waits for the backend
/// (hyper drops the stream's future) still leaves its line: `CH`, no status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_h2_stream_is_logged_as_the_client_s_abort() {
    let Logged {
        dir: _dir,
        log,
        backend,
        baton,
    } = logging("json").await;
    let web = baton.addr("web");
    let tcp = TcpStream::connect(web).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let req = hyper::Request::get(format!("http://{web}/slow/3000"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let asked = sender.send_request(req);
    support::eventually("the request reached the backend", || async {
        backend.active() == 1
    })
    .await;
    drop(asked);
    drop(sender);
    conn.abort();
    support::eventually("the backend let go", || async { backend.active() == 0 }).await;
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["protocol"], "HTTP/2.0");
    assert_eq!(lines[0]["termination"], "CH", "{}", lines[0]);
    assert!(lines[0]["status"].is_null(), "{}", lines[0]);
}

/// A head trickled in counts in `total_ms` from its first byte, as
/// nginx's `$request_time` does (it counted from the head's end: a client
/// trickling for seconds showed a few ms, where a refused head's line
/// counted from its first byte); `queue_ms` still from the head's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_ms_counts_from_the_heads_first_byte() {
    let Logged {
        dir: _dir,
        log,
        backend: _backend,
        baton,
    } = logging("json").await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\n")
        .await
        .expect("request line");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    s.write_all(b"Host: a\r\nConnection: close\r\n\r\n")
        .await
        .expect("the rest");
    let answer = client::read_until_closed(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let total = lines[0]["total_ms"].as_f64().expect("total_ms");
    let queue = lines[0]["queue_ms"].as_f64().expect("queue_ms");
    assert!(total >= 1500.0, "{}", lines[0]);
    assert!(queue < 1000.0, "{}", lines[0]);
}

/// Lines a full disk refuses are all said in baton's own log, each
/// counted once: the first at once, the rest when the writer stops (it
/// said them once a minute, so a shorter episode's count went unsaid).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_a_full_disk_refused_is_said() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new()
        .listener(
            "web",
            "http",
            "app",
            &log_key(Path::new("/dev/full"), "json"),
        )
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    for _ in 0..20 {
        let answer = client::get(baton.addr("web"), "/").await.expect("served");
        assert_eq!(answer.status, 200);
    }
    let dropped = "baton_access_log_dropped_total{listener=\"web\"}";
    support::eventually("every line counted as dropped", || async {
        client::series(&client::metrics(baton.admin).await, dropped) == Some(20.0)
    })
    .await;
    stop_and_wait(&baton).await;
    let log = baton.log();
    let said: u64 = log
        .lines()
        .filter(|l| l.contains("access log"))
        .filter_map(|l| {
            l.split(" lost=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(said, 20, "{log}");
}

/// A TCP listener's log has a line for every connection, those closed
/// before they were served too: a PROXY header refused (`PR`) or not
/// whole in time (`cR`), a TLS handshake that failed (`PR`) or that the
/// client closed before a byte (`CR`, a balancer's TCP check); they had
/// none, and the README promised one a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_connection_refused_before_it_was_served_has_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let echo = TcpEcho::start().await;
    let ca = support::tls::Authority::new();
    let a = ca.issue("a", &["a.test"]);
    let receive = "proxy_protocol = { trusted = [\"127.0.0.0/8\"], timeout = \"300ms\" }";
    let tls = support::tls::Issued::listener_tls(&[&a], "");
    let spec = Spec::new()
        .listener(
            "pp",
            "tcp",
            "echo",
            &format!("{receive}\n{}", log_key(&log, "json")),
        )
        .listener(
            "tls",
            "tcp",
            "echo",
            &format!("{tls}\n{}", log_key(&log, "json")),
        )
        .pool("echo", &[echo.addr]);
    let baton = Baton::start(spec).await;
    // (listener, bytes sent, whether the client then closes its half)
    for (listener, sent, closes) in [
        ("pp", &b"PROXY garbage\r\n"[..], false),
        ("pp", b"", false),
        ("tls", b"GET / HTTP/1.1\r\n\r\n", false),
        ("tls", b"", true),
    ] {
        let mut s = TcpStream::connect(baton.addr(listener))
            .await
            .expect("connect");
        s.write_all(sent).await.expect("write");
        if closes {
            s.shutdown().await.expect("half-close");
        }
        client::read_until_closed(&mut s).await;
    }
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    let mut ends: Vec<String> = lines
        .iter()
        .map(|l| format!("{} {} {}", l["listener"], l["protocol"], l["termination"]))
        .collect();
    ends.sort();
    assert_eq!(
        ends,
        [
            r#""pp" "TCP" "PR""#,
            r#""pp" "TCP" "cR""#,
            r#""tls" "TCP" "CR""#,
            r#""tls" "TCP" "PR""#
        ],
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["pool"] == "echo" && l["status"].is_null()),
        "{lines:?}"
    );
}

/// An h2 request whose field list is past the bound (a 70 KB field) is a
/// 431 that is counted and logged (`PR`, its method and path), as an
/// HTTP/1 head past it is: the connection answered it itself, and it left
/// no trace. So is one whose path is past it, which the connection
/// answers alone, with no request to hand on (no method or path logged):
/// it was neither counted nor logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_head_past_the_bound_is_a_431_counted_and_logged() {
    let Logged {
        dir: _dir,
        log,
        backend,
        baton,
    } = logging("json").await;
    let web = baton.addr("web");
    let mut sender = support::client::h2::<http_body_util::Empty<bytes::Bytes>>(web).await;
    let mut req = hyper::Request::get(format!("http://{web}/big"))
        .body(http_body_util::Empty::new())
        .expect("request");
    let huge = "h".repeat(70_000).parse().expect("value");
    req.headers_mut().insert("x-huge", huge);
    let answer = sender.send_request(req).await.expect("h2 response");
    assert_eq!(answer.status(), 431);
    // Within the 65,534 bytes an `http::Uri` may have.
    let long_path = format!("http://{web}/{}", "p".repeat(65_400));
    let req = hyper::Request::get(long_path)
        .body(http_body_util::Empty::new())
        .expect("request");
    let answer = sender.send_request(req).await.expect("h2 response");
    assert_eq!(answer.status(), 431);
    let metrics = client::metrics(baton.admin).await;
    let refused = "baton_requests_total{listener=\"web\",pool=\"app\",code=\"4xx\"}";
    assert_eq!(client::series(&metrics, refused), Some(2.0), "{metrics}");
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    // The two lines in either order: one is written as the first
    // stream's record ends, the other as the second's HEADERS come.
    let by_target = |target: &str| {
        lines
            .iter()
            .find(|l| l["target"] == target)
            .unwrap_or_else(|| panic!("no line for {target}: {lines:?}"))
    };
    for (line, method, target) in [
        (by_target("/big"), "GET", "/big"),
        (by_target("-"), "-", "-"),
    ] {
        assert_eq!(line["status"], 431, "{line}");
        assert_eq!(line["termination"], "PR", "{line}");
        assert_eq!(line["protocol"], "HTTP/2.0", "{line}");
        assert_eq!(
            (&line["method"], &line["target"]),
            (&method.into(), &target.into()),
            "{line}"
        );
    }
    assert_eq!(backend.hits(), 0);
}

/// A target past 2 KiB is cut there in a JSON line, its characters kept
/// whole (a line of a 64 KiB head, escaped, was 240 KiB: a few dozen
/// filled the writer's queue, and other clients' lines were dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_line_cuts_a_long_target() {
    let Logged {
        dir: _dir,
        log,
        backend: _backend,
        baton,
    } = logging("json").await;
    let web = baton.addr("web");
    let long = format!("/{}", "é".repeat(3000));
    let asked = format!("GET {long} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    raw(web, asked).await;
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    // 2,048 bytes would cut the 1,024th `é` in two: 2,047 are kept.
    let cut = format!("{}...", &long[..2047]);
    assert_eq!(lines[0]["target"], cut.as_str(), "{}", lines[0]);
}

/// An h2c connection to `web` whose stream 1 is a POST with its body's
/// first 14 bytes sent and the rest still to come, once `backend` has it.
async fn uploading(web: SocketAddr, backend: &HttpBackend) -> TcpStream {
    let mut s = TcpStream::connect(web).await.expect("connect");
    let opening = [
        h2_raw::opening(),
        h2_raw::post_on(1, "/upload"),
        h2_raw::data_on(1, b"the first part"),
    ]
    .concat();
    s.write_all(&opening).await.expect("write");
    support::eventually("the request reached the backend", || async {
        backend.active() == 1
    })
    .await;
    s
}

/// An h2 stream whose client resets it, or closes its connection, while
/// its body is still coming (or before its first byte) is the client's
/// abort while sending (`CR`, no status), as on HTTP/1: not a malformed
/// body's 400 that nobody got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_reset_during_its_upload_is_logged_as_cut_while_sending() {
    let Logged {
        dir: _dir,
        log,
        backend,
        baton,
    } = logging("json").await;
    let mut s = uploading(baton.addr("web"), &backend).await;
    s.write_all(&h2_raw::reset(1)).await.expect("reset");
    support::eventually("the backend let go", || async { backend.active() == 0 }).await;
    // The same, the client closing its connection instead.
    drop(uploading(baton.addr("web"), &backend).await);
    support::eventually("the backend let go", || async { backend.active() == 0 }).await;
    // And reset before its first DATA frame (no backend was picked yet).
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(&[h2_raw::opening(), h2_raw::post_on(1, "/upload")].concat())
        .await
        .expect("write");
    h2_raw::round_trip(&mut s).await;
    s.write_all(&h2_raw::reset(1)).await.expect("reset");
    h2_raw::round_trip(&mut s).await;
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let first_frame_cut = lines.iter().filter(|l| l["bytes_in"] == 0).count();
    assert_eq!(first_frame_cut, 1, "{lines:?}");
    for line in &lines {
        assert_eq!(line["termination"], "CR", "{line}");
        assert!(line["status"].is_null(), "nothing was answered: {line}");
    }
}

/// One http listener "web" logging to `log` in JSON, before `backend`,
/// whose stop forces what is left a second after it begins.
fn drained_in_a_second(log: &Path, backend: &HttpBackend) -> Spec {
    Spec::default()
        .section("[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"1s\"\n")
        .listener("web", "http", "app", &log_key(log, "json"))
        .pool("app", &[backend.addr])
}

/// An h2 stream the drain cuts at its deadline is the drain's doing, and
/// its line is written before the generation exits: stream tasks are the
/// drain's own (waited for, then dropped when forced), not tokio's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_cut_by_a_forced_drain_is_logged_as_drained() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(drained_in_a_second(&log, &backend)).await;
    let web = baton.addr("web");
    let mut sender = support::client::h2(web).await;
    let req = hyper::Request::get(format!("http://{web}/slow/10000"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let asked = tokio::spawn(sender.send_request(req));
    support::eventually("the request reached the backend", || async {
        backend.active() == 1
    })
    .await;
    for pid in processes_for(&baton.config) {
        signal(pid, Signal::SIGTERM);
        assert_eq!(wait_exit(pid).await, Some(3), "a forced stop");
    }
    assert!(asked.await.expect("join").is_err(), "the stream was cut");
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["protocol"], "HTTP/2.0");
    assert_eq!(lines[0]["termination"], "KH", "{}", lines[0]);
}

/// An h2 upload the drain cuts at its deadline is the drain's doing
/// (`KR`), not the client's, though its body broke the way a client's
/// leaving breaks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_upload_cut_by_a_forced_drain_is_logged_as_drained() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(drained_in_a_second(&log, &backend)).await;
    let _uploading = uploading(baton.addr("web"), &backend).await;
    for pid in processes_for(&baton.config) {
        signal(pid, Signal::SIGTERM);
        assert_eq!(wait_exit(pid).await, Some(3), "a forced stop");
    }
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["termination"], "KR", "{}", lines[0]);
    assert!(lines[0]["status"].is_null(), "{}", lines[0]);
}

/// An HTTP/1 response a reload's drain cuts at its deadline, mid-body, is
/// logged with what went out (its status, its bytes, `KD`) and counted, as
/// an h2 stream's is: its task is dropped before the exchange could note
/// either, and the count reaches the next generation with the old one's
/// last report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_response_cut_by_a_forced_drain_is_logged_and_counted_with_what_went_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = support::raw::RawBackend::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
            support::raw::Then::CloseAfter(std::time::Duration::from_secs(30)),
        )
    })
    .await;
    let spec = Spec::default()
        .section("[reload]\ndrain_timeout = \"1s\"\n")
        .listener("web", "http", "app", &log_key(&log, "json"))
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let mut s = TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    s.write_all(b"GET /long HTTP/1.1\r\nHost: app\r\n\r\n")
        .await
        .expect("request");
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("hello") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(
            support::TIMEOUT,
            tokio::io::AsyncReadExt::read(&mut s, &mut buf),
        )
        .await
        .expect("in time")
        .expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    baton.reload_ok().await;
    client::read_until_closed(&mut s).await;
    baton.settled().await;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_eq!(line["termination"], "KD", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(
        line["bytes_out"].as_u64(),
        Some(seen.len() as u64),
        "{line}"
    );
    let metrics = client::metrics(baton.admin).await;
    assert!(
        metrics.contains("baton_requests_total{listener=\"web\",pool=\"app\",code=\"2xx\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("baton_requests_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// An upgraded connection's line counts what went through the tunnel
/// each way, not the heads alone, and says when `tunnel_timeout` ended it
/// (`cD`, as a TCP-mode connection's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_logs_the_bytes_its_tunnel_carried_and_its_idle_end() {
    const SENT: usize = 10_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let backend = HttpBackend::start("a").await;
    let keys = format!("{}\ntunnel_timeout = \"1s\"", log_key(&log, "json"));
    let spec = Spec::default()
        .listener("web", "http", "app", &keys)
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let (mut s, head) = client::upgraded(baton.addr("web"), "echo").await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    s.write_all(&[b'x'; SENT]).await.expect("write upgraded");
    let mut back = vec![0u8; SENT];
    tokio::time::timeout(
        support::TIMEOUT,
        tokio::io::AsyncReadExt::read_exact(&mut s, &mut back),
    )
    .await
    .expect("echo in time")
    .expect("echoed");
    assert_eq!(
        client::read_until_closed(&mut s).await,
        "",
        "closed, idle, at tunnel_timeout"
    );
    stop_and_wait(&baton).await;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["status"], 101, "{}", lines[0]);
    assert_eq!(lines[0]["termination"], "cD", "{}", lines[0]);
    // The head `client::upgraded` sends, then what went through the tunnel.
    let asked = "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
    assert_eq!(
        lines[0]["bytes_in"].as_u64(),
        Some((asked.len() + SENT) as u64),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[0]["bytes_out"].as_u64(),
        Some((head.len() + SENT) as u64),
        "{}",
        lines[0]
    );
}

/// A TCP connection cut part way through a write to a client that stopped
/// reading (here by `tunnel_timeout`: nothing moved either way) counts
/// every byte that reached the client: the part of the last piece written
/// before the cut was lost to the access log's `bytes_out` (and to
/// `baton_tcp_bytes_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_connection_cut_mid_write_counts_what_reached_the_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("tcp.log");
    let flood = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let at = flood.local_addr().expect("addr");
    let _flooding = tokio::spawn(async move {
        let (mut s, _) = flood.accept().await.expect("accept");
        let _ = s.write_all(&vec![b'x'; 32 << 20]).await;
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    });
    let keys = format!("tunnel_timeout = \"500ms\"\n{}", log_key(&log, "json"));
    let spec = Spec::new()
        .listener("raw", "tcp", "flood", &keys)
        .pool("flood", &[at]);
    let baton = Baton::start(spec).await;
    let mut client = TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    // Read nothing until the cut: baton's write to it then waits part way.
    support::eventually("the connection's line is written", || async {
        std::fs::read_to_string(&log).is_ok_and(|text| text.ends_with('\n'))
    })
    .await;
    let received = client::read_until_closed(&mut client).await.len() as u64;
    let lines = json_lines(&[log]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["termination"], "cD", "{}", lines[0]);
    assert_eq!(
        lines[0]["bytes_out"].as_u64(),
        Some(received),
        "{}",
        lines[0]
    );
}
