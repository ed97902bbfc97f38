//! A listener's access log (`access_log`): one line per HTTP request, one
//! per TCP connection, as JSON or in Apache's combined format. A line is
//! built where the exchange ends and handed to its destination's writer
//! ([`sink`]); the proxy never waits on the disk.
//!
//! Who ended an exchange and why is a two-letter termination state after
//! HAProxy's: the first letter says who (`-` nobody: it completed; `C` the
//! client, `c` its timeout; `S` the backend, `s` its timeout; `P` baton
//! refused it; `R` a limit: the queue, or baton's own shortage; `K` the
//! drain deadline cut it), the second when (`R` reading the request, `Q`
//! queued for a backend, `C` connecting, `H` waiting for the response head,
//! `D` sending the response, `-` after it).

pub mod sink;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

use sink::{Destination, Sink};

/// A line's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    /// Apache's combined format, which most log tools read.
    Combined,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Combined => "combined",
        }
    }
}

/// A listener's `access_log`.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub destination: Destination,
    pub format: Format,
}

/// Who ended an exchange and when (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    Completed,
    ClientAborted(Phase),
    ClientTimeout(Phase),
    BackendFailed(Phase),
    BackendTimeout(Phase),
    Refused,
    QueueTimeout,
    /// baton ran short (fds, memory) connecting to a backend.
    Shortage,
    Drained(Phase),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Request,
    Queue,
    Connect,
    Head,
    Data,
}

impl Termination {
    pub fn code(self) -> String {
        let (who, phase) = match self {
            Termination::Completed => return "--".into(),
            Termination::Refused => ('P', Phase::Request),
            Termination::QueueTimeout => ('R', Phase::Queue),
            Termination::Shortage => ('R', Phase::Connect),
            Termination::ClientAborted(p) => ('C', p),
            Termination::ClientTimeout(p) => ('c', p),
            Termination::BackendFailed(p) => ('S', p),
            Termination::BackendTimeout(p) => ('s', p),
            Termination::Drained(p) => ('K', p),
        };
        let when = match phase {
            Phase::Request => 'R',
            Phase::Queue => 'Q',
            Phase::Connect => 'C',
            Phase::Head => 'H',
            Phase::Data => 'D',
        };
        format!("{who}{when}")
    }
}

/// When an exchange reached each step (`None`: it never did).
#[derive(Debug, Clone, Copy)]
pub struct Marks {
    /// The request's first byte came (an HTTP/1 head's; where nothing
    /// earlier is known, `started`): `total_ms` counts from it, as nginx's
    /// `$request_time` does, so a head trickled for seconds shows.
    pub began: Instant,
    /// The exchange began (its head whole): `queue_ms` counts from it.
    pub started: Instant,
    /// A backend was picked (the queue is behind it).
    pub leased: Option<Instant>,
    /// A backend connection was in hand.
    pub connected: Option<Instant>,
    /// The backend's response head came.
    pub head: Option<Instant>,
}

impl Marks {
    pub fn new() -> Marks {
        Marks::since(Instant::now())
    }

    /// An exchange beginning now whose request's first byte came at `began`.
    pub fn since(began: Instant) -> Marks {
        Marks {
            began,
            started: Instant::now(),
            leased: None,
            connected: None,
            head: None,
        }
    }

    /// A backend connection is in hand: a kept one was in hand when the
    /// backend was leased (no clock read), a new one now.
    pub fn got_connection(&mut self, reused: bool) {
        self.connected = if reused {
            self.leased
        } else {
            Some(Instant::now())
        };
    }

    /// The step the exchange was in at the end: where a failure happened.
    pub fn phase(&self) -> Phase {
        match (self.leased, self.connected, self.head) {
            (None, _, _) => Phase::Queue,
            (Some(_), None, _) => Phase::Connect,
            (Some(_), Some(_), None) => Phase::Head,
            (_, _, Some(_)) => Phase::Data,
        }
    }
}

impl Default for Marks {
    fn default() -> Self {
        Marks::new()
    }
}

