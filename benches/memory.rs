//! `cargo bench --bench memory [-- --connections N]`
//!
//! Resident memory of baton, HAProxy and nginx: idle, and holding N idle
//! HTTP keep-alive client connections (default 5,000: each side of a
//! loopback connection is an fd, and this machine allows 20,000 per
//! process). Prints the per-connection cost; it asserts nothing.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use support::client::Conn;
use support::proxies::{Kind, Proxy};

fn rss_kib(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

fn main() {
    let connections: usize = support::arg("--connections", 5000);
    let backend = support::start_backend(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("memory bench: RSS (all processes of each proxy), idle and with {connections} idle keep-alive connections");
    println!("| system | idle RSS | RSS with {connections} connections | per connection |");
    println!("| --- | ---: | ---: | ---: |");
    for kind in [Kind::Baton, Kind::Haproxy, Kind::Nginx] {
        if !kind.available() {
            println!("| {} | not installed | | |", kind.name());
            continue;
        }
        let proxy = Proxy::start(kind, support::free_port(), backend, 1, None);
        std::thread::sleep(Duration::from_millis(300));
        let idle = rss_kib(&proxy.pids());
        let addr = proxy.addr;
        let held = rt.block_on(async move {
            let mut held = Vec::new();
            for _ in 0..connections {
                let Ok(mut c) = Conn::open(addr).await else {
                    break;
                };
                if c.get("/").await.is_ok() {
                    held.push(c);
                }
            }
            held
        });
        std::thread::sleep(Duration::from_millis(300));
        let loaded = rss_kib(&proxy.pids());
        let per = (loaded.saturating_sub(idle)) as f64 * 1024.0 / held.len().max(1) as f64;
        println!(
            "| {} | {:.1} MiB | {:.1} MiB ({} held) | {:.1} KiB |",
            kind.name(),
            idle as f64 / 1024.0,
            loaded as f64 / 1024.0,
            held.len(),
            per / 1024.0
        );
        drop(held);
    }
}
