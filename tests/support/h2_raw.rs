//! An h2c client written frame by frame, for what hyper's client does not
//! let a test do: take a response at the TCP level slowly while sending
//! frames of its own, as a real client on a slow link does.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const RST_STREAM: u8 = 3;
const PING: u8 = 6;
/// A PING's flag for an answer.
const ACK: u8 = 1;
/// RST_STREAM's code for a stream the client no longer wants.
const CANCEL: u32 = 8;
/// The largest flow-control window h2 allows.
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// A frame of `kind` on `stream` with `flags` and `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A client's opening: the preface and an empty SETTINGS.
pub fn opening() -> Vec<u8> {
    [PREFACE.to_vec(), frame(4, 0, 0, &[])].concat()
}

/// Connected to `addr` with a 16 KiB receive buffer, h2 opened with the
/// largest windows: flow control never holds the server back, the socket
/// does (the client's pace is the kernel's).
pub async fn small_window_reader(addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(16 << 10).expect("SO_RCVBUF");
    let mut s = socket.connect(addr).await.expect("connect");
    let mut settings = 4u16.to_be_bytes().to_vec();
    settings.extend_from_slice(&MAX_WINDOW.to_be_bytes());
    let opening = [
        PREFACE.to_vec(),
        frame(4, 0, 0, &settings),
        frame(8, 0, 0, &(MAX_WINDOW - 65_535).to_be_bytes()),
    ]
    .concat();
    s.write_all(&opening).await.expect("opening");
    s
}

/// HEADERS for `GET path` on stream 1 (END_STREAM | END_HEADERS),
/// HPACK-coded with the static table and literals.
pub fn get(path: &str) -> Vec<u8> {
    get_on(1, path)
}

/// The same on `stream` (odd: a client's).
pub fn get_on(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x44, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x41, 1, b'x']);
    frame(1, 0x5, stream, &block)
}

/// HEADERS for `POST path` on `stream` (END_HEADERS only: a body follows).
pub fn post_on(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0x44, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x41, 1, b'x']);
    frame(1, 0x4, stream, &block)
}

/// HEADERS on `stream` carrying `fragment`, its block going on in
/// CONTINUATION frames (no END_HEADERS).
pub fn headers_begun(stream: u32, fragment: &[u8]) -> Vec<u8> {
    frame(1, 0, stream, fragment)
}

/// A CONTINUATION of a header block on `stream`, carrying `fragment`,
/// and not its last (no END_HEADERS).
pub fn continuation(stream: u32, fragment: &[u8]) -> Vec<u8> {
    frame(9, 0, stream, fragment)
}

/// DATA on `stream`, the body going on after it.
pub fn data_on(stream: u32, bytes: &[u8]) -> Vec<u8> {
    frame(DATA, 0, stream, bytes)
}

/// The last DATA on `stream` (END_STREAM): the body ends with it.
pub fn last_data_on(stream: u32, bytes: &[u8]) -> Vec<u8> {
    frame(DATA, 0x1, stream, bytes)
}

/// A PING (not an answer) with `payload`.
pub fn ping(payload: [u8; 8]) -> Vec<u8> {
    frame(PING, 0, 0, &payload)
}

/// RST_STREAM on `stream`: the client cancels it.
pub fn reset(stream: u32) -> Vec<u8> {
    reset_with(stream, CANCEL)
}

/// RST_STREAM on `stream` with the error `code` (0: NO_ERROR).
pub fn reset_with(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// Reads into `got` 16 KiB at a time, a little slower than loopback
/// carries it, sending a PING after each read until `size` bytes of stream
/// 1's data are in (the frames a client sends while it takes a response),
/// and answering the server's PINGs (so h2's graceful close can end as
/// soon as the last frame is written), until the server closes: `Ok` at
/// its FIN, the error if the connection was reset. `got` starts at a
/// frame's start.
pub async fn read_while_pinging(
    s: &mut TcpStream,
    got: &mut Vec<u8>,
    size: usize,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 << 10];
    let mut parsed = 0;
    loop {
        let n = tokio::time::timeout(super::TIMEOUT, s.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("no byte and no close in time"))??;
        if n == 0 {
            return Ok(());
        }
        got.extend_from_slice(&buf[..n]);
        while let Some((kind, flags, payload)) = frame_at(&got[parsed..]) {
            if kind == PING && flags & ACK == 0 {
                s.write_all(&frame(PING, ACK, 0, payload)).await?;
            }
            parsed += 9 + payload.len();
        }
        if data_of_stream_1(got) < size {
            s.write_all(&frame(PING, 0, 0, &[0; 8])).await?;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Sends a PING and reads until its answer: the server has read every
/// frame sent before it (h2 takes them in order), and what it sent before
/// the answer is in what this returns.
pub async fn round_trip(s: &mut TcpStream) -> Vec<u8> {
    const MARK: [u8; 8] = *b"rndtrip!";
    s.write_all(&frame(PING, 0, 0, &MARK)).await.expect("ping");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut parsed = 0;
    loop {
        let n = tokio::time::timeout(super::TIMEOUT, s.read(&mut buf))
            .await
            .expect("the PING answered in time")
            .expect("read");
        assert_ne!(n, 0, "closed before the PING's answer");
        got.extend_from_slice(&buf[..n]);
        while let Some((kind, flags, payload)) = frame_at(&got[parsed..]) {
            if kind == PING && flags & ACK != 0 && payload == MARK {
                return got;
            }
            parsed += 9 + payload.len();
        }
    }
}

/// The whole frame at the start of `bytes`, if it is in: its type, flags
/// and payload.
fn frame_at(bytes: &[u8]) -> Option<(u8, u8, &[u8])> {
    let header = bytes.get(..9)?;
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let payload = bytes.get(9..9 + len)?;
    Some((header[3], header[4], payload))
}

/// The DATA payload bytes on stream 1 in `bytes` (a server's frames,
/// from its SETTINGS on).
pub fn data_of_stream_1(bytes: &[u8]) -> usize {
    frames_of(bytes)
        .iter()
        .filter(|(kind, stream, _)| *kind == DATA && *stream == 1)
        .map(|(_, _, payload)| payload.len())
        .sum()
}

/// Whether the server's frames in `bytes` (from a frame's start) end
/// `stream`'s response: DATA or HEADERS with END_STREAM on it.
pub fn ends_stream(mut bytes: &[u8], stream: u32) -> bool {
    while let Some((kind, flags, payload)) = frame_at(bytes) {
        let on = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & MAX_WINDOW;
        if on == stream && (kind == DATA || kind == 1) && flags & 0x1 != 0 {
            return true;
        }
        bytes = &bytes[9 + payload.len()..];
    }
    false
}

/// The h2 frames in `bytes`, from a frame's start: (type, stream,
/// payload); a last frame not all in is cut where `bytes` end.
pub fn frames_of(mut bytes: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & MAX_WINDOW;
        let end = (9 + len).min(bytes.len());
        out.push((bytes[3], stream, bytes[9..end].to_vec()));
        bytes = &bytes[end..];
    }
    out
}
