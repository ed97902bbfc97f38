//! baton's own shortages: the errors a socket call gives when this process
//! or host ran out of something (descriptors, memory, socket buffers, the
//! epoll watches a user may hold: ENOSPC, from the registration tokio makes
//! of an accepted or connecting socket), not because a peer failed. The
//! accept loop backs off on them; a connect to a backend that meets one
//! does not count against the backend, or a full fd table would mark every
//! backend down. So does a connect to an IPv4 backend that found no local
//! port free (`no_local_port`).

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use nix::errno::Errno;

/// An fd held in reserve for a door that must open with the fd table
/// full (clients and backends holding every fd): the admin surface, whose
/// `/healthz` went unanswered (an orchestrator whose liveness probe fails
/// restarts the process, every connection lost), and the control socket
/// (`baton reload` was refused). Its place is given up for an accept that
/// found no room, and taken again when a connection on that door ends.
/// One per door: each accept loop owns its own.
pub struct SpareFd(Mutex<Option<std::fs::File>>);

impl SpareFd {
    /// One, held if there is room now.
    pub fn new() -> Arc<SpareFd> {
        let spare = Arc::new(SpareFd(Mutex::new(None)));
        spare.refill();
        spare
    }

    /// Gives the place up, for the next accept: whether one was held.
    pub fn give_up(&self) -> bool {
        self.held().take().is_some()
    }

    /// Once the place is given up: the connection `accept` takes in one
    /// poll, if one is waiting. If none is (the kernel takes a place before
    /// it looks at the queue, so an empty queue meets EMFILE too), the
    /// place is held again in the same breath: given up with no connection
    /// to take it, the data plane's next accept took it, and the next probe
    /// met EMFILE. (Polled once, not under a zero timeout, which waits for
    /// the timer's next millisecond before it gives up.)
    pub fn taken_by<T>(
        &self,
        accept: impl std::future::Future<Output = io::Result<T>>,
    ) -> Option<T> {
        match futures_util::FutureExt::now_or_never(accept) {
            Some(Ok(accepted)) => Some(accepted),
            _ => {
                self.refill();
                None
            }
        }
    }

    /// Holds a place again, if none is held and there is room.
    pub fn refill(&self) {
        let mut held = self.held();
        if held.is_none() {
            *held = std::fs::File::open("/dev/null").ok();
        }
    }

    /// Refills it when dropped: held by a connection's task, declared
    /// before the connection, so the connection's fd is closed first.
    pub fn refilled_at_end(self: &Arc<Self>) -> Refill {
        Refill(Arc::clone(self))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<std::fs::File>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts `work` on a thread of its own now, and gives the wait for its
/// result: blocking work kept off the runtime's threads. An error here is
/// the thread not to be had (a pid or thread limit reached), with `work`
/// not run: tokio's `spawn_blocking` panicked then, after queueing the
/// work where nothing would run it. The wait's error is `work` panicking.
pub fn on_a_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<impl std::future::Future<Output = io::Result<T>>> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = done.send(work());
        })?;
    Ok(async move {
        result
            .await
            .map_err(|_| io::Error::other("its thread panicked"))
    })
}

/// See [`SpareFd::refilled_at_end`].
pub struct Refill(Arc<SpareFd>);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.refill();
    }
}

/// Whether `err` says baton ran short, rather than that the peer failed.
pub fn is_own(err: &io::Error) -> bool {
    err.raw_os_error().is_some_and(|code| {
        [
            Errno::EMFILE,
            Errno::ENFILE,
            Errno::ENOBUFS,
            Errno::ENOMEM,
            Errno::ENOSPC,
        ]
        .iter()
        .any(|shortage| *shortage as i32 == code)
    })
}

/// Whether `err` says the fd table is full (EMFILE, or the host's, ENFILE),
/// not that something else ran short.
pub fn fd_table_full(err: &io::Error) -> bool {
    err.raw_os_error()
        .is_some_and(|e| e == Errno::EMFILE as i32 || e == Errno::ENFILE as i32)
}

/// Whether a connect to `to` failed for want of a local port: EADDRNOTAVAIL
/// to an IPv4 address, whose every ephemeral port toward it is taken
/// (`ip_local_port_range`; churn through a `send_proxy` pool or TCP mode
/// fills it with TIME_WAIT). Counted against the backend, it marked a busy
/// pool's backends down together, and a passing shortage was an outage,
/// as HAProxy does not make it. To an IPv6 address the same error also
/// says no source address of this host reaches it: that backend's own
/// fault, which its health must show.
pub fn no_local_port(err: &io::Error, to: SocketAddr) -> bool {
    // An IPv4-mapped address is IPv4 on the wire.
    to.ip().to_canonical().is_ipv4() && err.raw_os_error() == Some(Errno::EADDRNOTAVAIL as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_given_up_is_held_again_once_refilled() {
        let spare = SpareFd::new();
        assert!(spare.give_up(), "held from the start");
        assert!(!spare.give_up(), "given up once");
        drop(spare.refilled_at_end());
        assert!(spare.give_up(), "held again");
    }

    #[test]
    fn no_port_left_is_ours_toward_ipv4_alone() {
        let taken = io::Error::from_raw_os_error(Errno::EADDRNOTAVAIL as i32);
        let v4: SocketAddr = "10.0.0.5:80".parse().expect("address");
        let v6: SocketAddr = "[2001:db8::5]:80".parse().expect("address");
        assert!(no_local_port(&taken, v4));
        assert!(!no_local_port(&taken, v6), "no source address reaches it");
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:80".parse().expect("address");
        assert!(no_local_port(&taken, mapped));
        let refused = io::Error::from_raw_os_error(Errno::ECONNREFUSED as i32);
        assert!(!no_local_port(&refused, v4));
    }

    #[test]
    fn running_short_is_a_shortage_a_refusal_is_not() {
        let shortage = |e: Errno| is_own(&io::Error::from_raw_os_error(e as i32));
        assert!(shortage(Errno::EMFILE));
        assert!(shortage(Errno::ENFILE));
        assert!(shortage(Errno::ENOSPC), "epoll's max_user_watches");
        assert!(shortage(Errno::ENOBUFS), "socket buffers");
        assert!(shortage(Errno::ENOMEM), "memory");
        assert!(!shortage(Errno::EADDRNOTAVAIL));
        assert!(!shortage(Errno::ECONNREFUSED));
        assert!(!shortage(Errno::ETIMEDOUT));
        assert!(!is_own(&io::Error::other("no errno")));
    }
}
