//! Who listens on the admin port the CLI is about to send the token to.
//! The port is unprivileged: while baton is stopped (or before it binds),
//! any local user may listen there, and `baton backend` run by root would
//! hand that user the token. So the CLI asks the kernel which uids listen
//! where its connection lands, and which took it once made (`/proc/net/tcp`,
//! `/proc/net/tcp6`), and sends the token only to one who could read the
//! token file anyway.

use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::unistd::{Gid, Uid, User};

/// `/proc/net/tcp`'s states of a listening and of a connected socket.
const LISTEN: &str = "0A";
const ESTABLISHED: &str = "01";

/// One socket of a `/proc/net/tcp{,6}` table.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    local: SocketAddr,
    remote: SocketAddr,
    listening: bool,
    established: bool,
    uid: u32,
}

/// Where a connection to `addr` goes: an unspecified address (an admin
/// listening on `0.0.0.0`, which the CLI connects to as written) is this
/// host's loopback, as the kernel takes it.
pub fn reachable(addr: SocketAddr) -> SocketAddr {
    match canonical(addr.ip()) {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

/// The uids of the sockets a connection to `addr` may land on: those bound
/// to its very address if there are any (the kernel prefers them), else
/// the wildcard ones. `None` for an address that is not this host's: its
/// listeners are out of sight, and no local user can hold them. An error
/// when the kernel's tables cannot be read: who listens cannot be told.
pub fn uids_listening_at(addr: SocketAddr) -> std::io::Result<Option<Vec<u32>>> {
    if !is_own(addr.ip()) {
        return Ok(None);
    }
    let target = canonical(addr.ip());
    let listening: Vec<Row> = rows()?
        .into_iter()
        .filter(|r| r.listening && r.local.port() == addr.port())
        .collect();
    let exact: Vec<u32> = listening
        .iter()
        .filter(|r| r.local.ip() == target)
        .map(|r| r.uid)
        .collect();
    if !exact.is_empty() {
        return Ok(Some(exact));
    }
    let wildcard = |ip: IpAddr| ip.is_unspecified() && (ip.is_ipv6() || target.is_ipv4());
    Ok(Some(
        listening
            .iter()
            .filter(|r| wildcard(r.local.ip()))
            .map(|r| r.uid)
            .collect(),
    ))
}

/// Who took the connection from `ours` to `theirs`, one that stays on
/// this host (`stays_here`): the uid the kernel shows for its other end,
/// its listener's while queued (root's, 0, on older kernels) and
/// its accepter's once accepted. `None` where that end is not in the
/// table (gone).
pub fn uid_that_took(ours: SocketAddr, theirs: SocketAddr) -> std::io::Result<Option<u32>> {
    let (ours, theirs) = (canonical_addr(ours), canonical_addr(theirs));
    Ok(rows()?
        .into_iter()
        .find(|r| r.established && r.local == theirs && r.remote == ours)
        .map(|r| r.uid))
}

/// Whether a connection from `ours` to `theirs` stays on this host.
pub fn stays_here(ours: SocketAddr, theirs: SocketAddr) -> bool {
    let (ours, theirs) = (canonical(ours.ip()), canonical(theirs.ip()));
    theirs.is_loopback() || theirs == ours
}

/// Every socket of the kernel's TCP tables (`tcp6` is missing where the
/// host has no IPv6).
fn rows() -> std::io::Result<Vec<Row>> {
    let mut all = rows_in(&std::fs::read_to_string("/proc/net/tcp")?, false);
    match std::fs::read_to_string("/proc/net/tcp6") {
        Ok(text) => all.extend(rows_in(&text, true)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    Ok(all)
}

/// Whether `ip` is one of this host's addresses: loopback, or one a socket
/// may bind (which a foreign address may not, without `IP_FREEBIND` or
/// `ip_nonlocal_bind`; such a host's connection is told apart once made,
/// `stays_here`).
fn is_own(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// An IPv4-mapped IPv6 address as the IPv4 one it stands for.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn canonical_addr(addr: SocketAddr) -> SocketAddr {
    (canonical(addr.ip()), addr.port()).into()
}

/// The sockets of one table's text. Addresses are the kernel's words
/// printed in its own byte order, ports in hex.
fn rows_in(text: &str, v6: bool) -> Vec<Row> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (fields.get(1)?, fields.get(2)?);
            let (state, uid) = (fields.get(3)?, fields.get(7)?);
            Some(Row {
                local: address(local, v6)?,
                remote: address(remote, v6)?,
                listening: *state == LISTEN,
                established: *state == ESTABLISHED,
                uid: uid.parse().ok()?,
            })
        })
        .collect()
}

/// `0100007F:26AD` (or its IPv6 kin) as an address.
fn address(text: &str, v6: bool) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let ip = if v6 { ipv6(ip)? } else { ipv4(ip)? };
    Some((canonical(ip), u16::from_str_radix(port, 16).ok()?).into())
}

fn ipv4(hex: &str) -> Option<IpAddr> {
    let word = u32::from_str_radix(hex, 16).ok()?;
    Some(IpAddr::V4(Ipv4Addr::from(word.to_ne_bytes())))
}

fn ipv6(hex: &str) -> Option<IpAddr> {
    if hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, chunk) in bytes.chunks_mut(4).enumerate() {
        let word = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    Some(IpAddr::V6(Ipv6Addr::from(bytes)))
}

