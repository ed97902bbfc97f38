//! `cargo bench --bench throughput [-- --seconds S --threads N]`
//!
//! Requests per second and latency through baton, HAProxy and nginx, and
//! straight to the backend: HTTP/1.1 keep-alive and a new connection per
//! request (wrk), h2c with prior knowledge, 64 connections x 10 streams
//! (h2load; the backend speaks h2c too), and TCP mode carrying HTTP/1.1
//! keep-alive (wrk). Each proxy runs alone on core 0 with one worker; the
//! load generator runs on core 1 (with `--threads N`, N > 1: N workers, and
//! proxy and load free on every core). The direct-to-backend rate shows the
//! load generator is not the bottleneck (it must be well above every
//! proxy's). The backend runs with the load, so a pinned proxy has its
//! core to itself. Each cell also gives the proxy's CPU time per request,
//! user + kernel (all its processes, from /proc): the figure that says how
//! much a core carries, whatever the noise in the rates; and what each
//! request cost the backend (its CPU time, connections it accepted, reads
//! it made): a proxy should not make its backend work harder than its
//! peers do.
//! Prints a table; it asserts nothing.

#[path = "support/mod.rs"]
mod support;

use std::process::Command;

use support::backend::Backend;
use support::measure::{cell, cpu_during, wrk, Run};
use support::proxies::{Kind, Mode, Proxy};

/// Where the proxy and the load run: one worker pinned to core 0 with the
/// load on core 1, or (`--threads N`, N > 1) N workers and the load both
/// free on every core.
struct Layout {
    threads: usize,
    /// Core of the proxy, if pinned.
    proxy_core: Option<usize>,
    /// `taskset -c` list for the load generator.
    load_cpus: &'static str,
    /// Where the backend runs (with the load; empty: anywhere).
    backend_cpus: &'static [usize],
}

impl Layout {
    fn for_threads(threads: usize) -> Layout {
        if threads <= 1 {
            Layout {
                threads: 1,
                proxy_core: Some(0),
                load_cpus: "1",
                backend_cpus: &[1],
            }
        } else {
            Layout {
                threads,
                proxy_core: None,
                load_cpus: "0,1",
                backend_cpus: &[],
            }
        }
    }

    fn describe(&self) -> String {
        match self.proxy_core {
            Some(core) => format!(
                "load and backend on core {} (wrk -t2 -c64; h2load -t2 -c64 -m10); each proxy alone on core {core}, one worker",
                self.load_cpus
            ),
            None => format!(
                "load and proxies on every core (wrk -t2 -c64; h2load -t2 -c64 -m10); each proxy with {} workers",
                self.threads
            ),
        }
    }
}

/// h2load prints no percentiles: they come from its per-request log
/// (tab-separated; the third column is the request's time in µs).
fn h2load(url: &str, seconds: u32, cpus: &str) -> Option<Run> {
    let log = tempfile::NamedTempFile::new().ok()?;
    let out = Command::new("taskset")
        .args(["-c", cpus, "h2load", "-t2", "-c64", "-m10"])
        .arg(format!("-D{seconds}"))
        .arg(format!("--log-file={}", log.path().display()))
        .arg(url)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|v| v.trim_end_matches(" req/s").parse().ok())?;
    let counts = text
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .unwrap_or_default();
    let count = |what: &str| counts.split(", ").find(|f| f.ends_with(what));
    let failed = count(" failed").unwrap_or("? failed").to_string();
    let requests = count(" succeeded")
        .and_then(|f| f.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let mut micros: Vec<u64> = std::fs::read_to_string(log.path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.trim().parse().ok())
        .collect();
    micros.sort_unstable();
    Some(Run {
        rps,
        requests,
        latency: format!(
            "p50 {:.2}ms, p99 {:.2}ms, {failed}",
            support::pct(&micros, 0.50),
            support::pct(&micros, 0.99)
        ),
    })
}

/// Runs `load` and gives its cell: the rate and latency, the proxy's CPU
/// per request, and what each request cost the backend.
fn observed(proxy: &Proxy, backend: &Backend, load: impl FnOnce() -> Option<Run>) -> String {
    let before = backend.usage();
    let (run, cpu) = cpu_during(proxy, load);
    let requests = run.as_ref().map_or(0.0, |r| r.requests);
    let spent = backend.usage().per_request(&before, requests);
    format!("{}{spent}", cell(run, cpu))
}

fn measure(kind: Kind, backend: &Backend, mode: Mode, seconds: u32, layout: &Layout) -> String {
    let supported = match mode {
        Mode::Http => true,
        Mode::H2c => true,
        Mode::Tcp => kind != Kind::Nginx,
        // benches/tls.rs measures HTTPS.
        Mode::Https => false,
    };
    if !supported {
        return "n/a".into();
    }
    let proxy = Proxy::start_mode(
        kind,
        support::free_port(),
        backend.addr,
        layout.threads,
        layout.proxy_core,
        mode,
    );
    let url = format!("http://{}/", proxy.addr);
    let cpus = layout.load_cpus;
    match mode {
        Mode::Http => format!(
            "{} | {}",
            observed(&proxy, backend, || wrk(&url, seconds, false, cpus)),
            observed(&proxy, backend, || wrk(&url, seconds, true, cpus))
        ),
        Mode::H2c => observed(&proxy, backend, || h2load(&url, seconds, cpus)),
        Mode::Tcp | Mode::Https => observed(&proxy, backend, || wrk(&url, seconds, false, cpus)),
    }
}

fn main() {
    let seconds: u32 = support::arg("--seconds", 5);
    let layout = Layout::for_threads(support::arg("--threads", 1));
    for tool in ["/usr/bin/wrk", "/usr/bin/h2load"] {
        if !std::path::Path::new(tool).exists() {
            println!("throughput bench needs {tool}: benches/peers/setup.sh");
            return;
        }
    }
    let backend = support::start_backend(1, layout.backend_cpus);
    println!(
        "throughput bench: {seconds}s per cell; {}; 3-byte responses",
        layout.describe()
    );
    println!("| system | HTTP/1.1 keep-alive req/s | new connection req/s | h2c req/s | TCP mode (HTTP/1.1 keep-alive inside) req/s |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for kind in [Kind::Direct, Kind::Baton, Kind::Haproxy, Kind::Nginx] {
        if !kind.available() {
            println!("| {} | not installed | | | |", kind.name());
            continue;
        }
        let cells: Vec<String> = [Mode::Http, Mode::H2c, Mode::Tcp]
            .into_iter()
            .map(|mode| measure(kind, &backend, mode, seconds, &layout))
            .collect();
        println!("| {} | {} |", kind.name(), cells.join(" | "));
    }
}
