//! The names both paths rewrite heads by (`h1::rewrite` writes HTTP/1
//! clients' requests and h2 clients' alike, from each field's role):
//! hop-by-hop headers stay on their hop (RFC 9110 §7.6.1), forwarding
//! headers say where a request came from (per the listener's
//! `forwarded`); and `Via` on an h2 client's response.

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Fields that belong to one hop (RFC 9110 §7.6.1), for both paths.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
];

/// End-to-end headers a `Connection` header cannot strip: without them the
/// backend would read the request another way than baton did (RFC 9110
/// §7.6.1: a sender must not list them; if one does, they stay). Both the
/// h2 and the HTTP/1 path keep them.
pub const NOT_STRIPPABLE: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "authorization",
    "cookie",
];

/// What a client may say about where a request came from; `replace` drops
/// all of it (both paths): these, and every other `X-Forwarded-` field
/// ([`FORWARDED_PREFIX`]: `-Port`, `-Prefix`, `-Ssl`, `-Scheme`, which
/// Rack and Spring take to say https, or where the app is mounted).
pub const FORWARDING: &[&str] = &[
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
    "forwarded",
    "x-forwarded-client-cert",
    "front-end-https",
    // The client address as CDNs and other proxies write it, which
    // frameworks' "real IP" helpers read (Express's `trust proxy` list,
    // Django's and Rails' remote-IP middleware).
    "true-client-ip",
    "x-client-ip",
    "client-ip",
    "x-cluster-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
];

/// The start of every `X-Forwarded-` field's name.
pub const FORWARDED_PREFIX: &str = "x-forwarded-";

/// Fields baton frames or sets itself whose `_` spellings it drops (the
/// dashed ones it rewrites): a CGI-style backend would read
/// `X_Request_Id` as the request id baton set, a forged one.
pub const SET_BY_BATON: &[&str] = &["content-length", "transfer-encoding", "x-request-id"];

/// Whether `name` is `known` (lower case), also when spelled with `_` for
/// `-` (`X_Forwarded_For`): a CGI-style backend reads both as
/// `HTTP_X_FORWARDED_FOR`, so what drops one must drop the other (nginx
/// drops every name with an underscore by default).
pub fn names_alike(known: &str, name: &[u8]) -> bool {
    known.len() == name.len()
        && known
            .bytes()
            .zip(name)
            .all(|(k, &n)| k == n.to_ascii_lowercase() || (k == b'-' && n == b'_'))
}

/// Whether `name` is one of `FORWARDING` or an `X-Forwarded-` field, in
/// either spelling.
pub fn is_forwarding(name: &[u8]) -> bool {
    has_forwarded_prefix(name) || FORWARDING.iter().any(|known| names_alike(known, name))
}

/// Whether `name` is `X-Forwarded-` and more, in either spelling.
pub fn has_forwarded_prefix(name: &[u8]) -> bool {
    name.len() > FORWARDED_PREFIX.len()
        && name
            .get(..FORWARDED_PREFIX.len())
            .is_some_and(|start| names_alike(FORWARDED_PREFIX, start))
}

/// Whether `name` is the `_` spelling of one of `SET_BY_BATON`.
pub fn is_underscored_set_by_baton(name: &[u8]) -> bool {
    name.contains(&b'_') && SET_BY_BATON.iter().any(|known| names_alike(known, name))
}

/// The name an h2 client's id is looked for under, made once: a name
/// given as a string is parsed and checked each time it is used.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A client address as forwarding headers write it. An IPv4 address is
/// written digit by digit: through `fmt` it cost more than the rest of
/// accepting a connection's bookkeeping.
pub fn ip_text(ip: IpAddr) -> String {
    let IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut text = String::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}

/// Adds `Via`; `value` names the protocol of the message baton received
/// (RFC 9110 §7.6.3): "2.0 baton" on an h2 client's request, the backend's
/// version on its response.
pub fn add_via(headers: &mut HeaderMap, value: &'static str) {
    headers.append(http::header::VIA, HeaderValue::from_static(value));
}

/// `Date`, now, as an HTTP-date (RFC 9110 §5.6.7).
pub fn http_date_now() -> String {
    httpdate::fmt_http_date(std::time::SystemTime::now())
}

/// Adds `Date`, now, to a final response that has none: a proxy with a
/// clock adds one to a response it forwards without (RFC 9110 §6.6.1, a
/// MUST), as nginx does; baton's own answers carry one too (not the h2
/// connection's own 431, written below the exchange).
pub fn add_date_if_missing(headers: &mut HeaderMap) {
    if !headers.contains_key(http::header::DATE) {
        if let Ok(now) = HeaderValue::from_str(&http_date_now()) {
            headers.insert(http::header::DATE, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_forwarding;

    #[test]
    fn forwarding_names_count_in_either_spelling_and_only_whole() {
        assert!(is_forwarding(b"X_Forwarded_For"));
        assert!(is_forwarding(b"X-Forwarded-Scheme"));
        assert!(is_forwarding(b"x_real_ip"));
        assert!(!is_forwarding(b"x-forwarded-"));
        assert!(!is_forwarding(b"x_forwarded"));
        assert!(!is_forwarding(b"x-forwardedfor"));
    }

    #[test]
    fn addresses_are_written_as_std_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.100.255",
            "192.168.1.9",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:1.2.3.4",
        ] {
            let ip: std::net::IpAddr = ip.parse().expect("address");
            assert_eq!(super::ip_text(ip), ip.to_string());
        }
    }
}
