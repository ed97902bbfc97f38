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
/// who may not read its file listens (`port_holder`), before the connect:
/// where nobody listens, the connect says so.
fn held_by_a_reader(addr: SocketAddr, token: Token<'_>) -> Result<(), AdminCallError> {
    match port_holder::uids_listening_at(addr) {
        Ok(None) => Ok(()),
        Ok(Some(uids)) => all_readers(addr, uids, token),
        Err(err) => Err(unknown(addr, format!("the kernel's TCP tables: {err}"))),
    }
}

/// Refuses to send `token` on `stream` (to `addr`) when the socket that
/// took it belongs to a user who may not read the token file: a squatter
/// that bound between the first look and the connect, and let its
/// listener go once it took the connection, is caught here. A connection
/// that left this host needs no look. Where the kernel shows root (root's
/// own, or an older kernel's connection not yet accepted), whoever listens
/// now must be a reader, and someone must.
fn taken_by_a_reader(
    stream: &TcpStream,
    addr: SocketAddr,
    token: Token<'_>,
) -> Result<(), AdminCallError> {
    let ends = stream
        .local_addr()
        .and_then(|ours| Ok((ours, stream.peer_addr()?)));
    let (ours, theirs) = ends.map_err(|err| unknown(addr, err.to_string()))?;
    if !port_holder::stays_here(ours, theirs) {
        return Ok(());
    }
    match port_holder::uid_that_took(ours, theirs) {
        Err(err) => Err(unknown(addr, format!("the kernel's TCP tables: {err}"))),
        Ok(None) => Err(unknown(addr, "the connection's other end is gone".into())),
        Ok(Some(0)) => match port_holder::uids_listening_at(addr) {
            Ok(Some(uids)) if !uids.is_empty() => all_readers(addr, uids, token),
            _ => Err(unknown(addr, "nobody listens there any more".into())),
        },
        Ok(Some(uid)) => all_readers(addr, vec![uid], token),
    }
}

/// Refuses unless every one of `uids` may read the token file.
fn all_readers(addr: SocketAddr, uids: Vec<u32>, token: Token<'_>) -> Result<(), AdminCallError> {
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

fn unknown(addr: SocketAddr, cause: String) -> AdminCallError {
    AdminCallError::HolderUnknown {
        at: addr.to_string(),
        cause,
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
            if let Some(token) = token {
                held_by_a_reader(to, token)?;
            }
            let stream = connected(TcpStream::connect(to))
                .await
                .map_err(unreachable)?;
            if let Some(token) = token {
                taken_by_a_reader(&stream, to, token)?;
            }
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
