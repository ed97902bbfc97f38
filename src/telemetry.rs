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
/// in the metrics and, for requests, logged in the access log. One budget
/// for the process: a flood on one listener holds back the lines of
/// another's faults too (their metrics still count them).
const CLIENT_FAULT_LINES: u32 = 10;

static CLIENT_FAULTS: std::sync::Mutex<Budget> =
    std::sync::Mutex::new(Budget::new(CLIENT_FAULT_LINES));

fn client_faults() -> std::sync::MutexGuard<'static, Budget> {
    CLIENT_FAULTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a line about a client's fault may be logged now. The count of
/// those held back is logged on a line of its own once their second is
/// over ([`report_held_back`]), not on an unrelated client's line.
pub fn client_fault() -> bool {
    let now = std::time::Instant::now();
    let (admitted, ended) = client_faults().admit(now);
    if let Some(count) = ended {
        report(count);
    }
    admitted
}

/// Logs how many lines about clients' faults were held back, once their
/// second is over; `at_exit`, whatever is left. Called every second for
/// the process's life, and as the generation ends, so no count waits for
/// a fault that may never come.
pub fn report_held_back(at_exit: bool) {
    let held = client_faults().held_back(std::time::Instant::now(), at_exit);
    if let Some(count) = held {
        report(count);
    }
}

/// Reports held-back lines every second, for the process's life: a
/// draining generation still meets faulty clients.
pub async fn held_back_reports() {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        report_held_back(false);
    }
}

fn report(count: u64) {
    tracing::info!(
        held_back = count,
        "lines about clients' faults held back: at most {CLIENT_FAULT_LINES} a second are logged"
    );
}

/// Lets a repeated log line through `per_second` times a second at most,
/// counting the rest: the client-fault lines here, and a listener's
/// repeated warnings (`listener::Throttle`, one a second).
pub struct Budget {
    per_second: u32,
    window: Option<std::time::Instant>,
    used: u32,
    held: u64,
}

impl Budget {
    pub const fn new(per_second: u32) -> Budget {
        Budget {
            per_second,
            window: None,
            used: 0,
            held: 0,
        }
    }

    fn window_over(&self, now: std::time::Instant) -> bool {
        let second = std::time::Duration::from_secs(1);
        self.window
            .is_none_or(|start| now.duration_since(start) >= second)
    }

    fn take_held(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.held)).filter(|n| *n > 0)
    }

    /// Whether a line may go now, and the count a window that just ended
    /// held back.
    pub fn admit(&mut self, now: std::time::Instant) -> (bool, Option<u64>) {
        let mut ended = None;
        if self.window_over(now) {
            ended = self.take_held();
            self.window = Some(now);
            self.used = 0;
        }
        if self.used < self.per_second {
            self.used += 1;
            (true, ended)
        } else {
            self.held += 1;
            (false, ended)
        }
    }

    fn held_back(&mut self, now: std::time::Instant, at_exit: bool) -> Option<u64> {
        if at_exit || self.window_over(now) {
            self.take_held()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Ten lines a second pass; the rest are counted, and the count comes
    /// out once their second is over: with the next fault, from the
    /// reporter, or at exit, and only once.
    #[test]
    fn a_flood_of_client_faults_logs_ten_lines_a_second_and_counts_the_rest() {
        let mut budget = Budget::new(CLIENT_FAULT_LINES);
        let start = Instant::now();
        let first: Vec<_> = (0..25).map(|_| budget.admit(start)).collect();
        assert_eq!(first.iter().filter(|(admitted, _)| *admitted).count(), 10);
        assert!(first.iter().all(|(_, ended)| ended.is_none()));
        let later = start + Duration::from_millis(999);
        assert_eq!(budget.held_back(later, false), None, "still its second");
        let next = start + Duration::from_secs(1);
        assert_eq!(budget.admit(next), (true, Some(15)));
        assert_eq!(budget.admit(next), (true, None));

        let flood_at = next + Duration::from_secs(5);
        for _ in 0..12 {
            budget.admit(flood_at);
        }
        assert_eq!(budget.held_back(flood_at, true), Some(2), "at exit");
        assert_eq!(
            budget.held_back(flood_at + Duration::from_secs(2), false),
            None
        );
    }

    /// A listener's warnings, one a second: the next one through carries
    /// how many were held back since the last.
    #[test]
    fn a_budget_of_one_a_second_lets_the_first_through_and_counts_the_rest() {
        let mut budget = Budget::new(1);
        let start = Instant::now();
        assert_eq!(budget.admit(start), (true, None));
        assert_eq!(budget.admit(start), (false, None));
        assert_eq!(
            budget.admit(start + Duration::from_millis(500)),
            (false, None)
        );
        assert_eq!(
            budget.admit(start + Duration::from_secs(1)),
            (true, Some(2))
        );
    }
}
