//! The named control socket: `baton reload` and friends ask the running
//! daemon for things here. It takes requests, never hands out fds; it is
//! mode 0600 and checks the peer's uid (root or our own). One JSON line in,
//! one JSON line out; input is bounded in size and time so a hostile or
//! stuck client can neither crash nor block the daemon.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exit::Exit;
use crate::shortage::{self, SpareFd};
use crate::telemetry::{accept_failed, Throttle};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

const MAX_REQUEST: u64 = 64 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    Reload,
    Status,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reply {
    pub ok: bool,
    /// The exit code a CLI client should end with.
    pub exit_code: i32,
    pub message: String,
    /// The serving generation's pid, when the answer names one.
    #[serde(default)]
    pub pid: Option<u32>,
}

impl Reply {
    /// Success, naming the generation `pid` that now serves.
    pub fn serving(pid: u32, message: impl Into<String>) -> Reply {
        Reply {
            ok: true,
            exit_code: Exit::Clean.code(),
            message: message.into(),
            pid: Some(pid),
        }
    }

    pub fn err(exit: Exit, message: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            exit_code: exit.code(),
            message: message.into(),
            pid: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    command: Request,
}

/// A request on its way to the supervisor, with where to send the answer.
pub struct Incoming {
    pub request: Request,
    pub reply: oneshot::Sender<Reply>,
}

/// Binds the socket at `path`, mode 0600 from its creation (set on the
/// socket before `bind`, so no umask and no moment exposes it). A stale
/// socket there is replaced; a live daemon's socket, a symlink (never
/// followed) or any other kind of file is refused, and left as it is.
pub fn bind(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(refused("is a symbolic link; it is not followed"))
        }
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(refused("exists and is not a socket"))
        }
        Ok(_) if std::os::unix::net::UnixStream::connect(path).is_ok() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "in use by a running daemon (another baton with this path)",
            ));
        }
        Ok(_) => {
            std::fs::remove_file(path).map_err(|e| doing("cannot remove the stale socket", e))?
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| doing(&format!("cannot create its directory {}", dir.display()), e))?;
    }
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    // Linux creates the socket file with the socket inode's mode less the
    // umask: set it to 0600 before the file exists.
    nix::sys::stat::fchmod(&socket, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
    socket.bind(&socket2::SockAddr::unix(path)?)?;
    socket.listen(128)?;
    let listener: std::os::unix::net::UnixListener = socket.into();
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The path itself is named by the caller's error.
fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("{why}; refusing to replace it"),
    )
}

/// `err` with what baton was doing, its kind kept (a caller's remedy goes
/// by it).
fn doing(what: &str, err: std::io::Error) -> std::io::Error {
    std::io::Error::new(err.kind(), format!("{what}: {err}"))
}

