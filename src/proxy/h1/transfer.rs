//! The two directions of one exchange, run side by side in the client
//! connection's task: the request body going up (client → backend) and the
//! response coming down (backend → client). Each body is decoded by its
//! framing and re-framed for the other side, so neither peer's framing
//! reaches the other as bytes to be read another way.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::chunked::{self, ChunkError, Decoder, Piece};
use super::head::{self, BadResponse, Framing, Parsed, RequestHead, ResponseHead, Version};
use super::io::{read_some, release_if_empty, write_all, WriteFault};
use super::rewrite::{self, Delivery, Persistence};
use crate::backend::idle::Check;
use crate::backend::Backend;
use crate::lifecycle::drain::DrainWatch;
use crate::metrics::LongLivedKind;
use crate::proxy::longlived::{EventTail, LINGER};
use crate::proxy::pace::MinPace;

/// What the two directions tell each other (and the exchange).
#[derive(Default)]
pub struct Progress {
    /// The whole request body went to the backend.
    pub upload_done: AtomicBool,
    /// When a final response head came from the backend (the response
    /// clock stops then).
    pub head_at: OnceLock<Instant>,
    /// That head's status (0 before it).
    pub status: AtomicU16,
    /// An interim response (1xx) is being written to the client: until it
    /// is, the final head cannot be read, and a response clock that runs
    /// out meanwhile is the client's doing, not the backend's.
    pub interim_writing: AtomicBool,
    /// Response bytes went to the client: an error can no longer be answered.
    pub client_written: AtomicBool,
    /// How many, for the access log.
    pub bytes_out: AtomicU64,
    /// How many of those were meant as response heads (interim and
    /// final), whether or not they all went.
    pub head_out: AtomicU64,
    /// What the client sent into an upgraded connection's tunnel, for the
    /// access log's bytes in (a request body is counted as it is read).
    pub tunnelled_in: AtomicU64,
    /// The response goes to the client delimited by the connection's end
    /// (an HTTP/1.0 client's body of no stated length): one the backend
    /// breaks off must end with a reset, or the close reads as its end.
    pub until_close: AtomicBool,
}

impl Progress {
    /// A response head began to go to the client: an interim one is being
    /// written, or the final one came (and is written at once). An answer
    /// of baton's own from now on would land inside it or after it, so a
    /// fault of the upload's can only close the connection.
    pub fn response_begun(&self) -> bool {
        self.client_written.load(Ordering::Relaxed)
            || self.interim_writing.load(Ordering::Relaxed)
            || self.head_at.get().is_some()
    }
}

/// A request body on its way up: how much is left, and what is framed for
/// the backend but not written yet.
pub struct RequestBody {
    remaining: u64,
    decoder: Option<Decoder>,
    done: bool,
    pub framed: BytesMut,
    /// Body bytes taken from the client so far, as it framed them.
    received: u64,
}

