//! Whether any generation listens: the keeper's test, once a generation
//! ended as a failure, of whether anything is left to take connections.
//! A generation that serves holds the listening sockets (adopted or its
//! own), one starting holds at least its admin socket (listening from its
//! first instant) or the sockets its predecessor offered; one draining
//! after a reload has closed its copies. So, read from `/proc`: does any
//! process of the generations' group hold a listening socket, TCP or
//! Unix? One whose sockets cannot be read (`hidepid`, a process made
//! undumpable by file capabilities) is taken to listen: a fresh generation
//! started beside a serving one would split its traffic.

use std::collections::HashSet;

/// The kernel's state number for LISTEN in `/proc/net/tcp`.
const LISTEN: &str = "0A";

/// `__SO_ACCEPTCON` in `/proc/net/unix`'s flags: a listening socket.
const UNIX_LISTENING: &str = "00010000";

/// Whether a process of process group `group` holds a listening socket
/// (TCP over IPv4 or IPv6, or Unix) of this network namespace. A `/proc`
/// of another PID namespace (`unshare --pid` without `--mount-proc`, a
/// host's bind-mounted) names no process of ours: it counts as unreadable.
pub fn anyone_listens(group: i32) -> bool {
    let Some(listening) = listening_inodes().filter(|_| proc_is_ours()) else {
        return true;
    };
    members(group).any(|pid| holds_any(pid, &listening))
}

/// Whether `/proc` is this PID namespace's: `/proc/self` names us.
fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|target| target.to_str()?.parse::<u32>().ok())
        == Some(std::process::id())
}

/// The inodes of every listening socket; none if a table cannot be read
/// (a kernel without IPv6 has no `tcp6`: nothing listens there).
fn listening_inodes() -> Option<HashSet<u64>> {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = match std::fs::read_to_string(table) {
            Ok(text) => text,
            Err(err) if table.ends_with('6') && err.kind() == std::io::ErrorKind::NotFound => {
                continue
            }
            Err(_) => return None,
        };
        inodes.extend(text.lines().skip(1).filter_map(listening_inode));
    }
    let unix = std::fs::read_to_string("/proc/net/unix").ok()?;
    inodes.extend(unix.lines().skip(1).filter_map(listening_unix_inode));
    Some(inodes)
}

/// A TCP table line's socket inode, if it is a listening socket's.
fn listening_inode(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields.get(3) == Some(&LISTEN))
        .then(|| fields.get(9)?.parse().ok())
        .flatten()
}

/// A Unix table line's socket inode, if it is a listening socket's.
fn listening_unix_inode(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields.get(3) == Some(&UNIX_LISTENING))
        .then(|| fields.get(6)?.parse().ok())
        .flatten()
}

/// The processes of `group`.
fn members(group: i32) -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(move |&pid| group_of(pid) == Some(group))
}

/// A process's group, from `/proc/PID/stat` (its fifth field).
fn group_of(pid: u32) -> Option<i32> {
    crate::lifecycle::process::stat_field(pid, 5)?.parse().ok()
}

/// Whether `pid` holds one of the `sockets` (by inode), or its fds cannot
/// be read (see the module's doc).
fn holds_any(pid: u32, sockets: &HashSet<u64>) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return std::path::Path::new(&format!("/proc/{pid}")).exists();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .any(|inode: u64| sockets.contains(&inode))
}

#[cfg(test)]
mod tests {
    use super::{anyone_listens, listening_inode, listening_unix_inode};

    #[test]
    fn a_table_line_names_a_listening_socket_s_inode() {
        let listening = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0";
        let connected = "   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(listening_inode(listening), Some(4242));
        assert_eq!(listening_inode(connected), None);
        assert_eq!(listening_inode("garbage"), None);
        let unix_listening =
            "0000000000000000: 00000002 00000000 00010000 0001 01 5151 /run/baton/control.sock";
        let unix_connected = "0000000000000000: 00000003 00000000 00000000 0001 03 5252";
        assert_eq!(listening_unix_inode(unix_listening), Some(5151));
        assert_eq!(listening_unix_inode(unix_connected), None);
    }

    /// This test process's own group listens once it holds a listening
    /// socket, and not before (another test's may, alongside: so only
    /// the "after" is asserted of this group, the "before" of a group
    /// with no process).
    #[test]
    fn a_group_listens_while_a_member_holds_a_listening_socket() {
        let own = nix::unistd::getpgrp().as_raw();
        let _listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        assert!(anyone_listens(own));
        assert!(!anyone_listens(i32::MAX - 1), "no such group");
    }
}
