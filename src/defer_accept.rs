//! `TCP_DEFER_ACCEPT` on a listening socket: set by `listener` as an
//! accept loop starts, cleared by `lifecycle` as a stop begins.
//!
//! `unsafe`: the socket option, which neither socket2 nor nix wraps.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// How long the kernel holds a connection whose client sent nothing yet
/// before queueing it anyway, in `TCP_DEFER_ACCEPT`'s seconds (rounded up
/// to SYN-ACK retransmissions: the first one, at 1 s, brings it).
const DEFER_SECONDS: libc::c_int = 1;

/// How long after its handshake a deferred connection may still be held
/// out of the accept queue: the first SYN-ACK retransmission (1 s, the
/// kernel's initial RTO) and the client's answer to it, with room.
pub const DEFERRED_AT_MOST: Duration = Duration::from_millis(1500);

/// A connection, once its handshake completes, is queued for accepting
/// only when its client's first bytes come (or after [`DEFER_SECONDS`]),
/// so the accept finds the request already there: one wake-up and one
/// empty read fewer a connection. nginx's `deferred`, HAProxy's
/// `defer-accept`. Until then the client counts the connection open and
/// the kernel holds it out of the accept queue, so a stop undoes this
/// (see [`stop_deferring`]) before it closes the socket.
pub fn set_defer_accept(socket: BorrowedFd<'_>, on: bool) -> std::io::Result<()> {
    let seconds: libc::c_int = if on { DEFER_SECONDS } else { 0 };
    // SAFETY: the value is a c_int of the length given, read by the kernel.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::addr_of!(seconds).cast(),
            socklen_of::<libc::c_int>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Clears `TCP_DEFER_ACCEPT` on a listening TCP socket; true if it was
/// set. Connections the kernel already holds back are queued when their
/// first bytes come or at the SYN-ACK retransmission, within
/// [`DEFERRED_AT_MOST`] of their handshake; new ones as their handshake
/// completes.
pub fn stop_deferring(socket: BorrowedFd<'_>) -> bool {
    defers_accept(socket) && set_defer_accept(socket, false).is_ok()
}

/// Whether `TCP_DEFER_ACCEPT` is set on `socket` (false on a socket of
/// another kind).
pub fn defers_accept(socket: BorrowedFd<'_>) -> bool {
    let mut seconds: libc::c_int = 0;
    let mut len = socklen_of::<libc::c_int>();
    // SAFETY: `seconds` is writable for `len` bytes; on another kind of
    // socket the call fails and writes nothing.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::addr_of_mut!(seconds).cast(),
            &mut len,
        )
    };
    rc == 0 && seconds > 0
}

fn socklen_of<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(libc::socklen_t::MAX)
}
