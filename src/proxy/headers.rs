//! Header rewriting between client and backend: hop-by-hop headers stay on
//! their hop (RFC 9110 §7.6.1), forwarding headers say where a request came
//! from, and an upgrade keeps the two headers that make it one.

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, UPGRADE};

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// True for an HTTP/1.1 upgrade request (`Connection: upgrade` + `Upgrade`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
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

/// Removes hop-by-hop headers, those named in `Connection` included; an
/// upgrade keeps `Connection: upgrade` and its `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let upgrade = if keep_upgrade {
        headers.get(UPGRADE).cloned()
    } else {
        None
    };
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
    if let Some(upgrade) = upgrade {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, upgrade);
    }
}

/// A client address as a header value.
pub fn ip_value(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip.to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

/// Adds `X-Forwarded-For` (appended), `X-Forwarded-Proto` and `Via`.
pub fn add_forwarding(headers: &mut HeaderMap, client: &HeaderValue) {
    let xff = HeaderName::from_static("x-forwarded-for");
    match headers.get(&xff).and_then(|v| v.to_str().ok()) {
        Some(prior) => {
            let client = client.to_str().unwrap_or("unknown");
            if let Ok(v) = HeaderValue::from_str(&format!("{prior}, {client}")) {
                headers.insert(xff, v);
            }
        }
        None => {
            headers.insert(xff, client.clone());
        }
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
    add_via(headers);
}

pub fn add_via(headers: &mut HeaderMap) {
    headers.append(http::header::VIA, HeaderValue::from_static("1.1 baton"));
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
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn an_upgrade_keeps_its_headers() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(
            h.get(UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            h.get(CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
    }

    #[test]
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        add_forwarding(&mut h, &ip_value("127.0.0.1".parse().expect("ip")));
        assert_eq!(
            h.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"10.0.0.1, 127.0.0.1"[..])
        );
    }
}