/// One line's facts, borrowed from the exchange that ends.
pub struct Entry<'a> {
    pub request_id: &'a str,
    pub client: SocketAddr,
    pub pool: &'a str,
    pub backend: Option<&'a str>,
    pub method: &'a str,
    pub target: &'a str,
    /// `HTTP/1.1`, `HTTP/2.0`, or `TCP`.
    pub protocol: &'a str,
    pub status: Option<u16>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// What of `bytes_out` was body (a tunnel's bytes too), without
    /// response heads: the combined format's size, as Apache's `%b` and
    /// nginx's `$body_bytes_sent` count it.
    pub body_out: u64,
    pub marks: Marks,
    pub termination: Termination,
    /// As the client sent them: bytes past ASCII are allowed in a field's
    /// value, and the line escapes them rather than hide the field.
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
}

/// A listener's handle on its log.
#[derive(Clone)]
pub struct AccessLog {
    sink: Arc<Sink>,
    format: Format,
    listener: Arc<str>,
    generation: u64,
    dropped: metrics::Counter,
}

impl AccessLog {
    pub fn new(sink: Arc<Sink>, format: Format, listener: &str, generation: u64) -> AccessLog {
        AccessLog {
            sink,
            format,
            listener: Arc::from(listener),
            generation,
            dropped: crate::metrics::access_log_dropped(listener),
        }
    }

    /// Queues `entry`'s line; one the writer cannot take now is dropped
    /// and counted.
    pub fn write(&self, entry: &Entry<'_>) {
        let now = SystemTime::now();
        let line = match self.format {
            Format::Json => self.json(entry, now),
            Format::Combined => combined(entry, now),
        };
        if !self.sink.send(line, &self.dropped) {
            self.dropped.increment(1);
        }
    }

    fn json(&self, e: &Entry<'_>, now: SystemTime) -> Vec<u8> {
        let ended = Instant::now();
        let since = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
            (Some(a), Some(b)) => Some(millis(b.saturating_duration_since(a))),
            _ => None,
        };
        let target = clipped_text(e.target);
        let line = JsonLine {
            time: humantime::format_rfc3339_millis(now).to_string(),
            generation: self.generation,
            request_id: e.request_id,
            client: e.client,
            listener: &self.listener,
            pool: e.pool,
            backend: e.backend,
            method: e.method,
            target: &target,
            protocol: e.protocol,
            status: e.status,
            bytes_in: e.bytes_in,
            bytes_out: e.bytes_out,
            queue_ms: since(Some(e.marks.started), e.marks.leased),
            connect_ms: since(e.marks.leased, e.marks.connected),
            response_ms: since(e.marks.connected, e.marks.head),
            total_ms: millis(ended.saturating_duration_since(e.marks.began)),
            termination: e.termination.code(),
        };
        let mut out = Vec::with_capacity(256);
        let mut json = serde_json::Serializer::with_formatter(&mut out, AsciiOnly);
        if line.serialize(&mut json).is_err() {
            out.clear();
        }
        out.push(b'\n');
        out
    }
}

/// serde_json's compact output, with every character past ASCII written
/// as `\uXXXX`: a target or user agent holding U+2028, U+2029 or U+0085
/// (line breaks to `splitlines` and to JavaScript) or U+202E (which turns
/// a terminal's text around) cannot split or disguise a line.
struct AsciiOnly;

impl serde_json::ser::Formatter for AsciiOnly {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut ascii_from = 0;
        for (at, c) in fragment.char_indices() {
            if c.is_ascii() {
                continue;
            }
            writer.write_all(&fragment.as_bytes()[ascii_from..at])?;
            for unit in c.encode_utf16(&mut [0; 2]) {
                write!(writer, "\\u{unit:04x}")?;
            }
            ascii_from = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[ascii_from..])
    }
}

#[derive(Serialize)]
struct JsonLine<'a> {
    time: String,
    generation: u64,
    request_id: &'a str,
    client: SocketAddr,
    listener: &'a str,
    pool: &'a str,
    backend: Option<&'a str>,
    method: &'a str,
    target: &'a str,
    protocol: &'a str,
    status: Option<u16>,
    bytes_in: u64,
    bytes_out: u64,
    queue_ms: Option<f64>,
    connect_ms: Option<f64>,
    response_ms: Option<f64>,
    total_ms: f64,
    termination: String,
}

