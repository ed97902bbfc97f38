//! h2 frames (RFC 9113 §4 and §6): what a client sends, cut from the bytes
//! read and checked against the rules each frame type has, and what baton
//! writes back. Data and header fragments are views of the bytes read.

use bytes::{Buf, Bytes, BytesMut};

/// What a client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame's head: length (24 bits), type, flags, stream (31 bits).
pub const HEAD_LEN: usize = 9;
/// The largest frame payload either side takes until told otherwise.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;
/// The largest a flow-control window may grow.
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

/// An error code (RFC 9113 §7), in RST_STREAM and GOAWAY frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub u32);

impl Reason {
    pub const NO_ERROR: Reason = Reason(0x0);
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    pub const CANCEL: Reason = Reason(0x8);
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
}

/// A frame that breaks the protocol: the whole connection ends (GOAWAY
/// with the reason), or only the stream named (RST_STREAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("h2 connection error {0:?}: {1}")]
    Connection(Reason, &'static str),
    #[error("h2 stream {0} error {1:?}: {2}")]
    Stream(u32, Reason, &'static str),
}

fn connection_error(reason: Reason, why: &'static str) -> FrameError {
    FrameError::Connection(reason, why)
}

fn protocol(why: &'static str) -> FrameError {
    FrameError::Connection(Reason::PROTOCOL_ERROR, why)
}

fn frame_size(why: &'static str) -> FrameError {
    FrameError::Connection(Reason::FRAME_SIZE_ERROR, why)
}

/// The settings a client may send (RFC 9113 §6.5.2); those it left out
/// are `None`, unknown ones are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub header_table_size: Option<u32>,
    pub max_concurrent_streams: Option<u32>,
    pub initial_window_size: Option<u32>,
    pub max_frame_size: Option<u32>,
    pub max_header_list_size: Option<u32>,
}

/// One frame read from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `flow` is what it counts against the windows: its whole payload,
    /// padding included (RFC 9113 §6.9.1).
    Data {
        stream: u32,
        data: Bytes,
        flow: u32,
        end_stream: bool,
    },
    /// The first piece of a header block (padding and priority taken off).
    Headers {
        stream: u32,
        fragment: Bytes,
        end_stream: bool,
        end_headers: bool,
    },
    Continuation {
        stream: u32,
        fragment: Bytes,
        end_headers: bool,
    },
    /// Priorities are advice baton does not take.
    Priority,
    Reset {
        stream: u32,
        reason: Reason,
    },
    Settings(Settings),
    SettingsAck,
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        reason: Reason,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    /// A type RFC 9113 does not define: ignored (§4.1), except inside a
    /// header block, which the connection checks.
    Unknown {
        stream: u32,
    },
}

/// Cuts the next frame off `buf` once all of it is there (`Ok(None)`
/// until then). A frame longer than `max_frame` (the SETTINGS_MAX_FRAME_SIZE
/// baton announced) is refused from its head, before it is read.
pub fn next(buf: &mut BytesMut, max_frame: u32) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEAD_LEN {
        return Ok(None);
    }
    let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]);
    if len > max_frame {
        return Err(frame_size("frame longer than SETTINGS_MAX_FRAME_SIZE"));
    }
    let whole = HEAD_LEN + len as usize;
    if buf.len() < whole {
        return Ok(None);
    }
    let kind = buf[3];
    let flags = buf[4];
    let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & MAX_WINDOW;
    let mut payload = buf.split_to(whole).freeze();
    payload.advance(HEAD_LEN);
    parse(kind, flags, stream, payload).map(Some)
}

