//! Header rewriting between an h2 client and a backend (hyper's path; the
//! HTTP/1 path rewrites its heads in `h1::rewrite`): hop-by-hop headers
//! stay on their hop (RFC 9110 §7.6.1), forwarding headers say where a
//! request came from (per the listener's `forwarded`).

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, TE};

use crate::config::Forwarded;

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

/// The `Host` a backend gets: an absolute-form target's authority wins over
/// whatever `Host` the client sent (RFC 9112 §3.2.2), since routing used it.
pub fn host_from_target(headers: &mut HeaderMap, uri: &http::Uri) {
    // Without user information: routing looked at the host alone.
    let host = |a: &http::uri::Authority| {
        let text = a.as_str();
        HeaderValue::from_str(text.rsplit('@').next().unwrap_or(text)).ok()
    };
    if let Some(authority) = uri.authority().and_then(host) {
        headers.insert(HOST, authority);
    }
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes hop-by-hop headers, those named in `Connection` included. `Trailer` is
/// end-to-end (RFC 9110 §6.6.2), and a peer that takes trailers says so to
/// the next hop too (`TE: trailers`, the one TE a proxy passes on), so
/// trailers travel both ways.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let takes_trailers = headers
        .get_all(TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .filter(|n| !NOT_STRIPPABLE.contains(&n.as_str()))
        .collect();
    for name in named {
        headers.remove(name);
    }
    remove_any(headers, HOP_BY_HOP);
    if takes_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// Names set on every request, made once: a name given as a string is
/// parsed and checked each time it is used.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const X_FORWARDED_CLIENT_CERT: HeaderName = HeaderName::from_static("x-forwarded-client-cert");
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Drops every field `matches` names (a look first: most requests have none).
fn remove_matching(headers: &mut HeaderMap, matches: impl Fn(&[u8]) -> bool) {
    if headers.keys().any(|k| matches(k.as_str().as_bytes())) {
        let named: Vec<HeaderName> = headers
            .keys()
            .filter(|k| matches(k.as_str().as_bytes()))
            .cloned()
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
}

/// Removes the fields `names` lists. Most requests carry none of them, and
/// a `remove` parses and hashes its name each time, so the names present
/// are looked for first, in one pass.
fn remove_any(headers: &mut HeaderMap, names: &[&str]) {
    if headers.keys().any(|k| names.contains(&k.as_str())) {
        for name in names {
            headers.remove(*name);
        }
    }
}

/// A client address as a header value.
pub fn ip_value(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip_text(ip)).unwrap_or(HeaderValue::from_static("unknown"))
}

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

/// Sets `X-Forwarded-For` and `X-Forwarded-Proto` (`proto`: http or
/// https) as `mode` says, and `X-Forwarded-Client-Cert` to `client_cert`
/// (the identity the client's certificate proved, if any) unless `off`,
/// and adds `Via`.
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client: &HeaderValue,
    client_cert: Option<&HeaderValue>,
    mode: Forwarded,
    proto: &'static str,
) {
    let xff = X_FORWARDED_FOR;
    remove_matching(headers, is_underscored_set_by_baton);
    match mode {
        Forwarded::Off => {}
        Forwarded::Replace => {
            remove_matching(headers, is_forwarding);
            headers.insert(xff, client.clone());
        }
        Forwarded::Append => {
            // `_` spellings of the two fields baton writes: not chained.
            // Nor is a client's certificate identity: only the listener's
            // handshake can prove one.
            remove_matching(headers, |name| {
                names_alike(X_FORWARDED_CLIENT_CERT.as_str(), name)
                    || (name.contains(&b'_')
                        && ["x-forwarded-for", "x-forwarded-proto"]
                            .iter()
                            .any(|known| names_alike(known, name)))
            });
            // Element by element, bytes as sent: as the HTTP/1 path joins.
            let mut chain = Vec::new();
            let hops = headers
                .get_all(&xff)
                .iter()
                .flat_map(|v| v.as_bytes().split(|b| *b == b','))
                .map(<[u8]>::trim_ascii)
                .filter(|v| !v.is_empty());
            for hop in hops {
                chain.extend_from_slice(hop);
                chain.extend_from_slice(b", ");
            }
            chain.extend_from_slice(client.as_bytes());
            let joined = HeaderValue::from_bytes(&chain).unwrap_or_else(|_| client.clone());
            headers.insert(xff, joined);
        }
    }
    if mode != Forwarded::Off {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
        if let Some(identity) = client_cert {
            headers.insert(X_FORWARDED_CLIENT_CERT, identity.clone());
        }
    }
    add_via(headers, "2.0 baton");
}

/// Adds `Via`; `value` names the protocol of the message baton received
/// (RFC 9110 §7.6.3): "2.0 baton" on an h2 client's request, the backend's
/// version on its response.
pub fn add_via(headers: &mut HeaderMap, value: &'static str) {
    headers.append(http::header::VIA, HeaderValue::from_static(value));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    fn peer() -> HeaderValue {
        ip_value("127.0.0.1".parse().expect("ip"))
    }

    #[test]
    fn append_joins_every_line_then_the_peer() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.append(
            "x-forwarded-for",
            HeaderValue::from_static("10.0.0.2, 10.0.0.3"),
        );
        add_forwarding(&mut h, &peer(), None, Forwarded::Append, "http");
        assert_eq!(
            h.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"[..])
        );
    }

    #[test]
    fn append_drops_empty_elements_and_keeps_bytes_as_sent() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("a,, b ,"));
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"c\xe9").expect("obs-text"),
        );
        add_forwarding(&mut h, &peer(), None, Forwarded::Append, "http");
        assert_eq!(
            h.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"a, b, c\xe9, 127.0.0.1"[..])
        );
    }

    #[test]
    fn replace_trusts_nothing_the_client_sent() {
        let mut h = HeaderMap::new();
        for name in FORWARDING {
            h.insert(*name, HeaderValue::from_static("6.6.6.6"));
        }
        add_forwarding(&mut h, &peer(), None, Forwarded::Replace, "http");
        assert_eq!(h.get("x-forwarded-for"), Some(&peer()));
        assert_eq!(
            h.get("x-forwarded-proto").map(|v| v.as_bytes()),
            Some(&b"http"[..])
        );
        for name in ["x-forwarded-host", "x-real-ip", "forwarded"] {
            assert!(!h.contains_key(name), "{name}");
        }
        let mut h = HeaderMap::new();
        for name in ["x-forwarded-port", "x-forwarded-ssl", "x_forwarded_prefix"] {
            h.insert(name, HeaderValue::from_static("443"));
        }
        add_forwarding(&mut h, &peer(), None, Forwarded::Replace, "http");
        assert_eq!(h.len(), 3, "only baton's own: {h:?}");
    }

    #[test]
    fn replace_drops_underscore_spellings_too() {
        let mut h = HeaderMap::new();
        for name in ["x_forwarded_for", "x_real_ip", "x-forwarded_proto"] {
            h.insert(name, HeaderValue::from_static("6.6.6.6"));
        }
        h.insert("x_other", HeaderValue::from_static("kept"));
        add_forwarding(&mut h, &peer(), None, Forwarded::Replace, "http");
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["via", "x-forwarded-for", "x-forwarded-proto", "x_other"]
        );
        assert!(is_forwarding(b"X_Forwarded_For"));
        assert!(is_forwarding(b"X-Forwarded-Scheme"));
        assert!(!is_forwarding(b"x-forwarded-"));
        assert!(!is_forwarding(b"x_forwarded"));
        assert!(!is_forwarding(b"x-forwardedfor"));
    }

    #[test]
    fn connection_cannot_strip_host() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("host, x-gone"));
        h.insert(HOST, HeaderValue::from_static("app"));
        h.insert("x-gone", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert!(h.contains_key(HOST));
        assert!(!h.contains_key("x-gone"));
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
