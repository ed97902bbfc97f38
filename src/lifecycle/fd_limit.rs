//! The open-file limit: raised from its soft value to the hard one as a
//! generation starts. Every connection takes an fd or two, and a shell's
//! soft limit (commonly 1024) would refuse clients with EMFILE well below
//! what the host allows; the hard limit is what the admin granted (systemd's
//! unit sets both with `LimitNOFILE=`). HAProxy raises its own the same way,
//! and Go's runtime does for every program. A new generation inherits it.
//! And the table of open files, grown as a generation starts to what its
//! config may use, not by doubling under a burst of connections.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the soft limit to the hard one; says so when it moved.
pub fn raise() {
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return;
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    let shown = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::info!(
            from = %shown(limit.current),
            to = %shown(limit.maximum),
            "raised the open-file limit to its hard limit"
        ),
        Err(err) => tracing::warn!(
            soft = %shown(limit.current),
            cause = %err,
            "cannot raise the open-file limit"
        ),
    }
}

/// The fds listeners of `connections` in all may hold: a client's
/// connection and its backend's each, and room for the listeners, idle
/// backend connections and the rest. `baton check` holds the unit's
/// `LimitNOFILE=` to it.
pub fn fds_for(connections: usize) -> u64 {
    2 * connections as u64 + 1024
}

/// Says at the start when the open-file limit, raised as far as it goes,
/// is below what the listeners' `max_connections` may take. `baton check`
/// says so of a unit's `LimitNOFILE=`, but a container's limit or a
/// shell's `ulimit -n` meets no check: a flood then met EMFILE before
/// `max_connections`, its requests answered 503, with nothing said before.
pub fn warn_if_short(connections: usize) {
    let needed = fds_for(connections);
    if let Some(limit) = getrlimit(Resource::Nofile).current.filter(|l| *l < needed) {
        tracing::warn!(
            limit,
            needed,
            max_connections = connections,
            "the open-file limit is below what the listeners' max_connections may take (a client's and a backend's fd each, and 1024 more): a flood would meet EMFILE first, its requests answered 503; raise LimitNOFILE (or ulimit -n), or lower max_connections"
        );
    }
}

/// Grows the process's table of open files now to hold `fds` (within the
/// soft limit; a table that large already is left as it is). The kernel
/// grows it by doubling as fds are taken, and in a process of several
/// threads each growth waits for an RCU grace period (6 to 16 ms here, at
/// 256, 512, 1024, 2048 fds, and so on), during which the thread taking
/// the fd stands still, and with it every connection of its worker: a
/// generation that took a burst of new connections after a start or a
/// reload stalled them all, several times (h2c, 480 new backend
/// connections at once: 39 ms, where HAProxy, one thread, took 13.5).
/// Grown while the process is one thread, it waits for nothing. The table
/// costs 8 bytes of kernel memory an fd (256 KiB for the default
/// `max_connections`).
pub fn reserve_table(fds: u64) {
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let highest = fds.min(soft).min(i32::MAX as u64).saturating_sub(1) as i32;
    // F_DUPFD takes the lowest free fd at or above `highest`: taken and
    // given back, it leaves the table that large, and no fd in use is
    // touched (dup2 onto it would close one).
    let grown = std::fs::File::open("/dev/null")
        .and_then(|null| Ok(rustix::io::fcntl_dupfd_cloexec(&null, highest)?));
    if let Err(err) = grown {
        tracing::debug!(fds, cause = %err, "cannot grow the table of open files ahead");
    }
}

#[cfg(test)]
mod tests {
    /// `FDSize` of `/proc/self/status`: how many fds the table holds now.
    fn table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("FDSize")
    }

    #[test]
    fn the_table_is_grown_to_the_fds_asked_within_the_soft_limit() {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let asked = 5000;
        super::reserve_table(asked);
        let size = table_size();
        assert!(size >= asked.min(soft), "FDSize {size}, soft limit {soft}");
        let taken = asked.min(soft) - 1;
        assert!(
            std::fs::read_dir("/proc/self/fd")
                .expect("fds")
                .filter_map(Result::ok)
                .all(|e| e
                    .file_name()
                    .to_string_lossy()
                    .parse::<u64>()
                    .is_ok_and(|fd| fd < taken)),
            "the fd taken to grow the table (fd {taken}) is given back"
        );
    }
}
