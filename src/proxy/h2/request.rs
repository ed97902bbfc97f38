//! A request's decoded fields made into its head (RFC 9113 §8.2, §8.3):
//! pseudo-fields first and each once, names lowercase, no field that only
//! means something to one HTTP/1 connection. A head that breaks these is
//! malformed: its stream is reset (PROTOCOL_ERROR), the connection goes on.
//! What baton refuses as a proxy (CONNECT, two Hosts, a Content-Length two
//! parties could read two ways) is judged after, with a status, as for
//! HTTP/1.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, Method, Request, Uri};

use super::hpack::Field;

/// Why a head is malformed.
pub type Malformed = &'static str;

/// Marks a head whose field list was larger than baton's bound: it is
/// made of the fields kept, and answered 431 as a request (counted, and
/// logged with its method and path), not forwarded.
#[derive(Debug, Clone, Copy)]
pub struct ListTooLarge;

/// A request head, and the body length its Content-Length states (which
/// its DATA frames must add up to, RFC 9113 §8.1.1).
pub struct RequestHead {
    pub parts: Parts,
    pub content_length: Option<u64>,
}

/// The head `fields` make.
pub fn head(fields: Vec<Field>) -> Result<RequestHead, Malformed> {
    let mut method = None;
    let mut scheme = None;
    let mut authority = None;
    let mut path = None;
    let mut headers = HeaderMap::with_capacity(fields.len());
    let mut content_length = None;
    for Field { name, value } in fields {
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !headers.is_empty() {
                return Err("pseudo-header field after a regular one");
            }
            let slot = match pseudo {
                b"method" => &mut method,
                b"scheme" => &mut scheme,
                b"authority" => &mut authority,
                b"path" => &mut path,
                _ => return Err("unknown pseudo-header field"),
            };
            if slot.replace(value).is_some() {
                return Err("repeated pseudo-header field");
            }
            continue;
        }
        let name = regular_name(&name)?;
        if name == http::header::CONTENT_LENGTH {
            content_length = Some(length(&value, content_length)?);
        }
        // Its value's case is no matter (RFC 9110 §10.1.4).
        if name == http::header::TE && !value.eq_ignore_ascii_case(b"trailers") {
            return Err("te other than trailers");
        }
        headers.append(name, field_value(value)?);
    }
    let method = method.ok_or("no :method")?;
    let method = Method::from_bytes(&method).map_err(|_| "invalid :method")?;
    // An `http` or `https` target has a host, in `:authority` or `Host`
    // (RFC 9113 §8.3.1), as an HTTP/1.1 request must send `Host`: without
    // either, the backend read baton's own name for it.
    let named = authority.is_some() || headers.contains_key(http::header::HOST);
    if matches!(scheme.as_deref(), Some(b"http" | b"https")) && !named {
        return Err("no :authority or host");
    }
    let uri = uri(&method, scheme, authority, path)?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    *request.version_mut() = http::Version::HTTP_2;
    let (parts, ()) = request.into_parts();
    Ok(RequestHead {
        parts,
        content_length,
    })
}

/// A trailer section's fields: regular ones only (RFC 9113 §8.1).
pub fn trailers(fields: Vec<Field>) -> Result<HeaderMap, Malformed> {
    let mut trailers = HeaderMap::with_capacity(fields.len());
    for Field { name, value } in fields {
        if name.starts_with(b":") {
            return Err("pseudo-header field in trailers");
        }
        trailers.append(regular_name(&name)?, field_value(value)?);
    }
    Ok(trailers)
}

/// A regular field's name: lowercase, a token, and none of those a
/// connection-specific HTTP/1 field (§8.2.2).
fn regular_name(name: &[u8]) -> Result<HeaderName, Malformed> {
    if name.iter().any(u8::is_ascii_uppercase) {
        return Err("uppercase field name");
    }
    match name {
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade" => {
            return Err("connection-specific field")
        }
        _ => {}
    }
    HeaderName::from_bytes(name).map_err(|_| "invalid field name")
}

/// A field's value: no NUL, CR, LF or other control byte but HTAB. Edge
/// whitespace (§8.2.1) is let through, as the `h2` crate did: an HTTP/1
/// backend trims it, and the fields baton routes on are judged after
/// (a `Host` of `app ` is a 400 there, with the reason).
fn field_value(value: Bytes) -> Result<HeaderValue, Malformed> {
    HeaderValue::from_maybe_shared(value).map_err(|_| "invalid field value")
}

/// A Content-Length's value (repeats must agree).
fn length(value: &[u8], before: Option<u64>) -> Result<u64, Malformed> {
    let digits = std::str::from_utf8(value).map_err(|_| "invalid content-length")?;
    let length: u64 = digits.parse().map_err(|_| "invalid content-length")?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) || before.is_some_and(|b| b != length) {
        return Err("invalid content-length");
    }
    Ok(length)
}

