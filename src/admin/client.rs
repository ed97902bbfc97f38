//! The CLI's side of the admin API (`baton status`, `baton backend`): one
//! HTTP/1.1 request to the admin listener, the JSON answer back.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum AdminCallError {
    #[error("cannot reach the admin endpoint {addr}: {cause}")]
    Unreachable { addr: SocketAddr, cause: String },
    #[error("admin endpoint {addr}: {cause}")]
    Failed { addr: SocketAddr, cause: String },
}

/// Sends `method path` (with the bearer token, if any); returns the status
/// and the body.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), AdminCallError> {
    let unreachable = |cause: String| AdminCallError::Unreachable { addr, cause };
    let failed = |cause: String| AdminCallError::Failed { addr, cause };
    let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable("connect timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(e.to_string()))?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed(e.to_string()))?;
    // One deadline for the whole answer, body included: a daemon that
    // stalls mid-body must not hang `baton status` for good.
    let answer = async {
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(ANSWER_WAIT, answer)
        .await
        .map_err(|_| failed(format!("no whole answer within {}s", ANSWER_WAIT.as_secs())))?
        .map_err(|e| failed(e.to_string()))
}

/// How long a call waits for the whole answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
