//! Shared pieces of the benchmarks: an in-process backend, the proxies under
//! test (baton, HAProxy, nginx) started and reloaded the way their users do,
//! a raw HTTP/1.1 client that classifies every failure precisely, what the
//! benches read off wrk and /proc, and the tests' throwaway CA and rustls
//! client (one source for both).
#![allow(dead_code)]

pub mod backend;
pub mod client;
pub mod measure;
pub mod proxies;
#[path = "../../tests/support/tls.rs"]
pub mod tls;

pub use backend::start_backend;

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Raises this process's fd limit to room for `connections` through a
/// proxy (two fds each, and some to spare), within its hard limit; the
/// proxies started from here inherit it. At a fresh machine's 1,024 a
/// bench of 10,000 connections held about a thousand, and said so only in
/// passing. Not to the hard limit itself: HAProxy's `maxconn` follows the
/// limit, and sizes its tables by it.
pub fn raise_fd_limit(connections: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let wanted = u64::try_from(connections)
        .unwrap_or(u64::MAX)
        .saturating_mul(2)
        .saturating_add(4096);
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, wanted.clamp(soft, hard), hard);
    }
}

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
    serve_on_own_thread("echo", |mut stream| async move {
        let (mut r, mut w) = stream.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
    })
}

/// A WebSocket echo backend on its own runtime thread: it answers any
/// request head with a 101, then sends back each 1-byte frame it is sent
/// (unmasked, as a server's are). Its `Sec-WebSocket-Accept` is the one
/// for the key `benches/memory.rs` sends (RFC 6455 §1.3's example):
/// HAProxy answers a 101 without the right one with a 502.
pub fn start_websocket_backend() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    serve_on_own_thread("websocket", |mut stream| async move {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read_exact(&mut byte).await.is_err() {
                return;
            }
            head.push(byte[0]);
        }
        let switched =
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                         Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
        if stream.write_all(switched).await.is_err() {
            return;
        }
        let mut frame = [0u8; 7];
        while stream.read_exact(&mut frame).await.is_ok() {
            let payload = frame[6] ^ frame[2];
            if stream.write_all(&[0x81, 1, payload]).await.is_err() {
                return;
            }
        }
    })
}

/// Serves each connection to a new loopback port with `serve`, in a task
/// of a runtime on a thread of its own; returns the port's address.
fn serve_on_own_thread<F, Fut>(name: &'static str, serve: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{name} runtime: {e}"));
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("bind the {name} backend: {e}"));
            tx.send(listener.local_addr().expect("addr"))
                .expect("report addr");
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(stream));
                }
            }
        });
    });
    rx.recv()
        .unwrap_or_else(|e| panic!("{name} backend address: {e}"))
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
