//! baton's own shortages: the errors a socket call gives when this process
//! or host ran out of something (descriptors, memory, socket buffers, the
//! epoll watches a user may hold: ENOSPC, from the registration tokio makes
//! of an accepted or connecting socket), not because a peer failed. (Not EADDRNOTAVAIL: besides no local port left,
//! it is also an IPv6 backend with no source address to reach it from, a
//! fault of that backend's address that its health must show.) The accept loop backs off on
//! them; a connect to a backend that meets one does not count against the
//! backend, or a full fd table would mark every backend down.

use std::io;

use nix::errno::Errno;

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

#[cfg(test)]
mod tests {
    use super::*;

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
