//! The kernel's own word that a reload dropped nothing, without eBPF: the
//! network namespace's listen-queue counters from `/proc/net/netstat`, and
//! each listening socket's accept-queue length from `/proc/net/tcp{,6}`
//! (for a LISTEN socket, `rx_queue` is the accept queue, as `ss -ltn`'s
//! Recv-Q shows), found by the socket's inode.

use std::collections::HashMap;

/// `TcpExt` counters this namespace has counted since boot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Netstat {
    pub listen_overflows: u64,
    pub listen_drops: u64,
    pub migrate_success: u64,
    pub migrate_failure: u64,
}

pub fn netstat() -> Netstat {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
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
            values.insert(n, v.parse().unwrap_or(0));
        }
    }
    let get = |k: &str| values.get(k).copied().unwrap_or(0);
    Netstat {
        listen_overflows: get("ListenOverflows"),
        listen_drops: get("ListenDrops"),
        migrate_success: get("TCPMigrateReqSuccess"),
        migrate_failure: get("TCPMigrateReqFailure"),
    }
}

/// The socket inode behind one of our fds (`socket:[N]` in `/proc/self/fd`).
pub fn socket_inode(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Accept-queue lengths of LISTEN sockets, by inode.
pub fn listen_queues() -> HashMap<u64, u64> {
    let mut out = HashMap::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let rx = f[4]
                .split_once(':')
                .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok());
            if let (Some(rx), Ok(inode)) = (rx, f[9].parse::<u64>()) {
                out.insert(inode, rx);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_is_found_with_its_queue() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _queued: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
            .collect();
        let inode = socket_inode(std::os::fd::AsFd::as_fd(&listener)).expect("inode");
        assert_eq!(listen_queues().get(&inode), Some(&3));
        let _ = netstat();
    }
}
