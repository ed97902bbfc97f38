//! What a peer can send: a handoff message (from another generation) and a
//! control-socket request line (from any local process allowed to connect).
//! Both decoders answer every input with a value or an error, never a panic,
//! and so does the reassembly of a handoff message sent in pieces (the
//! input cut into datagrams at each newline).
#![no_main]

use baton::lifecycle::{control, framing, handoff};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = handoff::decode(bytes);
    let _ = control::decode_request(bytes);
    let mut pieces = framing::Reassembly::default();
    for datagram in bytes.split(|b| *b == b'\n') {
        if let Ok(Some(body)) = pieces.push(datagram) {
            let _ = handoff::decode(&body);
        }
    }
});
