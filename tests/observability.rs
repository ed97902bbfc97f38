//! Metrics and status follow both generations: counters never go backwards
//! across reloads and add up to exactly what clients received, draining
//! generations show in `/status`, the kernel's own counters say no reload
//! dropped a connection, and real Prometheus tooling accepts it all.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{free_addr, rss_kib, wait_exit, Baton, Spec};
use support::load::{Load, Targets};

/// Counter and histogram series of one scrape (`name{labels}` → value).
fn counters(text: &str) -> HashMap<String, f64> {
    let mut kinds = HashMap::new();
    let mut out = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                kinds.insert(name.to_string(), kind.to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = key.split('{').next().unwrap_or(key);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| kinds.get(*f).is_some_and(|k| k == "histogram"))
            .unwrap_or(name);
        if matches!(
            kinds.get(family).map(String::as_str),
            Some("counter" | "histogram")
        ) {
            out.insert(key.to_string(), value.parse().unwrap_or(f64::NAN));
        }
    }
    out
}

fn requests_total(text: &str) -> f64 {
    counters(text)
        .iter()
        .filter(|(k, _)| k.starts_with("baton_requests_total"))
        .map(|(_, v)| v)
        .sum()
}

async fn scrape(admin: std::net::SocketAddr) -> Result<String, String> {
    let a = client::admin_get(admin, "/metrics").await?;
    if a.status == 200 {
        Ok(a.body)
    } else {
        Err(format!("status {}", a.status))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_never_go_backwards_and_add_up_across_ten_reloads() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let baton = Baton::start(
        Spec::new()
            .http("web", "app")
            .pool("app", &[a.addr, b.addr]),
    )
    .await;
    let admin = baton.admin;
    let load = Load::start(Targets {
        http: Some(baton.addr("web")),
        tcp: None,
        names: vec!["a", "b"],
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let scraped = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let scraper = {
        let (stop, scraped) = (stop.clone(), std::sync::Arc::clone(&scraped));
        tokio::spawn(async move {
            let mut highest: HashMap<String, f64> = HashMap::new();
            let (mut scrapes, mut problems) = (0u32, Vec::new());
            while !stop.is_cancelled() {
                match scrape(admin).await {
                    Ok(text) => {
                        scrapes += 1;
                        scraped.fetch_add(1, Ordering::SeqCst);
                        for (key, value) in counters(&text) {
                            let before = highest.entry(key.clone()).or_insert(value);
                            // Float `_sum`s may print a last digit apart.
                            if value < *before - before.abs() * 1e-12 {
                                problems.push(format!("{key} went from {before} to {value}"));
                            }
                            *before = before.max(value);
                        }
                    }
                    Err(e) => problems.push(format!("scrape failed: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (scrapes, problems)
        })
    };
    load.progress(50).await;
    for _ in 0..10 {
        let old = baton.serving_pid().await;
        let seen = scraped.load(Ordering::SeqCst);
        baton.reload_ok().await;
        load.progress(30).await;
        // Scrapes land while the old generation drains and after it left.
        support::eventually("scrapes during the reload", || async {
            scraped.load(Ordering::SeqCst) > seen
        })
        .await;
        assert_eq!(wait_exit(old).await, Some(0));
        let seen = scraped.load(Ordering::SeqCst);
        support::eventually("scrapes after the reload", || async {
            scraped.load(Ordering::SeqCst) > seen
        })
        .await;
    }
    let report = load.stop().await;
    report.assert_clean();
    stop.cancel();
    let (scrapes, problems) = scraper.await.expect("scraper");
    assert!(scrapes >= 20, "scraped {scrapes} times");
    assert!(problems.is_empty(), "{problems:#?}");
    // Every response a client received was counted once, by some generation.
    let received = report.ok as f64;
    let mut counted = 0.0;
    for _ in 0..100 {
        counted = requests_total(&scrape(admin).await.expect("scrape"));
        if counted == received {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        counted, received,
        "baton_requests_total vs responses received"
    );
}

/// Labelled series exist at 0 from the first scrape (DESIGN), the drain's
/// histogram too: a dashboard or an alert on it has data before the first
/// drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_series_exist_at_zero_from_the_start() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let text = scrape(baton.admin).await.expect("scrape");
    for reason in ["reload", "shutdown"] {
        for series in [
            format!("baton_drain_duration_seconds_count{{reason=\"{reason}\"}} 0"),
            format!("baton_drained_connections_total{{reason=\"{reason}\"}} 0"),
            format!("baton_drain_forced_connections_total{{reason=\"{reason}\"}} 0"),
        ] {
            assert!(text.contains(&series), "{series} in\n{text}");
        }
    }
    for series in [
        "baton_handoff_duration_seconds_count 0",
        "baton_generation 1",
        "baton_reloads_total{result=\"success\"} 0",
        "baton_reloads_total{result=\"failed\"} 0",
    ] {
        assert!(text.contains(series), "{series} in\n{text}");
    }
}

/// What a dashboard graphs of reloads, after two that worked: the serving
/// generation's number, the reloads counted as successes, one handoff and
/// one reload drain each, carried to the serving generation from those
/// that did them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_show_in_the_generation_the_counts_and_the_histograms() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    baton.reload_ok().await;
    baton.reload_ok().await;
    baton.settled().await;
    let expected = [
        ("baton_generation", 3.0),
        ("baton_reloads_total{result=\"success\"}", 2.0),
        ("baton_reloads_total{result=\"failed\"}", 0.0),
        ("baton_handoff_duration_seconds_count", 2.0),
        ("baton_drain_duration_seconds_count{reason=\"reload\"}", 2.0),
        (
            "baton_drain_duration_seconds_count{reason=\"shutdown\"}",
            0.0,
        ),
    ];
    let admin = baton.admin;
    support::eventually("the reloads counted", || async move {
        let text = scrape(admin).await.unwrap_or_default();
        expected
            .iter()
            .all(|(series, value)| client::series(&text, series) == Some(*value))
    })
    .await;
}

/// `BATON_LOG_FORMAT=json` makes every line baton logs one JSON object (a
/// log shipper's input), the lines of the generation a reload starts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line_across_a_reload() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
    let baton = Baton::spawn_under(spec, &[], &["env", "BATON_LOG_FORMAT=json"]);
    baton.wait_ready().await;
    let new = baton.reload_ok().await;
    baton.settled().await;
    let log = baton.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["fields"]["message"].is_string()),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "serving" && l["fields"]["pid"] == new),
        "the new generation's own lines: {log}"
    );
}

/// `/status` says when each generation started and, for each backend, its
/// index (the admin API's other name for it) and its last health check
/// (DESIGN), which `baton status` and an operator's scripts read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_when_generations_started_and_each_backends_last_check() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let spec = Spec::new().http("web", "app").pool_with(
        "app",
        "health = { kind = \"http\", path = \"/health\", interval = \"100ms\", timeout = \"2s\", rise = 1, fall = 1 }",
        &[(a.addr, 1), (b.addr, 1)],
    );
    let before = support::unix_now();
    let baton = Baton::start(spec).await;
    let status = client::status(baton.admin).await;
    let started = status["generations"][0]["started_at"]
        .as_f64()
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        started >= before - 1.0 && started <= support::unix_now(),
        "{started} {status}"
    );
    for (name, index) in [("app-0", 0), ("app-1", 1)] {
        let backend = client::backend_status(baton.admin, name).await;
        assert_eq!(backend["index"], index, "{backend}");
        let check = &backend["last_check"];
        assert_eq!(check["ok"], true, "{backend}");
        assert!(
            check["at"].as_f64().is_some_and(|at| at >= before - 1.0),
            "{backend}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_a_draining_generation_with_its_connection() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let web = baton.addr("web");
    let old = baton.serving_pid().await;
    let slow = tokio::spawn(async move { client::get(web, "/slow/2500").await });
    support::eventually("slow request arrived", || async {
        backend.hits.load(Ordering::Relaxed) == 1
    })
    .await;
    let new = baton.reload_ok().await;
    let status = client::get(baton.admin, "/status").await.expect("status");
    let v: serde_json::Value = serde_json::from_str(&status.body).expect("json");
    let generations = v["generations"].as_array().expect("generations");
    assert_eq!(generations.len(), 2, "{}", status.body);
    assert_eq!(generations[0]["pid"], new);
    assert_eq!(generations[0]["state"], "active");
    assert_eq!(generations[1]["pid"], old);
    assert_eq!(generations[1]["state"], "draining");
    assert_eq!(generations[1]["in_flight"], 1);
    // The deadline comes with the old generation's first report, at once.
    support::eventually("the draining generation's deadline", || async {
        let s = client::get(baton.admin, "/status").await.expect("status");
        let v: serde_json::Value = serde_json::from_str(&s.body).expect("json");
        v["generations"][1]["drain_seconds_left"]
            .as_f64()
            .is_some_and(|l| l > 0.0)
    })
    .await;
    let metrics = scrape(baton.admin).await.expect("scrape");
    assert!(
        metrics.contains("baton_connections_active{listener=\"web\",state=\"draining\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("baton_draining_generations 1"));
    // Its request is on the backend: the backend's count shows it.
    assert!(
        metrics.contains("baton_backend_in_flight{pool=\"app\",backend=\"app-0\"} 1"),
        "{metrics}"
    );
    let backend_in_flight =
        || async { client::backend_status(baton.admin, "app-0").await["in_flight"].as_u64() };
    assert_eq!(backend_in_flight().await, Some(1));
    assert_eq!(slow.await.expect("join").expect("slow").status, 200);
    assert_eq!(wait_exit(old).await, Some(0));
    old_generation_left_status(baton.admin).await;
    assert_eq!(backend_in_flight().await, Some(0));
}

/// A listener a reload removed shows the old generation's connections on
/// it while it drains, then leaves `/metrics` with that generation, as the
/// series of what a reload removed do: not its last count for good, nor a
/// 0 for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_listeners_draining_count_leaves_with_its_generation() {
    let (backend, baton) = web_and_old().await;
    let old = baton.addr("old");
    // Held, not timed: the reload's answer comes only once the removed
    // listener waited for the connections its deferral held back (1.5 s).
    let slow = tokio::spawn(async move { client::get(old, "/gated").await });
    support::eventually("the request held by the backend", || async {
        backend.held() == 1
    })
    .await;
    let old_pid = baton.serving_pid().await;
    baton.write_spec(
        &Spec::new().http("web", "app").pool("app", &[backend.addr]),
        &HashMap::new(),
    );
    baton.reload_ok().await;
    let draining = "baton_connections_active{listener=\"old\",state=\"draining\"}";
    let metrics = scrape(baton.admin).await.expect("scrape");
    assert!(metrics.contains(&format!("{draining} 1")), "{metrics}");
    backend.release();
    assert_eq!(slow.await.expect("join").expect("slow").status, 200);
    assert_eq!(wait_exit(old_pid).await, Some(0));
    old_generation_left_status(baton.admin).await;
    let metrics = scrape(baton.admin).await.expect("scrape");
    assert!(!metrics.contains("listener=\"old\""), "{metrics}");
    assert!(metrics.contains("listener=\"web\""), "{metrics}");
}

/// Backend "a" behind two HTTP listeners, "web" and "old" (which a
/// reload then removes: it defers accepting, so its doors take 1.5 s to
/// close).
async fn web_and_old() -> (HttpBackend, Baton) {
    let backend = HttpBackend::start("a").await;
    let both = Spec::new()
        .http("web", "app")
        .http("old", "app")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(both).await;
    (backend, baton)
}

/// Every `/status` answered across a reload names one serving generation:
/// the old one stops answering before it closes its doors (1.5 s here: a
/// removed listener that defers accepting), where it answered on with
/// itself alone, draining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_across_a_reload_names_one_serving_generation() {
    let (backend, baton) = web_and_old().await;
    let admin = baton.admin;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut answers = Vec::new();
            while !stop.is_cancelled() && answers.len() < 2_000 {
                // A 503 is the old generation's "send it again" (see
                // `a_status_asked_of_a_generation_that_handed_over_is_sent_again`).
                let answer = client::get(admin, "/status").await;
                if let Some(s) = answer.ok().filter(|s| s.status == 200) {
                    let status: serde_json::Value =
                        serde_json::from_str(&s.body).expect("/status is JSON");
                    let serving = status["generations"]
                        .as_array()
                        .expect("generations")
                        .iter()
                        .filter(|g| g["state"] == "active")
                        .count();
                    answers.push((serving, s.body));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answers
        }
    });
    baton.write_spec(
        &Spec::new().http("web", "app").pool("app", &[backend.addr]),
        &HashMap::new(),
    );
    baton.reload_ok().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    let answers = polling.await.expect("join");
    assert!(answers.len() > 20, "{} answers", answers.len());
    for (serving, body) in &answers {
        assert_eq!(*serving, 1, "{body}");
    }
}

