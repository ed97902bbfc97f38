//! What the benches read off a run: wrk's rate and latency, and a proxy's
//! CPU time and resident memory from /proc (all its processes).

use std::process::Command;

use super::proxies::Proxy;

/// One measurement: requests/s and the latency figures the tool gives.
pub struct Run {
    pub rps: f64,
    /// Requests completed in the run.
    pub requests: f64,
    pub latency: String,
    /// The 99th percentile, for medians over rounds.
    pub p99_ms: Option<f64>,
    /// Answers that were not 2xx or 3xx, and requests that failed (socket
    /// errors, timeouts): a run with any is no measure of speed, as a
    /// proxy that answers 502 fast would look fast.
    pub errors: u64,
}

/// A run, with the proxy's CPU seconds (user, kernel) spent during it.
pub fn cell(run: Option<Run>, cpu: Option<(f64, f64)>) -> String {
    let Some(r) = run else {
        return "failed".into();
    };
    if r.errors > 0 {
        return format!("{} errors: left out", r.errors);
    }
    let per_request = match cpu {
        Some((user, sys)) if r.requests > 0.0 => format!(
            "; CPU/req {:.1} µs user + {:.1} kernel",
            user * 1e6 / r.requests,
            sys * 1e6 / r.requests
        ),
        _ => String::new(),
    };
    format!("{:.0} ({}{per_request})", r.rps, r.latency)
}

/// User and kernel CPU seconds used so far by the processes `pids`
/// (utime, stime in /proc/PID/stat, in clock ticks of 1/100 s).
pub fn cpu_seconds(pids: &[i32]) -> (f64, f64) {
    stat_seconds(pids.iter().map(|pid| format!("/proc/{pid}/stat")))
}

/// The same of this process's threads `tids` alone: /proc/TID/stat gives
/// the whole process's for any of its threads, and summed over a process's
/// threads counted it once a thread.
pub fn thread_cpu_seconds(tids: &[i32]) -> (f64, f64) {
    stat_seconds(tids.iter().map(|tid| format!("/proc/self/task/{tid}/stat")))
}

fn stat_seconds(stats: impl Iterator<Item = String>) -> (f64, f64) {
    let mut total = (0.0, 0.0);
    for path in stats {
        let stat = std::fs::read_to_string(path).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        total.0 += ticks(11) / 100.0;
        total.1 += ticks(12) / 100.0;
    }
    total
}

/// Runs `load` and says what the proxy's processes spent meanwhile, user
/// and kernel seconds (none for the direct runs: the backend shares this
/// process).
pub fn cpu_during<T>(proxy: &Proxy, load: impl FnOnce() -> T) -> (T, Option<(f64, f64)>) {
    let pids = proxy.pids();
    let before = (!pids.is_empty()).then(|| cpu_seconds(&pids));
    let out = load();
    let cpu = before.map(|(u, s)| {
        let (u2, s2) = cpu_seconds(&pids);
        (u2 - u, s2 - s)
    });
    (out, cpu)
}

/// `wrk -t2 -c64` for `seconds` on `cpus` (`taskset -c` list), keep-alive
/// or (`close`) a new connection per request.
pub fn wrk(url: &str, seconds: u32, close: bool, cpus: &str) -> Option<Run> {
    let mut cmd = Command::new("taskset");
    cmd.args([
        "-c",
        cpus,
        "wrk",
        "-t2",
        "-c64",
        &format!("-d{seconds}s"),
        "--latency",
    ]);
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    let out = cmd.arg(url).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())?;
    let latency = |p: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(p))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("-")
            .to_string()
    };
    let requests = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0.0);
    Some(Run {
        rps,
        requests,
        latency: format!("p50 {}, p99 {}", latency("50%"), latency("99%")),
        p99_ms: millis(&latency("99%")),
        errors: wrk_errors(&text),
    })
}

/// wrk's `Non-2xx or 3xx responses: N` and `Socket errors: connect A,
/// read B, write C, timeout D`, added up (each line only when nonzero).
fn wrk_errors(text: &str) -> u64 {
    let numbers = |line: &str| -> u64 {
        line.split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u64>().ok())
            .sum()
    };
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("Non-2xx or 3xx responses:")
                .or_else(|| l.strip_prefix("Socket errors:"))
        })
        .map(numbers)
        .sum()
}

/// wrk's way of writing a latency ("459.00us", "1.15ms", "1.02s"), in ms.
fn millis(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else {
        (text.strip_suffix('s')?, 1e3)
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

/// Resident memory of `pids`, KiB (VmRSS in /proc/PID/status).
pub fn rss_kib(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// Busy and total clock ticks of each core so far (the `cpuN` lines of
/// /proc/stat): how loaded a core was over a run, whoever loaded it.
pub fn core_ticks() -> Vec<(u64, u64)> {
    std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let t: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect();
            let at = |i: usize| t.get(i).copied().unwrap_or(0);
            // user nice system idle iowait irq softirq steal
            let idle = at(3) + at(4);
            let total: u64 = t.iter().take(8).sum();
            (total - idle, total)
        })
        .collect()
}

/// Each core's busy share (0..1) between two `core_ticks` readings.
pub fn core_busy(before: &[(u64, u64)], after: &[(u64, u64)]) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| (a.0 - b.0) as f64 / (a.1 - b.1).max(1) as f64)
        .collect()
}
