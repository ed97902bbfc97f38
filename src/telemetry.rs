//! Logging: `BATON_LOG` is the filter (default `info`), `BATON_LOG_FORMAT`
//! picks `text`, `json` or `auto` (plain text without colours or timestamps
//! when stderr is the journal, which adds its own). A value that is not
//! one of these is said on stderr, not taken silently. Lines about
//! clients' faults are logged within a budget ([`client_fault`]).

pub fn init() {
    let filter = match std::env::var("BATON_LOG") {
        Err(_) => tracing_subscriber::EnvFilter::new("info"),
        Ok(text) => tracing_subscriber::EnvFilter::try_new(&text).unwrap_or_else(|err| {
            eprintln!("baton: BATON_LOG={text:?} is not a log filter ({err}); logging at info");
            tracing_subscriber::EnvFilter::new("info")
        }),
    };
    let mut format = std::env::var("BATON_LOG_FORMAT").unwrap_or_else(|_| "auto".into());
    if !matches!(format.as_str(), "auto" | "text" | "json") {
        eprintln!("baton: BATON_LOG_FORMAT={format:?} is not auto, text or json; using auto");
        format = "auto".into();
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let installed = match format.as_str() {
        "json" => builder.json().try_init(),
        _ if format == "auto" && stderr_is_the_journal() => {
            builder.with_ansi(false).without_time().try_init()
        }
        _ => builder.with_ansi(false).try_init(),
    };
    if installed.is_err() {
        eprintln!("baton: logging was already initialised");
    }
}

/// systemd sets `JOURNAL_STREAM` to the `device:inode` of the stream it
/// connects stderr to; a child whose stderr was redirected elsewhere
/// inherits the variable all the same, so the stream itself is compared.
fn stderr_is_the_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(std::io::stderr()) else {
        return false;
    };
    stream.to_str() == Some(&format!("{}:{}", stat.st_dev, stat.st_ino))
}

/// Lines a second about clients' faults logged at most: a head refused, a
/// client too slow or silent, a TLS handshake or PROXY header failed. Any
/// client can cause them as fast as it can connect, and unbounded they
/// would cost more than refusing it and fill the journal, whose own rate
/// limit then drops baton's other lines too. Each fault is still counted
/// in the metrics and, for requests, logged in the access log.
const CLIENT_FAULT_LINES: u32 = 10;

static CLIENT_FAULTS: std::sync::Mutex<Budget> = std::sync::Mutex::new(Budget::new());

/// Whether a line about a client's fault may be logged now; if so, how
/// many were held back since the last one (logged as `suppressed`).
pub fn client_fault() -> Option<u64> {
    CLIENT_FAULTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .admit(std::time::Instant::now())
}

/// At most [`CLIENT_FAULT_LINES`] a second, counting the rest.
struct Budget {
    window: Option<std::time::Instant>,
    used: u32,
    suppressed: u64,
}

impl Budget {
    const fn new() -> Budget {
        Budget {
            window: None,
            used: 0,
            suppressed: 0,
        }
    }

    fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        let second = std::time::Duration::from_secs(1);
        if self
            .window
            .is_none_or(|start| now.duration_since(start) >= second)
        {
            self.window = Some(now);
            self.used = 0;
        }
        if self.used < CLIENT_FAULT_LINES {
            self.used += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Ten lines a second pass; the rest are counted, and the count goes
    /// with the next line that passes, in a later second.
    #[test]
    fn a_flood_of_client_faults_logs_ten_lines_a_second_and_counts_the_rest() {
        let mut budget = Budget::new();
        let start = Instant::now();
        let first: Vec<_> = (0..25).map(|_| budget.admit(start)).collect();
        assert_eq!(first.iter().filter(|a| a.is_some()).count(), 10);
        assert!(first[..10].iter().all(|a| *a == Some(0)));
        let later = start + Duration::from_millis(999);
        assert_eq!(budget.admit(later), None, "still the same second");
        let next = start + Duration::from_secs(1);
        assert_eq!(budget.admit(next), Some(16), "15 held back, and one more");
        assert_eq!(budget.admit(next), Some(0));
    }
}