impl RequestBody {
    pub fn new(framing: Framing) -> RequestBody {
        RequestBody {
            remaining: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            decoder: (framing == Framing::Chunked).then(Decoder::new),
            done: matches!(framing, Framing::Empty | Framing::UntilClose),
            framed: BytesMut::new(),
            received: 0,
        }
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// How many of `available` bytes belong to a Content-Length body.
    fn length_part(&self, available: usize) -> usize {
        available.min(usize::try_from(self.remaining).unwrap_or(usize::MAX))
    }

    /// Counts `n` bytes of a Content-Length body as gone from the
    /// client's buffer: only then may the body be done, or a failure
    /// before would leave its last bytes there to be read as the
    /// connection's next request.
    fn count_length_part(&mut self, n: usize) {
        self.remaining -= n as u64;
        self.received += n as u64;
        self.done = self.remaining == 0;
    }

    /// Moves what `input` holds of the body to `framed`, framed for the
    /// backend; bytes past the body (a pipelined request) stay in `input`.
    /// (Used for the first bytes, which go out with the head.)
    pub fn take(&mut self, input: &mut BytesMut) -> Result<(), ChunkError> {
        match &mut self.decoder {
            None => {
                let n = self.length_part(input.len());
                self.framed.put_slice(&input[..n]);
                input.advance(n);
                self.count_length_part(n);
            }
            Some(decoder) => {
                let before = input.len();
                self.done = decode_into(decoder, input, &mut self.framed, true, &mut |_| {})?;
                self.received += (before - input.len()) as u64;
            }
        }
        Ok(())
    }
}

/// Decodes the chunked bytes `input` holds into `out`, re-chunked when
/// `rechunk` (else the bare data); true once the body is complete.
fn decode_into(
    decoder: &mut Decoder,
    input: &mut BytesMut,
    out: &mut BytesMut,
    rechunk: bool,
    seen: &mut dyn FnMut(&[u8]),
) -> Result<bool, ChunkError> {
    loop {
        let (used, piece) = decoder.decode(input)?;
        match piece {
            Some(Piece::Data(range)) => {
                let data = &input[range];
                seen(data);
                if rechunk {
                    chunked::chunk_header(data.len(), out);
                    out.put_slice(data);
                    out.put_slice(chunked::CHUNK_END);
                } else {
                    out.put_slice(data);
                }
            }
            Some(Piece::End { trailers }) => {
                input.advance(used);
                if rechunk {
                    chunked::last_chunk(&trailers, out);
                }
                return Ok(true);
            }
            None if used == 0 => return Ok(false),
            None => {}
        }
        input.advance(used);
    }
}

/// Why the request body did not all go up.
#[derive(Debug)]
pub enum UpFault {
    Malformed(ChunkError),
    /// No body bytes for `idle_timeout`.
    Stalled,
    /// The body fell behind `body_min_rate`.
    TooSlow,
    ClientGone,
    /// The backend stopped taking the body (it may have answered early).
    BackendGone(io::Error),
}

/// Timing limits of the upload.
pub struct UpLimits {
    /// How long the client may pause its body.
    pub client_pause: Duration,
    /// How long the backend may take no bytes.
    pub backend_stall: Duration,
    /// What the body must keep up (`body_min_rate`), if anything.
    pub pace: Option<MinPace>,
}

/// Sends the request body: what `body.framed` holds, then the rest as the
/// client sends it.
pub async fn upload<R, W>(
    client: &mut R,
    client_buf: &mut BytesMut,
    backend: &mut W,
    body: &mut RequestBody,
    limits: &UpLimits,
) -> Result<(), UpFault>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let gone = |f| match f {
        WriteFault::Stalled => UpFault::BackendGone(io::ErrorKind::TimedOut.into()),
        WriteFault::Failed(e) => UpFault::BackendGone(e),
    };
    // The pace counts the body's bytes (those read before the backend was
    // picked too) against the time spent waiting for the rest here (not
    // writing them: that is the backend's time).
    let mut waited = Duration::ZERO;
    loop {
        if !body.framed.is_empty() {
            write_all(backend, &body.framed, limits.backend_stall)
                .await
                .map_err(gone)?;
            body.framed.clear();
        }
        if body.done {
            release_if_empty(&mut body.framed);
            return Ok(());
        }
        let allowance = limits.pace.map(|p| p.allowance(body.received, waited));
        let limit = allowance.map_or(limits.client_pause, |a| a.min(limits.client_pause));
        let began = allowance.map(|_| Instant::now());
        let read = tokio::time::timeout(limit, read_some(client, client_buf)).await;
        waited += began.map_or(Duration::ZERO, |b| b.elapsed());
        match read {
            Err(_) if limit < limits.client_pause => return Err(UpFault::TooSlow),
            Err(_) => return Err(UpFault::Stalled),
            Ok(Ok(0) | Err(_)) => return Err(UpFault::ClientGone),
            // A Content-Length body goes up as it was read, with no copy;
            // counted once written and gone from the buffer.
            Ok(Ok(_)) if body.decoder.is_none() => {
                let n = body.length_part(client_buf.len());
                write_all(backend, &client_buf[..n], limits.backend_stall)
                    .await
                    .map_err(gone)?;
                client_buf.advance(n);
                body.count_length_part(n);
            }
            Ok(Ok(_)) => body.take(client_buf).map_err(UpFault::Malformed)?,
        }
    }
}

