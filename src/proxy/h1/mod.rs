//! baton's own HTTP/1 codec, replacing hyper's: pure and synchronous (no
//! I/O), so every byte a peer sends is judged here once, strictly, and what
//! goes on is re-framed by baton rather than forwarded raw. `head` parses
//! request and response heads into offsets over the received bytes;
//! `chunked` decodes a chunked body incrementally and writes chunk framing.

pub mod chunked;
pub mod head;
