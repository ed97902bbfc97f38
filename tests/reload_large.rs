//! A large config reloads like a small one: the handoff carries whatever
//! the offer and the metrics report weigh (no fixed message ceiling), and
//! series of listeners, pools and backends the new config no longer has
//! are dropped at the reload instead of being carried forever.

mod support;

use std::collections::HashMap;

use support::backend::HttpBackend;
use support::client;
use support::daemon::{Baton, Spec};

const LISTENERS: usize = 50;
const POOLS: usize = 10;
const BACKENDS_PER_POOL: usize = 100;

/// 50 HTTP listeners over 10 pools of 100 backends (1,000 in all) that
/// alternate between two real servers. Its metrics report is megabytes
/// (every listener has request series for every pool it can route to).
fn large_spec(a: &HttpBackend, b: &HttpBackend) -> Spec {
    let backends: Vec<_> = (0..BACKENDS_PER_POOL)
        .map(|j| if j % 2 == 0 { a.addr } else { b.addr })
        .collect();
    let spec = (0..POOLS).fold(Spec::new(), |spec, p| {
        spec.pool(&format!("p{p}"), &backends)
    });
    (0..LISTENERS).fold(spec, |spec, i| {
        spec.http(&format!("l{i}"), &format!("p{}", i % POOLS))
    })
}