/// Milliseconds to the microsecond.
fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// `client - - [time] "request" status bytes "referer" "user-agent"`.
fn combined(e: &Entry<'_>, now: SystemTime) -> Vec<u8> {
    let status = status_for_tools(e.status, e.termination);
    let line = format!(
        "{} - - [{}] \"{} {} {}\" {status} {} \"{}\" \"{}\"\n",
        e.client.ip(),
        clf_time(now),
        escape(e.method.as_bytes()),
        escape(&clipped(e.target.as_bytes())),
        escape(e.protocol.as_bytes()),
        e.body_out,
        escape(&clipped(e.referer.unwrap_or(b"-"))),
        escape(&clipped(e.user_agent.unwrap_or(b"-"))),
    );
    line.into_bytes()
}

/// The most of a target, referer or user agent a line keeps (HAProxy cuts
/// a whole line at 1,024 bytes): escaped, the three make at most 24 KiB,
/// under the 48 KiB past which journald splits a line in two it cannot
/// parse. A client's 60 KiB user agent of bytes past ASCII was a 240 KiB
/// line: a few dozen filled the writer's queue, and other clients' lines
/// were dropped.
const FIELD_MAX: usize = 2048;

/// As much of `field` as a line will show of it, for a record that holds
/// it until its line is written: `clipped` then cuts it as it would the
/// whole field (a copy clipped already was clipped again, `.....`).
pub fn kept_for_the_line(field: &[u8]) -> &[u8] {
    &field[..field.len().min(FIELD_MAX + 4)]
}

/// `kept_for_the_line` for text, cut at a character's edge.
pub fn kept_for_the_line_text(text: &str) -> &str {
    &text[..edge_at_most(text, FIELD_MAX + 4)]
}

/// The last character's edge of `text` at or before `at`.
fn edge_at_most(text: &str, at: usize) -> usize {
    (0..=text.len().min(at))
        .rev()
        .find(|&edge| text.is_char_boundary(edge))
        .unwrap_or(0)
}

/// `field`, or its first `FIELD_MAX` bytes (not cutting a UTF-8
/// character) and `...`.
fn clipped(field: &[u8]) -> Cow<'_, [u8]> {
    if field.len() <= FIELD_MAX {
        return Cow::Borrowed(field);
    }
    let mut end = FIELD_MAX;
    // A continuation byte (0b10xx_xxxx) is inside a character.
    while end > FIELD_MAX - 3 && field[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    Cow::Owned([&field[..end], b"..."].concat())
}

/// `clipped` for text (httparse takes a target only if it is UTF-8),
/// cut where a character begins.
fn clipped_text(text: &str) -> Cow<'_, str> {
    if text.len() <= FIELD_MAX {
        return Cow::Borrowed(text);
    }
    Cow::Owned(format!("{}...", &text[..edge_at_most(text, FIELD_MAX)]))
}

/// A combined line's status, always a number: log tools (GoAccess,
/// AWStats) drop a line whose status is `-`, and with it every client
/// that left before its answer. Where none was sent, nginx's codes: 499,
/// the client closed first; 444, closed with no answer (a drain's cut, a
/// TCP connection). A JSON line keeps `status: null` and its termination.
fn status_for_tools(status: Option<u16>, termination: Termination) -> u16 {
    status.unwrap_or(match termination {
        Termination::ClientAborted(_) => 499,
        _ => 444,
    })
}

/// Quotes, backslashes, control bytes and every byte past ASCII as
/// `\xHH` (nginx's escaping): a client cannot forge a field or a line, nor
/// split one for a reader that takes U+2028 or U+0085 for a line break,
/// nor turn a terminal's text around (U+202E).
fn escape(text: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for &b in text {
        match b {
            b'"' | b'\\' | 0..=0x1F | 0x7F.. => {
                let _ = write!(out, "\\x{b:02X}");
            }
            b => out.push(char::from(b)),
        }
    }
    out
}

