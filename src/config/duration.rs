//! Durations as DESIGN.md writes them: `"250ms"`, `"5s"`, `"2m"`; `0` means
//! "use the default" and a negative value means "none" (the phase takes no
//! time). Parsing is humantime's; the sign rule and the upper bound are ours.

use std::time::Duration;

use super::file::DurationValue;

/// The longest duration any key takes. Far past every sensible timeout, and
/// far below what overflows when added to an `Instant` (which panics).
pub const LONGEST: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// What a written duration asks for, before the key's default is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// `0`: the key's default.
    Default,
    /// A negative value: the phase takes no time.
    None,
    Exactly(Duration),
}

/// Parses one written duration; the error is a sentence fragment that the
/// caller prefixes with the key path.
pub fn parse(value: &DurationValue) -> Result<Written, String> {
    match value {
        DurationValue::Seconds(0) => Ok(Written::Default),
        DurationValue::Seconds(n) if *n < 0 => Ok(Written::None),
        DurationValue::Seconds(n) => bounded(&n.to_string(), Duration::from_secs(n.unsigned_abs())),
        DurationValue::Text(text) => parse_text(text.trim()),
    }
}

fn parse_text(text: &str) -> Result<Written, String> {
    if let Some(rest) = text.strip_prefix('-') {
        return match span(rest.trim()) {
            Ok(_) => Ok(Written::None),
            Err(err) => Err(invalid(text, err)),
        };
    }
    match span(text) {
        Ok(d) if d.is_zero() => Ok(Written::Default),
        Ok(d) => bounded(text, d),
        Err(err) => Err(invalid(text, err)),
    }
}

/// A span with its unit, or a bare number of seconds: the file's integer
/// `30` means seconds, and so does `"30"` in a flag or the environment
/// (`BATON_DRAIN_TIMEOUT=30` under systemd, whose own timeouts are
/// written so), where it was refused for want of a unit.
pub(crate) fn span(text: &str) -> Result<Duration, humantime::DurationError> {
    match text.parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => humantime::parse_duration(text),
    }
}

fn bounded(text: &str, d: Duration) -> Result<Written, String> {
    if d > LONGEST {
        return Err(format!(
            "duration \"{text}\" is longer than the longest allowed (365d)"
        ));
    }
    Ok(Written::Exactly(d))
}

fn invalid(text: &str, err: humantime::DurationError) -> String {
    format!("invalid duration \"{text}\" ({err}); write it like \"250ms\", \"5s\" or \"2m\"")
}

/// Formats a duration the way the config writes it, for `baton check`.
pub fn display(d: Duration) -> String {
    if d.is_zero() {
        return "none".to_string();
    }
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> DurationValue {
        DurationValue::Text(s.to_string())
    }

    #[test]
    fn zero_means_default_and_negative_means_none() {
        assert_eq!(parse(&text("0")), Ok(Written::Default));
        assert_eq!(parse(&text("0s")), Ok(Written::Default));
        assert_eq!(parse(&DurationValue::Seconds(0)), Ok(Written::Default));
        assert_eq!(parse(&text("-1s")), Ok(Written::None));
        assert_eq!(parse(&DurationValue::Seconds(-3)), Ok(Written::None));
    }

    #[test]
    fn units_are_understood() {
        assert_eq!(
            parse(&text("250ms")),
            Ok(Written::Exactly(Duration::from_millis(250)))
        );
        assert_eq!(
            parse(&text("2m")),
            Ok(Written::Exactly(Duration::from_secs(120)))
        );
        assert_eq!(
            parse(&DurationValue::Seconds(7)),
            Ok(Written::Exactly(Duration::from_secs(7)))
        );
        // A bare number is seconds as text too (a flag, the environment).
        assert_eq!(
            parse(&text("30")),
            Ok(Written::Exactly(Duration::from_secs(30)))
        );
        assert_eq!(parse(&text("-30")), Ok(Written::None));
    }

    #[test]
    fn more_than_a_year_is_refused() {
        assert_eq!(
            parse(&text("365d")),
            Ok(Written::Exactly(LONGEST)),
            "a year itself is allowed"
        );
        let err = parse(&text("366d")).unwrap_err();
        assert!(err.contains("366d") && err.contains("longest"), "{err}");
        assert!(parse(&DurationValue::Seconds(i64::MAX)).is_err());
        assert!(parse(&text("99999999999999y")).is_err());
    }

    #[test]
    fn garbage_is_rejected_with_the_text() {
        let err = parse(&text("5 parsecs")).unwrap_err();
        assert!(err.contains("5 parsecs"), "{err}");
        assert!(parse(&text("-x")).is_err());
    }
}
