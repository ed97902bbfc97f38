//! The body step both HTTP/1 fuzz targets share: after a head, the rest of
//! the input is the body by the head's framing. A chunked body is decoded
//! whole and again cut into pieces (1..=7 bytes, the size picked by the
//! input's first byte): both must give the same data and the same end,
//! since a peer decides how its bytes arrive.

use baton::proxy::h1::chunked::{ChunkError, Decoder, Piece};
use baton::proxy::h1::head::Framing;
use bytes::Bytes;

/// Body data and its end: the trailers, an error, or None (wants more).
type Outcome = (Vec<u8>, Result<Option<Bytes>, ChunkError>);

pub fn check(framing: Framing, rest: &[u8], first: u8) {
    match framing {
        Framing::Length(n) => {
            let available = u64::try_from(rest.len()).unwrap_or(u64::MAX);
            assert!(available.min(n) <= n);
        }
        Framing::Chunked => {
            let whole = decode(rest, rest.len().max(1));
            let cut = decode(rest, 1 + usize::from(first % 7));
            assert_eq!(whole, cut, "a chunked body decoded differently when cut up");
        }
        Framing::Empty | Framing::UntilClose => {}
    }
}

/// Feeds `input` to a decoder in pieces of `step` bytes, looping over each
/// the way the exchange loop does.
fn decode(input: &[u8], step: usize) -> Outcome {
    let mut decoder = Decoder::new();
    let mut data = Vec::new();
    for piece in input.chunks(step) {
        let mut rest = piece;
        loop {
            match decoder.decode(rest) {
                Err(e) => return (data, Err(e)),
                Ok((_, Some(Piece::End { trailers }))) => return (data, Ok(Some(trailers))),
                Ok((n, Some(Piece::Data(range)))) => {
                    assert!(n <= rest.len() && range.end <= n && !range.is_empty());
                    data.extend_from_slice(&rest[range]);
                    rest = &rest[n..];
                }
                Ok((0, None)) => break,
                Ok((n, None)) => {
                    assert!(n <= rest.len());
                    rest = &rest[n..];
                }
            }
        }
    }
    (data, Ok(None))
}
