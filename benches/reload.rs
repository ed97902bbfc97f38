//! `cargo bench --bench reload [-- --reloads N --interval-ms MS --profile steady|storm --tcp]`
//!
//! Failed requests per reload, for baton and (when installed) HAProxy and
//! nginx, under the same load and the same reload schedule: keep-alive
//! clients, connection-per-request clients and slow requests held across
//! reloads (profile `steady`), or a storm of new connections (`storm`).
//! Prints a table; it asserts nothing (benches never fail CI on speed).

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::client::{Conn, Failure};
use support::proxies::{Kind, Mode, Proxy};

/// One request's record: when it started (from the run's start), how it
/// went, and whether it was a deliberately slow one (kept out of latency).
type Record = (Duration, Result<Duration, Failure>, bool);

struct Profile {
    keep_alive: usize,
    keep_alive_pause: Duration,
    per_request: usize,
    per_request_pause: Duration,
    slow: usize,
}

fn profile(name: &str) -> Profile {
    match name {
        "storm" => Profile {
            keep_alive: 0,
            keep_alive_pause: Duration::ZERO,
            per_request: 24,
            per_request_pause: Duration::ZERO,
            slow: 0,
        },
        _ => Profile {
            keep_alive: 24,
            keep_alive_pause: Duration::from_millis(6),
            per_request: 8,
            per_request_pause: Duration::from_millis(8),
            slow: 4,
        },
    }
}