/// Once the request is sent: keeps reading what the client sends next (a
/// pipelined request, up to one head's worth) and resolves if the client
/// goes away, so a request nobody waits for is not left at the backend.
pub async fn watch_client<R: AsyncRead + Unpin>(client: &mut R, client_buf: &mut BytesMut) {
    loop {
        if client_buf.len() >= head::MAX_HEAD {
            return std::future::pending().await;
        }
        if let Ok(0) | Err(_) = read_some(client, client_buf).await {
            return;
        }
    }
}

/// What the response direction needs to know.
pub struct Down<'a> {
    pub request: &'a RequestHead,
    /// Told as its response head comes: an answer (see `Backend::answered`).
    pub backend: &'a Backend,
    pub drain: &'a DrainWatch,
    pub listener: &'a str,
    /// How long the client may take no response bytes.
    pub client_stall: Duration,
    /// How long the backend may send no body bytes while baton waits for
    /// them (`response_timeout`, as nginx's `proxy_read_timeout` and
    /// HAProxy's `timeout server` bound a silent server mid-body), and an
    /// event stream, whose events may be far apart, `tunnel_timeout`.
    pub backend_silence: Duration,
    pub event_silence: Duration,
    pub progress: &'a Progress,
}

/// How the response went.
#[derive(Debug)]
pub enum Delivered {
    Done {
        status: u16,
        /// The backend connection may serve another request, after this
        /// check (see [`Check::after_response`]).
        backend_reuse: Option<Check>,
        /// The client connection may carry another request.
        client_reusable: bool,
    },
    /// 101 went to the client: the connection is a tunnel now.
    Upgraded { websocket: bool },
}

/// Why the response did not reach the client whole.
#[derive(Debug)]
pub enum DownFault {
    /// The backend failed before its response head was complete;
    /// `nothing_received` when not one byte came back.
    Backend {
        cause: String,
        nothing_received: bool,
    },
    BadHead(BadResponse),
    /// The response body broke off (its head went to the client).
    BrokeOff(String),
    /// The backend sent no body bytes for this long (its head went to the
    /// client).
    Silent(Duration),
    Client(WriteFault),
}

/// Reads the backend's response (interim ones are passed on to a 1.1
/// client), writes its head to the client and streams its body.
pub async fn download<R, W>(
    backend: &mut R,
    backend_buf: &mut BytesMut,
    client: &mut W,
    down: &Down<'_>,
) -> Result<Delivered, DownFault>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut first = true;
    let head = loop {
        let head = read_head(backend, backend_buf, &down.request.method, first).await?;
        first = false;
        if (100..200).contains(&head.status) && head.status != 101 {
            if down.request.version == Version::Http11 {
                let mut out = BytesMut::new();
                rewrite::interim(&head, &mut out);
                down.progress
                    .head_out
                    .fetch_add(out.len() as u64, Ordering::Relaxed);
                down.progress.interim_writing.store(true, Ordering::Relaxed);
                let written = write_all(client, &out, down.client_stall).await;
                down.progress
                    .interim_writing
                    .store(false, Ordering::Relaxed);
                written.map_err(DownFault::Client)?;
            }
            continue;
        }
        break head;
    };
    // An HTTP/1.0 client has no transfer codings: the body would reach it
    // coded with nothing to say so (nginx answers 502 too). Refused before
    // the head counts as taken: nothing of it reached the client (`SH`).
    if head.coded && down.request.version == Version::Http10 {
        return Err(DownFault::Backend {
            cause: "a transfer coding other than chunked, for an HTTP/1.0 client".into(),
            nothing_received: false,
        });
    }
    let _ = down.progress.head_at.set(Instant::now());
    down.backend.answered();
    down.progress.status.store(head.status, Ordering::Relaxed);
    let answered_early = !down.progress.upload_done.load(Ordering::Relaxed);
    if head.status == 101 {
        return switch(head, client, down).await;
    }
    let delivery = rewrite::delivery(head.framing, down.request.version);
    down.progress
        .until_close
        .store(delivery == Delivery::UntilClose, Ordering::Relaxed);
    let client_keeps = down.request.keep_alive
        && !down.drain.is_draining()
        && down.progress.upload_done.load(Ordering::Relaxed)
        && delivery != Delivery::UntilClose;
    let persistence = match (client_keeps, down.request.version) {
        (false, _) => Persistence::Closes,
        (true, Version::Http10) => Persistence::KeepAlive,
        (true, Version::Http11) => Persistence::Stays,
    };
    // The head goes out with the body bytes already here, in one write.
    let mut out = BytesMut::with_capacity(head.bytes.len() + 128 + backend_buf.len());
    rewrite::response(&head, down.request, delivery, persistence, &mut out);
    down.progress
        .head_out
        .fetch_add(out.len() as u64, Ordering::Relaxed);
    let event_stream = head
        .values("content-type")
        .next()
        .is_some_and(crate::proxy::longlived::is_event_stream);
    let mut body = ResponseBody {
        framing: head.framing,
        delivery,
        sse: event_stream.then(|| Sse::framed(head.framing)),
        out,
    };
    let complete = body.stream(backend, backend_buf, client, down).await?;
    // Chunked with a Content-Length too: answered right (chunked wins),
    // but a backend that says both is not trusted with another request.
    // Nor one that answered before it had the whole request: it may not
    // have read the rest, and would take it for the next request.
    let both_framings =
        head.framing == Framing::Chunked && head.values("content-length").next().is_some();
    let trusted = !both_framings && !answered_early;
    Ok(Delivered::Done {
        status: head.status,
        backend_reuse: (complete && head.keep_alive && backend_buf.is_empty() && trusted)
            .then(|| Check::after_response(head.framing == Framing::Empty)),
        client_reusable: complete && client_keeps,
    })
}

