//! Request and response heads, parsed once with `httparse` and judged
//! strictly: every rule a request-smuggling attack leans on (two lengths, a
//! disguised `Transfer-Encoding`, a folded line, a missing `Host`) is a
//! refusal here, so the rest of baton only ever sees heads with one meaning.
//!
//! A head is kept as its own bytes plus offsets into them, so nothing is
//! copied per field. Bare LF line endings are accepted (httparse takes them,
//! RFC 9112 §2.2 allows it): baton re-writes every head with CRLF before it
//! goes anywhere, so no peer ever sees the LF-only form.

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::Bytes;

use crate::proxy::headers;

/// Longest head accepted (request line/status line + fields + blank line).
pub const MAX_HEAD: usize = 64 * 1024;
/// Most fields in one head.
pub const MAX_FIELDS: usize = 128;

/// Where a message's body ends (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body at all.
    Empty,
    /// Exactly this many bytes (Content-Length; 0 is reported as Empty).
    Length(u64),
    /// Chunked transfer coding (see `chunked`).
    Chunked,
    /// Until the peer closes (responses only: no length, no chunked).
    UntilClose,
}

/// What a field is to a proxy, decided once at parse time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Forwarded as received.
    EndToEnd,
    /// `Host`.
    Host,
    /// `Content-Length` / `Transfer-Encoding`: framing, re-written by the proxy.
    Framing,
    /// Hop-by-hop (RFC 9110 §7.6.1): connection, keep-alive, proxy-connection, te,
    /// upgrade, http2-settings (trailer is NOT one: it is end-to-end), and any
    /// field named in a `Connection` token — except host, content-length,
    /// content-type, content-encoding, authorization, cookie, which a
    /// Connection token cannot strip. Also dropped on the way: the `_`
    /// spellings of the fields baton frames or sets (`headers::SET_BY_BATON`).
    HopByHop,
    /// Every x-forwarded-* field, x-real-ip, forwarded, front-end-https,
    /// and their spellings with `_` (`headers::is_forwarding`).
    Forwarding,
    /// `Expect` (baton answers 100-continue itself).
    Expect,
}

impl Role {
    /// Whether a field of an interim (1xx) response goes on to the client
    /// (on either path): not hop-by-hop, and no framing (it has no body).
    pub fn kept_in_interim(self) -> bool {
        !matches!(self, Role::HopByHop | Role::Framing)
    }
}

/// One field line: name and value as ranges into the head's bytes
/// (value without surrounding whitespace), so a head costs one copy in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The name as sent (any case).
    pub name: Range<usize>,
    /// The value, trimmed of surrounding spaces and tabs.
    pub value: Range<usize>,
    /// What the proxy does with it.
    pub role: Role,
}

/// The protocol versions baton speaks on HTTP/1 (anything else is refused
/// by httparse), kept because 1.0 and 1.1 differ on keep-alive and framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0.
    Http10,
    /// HTTP/1.1.
    Http11,
}

/// A parsed request head. `bytes` is exactly the head, from the request line
/// up to and including the blank line; `consumed` is how many bytes the
/// caller must drop from its buffer (empty lines skipped before the request
/// line, RFC 9112 §2.2, plus `bytes.len()`). Whatever follows is body or the
/// next request.
#[derive(Clone, Debug)]
pub struct RequestHead {
    /// The head's bytes; every range in this struct indexes them.
    pub bytes: Bytes,
    /// Bytes taken from the start of the parsed buffer: skipped leading
    /// empty lines + `bytes.len()`.
    pub consumed: usize,
    /// The method (CONNECT is never here: it is refused).
    pub method: http::Method,
    /// Request target as sent (origin-form, absolute-form, or `*`).
    pub target: Range<usize>,
    /// 1.0 or 1.1.
    pub version: Version,
    /// Every field line, in order.
    pub fields: Vec<Field>,
    /// Empty / Length / Chunked only (never UntilClose).
    pub framing: Framing,
    /// The client keeps the connection after this exchange: HTTP/1.1 unless a
    /// `Connection: close` token; HTTP/1.0 only with a `keep-alive` token.
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent on HTTP/1.1 (on 1.0 the expectation
    /// is ignored, RFC 9110 §10.1.1); any other Expect value is refused.
    pub expect_continue: bool,
    /// The `Upgrade` value's range when the request is an upgrade
    /// (HTTP/1.1, `Connection` has an `upgrade` token and exactly one
    /// `Upgrade` field is present), unless any offered protocol is `h2c`:
    /// then None (served as plain HTTP/1.1, never tunnelled: h2c smuggling).
    pub upgrade: Option<Range<usize>>,
    /// A `TE` field offered `trailers`.
    pub takes_trailers: bool,
}

/// A parsed response head: like `RequestHead`, `bytes` is exactly the head
/// (from the status line) and `consumed` counts skipped leading empty lines
/// too.
#[derive(Clone, Debug)]
pub struct ResponseHead {
    /// The head's bytes; every range in this struct indexes them.
    pub bytes: Bytes,
    /// Bytes taken from the start of the parsed buffer.
    pub consumed: usize,
    /// 100..=999.
    pub status: u16,
    /// 1.0 or 1.1.
    pub version: Version,
    /// Reason phrase range (may be empty).
    pub reason: Range<usize>,
    /// Every field line, in order.
    pub fields: Vec<Field>,
    /// Where the body ends.
    pub framing: Framing,
    /// The body carries a transfer coding other than chunked (`gzip,
    /// chunked`): only a chunked delivery to an HTTP/1.1 client can name it.
    pub coded: bool,
    /// The backend keeps the connection: 1.1 without `close`, 1.0 with `keep-alive`;
    /// always false for UntilClose framing.
    pub keep_alive: bool,
}

/// A parse that needs more bytes, or a whole head (whose `consumed` says
/// how many bytes it took).
#[derive(Debug)]
pub enum Parsed<T> {
    /// The head is not all in yet: read more and parse again from the start.
    Partial,
    /// The head is whole.
    Complete(T),
}

/// Why a request head is refused; the caller answers `status()` and closes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// Not a request baton will give one meaning to (400).
    #[error("malformed request: {0}")]
    BadRequest(&'static str),
    /// Longer than MAX_HEAD or more than MAX_FIELDS fields (431).
    #[error("request head too large")]
    TooLarge,
    /// CONNECT: baton is no forward proxy (405).
    #[error("method not allowed: {0}")]
    MethodNotAllowed(&'static str),
    /// An `Expect` other than `100-continue`, which no one on the way will
    /// meet (417, RFC 9110 §10.1.1), rather than dropped or passed on.
    #[error("expectation failed: {0}")]
    ExpectationFailed(&'static str),
}

impl Refusal {
    /// The status the client is answered with before the connection closes.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::BadRequest(_) => 400,
            Refusal::TooLarge => 431,
            Refusal::MethodNotAllowed(_) => 405,
            Refusal::ExpectationFailed(_) => 417,
        }
    }
}

/// Why a backend's response head cannot be used (the client gets 502).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadResponse {
    /// Not a response baton can give one meaning to.
    #[error("malformed response head: {0}")]
    Malformed(&'static str),
    /// Longer than MAX_HEAD or more than MAX_FIELDS fields.
    #[error("response head too large")]
    TooLarge,
}

/// Room for a head's fields, left uninitialised: httparse writes the ones
/// it parses and hands back only those. Filling 128 empty fields (4 KiB)
/// before every parse cost more than parsing a short head.
fn field_slots<'b>() -> [MaybeUninit<httparse::Header<'b>>; MAX_FIELDS] {
    [const { MaybeUninit::uninit() }; MAX_FIELDS]
}

/// Parses a request head from the start of `buf`. `Partial` when more bytes are needed
/// (and `buf.len() < MAX_HEAD`; at MAX_HEAD without a complete head → TooLarge).
/// On Complete, the caller drops `head.consumed` bytes from its buffer (the
/// head's bytes are copied into `head.bytes`, one copy); the bytes after
/// them stay the caller's.
pub fn parse_request(buf: &[u8]) -> Result<Parsed<RequestHead>, Refusal> {
    let window = buf.get(..MAX_HEAD).unwrap_or(buf);
    let mut slots = field_slots();
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(window, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(Refusal::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(Refusal::TooLarge),
        Err(e) => return Err(Refusal::BadRequest(httparse_reason(e))),
    };
    let method = req.method.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(Refusal::MethodNotAllowed("CONNECT"));
    }
    if standard_method_in_another_case(method.as_bytes()) {
        return Err(Refusal::BadRequest("method"));
    }
    let method =
        http::Method::from_bytes(method.as_bytes()).map_err(|_| Refusal::BadRequest("method"))?;
    let version = version(req.version).ok_or(Refusal::BadRequest("version"))?;
    let skip = leading_empty_lines(window);
    let src = window.get(skip..len).unwrap_or_default();
    let head = Bytes::copy_from_slice(src);
    let target = offset(src, req.path.unwrap_or_default().as_bytes());
    let parts = Parts::new(src, req.headers);
    let request = RequestHead {
        framing: request_framing(&head, &parts.fields, version)?,
        keep_alive: keep_alive(version, &parts),
        expect_continue: expect_continue(&head, &parts.fields, version)?,
        upgrade: upgrade(&head, &parts, version),
        takes_trailers: takes_trailers(&head, &parts.fields),
        consumed: len,
        method,
        target,
        version,
        fields: parts.fields,
        bytes: head,
    };
    check_target(&request)?;
    check_host(&request)?;
    Ok(Parsed::Complete(request))
}