/// Accepts until `stop`; each request goes to `requests`.
/// Each accepted request is handled in a task on `tasks`, so a generation
/// that stops accepting can still answer the requests it took.
pub async fn serve(
    listener: UnixListener,
    requests: mpsc::Sender<Incoming>,
    stop: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
) {
    let accept_errors = Throttle::new();
    let spare = SpareFd::new();
    loop {
        let mut accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        if accepted.as_ref().is_err_and(shortage::fd_table_full) && spare.give_up() {
            // The spare's place takes it: `baton reload` is answered (a
            // reload with no fds to be had says why it failed).
            match spare.taken_by(listener.accept()) {
                Some(taken) => accepted = Ok(taken),
                None => continue,
            }
        }
        match accepted {
            Ok((stream, _)) => {
                let requests = requests.clone();
                let refill = spare.refilled_at_end();
                tasks.spawn(async move {
                    // Dropped after `handle`, which closes the stream.
                    let _refill = refill;
                    if let Err(err) = handle(stream, requests).await {
                        tracing::info!(cause = %err, "control request rejected");
                    }
                });
            }
            Err(err) => {
                accept_failed(&err, &accept_errors, "control accept failed; backing off");
                spare.refill();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handle(stream: UnixStream, requests: mpsc::Sender<Incoming>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let reply = match authorize(write.as_ref()) {
        Err(reply) => reply,
        Ok(()) => match read_request(read).await {
            Err(reply) => reply,
            Ok(request) => {
                let (tx, rx) = oneshot::channel();
                if requests
                    .send(Incoming { request, reply: tx })
                    .await
                    .is_err()
                {
                    Reply::err(Exit::Failure, "the daemon is stopping")
                } else {
                    rx.await.unwrap_or_else(|_| {
                        Reply::err(Exit::Failure, "the daemon dropped the request")
                    })
                }
            }
        },
    };
    let mut line = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    write.write_all(&line).await
}

fn authorize(stream: &UnixStream) -> Result<(), Reply> {
    match refused_peer(stream) {
        Ok(None) => Ok(()),
        // As a socket whose mode refused the user: not reached (69).
        Ok(Some(uid)) => Err(Reply::err(
            Exit::Unreachable,
            format!("uid {uid} may not control this daemon"),
        )),
        Err(e) => Err(Reply::err(Exit::Failure, format!("SO_PEERCRED: {e}"))),
    }
}

/// The uid of `stream`'s peer if it may not command this daemon: only
/// root and baton's own user may (`SO_PEERCRED`), whatever the socket
/// file's mode (a careless chmod, or a socket systemd made and handed over
/// with a mode of its own).
pub fn refused_peer(stream: &UnixStream) -> std::io::Result<Option<u32>> {
    let uid = stream.peer_cred()?.uid();
    let allowed = uid == 0 || uid == nix::unistd::geteuid().as_raw();
    Ok((!allowed).then_some(uid))
}

async fn read_request(read: tokio::net::unix::OwnedReadHalf) -> Result<Request, Reply> {
    let mut line = Vec::new();
    let mut limited = BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST));
    match tokio::time::timeout(READ_TIMEOUT, limited.read_until(b'\n', &mut line)).await {
        Err(_) => return Err(Reply::err(Exit::Usage, "no request within 5s")),
        Ok(Err(e)) => return Err(Reply::err(Exit::Usage, format!("read: {e}"))),
        Ok(Ok(_)) => {}
    }
    decode_request(&line)
}

/// Decodes one request line; what is wrong with it becomes the reply.
pub fn decode_request(line: &[u8]) -> Result<Request, Reply> {
    serde_json::from_slice::<Envelope>(line)
        .map(|e| e.command)
        .map_err(|e| Reply::err(Exit::Usage, format!("malformed request: {e}")))
}

/// Client side: sends one request and waits up to `timeout` for the reply.
pub async fn call(path: &Path, request: Request, timeout: Duration) -> Result<Reply, CallError> {
    let mut stream = UnixStream::connect(path)
        .await
        .map_err(|source| CallError::Unreachable {
            path: path.display().to_string(),
            source,
        })?;
    let mut line =
        serde_json::to_vec(&Envelope { command: request }).map_err(std::io::Error::other)?;
    line.push(b'\n');
    // A daemon that refuses us answers without reading and hangs up, so
    // the write may fail while its answer waits to be read: read it.
    let written = stream.write_all(&line).await;
    let mut answer = Vec::new();
    let mut reader = BufReader::new(stream);
    match tokio::time::timeout(timeout, reader.read_until(b'\n', &mut answer)).await {
        Err(_) => Err(CallError::NoAnswer(timeout)),
        Ok(Err(e)) => Err(written.err().unwrap_or(e).into()),
        Ok(Ok(0)) => Err(written.err().map_or(CallError::Hangup, CallError::Io)),
        Ok(Ok(_)) => {
            serde_json::from_slice(&answer).map_err(|e| CallError::Malformed(e.to_string()))
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot reach the daemon at {path}: {source}")]
    Unreachable {
        path: String,
        source: std::io::Error,
    },
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon gave no answer within {0:?}")]
    NoAnswer(Duration),
    #[error("the daemon hung up without answering")]
    Hangup,
    #[error("malformed answer from the daemon: {0}")]
    Malformed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` as it is written on the socket: one JSON line.
    fn line(value: &impl Serialize) -> Vec<u8> {
        let mut line = serde_json::to_vec(value).expect("json");
        line.push(b'\n');
        line
    }

    macro_rules! golden {
        ($name:literal) => {
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/golden/control/0.1.0/",
                $name,
                ".json"
            ))
        };
    }

    /// A package upgrade's reload is the new release's `baton reload`
    /// asking the old release's daemon (`ExecReload=`), and a rollback's the
    /// reverse: requests and answers are what release 0.1.0 writes, byte
    /// for byte, and what it wrote is read (`tests/golden/control/`).
    #[test]
    fn the_control_lines_of_release_0_1_0_are_spoken() {
        for (request, golden) in [
            (Request::Reload, &golden!("reload")[..]),
            (Request::Status, &golden!("status")[..]),
        ] {
            assert_eq!(line(&Envelope { command: request }), golden, "{request:?}");
            assert_eq!(decode_request(golden), Ok(request), "{request:?}");
        }
        let serving = Reply::serving(4242, "generation 5 (pid 4242) is serving");
        let failed = Reply::err(
            Exit::Config,
            "reload failed: new generation failed (exit 78): config invalid",
        );
        for (reply, golden) in [
            (serving, &golden!("reply_reloaded")[..]),
            (failed, &golden!("reply_failed")[..]),
        ] {
            assert_eq!(line(&reply), golden, "{reply:?}");
            let read: Reply = serde_json::from_slice(golden).expect("reply");
            assert_eq!(read, reply);
        }
        // A field a later release adds is read past, either way.
        let later = br#"{"ok":true,"exit_code":0,"message":"m","pid":1,"took_ms":9}"#;
        assert!(serde_json::from_slice::<Reply>(later).is_ok());
        let asked = br#"{"command":"reload","wait_ms":100}"#;
        let envelope: Envelope = serde_json::from_slice(asked).expect("envelope");
        assert_eq!(envelope.command, Request::Reload);
    }
}
