//! `cargo bench --bench throughput [-- --seconds S]`
//!
//! Requests per second and latency through baton, HAProxy and nginx, and
//! straight to the backend, measured with wrk (Debian's package): HTTP/1.1
//! keep-alive, and a new connection per request. Each proxy runs alone on
//! core 0 with one worker; wrk runs on core 1. The direct-to-backend rate
//! shows the load generator is not the bottleneck (it must be well above
//! every proxy's). Prints a table; it asserts nothing.

#[path = "support/mod.rs"]
mod support;

use std::process::Command;

use support::proxies::{Kind, Proxy};

struct Run {
    rps: f64,
    p50: String,
    p99: String,
}

fn wrk(url: &str, seconds: u32, close: bool) -> Option<Run> {
    let mut cmd = Command::new("taskset");
    cmd.args([
        "-c",
        "1",
        "wrk",
        "-t2",
        "-c64",
        &format!("-d{seconds}s"),
        "--latency",
    ]);
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    let out = cmd.arg(url).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())?;
    let latency = |p: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(p))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("-")
            .to_string()
    };
    Some(Run {
        rps,
        p50: latency("50%"),
        p99: latency("99%"),
    })
}

fn main() {
    let seconds: u32 = support::arg("--seconds", 5);
    if !std::path::Path::new("/usr/bin/wrk").exists() {
        println!("throughput bench needs wrk: benches/peers/setup.sh");
        return;
    }
    let backend = support::start_backend(1);
    println!("throughput bench: wrk -t2 -c64 -d{seconds}s on core 1; each proxy alone on core 0, one worker; 3-byte responses");
    println!("| system | keep-alive req/s | p50 | p99 | new connection req/s | p50 | p99 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for kind in [Kind::Direct, Kind::Baton, Kind::Haproxy, Kind::Nginx] {
        if !kind.available() {
            println!("| {} | not installed | | | | | |", kind.name());
            continue;
        }
        let proxy = Proxy::start(kind, support::free_port(), backend, 1, Some(0));
        let url = format!("http://{}/", proxy.addr);
        let keep = wrk(&url, seconds, false);
        let close = wrk(&url, seconds, true);
        let cell = |r: &Option<Run>| match r {
            Some(r) => format!("{:.0} | {} | {}", r.rps, r.p50, r.p99),
            None => "failed | - | -".into(),
        };
        println!("| {} | {} | {} |", kind.name(), cell(&keep), cell(&close));
    }
}
