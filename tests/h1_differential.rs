//! baton's HTTP/1 codec judged against hyper's HTTP/1 server, the parser it
//! replaces: for each request below, both must accept it with the same body
//! length or both refuse it, except for the listed known differences, each
//! of which says which side is right. A known difference that stops being
//! one fails the test too, so the list stays true.

use std::convert::Infallible;
use std::time::Duration;

use baton::proxy::h1::chunked::{Decoder, Piece};
use baton::proxy::h1::head::{parse_request, Framing, Parsed};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// What a parser made of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Accepted, with a body of this many bytes.
    Body(u64),
    /// Refused (an error status, a closed connection, or a body error).
    Refused,
}

const CORPUS: &[(&str, &[u8])] = &[
    ("get", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("get_query_absolute", b"GET http://a/p?q=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("http10_keep_alive", b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
    ("http10_no_host", b"GET / HTTP/1.0\r\n\r\n"),
    ("post_cl", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"),
    ("post_cl_zero", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
    ("http10_post_cl", b"POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc"),
    ("chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
    ("chunked_ext", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b;c\r\nhello\r\n0;x=\"y z\"\r\n\r\n"),
    ("chunked_trailers", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\nContent-Length: 9\r\n\r\n"),
    ("chunked_mixed_case", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-encoding: cHuNkEd\r\n\r\n1\r\nx\r\n0\r\n\r\n"),
    ("te_tab", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"),
    ("leading_crlf", b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("bare_lf_head", b"POST / HTTP/1.1\nHost: a\nContent-Length: 2\n\nhi"),
    ("expect_continue", b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"),
    ("options_asterisk", b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("target_with_fragment", b"GET /app.js#/../admin HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("cl_te", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX"),
    ("te_cl", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\nx\r\n0\r\n\r\n"),
    ("te_te_x", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n"),
    ("te_te_chunked_twice", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("te_space_before_colon", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"),
    ("te_folded", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"),
    ("te_xchunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n"),
    ("te_gzip_chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"),
    ("te_chunked_gzip", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"),
    ("te_identity", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n"),
    ("te_http10", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("cl_twice_equal", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nhi"),
    ("cl_twice_differ", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi!"),
    ("cl_list", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\n\r\nhi"),
    ("cl_plus", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +2\r\n\r\nhi"),
    ("cl_hex", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x2\r\n\r\nhi"),
    ("obs_fold", b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n z\r\n\r\n"),
    ("nul_in_value", b"GET / HTTP/1.1\r\nHost: a\r\nX: y\0z\r\n\r\n"),
    ("cr_in_value", b"GET / HTTP/1.1\r\nHost: a\r\nX: y\rz\r\n\r\n"),
    ("nul_in_name", b"GET / HTTP/1.1\r\nHost: a\r\nX\0: y\r\n\r\n"),
    ("http09", b"GET /\r\n\r\n"),
    ("http2_version", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n"),
    ("method_0xff", b"G\xffT / HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("chunk_size_huge", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nx\r\n0\r\n\r\n"),
    ("chunk_size_bare_lf", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\nx\r\n0\r\n\r\n"),
    ("chunk_data_no_crlf", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n"),
    ("chunk_size_not_hex", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n"),
    ("missing_host", b"GET / HTTP/1.1\r\n\r\n"),
    ("two_hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
    ("host_with_at", b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n"),
    ("connect", b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n"),
    ("target_not_a_path", b"GET nope HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("asterisk_with_get", b"GET * HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("expect_other", b"POST / HTTP/1.1\r\nHost: a\r\nExpect: foo\r\nContent-Length: 2\r\n\r\nhi"),
    ("chunk_ext_unquoted_space", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;a b\r\nx\r\n0\r\n\r\n"),
    ("chunk_size_trailing_space", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1 \r\nx\r\n0\r\n\r\n"),
    ("method_head_lowercase", b"head / HTTP/1.1\r\nHost: a\r\n\r\n"),
    ("method_extension", b"PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n"),
];

/// Where baton and hyper disagree, and which one is right.
const KNOWN_DIFFERENCES: &[&str] = &[
    // TE with CL, either order (CL.TE, TE.CL): hyper drops CL and decodes
    // chunked; baton refuses. RFC 9112 §6.3 says such a message "ought to be
    // handled as an error": a smuggling attempt is not forwarded. baton is right.
    "cl_te",
    "te_cl",
    // Two TE fields that together say `chunked, chunked`: hyper decodes
    // chunked (the last coding is chunked); baton refuses any TE other than
    // one field of exactly `chunked` (chunked applied twice is invalid,
    // RFC 9112 §6.1, and repeated TE is a TE.TE obfuscation). baton is right.
    "te_te_chunked_twice",
    // `gzip, chunked`: hyper decodes the chunks and passes a gzip body on
    // while dropping the TE that said so; baton only proxies `chunked`
    // (it would have to keep the gzip coding). Both are allowed (RFC 9112
    // §6.1 lets a server answer 501 to codings it does not know); baton is
    // the stricter, safer choice.
    "te_gzip_chunked",
    // Identical repeated Content-Length: hyper accepts (RFC 9110 §8.6
    // allows it); baton refuses requests with two (a request is hostile
    // until proven otherwise; the RFC also allows rejecting). Both allowed.
    "cl_twice_equal",
    // HTTP/1.1 without Host: hyper accepts; RFC 9112 §3.2 says a server
    // MUST answer 400. baton is right.
    "missing_host",
    // Two Host fields, or a Host with userinfo: hyper does not look; RFC
    // 9112 §3.2 says MUST answer 400 (and RFC 9110 §4.2.4 forbids userinfo).
    // baton is right.
    "two_hosts",
    "host_with_at",
    // CONNECT: hyper hands it to the service; baton is no forward proxy and
    // answers 405. A policy choice, baton's is intended.
    "connect",
    // `GET nope`: hyper takes `nope` as an authority; for GET only origin-
    // and absolute-form are valid (RFC 9112 §3.2). baton is right.
    "target_not_a_path",
    // `GET *`: asterisk-form is for OPTIONS only (RFC 9112 §3.2.4); hyper
    // accepts it. baton is right.
    "asterisk_with_get",
    // An Expect other than 100-continue: hyper ignores it; RFC 9110 §10.1.1
    // lets a server answer 417, which baton does, rather than forwarding an
    // expectation nobody will meet. Both allowed.
    "expect_other",
    // A chunk extension that is not `token[=value]`: hyper skips extensions
    // unread; baton validates them (RFC 9112 §7.1.1), because a next hop
    // that parses them could read the chunk differently. baton is stricter.
    "chunk_ext_unquoted_space",
    // Whitespace after a chunk size with no extension: hyper tolerates it
    // (old implementations sent it); RFC 9112 §7.1 has no whitespace there
    // without a `;`. baton is stricter, and re-frames anyway.
    "chunk_size_trailing_space",
    // `head`: hyper takes it for an extension method whose answer has a
    // body; so would baton's framing, while a backend that folds the case
    // reads HEAD and sends none, and the next response on the connection
    // becomes this one's body. baton refuses a standard method in another
    // case (as nginx refuses any method not in capitals). baton is safer;
    // methods are case-sensitive (RFC 9110 §9.1), so both are allowed.
    "method_head_lowercase",
    // A fragment in the target: hyper drops it (the `http` crate cuts the
    // URI at `#`); baton refuses it, as HAProxy does since CVE-2023-45539:
    // a backend that reads the whole target would see a path other than
    // the one baton routed on. RFC 9112 §3.2 has no fragment in any form.
    // baton is right.
    "target_with_fragment",
];

/// baton's codec: the head, then the body by its framing.
fn baton_verdict(raw: &[u8]) -> Verdict {
    let head = match parse_request(raw) {
        Ok(Parsed::Complete(head)) => head,
        Ok(Parsed::Partial) | Err(_) => return Verdict::Refused,
    };
    let body = raw.get(head.consumed..).unwrap_or_default();
    match head.framing {
        Framing::Empty => Verdict::Body(0),
        Framing::Length(n) if body.len() as u64 >= n => Verdict::Body(n),
        Framing::Length(_) | Framing::UntilClose => Verdict::Refused,
        Framing::Chunked => chunked_length(body),
    }
}

fn chunked_length(mut body: &[u8]) -> Verdict {
    let mut decoder = Decoder::new();
    let mut total = 0u64;
    loop {
        match decoder.decode(body) {
            Ok((_, Some(Piece::End { .. }))) => return Verdict::Body(total),
            Ok((n, Some(Piece::Data(r)))) => {
                total += r.len() as u64;
                body = &body[n..];
            }
            Ok((0, None)) | Err(_) => return Verdict::Refused,
            Ok((n, None)) => body = &body[n..],
        }
    }
}

/// hyper's HTTP/1 server over an in-memory pipe; the service reports the
/// length of the body it read (or that reading it failed).
async fn hyper_verdict(raw: &'static [u8]) -> Verdict {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let tx = tx.clone();
        async move {
            let verdict = match req.into_body().collect().await {
                Ok(body) => Verdict::Body(body.to_bytes().len() as u64),
                Err(_) => Verdict::Refused,
            };
            let _ = tx.send(verdict);
            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::new())))
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(server), service);
    client.write_all(raw).await.unwrap();
    tokio::pin!(conn);
    tokio::select! {
        biased;
        Some(verdict) = rx.recv() => verdict,
        _ = &mut conn => rx.try_recv().unwrap_or(Verdict::Refused),
    }
}

#[tokio::test]
async fn baton_and_hyper_agree_except_where_listed() {
    let mut problems = Vec::new();
    for &(name, raw) in CORPUS {
        let hyper = tokio::time::timeout(Duration::from_secs(5), hyper_verdict(raw))
            .await
            .unwrap_or_else(|_| panic!("{name}: hyper gave no verdict within 5 s"));
        let baton = baton_verdict(raw);
        let known = KNOWN_DIFFERENCES.contains(&name);
        match (baton == hyper, known) {
            (true, true) => problems.push(format!(
                "{name}: listed as a known difference, but both say {baton:?}: drop it from the list"
            )),
            (false, false) => problems.push(format!("{name}: baton {baton:?}, hyper {hyper:?}")),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_known_difference_is_in_the_corpus() {
    for name in KNOWN_DIFFERENCES {
        assert!(
            CORPUS.iter().any(|(n, _)| n == name),
            "{name} is listed but not in the corpus"
        );
    }
    assert!(CORPUS.len() >= 40);
}
