//! The heads baton writes, built from the parsed ones: each field the
//! other side sent is copied as its bytes or left out by its `Role`, and
//! baton's own fields (framing, forwarding, `Via`, `Connection`) are added,
//! so a head goes out in one buffer and one write.

use bytes::{BufMut, BytesMut};

use super::head::{Framing, RequestHead, ResponseHead, Role, Version};
use crate::config::Forwarded;
use crate::proxy::headers::{self, names_alike};

/// `Via` names the protocol of the message baton received (RFC 9110 §7.6.3).
fn via(received: Version) -> &'static [u8] {
    match received {
        Version::Http10 => b"via: 1.0 baton\r\n",
        Version::Http11 => b"via: 1.1 baton\r\n",
    }
}

/// What the request head to a backend needs besides the client's head.
pub struct Outbound<'a> {
    /// The client's address as text, written once per connection.
    pub client_ip: &'a str,
    /// The identity the client's TLS certificate proved, if any.
    pub client_cert: Option<&'a str>,
    /// The listener asks clients for certificates (`client_ca`): a
    /// client's own `X-Forwarded-Client-Cert` is forged, whatever
    /// `forwarded` says (see [`forwarding_kept`]).
    pub checks_client_certs: bool,
    pub forwarded: Forwarded,
    /// `http`, or `https` behind TLS: `X-Forwarded-Proto`.
    pub proto: &'static str,
    /// The backend's `host:port`, for a request that named no host (an
    /// HTTP/1.0 one, or an h2 one with neither `:authority` nor `Host`).
    pub backend_authority: &'a str,
    /// The exchange's id, sent as `X-Request-Id` (the client's own where
    /// the listener kept it).
    pub request_id: &'a [u8],
}

/// The request a backend gets: origin-form target, HTTP/1.1, the client's
/// end-to-end fields, then baton's.
pub fn request(head: &RequestHead, to: &Outbound<'_>, out: &mut BytesMut) {
    out.put_slice(head.method.as_str().as_bytes());
    out.put_u8(b' ');
    put_origin_form(&head.method, head.target(), out);
    out.put_slice(b" HTTP/1.1\r\n");
    let authority = head.target_authority();
    let mut earlier = Earlier::default();
    let mut has_host = false;
    for f in &head.fields {
        let (name, value) = (head.field_name(f), head.field_value(f));
        let keep = match f.role {
            // Written below, once, with the exchange's id.
            Role::EndToEnd => !name.eq_ignore_ascii_case(b"x-request-id"),
            // An empty Host (allowed in 1.0) is no Host for the backend.
            Role::Host if value.is_empty() => false,
            Role::Host => {
                has_host = true;
                authority.is_none()
            }
            Role::Framing | Role::HopByHop | Role::Expect => false,
            Role::Forwarding => forwarding_kept(to, name, value, &mut earlier),
        };
        if keep {
            put_field(name, value, out);
        }
    }
    put_own_fields(authority, has_host, to, &earlier, via(head.version), out);
    match head.framing {
        Framing::Length(n) => put_length(n, out),
        Framing::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        // A stated zero length is kept: some servers want one on a POST.
        Framing::Empty if head.values("content-length").next().is_some() => put_length(0, out),
        Framing::Empty | Framing::UntilClose => {}
    }
    // `TE` is hop-by-hop: whoever sends it lists it in `Connection` too
    // (RFC 9110 §10.1.4), so a backend that is a proxy does not pass it on.
    match (&head.upgrade, head.takes_trailers) {
        (Some(upgrade), te) => {
            out.put_slice(match te {
                true => b"connection: upgrade, te\r\n",
                false => b"connection: upgrade\r\n",
            });
            put_field(b"upgrade", &head.bytes[upgrade.clone()], out);
        }
        (None, true) => out.put_slice(b"connection: te\r\n"),
        (None, false) => {}
    }
    if head.takes_trailers {
        out.put_slice(b"te: trailers\r\n");
    }
    out.put_slice(b"\r\n");
}