/// Whether `uid` may read `file` (or is root, or this very user, who read
/// it): every folder on its way searchable by it and the file readable,
/// each by the owner, group or other bits that apply to it. A file that
/// cannot be looked at trusts no one.
pub fn may_read(uid: u32, file: &Path) -> bool {
    if uid == 0 || uid == Uid::effective().as_raw() {
        return true;
    }
    let Ok(file) = std::fs::canonicalize(file) else {
        return false;
    };
    let folders_searchable = file
        .ancestors()
        .skip(1)
        .all(|folder| std::fs::metadata(folder).is_ok_and(|m| grants(uid, &m, 0o1)));
    folders_searchable && std::fs::metadata(&file).is_ok_and(|m| grants(uid, &m, 0o4))
}

/// Whether the mode of `meta` grants `bit` (4 read, 1 search) to `uid`:
/// its owner may (and may change the mode if not), a member of its group
/// by the group's bits, anyone else by the others'.
fn grants(uid: u32, meta: &std::fs::Metadata, bit: u32) -> bool {
    let mode = meta.mode();
    if uid == meta.uid() {
        true
    } else if in_group(uid, Gid::from_raw(meta.gid())) {
        mode & (bit << 3) != 0
    } else {
        mode & bit != 0
    }
}

/// Whether the user `uid` is in `group`, as primary or supplementary.
fn in_group(uid: u32, group: Gid) -> bool {
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(uid)) else {
        return false;
    };
    if user.gid == group {
        return true;
    }
    let Ok(name) = CString::new(user.name) else {
        return false;
    };
    nix::unistd::getgrouplist(&name, user.gid).is_ok_and(|groups| groups.contains(&group))
}

/// `uid`'s user name, for a message, if the user database has one.
pub fn user_name(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => "no user name".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:26AD 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 287 1 0 100 0 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 288 1 0 100 0 0 10 0
   2: 0100007F:26AD 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1002        0 289 1 0 100 0 0 10 0
";

    const TABLE6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:26AD 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   997        0 290 1 0 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 291 1 0 100 0 0 10 0
";

    #[test]
    fn sockets_are_read_in_the_kernels_byte_order() {
        let at = |ip: [u8; 4], port| SocketAddr::from((ip, port));
        let rows = rows_in(TABLE, false);
        let summary: Vec<_> = rows
            .iter()
            .map(|r| (r.local, r.remote, r.listening, r.established, r.uid))
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    at([127, 0, 0, 1], 9901),
                    at([0, 0, 0, 0], 0),
                    true,
                    false,
                    1001
                ),
                (at([0, 0, 0, 0], 8080), at([0, 0, 0, 0], 0), true, false, 0),
                (
                    at([127, 0, 0, 1], 9901),
                    at([127, 0, 0, 1], 50000),
                    false,
                    true,
                    1002
                ),
            ]
        );
        let rows6 = rows_in(TABLE6, true);
        assert_eq!(
            rows6[0].local,
            SocketAddr::from((Ipv6Addr::LOCALHOST, 9901))
        );
        assert_eq!(
            rows6[1].local,
            at([127, 0, 0, 1], 8081),
            "a mapped IPv4 address is the IPv4 one"
        );
    }

    /// Read from this host's own tables: a connection's other end shows
    /// its listener's uid while queued, and its accepter's once accepted
    /// (another uid's where the test may act as one): a squatter's either
    /// way.
    #[test]
    fn the_socket_that_took_a_connection_shows_its_listeners_uid() {
        let me = Uid::effective();
        let uid = if me.is_root() { 65534 } else { me.as_raw() };
        let listener = std::thread::spawn(move || {
            nix::unistd::setfsuid(Uid::from_raw(uid));
            std::net::TcpListener::bind("127.0.0.1:0")
        })
        .join()
        .expect("join")
        .expect("bind");
        let stream =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let ours = stream.local_addr().expect("ours");
        let theirs = stream.peer_addr().expect("theirs");
        assert!(stays_here(ours, theirs));
        let took = || uid_that_took(ours, theirs).ok().flatten();
        assert_eq!(took(), Some(uid), "queued");
        let _accepted = std::thread::spawn(move || {
            nix::unistd::setfsuid(Uid::from_raw(uid));
            listener.accept()
        })
        .join()
        .expect("join")
        .expect("accept");
        assert_eq!(took(), Some(uid), "accepted");
        assert!(!stays_here(ours, ([10, 0, 0, 5], 80).into()));
    }

    #[test]
    fn an_unspecified_admin_is_reached_on_loopback() {
        let port = 9901;
        for (written, reached) in [
            ("0.0.0.0", "127.0.0.1"),
            ("::", "::1"),
            ("::ffff:0.0.0.0", "127.0.0.1"),
            ("10.0.0.5", "10.0.0.5"),
        ] {
            let written: IpAddr = written.parse().expect("address");
            let reached: IpAddr = reached.parse().expect("address");
            assert_eq!(reachable((written, port).into()), (reached, port).into());
        }
    }

    #[test]
    fn root_and_this_user_may_read_anything_and_a_missing_file_trusts_no_other() {
        let missing = Path::new("/nonexistent/token");
        assert!(may_read(0, missing));
        assert!(may_read(Uid::effective().as_raw(), missing));
        let other = Uid::effective().as_raw().wrapping_add(4242).max(1);
        assert!(!may_read(other, missing));
    }
}
