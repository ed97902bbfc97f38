//! How one handoff message travels as SOCK_SEQPACKET datagrams. A datagram
//! must fit the socket's send buffer (about 208 KB by default), and an
//! offer carrying a large config's metrics report need not: a message
//! longer than [`PIECE`] goes in pieces, each a datagram of its own whose
//! first byte marks it. A shorter one is its JSON alone (first byte `{`), as
//! every release has sent it, so small messages still cross between this
//! release and an earlier one. Pure bytes: the fds and the socket are
//! `handoff`'s.

use super::handoff::HandoffError;

/// The payload of one piece: well under any send buffer a host would set.
pub const PIECE: usize = 64 * 1024;
/// The longest message reassembled: far beyond any real offer, it bounds
/// what a broken or hostile peer can make us hold.
pub const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// First byte of the first piece of a message.
const FIRST: u8 = 0x01;
/// First byte of a piece between the first and the last.
const MORE: u8 = 0x02;
/// First byte of the last piece.
const LAST: u8 = 0x03;

/// The datagrams `body` (a JSON object) travels in, each as its mark (empty
/// for a whole message) and its payload: at least `at_least` of them, for a
/// message with more fds than one datagram carries (the pieces are then
/// shorter, or empty).
pub fn frames(body: &[u8], at_least: usize) -> Vec<(&'static [u8], &[u8])> {
    let count = body.len().div_ceil(PIECE).max(at_least);
    if count <= 1 {
        return vec![(&[], body)];
    }
    let mut pieces: Vec<&[u8]> = body.chunks(body.len().div_ceil(count).max(1)).collect();
    pieces.resize(count, &[]);
    let last = count - 1;
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, piece)| {
            let mark: &'static [u8] = match i {
                0 => &[FIRST],
                i if i == last => &[LAST],
                _ => &[MORE],
            };
            (mark, piece)
        })
        .collect()
}

/// The pieces read so far of a message. It lives as long as the channel,
/// not inside one `recv` future, so a `recv` dropped part-way (a timeout,
/// a `select!`) loses nothing: the next one carries on.
#[derive(Debug)]
pub struct Reassembly {
    body: Vec<u8>,
    /// A first piece was read and its last one is still to come.
    open: bool,
    limit: usize,
}

impl Default for Reassembly {
    fn default() -> Self {
        Reassembly {
            body: Vec::new(),
            open: false,
            limit: MAX_MESSAGE,
        }
    }
}

impl Reassembly {
    /// Takes one datagram; returns the message's bytes once it is whole.
    /// After an error it starts afresh with the next message.
    pub fn push(&mut self, datagram: &[u8]) -> Result<Option<Vec<u8>>, HandoffError> {
        match self.append(datagram) {
            Ok(true) => Ok(Some(std::mem::take(&mut self.body))),
            Ok(false) => Ok(None),
            Err(err) => {
                self.body = Vec::new();
                self.open = false;
                Err(err)
            }
        }
    }

    /// Adds a datagram's payload; true once the message is complete.
    fn append(&mut self, datagram: &[u8]) -> Result<bool, HandoffError> {
        let malformed = |what: &str| HandoffError::Malformed(what.to_string());
        let (&mark, rest) = datagram
            .split_first()
            .ok_or_else(|| malformed("empty datagram"))?;
        let (starts, ends, payload) = match mark {
            b'{' => (true, true, datagram),
            FIRST => (true, false, rest),
            MORE => (false, false, rest),
            LAST => (false, true, rest),
            other => return Err(malformed(&format!("unknown frame mark {other:#04x}"))),
        };
        if starts && self.open {
            return Err(malformed("a message began before the previous one ended"));
        }
        if !starts && !self.open {
            return Err(malformed("a message piece came without its first piece"));
        }
        if self.body.len() + payload.len() > self.limit {
            return Err(HandoffError::TooLarge { limit: self.limit });
        }
        self.body.extend_from_slice(payload);
        self.open = !ends;
        Ok(ends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reassemble(r: &mut Reassembly, body: &[u8]) -> Vec<Result<Option<Vec<u8>>, String>> {
        frames(body, 1)
            .into_iter()
            .map(|(mark, piece)| {
                let datagram = [mark, piece].concat();
                r.push(&datagram).map_err(|e| e.to_string())
            })
            .collect()
    }

    #[test]
    fn a_short_message_is_its_json_alone() {
        let body = br#"{"version":1,"type":"commit"}"#;
        assert_eq!(frames(body, 1), vec![(&[][..], &body[..])]);
        let mut r = Reassembly::default();
        assert_eq!(reassemble(&mut r, body), vec![Ok(Some(body.to_vec()))]);
    }

    #[test]
    fn a_long_message_goes_in_marked_pieces_and_comes_back_whole() {
        let body: Vec<u8> = (0..PIECE * 3 + 5).map(|i| (i % 251) as u8).collect();
        let framed = frames(&body, 1);
        let marks: Vec<&[u8]> = framed.iter().map(|(m, _)| *m).collect();
        assert_eq!(marks, [&[FIRST][..], &[MORE], &[MORE], &[LAST]]);
        let mut r = Reassembly::default();
        let results = reassemble(&mut r, &body);
        assert_eq!(results[..3], [Ok(None), Ok(None), Ok(None)]);
        assert_eq!(results[3], Ok(Some(body.clone())));
        // And the next message starts afresh.
        assert_eq!(reassemble(&mut r, b"{}"), vec![Ok(Some(b"{}".to_vec()))]);
    }

    /// A message with more fds than a datagram carries goes in as many
    /// pieces as they need, even a short one, and comes back whole.
    #[test]
    fn a_short_message_goes_in_as_many_pieces_as_asked() {
        for body in [&br"{}"[..], br#"{"version":1,"type":"offer"}"#] {
            let framed = frames(body, 3);
            let marks: Vec<&[u8]> = framed.iter().map(|(m, _)| *m).collect();
            assert_eq!(marks, [&[FIRST][..], &[MORE], &[LAST]]);
            let mut r = Reassembly::default();
            let results = reassemble_framed(&mut r, &framed);
            assert_eq!(results, [Ok(None), Ok(None), Ok(Some(body.to_vec()))]);
        }
    }

    fn reassemble_framed(
        r: &mut Reassembly,
        framed: &[(&[u8], &[u8])],
    ) -> Vec<Result<Option<Vec<u8>>, String>> {
        framed
            .iter()
            .map(|(mark, piece)| r.push(&[*mark, *piece].concat()).map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn pieces_out_of_order_are_refused_and_forgotten() {
        let mut r = Reassembly::default();
        assert!(r.push(&[MORE, b'x']).is_err(), "no first piece");
        assert!(r.push(&[LAST, b'x']).is_err(), "no first piece");
        assert_eq!(r.push(&[FIRST, b'{']).ok(), Some(None));
        assert!(r.push(b"{}").is_err(), "a new message inside another");
        assert_eq!(
            r.push(b"{}").ok(),
            Some(Some(b"{}".to_vec())),
            "starts afresh"
        );
        assert!(r.push(&[]).is_err());
        assert!(r.push(b"\x7fgarbage").is_err());
    }

    #[test]
    fn a_message_past_the_limit_is_refused() {
        let mut r = Reassembly {
            limit: 10,
            ..Reassembly::default()
        };
        assert_eq!(r.push(&[FIRST, b'{', b'"']).ok(), Some(None));
        let err = r.push(&[MORE; 10]).unwrap_err();
        assert!(matches!(err, HandoffError::TooLarge { limit: 10 }), "{err}");
        assert!(err.to_string().contains("10 bytes"), "{err}");
    }
}