/// What a trusted proxy before baton said of the request (`append`), for
/// baton's own forwarding fields: its `X-Forwarded-For` hops, and the
/// scheme its client used.
#[derive(Default)]
pub struct Earlier<'a> {
    pub chain: Vec<&'a [u8]>,
    /// Its `X-Forwarded-Proto` fields (`said_proto`): a load balancer that
    /// ends TLS and speaks plain HTTP to baton says `https`, which baton's
    /// own `http` hid, and every app behind that checks the scheme
    /// (Django's `SECURE_SSL_REDIRECT`, Rails' `force_ssl`) redirected to
    /// https forever. HAProxy and nginx leave it as it came.
    pub protos: Vec<&'a [u8]>,
}

impl Earlier<'_> {
    /// The scheme the proxy before a plain listener said: the last value
    /// of its fields that is not empty (the hop nearest baton, which it
    /// trusts, as the last hops of `X-Forwarded-For`; empty list elements
    /// are none, RFC 9110 §5.6.1), when `http` or `https`. A TLS
    /// listener's is `https` whatever is said: its client's bytes were
    /// encrypted to baton, and an `http` there would only send an app's
    /// redirect to https round (one a cache in front could keep for all).
    fn said_proto(&self, listener: &'static str) -> &'static str {
        if listener == "https" {
            return listener;
        }
        self.protos
            .iter()
            .rev()
            .flat_map(|field| field.rsplit(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .find(|value| !value.is_empty())
            .and_then(scheme)
            .unwrap_or(listener)
    }
}

/// Whether a client's forwarding field (`Role::Forwarding`) goes on to the
/// backend as it came, per the listener's `forwarded`: all under `off`,
/// none under `replace`; under `append` the client's `X-Forwarded-For`
/// values are gathered in `earlier` (baton writes them as one line, its
/// own hop last), and so are its `X-Forwarded-Proto` fields (whose scheme
/// baton's own line says, `Earlier::said_proto`); the `_` spellings of the fields baton writes, with the
/// certificate identity only its own handshake can prove, are dropped,
/// not passed on; so is every other field that says the scheme
/// ([`SCHEME_FIELDS`]), which the one `X-Forwarded-Proto` says: left in, a
/// client's `X-Forwarded-Ssl: on` or `Forwarded: proto=https` beside it
/// made Rack take a plain request for https (`Forwarded`, which baton does
/// not extend with its own hop, would also give a chain without the peer
/// baton saw). One rule for both paths: h2 clients' fields go through it
/// too (`relay::upload`). On a listener that checks client certificates
/// a client's `X-Forwarded-Client-Cert` is dropped under `off` too: only
/// baton's handshake with that very client could prove one, and nothing in
/// front of a TLS listener can add a field to what the client encrypted,
/// so the field is the client's own claim (Envoy sanitizes it by default).
pub fn forwarding_kept<'a>(
    to: &Outbound<'_>,
    name: &[u8],
    value: &'a [u8],
    earlier: &mut Earlier<'a>,
) -> bool {
    match to.forwarded {
        Forwarded::Off => !(to.checks_client_certs && names_alike("x-forwarded-client-cert", name)),
        Forwarded::Replace => false,
        Forwarded::Append => {
            if name.eq_ignore_ascii_case(b"x-forwarded-for") {
                earlier.chain.push(value);
                false
            } else if name.eq_ignore_ascii_case(b"x-forwarded-proto") {
                earlier.protos.push(value);
                false
            } else {
                !names_alike("x-forwarded-for", name)
                    && !names_alike("x-forwarded-proto", name)
                    && !names_alike("x-forwarded-client-cert", name)
                    && !SCHEME_FIELDS.iter().any(|f| names_alike(f, name))
            }
        }
    }
}

/// A forwarded scheme baton passes on: `http` or `https`, in any case.
fn scheme(value: &[u8]) -> Option<&'static str> {
    let value = value.trim_ascii();
    if value.eq_ignore_ascii_case(b"https") {
        Some("https")
    } else if value.eq_ignore_ascii_case(b"http") {
        Some("http")
    } else {
        None
    }
}

