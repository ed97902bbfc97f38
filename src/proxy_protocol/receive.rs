//! A listener's side: the header is read off the socket before anything
//! else (before a TLS handshake too), and never a byte past it, so what
//! follows reaches TLS or HTTP untouched. The socket is peeked to find the
//! header's end; only bytes known to be header are consumed.

use std::net::SocketAddr;

use ppp::v1;
use ppp::v2;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::TcpStream;

use super::{Accept, Origin, ReceiveSettings};

/// The v2 header's first 12 bytes.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v2 header's fixed part: signature, version and command, family, length.
const V2_FIXED: usize = 16;
/// A v2 header's version-and-command byte for LOCAL.
const V2_LOCAL: u8 = 0x20;
/// The largest v2 header baton takes, TLVs included: HAProxy's default
/// buffer (`tune.bufsize`), the most a sender tested against it can
/// count on (senders' TLVs run to a few hundred bytes; the format allows
/// 64 KiB).
const V2_MAX: usize = 16 * 1024;
/// How much one look at the socket sees: a v1 line or a usual v2 header
/// whole. A longer header is taken in as many looks (each look's bytes
/// are consumed once they are surely the header's), so a connection
/// does not fill a buffer of `V2_MAX` for every header.
const LOOK: usize = 1024;
const V1_PREFIX: &[u8] = b"PROXY ";
const V1_UNKNOWN: &[u8] = b"PROXY UNKNOWN";
/// The spec's limit on a v1 line, CRLF included.
const V1_MAX: usize = 107;

/// Why a connection was closed before it was served: the `reason` label
/// of `baton_proxy_protocol_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a PROXY header from a peer not in `trusted`")]
    Untrusted,
    #[error("a malformed PROXY header")]
    Malformed,
    #[error("no PROXY header, and the listener requires one")]
    Missing,
    #[error("no whole PROXY header within the timeout")]
    Timeout,
    #[error("a PROXY header of a version the listener does not accept")]
    Version,
    #[error("the peer closed before a whole PROXY header")]
    Closed,
}

impl Refusal {
    /// Every reason, for the series published at 0 from the start.
    pub const ALL: [Refusal; 6] = [
        Refusal::Untrusted,
        Refusal::Malformed,
        Refusal::Missing,
        Refusal::Timeout,
        Refusal::Version,
        Refusal::Closed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refusal::Untrusted => "untrusted",
            Refusal::Malformed => "malformed",
            Refusal::Missing => "missing",
            Refusal::Timeout => "timeout",
            Refusal::Version => "version",
            Refusal::Closed => "closed",
        }
    }
}

/// What the first bytes of a connection are.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed {
    /// They could still become a header: more are needed.
    Incomplete,
    /// Not a PROXY header: the client's own bytes.
    Absent,
    /// A whole header, this many bytes long.
    Header(usize),
    /// A header that can never be whole (too long).
    Malformed,
}

/// Finds where a header starting at `bytes` ends, without judging it.
pub fn frame(bytes: &[u8]) -> Framed {
    if begins_as(bytes, V2_SIGNATURE) {
        if bytes.len() < V2_FIXED {
            return Framed::Incomplete;
        }
        let total = V2_FIXED + usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
        return match total {
            t if t > V2_MAX => Framed::Malformed,
            t if bytes.len() < t => Framed::Incomplete,
            t => Framed::Header(t),
        };
    }
    if begins_as(bytes, V1_PREFIX) {
        let window = &bytes[..bytes.len().min(V1_MAX)];
        return match window.windows(2).position(|w| w == b"\r\n") {
            Some(end) => Framed::Header(end + 2),
            None if bytes.len() >= V1_MAX => Framed::Malformed,
            None => Framed::Incomplete,
        };
    }
    Framed::Absent
}

/// `bytes` and `signature` agree as far as both go.
fn begins_as(bytes: &[u8], signature: &[u8]) -> bool {
    let n = bytes.len().min(signature.len());
    bytes[..n] == signature[..n]
}

/// Enough bytes are in to know they are a header's, so consuming them
/// takes nothing from the client.
fn surely_header(bytes: &[u8]) -> bool {
    (bytes.len() >= V2_SIGNATURE.len() && bytes.starts_with(V2_SIGNATURE))
        || bytes.starts_with(V1_PREFIX)
}