/// A few requests on a few listeners, each answered by a real backend.
async fn traffic(baton: &Baton) {
    for listener in ["l0", "l17", "l49"] {
        for _ in 0..4 {
            let answer = client::get(baton.addr(listener), "/x")
                .await
                .unwrap_or_else(|e| panic!("{listener}: {e}"));
            assert_eq!(answer.status, 200, "{listener}: {answer:?}");
            assert!(
                answer.body == HttpBackend::body_for("a", "/x")
                    || answer.body == HttpBackend::body_for("b", "/x"),
                "{listener}: {}",
                answer.body
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_listeners_and_a_thousand_backends_reload_ten_times() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let baton = Baton::start(large_spec(&a, &b)).await;
    traffic(&baton).await;
    let mut pid = baton.serving_pid().await;
    for _ in 0..10 {
        let new = baton.reload_ok().await;
        assert_ne!(new, pid, "a new generation serves");
        pid = new;
        traffic(&baton).await;
    }
    let text = client::metrics(baton.admin).await;
    let served: f64 = text
        .lines()
        .filter(|l| l.starts_with("baton_requests_total{listener=\"l17\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(served, 44.0, "counted across every generation:\n{text}");
}

/// Counter and histogram lines of a scrape that mention `needle`. (The
/// draining-connections gauge is sampled, not carried: it is left out.)
fn carried_lines<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(needle))
        .filter(|l| !l.starts_with("baton_connections_active"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_of_what_a_reload_removed_are_dropped() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let kept = Spec::new().http("web", "app").pool("app", &[a.addr]);
    let before = Spec::new()
        .http("web", "app")
        .http("old", "gone")
        .pool("app", &[a.addr, b.addr])
        .pool("gone", &[b.addr]);
    let baton = Baton::start(before).await;
    for listener in ["web", "old"] {
        for _ in 0..4 {
            let answer = client::get(baton.addr(listener), "/x").await.expect("get");
            assert_eq!(answer.status, 200, "{answer:?}");
        }
    }
    let text = client::metrics(baton.admin).await;
    for needle in ["listener=\"old\"", "pool=\"gone\"", "backend=\"app-1\""] {
        assert!(
            !carried_lines(&text, needle).is_empty(),
            "{needle}:\n{text}"
        );
    }

    baton.write_spec(&kept, &HashMap::new());
    baton.reload_ok().await;
    // Once with the offer's report, once more after the old generation's
    // last report as it exits.
    for when in ["after the reload", "once the old generation left"] {
        let text = client::metrics(baton.admin).await;
        for needle in ["listener=\"old\"", "pool=\"gone\"", "backend=\"app-1\""] {
            let stale = carried_lines(&text, needle);
            assert!(stale.is_empty(), "{when}: {needle} kept: {stale:#?}");
        }
        let web = carried_lines(&text, "baton_requests_total{listener=\"web\"");
        assert!(
            web.iter().any(|l| l.ends_with(" 4")),
            "{when}: the web listener's count is carried: {web:#?}"
        );
        baton.settled().await;
    }
}

/// More sockets than one datagram can carry (four listeners of 64 shards:
/// 256, with admin and control 258) cross a reload in one offer: the new
/// generation holds the very same listening sockets, and serves on each.
/// (No more: the old generation holds each about three times over at the
/// offer, under a common 1024-fd soft limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_hands_over_more_sockets_than_a_datagram_carries() {
    let backend = HttpBackend::start("a").await;
    let names: Vec<String> = (0..4).map(|i| format!("web{i}")).collect();
    let spec = names
        .iter()
        .fold(Spec::new().top("workers = 1"), |spec, name| {
            spec.listener(name, "http", "app", "reuseport = 64")
        })
        .pool("app", &[backend.addr]);
    let baton = Baton::start(spec).await;
    let ports: Vec<u16> = names.iter().map(|n| baton.addr(n).port()).collect();
    let before: Vec<Vec<u64>> = ports
        .iter()
        .map(|p| support::listening_inodes(*p))
        .collect();
    assert!(before.iter().all(|shards| shards.len() == 64), "{before:?}");
    let old = baton.serving_pid().await;
    assert_ne!(baton.reload_ok().await, old);
    let after: Vec<Vec<u64>> = ports
        .iter()
        .map(|p| support::listening_inodes(*p))
        .collect();
    assert_eq!(after, before, "the same kernel sockets listen");
    for name in &names {
        let answer = client::get(baton.addr(name), "/x").await.expect("served");
        assert_eq!(answer.status, 200, "{name}");
    }
}

/// Scrapes of a large config's `/metrics` in a loop, 32 at once, leave the
/// health checks on time: each render runs on a blocking thread, one at a
/// time. Rendered on the admin's thread, which the checks share, a check
/// waited behind the queued renders past its timeout, and a healthy
/// backend went down. (Not one failure asked: the backend answers from the
/// test's own runtime, beside the 32 scrapers, and a loaded machine may
/// keep one check past its 500 ms; three in a row would take it down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_in_a_loop_leave_the_health_checks_on_time() {
    let (a, b) = (HttpBackend::start("a").await, HttpBackend::start("b").await);
    let checks = "health = { kind = \"http\", path = \"/\", interval = \"100ms\", timeout = \"500ms\", rise = 1, fall = 3 }";
    let spec = large_spec(&a, &b)
        .pool_with("checked", checks, &[(a.addr, 1)])
        .http("lc", "checked");
    let baton = Baton::start(spec).await;
    let admin = baton.admin;
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let scrapers: Vec<_> = (0..32)
        .map(|_| {
            tokio::spawn(async move {
                let mut scrapes = 0u32;
                while tokio::time::Instant::now() < until {
                    client::metrics(admin).await;
                    scrapes += 1;
                }
                scrapes
            })
        })
        .collect();
    let mut scrapes = 0;
    for scraper in scrapers {
        scrapes += scraper.await.expect("scraper");
    }
    let text = client::metrics(admin).await;
    let of = |result: &str| {
        let series = format!(
            "baton_health_checks_total{{pool=\"checked\",backend=\"checked-0\",result=\"{result}\"}}"
        );
        client::series(&text, &series)
    };
    assert!(
        of("ok").is_some_and(|n| n >= 10.0),
        "checks ran: {:?}",
        of("ok")
    );
    let (ok, failed) = (of("ok").unwrap_or(0.0), of("failed").unwrap_or(0.0));
    assert!(
        failed * 5.0 <= ok,
        "{failed} of {} checks failed, {scrapes} scrapes",
        ok + failed
    );
    assert!(
        !baton.log().contains("backend is down"),
        "{scrapes} scrapes:\n{}",
        baton.log()
    );
}