fn parse(kind: u8, flags: u8, stream: u32, payload: Bytes) -> Result<Frame, FrameError> {
    let on_stream = |name: &'static str| {
        if stream == 0 {
            Err(protocol(name))
        } else {
            Ok(())
        }
    };
    let on_connection = |name: &'static str| {
        if stream != 0 {
            Err(protocol(name))
        } else {
            Ok(())
        }
    };
    match kind {
        DATA => {
            on_stream("DATA on stream 0")?;
            let flow = payload.len() as u32;
            let data = unpad(payload, flags)?;
            Ok(Frame::Data {
                stream,
                data,
                flow,
                end_stream: flags & END_STREAM != 0,
            })
        }
        HEADERS => {
            on_stream("HEADERS on stream 0")?;
            let mut fragment = unpad(payload, flags)?;
            if flags & PRIORITY_FLAG != 0 {
                // A stream error here would leave the header block
                // undecoded, and the HPACK table out of step with the
                // client's: the whole connection ends instead.
                take_priority(&mut fragment, stream).map_err(|err| match err {
                    FrameError::Stream(..) => protocol("HEADERS priority invalid"),
                    cut => cut,
                })?;
            }
            Ok(Frame::Headers {
                stream,
                fragment,
                end_stream: flags & END_STREAM != 0,
                end_headers: flags & END_HEADERS != 0,
            })
        }
        PRIORITY => {
            on_stream("PRIORITY on stream 0")?;
            let mut fields = payload;
            if fields.len() != 5 {
                let why = "PRIORITY frame not 5 bytes long";
                return Err(FrameError::Stream(stream, Reason::FRAME_SIZE_ERROR, why));
            }
            take_priority(&mut fields, stream)?;
            Ok(Frame::Priority)
        }
        RST_STREAM => {
            on_stream("RST_STREAM on stream 0")?;
            let code = four(&payload, "RST_STREAM frame not 4 bytes long")?;
            Ok(Frame::Reset {
                stream,
                reason: Reason(code),
            })
        }
        SETTINGS => {
            on_connection("SETTINGS on a stream")?;
            if flags & ACK != 0 {
                if !payload.is_empty() {
                    return Err(frame_size("SETTINGS acknowledgement with a payload"));
                }
                return Ok(Frame::SettingsAck);
            }
            settings(&payload).map(Frame::Settings)
        }
        PUSH_PROMISE => Err(protocol("PUSH_PROMISE from a client")),
        PING => {
            on_connection("PING on a stream")?;
            let payload: [u8; 8] = payload[..]
                .try_into()
                .map_err(|_| frame_size("PING frame not 8 bytes long"))?;
            Ok(Frame::Ping {
                ack: flags & ACK != 0,
                payload,
            })
        }
        GOAWAY => {
            on_connection("GOAWAY on a stream")?;
            if payload.len() < 8 {
                return Err(frame_size("GOAWAY frame shorter than 8 bytes"));
            }
            let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
            let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
            Ok(Frame::GoAway {
                last_stream: last & MAX_WINDOW,
                reason: Reason(code),
            })
        }
        WINDOW_UPDATE => {
            let increment = four(&payload, "WINDOW_UPDATE frame not 4 bytes long")? & MAX_WINDOW;
            match (increment, stream) {
                (0, 0) => Err(protocol("WINDOW_UPDATE of 0 for the connection")),
                (0, _) => Err(FrameError::Stream(
                    stream,
                    Reason::PROTOCOL_ERROR,
                    "WINDOW_UPDATE of 0",
                )),
                _ => Ok(Frame::WindowUpdate { stream, increment }),
            }
        }
        CONTINUATION => {
            on_stream("CONTINUATION on stream 0")?;
            Ok(Frame::Continuation {
                stream,
                fragment: payload,
                end_headers: flags & END_HEADERS != 0,
            })
        }
        _ => Ok(Frame::Unknown { stream }),
    }
}

/// A payload without its padding (RFC 9113 §6.1): a pad length at least
/// the rest of the payload is a protocol error.
fn unpad(mut payload: Bytes, flags: u8) -> Result<Bytes, FrameError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let Some(&pad) = payload.first() else {
        return Err(frame_size("padded frame without its pad length"));
    };
    let pad = usize::from(pad);
    if pad >= payload.len() {
        return Err(protocol("padding as long as the frame"));
    }
    payload.advance(1);
    payload.truncate(payload.len() - pad);
    Ok(payload)
}

/// Takes a priority's 5 bytes off the front; a stream may not depend on
/// itself (RFC 9113 §5.3.1).
fn take_priority(fragment: &mut Bytes, stream: u32) -> Result<(), FrameError> {
    if fragment.len() < 5 {
        return Err(frame_size("priority fields cut short"));
    }
    let on = u32::from_be_bytes([fragment[0], fragment[1], fragment[2], fragment[3]]) & MAX_WINDOW;
    fragment.advance(5);
    if on == stream {
        let why = "stream depends on itself";
        return Err(FrameError::Stream(stream, Reason::PROTOCOL_ERROR, why));
    }
    Ok(())
}

