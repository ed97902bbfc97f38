//! This process's own numbers (open fds, resident memory, CPU seconds),
//! read from `/proc/self` when `/metrics` renders.

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
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let page = sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap_or(4096);
    let resident_bytes = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * page);
    let ticks = sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap_or(100) as f64;
    let cpu_seconds = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the ")" that closes the command name; utime and
            // stime are the 12th and 13th of those.
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .map_or(0.0, |t| t / ticks);
    ProcessStats {
        open_fds,
        resident_bytes,
        cpu_seconds,
    }
}

fn sysconf(var: nix::unistd::SysconfVar) -> Option<u64> {
    nix::unistd::sysconf(var)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
}