/// A 101: the head goes to the client only if it asked for an upgrade.
async fn switch<W: AsyncWrite + Unpin>(
    head: ResponseHead,
    client: &mut W,
    down: &Down<'_>,
) -> Result<Delivered, DownFault> {
    let Some(asked) = &down.request.upgrade else {
        return Err(DownFault::Backend {
            cause: "101 Switching Protocols to a request that asked for no upgrade".into(),
            nothing_received: false,
        });
    };
    let Some(protocol) = head.switched_to(&down.request.bytes[asked.clone()]) else {
        return Err(DownFault::Backend {
            cause: "101 Switching Protocols to no protocol the request offered".into(),
            nothing_received: false,
        });
    };
    // The backend switched before it had the whole request: the rest of
    // the body would reach it as the new protocol's bytes. A 502 now, not
    // a 101 and then the connection closed under the client.
    if !down.progress.upload_done.load(Ordering::Relaxed) {
        return Err(DownFault::Backend {
            cause: "101 Switching Protocols before the whole request body was sent".into(),
            nothing_received: false,
        });
    }
    let websocket = protocol.eq_ignore_ascii_case(b"websocket");
    let mut out = BytesMut::with_capacity(head.bytes.len() + 64);
    rewrite::response(
        &head,
        down.request,
        Delivery::AsIs,
        Persistence::Stays,
        &mut out,
    );
    down.progress
        .head_out
        .fetch_add(out.len() as u64, Ordering::Relaxed);
    write_all(client, &out, down.client_stall)
        .await
        .map_err(DownFault::Client)?;
    down.progress.client_written.store(true, Ordering::Relaxed);
    Ok(Delivered::Upgraded { websocket })
}

async fn read_head<R: AsyncRead + Unpin>(
    backend: &mut R,
    buf: &mut BytesMut,
    method: &http::Method,
    first: bool,
) -> Result<ResponseHead, DownFault> {
    // How much of the head the last parse saw: a head trickled in is
    // parsed again only as `head::worth_parsing` says, as a client's is.
    let mut parsed = 0;
    loop {
        if !buf.is_empty() && head::worth_parsing(buf, parsed) {
            parsed = buf.len();
            if let Parsed::Complete(head) =
                head::parse_response(buf, method).map_err(DownFault::BadHead)?
            {
                buf.advance(head.consumed);
                return Ok(head);
            }
        }
        let nothing_received = first && buf.is_empty();
        match read_some(backend, buf).await {
            Ok(0) => {
                return Err(DownFault::Backend {
                    cause: "connection closed before a complete response head".into(),
                    nothing_received,
                })
            }
            Err(e) => {
                return Err(DownFault::Backend {
                    cause: e.to_string(),
                    nothing_received,
                })
            }
            Ok(_) => {}
        }
    }
}

