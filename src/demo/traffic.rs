//! The demo's backends and clients: small hyper servers that say who they
//! are, and paced clients that check every answer and keep a tally.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::{self as client, SendRequest};
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// An in-process HTTP backend answering `hello from NAME`.
pub struct Backend {
    pub addr: SocketAddr,
}

impl Backend {
    pub async fn start(name: &'static str) -> std::io::Result<Backend> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service =
                        service_fn(move |_req: Request<hyper::body::Incoming>| async move {
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                                "hello from {name}\n"
                            )))))
                        });
                    let _ = server::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Backend { addr })
    }
}

/// What the clients saw, shared between them.
#[derive(Clone, Default)]
pub struct Tally {
    requests: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    latencies_us: Arc<Mutex<Vec<u64>>>,
    first_failure: Arc<Mutex<Option<String>>>,
}

impl Tally {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    fn ok(&self, latency: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.latencies_us.lock() {
            l.push(latency.as_micros() as u64);
        }
    }

    fn fail(&self, why: String) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut f) = self.first_failure.lock() {
            f.get_or_insert(why);
        }
    }

    pub fn summary(&self) -> String {
        let mut l = self
            .latencies_us
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default();
        l.sort_unstable();
        let pct = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0) as f64
                / 1000.0
        };
        let mut out = format!(
            "summary: {} requests, {} failed; latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.requests(),
            self.failed(),
            pct(0.50),
            pct(0.99),
            l.last().copied().unwrap_or(0) as f64 / 1000.0
        );
        if let Ok(Some(why)) = self.first_failure.lock().map(|f| f.clone()) {
            out.push_str(&format!("\nfirst failure: {why}"));
        }
        out
    }
}

/// 4 keep-alive clients at ~200 req/s each and 2 that open a connection per
/// request at ~100 req/s each, until `stop`.
pub fn start_clients(
    proxy: SocketAddr,
    tally: &Tally,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(tokio::spawn(keep_alive_client(
            proxy,
            tally.clone(),
            stop.clone(),
        )));
    }
    for _ in 0..2 {
        handles.push(tokio::spawn(new_connection_client(
            proxy,
            tally.clone(),
            stop.clone(),
        )));
    }
    handles
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (sender, conn) = client::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One request; `Ok` only for a 200 whose body came from a demo backend.
async fn exchange(sender: &mut SendRequest<Empty<Bytes>>, addr: SocketAddr) -> Result<(), String> {
    sender
        .ready()
        .await
        .map_err(|e| format!("connection not ready: {e}"))?;
    let req = Request::get("/")
        .header("host", addr.to_string())
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    if status != 200 || !body.starts_with(b"hello from backend-") {
        return Err(format!(
            "status {status}, body {:?}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(())
}

async fn keep_alive_client(addr: SocketAddr, tally: Tally, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sender: Option<SendRequest<Empty<Bytes>>> = None;
    while !stop.is_cancelled() {
        tick.tick().await;
        let started = Instant::now();
        // A connection the server closed (Connection: close while it drains)
        // is replaced before the next request, as any HTTP client does.
        if sender.as_ref().is_none_or(|s| s.is_closed()) {
            match connect(addr).await {
                Ok(s) => sender = Some(s),
                Err(e) => {
                    tally.fail(e);
                    continue;
                }
            }
        }
        let Some(s) = sender.as_mut() else { continue };
        match exchange(s, addr).await {
            Ok(()) => tally.ok(started.elapsed()),
            Err(e) => {
                tally.fail(format!("keep-alive: {e}"));
                sender = None;
            }
        }
    }
}

async fn new_connection_client(addr: SocketAddr, tally: Tally, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.is_cancelled() {
        tick.tick().await;
        let started = Instant::now();
        let result = match connect(addr).await {
            Ok(mut s) => exchange(&mut s, addr).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => tally.ok(started.elapsed()),
            Err(e) => tally.fail(format!("new connection: {e}")),
        }
    }
}

/// The status code of `GET path` on the admin address, if it answered.
pub async fn get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut sender = connect(addr).await.ok()?;
    sender.ready().await.ok()?;
    let req = Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::new())
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    Some(resp.status().as_u16())
}
