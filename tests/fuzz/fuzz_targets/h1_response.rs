//! What a backend can send: a response head (to a GET and to a HEAD), then
//! its body. Every input gets a head, an error or "more bytes", never a
//! panic; the body decodes the same whole or cut up (see h1_body).
#![no_main]

use baton::proxy::h1::head::{parse_response, Parsed};
use libfuzzer_sys::fuzz_target;

#[path = "h1_body.rs"]
mod h1_body;

fuzz_target!(|bytes: &[u8]| {
    for method in [http::Method::GET, http::Method::HEAD] {
        let Ok(Parsed::Complete(head)) = parse_response(bytes, &method) else {
            continue;
        };
        assert!(head.bytes.len() <= head.consumed && head.consumed <= bytes.len());
        assert!(head.reason.end <= head.bytes.len());
        for field in &head.fields {
            let _ = (head.field_name(field), head.field_value(field));
        }
        let rest = &bytes[head.consumed..];
        h1_body::check(head.framing, rest, bytes.first().copied().unwrap_or(0));
    }
});
