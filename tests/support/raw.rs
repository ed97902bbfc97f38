//! A backend that answers byte for byte what the test scripts: for each
//! request head it reads (and its `Content-Length` body), the script gives
//! the bytes to write and what to do with the connection next. For the
//! cases a well-behaved server never shows: interim responses, extra bytes
//! after a response, a keep-alive connection closed under a request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the backend does after writing a script's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Reads the next request on the same connection.
    KeepAlive,
    /// Closes the connection now.
    Close,
    /// Keeps the connection idle this long, then closes it (a backend's
    /// own keep-alive timeout).
    CloseAfter(Duration),
}

/// One request as the backend read it: its head's text, and its place on
/// its connection (0 for the first).
pub struct Seen {
    pub head: String,
    pub on_connection: u64,
}

type Script = dyn Fn(&Seen) -> (Vec<u8>, Then) + Send + Sync;

pub struct RawBackend {
    pub addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    heads: Arc<Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl RawBackend {
    pub async fn start(script: impl Fn(&Seen) -> (Vec<u8>, Then) + Send + Sync + 'static) -> Self {
        RawBackend::start_on("127.0.0.1:0", script).await
    }

    /// The same, listening on `bind` (`[::1]:0` for an IPv6 backend).
    pub async fn start_on(
        bind: &str,
        script: impl Fn(&Seen) -> (Vec<u8>, Then) + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind(bind).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicU64::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let script: Arc<Script> = Arc::new(script);
        let (count, seen, stopped) = (Arc::clone(&accepted), Arc::clone(&heads), stop.clone());
        tokio::spawn(async move {
            loop {
                let Some(stream) = super::accept_until(&listener, &stopped).await else {
                    return;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let (script, seen, stopped) =
                    (Arc::clone(&script), Arc::clone(&seen), stopped.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = serve(stream, script, seen) => {}
                        () = stopped.cancelled() => {}
                    }
                });
            }
        });
        RawBackend {
            addr,
            accepted,
            heads,
            stop,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Every request head read so far, in order.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().map(|h| h.clone()).unwrap_or_default()
    }
}

async fn serve(mut stream: TcpStream, script: Arc<Script>, seen: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    let mut on_connection = 0;
    loop {
        let Some(head) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        if let Ok(mut s) = seen.lock() {
            s.push(head.clone());
        }
        let (bytes, then) = script(&Seen {
            head,
            on_connection,
        });
        on_connection += 1;
        if stream.write_all(&bytes).await.is_err() {
            return;
        }
        match then {
            Then::KeepAlive => {}
            Then::Close => return,
            Then::CloseAfter(idle) => {
                tokio::time::sleep(idle).await;
                return;
            }
        }
    }
}

/// Reads into `buf` until it holds a whole head; its length, `None` at
/// EOF.
async fn head_end(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(i + 4);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads one request head and its `Content-Length` body; `None` at EOF.
pub async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let end = head_end(stream, buf).await?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < end + length {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    buf.drain(..end + length);
    Some(head)
}

/// A complete 200 with `body`, keeping the connection.
pub fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An event stream's first event, then a minute of quiet (chunked).
pub fn one_event_then_quiet(_: &Seen) -> (Vec<u8>, Then) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n";
    (
        head.as_bytes().to_vec(),
        Then::CloseAfter(Duration::from_secs(60)),
    )
}

/// What a backend writes for the request it read.
pub type Answer = fn(&Seen) -> Vec<u8>;

/// A first answer on each connection, then a response head broken off
/// in its middle and a close.
pub fn breaks_off_its_second_head(seen: &Seen) -> (Vec<u8>, Then) {
    match seen.on_connection {
        0 => (ok("first"), Then::KeepAlive),
        _ => (b"HTTP/1.1 20".to_vec(), Then::Close),
    }
}

/// Answers that a kept backend connection must not outlive, each saying
/// `answer {n}` for the `n`th request on its connection: bytes past the
/// response's end (a second, unasked-for response), and a response that
/// states both a length and chunked coding (read chunked, RFC 9112 §6.3,
/// but a connection whose framing two parties may read two ways is not
/// given to another request).
pub fn unkeepable_answers() -> [(&'static str, Answer); 2] {
    fn stray_bytes_after(seen: &Seen) -> Vec<u8> {
        let mut bytes = ok(&format!("answer {}", seen.on_connection));
        bytes.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray");
        bytes
    }
    fn length_and_chunked(seen: &Seen) -> Vec<u8> {
        let body = format!("answer {}", seen.on_connection);
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
        .into_bytes()
    }
    [
        ("bytes past the response", stray_bytes_after),
        ("length and chunked", length_and_chunked),
    ]
}

/// A 101 to protocol `foo`, then `stream`: the backend's side of an
/// upgraded connection.
pub fn switched(stream: &[u8]) -> Vec<u8> {
    let mut bytes =
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: foo\r\nconnection: upgrade\r\n\r\n".to_vec();
    bytes.extend_from_slice(stream);
    bytes
}

/// A client connected to `addr` that asked to upgrade to `foo` and has
/// read nothing yet.
pub async fn upgrading(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nhost: app\r\nconnection: upgrade\r\nupgrade: foo\r\n\r\n")
        .await
        .expect("upgrade");
    s
}

/// A backend that answers every request with a head promising 100 bytes
/// and 5 of them, then sends nothing for a minute (a stuck application),
/// and a spec serving it on "web" with a `response_timeout` of 1 s.
pub async fn silent_mid_body() -> (RawBackend, super::daemon::Spec) {
    let backend = RawBackend::start(|_: &Seen| {
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello".to_vec(),
            Then::CloseAfter(Duration::from_secs(60)),
        )
    })
    .await;
    let spec = super::daemon::Spec::new()
        .top("workers = 1")
        .listener("web", "http", "app", "response_timeout = \"1s\"")
        .pool("app", &[backend.addr]);
    (backend, spec)
}

/// A backend that reads each request's head and then nothing more, holding
/// the connection: an upload to it stalls once the sockets are full.
pub async fn deaf_after_head() -> SocketAddr {
    reads_heads_only(Some(b"")).await
}

/// A backend that reads each request's head and closes without a byte of
/// answer, whatever of the body is still to come.
pub async fn closes_after_head() -> SocketAddr {
    reads_heads_only(None).await
}

/// A backend that reads each request's head, sends `answer` at once and
/// reads nothing more, holding the connection: an upload it refuses from
/// its head (a 413, a 401) and will not take.
pub async fn answers_after_head(answer: &'static [u8]) -> SocketAddr {
    reads_heads_only(Some(answer)).await
}

/// Reads heads only; `held`: the connection is held after `answer` (which
/// may be empty), else closed.
async fn reads_heads_only(held: Option<&'static [u8]>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut holding = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte).await {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            if let Some(answer) = held {
                let _ = stream.write_all(answer).await;
                holding.push(stream);
            }
        }
    });
    addr
}