/// An admin connection the old generation took before it handed over and
/// asked on after: `/status` and `/metrics` are answered 503 "send it
/// again" (a new connection reaches the serving generation), where the
/// old generation answered with what it knew: a `/status` naming no
/// serving generation (itself alone, draining: a flake of the test
/// above), and counts without the newer generation's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_asked_of_a_generation_that_handed_over_is_sent_again() {
    let (backend, baton, held) = with_a_held_request().await;
    let early = tokio::net::TcpStream::connect(baton.admin)
        .await
        .expect("admin");
    // Both taken by the only generation there is before the reload (see
    // `probe_across_a_reload`).
    let (later, _) = probe_across_a_reload(&baton).await;
    for (probe, path) in [(early, "/status"), (later, "/metrics")] {
        let answer = ask(probe, path).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{path}: {answer}");
        assert!(answer.contains("has handed over"), "{path}: {answer}");
    }
    let status = client::status(baton.admin).await;
    let states: Vec<&str> = status["generations"]
        .as_array()
        .expect("generations")
        .iter()
        .filter_map(|g| g["state"].as_str())
        .collect();
    assert_eq!(states, ["active", "draining"], "{status}");
    backend.release();
    assert_eq!(held.await.expect("join").expect("held").status, 200);
}

/// Waits until `/status` lists the serving generation alone.
async fn old_generation_left_status(admin: std::net::SocketAddr) {
    support::eventually("the old generation leaves /status", || async {
        let s = client::get(admin, "/status").await.expect("status");
        serde_json::from_str::<serde_json::Value>(&s.body)
            .is_ok_and(|v| v["generations"].as_array().is_some_and(|g| g.len() == 1))
    })
    .await;
}

