//! Real backends on 127.0.0.1: an HTTP server that says who answered and
//! which path it saw (`/slow/MS` answers after MS milliseconds, `/gated`
//! answers once the test calls [`HttpBackend::release`], `/headers` answers
//! with the request's headers (`name: value` lines) and its version, `/ws` echoes
//! bytes after a 101 upgrade to the protocol asked for, `/sse` streams an
//! event every 100 ms, `/upload` reads the whole body and says how many
//! bytes it got, `/bytes/N` streams N bytes), and a TCP echo server that
//! honours half-close.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub struct HttpBackend {
    pub addr: SocketAddr,
    pub name: &'static str,
    pub hits: Arc<AtomicU64>,
    /// Requests being answered right now (a request whose connection
    /// closes under it stops counting: hyper drops its future).
    active: Arc<AtomicU64>,
    /// Uploads read to their end, and uploads whose body failed midway.
    pub uploads: Arc<Uploads>,
    /// Client connections open now.
    connections: Arc<AtomicU64>,
    /// `/gated` requests waiting for [`Self::release`] now.
    held: Arc<AtomicU64>,
    /// Lets every `/gated` request answer, now and from then on (until
    /// [`Self::hold_again`] puts a new one in its place).
    release: Arc<std::sync::Mutex<tokio_util::sync::CancellationToken>>,
    /// Ends the accept loop and every open connection: a killed process.
    kill: tokio_util::sync::CancellationToken,
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.kill.cancel();
    }
}