/// Whether a head still arriving (`buf`, of which the last parse saw the
/// first `parsed` bytes) is worth parsing again. httparse starts over at
/// each call: parsed after every read, a head trickled a byte a segment
/// cost the square of its size (a 60 KiB head, 60,000 parses of up to 60
/// KiB). Parsed again only once a line has ended among the new bytes (a
/// head ends with one, and a malformed line is refused once it is whole),
/// once it has doubled since (so bytes no line ends are still refused
/// soon, not at `header_timeout`), or at the size limit: at most a parse a
/// line (`MAX_FIELDS` and two) and one for each doubling; its first bytes
/// always (a client speaking another protocol is refused at once).
pub fn worth_parsing(buf: &[u8], parsed: usize) -> bool {
    parsed == 0
        || buf.len() >= MAX_HEAD
        || buf.len() >= 2 * parsed
        || buf.get(parsed..).is_none_or(|new| new.contains(&b'\n'))
}

/// Parses a response head from the start of `buf`, as `parse_request` does
/// (same `consumed` contract); `request_method` decides HEAD's empty body
/// (CONNECT never gets here: it is refused before).
pub fn parse_response(
    buf: &[u8],
    request_method: &http::Method,
) -> Result<Parsed<ResponseHead>, BadResponse> {
    let window = buf.get(..MAX_HEAD).unwrap_or(buf);
    let mut slots = field_slots();
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, window, &mut slots)
    {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(BadResponse::TooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(BadResponse::TooLarge),
        Err(e) => return Err(BadResponse::Malformed(httparse_reason(e))),
    };
    let status = res.code.unwrap_or_default();
    if status < 100 {
        return Err(BadResponse::Malformed("status below 100"));
    }
    let version = version(res.version).ok_or(BadResponse::Malformed("version"))?;
    let skip = leading_empty_lines(window);
    let src = window.get(skip..len).unwrap_or_default();
    let head = Bytes::copy_from_slice(src);
    let reason = offset(src, res.reason.unwrap_or_default().as_bytes());
    let parts = Parts::new(src, res.headers);
    let (framing, coded) = response_framing(&head, &parts.fields, version, status, request_method)?;
    Ok(Parsed::Complete(ResponseHead {
        keep_alive: framing != Framing::UntilClose
            && !speaks_of_a_body(&head, &parts.fields, status)
            && keep_alive(version, &parts),
        consumed: len,
        status,
        version,
        reason,
        fields: parts.fields,
        framing,
        coded,
        bytes: head,
    }))
}

impl RequestHead {
    /// A field's name as sent.
    pub fn field_name(&self, f: &Field) -> &[u8] {
        slice(&self.bytes, &f.name)
    }

    /// A field's value, trimmed.
    pub fn field_value(&self, f: &Field) -> &[u8] {
        slice(&self.bytes, &f.value)
    }

    /// The request target as sent.
    pub fn target(&self) -> &[u8] {
        slice(&self.bytes, &self.target)
    }

    /// The path for routing: origin-form target up to `?`; for absolute-form, the path
    /// part of the URI ("/" if none); `*` for asterisk-form.
    pub fn path(&self) -> &[u8] {
        let target = self.target();
        let path = match absolute_form(target) {
            Some((_, rest)) => rest,
            None => target,
        };
        let path = path.split(|b| *b == b'?').next().unwrap_or_default();
        if path.is_empty() {
            b"/"
        } else {
            path
        }
    }

    /// Authority of an absolute-form target (what the backend's Host becomes, RFC 9112 §3.2.2).
    pub fn target_authority(&self) -> Option<&[u8]> {
        absolute_form(self.target()).map(|(authority, _)| authority)
    }

    /// Host for routing: target_authority, else the Host field (not
    /// lowercased, port not stripped: the caller does both); None when
    /// neither is there or the Host field is empty (HTTP/1.0 only).
    pub fn host(&self) -> Option<&[u8]> {
        self.target_authority()
            .or_else(|| values_in_role(&self.bytes, &self.fields, Role::Host, "host").next())
            .filter(|h| !h.is_empty())
    }

    /// Values of every field with this (lowercase) name, in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        values(&self.bytes, &self.fields, name)
    }
}

impl ResponseHead {
    /// The protocol a 101 switches to, if it is one `offered` (a request's
    /// Upgrade value) lists: RFC 9110 §7.8 has the server name it in its
    /// own Upgrade field, and only a protocol the client asked for. A 101
    /// without one, or from HTTP/1.0, switches to nothing baton can relay.
    pub fn switched_to<'a>(&'a self, offered: &[u8]) -> Option<&'a [u8]> {
        if self.version != Version::Http11 {
            return None;
        }
        let chosen = self.values("upgrade").flat_map(list).next()?;
        list(offered)
            .any(|p| p.eq_ignore_ascii_case(chosen))
            .then_some(chosen)
    }

    /// A field's name as sent.
    pub fn field_name(&self, f: &Field) -> &[u8] {
        slice(&self.bytes, &f.name)
    }

    /// A field's value, trimmed.
    pub fn field_value(&self, f: &Field) -> &[u8] {
        slice(&self.bytes, &f.value)
    }

    /// The reason phrase (may be empty).
    pub fn reason(&self) -> &[u8] {
        slice(&self.bytes, &self.reason)
    }

    /// Values of every field with this (lowercase) name, in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        values(&self.bytes, &self.fields, name)
    }
}

/// The fields of a head with their roles, and what its `Connection` tokens
/// say of the connection, read in place: no token is copied (an nginx
/// response says `Connection: keep-alive` every time).
struct Parts {
    fields: Vec<Field>,
    said: Said,
}

impl Parts {
    /// `src` is the head's bytes as httparse saw them (its slices point there).
    fn new(src: &[u8], headers: &[httparse::Header<'_>]) -> Parts {
        let tokens = Tokens::new(headers);
        let fields = headers
            .iter()
            .enumerate()
            .map(|(index, h)| Field {
                name: offset(src, h.name.as_bytes()),
                value: offset(src, h.value),
                role: role(h.name, || tokens.names(index, h.name.as_bytes())),
            })
            .collect();
        Parts {
            fields,
            said: tokens.said,
        }
    }
}

/// The `Connection` tokens a head's meaning asks about (any case).
#[derive(Clone, Copy, Default)]
struct Said {
    close: bool,
    keep_alive: bool,
    upgrade: bool,
}

impl Said {
    fn hear(&mut self, token: &[u8]) {
        self.close |= token.eq_ignore_ascii_case(b"close");
        self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
        self.upgrade |= token.eq_ignore_ascii_case(b"upgrade");
    }
}

/// Connection tokens gathered at most.
const GATHERED_TOKENS: usize = 8;

/// A head's `Connection` tokens, gathered once: every field's role asks
/// whether a token names it, and scanning the fields again for each (what
/// this replaced) cost more than parsing the head.
struct Tokens<'h> {
    gathered: [&'h [u8]; GATHERED_TOKENS],
    count: usize,
    /// With more than `GATHERED_TOKENS`, by field index: a token names it.
    /// Found once, in one pass over the tokens: asking each field of every
    /// token instead cost fields × tokens (a 64 KiB head of 30,000
    /// one-letter tokens and 127 fields took tens of milliseconds to read).
    many: Option<Vec<bool>>,
    said: Said,
}

impl<'h> Tokens<'h> {
    fn new(headers: &'h [httparse::Header<'h>]) -> Tokens<'h> {
        let mut tokens = Tokens {
            gathered: [&[]; GATHERED_TOKENS],
            count: 0,
            many: None,
            said: Said::default(),
        };
        let mut overflow = false;
        // Loops, not `connection_tokens`: its flattened iterator cost more
        // than all of a five-field head's roles.
        for field in headers.iter().filter(|h| is_connection(h)) {
            for token in list(field.value) {
                tokens.said.hear(token);
                match tokens.gathered.get_mut(tokens.count) {
                    Some(slot) => {
                        *slot = token;
                        tokens.count += 1;
                    }
                    None => overflow = true,
                }
            }
        }
        if overflow {
            tokens.many = Some(named_by_tokens(headers));
        }
        tokens
    }

    /// Whether a token names field `index`, called `name`.
    fn names(&self, index: usize, name: &[u8]) -> bool {
        match &self.many {
            Some(named) => named.get(index).copied().unwrap_or(false),
            None => self.gathered[..self.count]
                .iter()
                .any(|t| t.eq_ignore_ascii_case(name)),
        }
    }
}