/// A tool from Debian's `prometheus` package; `.ci/run` installs it. Off
/// CI, a machine without it skips the check and says so.
fn tool(name: &str) -> Option<&'static str> {
    let path: &'static str = match name {
        "promtool" => "/usr/bin/promtool",
        _ => "/usr/bin/prometheus",
    };
    let installed = std::path::Path::new(path).exists();
    support::skip::skipped_unless(
        installed,
        &format!("{path} (apt-get install prometheus; .ci/run does)"),
    )
    .then_some(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_a_real_scrape_and_the_shipped_rules() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    for i in 0..5 {
        client::get(baton.addr("web"), &format!("/{i}"))
            .await
            .expect("get");
    }
    baton.reload_ok().await;
    client::get(baton.addr("web"), "/after").await.expect("get");
    let text = scrape(baton.admin).await.expect("scrape");
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, text.as_bytes()).expect("feed promtool");
    }
    let out = child.wait_with_output().expect("promtool output");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/prometheus/baton.rules.yml"
    );
    // And what they say: each fires where users are hurt and stays quiet
    // through a day's reloads (`tests/prometheus/`).
    let cases = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/prometheus/baton.rules.test.yml"
    );
    for args in [["check", "rules", rules], ["test", "rules", cases]] {
        let out = std::process::Command::new(promtool)
            .args(args)
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernel_drops_nothing_in_a_connection_storm_across_ten_reloads() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let before = baton::metrics::kernel::netstat().expect("the namespace's counters");
    let metrics_before = scrape(baton.admin).await.expect("scrape");
    let web = baton.addr("web");
    let stop = tokio_util::sync::CancellationToken::new();
    let storm: Vec<_> = (0..8)
        .map(|i| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u64, 0u64);
                let started = tokio::time::Instant::now();
                while !stop.is_cancelled() && started.elapsed() < Duration::from_secs(60) {
                    match client::get(web, &format!("/storm/{i}")).await {
                        Ok(a) if a.status == 200 => ok += 1,
                        _ => failed += 1,
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    for _ in 0..10 {
        let old = baton.serving_pid().await;
        baton.reload_ok().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(wait_exit(old).await, Some(0));
    }
    stop.cancel();
    let (mut ok, mut failed) = (0, 0);
    for s in storm {
        let (o, f) = s.await.expect("join");
        ok += o;
        failed += f;
    }
    assert!(ok > 100, "the storm ran ({ok} requests)");
    assert_eq!(failed, 0, "no connection of the storm failed");
    let after = baton::metrics::kernel::netstat().expect("the namespace's counters");
    assert_eq!(
        (after.listen_drops, after.listen_overflows),
        (before.listen_drops, before.listen_overflows),
        "the kernel dropped nothing"
    );
    let metrics_after = scrape(baton.admin).await.expect("scrape");
    for name in [
        "baton_kernel_listen_drops_total",
        "baton_kernel_listen_overflows_total",
    ] {
        let value = |t: &str| counters(t).get(name).copied();
        assert_eq!(
            value(&metrics_before),
            value(&metrics_after),
            "{name} did not move"
        );
    }
    assert_eq!(
        counters(&metrics_after)
            .get("baton_kernel_listen_drops_total")
            .copied(),
        Some(after.listen_drops as f64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_backlog_agrees_with_ss() {
    let backend = HttpBackend::start("a").await;
    // One shard: `ss` shows one queue, and no second shard's accept loop
    // takes a queued connection to wait for a place.
    let spec = Spec::new()
        .top("workers = 1")
        .listener("web", "http", "app", "max_connections = 1")
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let web = baton.addr("web");
    let mut holder = client::connect(web).await.expect("holder");
    client::send(&mut holder, web, "/hold").await.expect("hold");
    let _queued = queued_requests(web, 4).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{}", web.port())])
        .output()
        .expect("ss");
    let text = String::from_utf8_lossy(&out.stdout);
    let recv_q: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|q| q.parse().ok())
        .unwrap_or_else(|| panic!("ss: {text}"));
    assert_eq!(recv_q, 4, "{text}");
    let metrics = scrape(baton.admin).await.expect("scrape");
    assert!(
        metrics.contains(&format!(
            "baton_listener_backlog{{listener=\"web\"}} {recv_q}"
        )),
        "{metrics}"
    );
}

/// A `backlog` changed by a reload applies to the adopted socket (as `ss`
/// shows a listening socket's backlog in Send-Q), not only after a stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_a_changed_backlog_to_the_adopted_socket() {
    let backend = HttpBackend::start("a").await;
    let spec = |backlog: u32| {
        Spec::new()
            .top("workers = 1")
            .listener("web", "http", "app", &format!("backlog = {backlog}"))
            .pool("app", &[backend.addr])
    };
    let baton = Baton::start(spec(16)).await;
    let web = baton.addr("web");
    let backlog = || {
        let out = std::process::Command::new("ss")
            .args(["-ltnH", &format!("sport = :{}", web.port())])
            .output()
            .expect("ss");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let send_q: Option<u64> = text.split_whitespace().nth(2).and_then(|q| q.parse().ok());
        send_q.unwrap_or_else(|| panic!("ss: {text}"))
    };
    assert_eq!(backlog(), 16);
    let inodes = support::listening_inodes(web.port());
    baton.write_spec(&spec(64), &HashMap::new());
    baton.reload_ok().await;
    assert_eq!(
        support::listening_inodes(web.port()),
        inodes,
        "the same socket"
    );
    assert_eq!(backlog(), 64);
}

/// `n` connections to `addr`, each with its request sent: what a client
/// leaves in the accept queue (one that says nothing the kernel holds out
/// of it, `defer_accept`).
async fn queued_requests(addr: std::net::SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut out = Vec::new();
    for _ in 0..n {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .expect("queued connect");
        s.write_all(b"GET /queued HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("queued request");
        out.push(s);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_sees_no_counter_reset_across_five_reloads() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!("global:\n  scrape_interval: 200ms\nscrape_configs:\n  - job_name: baton\n    static_configs:\n      - targets: [\"{}\"]\n", baton.admin),
    )
    .expect("config");
    let log = dir.path().join("prometheus.log");
    let query = |listen: std::net::SocketAddr, q: &'static str| async move {
        let path = format!("/api/v1/query?query={q}");
        client::get(listen, &path)
            .await
            .ok()
            .and_then(|a| serde_json::from_str::<serde_json::Value>(&a.body).ok())
    };
    // Its port is picked free, then bound by Prometheus: if another test
    // took it meanwhile, Prometheus exits, and we start it again.
    let mut started = None;
    for _ in 0..3 {
        let listen = free_addr();
        let mut server = std::process::Command::new(prometheus)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start prometheus");
        let mut up = false;
        for _ in 0..300 {
            if query(listen, "up")
                .await
                .is_some_and(|v| v["data"]["result"][0]["value"][1] == "1")
            {
                up = true;
                break;
            }
            if matches!(server.try_wait(), Ok(Some(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if up {
            started = Some((server, listen));
            break;
        }
        let _ = server.kill();
        let _ = server.wait();
    }
    let Some((mut server, listen)) = started else {
        panic!(
            "prometheus never scraped baton; its log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let web = baton.addr("web");
    for i in 0..5 {
        for j in 0..20 {
            client::get(web, &format!("/{i}/{j}")).await.expect("get");
        }
        let old = baton.serving_pid().await;
        baton.reload_ok().await;
        assert_eq!(wait_exit(old).await, Some(0));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let resets = query(listen, "resets(baton_connections_accepted_total%5B5m%5D)")
        .await
        .expect("query resets");
    let samples = query(
        listen,
        "count_over_time(baton_connections_accepted_total%5B5m%5D)",
    )
    .await
    .expect("query count");
    let _ = server.kill();
    let _ = server.wait();
    let n: f64 = samples["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    assert!(n >= 5.0, "prometheus took {n} samples: {samples}");
    assert_eq!(resets["data"]["result"][0]["value"][1], "0", "{resets}");
}

/// `rounds` batches of `batch` pipelined requests on one connection; the
/// number of answers read.
async fn pipelined(addr: std::net::SocketAddr, rounds: usize, batch: usize) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET /p HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let burst = request.repeat(batch);
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut answered = 0;
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail = Vec::new();
    for _ in 0..rounds {
        conn.write_all(burst.as_bytes())
            .await
            .expect("write a burst");
        let mut seen = 0;
        while seen < batch {
            let n = conn.read(&mut buf).await.expect("read answers");
            assert!(n > 0, "baton closed a pipelined connection");
            tail.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&tail);
            seen += text.matches("HTTP/1.1 200 OK").count();
            // Keep a few bytes: a status line may straddle two reads.
            let keep = tail.len().min(15);
            tail.drain(..tail.len() - keep);
        }
        answered += seen;
    }
    answered
}

/// Histogram samples wait in the recorder until something drains them; with
/// nobody scraping `/metrics`, only baton's own upkeep does. Without it
/// every request leaves 8 bytes behind for good (gigabytes an hour at full
/// speed on a host nobody scrapes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_under_load_that_nobody_scrapes() {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 50;
    const BATCH: usize = 50;
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let (web, pid) = (baton.addr("web"), baton.first_pid);
    let load = || async move {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| tokio::spawn(pipelined(web, ROUNDS, BATCH)))
            .collect();
        let mut answered = 0;
        for c in clients {
            answered += c.await.expect("join");
        }
        answered
    };
    // Warm up: buffers, pools and allocator arenas reach their size (on a
    // busy machine an arena could still grow in a second round: once the
    // whole suite ran, the measured rounds grew 320 KiB, 4.1 B a request).
    for _ in 0..3 {
        load().await;
    }
    let warm = rss_kib(pid);
    let mut answered = 0;
    // Ten rounds: the allocator's own growth, a few hundred KiB at most
    // however many requests (340-450 KiB seen on a busy machine), spread
    // over 200,000 requests stays well under the bound.
    for _ in 0..10 {
        answered += load().await;
    }
    let grown = rss_kib(pid).saturating_sub(warm);
    // Kept samples cost at least 8 B per request (18 B measured): 1.6 to
    // 3.4 MiB here; with upkeep, allocator noise of a few hundred KiB.
    assert!(
        grown * 1024 < answered as u64 * 4,
        "RSS grew {grown} KiB over {answered} requests with nobody scraping"
    );
}

/// An older generation that outlives newer draining ones still gets its
/// last counts to the serving generation: a request it finishes after five
/// quick reloads is counted (generations 2 to 5, drained, wait for it and
/// pass its counts on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_generation_outliving_newer_ones_is_still_counted() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(
        Spec::new()
            .section("[reload]\nmax_draining = 8\ndrain_timeout = \"20s\"\n")
            .http("web", "app")
            .pool("app", &[backend.addr]),
    )
    .await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    // Held until the five reloads are done (within generation 1's 20 s
    // drain).
    let slow = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the held request is on generation 1", || async {
        backend.held() == 1
    })
    .await;
    for _ in 0..5 {
        baton.reload_ok().await;
    }
    assert_eq!(backend.held(), 1, "generation 1 still holds its request");
    backend.release();
    let answer = slow
        .await
        .expect("join")
        .expect("the slow request completes");
    assert_eq!(answer.status, 200);
    baton.settled().await;
    // One request, answered by generation 1 after generation 6 serves.
    assert_eq!(requests_total(&client::metrics(admin).await), 1.0);
}

/// An older generation still draining when the one between gave up
/// waiting for it (that one's own `reload.drain_timeout`) and exited stays
/// in `/status` and the draining gauges until it exits too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_outliving_the_one_between_stays_in_status() {
    let backend = HttpBackend::start("a").await;
    let spec = |drain: &str| {
        Spec::new()
            .section(&format!("[reload]\ndrain_timeout = \"{drain}\"\n"))
            .http("web", "app")
            .pool("app", &[backend.addr])
    };
    let baton = Baton::start(spec("20s")).await;
    let (web, admin) = (baton.addr("web"), baton.admin);
    let first = baton.serving_pid().await;
    // Held until the asserts are made, however long the reloads take.
    let slow = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the held request is on generation 1", || async {
        backend.held() == 1
    })
    .await;
    baton.write_spec(&spec("1s"), &HashMap::new());
    let between = baton.reload_ok().await;
    baton.reload_ok().await;
    assert_eq!(wait_exit(between).await, Some(0));
    // The one between leaves `/status` as its exit is seen (its channel
    // closes a moment before); the first stays, draining.
    let pids = || async {
        let v = client::status(admin).await;
        let generations = v["generations"].as_array().cloned().unwrap_or_default();
        generations
            .iter()
            .map(|g| (g["pid"].as_u64(), g["state"].as_str().map(str::to_string)))
            .collect::<Vec<_>>()
    };
    support::eventually("the one between gone from /status", || async {
        pids().await.len() == 2
    })
    .await;
    assert_eq!(
        pids().await[1],
        (Some(u64::from(first)), Some("draining".to_string()))
    );
    let metrics = scrape(admin).await.expect("scrape");
    assert!(
        metrics.contains("baton_draining_generations 1"),
        "{metrics}"
    );
    backend.release();
    assert_eq!(slow.await.expect("join").expect("slow").status, 200);
    assert_eq!(wait_exit(first).await, Some(0));
    old_generation_left_status(admin).await;
}

