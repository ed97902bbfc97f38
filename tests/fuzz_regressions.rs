//! Replays the fuzzers' inputs as ordinary tests: every seed decodes (they
//! are real configs, messages and HTTP/1 heads), and every hostile input in
//! `tests/fuzz/regressions/TARGET/` (hand-picked edge cases, and anything a
//! fuzzer once crashed on) is refused with an error, not a panic (an HTTP/1
//! request is only required not to panic: a crash input may be valid).

use std::path::{Path, PathBuf};

use baton::config::{parse, Overrides};
use baton::lifecycle::{control, framing, handoff};
use baton::proxy::h1::chunked::{Decoder, Piece};
use baton::proxy::h1::head::{parse_request, parse_response, Framing, Parsed};
use baton::proxy::h2::frame::{self as h2_frame, Inbound};
use baton::proxy::h2::hpack;
use baton::proxy_protocol::receive::{decode, frame, Framed};
use baton::proxy_protocol::Accept;

#[path = "fuzz/fuzz_targets/h2_drive.rs"]
mod h2_drive;

fn inputs(dir: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz")
        .join(dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read input");
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

/// A handoff message as a channel receives it: `bytes` cut into datagrams
/// at each newline, put back together, then decoded.
fn receive(bytes: &[u8]) -> Result<handoff::Message, String> {
    let mut pieces = framing::Reassembly::default();
    let mut whole = None;
    for datagram in bytes.split(|b| *b == b'\n') {
        whole = pieces.push(datagram).map_err(|e| e.to_string())?;
    }
    let body = whole.ok_or("the message never ended")?;
    handoff::decode(&body).map_err(|e| e.to_string())
}

fn load_config(bytes: &[u8]) -> Result<baton::config::Config, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    parse(text, Path::new("fuzz.toml"), &Overrides::default()).map_err(|e| e.to_string())
}

#[test]
fn the_config_seed_loads() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/baton.toml");
    let bytes = std::fs::read(&example).expect("the example config");
    if let Err(e) = load_config(&bytes) {
        panic!("{}: {e}", example.display());
    }
}

#[test]
fn every_message_seed_decodes_as_one_or_the_other() {
    let seeds = inputs("seeds/messages");
    assert!(seeds.len() >= 4);
    for (path, bytes) in seeds {
        let handoff = receive(&bytes);
        let control = control::decode_request(&bytes);
        assert!(
            handoff.is_ok() != control.is_ok(),
            "{}: handoff {handoff:?}, control {:?}",
            path.display(),
            control.map_err(|r| r.message)
        );
    }
}

/// Hostile inputs (deep nesting, huge numbers, a future protocol version,
/// pieces of a message out of order) and whatever a fuzzer once crashed on: each is refused with an error.
#[test]
fn hostile_inputs_are_refused_not_panicked_on() {
    let configs = inputs("regressions/config");
    let messages = inputs("regressions/messages");
    assert!(!configs.is_empty() && !messages.is_empty());
    for (path, bytes) in configs {
        assert!(load_config(&bytes).is_err(), "{}", path.display());
    }
    for (path, bytes) in messages {
        assert!(handoff::decode(&bytes).is_err(), "{}", path.display());
        assert!(receive(&bytes).is_err(), "{}", path.display());
        assert!(
            control::decode_request(&bytes).is_err(),
            "{}",
            path.display()
        );
    }
}

#[test]
fn every_h1_seed_parses_whole() {
    let requests = inputs("seeds/h1_request");
    let responses = inputs("seeds/h1_response");
    assert!(requests.len() >= 4 && responses.len() >= 4);
    for (path, bytes) in requests {
        let parsed = parse_request(&bytes);
        assert!(
            matches!(parsed, Ok(Parsed::Complete(_))),
            "{}: {parsed:?}",
            path.display()
        );
    }
    for (path, bytes) in responses {
        let parsed = parse_response(&bytes, &http::Method::GET);
        assert!(
            matches!(parsed, Ok(Parsed::Complete(_))),
            "{}: {parsed:?}",
            path.display()
        );
    }
}