/// By field index, whether a `Connection` token names the field: the
/// field names sorted (at most `MAX_FIELDS`), then each token looked up
/// among them, so the work grows with the tokens, not tokens × fields.
fn named_by_tokens(headers: &[httparse::Header<'_>]) -> Vec<bool> {
    let name = |i: usize| headers.get(i).map_or(&b""[..], |h| h.name.as_bytes());
    let mut sorted: Vec<usize> = (0..headers.len()).collect();
    sorted.sort_unstable_by(|&a, &b| caseless_cmp(name(a), name(b)));
    let mut named = vec![false; headers.len()];
    for token in connection_tokens(headers) {
        let first = sorted.partition_point(|&i| caseless_cmp(name(i), token).is_lt());
        let same = sorted
            .get(first..)
            .unwrap_or_default()
            .iter()
            .take_while(|&&i| name(i).eq_ignore_ascii_case(token));
        for &i in same {
            // Marked before by the same token: so is the rest of the run.
            let Some(mark) = named.get_mut(i) else { break };
            if std::mem::replace(mark, true) {
                break;
            }
        }
    }
    named
}

/// Orders names as their lowercase forms do.
fn caseless_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.iter()
        .map(u8::to_ascii_lowercase)
        .cmp(b.iter().map(u8::to_ascii_lowercase))
}

fn is_connection(h: &httparse::Header<'_>) -> bool {
    h.name.eq_ignore_ascii_case("connection")
}

fn connection_tokens<'a>(headers: &'a [httparse::Header<'a>]) -> impl Iterator<Item = &'a [u8]> {
    headers
        .iter()
        .filter(|h| is_connection(h))
        .flat_map(|h| list(h.value))
}

/// A field's role: its fixed one, else hop-by-hop when a Connection token
/// names it (and it is not one a token cannot strip), else end-to-end.
/// Called for every field of every head.
fn role(name: &str, named_by_token: impl FnOnce() -> bool) -> Role {
    use crate::proxy::headers::NOT_STRIPPABLE;
    let fixed = fixed_role(name.as_bytes());
    if fixed == Role::EndToEnd
        && named_by_token()
        && !NOT_STRIPPABLE.iter().any(|n| name.eq_ignore_ascii_case(n))
    {
        Role::HopByHop
    } else {
        fixed
    }
}

/// The longest name `fixed_role`'s `match` knows (`x-cluster-client-ip`).
const LONGEST_KNOWN: usize = 19;

/// Whether `name` has the length and the first letter of one of the names
/// `fixed_role` knows: most names (`Date`, `Server`, `Content-Type`,
/// `User-Agent`, `Accept`) are ruled out by those alone, before any fold.
fn may_be_known(name: &[u8]) -> bool {
    // `CF-Connecting-IP`, where `Content-Encoding`, `-Language` and
    // `-Location` (as long, and common) would pass on the first letter.
    if name.len() == 16 && name[..2].eq_ignore_ascii_case(b"cf") {
        return true;
    }
    matches!(
        (name.len(), name.first().map(u8::to_ascii_lowercase)),
        (2, Some(b't'))
            | (4, Some(b'h'))
            | (6, Some(b'e'))
            | (7, Some(b'u'))
            | (9, Some(b'c' | b'f' | b'x'))
            | (10, Some(b'c' | b'k'))
            | (11, Some(b'x'))
            | (12, Some(b'x'))
            | (14, Some(b'c' | b'h' | b't'))
            | (15, Some(b'f'))
            | (16, Some(b'f' | b'p'))
            | (17, Some(b't'))
            | (19, Some(b'x'))
    )
}

/// The role a field's name alone gives it, from `headers`' lists
/// (`HOP_BY_HOP`, `FORWARDING`, `SET_BY_BATON`; a unit test holds the two
/// to each other) written as one `match` on the name folded once: lower
/// case, `_` as `-`. Asking each list in turn, the fold done again for
/// every name compared, cost a response head of five fields more than
/// httparse's parse of it.
pub(in crate::proxy::h1) fn fixed_role(name: &[u8]) -> Role {
    // Of any length: `X-Forwarded-` names are open-ended.
    if headers::has_forwarded_prefix(name) {
        return Role::Forwarding;
    }
    if !may_be_known(name) {
        return Role::EndToEnd;
    }
    let mut buf = [0u8; LONGEST_KNOWN];
    let mut underscored = false;
    for (slot, &b) in buf.iter_mut().zip(name) {
        underscored |= b == b'_';
        *slot = if b == b'_' {
            b'-'
        } else {
            b.to_ascii_lowercase()
        };
    }
    let folded = buf.get(..name.len()).unwrap_or_default();
    // Only forwarding names and the ones baton sets count in both
    // spellings; `keep_alive` is some other field.
    match (folded, underscored) {
        (b"host", false) => Role::Host,
        (b"content-length" | b"transfer-encoding", false) => Role::Framing,
        (
            b"connection" | b"keep-alive" | b"proxy-connection" | b"te" | b"upgrade"
            | b"http2-settings",
            false,
        ) => Role::HopByHop,
        (
            b"x-real-ip"
            | b"forwarded"
            | b"front-end-https"
            | b"true-client-ip"
            | b"x-client-ip"
            | b"client-ip"
            | b"x-cluster-client-ip"
            | b"cf-connecting-ip"
            | b"fastly-client-ip",
            _,
        ) => Role::Forwarding,
        (b"expect", false) => Role::Expect,
        (b"content-length" | b"transfer-encoding" | b"x-request-id", true) => Role::HopByHop,
        _ => Role::EndToEnd,
    }
}

/// The range `part` (a sub-slice httparse gave of `src`) covers in `src`,
/// which is also its range in the copy of `src` a head keeps.
fn offset(src: &[u8], part: &[u8]) -> Range<usize> {
    let start = (part.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize);
    match start.checked_add(part.len()) {
        Some(end) if end <= src.len() => start..end,
        // Not a part of `src`: httparse's static "" for a status line
        // without a reason phrase.
        _ => 0..0,
    }
}

/// `bytes[range]`, or nothing for a range that is not in it.
fn slice<'a>(bytes: &'a [u8], range: &Range<usize>) -> &'a [u8] {
    bytes.get(range.clone()).unwrap_or_default()
}

fn values<'a>(
    bytes: &'a [u8],
    fields: &'a [Field],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    fields
        .iter()
        .filter(move |f| slice(bytes, &f.name).eq_ignore_ascii_case(name.as_bytes()))
        .map(move |f| slice(bytes, &f.value))
}

/// Values of every field with this (lowercase) name, which has `role`
/// (the one `role` gives that name): one byte compared rules out most
/// fields before their names are.
fn values_in_role<'a>(
    bytes: &'a [u8],
    fields: &'a [Field],
    role: Role,
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    fields
        .iter()
        .filter(move |f| {
            f.role == role && slice(bytes, &f.name).eq_ignore_ascii_case(name.as_bytes())
        })
        .map(move |f| slice(bytes, &f.value))
}

/// The elements of a comma-separated list value, trimmed, empty ones dropped
/// (RFC 9110 §5.6.1).
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(trim)
        .filter(|t| !t.is_empty())
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// How many bytes of empty lines (CRLF or LF) httparse skipped before the
/// start line.
fn leading_empty_lines(buf: &[u8]) -> usize {
    buf.iter()
        .take_while(|b| matches!(b, b'\r' | b'\n'))
        .count()
}

fn version(minor: Option<u8>) -> Option<Version> {
    match minor {
        Some(0) => Some(Version::Http10),
        Some(1) => Some(Version::Http11),
        _ => None,
    }
}

fn httparse_reason(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid field name (or a folded line)",
        httparse::Error::HeaderValue => "invalid field value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        // A method, or a target that is not UTF-8 (httparse's path is
        // text).
        httparse::Error::Token => "invalid method or request target",
        httparse::Error::TooManyHeaders => "too many fields",
        httparse::Error::Version => "invalid version",
    }
}

/// A Content-Length value: 1..=19 ASCII digits, nothing else.
fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

fn length(n: u64) -> Framing {
    if n == 0 {
        Framing::Empty
    } else {
        Framing::Length(n)
    }
}

/// The values of a framing field (`content-length`, `transfer-encoding`).
fn named<'a>(head: &'a [u8], fields: &'a [Field], name: &'a str) -> Vec<&'a [u8]> {
    values_in_role(head, fields, Role::Framing, name).collect()
}