async fn client(
    addr: SocketAddr,
    keep: bool,
    path: &'static str,
    pause: Duration,
    start: Instant,
    end: Instant,
    out: Arc<Mutex<Vec<Record>>>,
) {
    let mut conn: Option<Conn> = None;
    let mut local = Vec::new();
    while Instant::now() < end {
        let t0 = Instant::now();
        let result = async {
            let c = match conn.take() {
                Some(c) => c,
                None => Conn::open(addr).await?,
            };
            let mut c = c;
            let reusable = c.get(path).await?;
            if keep && reusable {
                conn = Some(c);
            }
            Ok::<_, Failure>(())
        }
        .await;
        local.push((
            t0 - start,
            result.map(|()| t0.elapsed()),
            path.starts_with("/slow"),
        ));
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    if let Ok(mut o) = out.lock() {
        o.extend(local);
    }
}

struct Outcome {
    records: Vec<Record>,
    reloads: Vec<Duration>,
    handoffs: Vec<Duration>,
}

async fn tcp_client(addr: SocketAddr, start: Instant, end: Instant, out: Arc<Mutex<Vec<Record>>>) {
    let mut local = Vec::new();
    while Instant::now() < end {
        let t0 = Instant::now();
        let result = support::client::echo_session(addr).await;
        local.push((t0 - start, result.map(|()| t0.elapsed()), false));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    if let Ok(mut o) = out.lock() {
        o.extend(local);
    }
}

async fn run(
    kind: Kind,
    backend: SocketAddr,
    p: &Profile,
    reloads: u32,
    interval: Duration,
    tcp: bool,
) -> Outcome {
    let mode = if tcp { Mode::Tcp } else { Mode::Http };
    let proxy = Proxy::start_mode(kind, support::free_port(), backend, 2, None, mode);
    let addr = proxy.addr;
    let start = Instant::now();
    let warmup = Duration::from_secs(1);
    let end = start + warmup + interval * reloads + Duration::from_secs(1);
    let records = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    if tcp {
        for _ in 0..(p.keep_alive + p.per_request).max(8) {
            tasks.push(tokio::spawn(tcp_client(
                addr,
                start,
                end,
                Arc::clone(&records),
            )));
        }
    }
    for _ in 0..if tcp { 0 } else { p.keep_alive } {
        tasks.push(tokio::spawn(client(
            addr,
            true,
            "/k",
            p.keep_alive_pause,
            start,
            end,
            Arc::clone(&records),
        )));
    }
    for _ in 0..if tcp { 0 } else { p.per_request } {
        tasks.push(tokio::spawn(client(
            addr,
            false,
            "/n",
            p.per_request_pause,
            start,
            end,
            Arc::clone(&records),
        )));
    }
    for _ in 0..if tcp { 0 } else { p.slow } {
        tasks.push(tokio::spawn(client(
            addr,
            true,
            "/slow/700",
            Duration::ZERO,
            start,
            end,
            Arc::clone(&records),
        )));
    }
    tokio::time::sleep(warmup).await;
    let (mut at, mut handoffs) = (Vec::new(), Vec::new());
    for _ in 0..reloads {
        at.push(start.elapsed());
        if let Some(h) = proxy.reload().await {
            handoffs.push(h);
        }
        tokio::time::sleep_until((start + warmup + interval * at.len() as u32).into()).await;
    }
    for t in tasks {
        let _ = t.await;
    }
    drop(proxy);
    let records = records.lock().map(|r| r.clone()).unwrap_or_default();
    Outcome {
        records,
        reloads: at,
        handoffs,
    }
}

fn report(kind: Kind, o: &Outcome, reloads: u32) {
    let mut failures: BTreeMap<Failure, u64> = BTreeMap::new();
    let (mut steady, mut during) = (Vec::new(), Vec::new());
    let window = Duration::from_millis(500);
    for (t, r, slow) in &o.records {
        match r {
            Ok(_) if *slow => {}
            Ok(lat) => {
                let in_window = o.reloads.iter().any(|r| *t >= *r && *t < *r + window);
                if in_window { &mut during } else { &mut steady }.push(lat.as_micros() as u64);
            }
            Err(f) => *failures.entry(*f).or_default() += 1,
        }
    }
    steady.sort_unstable();
    during.sort_unstable();
    let failed: u64 = failures.values().sum();
    let kinds: Vec<String> = failures.iter().map(|(k, n)| format!("{k:?} {n}")).collect();
    let mut handoffs: Vec<u64> = o.handoffs.iter().map(|d| d.as_micros() as u64).collect();
    handoffs.sort_unstable();
    let handoff = if handoffs.is_empty() {
        "-".to_string()
    } else {
        format!(
            "{:.1}/{:.1} ms",
            support::pct(&handoffs, 0.5),
            support::pct(&handoffs, 1.0)
        )
    };
    println!(
        "| {:<24} | {:>8} | {:>6} | {:>8.2} | {:<22} | {:.2}/{:.2}/{:.2}/{:.1} | {:.2}/{:.2}/{:.2}/{:.1} | {} |",
        kind.name(),
        o.records.len(),
        failed,
        failed as f64 / f64::from(reloads.max(1)),
        if kinds.is_empty() { "-".to_string() } else { kinds.join(", ") },
        support::pct(&steady, 0.5),
        support::pct(&steady, 0.99),
        support::pct(&steady, 0.999),
        support::pct(&steady, 1.0),
        support::pct(&during, 0.5),
        support::pct(&during, 0.99),
        support::pct(&during, 0.999),
        support::pct(&during, 1.0),
        handoff
    );
}

fn main() {
    // Built before anything is pinned or any runtime runs (see `shipped_baton`).
    support::proxies::shipped_baton();
    let reloads: u32 = support::arg("--reloads", 20);
    let interval = Duration::from_millis(support::arg("--interval-ms", 500));
    let profile_name: String = support::arg("--profile", "steady".to_string());
    let p = profile(&profile_name);
    let tcp = std::env::args().any(|a| a == "--tcp");
    let backend = if tcp {
        support::start_echo_backend()
    } else {
        support::start_backend(1, &[]).addr
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mode = if tcp { "TCP echo sessions" } else { "HTTP/1.1" };
    println!("reload bench: profile {profile_name}, {reloads} reloads every {interval:?}, {mode}, loopback, 2 worker threads each");
    println!("latency ms p50/p99/p99.9/max; \"during\" = requests started within 500 ms after a reload began");
    println!("| system | requests | failed | per reload | failures by kind | steady latency | during reloads | handoff p50/max |");
    println!("| --- | ---: | ---: | ---: | --- | --- | --- | --- |");
    for kind in [Kind::Baton, Kind::Haproxy, Kind::Nginx] {
        if tcp && kind == Kind::Nginx {
            println!("| {:<24} | skipped: TCP needs nginx's stream module, not in Debian's nginx package |", kind.name());
            continue;
        }
        if !kind.available() {
            println!(
                "| {:<24} | not installed (benches/peers/setup.sh) |",
                kind.name()
            );
            continue;
        }
        let outcome = rt.block_on(run(kind, backend, &p, reloads, interval, tcp));
        report(kind, &outcome, reloads);
    }
}
