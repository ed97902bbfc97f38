//! The chunked transfer coding (RFC 9112 §7.1): an incremental decoder that
//! validates every size line, extension and trailer as bytes arrive, and the
//! writers baton re-frames a body with. Sizes and extensions are read here
//! once and never forwarded raw, so a backend cannot read them another way.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

use super::head::MAX_FIELDS;
use crate::proxy::headers;

/// Longest chunk size line, extensions and CRLF included: room for any
/// legitimate extension, little for an attacker to park.
const MAX_LINE: usize = 4 * 1024;
/// Longest trailer section, final CRLF included.
const MAX_TRAILERS: usize = 16 * 1024;
/// Most hex digits in a chunk size: 16 fill a u64.
const MAX_SIZE_DIGITS: usize = 16;

/// Trailer fields that would change framing or routing if a next hop
/// merged them into the head: dropped, not forwarded (RFC 9110 §6.5.1),
/// whether the trailers came in HTTP/1 or in h2. `Trailer` itself only
/// means something in a head.
const DROPPED_TRAILERS: [&str; 4] = ["content-length", "transfer-encoding", "host", "trailer"];

/// Whether a trailer field named `name` goes on: not one of
/// `DROPPED_TRAILERS` nor a hop-by-hop one (`Connection: close` merged
/// late would end a kept connection, h2 refuses them anywhere), nor one
/// that says where a request came from or
/// names it (`headers::FORWARDING`, `X-Request-Id`): baton sets those in
/// the head, and a backend merging trailers would take a client's forgery.
/// Their `_` spellings too, as in a head.
pub fn trailer_forwarded(name: &[u8]) -> bool {
    let named = |list: &[&str]| list.iter().any(|d| name.eq_ignore_ascii_case(d.as_bytes()));
    !named(&DROPPED_TRAILERS)
        && !named(headers::HOP_BY_HOP)
        && !headers::is_forwarding(name)
        && !name.eq_ignore_ascii_case(headers::X_REQUEST_ID.as_str().as_bytes())
        && !headers::is_underscored_set_by_baton(name)
}

/// Decodes a chunked body as its bytes arrive, validating every size line,
/// extension and trailer, so what goes on is re-framed by baton (never
/// forwarded raw: a backend must not read sizes or extensions another way).
#[derive(Debug)]
pub struct Decoder {
    state: State,
    /// The size line read so far (bounded by MAX_LINE).
    line: Vec<u8>,
    /// The trailer section read so far (bounded by MAX_TRAILERS).
    trailers: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk size line into `line`.
    SizeLine,
    /// In a chunk's data, this many bytes to go.
    Data(u64),
    /// After a chunk's data: the CRLF, `cr` once its CR is in.
    DataEnd { cr: bool },
    /// Reading the trailer section; the line in progress starts at this
    /// offset of `trailers`.
    Trailers { line_start: usize },
    /// The body is complete.
    Done,
}

/// What one call to `decode` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Body data: `input[range]` (a sub-slice of the input given to this call).
    Data(Range<usize>),
    /// The last-chunk and trailer section are in: `trailers` is the raw trailer
    /// field lines (validated with httparse::parse_headers, each `name: value\r\n`, re-serialised
    /// by the decoder with CRLF; empty if none), the body is complete.
    End {
        /// The kept trailer field lines, CRLF-terminated.
        trailers: Bytes,
    },
}

