//! Logging: `BATON_LOG` is the filter (default `info`), `BATON_LOG_FORMAT`
//! picks `text`, `json` or `auto` (plain text without colours or timestamps
//! when stderr is the journal, which adds its own, each line after its
//! syslog priority, `journal`). A value that is not
//! one of these is said on stderr, not taken silently. Lines about
//! clients' and backends' faults are logged within a budget
//! ([`may_say_client_fault`], [`may_say_backend_fault`]), and a stalled journal never
//! stalls the thread that logs ([`stderr`]).

mod journal;
pub mod stderr;

/// Says `text` on stderr as an error: a line each at the journal's error
/// priority where stderr is the journal (a config refused at a start or a
/// reload was stored as `info`, and `journalctl -p err` found nothing).
pub fn say_error(text: &str) {
    if stderr_is_the_journal() {
        for line in text.lines() {
            eprintln!("{}{line}", journal::ERROR);
        }
    } else {
        eprintln!("{text}");
    }
}

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
        .with_writer(stderr::Stderr)
        .with_target(false);
    let installed = match format.as_str() {
        "json" => builder.json().try_init(),
        _ if format == "auto" && stderr_is_the_journal() => {
            let plain = tracing_subscriber::fmt::format()
                .with_ansi(false)
                .without_time()
                .with_target(false);
            builder.event_format(journal::Prioritised(plain)).try_init()
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

/// Lines a second logged at most about one kind of fault. Each fault is
/// still counted in the metrics and, for requests, logged in the access
/// log; the lines held back are counted and the count logged once their
/// second is over. One budget a kind for the process: a flood on one
/// listener or pool holds back the lines of another's faults too (their
/// metrics still count them).
const FAULT_LINES: u32 = 10;

/// A kind of fault that can come as fast as requests do, whose lines are
/// logged within a budget: unbounded they would cost more than the work
/// they describe (stderr is written in the worker's thread) and fill the
/// journal, whose own rate limit then drops baton's other lines too.
struct FaultLines {
    budget: std::sync::Mutex<Budget>,
    /// What the held-back report calls them.
    what: &'static str,
    /// Whether some of them are warnings: the report is one too, or a
    /// log kept at WARN would show ten a second and never say that more
    /// were held back.
    warns: bool,
}

impl FaultLines {
    const fn new(what: &'static str, warns: bool) -> FaultLines {
        FaultLines {
            budget: std::sync::Mutex::new(Budget::new(FAULT_LINES)),
            what,
            warns,
        }
    }

    fn budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn admit(&self) -> bool {
        // Read before the lock: held for as little as may be, as every
        // worker comes here at a flood's rate.
        let now = std::time::Instant::now();
        let (admitted, ended) = self.budget().admit(now);
        if let Some(count) = ended {
            self.report(count);
        }
        admitted
    }

    fn report_held_back(&self, at_exit: bool) {
        let held = self.budget().held_back(std::time::Instant::now(), at_exit);
        if let Some(count) = held {
            self.report(count);
        }
    }

    fn report(&self, count: u64) {
        let what = self.what;
        if self.warns {
            tracing::warn!(
                held_back = count,
                "lines about {what} held back: at most {FAULT_LINES} a second are logged"
            );
        } else {
            tracing::info!(
                held_back = count,
                "lines about {what} held back: at most {FAULT_LINES} a second are logged"
            );
        }
    }
}

/// A head refused, a client too slow or silent, a TLS handshake or PROXY
/// header failed, an h2 client's rapid resets, a tunnel left idle: any
/// client can cause them as fast as it can connect.
/// Logged at INFO: a client's fault is no incident of the host's.
static CLIENT_FAULTS: FaultLines = FaultLines::new("clients' faults", false);

/// A backend refused, timed out or broke off, or a pool had none to give:
/// every request to a dead backend of a pool without health checks, or to
/// a pool with none up, meets one.
static BACKEND_FAULTS: FaultLines = FaultLines::new("backends' faults", true);

/// Whether a line about a client's fault may be logged now.
pub fn may_say_client_fault() -> bool {
    CLIENT_FAULTS.admit()
}

/// Whether a line about a backend's fault (or a pool's lack of one) may
/// be logged now.
pub fn may_say_backend_fault() -> bool {
    BACKEND_FAULTS.admit()
}

/// Logs how many lines about faults were held back, once their second is
/// over; `at_exit`, whatever is left. Called every second for the
/// process's life, and as the generation ends, so no count waits for a
/// fault that may never come.
pub fn report_held_back(at_exit: bool) {
    CLIENT_FAULTS.report_held_back(at_exit);
    BACKEND_FAULTS.report_held_back(at_exit);
}

/// Reports held-back lines every second, for the process's life: a
/// draining generation still meets faulty clients and backends.
pub async fn held_back_reports() {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        report_held_back(false);
    }
}

/// Lets a repeated warning through once a second, saying how many times
/// it was held back in between: a listener's (shared by its shards, so
/// locked), the admin and control sockets' accept errors, the health
/// checks baton could not make. Only touched when something is already
/// going wrong.
pub struct Throttle(std::sync::Mutex<Budget>);

impl Default for Throttle {
    fn default() -> Throttle {
        Throttle::new()
    }
}

impl Throttle {
    pub const fn new() -> Throttle {
        Throttle(std::sync::Mutex::new(Budget::new(1)))
    }

    /// `Some(held back since the last line)` when a line may go now.
    pub fn ready(&self) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut budget = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (admitted, held_back) = budget.admit(now);
        admitted.then(|| held_back.unwrap_or(0))
    }
}

/// An accept on the admin or control socket failed: a shortage of
/// baton's own is counted as the listeners' are (`at="accept"`), and the
/// warning is throttled, as the loop retries every 100 ms while the
/// connection waits in the queue.
pub fn accept_failed(err: &std::io::Error, lines: &Throttle, what: &'static str) {
    if crate::shortage::is_own(err) {
        crate::metrics::shortage(crate::metrics::Shortage::Accept);
    }
    if let Some(suppressed) = lines.ready() {
        tracing::warn!(cause = %err, suppressed, "{what}");
    }
}

/// Lets a repeated log line through `per_second` times a second at most,
/// counting the rest: the fault lines here, and the repeated warnings of
/// a [`Throttle`] (one a second).
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

/// `text` with its control characters (a terminal's escapes, line
/// breaks), Unicode's line and paragraph separators and its direction
/// marks and overrides (U+202E turns a terminal's text around) written as
/// Rust escapes: for text a peer chose that reaches a log line or a
/// terminal, such as a backend certificate's names in a failed
/// handshake's error (webpki writes them unescaped).
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    fn hidden(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
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
        let mut budget = Budget::new(FAULT_LINES);
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

    #[test]
    fn a_peer_s_control_characters_are_escaped() {
        assert_eq!(printable("plain \"text\" é"), "plain \"text\" é");
        assert_eq!(
            printable("x\u{1b}[2J\nFORGED\u{85}\u{202E}"),
            "x\\u{1b}[2J\\u{a}FORGED\\u{85}\\u{202e}"
        );
    }
}