impl HttpBackend {
    pub async fn start(name: &'static str) -> HttpBackend {
        HttpBackend::start_on(name, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// Starts (or restarts, after [`Self::kill`]) on a given address.
    pub async fn start_on(name: &'static str, addr: SocketAddr) -> HttpBackend {
        let listener = TcpListener::bind(addr).await.expect("bind backend");
        let addr = listener.local_addr().expect("backend addr");
        let hits = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&hits);
        let active = Arc::new(AtomicU64::new(0));
        let busy = Arc::clone(&active);
        let uploads = Arc::new(Uploads::default());
        let tally = Arc::clone(&uploads);
        let connections = Arc::new(AtomicU64::new(0));
        let open = Arc::clone(&connections);
        let gate = Gate {
            held: Arc::new(AtomicU64::new(0)),
            release: Arc::default(),
        };
        let (held, release) = (Arc::clone(&gate.held), Arc::clone(&gate.release));
        let kill = tokio_util::sync::CancellationToken::new();
        let killed = kill.clone();
        tokio::spawn(async move {
            loop {
                let Some(stream) = super::accept_until(&listener, &killed).await else {
                    return;
                };
                let (counter, busy) = (Arc::clone(&counter), Arc::clone(&busy));
                let tally = Arc::clone(&tally);
                let gate = gate.clone();
                let killed = killed.clone();
                let open = Active::mark(&open);
                tokio::spawn(async move {
                    let _open = open;
                    let service = service_fn(move |req| {
                        counter.fetch_add(1, Ordering::Relaxed);
                        let busy = Active::mark(&busy);
                        let (tally, gate) = (Arc::clone(&tally), gate.clone());
                        async move {
                            let answer = answer(name, req, &tally, &gate).await;
                            drop(busy);
                            answer
                        }
                    });
                    let conn = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades();
                    tokio::select! {
                        _ = conn => {}
                        () = killed.cancelled() => {}
                    }
                });
            }
        });
        HttpBackend {
            addr,
            name,
            hits,
            active,
            uploads,
            connections,
            held,
            release,
            kill,
        }
    }

    /// `/gated` requests this backend is holding now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Answers every held `/gated` request, and every later one at once.
    pub fn release(&self) {
        if let Ok(gate) = self.release.lock() {
            gate.cancel();
        }
    }

    /// From now on `/gated` requests are held again, until the next
    /// [`Self::release`].
    pub fn hold_again(&self) {
        if let Ok(mut gate) = self.release.lock() {
            *gate = tokio_util::sync::CancellationToken::new();
        }
    }

    /// Connections open to this backend now.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Requests this backend is answering now.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Closes the listener and every connection at once, as a crash would.
    pub fn kill(&self) {
        self.kill.cancel();
    }

    /// The body this backend answers for `path`.
    pub fn body_for(name: &str, path: &str) -> String {
        format!("{name} {path}\n")
    }
}

/// What `/upload` saw.
#[derive(Default)]
pub struct Uploads {
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    /// Bytes of the last completed upload.
    pub last_bytes: AtomicU64,
}

/// Where `/gated` requests wait for the test.
#[derive(Clone)]
struct Gate {
    held: Arc<AtomicU64>,
    release: Arc<std::sync::Mutex<tokio_util::sync::CancellationToken>>,
}

/// Counts a request as active until dropped, however its future ends.
struct Active(Arc<AtomicU64>);

impl Active {
    fn mark(count: &Arc<AtomicU64>) -> Active {
        count.fetch_add(1, Ordering::Relaxed);
        Active(Arc::clone(count))
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

type TestBody = BoxBody<Bytes, Infallible>;

fn full(text: String) -> TestBody {
    Full::new(Bytes::from(text)).boxed()
}

/// An endless event stream: `data: N` every 100 ms.
struct Ticker {
    interval: tokio::time::Interval,
    n: u64,
}

impl http_body::Body for Ticker {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.interval.poll_tick(cx) {
            std::task::Poll::Ready(_) => {
                self.n += 1;
                let event = format!("data: {}\n\n", self.n);
                std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

/// `remaining` bytes of `x`, in 64 KiB frames, made as they are read.
struct Generated {
    remaining: u64,
}

impl http_body::Body for Generated {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        const CHUNK: &[u8] = &[b'x'; 64 * 1024];
        if self.remaining == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.remaining.min(CHUNK.len() as u64);
        self.remaining -= n;
        let frame = Frame::data(Bytes::from_static(&CHUNK[..n as usize]));
        std::task::Poll::Ready(Some(Ok(frame)))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

/// Says which trailers the request body ended with, and ends its own
/// response body with the trailer `x-checksum: 42`.
async fn trailers(mut body: Incoming) -> Response<TestBody> {
    let mut seen = String::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(t) = frame.trailers_ref() {
            for (name, value) in t {
                seen.push_str(&format!(
                    "{name}={} ",
                    String::from_utf8_lossy(value.as_bytes())
                ));
            }
        }
    }
    let mut trailer = hyper::HeaderMap::new();
    trailer.insert("x-checksum", "42".parse().expect("value"));
    let frames = Frames(
        [
            Frame::data(Bytes::from(format!("request trailers: {seen}\n"))),
            Frame::trailers(trailer),
        ]
        .into(),
    );
    let mut resp = Response::new(frames.boxed());
    resp.headers_mut()
        .insert("trailer", "x-checksum".parse().expect("value"));
    resp
}

/// A body of frames given up front.
struct Frames(std::collections::VecDeque<Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// Reads the whole body, counting it; says how many bytes arrived.
async fn upload(body: Incoming, tally: &Uploads) -> TestBody {
    let mut body = body;
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => total += f.data_ref().map_or(0, |d| d.len() as u64),
            Err(_) => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
                return full("body failed\n".into());
            }
        }
    }
    tally.completed.fetch_add(1, Ordering::Relaxed);
    tally.last_bytes.store(total, Ordering::Relaxed);
    full(format!("received {total}\n"))
}

async fn answer(
    name: &'static str,
    mut req: Request<Incoming>,
    tally: &Uploads,
    gate: &Gate,
) -> Result<Response<TestBody>, Infallible> {
    let path = req.uri().path().to_string();
    if path == "/trailers" {
        return Ok(trailers(req.into_body()).await);
    }
    if path == "/headers" {
        let mut text = format!("{:?}\n", req.version());
        for (name, value) in req.headers() {
            text.push_str(&format!(
                "{name}: {}\n",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
        return Ok(Response::new(full(text)));
    }
    if path == "/gated" {
        let held = Active::mark(&gate.held);
        let release = gate.release.lock().map(|g| g.clone()).unwrap_or_default();
        release.cancelled().await;
        drop(held);
    }
    if path == "/upload" {
        return Ok(Response::new(upload(req.into_body(), tally).await));
    }
    if let Some(n) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        return Ok(Response::new(Generated { remaining: n }.boxed()));
    }
    if path == "/sse" {
        let ticker = Ticker {
            interval: tokio::time::interval(Duration::from_millis(100)),
            n: 0,
        };
        let mut resp = Response::new(ticker.boxed());
        resp.headers_mut()
            // Not in lower case: a media type matches in any case.
            .insert(
                "content-type",
                "Text/Event-Stream; charset=utf-8".parse().expect("header"),
            );
        return Ok(resp);
    }
    if path == "/ws" {
        let protocol = req.headers().get("upgrade").cloned();
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut resp = Response::new(full(String::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        resp.headers_mut()
            .insert("connection", "upgrade".parse().expect("header"));
        if let Some(p) = protocol {
            resp.headers_mut().insert("upgrade", p);
        }
        return Ok(resp);
    }
    if let Some(ms) = path
        .strip_prefix("/slow/")
        .and_then(|m| m.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut resp = Response::new(full(HttpBackend::body_for(name, &path)));
    if let Some(xff) = req.headers().get("x-forwarded-for") {
        resp.headers_mut()
            .insert("x-seen-forwarded-for", xff.clone());
    }
    Ok(resp)
}

/// Echoes every byte; when the client half-closes, finishes echoing and
/// then half-closes back.
pub struct TcpEcho {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TcpEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpEcho {
    pub async fn start() -> TcpEcho {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let addr = listener.local_addr().expect("echo addr");
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if stream.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
        TcpEcho { addr, task }
    }
}

/// A backend that says `hi` and closes (a server-speaks-first protocol).
pub async fn greeter() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, b"hi").await;
        }
    });
    (addr, serving)
}

/// A backend that accepts and never answers, nor closes: a hung server, to
/// baton. Its connections are held until the task is aborted.
pub async fn silent() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    (addr, holding)
}
