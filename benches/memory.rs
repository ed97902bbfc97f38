//! `cargo bench --bench memory [-- --connections N]`
//!
//! Resident memory of baton, HAProxy and nginx: idle, holding N idle HTTP
//! keep-alive client connections (each has answered one request), as many
//! idle h2c connections (the same), N idle WebSockets (each upgraded and
//! has echoed one frame) and, in TCP mode, N idle proxied connections
//! (each has echoed one byte). Default N = 10,000. A WebSocket or a
//! TCP-mode connection costs a proxy two fds (it has its backend
//! connection too), so there N is capped to fit the fd limit (20,000 on
//! this machine kind, which even root cannot raise); their backends run
//! in a process of their own for the same reason. Prints the
//! per-connection cost; it asserts nothing.

#[path = "support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::client::Conn;
use support::measure::rss_kib;
use support::proxies::{Kind, Mode, Proxy};

/// A TCP echo server and a WebSocket one in a child process (this bench
/// binary, re-run with `--echo-server`), killed on drop.
struct EchoProcess {
    child: std::process::Child,
    addr: SocketAddr,
    websocket: SocketAddr,
}

impl EchoProcess {
    fn start() -> EchoProcess {
        let mut child = std::process::Command::new(std::env::current_exe().expect("own path"))
            .arg("--echo-server")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the echo process");
        let stdout = child.stdout.take().expect("echo stdout");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        let mut next_addr = || -> SocketAddr {
            let line = lines.next().expect("an address").expect("an address");
            line.trim().parse().expect("echo address")
        };
        let addr = next_addr();
        let websocket = next_addr();
        EchoProcess {
            child,
            addr,
            websocket,
        }
    }
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Something held open through the proxy: an HTTP keep-alive connection,
/// an h2c connection (its client and the task that drives it) or a TCP
/// stream (TCP mode's, or an upgraded one's).
enum Held {
    Http(Conn),
    H2c(h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>),
    Tcp(TcpStream),
}

async fn open(addr: SocketAddr, mode: Mode) -> Option<Held> {
    tokio::time::timeout(Duration::from_secs(2), open_one(addr, mode))
        .await
        .ok()
        .flatten()
}

async fn open_one(addr: SocketAddr, mode: Mode) -> Option<Held> {
    match mode {
        Mode::Tcp => {
            let mut s = TcpStream::connect(addr).await.ok()?;
            s.write_all(b"x").await.ok()?;
            let mut echo = [0u8; 1];
            s.read_exact(&mut echo).await.ok()?;
            Some(Held::Tcp(s))
        }
        Mode::WebSocket => upgraded(addr).await.map(Held::Tcp),
        // benches/tls.rs measures idle TLS connections.
        Mode::Https => None,
        Mode::Http => {
            let mut c = Conn::open(addr).await.ok()?;
            c.get("/").await.ok()?.then_some(Held::Http(c))
        }
        Mode::H2c => h2c_answered(addr).await,
    }
}

/// A connection switched to WebSocket that has echoed one frame (its key
/// RFC 6455 §1.3's example, whose accept the backend knows).
async fn upgraded(addr: SocketAddr) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let request = "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                   Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    s.write_all(request.as_bytes()).await.ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.ok()?;
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        return None;
    }
    // A text frame of one byte, masked as a client's must be.
    s.write_all(&[0x81, 0x81, 7, 7, 7, 7, b'x' ^ 7])
        .await
        .ok()?;
    let mut echo = [0u8; 3];
    s.read_exact(&mut echo).await.ok()?;
    (echo == [0x81, 1, b'x']).then_some(s)
}

/// An h2c connection (prior knowledge) that has answered one GET whole.
async fn h2c_answered(addr: SocketAddr) -> Option<Held> {
    let tcp = TcpStream::connect(addr).await.ok()?;
    let (mut client, connection) = h2::client::handshake(tcp).await.ok()?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::get(format!("http://{addr}/"))
        .body(())
        .ok()?;
    let (response, _) = client.send_request(request, true).ok()?;
    let response = response.await.ok()?;
    let ok = response.status().is_success();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        body.flow_control().release_capacity(chunk.len()).ok()?;
    }
    ok.then_some(Held::H2c(client, driver))
}

fn row(rt: &tokio::runtime::Runtime, kind: Kind, backend: SocketAddr, mode: Mode, n: usize) {
    let proxy = Proxy::start_mode(kind, support::free_port(), backend, 1, None, mode);
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss_kib(&proxy.pids());
    let addr = proxy.addr;
    let held = rt.block_on(async move {
        let mut held = Vec::new();
        for _ in 0..n {
            match open(addr, mode).await {
                Some(one) => held.push(one),
                None => break,
            }
        }
        held
    });
    std::thread::sleep(Duration::from_millis(500));
    let loaded = rss_kib(&proxy.pids());
    // None held is a failure to say, not a figure (a proxy that refused
    // every one, as HAProxy does a 101 it finds wrong).
    let per = if held.is_empty() {
        "none held".to_string()
    } else {
        format!(
            "{:.1} KiB",
            loaded.saturating_sub(idle) as f64 / held.len() as f64
        )
    };
    let what = match mode {
        Mode::Tcp => "TCP",
        Mode::H2c => "h2c",
        Mode::WebSocket => "WebSocket",
        _ => "HTTP",
    };
    println!(
        "| {} | {what} | {:.1} MiB | {:.1} MiB ({} held) | {per} |",
        kind.name(),
        idle as f64 / 1024.0,
        loaded as f64 / 1024.0,
        held.len(),
    );
    for one in held {
        match one {
            Held::Http(c) => drop(c),
            Held::H2c(client, driver) => {
                drop(client);
                driver.abort();
            }
            Held::Tcp(s) => drop(s),
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--echo-server") {
        println!("{}", support::start_echo_backend());
        println!("{}", support::start_websocket_backend());
        loop {
            std::thread::park();
        }
    }
    // Built before anything is pinned (see `shipped_baton`).
    support::proxies::shipped_baton();
    let connections: usize = support::arg("--connections", 10_000);
    support::raise_fd_limit(connections);
    let tcp_connections = connections.min(support::fd_limit().saturating_sub(200) / 2);
    let backend = support::start_backend(1, &[]).addr;
    let echo = EchoProcess::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("memory bench: RSS (all processes of each proxy), idle and with {connections} idle HTTP (or h2c) connections ({tcp_connections} WebSockets or TCP-mode ones: the fd limit is {})", support::fd_limit());
    println!("| system | mode | idle RSS | RSS with the connections | per connection |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for kind in [Kind::Baton, Kind::Haproxy, Kind::Nginx] {
        if !kind.available() {
            println!("| {} | | not installed | | |", kind.name());
            continue;
        }
        row(&rt, kind, backend, Mode::Http, connections);
        row(&rt, kind, backend, Mode::H2c, connections);
        row(&rt, kind, echo.websocket, Mode::WebSocket, tcp_connections);
        if kind != Kind::Nginx {
            row(&rt, kind, echo.addr, Mode::Tcp, tcp_connections);
        }
    }
}
