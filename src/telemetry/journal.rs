//! Lines for the journal with their priority: journald reads a `<N>`
//! before a line as its syslog priority (`SyslogLevelPrefix=`, on by
//! default) and takes any other line as `info`. Without it every line of
//! baton's, a backend gone down or a worker stuck, was `info`:
//! `journalctl -p warning` and shippers that alert on the priority found
//! none, and journald's rate limit, kept per priority, counted them with
//! the info lines and an access log on stdout.

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// syslog's `err`, for lines written outside the log (`telemetry::say_error`).
pub const ERROR: &str = "<3>";

/// An event as the inner format writes it, each of its lines (a message
/// may have several) after its priority.
pub struct Prioritised<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for Prioritised<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut text = String::new();
        self.0.format_event(ctx, Writer::new(&mut text), event)?;
        let priority = priority(*event.metadata().level());
        for line in text.lines() {
            writeln!(writer, "{priority}{line}")?;
        }
        Ok(())
    }
}

/// syslog's priority for a level: `err`, `warning`, `info`, `debug`.
fn priority(level: Level) -> &'static str {
    match level {
        Level::ERROR => ERROR,
        Level::WARN => "<4>",
        Level::INFO => "<6>",
        Level::DEBUG | Level::TRACE => "<7>",
    }
}