/// Requests refused before they could be routed (a malformed head, one
/// too large, one too slow) are answered, so counted, on the listener's
/// pool, as h2's refusals are, with their durations (the 408's at least
/// its `header_timeout`): the histogram's count is the requests'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_before_routing_are_counted_on_the_listeners_pool() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(
        Spec::new()
            .listener("web", "http", "app", "header_timeout = \"500ms\"")
            .pool("app", &[backend.addr]),
    )
    .await;
    let web = baton.addr("web");
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    for (sent, status) in [
        (
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_string(),
            "400",
        ),
        (huge, "431"),
        ("GET / HTTP/1.1\r\nHost: a\r\n".to_string(), "408"),
    ] {
        let mut s = tokio::net::TcpStream::connect(web).await.expect("connect");
        tokio::io::AsyncWriteExt::write_all(&mut s, sent.as_bytes())
            .await
            .expect("request");
        let seen = client::read_until_closed(&mut s).await;
        assert!(seen.starts_with(&format!("HTTP/1.1 {status}")), "{seen}");
    }
    let text = client::metrics(baton.admin).await;
    assert_eq!(
        counters(&text).get("baton_requests_total{listener=\"web\",pool=\"app\",code=\"4xx\"}"),
        Some(&3.0),
        "{}",
        text.lines()
            .filter(|l| l.starts_with("baton_requests_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let durations = counters(&text);
    let of = |part: &str| {
        durations
            .get(&format!(
                "baton_request_duration_seconds_{part}{{listener=\"web\",pool=\"app\"}}"
            ))
            .copied()
    };
    assert_eq!(of("count"), Some(3.0), "one duration a refusal");
    assert!(
        of("sum").is_some_and(|s| s >= 0.5),
        "the 408 waited: {:?}",
        of("sum")
    );
    assert_eq!(backend.hits(), 0);
}

/// A request's duration runs from its head to its response head (DESIGN:
/// "request head to response head"), not to the end of a body that may
/// stream for minutes; and a response that broke off after its head was
/// still answered, with its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_breaks_off_counts_with_its_time_to_the_head() {
    let backend = support::raw::RawBackend::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
            support::raw::Then::CloseAfter(Duration::from_secs(3)),
        )
    })
    .await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let mut s = tokio::net::TcpStream::connect(baton.addr("web"))
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut s, b"GET / HTTP/1.1\r\nhost: app\r\n\r\n")
        .await
        .expect("request");
    let seen = client::read_until_closed(&mut s).await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    let scraped = counters(&client::metrics(baton.admin).await);
    let series = |name: &str| {
        scraped
            .get(&format!("{name}{{listener=\"web\",pool=\"app\"}}"))
            .copied()
    };
    assert_eq!(series("baton_request_duration_seconds_count"), Some(1.0));
    let took = series("baton_request_duration_seconds_sum").unwrap_or(f64::NAN);
    assert!(took < 2.0, "{took} s: to the head, not to the break 3 s on");
    assert_eq!(requests_total(&client::metrics(baton.admin).await), 1.0);
}