/// A request head and its body as the fuzz target takes them: the head,
/// then a chunked body decoded to its end, an error or a want of bytes.
fn take_request(bytes: &[u8]) {
    let Ok(Parsed::Complete(head)) = parse_request(bytes) else {
        return;
    };
    if head.framing != Framing::Chunked {
        return;
    }
    let mut rest = &bytes[head.consumed..];
    let mut decoder = Decoder::new();
    loop {
        match decoder.decode(rest) {
            Ok((0, None)) | Ok((_, Some(Piece::End { .. }))) | Err(_) => return,
            Ok((n, _)) => rest = &rest[n..],
        }
    }
}

/// Smuggling shapes, endless empty lines, huge chunk sizes, extensions and
/// trailers, and whatever a fuzzer once crashed on: none panics or hangs.
#[test]
fn hostile_h1_requests_do_not_panic() {
    let cases = inputs("regressions/h1_request");
    assert!(!cases.is_empty());
    for (_, bytes) in cases {
        take_request(&bytes);
    }
}

/// Each seed is a whole PROXY header (v1 and v2, addresses, LOCAL,
/// UNKNOWN, TLVs), framed short of the client's bytes after it.
#[test]
fn every_proxy_header_seed_frames_and_decodes() {
    let seeds = inputs("seeds/proxy_header");
    assert!(seeds.len() >= 6);
    for (path, bytes) in seeds {
        let Framed::Header(length) = frame(&bytes) else {
            panic!("{}: not framed as a header", path.display());
        };
        let told = decode(&bytes[..length], Accept::Any);
        assert!(told.is_ok(), "{}: {told:?}", path.display());
    }
}

/// What a fuzzer once crashed on (a v1 line with non-ASCII UTF-8 panicked
/// `ppp`'s parser): framed, then refused, never a panic.
#[test]
fn hostile_proxy_headers_are_refused() {
    let cases = inputs("regressions/proxy_header");
    assert!(!cases.is_empty());
    for (path, bytes) in cases {
        if let Framed::Header(length) = frame(&bytes) {
            let told = decode(&bytes[..length], Accept::Any);
            assert!(told.is_err(), "{}: {told:?}", path.display());
        }
    }
}

/// An h2 client's frames as the fuzz target reads them: every frame cut
/// and checked, header blocks assembled and decoded with one decoder.
/// The number of header blocks, or the first error.
fn read_h2(bytes: &[u8]) -> Result<usize, String> {
    let mut buf = bytes::BytesMut::from(bytes);
    let mut reader = h2_frame::Reader::new(h2_frame::DEFAULT_MAX_FRAME, 65_536);
    let mut decoder = hpack::Decoder::new(4096);
    let mut blocks = 0;
    while let Some(inbound) = reader.next(&mut buf).map_err(|e| e.to_string())? {
        if let Inbound::Block(whole) = inbound {
            let mut fields = Vec::new();
            let decoded = decoder.decode(&whole.block, 65_536, &mut fields);
            decoded.map_err(|e| e.to_string())?;
            blocks += 1;
        }
    }
    if !buf.is_empty() || reader.inside_block() {
        return Err(format!("{} bytes left unread", buf.len()));
    }
    Ok(blocks)
}

/// Each seed is a sequence of valid frames (settings, requests whose heads
/// share the dynamic table, bodies with padding, CONTINUATIONs, control
/// frames, a type h2 does not define), read to its end.
#[test]
fn every_h2_seed_reads_whole() {
    let seeds = inputs("seeds/h2_frames");
    assert!(seeds.len() >= 4);
    for (path, bytes) in seeds {
        let read = read_h2(&bytes);
        assert!(read.is_ok(), "{}: {read:?}", path.display());
    }
}

/// CONTINUATION floods, frames interleaved in a header block, integers and
/// sizes past their bounds, EOS in a Huffman string: each refused.
#[test]
fn hostile_h2_frames_are_refused() {
    let cases = inputs("regressions/h2_frames");
    assert!(cases.len() >= 8);
    for (path, bytes) in cases {
        let read = read_h2(&bytes);
        assert!(read.is_err(), "{}: {read:?}", path.display());
    }
}

/// Every h2 seed and hostile case, fed to a whole connection, ends it:
/// no panic, no hang (what the `h2_conn` fuzz target checks of any input).
#[tokio::test(start_paused = true)]
async fn every_h2_input_ends_its_connection() {
    let cases = [inputs("seeds/h2_frames"), inputs("regressions/h2_frames")].concat();
    assert!(cases.len() >= 12);
    for (path, bytes) in cases {
        assert!(
            h2_drive::connection_ends(&bytes).await,
            "{}",
            path.display()
        );
    }
}
