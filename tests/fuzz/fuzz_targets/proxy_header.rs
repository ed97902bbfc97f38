//! What a peer in front of baton can send first: a PROXY header, whole, in
//! part or broken. Framing and decoding answer every input without a panic;
//! a framed header is never longer than what was read, and no prefix of it
//! is ever taken for a whole one (so no byte past a header is consumed);
//! what a header tells, baton writes back so that it reads the same.
#![no_main]

use baton::proxy_protocol::receive::{decode, frame, Framed};
use baton::proxy_protocol::send::{header, Extras};
use baton::proxy_protocol::{Accept, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Framed::Header(length) = frame(bytes) else {
        return;
    };
    assert!(length <= bytes.len());
    for shorter in 0..length {
        assert_eq!(frame(&bytes[..shorter]), Framed::Incomplete);
    }
    let whole = &bytes[..length];
    let _ = decode(whole, Accept::V1);
    let _ = decode(whole, Accept::V2);
    if let Ok(Some((client, local))) = decode(whole, Accept::Any) {
        for version in [Version::V1, Version::V2] {
            let again = header(version, client, local, Extras::default());
            let told = decode(&again, Accept::Any);
            let canonical = |a: std::net::SocketAddr| (a.ip().to_canonical(), a.port());
            let (c, l) = told
                .expect("baton reads its own header")
                .expect("addresses");
            assert_eq!(
                (canonical(c), canonical(l)),
                (canonical(client), canonical(local))
            );
        }
    }
});