/// Fields besides `X-Forwarded-Proto` that backends read the scheme from
/// (Rack, Spring, gunicorn, IIS).
const SCHEME_FIELDS: [&str; 5] = [
    "forwarded",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-forwarded-protocol",
    "front-end-https",
];

/// The target as a backend takes it: an absolute-form target loses its
/// scheme and authority (they went to `Host`). With neither path nor query
/// left, an OPTIONS asks about the server (RFC 9112 §3.2.4: the last proxy
/// sends `*`), anything else about `/`.
fn put_origin_form(method: &http::Method, target: &[u8], out: &mut BytesMut) {
    if target.starts_with(b"/") || target == b"*" {
        out.put_slice(target);
        return;
    }
    let after_scheme = target
        .windows(3)
        .position(|w| w == b"://")
        .map_or(target, |i| &target[i + 3..]);
    let rest = after_scheme
        .iter()
        .position(|b| *b == b'/' || *b == b'?')
        .map_or(&b""[..], |i| &after_scheme[i..]);
    if rest.is_empty() && method == http::Method::OPTIONS {
        out.put_u8(b'*');
        return;
    }
    if !rest.starts_with(b"/") {
        out.put_u8(b'/');
    }
    out.put_slice(rest);
}

/// What baton writes into every request it sends a backend, after the
/// client's own fields, whichever protocol the client spoke: `Host` (the
/// target's `authority` where it named one, else the backend's unless the
/// client's was kept), the forwarding fields (with what a proxy before
/// baton said, `earlier`), `X-Request-Id` and `via`.
pub fn put_own_fields(
    authority: Option<&[u8]>,
    has_host: bool,
    to: &Outbound<'_>,
    earlier: &Earlier<'_>,
    via: &[u8],
    out: &mut BytesMut,
) {
    match authority {
        Some(a) => put_field(b"host", a, out),
        None if !has_host => put_field(b"host", to.backend_authority.as_bytes(), out),
        None => {}
    }
    put_forwarding(to, earlier, out);
    put_field(b"x-request-id", to.request_id, out);
    out.put_slice(via);
}

/// `X-Forwarded-For` (the `earlier` hops, then the client), `-Proto` (as
/// `Earlier::said_proto` has it) and `-Client-Cert`, unless the
/// listener's `forwarded` is `off`.
fn put_forwarding(to: &Outbound<'_>, earlier: &Earlier<'_>, out: &mut BytesMut) {
    if to.forwarded == Forwarded::Off {
        return;
    }
    out.put_slice(b"x-forwarded-for: ");
    for hop in earlier
        .chain
        .iter()
        .flat_map(|v| v.split(|b| *b == b','))
        .map(|v| v.trim_ascii())
        .filter(|v| !v.is_empty())
    {
        out.put_slice(hop);
        out.put_slice(b", ");
    }
    out.put_slice(to.client_ip.as_bytes());
    out.put_slice(b"\r\nx-forwarded-proto: ");
    out.put_slice(earlier.said_proto(to.proto).as_bytes());
    out.put_slice(b"\r\n");
    if let Some(identity) = to.client_cert {
        put_field(b"x-forwarded-client-cert", identity.as_bytes(), out);
    }
}

/// How a response's body goes to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// No body, or exactly the backend's `Content-Length`.
    AsIs,
    /// Re-chunked for a 1.1 client (chunked or close-delimited upstream).
    Chunked,
    /// Close-delimited: a 1.0 client, which cannot take chunked.
    UntilClose,
}