/// `10/Oct/2000:13:55:36 +0000`: the common log format's time, in UTC,
/// rearranged from humantime's RFC 3339 (`2000-10-10T13:55:36Z`).
fn clf_time(now: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = humantime::format_rfc3339_seconds(now).to_string();
    let month = t[5..7]
        .parse::<usize>()
        .map_or("Jan", |m| MONTHS[(m - 1) % 12]);
    format!("{}/{month}/{}:{} +0000", &t[8..10], &t[0..4], &t[11..19])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_kept_for_its_line_is_clipped_as_the_whole_would_be() {
        for pad in 0..4 {
            let long = format!("{}{}", "a".repeat(2046 + pad), "é".repeat(1000));
            let kept = kept_for_the_line(long.as_bytes());
            assert!(kept.len() < 2100);
            assert_eq!(clipped(kept), clipped(long.as_bytes()));
            assert_eq!(
                clipped_text(kept_for_the_line_text(&long)),
                clipped_text(&long)
            );
        }
    }

    #[test]
    fn times_are_the_common_log_format_s() {
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(clf_time(leap), "29/Feb/2000:00:00:00 +0000");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(971_186_136);
        assert_eq!(clf_time(t), "10/Oct/2000:13:55:36 +0000");
    }

    #[test]
    fn a_client_cannot_forge_a_field() {
        assert_eq!(escape(b"a\"b\\c\nd"), "a\\x22b\\x5Cc\\x0Ad");
        assert_eq!(
            escape("/\u{2028}\u{85}\u{202E}é\u{7F}".as_bytes()),
            "/\\xE2\\x80\\xA8\\xC2\\x85\\xE2\\x80\\xAE\\xC3\\xA9\\x7F"
        );
        // Not UTF-8 (a header value may carry any byte past ASCII):
        // escaped like the rest, not hidden.
        assert_eq!(escape(b"curl\xFF\xC3"), "curl\\xFF\\xC3");
    }

    /// A JSON line is ASCII whatever a client sent: what is past it is
    /// `\uXXXX` (a surrogate pair past the BMP), and reads back the same.
    #[test]
    fn a_json_line_is_ascii_and_reads_back_the_same() {
        let target = "/a\u{2028}b\u{85}\u{202E}é😀\"\n";
        let line = AsciiLine { target };
        let mut out = Vec::new();
        let mut json = serde_json::Serializer::with_formatter(&mut out, AsciiOnly);
        line.serialize(&mut json).expect("serialized");
        assert!(out.is_ascii(), "{}", String::from_utf8_lossy(&out));
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.contains(r"\u2028") && text.contains(r"\ud83d\ude00"),
            "{text}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(back["target"], target);
    }

    #[derive(Serialize)]
    struct AsciiLine<'a> {
        target: &'a str,
    }

    #[test]
    fn long_fields_are_cut_whole_characters_and_marked() {
        let short = b"/a".repeat(1024);
        assert_eq!(clipped(&short).as_ref(), &short[..]);
        let long = b"x".repeat(5000);
        assert_eq!(clipped(&long).as_ref(), [&long[..2048], b"..."].concat());
        // Three bytes a character: byte 2,048 is inside the 683rd, which
        // begins at 2,046.
        let wide = "\u{20AC}".repeat(1000);
        let cut = clipped(wide.as_bytes());
        assert_eq!(cut.as_ref(), format!("{}...", &wide[..2046]).as_bytes());
        // Not UTF-8: no further back than a character's three
        // continuation bytes.
        let odd = [0x80; 5000];
        assert_eq!(clipped(&odd).as_ref(), [&odd[..2045], b"..."].concat());
    }

    #[test]
    fn a_long_target_keeps_its_characters_whole() {
        let long = format!("/{}", "é".repeat(3000));
        let cut = clipped_text(&long);
        // 2,048 bytes would cut the 1,024th `é` in two.
        assert_eq!(cut, format!("{}...", &long[..2047]));
        assert_eq!(clipped_text("/short"), "/short");
    }

    #[test]
    fn a_combined_line_always_has_a_numeric_status() {
        let gone = Termination::ClientAborted(Phase::Head);
        assert_eq!(status_for_tools(None, gone), 499);
        assert_eq!(
            status_for_tools(None, Termination::Drained(Phase::Head)),
            444
        );
        assert_eq!(status_for_tools(None, Termination::Completed), 444);
        assert_eq!(status_for_tools(Some(200), gone), 200);
    }

    #[test]
    fn termination_codes_say_who_and_when() {
        assert_eq!(Termination::Completed.code(), "--");
        assert_eq!(Termination::ClientAborted(Phase::Data).code(), "CD");
        assert_eq!(Termination::BackendTimeout(Phase::Head).code(), "sH");
        assert_eq!(Termination::Refused.code(), "PR");
        assert_eq!(Termination::Drained(Phase::Head).code(), "KH");
        assert_eq!(Termination::QueueTimeout.code(), "RQ");
    }
}