/// Resolves at `at`, or never. A `select!` arm's future is made at every
/// turn of its loop, enabled or not: made so, it costs nothing until
/// polled, where a `sleep_until` read the clock and took the timer's
/// handle at every body read of every response.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// An event stream's place: its last bytes (`EventTail`), and whether the
/// drain asked it to end.
struct Sse {
    tail: EventTail,
    ending: bool,
    /// Whether a drain ends it: not one whose backend stated its length,
    /// which is a finite response, and which a client would take for cut
    /// short if it ended at an event boundary before that length.
    ends_for_drain: bool,
}

impl Sse {
    fn framed(framing: Framing) -> Sse {
        Sse {
            tail: EventTail::default(),
            ending: false,
            ends_for_drain: !matches!(framing, Framing::Length(_)),
        }
    }
}

/// A response body on its way down.
struct ResponseBody {
    framing: Framing,
    delivery: Delivery,
    sse: Option<Sse>,
    /// Framed for the client, not written yet.
    out: BytesMut,
}

impl ResponseBody {
    /// Streams the body after what `out` holds (the head); true when it
    /// ended as its framing says (false: an event stream cut for the drain).
    async fn stream<R, W>(
        &mut self,
        backend: &mut R,
        buf: &mut BytesMut,
        client: &mut W,
        down: &Down<'_>,
    ) -> Result<bool, DownFault>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut remaining = match self.framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        let mut decoder = (self.framing == Framing::Chunked).then(Decoder::new);
        let ending = down.drain.long_lived_ending();
        tokio::pin!(ending);
        let silence = match self.sse {
            Some(_) => down.event_silence,
            None => down.backend_silence,
        };
        // From the drain's word, how long an event stream waits for an
        // event boundary before it ends where it is (see `SseBody::linger`).
        let mut linger = None;
        loop {
            let complete = if self.out.is_empty() && matches!(self.framing, Framing::Length(_)) {
                self.pass_through(buf, &mut remaining, client, down).await?
            } else {
                self.frame(buf, &mut remaining, decoder.as_mut())?
            };
            if !self.out.is_empty() {
                write_all(client, &self.out, down.client_stall)
                    .await
                    .map_err(DownFault::Client)?;
                self.out.clear();
                down.progress.client_written.store(true, Ordering::Relaxed);
            }
            if complete {
                return Ok(true);
            }
            if self
                .sse
                .as_ref()
                .is_some_and(|s| s.ending && s.tail.at_boundary())
            {
                self.end_for_drain(client, down).await;
                return Ok(false);
            }
            let read = tokio::select! {
                // The drain's word first (an event stream's only: a busy
                // stream whose reads are always ready would never hear
                // it), then bytes already there, which arm no timer (the
                // sleep is polled, and registered, only when the read waits).
                biased;
                () = ending.as_mut(), if self.sse.as_ref().is_some_and(|s| s.ends_for_drain && !s.ending) => {
                    if let Some(sse) = &mut self.sse {
                        sse.ending = true;
                    }
                    linger = Some(Instant::now() + LINGER);
                    continue;
                }
                () = until(linger), if linger.is_some() => {
                    self.end_for_drain(client, down).await;
                    return Ok(false);
                }
                read = read_some(backend, buf) => read,
                () = tokio::time::sleep(silence) => return Err(DownFault::Silent(silence)),
            };
            match read {
                Ok(0) if self.framing == Framing::UntilClose => {
                    self.out.clear();
                    if self.delivery == Delivery::Chunked {
                        chunked::last_chunk(&[], &mut self.out);
                        write_all(client, &self.out, down.client_stall)
                            .await
                            .map_err(DownFault::Client)?;
                    }
                    return Ok(true);
                }
                Ok(0) => return Err(DownFault::BrokeOff("closed mid-body".into())),
                Err(e) => return Err(DownFault::BrokeOff(e.to_string())),
                Ok(_) => {}
            }
        }
    }

    /// Writes what `buf` holds of a Content-Length body to the client as it
    /// was read, with no copy (once the head is out); true once complete.
    async fn pass_through<W: AsyncWrite + Unpin>(
        &mut self,
        buf: &mut BytesMut,
        remaining: &mut u64,
        client: &mut W,
        down: &Down<'_>,
    ) -> Result<bool, DownFault> {
        let n = buf
            .len()
            .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
        if n > 0 {
            if let Some(sse) = self.sse.as_mut() {
                sse.tail.saw(&buf[..n]);
            }
            write_all(client, &buf[..n], down.client_stall)
                .await
                .map_err(DownFault::Client)?;
            buf.advance(n);
            *remaining -= n as u64;
        }
        Ok(*remaining == 0)
    }

    /// Moves what `buf` holds of the body into `out`, framed for the
    /// client; true once the body is complete.
    fn frame(
        &mut self,
        buf: &mut BytesMut,
        remaining: &mut u64,
        decoder: Option<&mut Decoder>,
    ) -> Result<bool, DownFault> {
        let sse = &mut self.sse;
        let mut seen = |data: &[u8]| {
            if let Some(s) = sse.as_mut() {
                s.tail.saw(data);
            }
        };
        match (self.framing, decoder) {
            (Framing::Empty, _) => Ok(true),
            (Framing::Chunked, Some(decoder)) => decode_into(
                decoder,
                buf,
                &mut self.out,
                self.delivery == Delivery::Chunked,
                &mut seen,
            )
            .map_err(|e| DownFault::BrokeOff(format!("bad chunked body: {e}"))),
            (Framing::Length(_), _) => {
                let n = buf
                    .len()
                    .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                seen(&buf[..n]);
                self.out.put_slice(&buf[..n]);
                buf.advance(n);
                *remaining -= n as u64;
                Ok(*remaining == 0)
            }
            _ => {
                if !buf.is_empty() {
                    seen(buf);
                    if self.delivery == Delivery::Chunked {
                        chunked::chunk_header(buf.len(), &mut self.out);
                        self.out.put_slice(buf);
                        self.out.put_slice(chunked::CHUNK_END);
                    } else {
                        self.out.put_slice(buf);
                    }
                    buf.clear();
                }
                Ok(false)
            }
        }
    }

    /// Ends an event stream at an event boundary: a chunked one properly,
    /// then the connection closes.
    async fn end_for_drain<W: AsyncWrite + Unpin>(&mut self, client: &mut W, down: &Down<'_>) {
        if self.delivery == Delivery::Chunked {
            self.out.clear();
            chunked::last_chunk(&[], &mut self.out);
            let _ = write_all(client, &self.out, down.client_stall).await;
        }
        down.drain.ended_long_lived(LongLivedKind::Sse);
        tracing::debug!(listener = %down.listener, kind = "sse", expected = true, "ended event stream for drain");
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A backend that takes nothing: every write fails.
    struct Refusing;

    impl AsyncWrite for Refusing {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// The last bytes of a Content-Length body, read but not written when
    /// the backend fails, are still in the client's buffer: the body is
    /// not done, so the exchange closes the connection instead of reading
    /// them as its next request (a smuggled one, here).
    #[tokio::test]
    async fn a_length_body_whose_last_write_fails_is_not_done() {
        let rest = b"\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut body = RequestBody::new(Framing::Length(rest.len() as u64));
        let mut client: &[u8] = rest;
        let mut client_buf = BytesMut::new();
        let limits = UpLimits {
            client_pause: Duration::from_secs(5),
            backend_stall: Duration::from_secs(5),
            pace: None,
        };
        let sent = upload(
            &mut client,
            &mut client_buf,
            &mut Refusing,
            &mut body,
            &limits,
        )
        .await;
        assert!(matches!(sent, Err(UpFault::BackendGone(_))));
        assert!(!body.is_done(), "the body's last bytes never left");
        assert_eq!(&client_buf[..], rest);
    }
}
