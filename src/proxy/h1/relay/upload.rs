//! The request direction of a relayed exchange: the HTTP/1 head written
//! from the request's parts, the client's body framed as it comes (its
//! next frame asked for only once the last is written: backpressure), and
//! how long the backend has taken no bytes.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::Method;
use http_body::{Body, Frame};
use tokio::io::AsyncWrite;
use tokio::time::Instant;

use super::super::chunked;
use super::super::head::{self, Role};
use super::super::rewrite::{self, put_field, Outbound};
use crate::backend::stream::BackendStream;
use crate::proxy::body::ProxyBody;
use crate::proxy::clock::SharedInstant;

/// How a request body goes up.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum UpFraming {
    /// No body (and the method needs no length said).
    None,
    /// As the client's `Content-Length` says (h2 holds the client to it),
    /// or `Content-Length: 0` for a bodiless method that takes a body.
    Length,
    /// Chunked: the length is not known in advance.
    Chunked,
}

pub(super) fn request_framing(parts: &Parts, body: &ProxyBody) -> UpFraming {
    let has_length = parts.headers.contains_key(CONTENT_LENGTH);
    if has_length {
        return UpFraming::Length;
    }
    if !body.is_end_stream() {
        return UpFraming::Chunked;
    }
    // A POST with no body still says so, as HTTP/1 clients do: some
    // servers refuse one without a length (411).
    let takes_body = [Method::POST, Method::PUT, Method::PATCH].contains(&parts.method);
    if takes_body {
        UpFraming::Length
    } else {
        UpFraming::None
    }
}

/// `METHOD origin-form HTTP/1.1`, the client's fields, baton's, and the
/// framing: the fields keep or lose the same roles (`head::fixed_role`)
/// as an HTTP/1 client's do in `rewrite::request`, and baton adds the same
/// ones (`rewrite::put_own_fields`), all written straight from the
/// request's parts (rewriting its `HeaderMap` first hashed each name inserted,
/// removed or looked for: a twentieth of an h2 request's instructions). No
/// client field is named by a `Connection` token: h2 carries no
/// connection-specific field (`h2::request` refuses a request with one, and
/// `TE` other than `trailers`; RFC 9113 §8.2.2); baton's own `TE` goes up
/// named in `connection: te`.
///
/// h2 may split `Cookie` into many fields: HTTP/1 gets them joined in one
/// line (RFC 9113 §8.2.3). `Host` is the request's `:authority` where it
/// has one (without user information: routing looked at the host alone),
/// else its `Host`, else the backend's, as HTTP/1.1 needs one. `Expect`
/// stays here: the body was asked for already (baton sent the client its
/// 100 (Continue) as it read the body's first frame).
pub(super) fn request_head(
    parts: &Parts,
    to: &Outbound<'_>,
    framing: UpFraming,
    out: &mut BytesMut,
) {
    out.put_slice(parts.method.as_str().as_bytes());
    out.put_u8(b' ');
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority().map(|a| {
        let text = a.as_str();
        text.rsplit('@').next().unwrap_or(text)
    });
    let mut earlier = rewrite::Earlier::default();
    let mut cookies: Vec<&[u8]> = Vec::new();
    let (mut has_host, mut has_length, mut takes_trailers) = (false, false, false);
    for (name, value) in &parts.headers {
        // h2's names are lower case.
        let (name, value) = (name.as_str().as_bytes(), value.as_bytes());
        let keep = match head::fixed_role(name) {
            Role::EndToEnd if name == b"cookie" => {
                cookies.push(value);
                false
            }
            // Written below, once, with the exchange's id.
            Role::EndToEnd => name != b"x-request-id",
            Role::Host => {
                has_host = true;
                authority.is_none()
            }
            // The client's own length, which h2 holds it to.
            Role::Framing => {
                let length = name == b"content-length";
                has_length |= length;
                length
            }
            Role::HopByHop => {
                takes_trailers |= name == b"te";
                false
            }
            Role::Expect => false,
            Role::Forwarding => rewrite::forwarding_kept(to, name, value, &mut earlier),
        };
        if keep {
            put_field(name, value, out);
        }
    }
    if !cookies.is_empty() {
        out.put_slice(b"cookie: ");
        for (i, cookie) in cookies.iter().enumerate() {
            if i > 0 {
                out.put_slice(b"; ");
            }
            out.put_slice(cookie);
        }
        out.put_slice(b"\r\n");
    }
    let authority = authority.map(str::as_bytes);
    rewrite::put_own_fields(
        authority,
        has_host,
        to,
        &earlier,
        b"via: 2.0 baton\r\n",
        out,
    );
    match framing {
        UpFraming::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
        UpFraming::Length if !has_length => out.put_slice(b"content-length: 0\r\n"),
        UpFraming::Length | UpFraming::None => {}
    }
    // A peer that takes trailers says so to the next hop too: trailers
    // travel both ways (`TE: trailers`, the one TE a proxy passes on), in
    // `Connection` too, as a hop-by-hop field is (RFC 9110 §10.1.4).
    if takes_trailers {
        out.put_slice(b"connection: te\r\nte: trailers\r\n");
    }
    out.put_slice(b"\r\n");
}

