//! baton's own HTTP/1 path, on `httparse`. The data's way through the
//! files: `conn` waits for a request head on a client connection; `head`
//! and `chunked` parse heads and chunked bodies (no I/O); `exchange` takes
//! one request to a backend and back, with `transfer` moving the two
//! bodies and `rewrite` writing the heads each side gets; `io` reads and
//! writes the buffers; `upgraded` carries a connection the backend
//! switched (101) to its end. Backend connections kept between requests live
//! with their backend (`backend::idle`); `upstream` finds one for an
//! exchange, and `relay` carries an h2 client's stream on it (the same
//! upstream, HTTP/1 to the backend).

pub mod alarm;
pub mod chunked;
pub mod conn;
pub mod exchange;
pub mod head;
pub mod io;
pub mod record;
pub mod relay;
pub mod rewrite;
pub mod transfer;
pub mod upgraded;
pub mod upstream;