/// Why a chunked body cannot be given one meaning; the connection it came
/// on cannot be trusted for another message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChunkError {
    /// A size line not starting with a hex digit, or with junk after it.
    #[error("invalid chunk size")]
    BadSize,
    /// More than 16 hex digits.
    #[error("chunk size too large")]
    SizeTooLarge,
    /// An extension that is not `;token[=token|quoted-string]`, or a size
    /// line over 4 KiB.
    #[error("invalid chunk extension")]
    BadExtension,
    /// A size line, chunk data or trailer line not ended by CRLF.
    #[error("chunk line not ended by CRLF")]
    MissingCrlf,
    /// A trailer section that is not valid field lines.
    #[error("invalid trailer section: {0}")]
    BadTrailers(&'static str),
    /// A trailer section over 16 KiB or with more than MAX_FIELDS fields.
    #[error("trailer section too large")]
    TrailersTooLarge,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder at the start of a chunked body.
    pub fn new() -> Decoder {
        Decoder {
            state: State::SizeLine,
            line: Vec::new(),
            trailers: Vec::new(),
        }
    }

    /// Reads from `input`; returns how many bytes were consumed and at most one Piece.
    /// Callers loop: call again with `&input[consumed..]` until consumed == 0 with no piece
    /// (needs more bytes) or End. Never panics; bounded memory: size line + extensions ≤ 4 KiB
    /// (else BadExtension/BadSize/SizeTooLarge), trailer section ≤ 16 KiB (else TrailersTooLarge).
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Piece>), ChunkError> {
        let mut used = 0;
        loop {
            let rest = input.get(used..).unwrap_or_default();
            let (n, piece) = self.step(rest)?;
            let at = used;
            used += n;
            match piece {
                Some(Piece::Data(r)) => {
                    return Ok((used, Some(Piece::Data(r.start + at..r.end + at))))
                }
                Some(end) => return Ok((used, Some(end))),
                None if n == 0 => return Ok((used, None)),
                None => {}
            }
        }
    }

    /// The last chunk and trailer section are in.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// One move of the state machine over the start of `input`.
    fn step(&mut self, input: &[u8]) -> Result<(usize, Option<Piece>), ChunkError> {
        match self.state {
            State::SizeLine => self.size_line(input),
            State::Data(remaining) => Ok(self.data(input, remaining)),
            State::DataEnd { cr } => self.data_end(input, cr),
            State::Trailers { line_start } => self.trailer_line(input, line_start),
            State::Done => Ok((0, None)),
        }
    }

    fn size_line(&mut self, input: &[u8]) -> Result<(usize, Option<Piece>), ChunkError> {
        let (take, whole) = up_to_newline(input);
        if self.line.len() + take > MAX_LINE {
            return Err(overlong_line(&self.line, input));
        }
        self.line
            .extend_from_slice(input.get(..take).unwrap_or_default());
        if whole {
            let size = size_line(&self.line)?;
            self.line.clear();
            self.state = match size {
                0 => State::Trailers { line_start: 0 },
                n => State::Data(n),
            };
        }
        Ok((take, None))
    }

    fn data(&mut self, input: &[u8], remaining: u64) -> (usize, Option<Piece>) {
        let take = usize::try_from(remaining).map_or(input.len(), |r| r.min(input.len()));
        if take == 0 {
            return (0, None);
        }
        let left = remaining - take as u64;
        self.state = if left == 0 {
            State::DataEnd { cr: false }
        } else {
            State::Data(left)
        };
        (take, Some(Piece::Data(0..take)))
    }

    fn data_end(&mut self, input: &[u8], cr: bool) -> Result<(usize, Option<Piece>), ChunkError> {
        self.state = match (input.first(), cr) {
            (None, _) => return Ok((0, None)),
            (Some(b'\r'), false) => State::DataEnd { cr: true },
            (Some(b'\n'), true) => State::SizeLine,
            _ => return Err(ChunkError::MissingCrlf),
        };
        Ok((1, None))
    }

    fn trailer_line(
        &mut self,
        input: &[u8],
        line_start: usize,
    ) -> Result<(usize, Option<Piece>), ChunkError> {
        let (take, whole) = up_to_newline(input);
        if self.trailers.len() + take > MAX_TRAILERS {
            return Err(ChunkError::TrailersTooLarge);
        }
        self.trailers
            .extend_from_slice(input.get(..take).unwrap_or_default());
        if !whole {
            return Ok((take, None));
        }
        if !self.trailers.ends_with(b"\r\n") {
            return Err(ChunkError::MissingCrlf);
        }
        if self.trailers.len() - line_start > 2 {
            self.state = State::Trailers {
                line_start: self.trailers.len(),
            };
            return Ok((take, None));
        }
        let trailers = reserialise(&self.trailers)?;
        self.trailers = Vec::new();
        self.state = State::Done;
        Ok((take, Some(Piece::End { trailers })))
    }
}

