//! HPACK (RFC 7541), the header compression of baton's own h2 server:
//! request heads decoded with the dynamic table the client's encoder
//! keeps, response heads encoded without one.

mod code;
pub mod decode;
pub mod encode;
pub mod huffman;
mod table;

pub use decode::{DecodeError, Decoder, Field, Listed};
