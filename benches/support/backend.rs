//! The benches' HTTP/1.1 and h2c backend, in process, and what serving
//! through a proxy cost it: connections accepted, reads made and CPU time,
//! so a proxy that makes its backend work harder (a connection per
//! request, a head in several writes) shows in the figures.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::measure::thread_cpu_seconds;

/// A running backend.
pub struct Backend {
    pub addr: SocketAddr,
    tally: Arc<Tally>,
}

#[derive(Default)]
struct Tally {
    connections: AtomicU64,
    reads: AtomicU64,
    /// Every thread the backend runs on (its accept loop's and its
    /// runtime's), for their CPU time in /proc.
    threads: Mutex<Vec<i32>>,
}

/// What the backend had spent at one moment.
#[derive(Clone, Copy)]
pub struct Usage {
    pub connections: u64,
    pub reads: u64,
    /// User and kernel seconds.
    pub cpu: (f64, f64),
}

impl Backend {
    pub fn usage(&self) -> Usage {
        let threads = self
            .tally
            .threads
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default();
        Usage {
            connections: self.tally.connections.load(Ordering::Relaxed),
            reads: self.tally.reads.load(Ordering::Relaxed),
            cpu: thread_cpu_seconds(&threads),
        }
    }
}

impl Usage {
    /// What was spent between `before` and this, per request: CPU µs
    /// (user + kernel), new connections and reads.
    pub fn per_request(&self, before: &Usage, requests: f64) -> String {
        if requests <= 0.0 {
            return String::new();
        }
        let cpu = (self.cpu.0 - before.cpu.0) + (self.cpu.1 - before.cpu.1);
        format!(
            "; backend {:.1} µs, {} connections, {:.2} reads a request",
            cpu * 1e6 / requests,
            self.connections - before.connections,
            (self.reads - before.reads) as f64 / requests
        )
    }
}

fn this_thread() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// Starts a backend answering `ok\n` (3 bytes), or after `MS` ms on
/// `/slow/MS`, over HTTP/1.1 or h2c (prior knowledge), on its own runtime
/// thread so it does not share the load generator's scheduler. With
/// `cpus`, its threads run only there (the runtime's threads inherit the
/// pinning of the thread that builds it), so it cannot take time from a
/// proxy pinned elsewhere.
pub fn start_backend(worker_threads: usize, cpus: &[usize]) -> Backend {
    let (tx, rx) = std::sync::mpsc::channel();
    let cpus = cpus.to_vec();
    let tally = Arc::new(Tally::default());
    let served = Arc::clone(&tally);
    std::thread::spawn(move || {
        super::pin_this_thread(&cpus);
        let record = Arc::clone(&served);
        let note = move || {
            if let Ok(mut t) = record.threads.lock() {
                t.push(this_thread());
            }
        };
        note();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads)
            .on_thread_start(note)
            .enable_all()
            .build()
            .expect("backend runtime");
        rt.block_on(serve(served, tx));
    });
    let addr = rx.recv().expect("backend address");
    Backend { addr, tally }
}

async fn serve(tally: Arc<Tally>, tx: std::sync::mpsc::Sender<SocketAddr>) {
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
        tally.connections.fetch_add(1, Ordering::Relaxed);
        let stream = Counted {
            stream,
            tally: Arc::clone(&tally),
        };
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
            // HTTP/1.1 and h2c (prior knowledge), so h2c can be measured
            // straight to the backend too.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A backend connection that counts the reads that brought bytes.
struct Counted {
    stream: TcpStream,
    tally: Arc<Tally>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.tally.reads.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