/// Whether the upload waits for the backend to take bytes, and since when;
/// and when it last stopped waiting. While it waits, the client's body is
/// not read (backpressure), so a client that sends nothing then is not the
/// one stalling: the exchange's watch charges the backend instead, and
/// counts the client's pause only from when the backend took bytes again
/// (and its pace, `body_min_rate`, over the time it was not waited on).
pub struct BackendWait {
    start: Instant,
    /// Since when it waits (unset while it does not).
    since: SharedInstant,
    /// When it last stopped waiting (the start if never).
    last_moved: SharedInstant,
    /// Nanoseconds of the waits that ended.
    waited: AtomicU64,
}

impl BackendWait {
    pub(super) fn new() -> BackendWait {
        let start = Instant::now();
        BackendWait {
            start,
            since: SharedInstant::unset(start),
            last_moved: SharedInstant::at(start),
            waited: AtomicU64::new(0),
        }
    }

    /// Notes what a write or flush to the backend did, and passes it on.
    fn note<T>(&self, polled: Poll<T>) -> Poll<T> {
        match polled {
            Poll::Pending => self.since.set_now_if_unset(),
            Poll::Ready(_) => {
                if let Some(since) = self.since.take() {
                    self.last_moved.set_now();
                    let waited = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.waited.fetch_add(waited, Ordering::Relaxed);
                }
            }
        }
        polled
    }

    /// How long the backend has taken no bytes, if it is being waited on.
    pub fn waiting_for(&self) -> Option<Duration> {
        self.since.get().map(|since| since.elapsed())
    }

    /// When the backend last took bytes after a wait (the start if never).
    pub fn last_moved(&self) -> Instant {
        self.last_moved.get().unwrap_or_else(Instant::now)
    }

    /// The time since the upload began that it did not wait on the
    /// backend: the client's own, which its pace is counted over.
    pub fn clients_time(&self) -> Duration {
        let ended = Duration::from_nanos(self.waited.load(Ordering::Relaxed));
        let current = self.waiting_for().unwrap_or_default();
        self.start.elapsed().saturating_sub(ended + current)
    }
}

/// Why the upload stopped.
pub(super) enum UpFault {
    /// The client's body broke off.
    Client,
    /// The backend took no more bytes.
    Backend,
}

/// The request direction: framed bytes not written yet, and the client's
/// body still to come.
pub(super) struct Upload {
    pub(super) out: BytesMut,
    /// `None` once the client's body has ended.
    pub(super) source: Option<ProxyBody>,
    chunked: bool,
    /// Written out, now being flushed (a TLS session holds bytes back).
    pub(super) flushing: bool,
    /// The request head (the first bytes queued) has all been written.
    head_sent: bool,
}