/// How the client's response is framed, given the backend's framing.
pub fn delivery(framing: Framing, client: Version) -> Delivery {
    match (framing, client) {
        (Framing::Empty | Framing::Length(_), _) => Delivery::AsIs,
        (Framing::Chunked | Framing::UntilClose, Version::Http11) => Delivery::Chunked,
        (Framing::Chunked | Framing::UntilClose, Version::Http10) => Delivery::UntilClose,
    }
}

/// What the client's response head says about its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing: 1.1's default, the connection stays.
    Stays,
    /// `Connection: keep-alive` (a 1.0 client that asked for it).
    KeepAlive,
    /// `Connection: close`.
    Closes,
}

/// The response a client gets: the backend's status and end-to-end fields,
/// baton's `Via`, framing and `Connection`, and a `Date` if it had none.
/// A 1xx or 101 keeps its own.
pub fn response(
    head: &ResponseHead,
    request: &RequestHead,
    delivery: Delivery,
    persistence: Persistence,
    out: &mut BytesMut,
) {
    put_status_line(head.status, &head.bytes[head.reason.clone()], out);
    // A HEAD or 304 answer's length describes the body it does not carry.
    let length_kept = request.method == http::Method::HEAD || head.status == 304;
    let mut length_written = false;
    // Codings other than chunked stay on the body: they go on, with
    // baton's own chunked last.
    let mut codings: Option<Vec<u8>> = None;
    let mut dated = false;
    for f in &head.fields {
        let (name, value) = (head.field_name(f), head.field_value(f));
        let keep = match f.role {
            Role::Framing if name.eq_ignore_ascii_case(b"content-length") => {
                let kept = length_kept && !length_written;
                length_written |= kept;
                kept
            }
            // Codings split over several fields apply in their order.
            Role::Framing => {
                if delivery == Delivery::Chunked {
                    if let Some(more) = other_codings(value) {
                        match codings.as_mut() {
                            Some(gathered) => {
                                gathered.extend_from_slice(b", ");
                                gathered.extend_from_slice(&more);
                            }
                            None => codings = Some(more),
                        }
                    }
                }
                false
            }
            Role::HopByHop => false,
            _ => true,
        };
        if keep {
            // Not one `Connection` named, which stays on its hop.
            dated |= name.eq_ignore_ascii_case(b"date");
            put_field(name, value, out);
        }
    }
    out.put_slice(via(head.version));
    if head.status == 101 {
        out.put_slice(b"connection: upgrade\r\n");
        if let Some(upgrade) = head.values("upgrade").next() {
            put_field(b"upgrade", upgrade, out);
        }
        out.put_slice(b"\r\n");
        return;
    }
    // A proxy with a clock dates a response that came without (RFC 9110
    // §6.6.1, a MUST), as nginx does.
    if !dated {
        put_date(out);
    }
    let bodiless_by_rule = request.method == http::Method::HEAD
        || head.status == 204
        || head.status == 304
        || head.status < 200;
    match (delivery, head.framing) {
        (Delivery::AsIs, Framing::Length(n)) => put_length(n, out),
        // Without a length, an empty body would run until the close.
        (Delivery::AsIs, Framing::Empty) if !bodiless_by_rule => put_length(0, out),
        (Delivery::Chunked, _) => {
            out.put_slice(b"transfer-encoding: ");
            if let Some(other) = &codings {
                out.put_slice(other);
                out.put_slice(b", ");
            }
            out.put_slice(b"chunked\r\n");
        }
        _ => {}
    }
    match persistence {
        Persistence::Stays => {}
        Persistence::KeepAlive => out.put_slice(b"connection: keep-alive\r\n"),
        Persistence::Closes => out.put_slice(b"connection: close\r\n"),
    }
    out.put_slice(b"\r\n");
}

/// The codings of a `Transfer-Encoding` value other than `chunked`
/// (`gzip, chunked` → `gzip`), if any.
fn other_codings(value: &[u8]) -> Option<Vec<u8>> {
    let other: Vec<&[u8]> = value
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"chunked"))
        .collect();
    (!other.is_empty()).then(|| other.join(&b", "[..]))
}

