//! A backend's idle HTTP/1 connections, kept for the next request. A
//! connection comes back here only after a clean end of response with
//! keep-alive on both sides; it leaves as the freshest one the backend has
//! not closed meanwhile (checked with a non-blocking peek, so a connection
//! the backend closed while idle is never written to). Connections idle
//! longer than `IDLE_LIMIT`, below the usual backend keep-alive timeouts
//! (nginx 75 s, Node 5 s, Go none), are closed rather than reused.

use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::socket::{recv, MsgFlags};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Idle time after which a connection is closed rather than reused.
pub const IDLE_LIMIT: Duration = Duration::from_secs(4);
/// Idle connections kept per backend, at most: beyond it a returned
/// connection is closed (bounded fds after a burst).
const MAX_IDLE: usize = 512;

#[derive(Default)]
pub struct IdleConnections {
    /// Oldest first: taken from the back, expired from the front.
    conns: Mutex<Vec<(TcpStream, Instant)>>,
}

impl IdleConnections {
    /// The freshest connection still open, if any; closes those found
    /// closed, expired or holding stray bytes on the way.
    pub fn take(&self) -> Option<TcpStream> {
        let Ok(mut conns) = self.conns.lock() else {
            return None;
        };
        while let Some((stream, since)) = conns.pop() {
            if since.elapsed() < IDLE_LIMIT && still_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    /// Keeps `stream` for reuse, dropping connections that expired.
    pub fn put(&self, stream: TcpStream) {
        let Ok(mut conns) = self.conns.lock() else {
            return;
        };
        let expired = conns
            .iter()
            .take_while(|(_, since)| since.elapsed() >= IDLE_LIMIT)
            .count();
        conns.drain(..expired);
        if conns.len() < MAX_IDLE {
            conns.push((stream, Instant::now()));
        }
    }

    /// Closes every connection idle past `IDLE_LIMIT` (run now and then,
    /// so a backend's closed connections do not linger after traffic stops).
    pub fn sweep(&self) {
        if let Ok(mut conns) = self.conns.lock() {
            conns.retain(|(_, since)| since.elapsed() < IDLE_LIMIT);
        }
    }
}

/// An idle connection is usable only if nothing is readable on it: EOF
/// means the backend closed it, and bytes would be a response to nothing.
fn still_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(
        recv(
            stream.as_raw_fd(),
            &mut probe,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Err(nix::errno::Errno::EAGAIN)
    )
}