/// A backend that answers each connection's first request, keeping the
/// connection, and closes once the second's head is in, waiting for none
/// of its body: its keep-alive close, met by the next request's upload.
pub async fn closes_under_its_second_head() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                if read_request(&mut stream, &mut buf).await.is_some()
                    && stream.write_all(&ok("first")).await.is_ok()
                {
                    let _ = head_end(&mut stream, &mut buf).await;
                }
            });
        }
    });
    addr
}

/// A backend that reads a request's head, takes none of its body for
/// `pause` (the upload waits on it), then reads the `Content-Length` body
/// whole and answers 200 `ok`.
pub async fn slow_to_read_the_body(pause: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.ok() != Some(1) {
                        return;
                    }
                    head.push(byte[0]);
                }
                let length = String::from_utf8_lossy(&head)
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<u64>().ok())?
                    })
                    .unwrap_or(0);
                tokio::time::sleep(pause).await;
                let mut body = (&mut stream).take(length);
                if tokio::io::copy(&mut body, &mut tokio::io::sink())
                    .await
                    .ok()
                    == Some(length)
                {
                    let _ = stream.write_all(&ok("ok")).await;
                }
            });
        }
    });
    addr
}

/// A backend of one place where a retried request must keep it: `/b` on a
/// kept connection is read and the connection closed a second later with
/// no answer (the keep-alive race); `/b` on a new connection is answered
/// `again`; `/slow` holds its connection two seconds and closes unanswered;
/// anything else is answered `first` and kept.
pub fn closes_under_b(seen: &Seen) -> (Vec<u8>, Then) {
    let path = seen.head.split(' ').nth(1).unwrap_or_default();
    match (path, seen.on_connection) {
        ("/slow", _) => (Vec::new(), Then::CloseAfter(Duration::from_secs(2))),
        ("/b", 0) => (ok("again"), Then::KeepAlive),
        ("/b", _) => (Vec::new(), Then::CloseAfter(Duration::from_secs(1))),
        _ => (ok("first"), Then::KeepAlive),
    }
}