/// An interim (1xx) response as the backend sent it, minus hop-by-hop
/// and framing fields (it has no body).
pub fn interim(head: &ResponseHead, out: &mut BytesMut) {
    put_status_line(head.status, &head.bytes[head.reason.clone()], out);
    for f in head.fields.iter().filter(|f| f.role.kept_in_interim()) {
        put_field(head.field_name(f), head.field_value(f), out);
    }
    out.put_slice(via(head.version));
    out.put_slice(b"\r\n");
}

/// An answer of baton's own: a short text body saying the status and, for
/// an error, the request id (never a backend's name or address). A HEAD
/// request gets the head alone. Returns the head's length (the access
/// log's combined format counts the body alone).
pub fn own_answer(
    status: http::StatusCode,
    body: &str,
    request: Option<&RequestHead>,
    closes: bool,
    out: &mut BytesMut,
) -> usize {
    let start = out.len();
    let reason = status.canonical_reason().unwrap_or("Error");
    put_status_line(status.as_u16(), reason.as_bytes(), out);
    out.put_slice(b"content-type: text/plain; charset=utf-8\r\n");
    put_date(out);
    out.put_slice(via(request.map_or(Version::Http11, |r| r.version)));
    put_length(body.len() as u64, out);
    if closes {
        out.put_slice(b"connection: close\r\n");
    } else if request.is_some_and(|r| r.version == Version::Http10) {
        // Kept, so it asked for that: a 1.0 client takes a connection
        // for closed unless the answer says otherwise, as a proxied
        // answer's head does (`Persistence::KeepAlive`).
        out.put_slice(b"connection: keep-alive\r\n");
    }
    out.put_slice(b"\r\n");
    let head = out.len() - start;
    if request.is_none_or(|r| r.method != http::Method::HEAD) {
        out.put_slice(body.as_bytes());
    }
    head
}

/// `Date`, now: a server with a clock sends one in its answers (RFC 9110
/// §6.6.1, a MUST for 4xx), as nginx's own answers do.
fn put_date(out: &mut BytesMut) {
    out.put_slice(b"date: ");
    out.put_slice(headers::http_date_now().as_bytes());
    out.put_slice(b"\r\n");
}

fn put_status_line(status: u16, reason: &[u8], out: &mut BytesMut) {
    out.put_slice(b"HTTP/1.1 ");
    put_decimal(u64::from(status), out);
    out.put_u8(b' ');
    out.put_slice(reason);
    out.put_slice(b"\r\n");
}

/// One `name: value` line (the HTTP/1 heads baton writes, both paths).
pub fn put_field(name: &[u8], value: &[u8], out: &mut BytesMut) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

fn put_length(n: u64, out: &mut BytesMut) {
    out.put_slice(b"content-length: ");
    put_decimal(n, out);
    out.put_slice(b"\r\n");
}

