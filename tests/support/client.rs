//! Real HTTP clients (hyper) for the tests: one request on a fresh
//! connection, or a kept-alive connection reused like a browser would.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::HeaderMap;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    /// The request id on one of baton's own error pages.
    pub fn page_request_id(&self) -> String {
        self.body
            .lines()
            .find_map(|l| l.strip_prefix("request id: "))
            .expect("the page's request id")
            .to_string()
    }
}

pub async fn connect(addr: SocketAddr) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    http1_over(stream).await
}

/// An HTTP/1.1 client connection over an open stream (plain or TLS).
pub async fn http1_over<S>(stream: S) -> Result<SendRequest<Empty<Bytes>>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// An h2 (prior knowledge) client connection to `addr`, sending bodies of
/// type `B`; its connection task runs on its own.
pub async fn h2<B>(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    h2_over(stream).await.expect("h2 handshake")
}

/// An h2 client connection over an open `stream` (plain TCP with prior
/// knowledge, or TLS with ALPN h2); its connection task runs on its own.
pub async fn h2_over<S, B>(stream: S) -> Result<hyper::client::conn::http2::SendRequest<B>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .map_err(|e| format!("h2 handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// `GET https://{authority}{path}` as h2 over an open stream (TLS with
/// ALPN h2).
pub async fn h2_get_over<S>(stream: S, authority: &str, path: &str) -> Result<Answer, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let exchange = async {
        let mut sender = h2_over(stream).await?;
        let req = Request::get(format!("https://{authority}{path}"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        answer(resp).await
    };
    tokio::time::timeout(EXCHANGE_BOUND, exchange)
        .await
        .map_err(|_| format!("no answer within {EXCHANGE_BOUND:?}"))?
}

/// One request on an existing connection.
pub async fn send(
    sender: &mut SendRequest<Empty<Bytes>>,
    addr: SocketAddr,
    path: &str,
) -> Result<Answer, String> {
    send_with_host(sender, &addr.to_string(), path).await
}

/// `n` kept-alive connections to `addr`, each after one `GET path`
/// answered 200: idle connections a test holds open.
pub async fn kept_alive(addr: SocketAddr, path: &str, n: usize) -> Vec<SendRequest<Empty<Bytes>>> {
    let mut kept = Vec::new();
    for _ in 0..n {
        let mut c = connect(addr).await.expect("connect");
        assert_eq!(send(&mut c, addr, path).await.expect("get").status, 200);
        kept.push(c);
    }
    kept
}

/// One request on an existing connection, with the `Host` header given.
pub async fn send_with_host(
    sender: &mut SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
) -> Result<Answer, String> {
    exchange(sender, Request::get(path).header("host", host)).await
}

/// The longest one exchange may take: a request lost in a handoff (what
/// these tests hunt) fails its test instead of hanging it. Longer than any
/// request a test holds on purpose.
const EXCHANGE_BOUND: std::time::Duration = std::time::Duration::from_secs(120);

/// Sends one built request on `sender` and reads the whole answer, within
/// [`EXCHANGE_BOUND`].
async fn exchange(
    sender: &mut SendRequest<Empty<Bytes>>,
    req: hyper::http::request::Builder,
) -> Result<Answer, String> {
    tokio::time::timeout(EXCHANGE_BOUND, exchange_unbounded(sender, req))
        .await
        .map_err(|_| format!("no answer within {EXCHANGE_BOUND:?}"))?
}

async fn exchange_unbounded(
    sender: &mut SendRequest<Empty<Bytes>>,
    req: hyper::http::request::Builder,
) -> Result<Answer, String> {
    sender
        .ready()
        .await
        .map_err(|e| format!("not ready: {e}"))?;
    let req = req.body(Empty::new()).map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    answer(resp).await
}

/// Reads a whole response.
async fn answer(resp: hyper::Response<hyper::body::Incoming>) -> Result<Answer, String> {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `GET path` on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Answer, String> {
    let mut sender = connect(addr).await?;
    send(&mut sender, addr, path).await
}

/// `GET path` of the admin API on a fresh connection, sent again while
/// it is answered 503 "has handed over" (as `baton status` does): by a
/// generation that took the connection just before a reload's handover,
/// which knows nothing of the serving one.
pub async fn admin_get(admin: SocketAddr, path: &str) -> Result<Answer, String> {
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    loop {
        let answer = get(admin, path).await?;
        let handed_over = answer.status == 503 && answer.body.contains("has handed over");
        if !handed_over || tokio::time::Instant::now() > deadline {
            return Ok(answer);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `METHOD path` on a fresh connection, with an optional bearer token.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<Answer, String> {
    call_with(addr, method, path, token, &[]).await
}

/// [`call`] with more header fields (what a browser adds, say; a `host`
/// among them replaces the address).
pub async fn call_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    fields: &[(&str, &str)],
) -> Result<Answer, String> {
    let mut sender = connect(addr).await?;
    let mut req = Request::builder().method(method).uri(path);
    if !fields
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        req = req.header("host", addr.to_string());
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    for (name, value) in fields {
        req = req.header(*name, *value);
    }
    exchange(&mut sender, req).await
}

/// Drains backend `id` (an index, a name, `name@address`) through the
/// admin API, which must take it; its answer.
pub async fn drain(admin: SocketAddr, id: &str) -> Answer {
    backend_call(admin, id, "drain").await
}

/// Restores backend `id` through the admin API, which must take it; its
/// answer.
pub async fn restore(admin: SocketAddr, id: &str) -> Answer {
    backend_call(admin, id, "restore").await
}

async fn backend_call(admin: SocketAddr, id: &str, verb: &str) -> Answer {
    let answer = call(admin, "POST", &format!("/backends/{id}/{verb}"), None)
        .await
        .unwrap_or_else(|e| panic!("{verb} call: {e}"));
    assert_eq!(answer.status, 200, "{verb}: {}", answer.body);
    answer
}

/// The Prometheus text `/metrics` serves.
pub async fn metrics(admin: SocketAddr) -> String {
    admin_get(admin, "/metrics").await.expect("metrics").body
}

/// The value of one series (`name{labels}` as `/metrics` writes it) in
/// `metrics`, if it is there.
pub fn series(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// `/status` as JSON.
pub async fn status(admin: SocketAddr) -> serde_json::Value {
    let status = admin_get(admin, "/status").await.expect("status");
    serde_json::from_str(&status.body)
        .unwrap_or_else(|e| panic!("status json: {e}: {}", status.body))
}

/// What `/status` reports for backend `name`.
pub async fn backend_status(admin: SocketAddr, name: &str) -> serde_json::Value {
    let v = status(admin).await;
    v["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["backends"].as_array().into_iter().flatten())
        .find(|b| b["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no backend {name} in {v}"))
}

/// The state `/status` reports for backend `name`.
pub async fn backend_state(admin: SocketAddr, name: &str) -> String {
    backend_status(admin, name).await["state"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Everything the peer sends until it closes (a reset ends it too); a
/// peer that has not closed within `TIMEOUT` fails the test: callers
/// assert a close, which a timeout taken for one would fake.
pub async fn read_until_closed(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let read = tokio::time::timeout(super::TIMEOUT, s.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "the peer did not close within {:?}; it sent {:?}",
        super::TIMEOUT,
        String::from_utf8_lossy(&out)
    );
    String::from_utf8_lossy(&out).into_owned()
}

/// A connection upgraded to `protocol` on the backend's echo path (`/ws`):
/// the response head is read (and returned, lower-cased); what follows is
/// the tunnel.
pub async fn upgraded(addr: SocketAddr, protocol: &str) -> (TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.expect("read head");
        head.push(byte[0]);
    }
    (s, String::from_utf8_lossy(&head).to_ascii_lowercase())
}

/// Waits until `listener` has `open` client connections of the serving
/// generation (`baton_connections_active`): a client that left is gone for
/// baton too.
pub async fn until_serving(admin: SocketAddr, listener: &str, open: u64) {
    let series = format!("baton_connections_active{{listener=\"{listener}\",state=\"serving\"}}");
    super::eventually(&format!("{open} open on {listener}"), || async {
        self::series(&metrics(admin).await, &series) == Some(open as f64)
    })
    .await;
}

/// A client's way to `target` whose uplink is slow: every chunk the client
/// sends reaches `target` `latency` after it was read, in order; what comes
/// back comes at once. One connection, made to `target` as the client's is
/// accepted (a long round trip, as from across the world, on loopback).
pub async fn slow_uplink(target: SocketAddr, latency: std::time::Duration) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let Ok(server) = TcpStream::connect(target).await else {
            return;
        };
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = server.into_split();
        let (chunks, mut due) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                let at = tokio::time::Instant::now() + latency;
                if chunks.send((at, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            while let Some((at, chunk)) = due.recv().await {
                tokio::time::sleep_until(at).await;
                if to_server.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            let _ = to_server.shutdown().await;
        });
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    addr
}

/// A connection to `addr` whose receive buffer is 4 KiB: a client that
/// takes bytes only as fast as it reads them (a loopback socket's buffer
/// would otherwise take megabytes for it).
pub async fn small_window(addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket.connect(addr).await.expect("connect")
}