/// `max_connections_per_backend = 1` and a one-second `queue_timeout`, one
/// worker: the pool for [`closes_under_b`].
pub fn one_place(backend: SocketAddr) -> super::daemon::Spec {
    one_place_waiting(backend, "1s")
}

/// The same, with requests waiting in line up to `queue_timeout`.
pub fn one_place_waiting(backend: SocketAddr, queue_timeout: &str) -> super::daemon::Spec {
    super::daemon::Spec::new()
        .top("workers = 1")
        .http("web", "app")
        .pool_with(
            "app",
            &format!("max_connections_per_backend = 1\nqueue_timeout = \"{queue_timeout}\""),
            &[(backend, 1)],
        )
}

/// Once the backend has read `/b`, a request for `/slow` that waits in
/// line for the place `/b` holds.
pub async fn queued_behind_b(backend: &RawBackend, web: SocketAddr) {
    super::eventually("the backend read /b", || async {
        backend.heads().iter().any(|h| h.starts_with("GET /b "))
    })
    .await;
    tokio::spawn(async move {
        let _ = super::client::get(web, "/slow").await;
    });
}

/// A request a client hides in a body: what a backend that never reads
/// bodies takes for its next request.
pub const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n";

/// A backend that answers each request head with its path and never reads
/// a body (so a body's bytes are read as the next request); `/early` is
/// answered at once, its body's last bytes once [`SMUGGLED`] came (the
/// request's upload ends while the answer is still coming).
pub async fn answers_before_the_body() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answers_heads_never_bodies(s));
        }
    });
    addr
}

async fn answers_heads_never_bodies(mut s: TcpStream) {
    let mut buf = Vec::new();
    while let Some(end) = head_end(&mut s, &mut buf).await {
        let head: Vec<u8> = buf.drain(..end).collect();
        let head = String::from_utf8_lossy(&head).into_owned();
        let path = head.split(' ').nth(1).unwrap_or("?").to_string();
        let written = match path.as_str() {
            "/early" => {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nea")
                    .await;
                more_than(&mut s, &mut buf, SMUGGLED.len()).await;
                s.write_all(b"rly").await
            }
            // The body read as a request is answered only once the next
            // request came on this connection: baton then reused it, and
            // nothing of this answer was there before (which its other
            // checks, for bytes past a response, would have refused).
            "/smuggled" => {
                more_than(&mut s, &mut buf, 0).await;
                s.write_all(&ok(&path)).await
            }
            _ => s.write_all(&ok(&path)).await,
        };
        if written.is_err() {
            return;
        }
    }
}

/// Reads into `buf` until it holds more than `len` bytes, within TIMEOUT.
async fn more_than(s: &mut TcpStream, buf: &mut Vec<u8>, len: usize) {
    let reading = async {
        while buf.len() <= len {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(super::TIMEOUT, reading).await;
}