impl Upload {
    pub(super) fn new(out: BytesMut, source: Option<ProxyBody>, chunked: bool) -> Upload {
        Upload {
            out,
            source,
            chunked,
            flushing: false,
            head_sent: false,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.source.is_none() && self.out.is_empty() && !self.flushing
    }

    /// The head went up whole and the body has not all gone up (the
    /// client's, or its last bytes still queued): a backend that closes
    /// now would not take the whole request.
    pub(super) fn body_going_up(&self) -> bool {
        self.head_sent && !self.is_done()
    }

    /// Writes what it can without waiting; `Ready(Ok)` once all is sent.
    /// The client's body is asked for its next frame only when the last
    /// one is written, so a slow backend slows the client (backpressure).
    pub(super) fn poll(
        &mut self,
        stream: &mut BackendStream,
        wait: &BackendWait,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UpFault>> {
        loop {
            if !self.out.is_empty() {
                let written = Pin::new(&mut *stream).poll_write(cx, &self.out);
                match ready!(wait.note(written)) {
                    Ok(0) | Err(_) => return Poll::Ready(Err(UpFault::Backend)),
                    Ok(n) => self.out.advance(n),
                }
                self.flushing = self.out.is_empty();
                self.head_sent |= self.flushing;
                continue;
            }
            if self.flushing {
                let flushed = Pin::new(&mut *stream).poll_flush(cx);
                ready!(wait.note(flushed)).map_err(|_| UpFault::Backend)?;
                self.flushing = false;
                continue;
            }
            let Some(source) = self.source.as_mut() else {
                // All sent: the buffer goes, not held through the response
                // (a head of up to 64 KiB, for as long as a stream lasts).
                self.out = BytesMut::new();
                return Poll::Ready(Ok(()));
            };
            match ready!(Pin::new(source).poll_frame(cx)) {
                Some(Ok(frame)) => self.frame(frame),
                None => {
                    if self.chunked {
                        chunked::last_chunk(&[], &mut self.out);
                    }
                    self.source = None;
                }
                Some(Err(_)) => {
                    self.source = None;
                    return Poll::Ready(Err(UpFault::Client));
                }
            }
        }
    }

    fn frame(&mut self, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) if self.chunked => {
                chunked::chunk_header(data.len(), &mut self.out);
                self.out.put_slice(&data);
                self.out.put_slice(chunked::CHUNK_END);
            }
            Ok(data) => self.out.put_slice(&data),
            Err(frame) => {
                // Trailers end the body; only a chunked one can carry them.
                if let (Ok(trailers), true) = (frame.into_trailers(), self.chunked) {
                    let mut lines = BytesMut::new();
                    let kept = trailers
                        .iter()
                        .filter(|(name, _)| chunked::trailer_forwarded(name.as_str().as_bytes()));
                    for (name, value) in kept {
                        put_field(name.as_str().as_bytes(), value.as_bytes(), &mut lines);
                    }
                    chunked::last_chunk(&lines, &mut self.out);
                    self.chunked = false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Forwarded;

    fn outbound(forwarded: Forwarded) -> Outbound<'static> {
        Outbound {
            client_ip: "127.0.0.1",
            client_cert: Some("Subject=\"CN=alice\""),
            checks_client_certs: true,
            forwarded,
            proto: "https",
            backend_authority: "10.0.0.9:8080",
            request_id: b"id-1",
        }
    }

    /// The HTTP/1 head an h2 request with these fields goes up as, framed.
    fn framed(
        method: &str,
        uri: &str,
        fields: &[(&str, &[u8])],
        to: &Outbound<'_>,
        framing: UpFraming,
    ) -> String {
        let mut request = http::Request::builder().method(method).uri(uri);
        for (name, value) in fields {
            request = request.header(*name, *value);
        }
        let (parts, ()) = request.body(()).expect("request").into_parts();
        let mut out = BytesMut::new();
        request_head(&parts, to, framing, &mut out);
        // Bytes past ASCII shown as `\xNN`: obs-text goes up as sent.
        out.iter()
            .map(|&b| match b {
                0x80.. => format!("\\x{b:02x}"),
                _ => char::from(b).to_string(),
            })
            .collect()
    }

    /// The same for a GET without a body.
    fn written(uri: &str, fields: &[(&str, &str)], to: &Outbound<'_>) -> String {
        let fields: Vec<(&str, &[u8])> = fields.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        framed("GET", uri, &fields, to, UpFraming::None)
    }

    fn lines(head: &str) -> Vec<&str> {
        head.split("\r\n").filter(|l| !l.is_empty()).collect()
    }

    #[test]
    fn replace_trusts_nothing_the_client_sent() {
        let forged = [
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "http"),
            ("x-forwarded-host", "evil"),
            ("x-forwarded-port", "1"),
            ("x_forwarded_prefix", "/evil"),
            ("x-real-ip", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("front-end-https", "on"),
            ("x-forwarded-client-cert", "forged"),
            ("x-request-id", "forged"),
            ("x_request_id", "forged"),
            ("via", "1.1 edge"),
            ("accept", "*/*"),
        ];
        let head = written("http://app/p?q", &forged, &outbound(Forwarded::Replace));
        assert_eq!(
            lines(&head),
            [
                "GET /p?q HTTP/1.1",
                "via: 1.1 edge",
                "accept: */*",
                "host: app",
                "x-forwarded-for: 127.0.0.1",
                "x-forwarded-proto: https",
                "x-forwarded-client-cert: Subject=\"CN=alice\"",
                "x-request-id: id-1",
                "via: 2.0 baton",
            ]
        );
    }

    #[test]
    fn append_chains_every_hop_as_sent_then_the_client() {
        let fields: [(&str, &[u8]); 8] = [
            ("x-forwarded-for", b"a,, b ,"),
            ("x-forwarded-for", b"10.0.0.2, c\xe9"),
            ("x_forwarded_for", b"6.6.6.6"),
            ("x-forwarded-proto", b"http"),
            ("x_forwarded_client_cert", b"forged"),
            ("x-forwarded-client-cert", b"forged"),
            ("x-request-id", b"forged"),
            ("x-forwarded-host", b"kept"),
        ];
        let to = outbound(Forwarded::Append);
        let head = framed("GET", "/p", &fields, &to, UpFraming::None);
        assert_eq!(
            lines(&head),
            [
                "GET /p HTTP/1.1",
                "x-forwarded-host: kept",
                "host: 10.0.0.9:8080",
                "x-forwarded-for: a, b, 10.0.0.2, c\\xe9, 127.0.0.1",
                "x-forwarded-proto: https",
                "x-forwarded-client-cert: Subject=\"CN=alice\"",
                "x-request-id: id-1",
                "via: 2.0 baton",
            ]
        );
    }

    #[test]
    fn append_passes_on_the_scheme_the_nearest_proxy_said_to_a_plain_listener() {
        let scheme_of = |fields: &[(&str, &[u8])], proto| {
            let to = Outbound {
                proto,
                ..outbound(Forwarded::Append)
            };
            let head = framed("GET", "/", fields, &to, UpFraming::None);
            lines(&head)
                .into_iter()
                .filter(|l| l.starts_with("x-forwarded-proto"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        // The client's own first, then the proxy's: the last is the hop
        // nearest baton; of a list, its last value.
        let said: [(&str, &[u8]); 2] = [
            ("x-forwarded-proto", b"http"),
            ("x-forwarded-proto", b" HTTPS "),
        ];
        assert_eq!(scheme_of(&said, "http"), ["x-forwarded-proto: https"]);
        let listed: [(&str, &[u8]); 1] = [("x-forwarded-proto", b"https, http")];
        assert_eq!(scheme_of(&listed, "http"), ["x-forwarded-proto: http"]);
        let trailing: [(&str, &[u8]); 2] = [
            ("x-forwarded-proto", b"https, "),
            ("x-forwarded-proto", b""),
        ];
        assert_eq!(
            scheme_of(&trailing, "http"),
            ["x-forwarded-proto: https"],
            "empty elements are none"
        );
        let unusable: [(&str, &[u8]); 2] = [
            ("x-forwarded-proto", b"https"),
            ("x-forwarded-proto", b"ftp"),
        ];
        assert_eq!(
            scheme_of(&unusable, "http"),
            ["x-forwarded-proto: http"],
            "the listener's own"
        );
        // A TLS listener's clients reached baton encrypted.
        let downgraded: [(&str, &[u8]); 1] = [("x-forwarded-proto", b"http")];
        assert_eq!(
            scheme_of(&downgraded, "https"),
            ["x-forwarded-proto: https"]
        );
    }

    #[test]
    fn off_passes_what_the_client_said_and_adds_none() {
        let fields = [
            ("x-forwarded-for", "6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("x-request-id", "a"),
            ("x-request-id", "b"),
        ];
        let head = written("http://app/", &fields, &outbound(Forwarded::Off));
        assert_eq!(
            lines(&head),
            [
                "GET / HTTP/1.1",
                "x-forwarded-for: 6.6.6.6",
                "x-real-ip: 6.6.6.6",
                "host: app",
                "x-request-id: id-1",
                "via: 2.0 baton",
            ]
        );
    }

    #[test]
    fn the_authority_names_the_host_cookies_join_and_hop_fields_stay() {
        let fields = [
            ("host", "other"),
            ("cookie", "a=1"),
            ("te", "trailers"),
            ("http2-settings", "AAA"),
            ("expect", "100-continue"),
            ("content_length", "5"),
            ("cookie", "b=2"),
        ];
        let head = written("http://user@app:8080/", &fields, &outbound(Forwarded::Off));
        assert_eq!(
            lines(&head),
            [
                "GET / HTTP/1.1",
                "cookie: a=1; b=2",
                "host: app:8080",
                "x-request-id: id-1",
                "via: 2.0 baton",
                "connection: te",
                "te: trailers",
            ]
        );
        let head = written("/", &[("host", "given")], &outbound(Forwarded::Off));
        assert!(head.contains("\r\nhost: given\r\n"), "{head}");
        assert_eq!(head.matches("host:").count(), 1, "{head}");
    }

    #[test]
    fn a_body_goes_up_with_the_clients_length_or_chunked() {
        let to = outbound(Forwarded::Off);
        let sized: [(&str, &[u8]); 2] = [("content-length", b"5"), ("content_length", b"9")];
        let head = framed("POST", "/", &sized, &to, UpFraming::Length);
        assert_eq!(head.matches("content-length").count(), 1, "{head}");
        assert!(head.contains("\r\ncontent-length: 5\r\n"), "{head}");
        let head = framed("POST", "/", &[], &to, UpFraming::Length);
        assert!(head.contains("\r\ncontent-length: 0\r\n"), "{head}");
        let coded: [(&str, &[u8]); 1] = [("transfer_encoding", b"gzip")];
        let head = framed("PUT", "/", &coded, &to, UpFraming::Chunked);
        assert_eq!(
            lines(&head),
            [
                "PUT / HTTP/1.1",
                "host: 10.0.0.9:8080",
                "x-request-id: id-1",
                "via: 2.0 baton",
                "transfer-encoding: chunked",
            ]
        );
    }
}