/// The addresses a whole header tells, `None` for "the socket's own"
/// (v2 `LOCAL`, the balancer's own health check; v1 `UNKNOWN`; a family
/// other than IPv4/IPv6).
pub fn decode(header: &[u8], accept: Accept) -> Result<Option<(SocketAddr, SocketAddr)>, Refusal> {
    if header.starts_with(V2_SIGNATURE) {
        if accept == Accept::V1 {
            return Err(Refusal::Version);
        }
        // LOCAL (version 2, command 0): its address block is skipped
        // whatever family it names, as the spec asks of receivers and
        // HAProxy does; `ppp` refuses one shorter than the family's.
        if header.get(V2_SIGNATURE.len()) == Some(&V2_LOCAL) {
            return Ok(None);
        }
        let parsed = v2::Header::try_from(header).map_err(|_| Refusal::Malformed)?;
        if parsed.header.len() != header.len() {
            return Err(Refusal::Malformed);
        }
        if parsed.command == v2::Command::Local {
            return Ok(None);
        }
        let addresses = match (parsed.protocol, parsed.addresses) {
            (v2::Protocol::Stream, v2::Addresses::IPv4(a)) => four(a),
            (v2::Protocol::Stream, v2::Addresses::IPv6(a)) => six(a),
            (v2::Protocol::Datagram, _) => return Err(Refusal::Malformed),
            _ => return Ok(None),
        };
        // ppp reads TLVs only when asked: one cut short or running past the
        // header is refused here, as HAProxy refuses it.
        if parsed.tlvs().any(|tlv| tlv.is_err()) {
            return Err(Refusal::Malformed);
        }
        checksum_holds(header, parsed.tlv_bytes().len())?;
        return Ok(Some(addresses));
    }
    if accept == Accept::V2 {
        return Err(Refusal::Version);
    }
    // The v1 line is US-ASCII; other UTF-8 would also panic `ppp`'s
    // parser (it slices inside a character: found by the fuzzer).
    if !header.is_ascii() {
        return Err(Refusal::Malformed);
    }
    // `PROXY UNKNOWN`: whatever follows up to the CRLF is ignored, as the
    // spec asks (`ppp` refuses more than four fields after it).
    if let Some(b' ' | b'\r') = header
        .strip_prefix(V1_UNKNOWN)
        .and_then(|rest| rest.first())
    {
        return Ok(None);
    }
    let text = std::str::from_utf8(header).map_err(|_| Refusal::Malformed)?;
    let parsed = v1::Header::try_from(text).map_err(|_| Refusal::Malformed)?;
    match parsed.addresses {
        v1::Addresses::Tcp4(a) => Ok(Some(four(a))),
        v1::Addresses::Tcp6(a) => Ok(Some(six(a))),
        v1::Addresses::Unknown => Ok(None),
    }
}

/// A v2 header's `PP2_TYPE_CRC32C`, where it has one, matches the header:
/// the CRC32c of all of it with the checksum's own four bytes as zeros
/// (the spec's check, which HAProxy makes). The first that does not match
/// ends the walk. `tlv_len`: the bytes of TLVs ending the header, already
/// found well formed.
fn checksum_holds(header: &[u8], tlv_len: usize) -> Result<(), Refusal> {
    const PP2_TYPE_CRC32C: u8 = 0x03;
    let mut at = header.len() - tlv_len;
    while let [kind, high, low, ..] = header[at..] {
        let value = at + 3;
        let end = value + usize::from(u16::from_be_bytes([high, low]));
        if kind == PP2_TYPE_CRC32C {
            let said: [u8; 4] = header[value..end]
                .try_into()
                .map_err(|_| Refusal::Malformed)?;
            let crc = crc32c(&[&header[..value], &[0; 4], &header[end..]]);
            if crc != u32::from_be_bytes(said) {
                return Err(Refusal::Malformed);
            }
        }
        at = end;
    }
    Ok(())
}

