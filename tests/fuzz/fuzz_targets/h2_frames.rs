//! What an h2 client can send after its preface: frames cut from the bytes
//! and checked, header blocks put back together from HEADERS and
//! CONTINUATION frames and decoded with one HPACK decoder, as a connection
//! reads them. Every input ends in frames, an error or "more bytes", never
//! a panic or an allocation beyond the bounds given.
#![no_main]

use baton::proxy::h2::frame::{self, Inbound, Reader};
use baton::proxy::h2::hpack::Decoder;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let mut buf = BytesMut::from(bytes);
    let mut reader = Reader::new(frame::DEFAULT_MAX_FRAME, 65_536);
    let mut decoder = Decoder::new(4096);
    while let Ok(Some(inbound)) = reader.next(&mut buf) {
        if let Inbound::Block(whole) = inbound {
            let mut fields = Vec::new();
            if decoder.decode(&whole.block, 65_536, &mut fields).is_err() {
                return;
            }
            let listed: usize = fields.iter().map(|f| f.name.len() + f.value.len() + 32).sum();
            assert!(listed <= 65_536);
        }
    }
});