/// How much of `input` belongs to the current line, and whether that
/// includes its LF.
fn up_to_newline(input: &[u8]) -> (usize, bool) {
    match input.iter().position(|b| *b == b'\n') {
        Some(lf) => (lf + 1, true),
        None => (input.len(), false),
    }
}

/// The error for a size line longer than MAX_LINE, judged on its first
/// MAX_LINE bytes only, so it is the same however the line was cut up.
fn overlong_line(line: &[u8], input: &[u8]) -> ChunkError {
    let digits = line
        .iter()
        .chain(input)
        .take(MAX_LINE)
        .take_while(|b| b.is_ascii_hexdigit())
        .count();
    match digits {
        0 => ChunkError::BadSize,
        n if n > MAX_SIZE_DIGITS => ChunkError::SizeTooLarge,
        _ => ChunkError::BadExtension,
    }
}

/// A whole size line, CRLF included: `1*16HEXDIG *(BWS ";" BWS name [BWS "=" BWS value]) CRLF`.
fn size_line(line: &[u8]) -> Result<u64, ChunkError> {
    let body = line.strip_suffix(b"\r\n").ok_or(ChunkError::MissingCrlf)?;
    let digits = body.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ChunkError::BadSize);
    }
    if digits > MAX_SIZE_DIGITS {
        return Err(ChunkError::SizeTooLarge);
    }
    let (hex, extensions) = body.split_at(digits);
    if !extensions.is_empty() && !bws(extensions).starts_with(b";") {
        return Err(ChunkError::BadSize);
    }
    check_extensions(extensions)?;
    hex.iter()
        .try_fold(0u64, |n, d| {
            let digit = char::from(*d).to_digit(16)?;
            n.checked_mul(16)?.checked_add(u64::from(digit))
        })
        .ok_or(ChunkError::SizeTooLarge)
}

/// Chunk extensions (RFC 9112 §7.1.1), validated and then discarded.
fn check_extensions(mut rest: &[u8]) -> Result<(), ChunkError> {
    while !rest.is_empty() {
        rest = bws(rest)
            .strip_prefix(b";")
            .ok_or(ChunkError::BadExtension)?;
        let (name, after) = token(bws(rest));
        if name.is_empty() {
            return Err(ChunkError::BadExtension);
        }
        rest = after;
        if let Some(value) = bws(rest).strip_prefix(b"=") {
            rest = extension_value(bws(value))?;
        }
    }
    Ok(())
}

/// A token or a quoted-string; returns what follows it.
fn extension_value(input: &[u8]) -> Result<&[u8], ChunkError> {
    if let Some(quoted) = input.strip_prefix(b"\"") {
        return after_quoted(quoted);
    }
    match token(input) {
        ([], _) => Err(ChunkError::BadExtension),
        (_, rest) => Ok(rest),
    }
}

/// The rest after a quoted-string's closing quote (RFC 9110 §5.6.4);
/// `input` starts after the opening quote.
fn after_quoted(mut input: &[u8]) -> Result<&[u8], ChunkError> {
    loop {
        match input {
            [b'"', rest @ ..] => return Ok(rest),
            [b'\\', c, rest @ ..] if is_quoted_pair(*c) => input = rest,
            [c, rest @ ..] if is_qdtext(*c) => input = rest,
            _ => return Err(ChunkError::BadExtension),
        }
    }
}

fn is_qdtext(c: u8) -> bool {
    matches!(c, b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff)
}

fn is_quoted_pair(c: u8) -> bool {
    matches!(c, b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff)
}

/// The longest token at the start of `input`, and the rest.
fn token(input: &[u8]) -> (&[u8], &[u8]) {
    let n = input.iter().take_while(|b| is_tchar(**b)).count();
    input.split_at(n)
}

