//! What a client can send: a request head, then its body. The parser
//! answers every input with a head, a refusal or "more bytes", never a
//! panic, and a whole head's offsets stay inside its bytes; the body
//! decodes the same whole or cut up (see h1_body).
#![no_main]

use baton::proxy::h1::head::{parse_request, Parsed};
use libfuzzer_sys::fuzz_target;

#[path = "h1_body.rs"]
mod h1_body;

fuzz_target!(|bytes: &[u8]| {
    let Ok(Parsed::Complete(head)) = parse_request(bytes) else {
        return;
    };
    assert!(head.bytes.len() <= head.consumed && head.consumed <= bytes.len());
    assert!(head.target.end <= head.bytes.len());
    for field in &head.fields {
        assert!(field.name.end <= head.bytes.len() && field.value.end <= head.bytes.len());
        let _ = (head.field_name(field), head.field_value(field));
    }
    let _ = (head.path(), head.host(), head.target_authority());
    let rest = &bytes[head.consumed..];
    h1_body::check(head.framing, rest, bytes.first().copied().unwrap_or(0));
});
