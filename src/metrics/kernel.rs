//! The kernel's own word that a reload dropped nothing, without eBPF: the
//! network namespace's listen-queue counters from `/proc/net/netstat`, and
//! each listening socket's accept-queue length from `TCP_INFO` (for a
//! LISTEN socket, `tcpi_unacked` is the accept queue, `ss -ltn`'s Recv-Q).
//! One syscall per socket, whatever else the host has open: reading
//! `/proc/net/tcp` instead cost a scrape hundreds of milliseconds at tens
//! of thousands of connections.
//!
//! `unsafe`: `getsockopt` into a `tcp_info`.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::{PoisonError, RwLock};

/// `TcpExt` counters this namespace has counted since boot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Netstat {
    pub listen_overflows: u64,
    pub listen_drops: u64,
    pub migrate_success: u64,
    pub migrate_failure: u64,
}

/// The counters, or `None` where `/proc/net/netstat` cannot be read now
/// (no fd to be had, say). Not zeros: a new generation, which carries none
/// of these counters from the old one, showing 0 at its first scrape
/// looked like a reset to Prometheus, whose `increase()` then counted every
/// overflow since boot, on the metric meant to prove a reload lost nothing.
pub fn netstat() -> Option<Netstat> {
    parse_netstat(&std::fs::read_to_string("/proc/net/netstat").ok()?)
}

/// The counters in `/proc/net/netstat`'s `text`; `None` without its
/// `TcpExt` lines (their `ListenOverflows`).
fn parse_netstat(text: &str) -> Option<Netstat> {
    let mut lines = text.lines();
    let mut values: HashMap<&str, u64> = HashMap::new();
    while let (Some(names), Some(nums)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        for (n, v) in names
            .split_whitespace()
            .zip(nums.split_whitespace())
            .skip(1)
        {
            if let Ok(v) = v.parse() {
                values.insert(n, v);
            }
        }
    }
    if !values.contains_key("ListenOverflows") {
        return None;
    }
    // A kernel that does not count one (before 5.14: no migrations) says 0.
    let get = |k: &str| values.get(k).copied().unwrap_or(0);
    Some(Netstat {
        listen_overflows: get("ListenOverflows"),
        listen_drops: get("ListenDrops"),
        migrate_success: get("TCPMigrateReqSuccess"),
        migrate_failure: get("TCPMigrateReqFailure"),
    })
}

/// One listening socket's accept queue, as the admin reads it while the
/// accept loop owns the socket. The loop shows its fd here for as long as
/// the socket is open ([`Shown`], dropped before the socket); the write
/// lock waits out a reading in progress, so a reading never meets a closed
/// fd or one whose number went to another socket since.
#[derive(Debug, Default)]
pub struct AcceptQueue {
    fd: RwLock<Option<RawFd>>,
}

/// `socket` shown in an [`AcceptQueue`] until this is dropped: drop it
/// before the socket closes (declared after it, or dropped by hand).
#[must_use]
pub struct Shown<'a>(&'a AcceptQueue);

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        self.0.set(None);
    }
}

impl AcceptQueue {
    /// Shows `socket`, which must stay open while the guard lives.
    pub fn show(&self, socket: BorrowedFd<'_>) -> Shown<'_> {
        self.set(Some(socket.as_raw_fd()));
        Shown(self)
    }

    fn set(&self, fd: Option<RawFd>) {
        *self.fd.write().unwrap_or_else(PoisonError::into_inner) = fd;
    }

    /// Connections waiting in the kernel's queue (0 while nothing is
    /// shown).
    pub fn waiting(&self) -> u64 {
        let fd = self.fd.read().unwrap_or_else(PoisonError::into_inner);
        fd.and_then(tcp_accept_queue).unwrap_or(0)
    }
}

/// How many connections wait in a listening socket's accept queue now.
pub fn accept_queue(socket: BorrowedFd<'_>) -> Option<u64> {
    tcp_accept_queue(socket.as_raw_fd())
}

/// `TCP_INFO`'s `tcpi_unacked` for a listening socket `fd`.
fn tcp_accept_queue(fd: RawFd) -> Option<u64> {
    // SAFETY: all-zero bytes are a valid `tcp_info` (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>()).ok()?;
    // SAFETY: `info` is writable for `len` bytes and the kernel writes at
    // most `len` of them (on any fd; that `fd` is our listening socket is
    // `AcceptQueue`'s care, for a right answer, not for soundness).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::addr_of_mut!(info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(u64::from(info.tcpi_unacked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_not_read_are_none_not_zeros() {
        assert_eq!(parse_netstat(""), None, "a read cut short");
        let other = "IpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(parse_netstat(other), None, "no TcpExt lines");
        let text = "IpExt: InNoRoutes\nIpExt: 0\nTcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 1 7 9\n";
        let read = parse_netstat(text).expect("counters");
        assert_eq!((read.listen_overflows, read.listen_drops), (7, 9));
        assert_eq!(read.migrate_success, 0, "not counted by this kernel");
    }

    #[test]
    fn a_shown_listening_socket_reads_its_queue_and_nothing_once_hidden() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _queued: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
            .collect();
        let queue = AcceptQueue::default();
        assert_eq!(queue.waiting(), 0, "not shown yet");
        let shown = queue.show(std::os::fd::AsFd::as_fd(&listener));
        assert_eq!(queue.waiting(), 3);
        drop(shown);
        assert_eq!(queue.waiting(), 0);
        assert!(netstat().is_some(), "this namespace's counters");
    }
}