/// RFC 9110 §5.6.2 tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `input` after optional whitespace (BWS).
fn bws(input: &[u8]) -> &[u8] {
    let n = input
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count();
    input.get(n..).unwrap_or_default()
}

/// A complete trailer section (blank line included) validated by httparse
/// and written back as `name: value\r\n` lines, framing and routing fields
/// dropped.
fn reserialise(section: &[u8]) -> Result<Bytes, ChunkError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let fields = match httparse::parse_headers(section, &mut slots) {
        Ok(httparse::Status::Complete((n, fields))) if n == section.len() => fields,
        Ok(_) => return Err(ChunkError::BadTrailers("not one trailer section")),
        Err(httparse::Error::TooManyHeaders) => return Err(ChunkError::TrailersTooLarge),
        Err(_) => return Err(ChunkError::BadTrailers("invalid field line")),
    };
    let mut out = BytesMut::with_capacity(section.len());
    for field in fields {
        if !trailer_forwarded(field.name.as_bytes()) {
            continue;
        }
        out.put_slice(field.name.as_bytes());
        out.put_slice(b": ");
        out.put_slice(field.value);
        out.put_slice(CHUNK_END);
    }
    Ok(out.freeze())
}

/// Writes the framing for one data chunk of `len` bytes: `{len:x}\r\n` (the data and a
/// trailing `\r\n` are the caller's, see `CHUNK_END`). `len` must not be 0:
/// that is the last chunk's (see `last_chunk`).
pub fn chunk_header(len: usize, out: &mut BytesMut) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 2 * std::mem::size_of::<usize>()];
    let mut start = digits.len();
    let mut n = len;
    for slot in digits.iter_mut().rev() {
        *slot = HEX[n & 0xf];
        start -= 1;
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.put_slice(digits.get(start..).unwrap_or_default());
    out.put_slice(CHUNK_END);
}

/// What ends each chunk's data.
pub const CHUNK_END: &[u8] = b"\r\n";