fn four(payload: &[u8], why: &'static str) -> Result<u32, FrameError> {
    let bytes: [u8; 4] = payload.try_into().map_err(|_| frame_size(why))?;
    Ok(u32::from_be_bytes(bytes))
}

fn settings(payload: &[u8]) -> Result<Settings, FrameError> {
    if !payload.len().is_multiple_of(6) {
        return Err(frame_size("SETTINGS payload not a multiple of 6 bytes"));
    }
    let mut told = Settings::default();
    for entry in payload.chunks_exact(6) {
        let id = u16::from_be_bytes([entry[0], entry[1]]);
        let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
        match id {
            0x1 => told.header_table_size = Some(value),
            // ENABLE_PUSH and ENABLE_CONNECT_PROTOCOL: baton pushes
            // nothing and takes no extended CONNECT, but either is 0 or 1.
            0x2 | 0x8 if value > 1 => return Err(protocol("SETTINGS flag neither 0 nor 1")),
            0x3 => told.max_concurrent_streams = Some(value),
            0x4 if value > MAX_WINDOW => {
                let why = "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1";
                return Err(connection_error(Reason::FLOW_CONTROL_ERROR, why));
            }
            0x4 => told.initial_window_size = Some(value),
            0x5 if !(DEFAULT_MAX_FRAME..=(1 << 24) - 1).contains(&value) => {
                return Err(protocol("SETTINGS_MAX_FRAME_SIZE out of range"));
            }
            0x5 => told.max_frame_size = Some(value),
            0x6 => told.max_header_list_size = Some(value),
            _ => {}
        }
    }
    Ok(told)
}

/// Writes frames into `out`, the connection's outgoing bytes.
pub mod write {
    use super::*;

    fn head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
        let len = (len as u32).to_be_bytes();
        out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
    }

    /// SETTINGS with `(identifier, value)` pairs.
    pub fn settings(out: &mut Vec<u8>, values: &[(u16, u32)]) {
        head(out, values.len() * 6, SETTINGS, 0, 0);
        for (id, value) in values {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&value.to_be_bytes());
        }
    }

    pub fn settings_ack(out: &mut Vec<u8>) {
        head(out, 0, SETTINGS, ACK, 0);
    }

    pub fn ping(out: &mut Vec<u8>, payload: [u8; 8], ack: bool) {
        head(out, 8, PING, if ack { ACK } else { 0 }, 0);
        out.extend_from_slice(&payload);
    }

    pub fn window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
        head(out, 4, WINDOW_UPDATE, 0, stream);
        out.extend_from_slice(&increment.to_be_bytes());
    }

    pub fn reset(out: &mut Vec<u8>, stream: u32, reason: Reason) {
        head(out, 4, RST_STREAM, 0, stream);
        out.extend_from_slice(&reason.0.to_be_bytes());
    }

    pub fn goaway(out: &mut Vec<u8>, last_stream: u32, reason: Reason) {
        head(out, 8, GOAWAY, 0, 0);
        out.extend_from_slice(&last_stream.to_be_bytes());
        out.extend_from_slice(&reason.0.to_be_bytes());
    }

    /// A header block as HEADERS and as many CONTINUATIONs as
    /// `max_frame` (the client's SETTINGS_MAX_FRAME_SIZE) needs.
    pub fn headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool, max_frame: u32) {
        let mut pieces = block.chunks((max_frame as usize).max(1)).peekable();
        let first = pieces.next().unwrap_or(&[]);
        let mut kind = HEADERS;
        let mut flags = if end_stream { END_STREAM } else { 0 };
        let mut piece = first;
        loop {
            let last = pieces.peek().is_none();
            if last {
                flags |= END_HEADERS;
            }
            head(out, piece.len(), kind, flags, stream);
            out.extend_from_slice(piece);
            match pieces.next() {
                Some(next) => piece = next,
                None => return,
            }
            kind = CONTINUATION;
            flags = 0;
        }
    }

    /// A DATA frame's head: its `len` bytes of data follow it.
    pub fn data_head(out: &mut Vec<u8>, stream: u32, len: usize, end_stream: bool) {
        head(
            out,
            len,
            DATA,
            if end_stream { END_STREAM } else { 0 },
            stream,
        );
    }
}