/// After a reload the serving generation says when the last one succeeded
/// (DESIGN's `baton_last_reload_success_timestamp_seconds`): the older
/// generation, whose gauge is not carried, cannot say it. A first start
/// says when it loaded its config, as Prometheus does of its own: an
/// alert on the reload's age needs the series before any reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_generation_says_when_the_last_reload_succeeded() {
    let now = support::unix_now;
    let reloaded_at = |scraped: String| -> f64 {
        client::series(&scraped, "baton_last_reload_success_timestamp_seconds")
            .unwrap_or_else(|| panic!("no reload timestamp in:\n{scraped}"))
    };
    let backend = HttpBackend::start("a").await;
    let started = now();
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let at = reloaded_at(client::metrics(baton.admin).await);
    assert!(
        at >= started.floor(),
        "{at} is before the start ({started})"
    );
    let before = now();
    baton.reload_ok().await;
    baton.settled().await;
    let at = reloaded_at(client::metrics(baton.admin).await);
    assert!(at >= before.floor(), "{at} is before the reload ({before})");
}

/// A baton whose generation 1 holds a request the backend holds, so that
/// after a reload it drains until its deadline (5 s from the reload,
/// however long the reload took: a request of 5 s counted from before it,
/// and a loaded machine's reload could leave the test no old generation).
async fn with_a_held_request() -> (
    HttpBackend,
    Baton,
    tokio::task::JoinHandle<Result<client::Answer, String>>,
) {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let web = baton.addr("web");
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("the held request is on generation 1", || async {
        backend.held() == 1
    })
    .await;
    (backend, baton, held)
}