/// A request's body framing: one `Transfer-Encoding: chunked` (1.1 only)
/// or one strict Content-Length, never both, else no body.
fn request_framing(head: &[u8], fields: &[Field], version: Version) -> Result<Framing, Refusal> {
    let te = named(head, fields, "transfer-encoding");
    let cl = named(head, fields, "content-length");
    match (te.as_slice(), cl.as_slice()) {
        ([], []) => Ok(Framing::Empty),
        ([], [value]) => content_length(value)
            .map(length)
            .ok_or(Refusal::BadRequest("invalid content-length")),
        ([], _) => Err(Refusal::BadRequest("more than one content-length")),
        (_, [_, ..]) => Err(Refusal::BadRequest("transfer-encoding with content-length")),
        _ if version == Version::Http10 => {
            Err(Refusal::BadRequest("transfer-encoding in HTTP/1.0"))
        }
        ([value], []) if value.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
        _ => Err(Refusal::BadRequest("unsupported transfer-encoding")),
    }
}

/// A response's body framing (RFC 9112 §6.3): none for HEAD, 1xx, 204 and
/// 304; then Transfer-Encoding (chunked last, else until close); then
/// Content-Length (repeats must agree); else until close. And whether the
/// body carries another transfer coding than chunked.
fn response_framing(
    head: &[u8],
    fields: &[Field],
    version: Version,
    status: u16,
    method: &http::Method,
) -> Result<(Framing, bool), BadResponse> {
    if status < 200 || status == 204 {
        return Ok((Framing::Empty, false));
    }
    if method == http::Method::HEAD || status == 304 {
        // No body, but the length goes on to the client (it describes
        // the body a GET would get): it must be one valid length.
        agreed_length(head, fields)?;
        return Ok((Framing::Empty, false));
    }
    let mut te = values_in_role(head, fields, Role::Framing, "transfer-encoding").peekable();
    if te.peek().is_some() {
        if version == Version::Http10 {
            return Err(BadResponse::Malformed("transfer-encoding in HTTP/1.0"));
        }
        let (mut coded, mut last_chunked, mut chunked, mut codings) = (false, false, 0, 0);
        for coding in te.flat_map(list) {
            last_chunked = coding.eq_ignore_ascii_case(b"chunked");
            chunked += usize::from(last_chunked);
            coded |= !last_chunked;
            codings += 1;
        }
        // A Transfer-Encoding that names no coding (empty, or commas)
        // frames nothing: read as close-delimited, a Content-Length beside
        // it went on to h2 clients with more bytes than it said.
        if codings == 0 {
            return Err(BadResponse::Malformed("transfer-encoding without a coding"));
        }
        // Chunked applied twice, or under another coding, has no framing
        // baton could pass on in HTTP/1.1 (RFC 9112 §6.1: once, and last).
        if chunked > usize::from(last_chunked) {
            return Err(BadResponse::Malformed("chunked twice or not last"));
        }
        let framing = if last_chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        };
        return Ok((framing, coded));
    }
    match agreed_length(head, fields)? {
        None => Ok((Framing::UntilClose, false)),
        Some(n) => Ok((length(n), false)),
    }
}

/// A 204 with a Transfer-Encoding or a Content-Length other than 0 (RFC
/// 9110 §8.6: a server sends neither) comes from a backend that may send a
/// body after all: its connection is not kept, so such bytes, late, cannot
/// become the next request's answer.
fn speaks_of_a_body(head: &[u8], fields: &[Field], status: u16) -> bool {
    status == 204
        && (values_in_role(head, fields, Role::Framing, "transfer-encoding")
            .next()
            .is_some()
            || values_in_role(head, fields, Role::Framing, "content-length").any(|v| v != b"0"))
}

/// A response's Content-Length, if it has one: every repeat valid and the
/// same.
fn agreed_length(head: &[u8], fields: &[Field]) -> Result<Option<u64>, BadResponse> {
    let mut lengths =
        values_in_role(head, fields, Role::Framing, "content-length").map(content_length);
    match lengths.next() {
        None => Ok(None),
        Some(Some(n)) if lengths.all(|m| m == Some(n)) => Ok(Some(n)),
        Some(_) => Err(BadResponse::Malformed("invalid content-length")),
    }
}

fn keep_alive(version: Version, parts: &Parts) -> bool {
    match version {
        Version::Http11 => !parts.said.close,
        Version::Http10 => parts.said.keep_alive && !parts.said.close,
    }
}

/// `Expect: 100-continue` on 1.1; ignored on 1.0 (RFC 9110 §10.1.1); any
/// other expectation (an empty one too) is refused with 417 rather than
/// silently dropped.
fn expect_continue(head: &[u8], fields: &[Field], version: Version) -> Result<bool, Refusal> {
    let mut expect = values_in_role(head, fields, Role::Expect, "expect").peekable();
    let any = expect.peek().is_some();
    if !expect.all(expectation_met) {
        return Err(Refusal::ExpectationFailed(
            "an Expect other than 100-continue",
        ));
    }
    Ok(any && version == Version::Http11)
}

/// Whether an `Expect` value is one a proxy's next hop can meet:
/// `100-continue` alone (RFC 9110 §10.1.1; any other, an empty one too,
/// is 417 on both paths).
pub(crate) fn expectation_met(value: &[u8]) -> bool {
    value.eq_ignore_ascii_case(b"100-continue")
}

/// The Upgrade field's range for a 1.1 upgrade request, unless `h2c` is
/// offered (never tunnelled: h2c smuggling) or the field is repeated
/// (one list, one meaning).
fn upgrade(head: &[u8], parts: &Parts, version: Version) -> Option<Range<usize>> {
    if version != Version::Http11 || !parts.said.upgrade {
        return None;
    }
    let mut fields = parts
        .fields
        .iter()
        .filter(|f| slice(head, &f.name).eq_ignore_ascii_case(b"upgrade"));
    let field = fields.next()?;
    let value = slice(head, &field.value);
    let h2c = list(value).any(|p| {
        let name = p.split(|b| *b == b'/').next().unwrap_or_default();
        trim(name).eq_ignore_ascii_case(b"h2c")
    });
    (fields.next().is_none() && !value.is_empty() && !h2c).then(|| field.value.clone())
}

/// A `TE` element `trailers` (parameters after `;` ignored).
fn takes_trailers(head: &[u8], fields: &[Field]) -> bool {
    values_in_role(head, fields, Role::HopByHop, "te")
        .flat_map(list)
        .any(|t| {
            let name = t.split(|b| *b == b';').next().unwrap_or_default();
            trim(name).eq_ignore_ascii_case(b"trailers")
        })
}

/// An absolute-form target's authority and the rest after it (path and
/// query), for `http://` and `https://` (any case).
fn absolute_form(target: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = ["http://", "https://"].iter().find_map(|scheme| {
        let (head, rest) = target.split_at_checked(scheme.len())?;
        head.eq_ignore_ascii_case(scheme.as_bytes()).then_some(rest)
    })?;
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?'))
        .unwrap_or(rest.len());
    Some(rest.split_at(end))
}

/// Origin-form (`/...`), absolute-form with a valid authority, or `*` for
/// OPTIONS (RFC 9112 §3.2); authority-form is CONNECT's, refused before.
/// A fragment (`#`) is no part of any form: baton would route on the path
/// before it while a backend reads the whole (`/app.js#/../admin`), the
/// path-rule bypass HAProxy closed by refusing it (CVE-2023-45539).
fn check_target(request: &RequestHead) -> Result<(), Refusal> {
    let target = request.target();
    if target.contains(&b'#') {
        return Err(Refusal::BadRequest("fragment in request target"));
    }
    if target.starts_with(b"/") {
        return Ok(());
    }
    if target == b"*" {
        return if request.method == http::Method::OPTIONS {
            Ok(())
        } else {
            Err(Refusal::BadRequest("asterisk-form target without OPTIONS"))
        };
    }
    match absolute_form(target) {
        Some((authority, _)) if valid_authority(authority) => Ok(()),
        Some(_) => Err(Refusal::BadRequest("invalid authority in target")),
        None => Err(Refusal::BadRequest("invalid request target")),
    }
}

/// One Host field, required on 1.1 and non-empty there; any Host holds
/// authority characters only (no whitespace, `/`, `@`, ...).
fn check_host(request: &RequestHead) -> Result<(), Refusal> {
    let mut hosts = values_in_role(&request.bytes, &request.fields, Role::Host, "host");
    let (first, second) = (hosts.next(), hosts.next());
    if second.is_some() {
        return Err(Refusal::BadRequest("more than one Host"));
    }
    match first {
        None if request.version == Version::Http11 => Err(Refusal::BadRequest("missing Host")),
        None => Ok(()),
        Some(host) if host.is_empty() && request.version == Version::Http11 => {
            Err(Refusal::BadRequest("empty Host"))
        }
        Some(host) if host.is_empty() || valid_authority(host) => Ok(()),
        Some(_) => Err(Refusal::BadRequest("invalid Host")),
    }
}

