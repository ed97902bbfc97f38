//! This process's own numbers (open fds, resident memory, CPU seconds),
//! read when `/metrics` renders: from `/proc/self`, and CPU time from
//! `getrusage`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessStats {
    pub open_fds: u64,
    pub resident_bytes: u64,
    pub cpu_seconds: f64,
}

impl ProcessStats {
    pub fn add(&mut self, other: &ProcessStats) {
        self.open_fds += other.open_fds;
        self.resident_bytes += other.resident_bytes;
        self.cpu_seconds += other.cpu_seconds;
    }
}

pub fn read() -> ProcessStats {
    ProcessStats {
        open_fds: open_fds(),
        resident_bytes: resident_bytes(),
        cpu_seconds: cpu_seconds(),
    }
}

/// The last figures read from `/proc/self`, for a read that needs an fd
/// and finds none: a full fd table is just when these numbers are looked
/// at, and read as 0 they said the opposite (and a CPU figure falling to
/// 0 broke every `rate()` over it).
static LAST_OPEN_FDS: AtomicU64 = AtomicU64::new(0);
static LAST_RESIDENT: AtomicU64 = AtomicU64::new(0);

/// The entries of `/proc/self/fd`. A table with no fd left to list it is
/// full: at least the soft limit, and at least the last count; another
/// failure gives the last count.
fn open_fds() -> u64 {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => {
            let n = entries.count() as u64;
            LAST_OPEN_FDS.store(n, Ordering::Relaxed);
            n
        }
        // Memory short is no full table: the gauge at the fd limit then
        // would fire alerts about fds.
        Err(err) if crate::shortage::fd_table_full(&err) => {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
            LAST_OPEN_FDS
                .load(Ordering::Relaxed)
                .max(limit.unwrap_or(0))
        }
        // No `/proc` (a container without it): not a full table.
        Err(_) => LAST_OPEN_FDS.load(Ordering::Relaxed),
    }
}

/// Resident pages (`/proc/self/statm`) in bytes; the last figure read when
/// the file cannot be.
fn resident_bytes() -> u64 {
    let page = sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap_or(4096);
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok());
    match pages {
        Some(pages) => {
            LAST_RESIDENT.store(pages * page, Ordering::Relaxed);
            pages * page
        }
        None => LAST_RESIDENT.load(Ordering::Relaxed),
    }
}

/// User and system CPU seconds, from `getrusage`, which needs no fd.
fn cpu_seconds() -> f64 {
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).map_or(0.0, |usage| {
        seconds(usage.user_time()) + seconds(usage.system_time())
    })
}

fn sysconf(var: nix::unistd::SysconfVar) -> Option<u64> {
    nix::unistd::sysconf(var)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
}