/// A backend drain posted on an admin connection opened before a reload,
/// and so answered by the old generation after the go-ahead, is refused
/// (503, and the connection closed) rather than taken by a generation that
/// no longer picks backends: its 200 said "draining" while the serving
/// generation went on sending the backend traffic. Sent again, the
/// serving generation takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_drain_posted_to_the_old_generation_after_the_handover_is_refused() {
    use tokio::io::AsyncWriteExt;
    let (_backend, baton, slow) = with_a_held_request().await;
    let admin = baton.admin;
    let (mut late, _) = probe_across_a_reload(&baton).await;
    late.write_all(
        b"POST /backends/app-0/drain HTTP/1.1\r\nhost: admin\r\ncontent-length: 0\r\n\r\n",
    )
    .await
    .expect("request");
    let answer = client::read_until_closed(&mut late).await.to_lowercase();
    assert!(answer.starts_with("http/1.1 503"), "{answer:?}");
    assert!(answer.contains("connection: close"), "{answer:?}");
    let state = |s: serde_json::Value| s["pools"][0]["backends"][0]["state"].clone();
    assert_eq!(state(client::status(admin).await), "up", "nothing changed");
    let again = client::call(admin, "POST", "/backends/app-0/drain", None)
        .await
        .expect("call");
    assert_eq!(again.status, 200, "{}", again.body);
    let now = state(client::status(admin).await);
    assert!(now == "draining" || now == "out", "{now}");
    drop(slow);
}

