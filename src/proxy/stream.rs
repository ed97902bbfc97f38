//! What a client connection's bytes travel on: plain TCP today, TLS over
//! TCP next. The HTTP/1 path is written once against this trait; each
//! kind of stream says how it is split for an exchange's upload and
//! download side by side, how to wait for bytes without holding a read
//! buffer, and which TCP socket lies under it.

use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;

pub trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type Reader<'a>: AsyncRead + Unpin + Send
    where
        Self: 'a;
    type Writer<'a>: AsyncWrite + Unpin + Send
    where
        Self: 'a;

    /// The reading and writing halves, both usable at once.
    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>);

    /// Resolves once a read would not wait (bytes, EOF or an error), so an
    /// idle connection waits holding no buffer.
    fn readable(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// The TCP socket under the stream.
    fn tcp(&self) -> &TcpStream;
}

impl ClientStream for TcpStream {
    type Reader<'a> = ReadHalf<'a>;
    type Writer<'a> = WriteHalf<'a>;

    fn halves(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        self.split()
    }

    fn readable(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        TcpStream::readable(self)
    }

    fn tcp(&self) -> &TcpStream {
        self
    }
}
