//! The CLI's side of the admin API (`baton status`, `baton backend`): one
//! HTTP/1.1 request to the admin listener, the JSON answer back.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use super::port_holder;
use crate::config::AdminListen;

#[derive(Debug, thiserror::Error)]
pub enum AdminCallError {
    #[error("cannot reach the admin endpoint {at}: {cause}")]
    Unreachable { at: String, cause: String },
    /// Its socket's mode keeps this user out: the daemon may well run.
    #[error("the admin socket {at} refuses this user: only root and the daemon's own user may connect (or give the admin a TCP listen)")]
    NotOurs { at: String },
    /// Another user listens on the admin port (baton stopped, or not yet
    /// bound): the token would be theirs.
    #[error("the admin port {at} is held by uid {uid} ({user}), who may not read {token_file}: the admin token is not sent to it (is baton running, and is something else listening on its admin port?)")]
    HeldByAnother {
        at: String,
        uid: u32,
        user: String,
        token_file: String,
    },
    #[error("admin endpoint {at}: {cause}")]
    Failed { at: String, cause: String },
}

/// Refuses to send the token read from `token_file` to a TCP admin port
/// where a user who may not read that file listens (`port_holder`). A Unix
/// socket needs no look: its folder's mode keeps others from making it.
pub fn token_may_go_to(at: &AdminListen, token_file: &Path) -> Result<(), AdminCallError> {
    let AdminListen::Tcp(addr) = at else {
        return Ok(());
    };
    let stranger = port_holder::uids_listening_at(*addr)
        .into_iter()
        .find(|uid| !port_holder::may_read(*uid, token_file));
    match stranger {
        None => Ok(()),
        Some(uid) => Err(AdminCallError::HeldByAnother {
            at: at.to_string(),
            uid,
            user: port_holder::user_name(uid),
            token_file: token_file.display().to_string(),
        }),
    }
}

/// Sends `method path` to the admin listener `at` (with the bearer token,
/// if any); returns the status and the body.
pub async fn call(
    at: &AdminListen,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), AdminCallError> {
    let unreachable = |cause: std::io::Error| AdminCallError::Unreachable {
        at: at.to_string(),
        cause: cause.to_string(),
    };
    let asked = Asked {
        method,
        path,
        token,
    };
    let answer = match at {
        AdminListen::Tcp(addr) => {
            let stream = connected(TcpStream::connect(addr)).await;
            asked
                .on(stream.map_err(unreachable)?, &addr.to_string())
                .await
        }
        AdminListen::Unix(socket) => {
            // A Unix socket's mode refuses with EACCES (a TCP connect's
            // EACCES or EPERM is a firewall's or a security module's).
            let stream = connected(UnixStream::connect(socket))
                .await
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::PermissionDenied => {
                        AdminCallError::NotOurs { at: at.to_string() }
                    }
                    _ => unreachable(e),
                });
            asked.on(stream?, "localhost").await
        }
    };
    answer.map_err(|cause| AdminCallError::Failed {
        at: at.to_string(),
        cause,
    })
}

/// The stream `connect` makes, within 5 s, or why not.
async fn connected<S>(
    connect: impl std::future::Future<Output = std::io::Result<S>>,
) -> std::io::Result<S> {
    tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

/// One request to the admin API.
struct Asked<'a> {
    method: &'a str,
    path: &'a str,
    token: Option<&'a str>,
}

impl Asked<'_> {
    /// Sends it on `stream`, to `host`: the status and the body.
    async fn on<S>(&self, stream: S, host: &str) -> Result<(u16, String), String>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(self.method)
            .uri(self.path)
            .header("host", host);
        if let Some(t) = self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
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
            .map_err(|_| format!("no whole answer within {}s", ANSWER_WAIT.as_secs()))?
            .map_err(|e| e.to_string())
    }
}

/// How long a call waits for the whole answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