/// A scraper's kept-alive admin connection does not stay on a draining
/// generation: it is closed when the next generation takes the admin
/// socket, so the scraper's next request reaches the serving one, not the
/// draining one's metrics and `/status` for the whole drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_admin_connection_moves_to_the_serving_generation() {
    let (_backend, baton, slow) = with_a_held_request().await;
    let admin = baton.admin;
    let mut kept = client::connect(admin).await.expect("admin connection");
    let first = client::send(&mut kept, admin, "/status")
        .await
        .expect("status");
    assert!(first.body.contains("\"number\":1"), "{}", first.body);
    baton.reload_ok().await;
    support::eventually("the draining generation closed the kept connection", || {
        let closed = kept.is_closed();
        async move { closed }
    })
    .await;
    let status = client::status(admin).await;
    assert_eq!(status["generations"][0]["number"], 2, "{status}");
    drop(slow);
}

/// A connection to the admin socket the serving generation took (a
/// request on a second one is answered only once it did: the kernel
/// hands connections over in the order they came), then a reload: the
/// old generation holds the first one. Returns it and the new pid.
async fn probe_across_a_reload(baton: &Baton) -> (tokio::net::TcpStream, u32) {
    let probe = tokio::net::TcpStream::connect(baton.admin)
        .await
        .expect("connect");
    let after = client::get(baton.admin, "/healthz").await.expect("healthz");
    assert_eq!(after.status, 200);
    (probe, baton.reload_ok().await)
}

/// Asks `path` on `probe` and reads the answer to the close.
async fn ask(mut probe: tokio::net::TcpStream, path: &str) -> String {
    use tokio::io::AsyncWriteExt;
    probe
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: admin\r\n\r\n").as_bytes())
        .await
        .expect("request");
    client::read_until_closed(&mut probe).await
}

/// Connects to the admin socket, reloads, then asks `path` on that
/// connection: the old generation took it, so the old generation answers.
async fn asked_across_a_reload(baton: &Baton, path: &str) -> String {
    let (probe, _) = probe_across_a_reload(baton).await;
    ask(probe, path).await
}

/// An admin connection taken before the handover that has not sent its
/// request yet is still answered, once (`Connection: close`), not closed
/// unanswered: a probe that connected just before a reload gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_connection_open_at_the_handover_gets_its_one_answer() {
    let (_backend, baton, slow) = with_a_held_request().await;
    let answer = asked_across_a_reload(&baton, "/healthz")
        .await
        .to_lowercase();
    assert!(answer.starts_with("http/1.1 200"), "{answer:?}");
    assert!(answer.contains("connection: close"), "{answer:?}");
    drop(slow);
}

