//! Shared helpers for the integration tests: real backends on 127.0.0.1,
//! the real `baton` binary (or a daemon inside the test process,
//! `in_process`), real clients. Each test binary uses a subset,
//! hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod backend;
pub mod client;
pub mod daemon;
pub mod dns;
pub mod h2_raw;
pub mod in_process;
pub mod load;
pub mod netns;
pub mod proxied;
pub mod raw;
pub mod sandbox;
pub mod skip;
pub mod tls;

use std::time::Duration;

/// The bound on every wait in the tests: generous, since CI machines are noisy.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// The next connection `listener` accepts; `None` once `stop` is
/// cancelled or accepting fails (a test backend's accept loop).
pub async fn accept_until(
    listener: &tokio::net::TcpListener,
    stop: &tokio_util::sync::CancellationToken,
) -> Option<tokio::net::TcpStream> {
    tokio::select! {
        () = stop.cancelled() => None,
        accepted = listener.accept() => accepted.ok().map(|(s, _)| s),
    }
}

/// Whether `probe` (a command that needs what a test needs: root, a
/// namespace) succeeds here; if not, the test is skipped as needing
/// `needs` (see `skip`).
pub fn possible_or_skipped(probe: &[&str], needs: &str) -> bool {
    let Some((program, args)) = probe.split_first() else {
        return false;
    };
    let possible = std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    skip::skipped_unless(possible, needs)
}

/// Skips a test for what the host may not give, CI's host too: unlike
/// [`skip::skipped_unless`], this does not fail under `CI`. Only for what is the
/// host's choice rather than CI's setup: a pids cgroup of a test's own
/// (a container on cgroup v2 often has no pids controller to delegate;
/// this project's machine kind has cgroup v1's, where the test runs).
pub fn skipped_on_this_host(needs: &str) {
    eprintln!("skipped: needs {needs}, which this host does not give");
}

/// Now, in Unix seconds: what `/status` and the metrics give times in.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Polls `check` every 20 ms until it holds or `TIMEOUT` passes.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while tokio::time::Instant::now() < deadline {
        // A check that hangs (a request nobody answers) fails in time too.
        if tokio::time::timeout_at(deadline, check()).await == Ok(true) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Inodes of the TCP sockets listening on `port` (`/proc/net/tcp` and
/// `tcp6`; the tests share baton's network namespace): the same inodes
/// after a reload or restart mean the very same kernel sockets.
pub fn listening_inodes(port: u16) -> Vec<u64> {
    let table = ["/proc/net/tcp", "/proc/net/tcp6"]
        .map(|t| std::fs::read_to_string(t).unwrap_or_default())
        .join("\n");
    let mut inodes: Vec<u64> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit_once(':')?.1;
            (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == "0A")
                .then(|| f.get(9)?.parse().ok())?
        })
        .collect();
    inodes.sort_unstable();
    inodes
}

/// The send queue of the TCP connection from local port `local` to remote
/// port `remote`, as `/proc/net/tcp` lists it (the tests share baton's
/// network namespace): bytes written and not yet taken by the peer. `None`
/// when no such connection is listed.
pub fn send_queue(local: u16, remote: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let port = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if port(f.get(1)?)? != local || port(f.get(2)?)? != remote {
            return None;
        }
        let (tx, _) = f.get(4)?.split_once(':')?;
        u64::from_str_radix(tx, 16).ok()
    })
}

/// What a connection reads until it ends, and how it ended: `Ok` for a
/// FIN, the error's kind for a reset.
pub async fn read_to_the_end(
    s: &mut tokio::net::TcpStream,
) -> (Vec<u8>, Result<(), std::io::ErrorKind>) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let ended = tokio::time::timeout(TIMEOUT, s.read_to_end(&mut got))
        .await
        .expect("the connection ends");
    (got, ended.map(drop).map_err(|e| e.kind()))
}

/// Writes `len` bytes to `s` in 64 KiB chunks, pausing for `pause`
/// halfway (a client that uploads in two bursts), each chunk taken within
/// [`TIMEOUT`]; panics naming the chunk whose write failed.
pub async fn upload_with_a_pause(s: &mut tokio::net::TcpStream, len: usize, pause: Duration) {
    use tokio::io::AsyncWriteExt;
    let chunk = vec![b'z'; 64 * 1024];
    let chunks = len / chunk.len();
    for n in 0..chunks {
        if n == chunks / 2 {
            tokio::time::sleep(pause).await;
        }
        tokio::time::timeout(TIMEOUT, s.write_all(&chunk))
            .await
            .unwrap_or_else(|_| panic!("chunk {n} taken in time"))
            .unwrap_or_else(|e| panic!("chunk {n} of the body written: {e}"));
    }
}

/// The next `n` bytes `s` reads, within [`TIMEOUT`].
pub async fn read_exactly(s: &mut tokio::net::TcpStream, n: usize) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = vec![0u8; n];
    tokio::time::timeout(TIMEOUT, s.read_exact(&mut got))
        .await
        .expect("the bytes in time")
        .expect("read");
    got
}

/// Closes `s` with a reset (`SO_LINGER` 0).
pub fn reset(s: tokio::net::TcpStream) {
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
    drop(s);
}

/// Sends a request on `client`, a connection made earlier that said
/// nothing yet (held back by `defer_accept`), and asserts its whole
/// response from backend "a" came, not a reset.
pub async fn served_when_it_speaks(mut client: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    client
        .write_all(b"GET /late HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut reply = String::new();
    tokio::time::timeout(TIMEOUT, client.read_to_string(&mut reply))
        .await
        .expect("in time")
        .expect("no reset");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert!(
        reply.ends_with(&backend::HttpBackend::body_for("a", "/late")),
        "{reply:?}"
    );
}