/// The target: CONNECT names an authority alone (§8.5), every other method
/// a scheme and a non-empty path.
fn uri(
    method: &Method,
    scheme: Option<Bytes>,
    authority: Option<Bytes>,
    path: Option<Bytes>,
) -> Result<Uri, Malformed> {
    let mut uri = Uri::builder();
    if method == Method::CONNECT {
        if scheme.is_some() || path.is_some() {
            return Err("CONNECT with :scheme or :path");
        }
        let authority = authority.ok_or("CONNECT without :authority")?;
        let authority =
            Authority::from_maybe_shared(authority).map_err(|_| "invalid :authority")?;
        return uri
            .authority(authority)
            .build()
            .map_err(|_| "invalid :authority");
    }
    let (Some(scheme), Some(path)) = (scheme, path) else {
        return Err("no :scheme or :path");
    };
    if path.is_empty() {
        return Err("empty :path");
    }
    // The `http` crate would cut the path at `#` unseen; refused instead,
    // as on HTTP/1 (see `h1::head::check_target`).
    if path.contains(&b'#') {
        return Err("fragment in :path");
    }
    // Without `:authority` (`Host` then names the host) the target is
    // origin-form: a URI has no scheme without an authority.
    if let Some(authority) = authority {
        let authority =
            Authority::from_maybe_shared(authority).map_err(|_| "invalid :authority")?;
        uri = uri.scheme(&scheme[..]).authority(authority);
    }
    let path = PathAndQuery::from_maybe_shared(path).map_err(|_| "invalid request target")?;
    uri.path_and_query(path)
        .build()
        .map_err(|_| "invalid request target")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(list: &[(&str, &str)]) -> Vec<Field> {
        list.iter()
            .map(|(n, v)| Field {
                name: Bytes::copy_from_slice(n.as_bytes()),
                value: Bytes::copy_from_slice(v.as_bytes()),
            })
            .collect()
    }

    const GET: [(&str, &str); 4] = [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "example.test"),
        (":path", "/a?b=c"),
    ];

    #[test]
    fn a_request_head_is_made() {
        let mut list = GET.to_vec();
        list.extend([
            ("content-length", "5"),
            ("cookie", "a=1"),
            ("cookie", "b=2"),
        ]);
        let head = head(fields(&list)).expect("valid");
        assert_eq!(head.parts.method, Method::GET);
        assert_eq!(head.parts.uri, "http://example.test/a?b=c");
        assert_eq!(head.parts.headers.get_all("cookie").iter().count(), 2);
        assert_eq!(head.content_length, Some(5));
        let connect = [(":method", "CONNECT"), (":authority", "example.test:443")];
        let connect = super::head(fields(&connect)).expect("valid CONNECT");
        assert_eq!(
            connect.parts.uri.authority().map(|a| a.as_str()),
            Some("example.test:443")
        );
    }

    #[test]
    fn malformed_heads_are_refused() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut list = GET.to_vec();
            list.extend_from_slice(extra);
            head(fields(&list)).err()
        };
        assert_eq!(with(&[("X-Upper", "v")]), Some("uppercase field name"));
        assert_eq!(
            with(&[("connection", "close")]),
            Some("connection-specific field")
        );
        assert_eq!(
            with(&[("transfer-encoding", "chunked")]),
            Some("connection-specific field")
        );
        assert_eq!(
            with(&[("x-a", "v"), (":path", "/")]),
            Some("pseudo-header field after a regular one")
        );
        assert_eq!(
            with(&[(":path", "/")]),
            Some("repeated pseudo-header field")
        );
        assert_eq!(
            with(&[(":protocol", "websocket")]),
            Some("unknown pseudo-header field")
        );
        assert_eq!(with(&[("x-a", "v\r\nx-b: w")]), Some("invalid field value"));
        assert_eq!(with(&[("te", "gzip")]), Some("te other than trailers"));
        assert!(with(&[("te", "trailers")]).is_none());
        assert!(with(&[("te", "Trailers")]).is_none());
        assert_eq!(
            with(&[("content-length", "5"), ("content-length", "6")]),
            Some("invalid content-length")
        );
        assert_eq!(
            with(&[("content-length", "+5")]),
            Some("invalid content-length")
        );
        let no_host = [(":method", "GET"), (":scheme", "https"), (":path", "/")];
        assert_eq!(head(fields(&no_host)).err(), Some("no :authority or host"));
        let host_alone = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            ("host", "example.test"),
        ];
        assert!(head(fields(&host_alone)).is_ok());
        let named = (":authority", "example.test");
        let no_path = [(":method", "GET"), (":scheme", "http"), named];
        assert_eq!(head(fields(&no_path)).err(), Some("no :scheme or :path"));
        let empty_path = [
            (":method", "GET"),
            (":scheme", "http"),
            named,
            (":path", ""),
        ];
        assert_eq!(head(fields(&empty_path)).err(), Some("empty :path"));
        let fragment = [
            (":method", "GET"),
            (":scheme", "http"),
            named,
            (":path", "/a.js#/x"),
        ];
        assert_eq!(head(fields(&fragment)).err(), Some("fragment in :path"));
        assert_eq!(
            trailers(fields(&[(":path", "/")])).err(),
            Some("pseudo-header field in trailers")
        );
        assert!(trailers(fields(&[("x-checksum", "abc")])).is_ok());
    }
}