/// Whether `method` is one of the standard methods written in another
/// case (`head`, `Get`): methods are case-sensitive (RFC 9110 §9.1), so
/// baton takes `head` for an unknown method, whose response has a body,
/// while a backend that folds case reads a HEAD and sends none, and the
/// next response on that connection becomes this one's body. Refused with
/// 400, as nginx refuses any method not in capitals. Asked of every
/// request: a method in capitals (every client's) is one scan, no compare.
pub(crate) fn standard_method_in_another_case(method: &[u8]) -> bool {
    const STANDARD: [&[u8]; 9] = [
        b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH",
    ];
    method.iter().any(u8::is_ascii_lowercase)
        && STANDARD.iter().any(|m| m.eq_ignore_ascii_case(method))
}

/// `host [":" port]` (RFC 3986 §3.2.2–3, as RFC 9112 §3.2 asks of Host
/// and of an absolute-form target): a non-empty reg-name or IPv4 address,
/// or an IP literal in brackets, then digits after one colon. No userinfo,
/// whitespace or `/`; nor a second colon or a stray bracket (`a:1:2`,
/// `a]b`), which routing (`config::strip_port`) and an HTTP/1 backend would
/// cut in different places: nginx takes `a:1:2` as host `a`, where no
/// route named `a` would see it.
pub(crate) fn valid_authority(authority: &[u8]) -> bool {
    // One pass over the host: the first byte it may not hold ends it, and
    // must be its end (`]` for a literal, then `:` or the end).
    let after = match authority.strip_prefix(b"[") {
        Some(literal) => match literal.iter().position(|&b| !IP_LITERAL[usize::from(b)]) {
            Some(end) if end > 0 && literal[end] == b']' => &literal[end + 1..],
            _ => return false,
        },
        None => {
            let end = authority
                .iter()
                .position(|&b| !REG_NAME[usize::from(b)])
                .unwrap_or(authority.len());
            if end == 0 {
                return false;
            }
            &authority[end..]
        }
    };
    match after {
        [] => true,
        [b':', port @ ..] => port.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// The bytes of a reg-name or IPv4 address (unreserved, sub-delims and
/// `%` of percent-encoding), as a table: one load a byte, where searching
/// the punctuation list for each cost a tenth of a request head's parse.
const REG_NAME: [bool; 256] = byte_table(b"-._~%!$&'()*+,;=");

/// The bytes inside an IP literal's brackets: an IPv6 address's, and an
/// IPvFuture's (`v1.x`: a reg-name's and `:`).
const IP_LITERAL: [bool; 256] = byte_table(b"-._~%!$&'()*+,;=:");

/// ASCII letters and digits, and `punctuation`.
const fn byte_table(punctuation: &[u8]) -> [bool; 256] {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let mut i = 0;
    while i < punctuation.len() {
        table[punctuation[i] as usize] = true;
        i += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(bytes: &[u8]) -> Result<RequestHead, Refusal> {
        match parse_request(bytes)? {
            Parsed::Complete(head) => Ok(head),
            Parsed::Partial => panic!("partial: {:?}", String::from_utf8_lossy(bytes)),
        }
    }

    fn ok(bytes: &[u8]) -> RequestHead {
        req(bytes).unwrap()
    }

    fn bad(bytes: &[u8]) -> Refusal {
        req(bytes).expect_err(&String::from_utf8_lossy(bytes))
    }

    fn is_400(bytes: &[u8]) -> bool {
        matches!(bad(bytes), Refusal::BadRequest(_))
    }

    fn role_of(head: &RequestHead, name: &str) -> Role {
        let f = head
            .fields
            .iter()
            .find(|f| head.field_name(f).eq_ignore_ascii_case(name.as_bytes()));
        f.unwrap().role
    }

    fn res(bytes: &[u8], method: &http::Method) -> Result<ResponseHead, BadResponse> {
        match parse_response(bytes, method)? {
            Parsed::Complete(head) => Ok(head),
            Parsed::Partial => panic!("partial"),
        }
    }

    fn get(bytes: &[u8]) -> ResponseHead {
        res(bytes, &http::Method::GET).unwrap()
    }

    /// A target past ASCII is taken when it is UTF-8 and refused when not
    /// (httparse's path is text): an access line shows any target it
    /// took, and the refusal names the target.
    #[test]
    fn a_target_is_utf8_or_refused() {
        assert_eq!(
            ok("GET /é?q=ü HTTP/1.1\r\nHost: a\r\n\r\n".as_bytes()).target(),
            "/é?q=ü".as_bytes()
        );
        for odd in [&b"/p\xFF"[..], b"/a\x80", b"/\xC3"] {
            let raw = [&b"GET "[..], odd, b" HTTP/1.1\r\nHost: a\r\n\r\n"].concat();
            let why = bad(&raw);
            assert!(
                matches!(why, Refusal::BadRequest(r) if r.contains("target")),
                "{why:?}"
            );
        }
    }

    #[test]
    fn a_plain_get_is_offsets_into_its_own_bytes() {
        let raw = b"GET /a/b?x=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\r\nNEXT";
        let head = ok(raw);
        assert_eq!(head.method, http::Method::GET);
        assert_eq!(head.target(), b"/a/b?x=1");
        assert_eq!(head.path(), b"/a/b");
        assert_eq!(head.host(), Some(&b"example.com:8080"[..]));
        assert_eq!(head.version, Version::Http11);
        assert_eq!(head.framing, Framing::Empty);
        assert!(head.keep_alive && !head.expect_continue && head.upgrade.is_none());
        assert_eq!(head.consumed, raw.len() - 4);
        assert_eq!(&head.bytes[..], &raw[..raw.len() - 4]);
        let accept = &head.fields[1];
        assert_eq!(
            (head.field_name(accept), head.field_value(accept)),
            (&b"Accept"[..], &b"*/*"[..])
        );
        assert_eq!(head.values("accept").collect::<Vec<_>>(), vec![&b"*/*"[..]]);
    }

    #[test]
    fn an_incomplete_head_is_partial_until_max_head() {
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nHost: a\r\n"),
            Ok(Parsed::Partial)
        ));
        assert!(matches!(parse_request(b""), Ok(Parsed::Partial)));
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD, b'a');
        assert_eq!(bad(&big), Refusal::TooLarge);
        big.truncate(MAX_HEAD - 1);
        assert!(matches!(parse_request(&big), Ok(Parsed::Partial)));
    }

    #[test]
    fn too_many_fields_is_too_large() {
        let mut raw = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..MAX_FIELDS {
            raw.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        raw.extend_from_slice(b"\r\n");
        assert_eq!(bad(&raw), Refusal::TooLarge);
        assert_eq!(bad(&raw).status(), 431);
    }

    #[test]
    fn leading_empty_lines_are_consumed_but_not_in_the_head() {
        let raw = b"\r\n\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let head = ok(raw);
        assert_eq!(head.consumed, raw.len());
        assert!(head.bytes.starts_with(b"GET / HTTP/1.1"));
        assert_eq!(head.bytes.len(), raw.len() - 5);
        assert_eq!(head.target(), b"/");
        assert_eq!(head.host(), Some(&b"a"[..]));
    }

    #[test]
    fn only_http_1_0_and_1_1() {
        assert!(is_400(b"GET / HTTP/2.0\r\nHost: a\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.2\r\nHost: a\r\n\r\n"));
        assert!(is_400(b"GET /\r\n\r\n"));
        assert_eq!(ok(b"GET / HTTP/1.0\r\n\r\n").version, Version::Http10);
    }

    #[test]
    fn host_is_required_once_and_valid_on_1_1() {
        assert!(is_400(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\tb\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost:\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost:   \r\n\r\n"));
        // host [":" port], nothing else: what routing strips as a port is
        // what a backend reads as one.
        for bad in [
            &b"a:1:2"[..],
            b"a:b",
            b"a]b",
            b"a[b",
            b":80",
            b"[::1",
            b"[]",
            b"[::1]x",
            b"[::1]:8a",
            b"[::1]]",
            b"[a[b]",
        ] {
            let raw = [&b"GET / HTTP/1.1\r\nHost: "[..], bad, b"\r\n\r\n"].concat();
            assert!(is_400(&raw), "{}", String::from_utf8_lossy(bad));
            let absolute = [&b"GET http://"[..], bad, b"/ HTTP/1.1\r\nHost: a\r\n\r\n"].concat();
            assert!(is_400(&absolute), "{}", String::from_utf8_lossy(bad));
        }
        for good in [
            &b"a"[..],
            b"a:",
            b"a:8080",
            b"127.0.0.1:80",
            b"[::1]",
            b"[::ffff:127.0.0.1]:80",
            b"a-b.c_d~e%41",
        ] {
            let raw = [&b"GET / HTTP/1.1\r\nHost: "[..], good, b"\r\n\r\n"].concat();
            assert_eq!(ok(&raw).host(), Some(good));
        }
        assert_eq!(
            ok(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n").host(),
            Some(&b"[::1]:80"[..])
        );
        assert_eq!(ok(b"GET / HTTP/1.0\r\n\r\n").host(), None);
        assert_eq!(ok(b"GET / HTTP/1.0\r\nHost:\r\n\r\n").host(), None);
        assert!(is_400(b"GET / HTTP/1.0\r\nHost: a@b\r\n\r\n"));
        assert_eq!(
            ok(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").fields[0].role,
            Role::Host
        );
    }

    #[test]
    fn targets_are_origin_absolute_or_asterisk_form() {
        let head = ok(b"GET http://Example.com:81/p/q?x HTTP/1.1\r\nHost: other\r\n\r\n");
        assert_eq!(head.target_authority(), Some(&b"Example.com:81"[..]));
        assert_eq!(head.host(), Some(&b"Example.com:81"[..]));
        assert_eq!(head.path(), b"/p/q");
        let head = ok(b"GET HTTPS://b.example HTTP/1.1\r\nHost: b.example\r\n\r\n");
        assert_eq!(head.target_authority(), Some(&b"b.example"[..]));
        assert_eq!(head.path(), b"/");
        assert_eq!(
            ok(b"GET hTtP://c?x=1 HTTP/1.1\r\nHost: c\r\n\r\n").path(),
            b"/"
        );
        assert_eq!(ok(b"GET /?x HTTP/1.1\r\nHost: c\r\n\r\n").path(), b"/");
        assert_eq!(
            ok(b"GET / HTTP/1.1\r\nHost: c\r\n\r\n").target_authority(),
            None
        );
        let head = ok(b"OPTIONS * HTTP/1.1\r\nHost: c\r\n\r\n");
        assert_eq!((head.path(), head.target()), (&b"*"[..], &b"*"[..]));
        assert!(is_400(b"GET * HTTP/1.1\r\nHost: c\r\n\r\n"));
        assert!(is_400(b"GET nope HTTP/1.1\r\nHost: c\r\n\r\n"));
        assert!(is_400(b"GET ftp://c/ HTTP/1.1\r\nHost: c\r\n\r\n"));
        assert!(is_400(b"GET http:///p HTTP/1.1\r\nHost: c\r\n\r\n"));
        assert!(is_400(b"GET http://u@c/p HTTP/1.1\r\nHost: c\r\n\r\n"));
    }

    #[test]
    fn a_fragment_is_refused_in_any_form() {
        for target in ["/a.js#/../admin", "/?q#f", "http://c/p#f", "http://c#f"] {
            let head = format!("GET {target} HTTP/1.1\r\nHost: c\r\n\r\n");
            assert_eq!(
                bad(head.as_bytes()),
                Refusal::BadRequest("fragment in request target"),
                "{target}"
            );
        }
    }

    #[test]
    fn connect_is_not_allowed() {
        let r = bad(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n");
        assert_eq!(r, Refusal::MethodNotAllowed("CONNECT"));
        assert_eq!(r.status(), 405);
        assert!(matches!(
            bad(b"CONNECT / HTTP/1.1\r\n\r\n"),
            Refusal::MethodNotAllowed(_)
        ));
    }

    #[test]
    fn methods_are_tokens() {
        assert!(is_400(b"G\xffT / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(is_400(b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert_eq!(
            ok(b"PURGE / HTTP/1.1\r\nHost: a\r\n\r\n").method.as_str(),
            "PURGE"
        );
        assert_eq!(bad(b"G\xffT / HTTP/1.1\r\n\r\n").status(), 400);
    }

    #[test]
    fn content_length_is_one_field_of_plain_digits() {
        let cl = |v: &str| {
            req(format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {v}\r\n\r\n").as_bytes())
        };
        assert_eq!(cl("5").unwrap().framing, Framing::Length(5));
        assert_eq!(cl("0").unwrap().framing, Framing::Empty);
        assert_eq!(cl("007").unwrap().framing, Framing::Length(7));
        assert_eq!(
            cl("9999999999999999999").unwrap().framing,
            Framing::Length(9_999_999_999_999_999_999)
        );
        for v in [
            "+5",
            "-1",
            "5 5",
            "5,5",
            "5, 5",
            "0x5",
            "abc",
            "",
            "18446744073709551616",
            "00000000000000000001",
        ] {
            assert!(matches!(cl(v), Err(Refusal::BadRequest(_))), "{v}");
        }
        assert!(is_400(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"
        ));
        assert!(is_400(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"
        ));
        let head = cl("5").unwrap();
        assert_eq!(role_of(&head, "content-length"), Role::Framing);
    }

    #[test]
    fn transfer_encoding_is_exactly_chunked() {
        let te = |v: &str| {
            req(format!("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {v}\r\n\r\n").as_bytes())
        };
        assert_eq!(te("chunked").unwrap().framing, Framing::Chunked);
        assert_eq!(te("cHuNkEd").unwrap().framing, Framing::Chunked);
        assert_eq!(te("chunked  ").unwrap().framing, Framing::Chunked);
        assert_eq!(
            req(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-encoding:\tchunked\r\n\r\n")
                .unwrap()
                .framing,
            Framing::Chunked
        );
        for v in [
            "xchunked",
            "chunked, gzip",
            "gzip, chunked",
            "identity",
            "",
            "chunked,",
            "chunked;q=1",
            "\"chunked\"",
        ] {
            assert!(matches!(te(v), Err(Refusal::BadRequest(_))), "{v:?}");
        }
        assert_eq!(
            role_of(&te("chunked").unwrap(), "transfer-encoding"),
            Role::Framing
        );
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        // CL.TE and TE.CL: both framings.
        assert!(is_400(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX"));
        assert!(is_400(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"));
        // TE.TE obfuscations.
        assert!(is_400(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n"));
        assert!(is_400(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"));
        assert!(is_400(
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n"
        ));
        assert!(is_400(
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"
        ));
        assert!(is_400(
            b"POST / HTTP/1.1\r\nHost: a\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(is_400(
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n"
        ));
        // TE on HTTP/1.0.
        assert!(is_400(
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
    }

    #[test]
    fn bare_lf_is_accepted() {
        let head = ok(b"POST /x HTTP/1.1\nHost: a\nContent-Length: 3\n\nabc");
        assert_eq!(head.framing, Framing::Length(3));
        assert_eq!(head.consumed, head.bytes.len());
        assert_eq!(head.bytes.len(), 44);
        assert_eq!(head.host(), Some(&b"a"[..]));
    }

    #[test]
    fn folded_lines_and_control_bytes_are_refused() {
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n z\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\tz\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\n Host: a\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nX: y\0z\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nX: y\rz\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nX\0: y\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nX\r: y\r\n\r\n"));
        assert!(is_400(b"GET / HTTP/1.1\r\nHost: a\r\nX: \x01\r\n\r\n"));
        assert_eq!(
            ok(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\tb\r\n\r\n")
                .values("x")
                .next(),
            Some(&b"a\tb"[..])
        );
    }

    #[test]
    fn expect_is_100_continue_or_refused() {
        let head =
            ok(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n");
        assert!(head.expect_continue);
        assert_eq!(role_of(&head, "expect"), Role::Expect);
        assert_eq!(
            bad(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: foo\r\n\r\n"),
            Refusal::ExpectationFailed("an Expect other than 100-continue")
        );
        assert_eq!(
            bad(b"POST / HTTP/1.1\r\nHost: a\r\nExpect:\r\n\r\n").status(),
            417
        );
        assert!(!ok(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n").expect_continue);
    }

    #[test]
    fn keep_alive_follows_version_and_connection_tokens() {
        assert!(!ok(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n").keep_alive);
        assert!(!ok(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, close\r\n\r\n").keep_alive);
        assert!(ok(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        assert!(!ok(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(ok(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(
            !ok(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n")
                .keep_alive
        );
    }

    #[test]
    fn tokens_past_those_gathered_still_name_fields() {
        let many = (1..=GATHERED_TOKENS + 2)
            .map(|i| format!("x-t{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let last = format!("x-t{}", GATHERED_TOKENS + 2);
        let text = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: {many}\r\nConnection: close\r\n\
{last}: 1\r\nx-t1: 1\r\nx-other: 1\r\n\r\n"
        );
        let head = ok(text.as_bytes());
        assert_eq!(role_of(&head, &last), Role::HopByHop);
        assert_eq!(role_of(&head, "x-t1"), Role::HopByHop);
        assert_eq!(role_of(&head, "x-other"), Role::EndToEnd);
        assert!(!head.keep_alive, "close, the last token, is heard");
    }

    /// Feeds `text` a byte at a time as `next_head` reads it: the parses
    /// made, and the length at which the first one ended (complete or
    /// refused).
    fn trickled(text: &[u8]) -> (usize, Option<usize>) {
        let mut parsed = 0;
        let mut parses = 0;
        for end in 1..=text.len() {
            let buf = &text[..end];
            if worth_parsing(buf, parsed) {
                parsed = end;
                parses += 1;
                if !matches!(parse_request(buf), Ok(Parsed::Partial)) {
                    return (parses, Some(end));
                }
            }
        }
        (parses, None)
    }

    /// A head trickled a byte at a time is parsed at its first byte, at
    /// each line's end and each doubling, not at every byte; its end is
    /// never missed, and a malformed line no `\n` ends is refused once the
    /// head has doubled past it.
    #[test]
    fn a_trickled_head_is_parsed_once_a_line_or_a_doubling() {
        let text = b"GET / HTTP/1.1\r\nHost: a\r\nX-Long: 0123456789abcdefghij0123456789\r\n\r\n";
        let (parses, ended) = trickled(text);
        assert_eq!(ended, Some(text.len()), "complete at its last byte");
        // At bytes 1, 2, 4, 8, 16 (a line's end too), 25, 50 (a doubling),
        // 65 and 67 (lines' ends).
        assert_eq!(parses, 9);
        let bad = b"GET / HTTP/1.1\r\nBad Header: 0123456789abcdefghij";
        assert_eq!(
            trickled(bad),
            (6, Some(32)),
            "refused at the doubling after it"
        );
        assert!(
            worth_parsing(&vec![b'a'; MAX_HEAD], MAX_HEAD - 1),
            "the limit is parsed"
        );
    }

    #[test]
    fn many_tokens_name_their_fields_in_any_case_and_repeated() {
        let mut tokens: Vec<String> = (0..40).map(|i| format!("x-u{i}")).collect();
        tokens.extend(["X-Dup", "x-dup", "COOKIE", "x-ab", "x-a"].map(String::from));
        let text = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: {}\r\nx-dup: 1\r\nX-DUP: 2\r\n\
x-u39: 1\r\nx-u0: 1\r\ncookie: c\r\nx-a: 1\r\nx-abc: 1\r\nx-u: 1\r\nx-u400: 1\r\n\r\n",
            tokens.join(",")
        );
        let head = ok(text.as_bytes());
        let role = |i: usize| head.fields[i].role;
        let named: Vec<usize> = (0..head.fields.len())
            .filter(|&i| role(i) == Role::HopByHop)
            .collect();
        // Connection itself, both x-dup fields, x-u39, x-u0 and x-a; not
        // cookie (a token may not strip it), x-abc, x-u or x-u400.
        let names: Vec<String> = named
            .iter()
            .map(|&i| String::from_utf8_lossy(head.field_name(&head.fields[i])).into_owned())
            .collect();
        assert_eq!(
            names,
            ["Connection", "x-dup", "X-DUP", "x-u39", "x-u0", "x-a"],
            "{:?}",
            head.fields
        );
        assert!(head.keep_alive);
    }

    #[test]
    fn a_head_of_thousands_of_tokens_is_read_with_every_role_right() {
        // The shape that cost fields × tokens: 30,000 one-letter tokens and
        // 120 one-letter fields; half of them named.
        let mut text = String::from("GET / HTTP/1.1\r\nHost: a\r\nConnection: ");
        text.push_str(&"a,".repeat(30_000));
        text.push_str("close\r\n");
        for _ in 0..60 {
            text.push_str("b: 1\r\na: 1\r\n");
        }
        text.push_str("\r\n");
        let head = ok(text.as_bytes());
        let hop = |name: &[u8]| {
            head.fields
                .iter()
                .filter(|f| head.field_name(f) == name)
                .all(|f| f.role == Role::HopByHop)
        };
        assert!(hop(b"a"));
        assert!(head
            .fields
            .iter()
            .filter(|f| head.field_name(f) == b"b")
            .all(|f| f.role == Role::EndToEnd));
        assert!(!head.keep_alive, "close, the last token, is heard");
    }

    /// The roles by `headers`' lists, asked in turn (what `fixed_role`
    /// folds into one match).
    fn role_by_lists(name: &str) -> Role {
        use crate::proxy::headers::{is_forwarding, is_underscored_set_by_baton, HOP_BY_HOP};
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is("host") {
            Role::Host
        } else if is("content-length") || is("transfer-encoding") {
            Role::Framing
        } else if HOP_BY_HOP.iter().any(|n| is(n)) {
            Role::HopByHop
        } else if is_forwarding(name.as_bytes()) {
            Role::Forwarding
        } else if is("expect") {
            Role::Expect
        } else if is_underscored_set_by_baton(name.as_bytes()) {
            Role::HopByHop
        } else {
            Role::EndToEnd
        }
    }

    #[test]
    fn a_names_fixed_role_is_the_one_the_lists_give() {
        use crate::proxy::headers::{FORWARDING, HOP_BY_HOP, NOT_STRIPPABLE, SET_BY_BATON};
        let known = [
            "host",
            "expect",
            "x-request-id",
            "date",
            "server",
            "accept",
            "x-forwarded-port",
            "x-forwarded-ssl",
        ];
        let all = HOP_BY_HOP
            .iter()
            .chain(FORWARDING)
            .chain(SET_BY_BATON)
            .chain(NOT_STRIPPABLE)
            .chain(&known);
        let mut asked = 0;
        for name in all {
            let upper = name.to_ascii_uppercase();
            let underscored = name.replace('-', "_");
            let one_underscore = name.replacen('-', "_", 1);
            let longer = format!("{name}s");
            let shorter = &name[..name.len() - 1];
            let other_letter = format!("{}q", shorter);
            for spelling in [
                *name,
                &upper,
                &underscored,
                &one_underscore,
                &longer,
                shorter,
                &other_letter,
            ] {
                assert_eq!(
                    fixed_role(spelling.as_bytes()),
                    role_by_lists(spelling),
                    "{spelling}"
                );
                asked += 1;
            }
        }
        assert!(asked > 100);
        assert_eq!(fixed_role(b"Keep_Alive"), Role::EndToEnd);
        assert_eq!(fixed_role(b"X_Forwarded_For"), Role::Forwarding);
        assert_eq!(fixed_role(b"Transfer_Encoding"), Role::HopByHop);
        assert_eq!(fixed_role(b"x-forwarded-proto-and-more"), Role::Forwarding);
        assert_eq!(fixed_role(b"X_Forwarded_Prefix"), Role::Forwarding);
        assert_eq!(fixed_role(b"x-forwarded-"), Role::EndToEnd);
        assert_eq!(fixed_role(b"x-forwardedport"), Role::EndToEnd);
    }

    #[test]
    fn roles_are_decided_once() {
        let head = ok(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-Secret , cookie, content-type, Authorization, content-encoding\r\n\
Keep-Alive: 5\r\nProxy-Connection: x\r\nTE: trailers\r\nUpgrade: y\r\nHTTP2-Settings: z\r\nTrailer: t\r\n\
X-Forwarded-For: 1\r\nX-Forwarded-Proto: 2\r\nX-Forwarded-Host: 3\r\nX-Real-IP: 4\r\nForwarded: 5\r\n\
X-Forwarded-Client-Cert: 6\r\nx-secret: s\r\nCookie: c\r\nContent-Type: t\r\nAuthorization: a\r\nContent-Encoding: e\r\nAccept: a\r\n\r\n");
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "te",
            "upgrade",
            "http2-settings",
            "x-secret",
        ] {
            assert_eq!(role_of(&head, name), Role::HopByHop, "{name}");
        }
        for name in [
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "x-real-ip",
            "forwarded",
            "x-forwarded-client-cert",
        ] {
            assert_eq!(role_of(&head, name), Role::Forwarding, "{name}");
        }
        for name in [
            "trailer",
            "cookie",
            "content-type",
            "authorization",
            "content-encoding",
            "accept",
        ] {
            assert_eq!(role_of(&head, name), Role::EndToEnd, "{name}");
        }
        assert_eq!(role_of(&head, "host"), Role::Host);
        assert!(head.takes_trailers);
        assert!(head.upgrade.is_none(), "no upgrade token in Connection");
        let head = ok(b"GET / HTTP/1.1\r\nConnection: host, content-length\r\nHost: a\r\nContent-Length: 1\r\n\r\n");
        assert_eq!(role_of(&head, "host"), Role::Host);
        assert_eq!(role_of(&head, "content-length"), Role::Framing);
    }

    #[test]
    fn upgrades_are_offered_unless_h2c() {
        let up = |conn: &str, upgrade: &str| {
            let head = ok(format!(
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: {conn}\r\nUpgrade: {upgrade}\r\n\r\n"
            )
            .as_bytes());
            head.upgrade.clone().map(|r| head.bytes[r].to_vec())
        };
        assert_eq!(up("Upgrade", "websocket"), Some(b"websocket".to_vec()));
        assert_eq!(
            up("keep-alive, upgrade", "foo/2, bar"),
            Some(b"foo/2, bar".to_vec())
        );
        assert_eq!(up("upgrade", "h2c"), None);
        assert_eq!(up("upgrade, HTTP2-Settings", "websocket, H2C"), None);
        assert_eq!(up("upgrade", "h2c/1"), None);
        assert_eq!(up("keep-alive", "websocket"), None);
        assert!(
            ok(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n")
                .upgrade
                .is_none()
        );
        assert!(
            ok(b"GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
                .upgrade
                .is_none()
        );
        assert!(ok(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: a\r\nUpgrade: b\r\n\r\n"
        )
        .upgrade
        .is_none());
    }

    #[test]
    fn te_trailers_is_noticed() {
        assert!(
            ok(b"GET / HTTP/1.1\r\nHost: a\r\nTE: gzip;q=0.5, Trailers\r\n\r\n").takes_trailers
        );
        assert!(ok(b"GET / HTTP/1.1\r\nHost: a\r\nTE: trailers;q=1\r\n\r\n").takes_trailers);
        assert!(!ok(b"GET / HTTP/1.1\r\nHost: a\r\nTE: gzip\r\n\r\n").takes_trailers);
        assert!(!ok(b"GET / HTTP/1.1\r\nHost: a\r\nX: trailers\r\n\r\n").takes_trailers);
    }

    #[test]
    fn values_are_in_order_and_case_blind() {
        let head = ok(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\nX-B: 3\r\nX-A:\r\n\r\n");
        assert_eq!(
            head.values("x-a").collect::<Vec<_>>(),
            vec![&b"1"[..], b"2", b""]
        );
    }

    #[test]
    fn a_response_head_is_offsets_too() {
        let raw = b"\r\nHTTP/1.1 200 Fine Thanks\r\nContent-Length: 3\r\nX: y\r\n\r\nabc";
        let head = get(raw);
        assert_eq!(head.status, 200);
        assert_eq!(head.reason(), b"Fine Thanks");
        assert_eq!(head.framing, Framing::Length(3));
        assert!(head.keep_alive);
        assert_eq!(head.consumed, raw.len() - 3);
        assert!(head.bytes.starts_with(b"HTTP/1.1 200"));
        assert_eq!(head.values("x").next(), Some(&b"y"[..]));
        assert_eq!(head.field_name(&head.fields[1]), b"X");
        assert_eq!(head.field_value(&head.fields[0]), b"3");
        assert_eq!(get(b"HTTP/1.1 204\r\n\r\n").reason(), b"");
    }

    #[test]
    fn bodiless_responses_are_empty_whatever_they_say() {
        let head_method = res(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
            &http::Method::HEAD,
        )
        .unwrap();
        assert_eq!(head_method.framing, Framing::Empty);
        let interim = res(
            b"HTTP/1.1 103 Early Hints\r\nContent-Length: x\r\n\r\n",
            &http::Method::HEAD,
        );
        assert!(interim.is_ok(), "an interim head's length goes nowhere");
        for bad in ["x", "1, 2", "10\r\nContent-Length: 11"] {
            let raw = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
            assert_eq!(
                res(raw.as_bytes(), &http::Method::HEAD).unwrap_err(),
                BadResponse::Malformed("invalid content-length"),
                "a HEAD's length goes on, so it must be one: {bad}"
            );
            let raw = format!("HTTP/1.1 304 Not Modified\r\nContent-Length: {bad}\r\n\r\n");
            assert!(res(raw.as_bytes(), &http::Method::GET).is_err(), "{bad}");
        }
        for status in ["100", "101", "103", "204", "304"] {
            let raw = format!(
                "HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
            );
            assert_eq!(get(raw.as_bytes()).framing, Framing::Empty, "{status}");
        }
    }

    #[test]
    fn response_transfer_encoding_overrides_content_length() {
        let head =
            get(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.fields.iter().all(|f| f.role == Role::Framing));
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n").framing,
            Framing::Chunked
        );
        assert_eq!(
            get(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            .framing,
            Framing::Chunked
        );
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 4\r\n\r\n").framing,
            Framing::UntilClose
        );
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n").framing,
            Framing::UntilClose
        );
        assert!(res(
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            &http::Method::GET
        )
        .is_err());
    }

    /// Chunked twice, or under another coding: HTTP/1.1 has no way to
    /// pass it on (chunked once, last), so no framing is guessed.
    #[test]
    fn a_response_chunked_twice_or_not_last_is_malformed() {
        for te in [
            &b"chunked, chunked"[..],
            b"chunked\r\nTransfer-Encoding: chunked",
            b"chunked, gzip",
            b"gzip, chunked, gzip",
        ] {
            let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: ".to_vec();
            raw.extend_from_slice(te);
            raw.extend_from_slice(b"\r\n\r\n");
            assert_eq!(
                res(&raw, &http::Method::GET).unwrap_err(),
                BadResponse::Malformed("chunked twice or not last"),
                "{}",
                String::from_utf8_lossy(te)
            );
        }
    }

    /// A Transfer-Encoding that names no coding frames nothing: refused,
    /// not read as close-delimited beside a Content-Length an h2 client
    /// was given.
    #[test]
    fn a_response_transfer_encoding_without_a_coding_is_malformed() {
        for te in [&b""[..], b",", b" , ,"] {
            let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding:".to_vec();
            raw.extend_from_slice(te);
            raw.extend_from_slice(b"\r\nContent-Length: 3\r\n\r\n");
            assert_eq!(
                res(&raw, &http::Method::GET).unwrap_err(),
                BadResponse::Malformed("transfer-encoding without a coding"),
                "{}",
                String::from_utf8_lossy(te)
            );
        }
    }

    #[test]
    fn a_response_knows_a_transfer_coding_other_than_chunked() {
        let coded = |raw: &[u8]| get(raw).coded;
        assert!(coded(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        ));
        assert!(coded(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"));
        assert!(coded(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(!coded(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
        ));
        assert!(!coded(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"));
        // No body, so nothing coded.
        assert!(!coded(
            b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: gzip\r\n\r\n"
        ));
    }

    #[test]
    fn a_status_line_without_a_reason_has_an_empty_one() {
        let head = get(b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(head.reason, 0..0);
    }

    #[test]
    fn response_content_length_repeats_must_agree() {
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\n").framing,
            Framing::Length(4)
        );
        assert_eq!(
            get(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").framing,
            Framing::Empty
        );
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: +4\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: x\r\n\r\n",
        ] {
            assert!(matches!(
                res(bad, &http::Method::GET),
                Err(BadResponse::Malformed(_))
            ));
        }
    }

    #[test]
    fn response_keep_alive() {
        assert!(get(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n").keep_alive);
        for says in ["Content-Length: 5", "Transfer-Encoding: chunked"] {
            let raw = format!("HTTP/1.1 204 No Content\r\n{says}\r\n\r\n");
            assert!(!get(raw.as_bytes()).keep_alive, "a 204 with {says}");
        }
        let head = get(b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(head.framing, Framing::UntilClose);
        assert!(!head.keep_alive);
        assert!(
            !get(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n").keep_alive
        );
        assert!(!get(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n").keep_alive);
        assert!(
            get(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n")
                .keep_alive
        );
        assert_eq!(get(b"HTTP/1.0 200 OK\r\n\r\n").version, Version::Http10);
    }

    #[test]
    fn malformed_responses() {
        let m = |raw: &[u8]| res(raw, &http::Method::GET).unwrap_err();
        assert!(matches!(
            m(b"HTTP/1.1 099 Low\r\n\r\n"),
            BadResponse::Malformed(_)
        ));
        assert!(matches!(
            m(b"HTTP/1.1 20 OK\r\n\r\n"),
            BadResponse::Malformed(_)
        ));
        assert!(matches!(
            m(b"HTTP/2 200 OK\r\n\r\n"),
            BadResponse::Malformed(_)
        ));
        assert!(matches!(
            m(b"HTTP/1.1 200 OK\r\nX: y\r\n z\r\n\r\n"),
            BadResponse::Malformed(_)
        ));
        assert!(matches!(
            m(b"HTTP/1.1 200 OK\r\nX : y\r\n\r\n"),
            BadResponse::Malformed(_)
        ));
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for _ in 0..=MAX_FIELDS {
            many.extend_from_slice(b"X: y\r\n");
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(m(&many), BadResponse::TooLarge);
        let mut big = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        big.resize(MAX_HEAD + 10, b'a');
        assert_eq!(m(&big), BadResponse::TooLarge);
        assert!(matches!(
            parse_response(b"HTTP/1.1 200 OK\r\n", &http::Method::GET),
            Ok(Parsed::Partial)
        ));
        assert_eq!(get(b"HTTP/1.1 999 Odd\r\n\r\n").status, 999);
    }
}