/// A readiness probe that reached the old generation (taken just before
/// the handover, asked after) is answered from the pools, as the serving
/// generation answers: a host with a pool down stays 503 across a reload
/// (it was 200 "draining" whatever the pools, a flip into service for a
/// moment at every reload), and a healthy one stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_probe_the_old_generation_answers_says_what_its_pools_say() {
    let (dead, _held) = support::daemon::dead_addr();
    for (pool_down, expected) in [(false, 200), (true, 503)] {
        let backend = HttpBackend::start("a").await;
        let mut spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
        if pool_down {
            let checks = "health = { kind = \"tcp\", interval = \"100ms\", timeout = \"500ms\", rise = 1, fall = 1 }";
            spec = spec
                .http("other", "gone")
                .pool_with("gone", checks, &[(dead, 1)]);
        }
        let baton = Baton::spawn(spec, &[]);
        let admin = baton.admin;
        support::eventually("/readyz settled", || async {
            client::get(admin, "/readyz")
                .await
                .is_ok_and(|r| r.status == expected)
        })
        .await;
        let web = baton.addr("web");
        let held = tokio::spawn(async move { client::get(web, "/gated").await });
        support::eventually("a request holds generation 1", || async {
            backend.held() == 1
        })
        .await;
        let answer = asked_across_a_reload(&baton, "/readyz").await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {expected} "))
                && answer.contains(r#""generation":"draining""#),
            "{answer:?}"
        );
        let serving = client::get(admin, "/readyz").await.expect("readyz");
        assert_eq!(serving.status, expected, "the serving generation's");
        backend.release();
        assert_eq!(held.await.expect("task").expect("answered").status, 200);
    }
}

/// A stop that reaches an old generation while it drains turns its
/// readiness to 503, as the serving generation's: a probe it still
/// answers (on a connection it took before the handover) read 200 while
/// the serving one said the host was stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_reaching_a_draining_generation_turns_its_readiness_to_503() {
    let backend = HttpBackend::start("a").await;
    let baton = Baton::start(Spec::new().http("web", "app").pool("app", &[backend.addr])).await;
    let web = baton.addr("web");
    let held = tokio::spawn(async move { client::get(web, "/gated").await });
    support::eventually("a request holds generation 1", || async {
        backend.held() == 1
    })
    .await;
    let (probe, serving) = probe_across_a_reload(&baton).await;
    // As systemd's stop: SIGTERM to every process of the unit.
    for pid in [serving, baton.first_pid] {
        support::daemon::signal(pid, nix::sys::signal::Signal::SIGTERM);
    }
    support::eventually("the draining generation heard the stop", || async {
        baton.log().contains("stop signal while draining")
    })
    .await;
    let answer = ask(probe, "/readyz").await;
    assert!(
        answer.starts_with("HTTP/1.1 503 ") && answer.contains(r#""status":"draining""#),
        "{answer:?}"
    );
    backend.release();
    drop(held);
}

/// `baton_tcp_bytes_total` moves while a TCP session lasts (every 64 KiB
/// a connection moves), not only as it ends: a session of days would
/// otherwise show no traffic all along, then all of it at once. At the
/// end it holds every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_bytes_count_while_the_session_lasts() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = support::backend::TcpEcho::start().await;
    let baton = Baton::start(Spec::new().tcp("raw", "echo").pool("echo", &[echo.addr])).await;
    let at_start = client::metrics(baton.admin).await;
    assert!(
        at_start.contains("baton_tcp_bytes_total{listener=\"raw\",direction=\"to_client\"} 0\n"),
        "the series is there from the start, at 0:\n{at_start}"
    );
    let mut session = tokio::net::TcpStream::connect(baton.addr("raw"))
        .await
        .expect("connect");
    let sent = vec![7u8; 100_000];
    let mut back = vec![0u8; sent.len()];
    let (mut reader, mut writer) = session.split();
    let (written, read) = tokio::join!(writer.write_all(&sent), async {
        let mut got = 0;
        while got < back.len() {
            match reader.read(&mut back[got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got
    });
    written.expect("write");
    assert_eq!(read, sent.len(), "echoed");
    let counted = |direction: &'static str| {
        let admin = baton.admin;
        async move {
            let series =
                format!("baton_tcp_bytes_total{{listener=\"raw\",direction=\"{direction}\"}} ");
            let text = client::metrics(admin).await;
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str())?.parse::<f64>().ok())
                .unwrap_or(0.0)
        }
    };
    for direction in ["to_backend", "to_client"] {
        support::eventually("bytes counted while the session is open", || async {
            counted(direction).await >= 65_536.0
        })
        .await;
    }
    // Still open: it echoes on; closed, every byte is counted.
    session.write_all(b"x").await.expect("write");
    session.read_exact(&mut back[..1]).await.expect("echoed");
    drop(session);
    for direction in ["to_backend", "to_client"] {
        support::eventually("every byte counted at the end", || async {
            counted(direction).await == 100_001.0
        })
        .await;
    }
}

/// A scrape makes no thread: `/metrics` is rendered on a thread made as
/// the admin starts. Rendered on tokio's blocking pool, a scrape made one
/// once the pool's last had idled out, and where none could be made (a
/// pid or thread limit reached) the scrape panicked with its render left
/// queued, holding the turn: every later scrape waited for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_makes_no_thread() {
    let backend = HttpBackend::start("a").await;
    let spec = Spec::new().http("web", "app").pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let threads = || {
        let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", baton.first_pid))
            .expect("baton's threads")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .collect();
        names.sort();
        names
    };
    let before = threads();
    for _ in 0..3 {
        let scrape = client::get(baton.admin, "/metrics").await.expect("scrape");
        assert_eq!(scrape.status, 200);
    }
    assert_eq!(threads(), before);
}
