//! Reading into and writing from the buffers of one exchange. A read
//! buffer is allocated when bytes arrive and freed when it empties, so an
//! idle keep-alive connection holds its socket and no buffer. A write that
//! makes no progress for the stall limit ends the connection: the peer
//! stopped taking bytes.

use std::io;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Room made in a read buffer before each read.
const READ_CHUNK: usize = 16 * 1024;

/// Reads what is there into `buf`; `Ok(0)` at EOF.
pub async fn read_some<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> io::Result<usize> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    r.read_buf(buf).await
}

/// Reads what `stream` has now, without waiting: `None` if nothing (its
/// readiness was stale), `Some(0)` at EOF.
pub fn try_read_some(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<Option<usize>> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    match stream.try_read_buf(buf) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            release_if_empty(buf);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// How long a closing connection keeps reading what its client still
/// sends, and how much of it.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 256 * 1024;

/// Closes a client connection gracefully: the write side first, then
/// what the client still sends is read and dropped for a moment, because
/// closing a socket with unread bytes makes the kernel send a reset, which
/// can destroy a response the client has not read yet (a pipelined
/// request during a drain, an upload answered early). nginx's
/// `lingering_close` does the same.
pub async fn linger_close(stream: &mut TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = vec![0u8; 4096];
    let mut total = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while total < LINGER_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    })
    .await;
}

/// Gives back the memory of a buffer that holds nothing.
pub fn release_if_empty(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > 0 {
        *buf = BytesMut::new();
    }
}

/// Why bytes did not go out.
#[derive(Debug)]
pub enum WriteFault {
    /// The peer took nothing for the stall limit.
    Stalled,
    Failed(io::Error),
}

/// Writes all of `data`; each write must make progress within `stall`.
pub async fn write_all<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut data: &[u8],
    stall: Duration,
) -> Result<(), WriteFault> {
    while !data.is_empty() {
        match tokio::time::timeout(stall, w.write(data)).await {
            Err(_) => return Err(WriteFault::Stalled),
            Ok(Ok(0)) => {
                return Err(WriteFault::Failed(io::ErrorKind::WriteZero.into()));
            }
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(WriteFault::Failed(e)),
        }
    }
    Ok(())
}
