//! Shared pieces of the benchmarks: an in-process backend, the proxies under
//! test (baton, HAProxy, nginx) started and reloaded the way their users do,
//! a raw HTTP/1.1 client that classifies every failure precisely, what the
//! benches read off wrk and /proc, and the tests' throwaway CA and rustls
//! client (one source for both).
#![allow(dead_code)]

pub mod client;
pub mod measure;
pub mod proxies;
#[path = "../../tests/support/tls.rs"]
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// This process's soft fd limit (the proxies it starts inherit it).
pub fn fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(1024)
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Starts an HTTP/1.1 and h2c backend answering `ok\n` (3 bytes), or after `MS` ms on
/// `/slow/MS`, on its own runtime thread so it does not share the load
/// generator's scheduler. With `cpus`, its threads run only there (the
/// runtime's threads inherit the pinning of the thread that builds it), so
/// it cannot take time from a proxy pinned elsewhere.
pub fn start_backend(worker_threads: usize, cpus: &[usize]) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    let cpus = cpus.to_vec();
    std::thread::spawn(move || {
        pin_this_thread(&cpus);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads)
            .enable_all()
            .build()
            .expect("backend runtime");
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind backend");
            tx.send(listener.local_addr().expect("addr"))
                .expect("report addr");
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let service = service_fn(|req: Request<hyper::body::Incoming>| async move {
                        if let Some(ms) = req
                            .uri()
                            .path()
                            .strip_prefix("/slow/")
                            .and_then(|m| m.parse().ok())
                        {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
                    });
                    // HTTP/1.1 and h2c (prior knowledge), so h2c can be
                    // measured straight to the backend too.
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    rx.recv().expect("backend address")
}

/// Runs the calling thread (and threads it starts) only on `cpus`; empty:
/// anywhere.
pub fn pin_this_thread(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu).expect("cpu number in range");
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("pin backend");
}

/// Starts a TCP echo backend on its own runtime thread.
pub fn start_echo_backend() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("echo runtime");
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
            tx.send(listener.local_addr().expect("addr"))
                .expect("report addr");
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
    });
    rx.recv().expect("echo address")
}

/// Percentile of sorted microseconds, in milliseconds.
pub fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

/// `--name value` from the bench's arguments.
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
