//! The CLI's side of the admin API (`baton status`, `baton backend`): one
//! HTTP/1.1 request to the admin listener, the JSON answer back.

use std::net::SocketAddr;
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
    /// Who listens on the admin port cannot be told, or the listener that
    /// took the connection is gone: the token is not sent on a guess.
    #[error(
        "cannot tell who listens on the admin port {at} ({cause}): the admin token is not sent"
    )]
    HolderUnknown { at: String, cause: String },
    #[error("admin endpoint {at}: {cause}")]
    Failed { at: String, cause: String },
}

/// The token, and the file it was read from: it goes only to a TCP admin
/// port held by a user who may read that file.
#[derive(Clone, Copy)]
pub struct Token<'a> {
    pub secret: &'a str,
    pub file: &'a Path,
}

/// Refuses to send `token` to a TCP admin port on this host where a user
/// who may not read its file listens (`port_holder`). Asked before the
/// connect (where nobody listening is left for the connect to say) and
/// again once it is made (`connected`), where someone must still listen:
/// a squatter that bound just after the first look and closed its
/// listener once it took the connection is caught either way. A Unix
/// socket needs no look: its folder's mode keeps others from making it.
fn held_by_a_reader(
    addr: SocketAddr,
    token: Token<'_>,
    connected: bool,
) -> Result<(), AdminCallError> {
    let unknown = |cause: String| AdminCallError::HolderUnknown {
        at: addr.to_string(),
        cause,
    };
    let uids = match port_holder::uids_listening_at(addr) {
        Ok(None) => return Ok(()),
        Ok(Some(uids)) => uids,
        Err(err) => return Err(unknown(format!("/proc/net/tcp: {err}"))),
    };
    if uids.is_empty() && connected {
        return Err(unknown("nobody listens there any more".to_string()));
    }
    match uids
        .into_iter()
        .find(|uid| !port_holder::may_read(*uid, token.file))
    {
        None => Ok(()),
        Some(uid) => Err(AdminCallError::HeldByAnother {
            at: addr.to_string(),
            uid,
            user: port_holder::user_name(uid),
            token_file: token.file.display().to_string(),
        }),
    }
}

/// Sends `method path` to the admin listener `at` (with the bearer token,
/// if any); returns the status and the body.
pub async fn call(
    at: &AdminListen,
    method: &str,
    path: &str,
    token: Option<Token<'_>>,
) -> Result<(u16, String), AdminCallError> {
    let unreachable = |cause: std::io::Error| AdminCallError::Unreachable {
        at: at.to_string(),
        cause: cause.to_string(),
    };
    let asked = Asked {
        method,
        path,
        token: token.map(|t| t.secret),
    };
    let answer = match at {
        AdminListen::Tcp(addr) => {
            let to = port_holder::reachable(*addr);
            let guarded = |connected| token.map_or(Ok(()), |t| held_by_a_reader(to, t, connected));
            guarded(false)?;
            let stream = connected(TcpStream::connect(to))
                .await
                .map_err(unreachable)?;
            guarded(true)?;
            asked.on(stream, &addr.to_string()).await
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