/// What a client sent, as its connection acts on it: a frame, or a header
/// block put back together from its HEADERS and CONTINUATION frames.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    Frame(Frame),
    Block(HeaderBlock),
}

/// A header block whole: a request's head (or its trailers).
#[derive(Debug, PartialEq, Eq)]
pub struct HeaderBlock {
    pub stream: u32,
    pub block: Bytes,
    pub end_stream: bool,
}

/// Reads a client's frames from the bytes it sent, header blocks whole.
#[derive(Debug)]
pub struct Reader {
    /// SETTINGS_MAX_FRAME_SIZE, as baton announced it.
    max_frame: u32,
    /// The most a header block may take, compressed.
    max_block: usize,
    pending: Option<PendingBlock>,
}

impl Reader {
    pub fn new(max_frame: u32, max_block: usize) -> Reader {
        Reader {
            max_frame,
            max_block,
            pending: None,
        }
    }

    /// The next frame or header block once all of it is in `buf`.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Inbound>, FrameError> {
        loop {
            let frame = match next(buf, self.max_frame) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(None),
                // Inside a header block any frame but its CONTINUATION is
                // a connection error (RFC 9113 §6.10), a faulty one too:
                // resetting the stream it names would let the block go on.
                Err(FrameError::Stream(..)) if self.pending.is_some() => {
                    return Err(protocol(
                        "a frame other than CONTINUATION inside a header block",
                    ))
                }
                Err(err) => return Err(err),
            };
            let assembled = match (self.pending.take(), frame) {
                (Some(pending), frame) => pending.extend(frame, self.max_block)?,
                (
                    None,
                    Frame::Headers {
                        stream,
                        fragment,
                        end_stream,
                        end_headers,
                    },
                ) => PendingBlock::start(stream, fragment, end_stream, end_headers),
                (None, frame) => return Ok(Some(Inbound::Frame(frame))),
            };
            match assembled {
                Assembled::Partial(pending) => self.pending = Some(pending),
                Assembled::Whole(block) => return Ok(Some(Inbound::Block(block))),
            }
        }
    }

    /// Whether a header block has begun and not ended: bytes cut off
    /// there are a client that went away mid-head.
    pub fn inside_block(&self) -> bool {
        self.pending.is_some()
    }
}

/// Where a header block stands after a frame.
#[derive(Debug, PartialEq, Eq)]
enum Assembled {
    Whole(HeaderBlock),
    /// CONTINUATIONs are still to come.
    Partial(PendingBlock),
}

/// A header block being put back together (RFC 9113 §4.3): nothing else
/// may come between its frames, and the whole is bounded, in bytes and in
/// frames (a client could otherwise send CONTINUATIONs for ever: empty
/// ones cost it nine bytes each and baton a frame's work, the 2024
/// "CONTINUATION flood").
#[derive(Debug, PartialEq, Eq)]
struct PendingBlock {
    stream: u32,
    end_stream: bool,
    block: BytesMut,
    /// CONTINUATION frames taken so far.
    continuations: usize,
}

/// CONTINUATIONs one header block may take, fixed: the largest block baton
/// takes today (`max_block`, 128 KiB) in frames of 4 KiB, a quarter of the
/// smallest frame size a peer may send (nghttp2 takes 8 by default).
const MAX_CONTINUATIONS: usize = 32;

impl PendingBlock {
    /// Starts a block with a HEADERS frame's fragment.
    fn start(stream: u32, fragment: Bytes, end_stream: bool, end_headers: bool) -> Assembled {
        if end_headers {
            return Assembled::Whole(HeaderBlock {
                stream,
                block: fragment,
                end_stream,
            });
        }
        Assembled::Partial(PendingBlock {
            stream,
            end_stream,
            block: BytesMut::from(&fragment[..]),
            continuations: 0,
        })
    }