/// CRC-32C (Castagnoli, reflected) of `parts` one after the other, bit by
/// bit: a header is at most 16 KiB and rarely carries one.
fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for &b in parts.iter().flat_map(|part| part.iter()) {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// The (client, reached) ends a header's IPv4 block tells (`ppp` uses
/// one type for both versions).
fn four(a: v1::IPv4) -> (SocketAddr, SocketAddr) {
    (
        (a.source_address, a.source_port).into(),
        (a.destination_address, a.destination_port).into(),
    )
}

/// The same for an IPv6 block. An IPv4 client written as IPv6 (a sender
/// on a dual-stack socket writes `::ffff:192.0.2.7`) is read as the IPv4
/// address it is, as baton writes one it accepts itself: a backend's
/// trusted-proxy list of IPv4 blocks matches its `X-Forwarded-For`.
fn six(a: v1::IPv6) -> (SocketAddr, SocketAddr) {
    (
        super::canonical((a.source_address, a.source_port).into()),
        super::canonical((a.destination_address, a.destination_port).into()),
    )
}

/// What a wait for a header came to, when nothing was refused.
#[derive(Debug)]
pub enum Received {
    /// Who the connection is from.
    From(Origin),
    /// Not a byte came before `idle_until` did (a drain's grace).
    Idle,
}

/// Reads the header, if any, off `stream` within `settings.timeout`, and
/// says who the connection is from. A peer that has sent nothing when
/// `idle_until` resolves (a drain's grace: it would hold the drain to the
/// timeout) is `Idle`; within the same timeout, which counts from here.
pub async fn receive(
    stream: &mut TcpStream,
    socket: Origin,
    settings: &ReceiveSettings,
    idle_until: impl std::future::Future<Output = ()>,
) -> Result<Received, Refusal> {
    let trusted = settings.trusts(socket.client.ip());
    if !trusted && settings.required {
        // Nothing it could send would be believed.
        return Err(Refusal::Untrusted);
    }
    let mut consumed = Vec::new();
    let read = tokio::time::timeout(settings.timeout, async {
        if silent_until(stream, idle_until).await? {
            return Ok(None);
        }
        read_header(stream, &mut consumed).await.map(Some)
    })
    .await;
    let looked = match read {
        Ok(Ok(None)) => return Ok(Received::Idle),
        Ok(Ok(Some(looked))) => looked,
        Ok(Err(refusal)) => return Err(refusal),
        // A client that sends nothing first (a server-speaks-first
        // protocol) is served once the wait is over, where allowed.
        Err(_) if consumed.is_empty() && !settings.required => Looked::Absent,
        Err(_) => return Err(Refusal::Timeout),
    };
    let origin = match looked {
        Looked::Silent if settings.required => return Err(Refusal::Closed),
        Looked::Absent if settings.required => return Err(Refusal::Missing),
        // One that closed its half having sent nothing (`nc -N` reading a
        // greeting) is served too: as it would be without `proxy_protocol`.
        Looked::Silent | Looked::Absent => socket,
        Looked::Header(_) if !trusted => return Err(Refusal::Untrusted),
        Looked::Header(header) => match decode(&header, settings.accept)? {
            Some((client, local)) => Origin {
                client,
                local: Some(local),
            },
            None => socket,
        },
    };
    Ok(Received::From(origin))
}

/// Whether `idle_until` came before a first byte (or the peer's close).
/// Peeked, not waited on for readability, which tokio may report without
/// a byte; the header is read after. A reset is the peer gone (the
/// kernel reports it once: a look after it would see a quiet close).
async fn silent_until(
    stream: &TcpStream,
    idle_until: impl std::future::Future<Output = ()>,
) -> Result<bool, Refusal> {
    let mut first = [0u8; 1];
    tokio::select! {
        // A byte that came wins over a grace that ran out with it.
        biased;
        peeked = stream.peek(&mut first) => peeked.map(|_| false).map_err(|_| Refusal::Closed),
        () = idle_until => Ok(true),
    }
}

/// What the first bytes of a connection are.
#[derive(Debug, PartialEq)]
enum Looked {
    /// A whole header.
    Header(Vec<u8>),
    /// Not a header: the client's own bytes.
    Absent,
    /// None: the peer closed its half having sent nothing at all.
    Silent,
}

/// The whole header, if the first bytes are one. Bytes are consumed into
/// `consumed` only once they are surely header.
async fn read_header(stream: &mut TcpStream, consumed: &mut Vec<u8>) -> Result<Looked, Refusal> {
    let mut peeked = vec![0u8; LOOK];
    // How many bytes the last look saw that might yet become a header.
    let mut unsure = None;
    loop {
        let (n, closed) = next_look(stream, &mut peeked, unsure).await?;
        if n == 0 && unsure.is_none() && consumed.is_empty() {
            return Ok(Looked::Silent);
        }
        if n == 0 {
            return Err(Refusal::Closed);
        }
        // What was consumed and what this look saw, judged together; the
        // look's bytes are taken back off (a copy of all seen at each look
        // would cost a header trickled in a byte at a time its square).
        let before = consumed.len();
        consumed.extend_from_slice(&peeked[..n]);
        let (framed, sure) = (frame(consumed), surely_header(consumed));
        consumed.truncate(before);
        match framed {
            Framed::Absent if consumed.is_empty() => return Ok(Looked::Absent),
            Framed::Absent | Framed::Malformed => return Err(Refusal::Malformed),
            Framed::Header(total) => {
                take(stream, consumed, total - consumed.len()).await?;
                return Ok(Looked::Header(std::mem::take(consumed)));
            }
            Framed::Incomplete if sure => {
                take(stream, consumed, n).await?;
                unsure = None;
            }
            // Gone before a whole header: nothing more will come.
            Framed::Incomplete if closed => return Err(Refusal::Closed),
            Framed::Incomplete => unsure = Some(n),
        }
    }
}

/// Peeks at what the socket holds, once it holds more than the `unsure`
/// bytes of the last look (those cannot be consumed: they may be the
/// client's own), or the client closed its side; returns the count and
/// whether it closed. Looking again on a timer would let a client holding
/// many such connections keep baton busy. The readiness is taken before the
/// peek and cleared when the peek saw nothing new, so an arrival in
/// between is never missed (tokio's reactor is edge-triggered, and Linux
/// signals every arrival).
async fn next_look(
    stream: &TcpStream,
    peeked: &mut [u8],
    unsure: Option<usize>,
) -> Result<(usize, bool), Refusal> {
    loop {
        let ready = stream
            .ready(Interest::READABLE)
            .await
            .map_err(|_| Refusal::Closed)?;
        let closed = ready.is_read_closed();
        let look = stream.try_io(Interest::READABLE, || {
            let n = peek(stream, peeked)?;
            if Some(n) == unsure && !closed {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match look {
            Ok(n) => return Ok((n, closed)),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(Refusal::Closed),
        }
    }
}

/// The bytes the socket holds, left in it; `WouldBlock` when none.
fn peek(stream: &TcpStream, into: &mut [u8]) -> std::io::Result<usize> {
    use nix::sys::socket::{recv, MsgFlags};
    use std::os::fd::AsRawFd;
    let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    recv(stream.as_raw_fd(), into, flags).map_err(std::io::Error::from)
}

/// Moves `count` bytes already peeked from the socket into `consumed`.
async fn take(stream: &mut TcpStream, consumed: &mut Vec<u8>, count: usize) -> Result<(), Refusal> {
    let start = consumed.len();
    consumed.resize(start + count, 0);
    stream
        .read_exact(&mut consumed[start..])
        .await
        .map_err(|_| Refusal::Closed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        h.extend_from_slice(&(body.len() as u16).to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    const V4_BODY: &[u8] = &[192, 0, 2, 7, 10, 0, 0, 1, 0x30, 0x39, 0x1f, 0x90];

    #[test]
    fn headers_are_framed_by_their_own_length() {
        let line = b"PROXY TCP4 192.0.2.7 10.0.0.1 12345 8080\r\nGET / HTTP/1.1\r\n";
        assert_eq!(frame(line), Framed::Header(42));
        assert_eq!(frame(&line[..20]), Framed::Incomplete);
        assert_eq!(frame(b"PRO"), Framed::Incomplete);
        assert_eq!(frame(b"GET / HTTP/1.1\r\n"), Framed::Absent);
        assert_eq!(frame(b"\x16\x03\x01"), Framed::Absent);
        assert_eq!(frame(&[b'P'; 200]), Framed::Absent);
        let long = [b"PROXY ".as_slice(), &[b'1'; 120]].concat();
        assert_eq!(frame(&long), Framed::Malformed);
        let mut binary = v2(1, 0x11, V4_BODY);
        assert_eq!(frame(&binary), Framed::Header(28));
        assert_eq!(frame(&binary[..15]), Framed::Incomplete);
        assert_eq!(frame(&binary[..20]), Framed::Incomplete);
        binary[14..16].copy_from_slice(&((V2_MAX - V2_FIXED) as u16 + 1).to_be_bytes());
        assert_eq!(frame(&binary), Framed::Malformed);
        let mut largest = v2(1, 0x11, &[0; V2_MAX - V2_FIXED]);
        assert_eq!(frame(&largest), Framed::Header(V2_MAX));
        largest.push(0);
        assert_eq!(frame(&largest), Framed::Header(V2_MAX));
    }

    #[test]
    fn headers_tell_the_client_and_the_address_it_reached() {
        let told = decode(b"PROXY TCP4 192.0.2.7 10.0.0.1 12345 8080\r\n", Accept::Any);
        let expect = Some((
            "192.0.2.7:12345".parse().expect("addr"),
            "10.0.0.1:8080".parse().expect("addr"),
        ));
        assert_eq!(told, Ok(expect));
        assert_eq!(decode(&v2(1, 0x11, V4_BODY), Accept::Any), Ok(expect));
        assert_eq!(decode(&v2(1, 0x11, V4_BODY), Accept::V2), Ok(expect));
        let six = decode(b"PROXY TCP6 2001:db8::7 ::1 1 2\r\n", Accept::V1);
        assert_eq!(
            six,
            Ok(Some((
                "[2001:db8::7]:1".parse().expect("addr"),
                "[::1]:2".parse().expect("addr")
            )))
        );
        // A sender on a dual-stack socket writes its IPv4 client as IPv6.
        let mapped = decode(
            b"PROXY TCP6 ::ffff:192.0.2.7 ::ffff:10.0.0.1 12345 8080\r\n",
            Accept::V1,
        );
        assert_eq!(mapped, Ok(expect));
    }

    #[test]
    fn local_and_unknown_keep_the_socket_addresses() {
        assert_eq!(decode(&v2(0, 0x00, &[]), Accept::Any), Ok(None));
        assert_eq!(decode(&v2(0, 0x11, V4_BODY), Accept::Any), Ok(None));
        // LOCAL's family is ignored, and its block may be shorter than the
        // family's (or absent): HAProxy takes these as well.
        assert_eq!(decode(&v2(0, 0x11, &[]), Accept::Any), Ok(None));
        assert_eq!(decode(&v2(0, 0x21, &V4_BODY[..4]), Accept::Any), Ok(None));
        assert_eq!(decode(&v2(0, 0x11, &[]), Accept::V1), Err(Refusal::Version));
        assert_eq!(decode(b"PROXY UNKNOWN\r\n", Accept::Any), Ok(None));
        // Whatever follows UNKNOWN is ignored, however many fields.
        let long = b"PROXY UNKNOWN ffff::1 ffff::2 65535 65535 and more\r\n";
        assert_eq!(decode(long, Accept::Any), Ok(None));
        let glued = b"PROXY UNKNOWNX 1.2.3.4 5.6.7.8 1 2\r\n";
        assert_eq!(decode(glued, Accept::Any), Err(Refusal::Malformed));
    }

    #[test]
    fn wrong_versions_and_broken_headers_are_refused() {
        assert_eq!(
            decode(&v2(1, 0x11, V4_BODY), Accept::V1),
            Err(Refusal::Version)
        );
        assert_eq!(
            decode(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", Accept::V2),
            Err(Refusal::Version)
        );
        for bad in [
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n".as_slice(),
            b"PROXY TCP4 1.2.3.999 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 ::1 ::1 1 2\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n",
            "PROXY TCP4 ɱŔ 1.2.3.4 1 2\r\n".as_bytes(),
        ] {
            assert_eq!(
                decode(bad, Accept::Any),
                Err(Refusal::Malformed),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Too short for its family, a datagram, an unknown command.
        assert_eq!(
            decode(&v2(1, 0x11, &V4_BODY[..8]), Accept::Any),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            decode(&v2(1, 0x12, V4_BODY), Accept::Any),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            decode(&v2(7, 0x11, V4_BODY), Accept::Any),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn tlvs_must_fit_the_header() {
        let noop = [V4_BODY, &[0x04, 0, 2, 0, 0]].concat();
        assert!(matches!(
            decode(&v2(1, 0x11, &noop), Accept::Any),
            Ok(Some(_))
        ));
        for tlvs in [&[0x04, 0, 10, 0, 0][..], &[0x04, 0][..]] {
            let body = [V4_BODY, tlvs].concat();
            assert_eq!(
                decode(&v2(1, 0x11, &body), Accept::Any),
                Err(Refusal::Malformed),
                "{tlvs:?}"
            );
        }
    }

    #[test]
    fn a_crc32c_tlv_must_match_the_header() {
        assert_eq!(
            crc32c(&[b"1234", b"56789"]),
            0xE306_9283,
            "the standard check value"
        );
        let noop = [0x04, 0, 1, 0x5A];
        let with_crc = |crc: u32| {
            let tlvs = [&noop[..], &[0x03, 0, 4], &crc.to_be_bytes()].concat();
            v2(1, 0x11, &[V4_BODY, &tlvs].concat())
        };
        let right = crc32c(&[&with_crc(0)]);
        assert!(matches!(decode(&with_crc(right), Accept::Any), Ok(Some(_))));
        assert_eq!(
            decode(&with_crc(right ^ 1), Accept::Any),
            Err(Refusal::Malformed)
        );
        let short = v2(1, 0x11, &[V4_BODY, &[0x03, 0, 2, 0, 0]].concat());
        assert_eq!(decode(&short, Accept::Any), Err(Refusal::Malformed));
    }

    /// A client's end of a loopback connection, and baton's.
    async fn connected() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (client, server)
    }

    #[tokio::test]
    async fn a_partial_prefix_and_then_a_close_is_closed_at_once() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server) = connected().await;
        client.write_all(b"PRO").await.expect("write");
        client.shutdown().await.expect("half-close");
        let mut consumed = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            read_header(&mut server, &mut consumed),
        )
        .await;
        assert_eq!(
            read,
            Ok(Err(Refusal::Closed)),
            "not looked at until the timeout"
        );
        // Nothing at all, then a close: told apart (an optional header's
        // listener serves it).
        let (mut client, mut server) = connected().await;
        client.shutdown().await.expect("half-close");
        let read = read_header(&mut server, &mut Vec::new()).await;
        assert_eq!(read, Ok(Looked::Silent));
    }

    /// A peer that resets before its first byte is gone (`closed`), not a
    /// quiet close an optional header's listener serves: the kernel
    /// reports the reset once, to the first look.
    #[tokio::test]
    async fn a_reset_before_the_first_byte_is_closed() {
        let (client, mut server) = connected().await;
        let peer = server.peer_addr().expect("peer");
        let settings = ReceiveSettings {
            accept: Accept::Any,
            trusted: vec!["127.0.0.0/8".parse().expect("block")],
            required: false,
            timeout: std::time::Duration::from_secs(5),
        };
        socket2::SockRef::from(&client)
            .set_linger(Some(std::time::Duration::ZERO))
            .expect("linger 0: a reset at close");
        drop(client);
        let origin = Origin {
            client: peer,
            local: None,
        };
        let received = receive(&mut server, origin, &settings, std::future::pending()).await;
        assert!(matches!(received, Err(Refusal::Closed)), "{received:?}");
    }

    /// Counts its wake-ups.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_partial_prefix_waits_for_more_bytes_not_on_a_timer() {
        use std::future::Future;
        use std::time::Duration;
        use tokio::io::AsyncWriteExt;

        let (mut client, mut server) = connected().await;
        let header = v2(1, 0x11, V4_BODY);
        client.write_all(&header[..4]).await.expect("write");
        tokio::time::sleep(Duration::from_millis(50)).await;

        let wakes = std::sync::Arc::new(Wakes(0.into()));
        let waker = std::task::Waker::from(std::sync::Arc::clone(&wakes));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut consumed = Vec::new();
        let mut reading = Box::pin(read_header(&mut server, &mut consumed));
        assert!(reading.as_mut().poll(&mut cx).is_pending());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let count = || wakes.0.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(count(), 0, "nothing came, nothing looked again");

        client.write_all(&header[4..]).await.expect("write");
        let read = loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let std::task::Poll::Ready(read) = reading.as_mut().poll(&mut cx) {
                break read;
            }
        };
        assert!(count() >= 1, "woken by the bytes");
        assert_eq!(read, Ok(Looked::Header(header)));
    }
}
