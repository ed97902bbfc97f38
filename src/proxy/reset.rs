//! A tunnel's abort passed on: when one side of a TCP-mode connection
//! resets (or fails otherwise), the other side is reset too, not closed
//! with a FIN. A FIN says "that was all"; a client whose backend crashed
//! mid-stream would take a cut stream for a whole one, and a backend whose
//! client vanished would take the abort for a clean end (HAProxy likewise
//! mimics on one side what it got on the other).
//!
//! The reset waits until the peer has taken every byte written to it
//! (`TIOCOUTQ`, the socket's unacknowledged bytes): a reset discards the
//! send queue, and what the failed side sent before it failed is still
//! owed. Then `SO_LINGER` 0, so the close that follows sends RST.
//!
//! `unsafe`: the `ioctl` that reads the send queue.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::stream::ByteStream;

/// How long the peer has to take what is queued for it before the reset
/// goes regardless (one that stopped reading would hold the task).
const QUEUE_TAKEN_WITHIN: Duration = Duration::from_secs(1);
/// How often the send queue is looked at meanwhile: on a working path it
/// is empty at the first look.
const QUEUE_LOOK_EVERY: Duration = Duration::from_millis(10);

/// Resets `socket`'s connection once its peer has everything written to
/// it, or `QUEUE_TAKEN_WITHIN` from now; the reset goes out when the
/// socket is closed.
pub async fn once_taken(socket: &TcpStream) {
    let _ = tokio::time::timeout(QUEUE_TAKEN_WITHIN, async {
        while unacknowledged(socket).is_some_and(|bytes| bytes > 0) {
            tokio::time::sleep(QUEUE_LOOK_EVERY).await;
        }
    })
    .await;
    at_close(socket);
}

/// A tunnel's two ends, both reset if it is cut off: its task dropped
/// mid-copy (the drain's deadline forced it, or the process ends) would
/// close them with a FIN, and a client of a protocol with no framing of
/// its own would take the cut stream for a whole one, a backend the
/// client's last write for its end. The ends are owned here, and
/// `Drop::drop` runs before they are dropped: `SO_LINGER` 0 is set while
/// both sockets are still open.
pub struct Ends<C: ByteStream, B: ByteStream> {
    pub client: C,
    pub backend: B,
    cut: bool,
}

impl<C: ByteStream, B: ByteStream> Ends<C, B> {
    pub fn new(client: C, backend: B) -> Ends<C, B> {
        Ends {
            client,
            backend,
            cut: true,
        }
    }

    /// The tunnel ended by itself: its ends close as it decided.
    pub fn ended(&mut self) {
        self.cut = false;
    }
}

impl<C: ByteStream, B: ByteStream> Drop for Ends<C, B> {
    fn drop(&mut self) {
        if self.cut {
            at_close(self.client.tcp());
            at_close(self.backend.tcp());
        }
    }
}

/// `socket`'s close sends a reset: `SO_LINGER` 0.
fn at_close(socket: &TcpStream) {
    if let Err(err) = socket2::SockRef::from(socket).set_linger(Some(Duration::ZERO)) {
        tracing::debug!(cause = %err, "cannot set SO_LINGER 0; the close sends a FIN");
    }
}

/// Bytes written to `socket` that its peer has not acknowledged yet.
fn unacknowledged(socket: &TcpStream) -> Option<u32> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ on a TCP socket) writes one `int` through
    // the pointer, which points at one.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    (rc == 0).then(|| u32::try_from(bytes).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A peer that reads slowly still gets every byte, then the reset:
    /// closed at once with `SO_LINGER` 0, the queue would be thrown away.
    #[tokio::test]
    async fn a_slow_reader_gets_every_byte_then_the_reset() {
        const SENT: usize = 512 << 10;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut peer = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (mut ours, _) = listener.accept().await.expect("accept");
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = vec![0u8; 16 << 10];
            loop {
                tokio::time::sleep(Duration::from_millis(2)).await;
                match peer.read(&mut buf).await {
                    Ok(0) => return (got, Ok(())),
                    Ok(n) => got += n,
                    Err(err) => return (got, Err(err.kind())),
                }
            }
        });
        ours.write_all(&vec![b'x'; SENT]).await.expect("write");
        once_taken(&ours).await;
        drop(ours);
        let (got, ended) = reader.await.expect("reader");
        assert_eq!(got, SENT, "every byte");
        assert_eq!(ended, Err(std::io::ErrorKind::ConnectionReset));
    }
}