/// The last chunk with trailers (already CRLF-terminated field lines) and the final CRLF.
pub fn last_chunk(trailers: &[u8], out: &mut BytesMut) {
    out.put_slice(b"0\r\n");
    out.put_slice(trailers);
    out.put_slice(CHUNK_END);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Body data, and the end: trailers, an error, or None (wants more).
    type Outcome = (Vec<u8>, Result<Option<Bytes>, ChunkError>);

    /// Feeds `input` in pieces of `step` bytes (0: whole), looping over
    /// each piece the way a caller does.
    fn run(input: &[u8], step: usize) -> Outcome {
        let mut decoder = Decoder::new();
        let mut data = Vec::new();
        let pieces: Vec<&[u8]> = if step == 0 {
            vec![input]
        } else {
            input.chunks(step).collect()
        };
        for piece in pieces {
            let mut rest = piece;
            loop {
                match decoder.decode(rest) {
                    Err(e) => return (data, Err(e)),
                    Ok((_, Some(Piece::End { trailers }))) => {
                        assert!(decoder.is_done());
                        return (data, Ok(Some(trailers)));
                    }
                    Ok((n, Some(Piece::Data(r)))) => {
                        data.extend_from_slice(&rest[r]);
                        rest = &rest[n..];
                    }
                    Ok((0, None)) => break,
                    Ok((n, None)) => rest = &rest[n..],
                }
            }
        }
        (data, Ok(None))
    }

    /// The outcome, checked to be the same whole and cut up in 1..=7.
    fn decode(input: &[u8]) -> Outcome {
        let whole = run(input, 0);
        for step in 1..=7 {
            assert_eq!(
                run(input, step),
                whole,
                "step {step}: {:?}",
                String::from_utf8_lossy(input)
            );
        }
        whole
    }

    fn body(input: &[u8]) -> Vec<u8> {
        let (data, end) = decode(input);
        assert_eq!(
            end,
            Ok(Some(Bytes::new())),
            "{:?}",
            String::from_utf8_lossy(input)
        );
        data
    }

    fn error(input: &[u8]) -> ChunkError {
        decode(input).1.expect_err(&String::from_utf8_lossy(input))
    }

    #[test]
    fn chunks_decode_to_their_data() {
        assert_eq!(
            body(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            b"hello world"
        );
        assert_eq!(body(b"0\r\n\r\n"), b"");
        assert_eq!(body(b"A\r\n0123456789\r\n0000\r\n\r\n"), b"0123456789");
        assert_eq!(body(b"1\r\n\r\r\n1\r\n\n\r\n0\r\n\r\n"), b"\r\n");
    }

    #[test]
    fn a_call_without_enough_bytes_consumes_them_and_waits() {
        let mut d = Decoder::new();
        assert_eq!(d.decode(b""), Ok((0, None)));
        assert_eq!(d.decode(b"5\r"), Ok((2, None)));
        assert_eq!(d.decode(b"\nhel"), Ok((4, Some(Piece::Data(1..4)))));
        assert_eq!(d.decode(b""), Ok((0, None)));
        assert!(!d.is_done());
        assert_eq!(decode(b"5\r\nhello\r\n").1, Ok(None));
    }

    #[test]
    fn data_comes_one_piece_per_call() {
        let mut d = Decoder::new();
        let input = b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\nNEXT";
        assert_eq!(d.decode(input), Ok((5, Some(Piece::Data(3..5)))));
        assert_eq!(d.decode(&input[5..]), Ok((6, Some(Piece::Data(5..6)))));
        let (n, end) = d.decode(&input[11..]).unwrap();
        assert_eq!(
            (n, end),
            (
                7,
                Some(Piece::End {
                    trailers: Bytes::new()
                })
            )
        );
        assert_eq!(&input[18..], b"NEXT");
        assert_eq!(d.decode(b"more"), Ok((0, None)));
    }

    #[test]
    fn extensions_are_validated_and_dropped() {
        for ok in [
            &b"5;name\r\nhello\r\n0\r\n\r\n"[..],
            b"5;a=b\r\nhello\r\n0;last\r\n\r\n",
            b"5 ; a = \"q \\\" x;y\"\t;c\r\nhello\r\n0\r\n\r\n",
            b"5;a=b;c;d=\"\"\r\nhello\r\n0\r\n\r\n",
        ] {
            assert_eq!(body(ok), b"hello");
        }
        for bad in [
            &b"5;\r\nhello\r\n0\r\n\r\n"[..],
            b"5;a=\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"open\r\nhello\r\n0\r\n\r\n",
            b"5;a b\r\nhello\r\n0\r\n\r\n",
            b"5;=b\r\nhello\r\n0\r\n\r\n",
            b"5;a=b c\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"\x01\"\r\nhello\r\n0\r\n\r\n",
            b"5;a=b \r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
        ] {
            assert_eq!(
                error(bad),
                ChunkError::BadExtension,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn sizes_are_1_to_16_hex_digits() {
        for bad in [
            &b"g\r\n"[..],
            b" 5\r\n",
            b"5 \r\n",
            b"-5\r\n",
            b"0x5\r\n",
            b"\r\n",
            b"+5\r\n",
        ] {
            assert_eq!(
                error(bad),
                ChunkError::BadSize,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(error(b"ffffffffffffffffff\r\n"), ChunkError::SizeTooLarge);
        assert_eq!(error(b"00000000000000005\r\n"), ChunkError::SizeTooLarge);
        let (data, end) = decode(b"ffffffffffffffff\r\nabc");
        assert_eq!((data, end), (b"abc".to_vec(), Ok(None)));
    }

    #[test]
    fn every_line_ends_in_crlf() {
        assert_eq!(error(b"5\nhello\r\n0\r\n\r\n"), ChunkError::MissingCrlf);
        assert_eq!(error(b"5\r\nhelloXX0\r\n\r\n"), ChunkError::MissingCrlf);
        assert_eq!(error(b"5\r\nhello\n0\r\n\r\n"), ChunkError::MissingCrlf);
        assert_eq!(error(b"5\r\nhello\r0\r\n\r\n"), ChunkError::MissingCrlf);
        assert_eq!(error(b"0\r\n\n"), ChunkError::MissingCrlf);
        assert_eq!(error(b"0\r\nX: y\n\r\n"), ChunkError::MissingCrlf);
        assert_eq!(error(b"0\r\nX: y\r\n\n"), ChunkError::MissingCrlf);
        assert_eq!(decode(b"5\r\nhello\r\n0\r\nX: y\r\n").0, b"hello");
    }

    #[test]
    fn trailers_are_validated_and_reserialised() {
        let (data, end) = decode(
            b"3\r\nabc\r\n0\r\nX-T: 1\r\nContent-Length: 5\r\nhost: h\r\nTransfer-Encoding: x\r\nConnection: close\r\nkeep-alive: 5\r\nUpgrade: h2c\r\nTE: trailers\r\nTrailer: X-T\r\nX-Forwarded-For: 6.6.6.6\r\nforwarded: for=6.6.6.6\r\nx-request-id: forged\r\nX_Request_Id: forged\r\nX-Forwarded-Client-Cert: Hash=00\r\nX_Forwarded_Client_Cert: Hash=01\r\nY:  2 \r\n\r\n",
        );
        assert_eq!(data, b"abc");
        assert_eq!(end, Ok(Some(Bytes::from_static(b"X-T: 1\r\nY: 2\r\n"))));
        assert!(matches!(
            error(b"0\r\nX: 1\r\n folded\r\n\r\n"),
            ChunkError::BadTrailers(_)
        ));
        assert!(matches!(
            error(b"0\r\nX Y: 1\r\n\r\n"),
            ChunkError::BadTrailers(_)
        ));
        assert!(matches!(
            error(b"0\r\nX: \x00\r\n\r\n"),
            ChunkError::BadTrailers(_)
        ));
        assert!(matches!(
            error(b"0\r\nnocolon\r\n\r\n"),
            ChunkError::BadTrailers(_)
        ));
    }

    #[test]
    fn lines_and_trailers_are_bounded() {
        let mut long_ext = b"5;a=".to_vec();
        long_ext.resize(5000, b'b');
        assert_eq!(error(&long_ext), ChunkError::BadExtension);
        assert_eq!(error(&vec![b'f'; 5000]), ChunkError::SizeTooLarge);
        assert_eq!(error(&vec![b'x'; 5000]), ChunkError::BadSize);
        let mut just_fits = b"5;a=".to_vec();
        just_fits.resize(MAX_LINE - 2, b'b');
        just_fits.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        assert_eq!(body(&just_fits), b"hello");
        let mut trailers = b"0\r\n".to_vec();
        while trailers.len() < MAX_TRAILERS + 10 {
            trailers.extend_from_slice(b"X: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\r\n");
        }
        assert_eq!(error(&trailers), ChunkError::TrailersTooLarge);
        let mut many = b"0\r\n".to_vec();
        for _ in 0..=MAX_FIELDS {
            many.extend_from_slice(b"X: y\r\n");
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(error(&many), ChunkError::TrailersTooLarge);
    }

    #[test]
    fn framing_writers_round_trip() {
        let mut out = BytesMut::new();
        chunk_header(0x1a2b, &mut out);
        assert_eq!(&out[..], b"1a2b\r\n");
        out.clear();
        chunk_header(usize::MAX, &mut out);
        assert_eq!(&out[..], b"ffffffffffffffff\r\n");
        out.clear();
        for part in [&b"hello"[..], &[7u8; 300]] {
            chunk_header(part.len(), &mut out);
            out.extend_from_slice(part);
            out.extend_from_slice(CHUNK_END);
        }
        last_chunk(b"X: 1\r\n", &mut out);
        let (data, end) = decode(&out);
        assert_eq!(data.len(), 305);
        assert_eq!(end, Ok(Some(Bytes::from_static(b"X: 1\r\n"))));
        let mut empty = BytesMut::new();
        last_chunk(b"", &mut empty);
        assert_eq!(&empty[..], b"0\r\n\r\n");
    }
}
