//! What a peer can send: a handoff message (from another generation) and a
//! control-socket request line (from any local process allowed to connect).
//! Both decoders answer every input with a value or an error, never a panic.
#![no_main]

use baton::lifecycle::{control, handoff};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = handoff::decode(bytes);
    let _ = control::decode_request(bytes);
});