    /// Adds the frame that came next; anything but a CONTINUATION of the
    /// same stream, or a block past `max_block` bytes, ends the connection.
    fn extend(mut self, frame: Frame, max_block: usize) -> Result<Assembled, FrameError> {
        let Frame::Continuation {
            stream,
            fragment,
            end_headers,
        } = frame
        else {
            return Err(protocol(
                "a frame other than CONTINUATION inside a header block",
            ));
        };
        if stream != self.stream {
            return Err(protocol(
                "CONTINUATION of another stream inside a header block",
            ));
        }
        if self.block.len() + fragment.len() > max_block {
            let why = "header block larger than SETTINGS_MAX_HEADER_LIST_SIZE";
            return Err(connection_error(Reason::ENHANCE_YOUR_CALM, why));
        }
        self.continuations += 1;
        if self.continuations > MAX_CONTINUATIONS {
            let why = "header block in more CONTINUATION frames than any client needs";
            return Err(connection_error(Reason::ENHANCE_YOUR_CALM, why));
        }
        self.block.extend_from_slice(&fragment);
        if !end_headers {
            return Ok(Assembled::Partial(self));
        }
        Ok(Assembled::Whole(HeaderBlock {
            stream: self.stream,
            block: self.block.freeze(),
            end_stream: self.end_stream,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> BytesMut {
        let mut out = Vec::new();
        let len = (payload.len() as u32).to_be_bytes();
        out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        BytesMut::from(&out[..])
    }

    fn one(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<Frame, FrameError> {
        let mut buf = raw(kind, flags, stream, payload);
        let frame = next(&mut buf, DEFAULT_MAX_FRAME).map(|f| f.expect("whole"));
        assert!(buf.is_empty() || frame.is_err());
        frame
    }

    fn reason(result: Result<Frame, FrameError>) -> Reason {
        match result {
            Err(FrameError::Connection(reason, _) | FrameError::Stream(_, reason, _)) => reason,
            Ok(frame) => panic!("accepted: {frame:?}"),
        }
    }

    #[test]
    fn a_frame_waits_for_all_its_bytes() {
        let whole = raw(DATA, END_STREAM, 1, b"hello");
        let mut buf = BytesMut::new();
        for (i, byte) in whole.iter().enumerate() {
            buf.extend_from_slice(&[*byte]);
            let frame = next(&mut buf, DEFAULT_MAX_FRAME).expect("valid");
            assert_eq!(frame.is_some(), i == whole.len() - 1);
            if let Some(frame) = frame {
                let data = Bytes::from_static(b"hello");
                let flow = 5;
                let want = Frame::Data {
                    stream: 1,
                    data,
                    flow,
                    end_stream: true,
                };
                assert_eq!(frame, want);
            }
        }
    }

    #[test]
    fn padding_and_priority_are_taken_off() {
        // Pad length 2, priority (depends on 3, weight 16), "ab", padding.
        let payload = [2, 0, 0, 0, 3, 16, b'a', b'b', 0, 0];
        let frame = one(HEADERS, PADDED | PRIORITY_FLAG | END_HEADERS, 1, &payload);
        let want = Frame::Headers {
            stream: 1,
            fragment: Bytes::from_static(b"ab"),
            end_stream: false,
            end_headers: true,
        };
        assert_eq!(frame, Ok(want));
        let Ok(Frame::Data { data, flow, .. }) = one(DATA, PADDED, 1, &[1, b'x', 0]) else {
            panic!("padded DATA");
        };
        assert_eq!((&data[..], flow), (&b"x"[..], 3));
    }

    #[test]
    fn frames_that_break_the_rules_are_refused_with_their_reason() {
        let protocol = Reason::PROTOCOL_ERROR;
        let size = Reason::FRAME_SIZE_ERROR;
        assert_eq!(reason(one(DATA, 0, 0, b"x")), protocol);
        assert_eq!(reason(one(DATA, PADDED, 1, &[2, 0])), protocol);
        assert_eq!(reason(one(DATA, PADDED, 1, &[])), size);
        assert_eq!(reason(one(HEADERS, PRIORITY_FLAG, 1, &[0, 0])), size);
        assert_eq!(
            one(PRIORITY, 0, 3, &[0, 0, 0, 3, 16]),
            Err(FrameError::Stream(3, protocol, "stream depends on itself"))
        );
        assert_eq!(
            one(HEADERS, PRIORITY_FLAG, 3, &[0, 0, 0, 3, 16]),
            Err(FrameError::Connection(protocol, "HEADERS priority invalid"))
        );
        assert_eq!(reason(one(PRIORITY, 0, 1, &[0; 4])), size);
        assert_eq!(reason(one(RST_STREAM, 0, 1, &[0; 3])), size);
        assert_eq!(reason(one(RST_STREAM, 0, 0, &[0; 4])), protocol);
        assert_eq!(reason(one(SETTINGS, 0, 1, &[])), protocol);
        assert_eq!(reason(one(SETTINGS, ACK, 0, &[0; 6])), size);
        assert_eq!(reason(one(SETTINGS, 0, 0, &[0; 5])), size);
        assert_eq!(reason(one(SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 2])), protocol);
        let big_window = [0, 4, 0x80, 0, 0, 0];
        assert_eq!(
            reason(one(SETTINGS, 0, 0, &big_window)),
            Reason::FLOW_CONTROL_ERROR
        );
        assert_eq!(
            reason(one(SETTINGS, 0, 0, &[0, 5, 0, 0, 0x3f, 0xff])),
            protocol
        );
        assert_eq!(reason(one(PUSH_PROMISE, 0, 1, &[0; 4])), protocol);
        assert_eq!(reason(one(PING, 0, 0, &[0; 7])), size);
        assert_eq!(reason(one(PING, 0, 1, &[0; 8])), protocol);
        assert_eq!(reason(one(GOAWAY, 0, 0, &[0; 7])), size);
        assert_eq!(reason(one(WINDOW_UPDATE, 0, 0, &[0; 4])), protocol);
        assert_eq!(
            one(WINDOW_UPDATE, 0, 5, &[0; 4]),
            Err(FrameError::Stream(5, protocol, "WINDOW_UPDATE of 0"))
        );
        assert_eq!(reason(one(CONTINUATION, 0, 0, b"x")), protocol);
        // Refused from its head: 16 KiB and one byte, none of it sent.
        let mut head = raw(DATA, 0, 1, &[]);
        head[0..3].copy_from_slice(&[0, 0x40, 0x01]);
        assert_eq!(
            reason(next(&mut head, DEFAULT_MAX_FRAME).map(Option::unwrap)),
            size
        );
    }

    #[test]
    fn settings_are_read_and_unknown_ones_ignored() {
        let payload = [
            0, 1, 0, 0, 0x10, 0, // header table 4096
            0, 3, 0, 0, 0, 100, // 100 streams
            0, 4, 0, 1, 0, 0, // window 65536
            0, 5, 0, 0, 0x40, 0, // frame 16384
            0, 6, 0, 0, 0x20, 0, // list 8192
            0x12, 0x34, 0, 0, 0, 9, // unknown
        ];
        let want = Settings {
            header_table_size: Some(4096),
            max_concurrent_streams: Some(100),
            initial_window_size: Some(65536),
            max_frame_size: Some(16384),
            max_header_list_size: Some(8192),
        };
        assert_eq!(one(SETTINGS, 0, 0, &payload), Ok(Frame::Settings(want)));
        assert_eq!(
            one(0xfa, 0, 7, b"whatever"),
            Ok(Frame::Unknown { stream: 7 })
        );
    }

    #[test]
    fn written_frames_read_back() {
        let mut out = Vec::new();
        write::settings(&mut out, &[(3, 100), (4, 65536)]);
        write::settings_ack(&mut out);
        write::ping(&mut out, *b"12345678", true);
        write::window_update(&mut out, 3, 1000);
        write::reset(&mut out, 3, Reason::CANCEL);
        write::goaway(&mut out, 7, Reason::NO_ERROR);
        write::data_head(&mut out, 3, 2, true);
        out.extend_from_slice(b"ok");
        let mut buf = BytesMut::from(&out[..]);
        let mut frames = Vec::new();
        while let Some(frame) = next(&mut buf, DEFAULT_MAX_FRAME).expect("valid") {
            frames.push(frame);
        }
        let settings = Settings {
            max_concurrent_streams: Some(100),
            initial_window_size: Some(65536),
            ..Settings::default()
        };
        let want = vec![
            Frame::Settings(settings),
            Frame::SettingsAck,
            Frame::Ping {
                ack: true,
                payload: *b"12345678",
            },
            Frame::WindowUpdate {
                stream: 3,
                increment: 1000,
            },
            Frame::Reset {
                stream: 3,
                reason: Reason::CANCEL,
            },
            Frame::GoAway {
                last_stream: 7,
                reason: Reason::NO_ERROR,
            },
            Frame::Data {
                stream: 3,
                data: Bytes::from_static(b"ok"),
                flow: 2,
                end_stream: true,
            },
        ];
        assert_eq!(frames, want);
    }

    /// A block longer than a frame goes out as HEADERS and CONTINUATIONs,
    /// and is read back whole, the frames after it as they came.
    #[test]
    fn a_long_header_block_is_split_and_put_back() {
        let block: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        write::headers(&mut out, 5, &block, true, DEFAULT_MAX_FRAME);
        write::ping(&mut out, [0; 8], false);
        let mut reader = Reader::new(DEFAULT_MAX_FRAME, 65_536);
        let mut buf = BytesMut::new();
        let mut read = Vec::new();
        let mut inside = false;
        for piece in out.chunks(1000) {
            buf.extend_from_slice(piece);
            while let Some(inbound) = reader.next(&mut buf).expect("valid") {
                read.push(inbound);
            }
            inside |= reader.inside_block();
        }
        let want = HeaderBlock {
            stream: 5,
            block: Bytes::from(block),
            end_stream: true,
        };
        let ping = Frame::Ping {
            ack: false,
            payload: [0; 8],
        };
        assert_eq!(read, [Inbound::Block(want), Inbound::Frame(ping)]);
        assert!(buf.is_empty() && inside && !reader.inside_block());
    }

    #[test]
    fn a_header_block_is_interrupted_by_nothing_and_bounded() {
        let pending = || match PendingBlock::start(1, Bytes::from_static(b"ab"), false, false) {
            Assembled::Partial(pending) => pending,
            whole => panic!("{whole:?}"),
        };
        let continuation = |stream, len| Frame::Continuation {
            stream,
            fragment: Bytes::from(vec![0; len]),
            end_headers: false,
        };
        let refused =
            |result: Result<Assembled, FrameError>| reason(result.map(|_| Frame::Priority));
        assert_eq!(
            refused(pending().extend(Frame::Priority, 100)),
            Reason::PROTOCOL_ERROR
        );
        assert_eq!(
            refused(pending().extend(continuation(3, 1), 100)),
            Reason::PROTOCOL_ERROR
        );
        assert_eq!(
            refused(pending().extend(continuation(1, 99), 100)),
            Reason::ENHANCE_YOUR_CALM
        );
        assert!(matches!(
            pending().extend(continuation(1, 98), 100),
            Ok(Assembled::Partial(_))
        ));
        // Empty CONTINUATIONs, which the size bound never stops.
        let mut block = pending();
        for _ in 0..MAX_CONTINUATIONS {
            block = match block.extend(continuation(1, 0), 100) {
                Ok(Assembled::Partial(more)) => more,
                other => panic!("{other:?}"),
            };
        }
        assert_eq!(
            refused(block.extend(continuation(1, 0), 100)),
            Reason::ENHANCE_YOUR_CALM
        );
    }

    /// A faulty frame inside a header block (one that alone would reset
    /// the stream it names) ends the connection: the block cannot go on.
    #[test]
    fn a_faulty_frame_inside_a_header_block_ends_the_connection() {
        let faulty = [
            raw(WINDOW_UPDATE, 0, 1, &[0; 4]),
            raw(PRIORITY, 0, 1, &[0, 0, 0, 1, 16]),
        ];
        for frame in faulty {
            let mut reader = Reader::new(DEFAULT_MAX_FRAME, 1 << 16);
            let mut buf = BytesMut::from(&raw(HEADERS, 0, 3, b"ab")[..]);
            assert_eq!(reader.next(&mut buf), Ok(None), "the block begun");
            buf.extend_from_slice(&frame);
            buf.extend_from_slice(&raw(CONTINUATION, END_HEADERS, 3, b"cd"));
            assert!(
                matches!(
                    reader.next(&mut buf),
                    Err(FrameError::Connection(Reason::PROTOCOL_ERROR, _))
                ),
                "{frame:?}"
            );
        }
        // Outside a block, the same frame resets its stream alone.
        let mut reader = Reader::new(DEFAULT_MAX_FRAME, 1 << 16);
        let mut buf = BytesMut::from(&raw(WINDOW_UPDATE, 0, 1, &[0; 4])[..]);
        assert!(matches!(
            reader.next(&mut buf),
            Err(FrameError::Stream(1, Reason::PROTOCOL_ERROR, _))
        ));
    }
}
