//! Durations as DESIGN.md writes them: `"250ms"`, `"5s"`, `"2m"`; `0` means
//! "use the default" and a negative value means "none" (the phase takes no
//! time). Parsing is humantime's; only the sign rule is ours.

use std::time::Duration;

use super::file::DurationValue;

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
        DurationValue::Seconds(n) => Ok(Written::Exactly(Duration::from_secs(n.unsigned_abs()))),
        DurationValue::Text(text) => parse_text(text.trim()),
    }
}

fn parse_text(text: &str) -> Result<Written, String> {
    if let Some(rest) = text.strip_prefix('-') {
        return match humantime::parse_duration(rest.trim()) {
            Ok(_) => Ok(Written::None),
            Err(err) => Err(invalid(text, err)),
        };
    }
    if text == "0" {
        return Ok(Written::Default);
    }
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Ok(Written::Default),
        Ok(d) => Ok(Written::Exactly(d)),
        Err(err) => Err(invalid(text, err)),
    }
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
    }

    #[test]
    fn garbage_is_rejected_with_the_text() {
        let err = parse(&text("5 parsecs")).unwrap_err();
        assert!(err.contains("5 parsecs"), "{err}");
        assert!(parse(&text("-x")).is_err());
    }
}
