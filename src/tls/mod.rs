//! TLS termination.

pub mod handshake;