/// `n` in decimal, by hand: a status line and a length are written per
/// exchange, and `write!`'s formatting machinery cost some 650
/// instructions an exchange (callgrind).
fn put_decimal(n: u64, out: &mut BytesMut) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0, 7, 10, 204, 1_000_000, u64::MAX] {
            let mut out = BytesMut::new();
            put_decimal(n, &mut out);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }

    fn origin(target: &str) -> String {
        origin_for(&http::Method::GET, target)
    }

    fn origin_for(method: &http::Method, target: &str) -> String {
        let mut out = BytesMut::new();
        put_origin_form(method, target.as_bytes(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn an_absolute_target_becomes_origin_form() {
        assert_eq!(origin("/a?b"), "/a?b");
        assert_eq!(origin("*"), "*");
        assert_eq!(origin("http://example.com/x/y?z=1"), "/x/y?z=1");
        assert_eq!(origin("http://example.com"), "/");
        assert_eq!(origin("http://example.com?q"), "/?q");
        let options = http::Method::OPTIONS;
        assert_eq!(origin_for(&options, "http://example.com:8001"), "*");
        assert_eq!(origin_for(&options, "http://example.com?q"), "/?q");
        assert_eq!(origin_for(&options, "http://example.com/"), "/");
        assert_eq!(origin_for(&options, "*"), "*");
    }

    fn client_head(head: &str, request: &str) -> String {
        let Ok(super::super::head::Parsed::Complete(req)) =
            super::super::head::parse_request(request.as_bytes())
        else {
            panic!("request parses");
        };
        let Ok(super::super::head::Parsed::Complete(res)) =
            super::super::head::parse_response(head.as_bytes(), &req.method)
        else {
            panic!("response parses");
        };
        let mut out = BytesMut::new();
        let how = delivery(res.framing, req.version);
        response(&res, &req, how, Persistence::Stays, &mut out);
        String::from_utf8_lossy(&out).to_ascii_lowercase()
    }

    /// The head a backend gets for `request`.
    fn backend_head(request: &str) -> String {
        let Ok(super::super::head::Parsed::Complete(req)) =
            super::super::head::parse_request(request.as_bytes())
        else {
            panic!("request parses");
        };
        let to = Outbound {
            client_ip: "127.0.0.1",
            client_cert: None,
            checks_client_certs: false,
            forwarded: Forwarded::Replace,
            proto: "http",
            backend_authority: "10.0.0.9:8080",
            request_id: b"id-1",
        };
        let mut out = BytesMut::new();
        super::request(&req, &to, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `TE`, hop-by-hop, goes up listed in `Connection` too (RFC 9110
    /// §10.1.4), beside an upgrade's `upgrade` when there is one.
    #[test]
    fn te_goes_up_named_in_connection() {
        let plain = backend_head("GET / HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n");
        assert!(
            plain.contains("\r\nconnection: te\r\nte: trailers\r\n"),
            "{plain}"
        );
        let upgrade = backend_head(
            "GET / HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        );
        assert!(
            upgrade.contains("\r\nconnection: upgrade, te\r\n"),
            "{upgrade}"
        );
        let none = backend_head("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(!none.contains("connection:"), "{none}");
    }

    #[test]
    fn codings_other_than_chunked_stay_named_with_chunked_last() {
        let get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let until_close = client_head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", get);
        assert!(
            until_close.contains("transfer-encoding: gzip, chunked\r\n"),
            "{until_close}"
        );
        let both = client_head(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            get,
        );
        assert!(
            both.contains("transfer-encoding: gzip, chunked\r\n"),
            "{both}"
        );
        let split = client_head(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: br, chunked\r\n\r\n",
            get,
        );
        assert!(
            split.contains("transfer-encoding: gzip, br, chunked\r\n"),
            "every field's codings, in order: {split}"
        );
        let plain = client_head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", get);
        assert_eq!(plain.matches("transfer-encoding").count(), 1, "{plain}");
        assert!(plain.contains("transfer-encoding: chunked\r\n"), "{plain}");
    }

    #[test]
    fn an_empty_body_says_its_length_unless_it_has_none_by_rule() {
        let get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let redirect = client_head("HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n", get);
        assert!(redirect.contains("content-length: 0\r\n"), "{redirect}");
        let no_content = client_head("HTTP/1.1 204 No Content\r\n\r\n", get);
        assert!(!no_content.contains("content-length"), "{no_content}");
    }

    #[test]
    fn a_client_body_is_delivered_as_the_client_can_take_it() {
        assert_eq!(
            delivery(Framing::Length(3), Version::Http10),
            Delivery::AsIs
        );
        assert_eq!(
            delivery(Framing::UntilClose, Version::Http11),
            Delivery::Chunked
        );
        assert_eq!(
            delivery(Framing::Chunked, Version::Http10),
            Delivery::UntilClose
        );
    }
}
