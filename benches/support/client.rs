//! A raw HTTP/1.1 client for load: it keeps or drops connections like a
//! browser would and names each failure by what the socket said, which is
//! what tells a reset accept queue from a keep-alive race.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Why one request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failure {
    /// Connection refused: nothing listened.
    Refused,
    /// Reset by the peer (a closed accept queue, or a closed connection).
    Reset,
    /// The connection closed before a whole response arrived.
    Eof,
    Timeout,
    /// A response other than 2xx.
    Status,
}

/// One request's outcome: the latency, or why it failed.
pub type Outcome = Result<Duration, Failure>;

/// An HTTP/1.1 client connection over TCP, or over any byte stream (a TLS
/// session).
pub struct Conn<S = TcpStream> {
    stream: S,
    buf: Vec<u8>,
}

fn classify(err: &std::io::Error) -> Failure {
    match err.kind() {
        std::io::ErrorKind::ConnectionRefused => Failure::Refused,
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => Failure::Reset,
        std::io::ErrorKind::UnexpectedEof => Failure::Eof,
        std::io::ErrorKind::TimedOut => Failure::Timeout,
        _ => Failure::Reset,
    }
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Result<Conn, Failure> {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| Failure::Timeout)?
            .map_err(|e| classify(&e))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn::over(stream))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// A client on an open stream.
    pub fn over(stream: S) -> Conn<S> {
        Conn {
            stream,
            buf: Vec::with_capacity(4096),
        }
    }

    /// The stream under the client.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// One GET; `Ok(keep)` says whether the connection may be reused.
    pub async fn get(&mut self, path: &str) -> Result<bool, Failure> {
        self.request(path, false).await
    }

    /// One GET, asking the server to close after it with `close`.
    pub async fn request(&mut self, path: &str, close: bool) -> Result<bool, Failure> {
        let connection = if close { "Connection: close\r\n" } else { "" };
        let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n{connection}\r\n");
        self.stream
            .write_all(req.as_bytes())
            .await
            .map_err(|e| classify(&e))?;
        tokio::time::timeout(Duration::from_secs(10), self.read_response())
            .await
            .map_err(|_| Failure::Timeout)?
    }

    /// Appends what the socket has next; a close before the whole answer
    /// is `Eof`.
    async fn read_more(&mut self) -> Result<(), Failure> {
        let mut chunk = [0u8; 4096];
        let n = self
            .stream
            .read(&mut chunk)
            .await
            .map_err(|e| classify(&e))?;
        if n == 0 {
            return Err(Failure::Eof);
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn read_response(&mut self) -> Result<bool, Failure> {
        self.buf.clear();
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.read_more().await?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_ascii_lowercase();
        let status_ok = head.starts_with("http/1.1 2") || head.starts_with("http/1.0 2");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let keep = !head.contains("connection: close") && head.starts_with("http/1.1");
        while self.buf.len() < head_end + length {
            self.read_more().await?;
        }
        if status_ok {
            Ok(keep)
        } else {
            Err(Failure::Status)
        }
    }
}

/// One TCP session through an echo backend: connect, send a line, read it
/// back, close.
pub async fn echo_session(addr: SocketAddr) -> Result<(), Failure> {
    let mut conn = Conn::open(addr).await?;
    let line = b"baton bench echo line\n";
    conn.stream
        .write_all(line)
        .await
        .map_err(|e| classify(&e))?;
    let mut back = [0u8; 22];
    tokio::time::timeout(Duration::from_secs(10), conn.stream.read_exact(&mut back))
        .await
        .map_err(|_| Failure::Timeout)?
        .map_err(|e| classify(&e))?;
    if back != *line {
        return Err(Failure::Status);
    }
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
