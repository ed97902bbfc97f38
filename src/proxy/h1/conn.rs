//! One HTTP/1 client connection, in the task that accepted it: wait for a
//! request head without holding a buffer, serve the exchange, repeat while
//! both sides keep the connection.
//!
//! Clocks: a request head must be complete within `header_timeout` of its
//! first byte (of the connection's opening, for the first one), else 408;
//! a keep-alive connection idle for `idle_timeout` is closed. While the
//! generation drains, a connection idle for `keepalive_drain_grace` is
//! closed (closing it the instant the drain begins would race a request
//! its client may be sending: the reload loss HAProxy and nginx show), and
//! a request in progress is answered with `Connection: close`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use super::record;
use crate::access_log::{Phase, Termination};
use crate::proxy_protocol::Origin;

use bytes::{Buf, BytesMut};
use http::StatusCode;
use tokio::time::Instant;

use super::exchange::{exchange, After, Client, Served};
use super::head::{self, Framing, Parsed, Refusal, RequestHead};
use super::io::{ack_promptly, linger_close, read_now, release_if_empty, write_all, Linger};
use super::rewrite;
use super::upstream;
use crate::lifecycle::drain::DrainWatch;
use crate::proxy::request_id::RequestId;
use crate::proxy::web::HttpProxy;
use crate::stream::ByteStream;

/// What a client is answered when its head is too slow.
pub const TIMEOUT_RESPONSE: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// Where waiting for the next request head ended.
enum Next {
    /// A whole head, its first byte come then.
    Head(RequestHead, Instant),
    /// No request to serve: the connection ends.
    End(NoRequest),
}

/// Why a wait for a request head ended without one.
enum NoRequest {
    /// Refused, its head's first byte come then.
    Refused(Refusal, Instant),
    /// A head begun (then) but not finished within `header_timeout`.
    Slow(Instant),
    /// A head begun (then) and not finished: the client closed or reset.
    Left(Instant),
    /// Closed by the client between requests, idle too long, or idle
    /// through the drain's grace.
    Done,
}

/// How a connection's last exchange left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The client asked for the close with its last request, which had no
    /// body: it sends nothing more.
    ClientAsked,
    /// Anything else: the client may still be sending.
    Other,
}

/// Serves `stream` until either side ends it, then closes it gracefully.
/// `opened` starts the first head's clock; `opening` holds the bytes read
/// to tell HTTP/1 from h2 (the connection's read buffer from then on).
pub async fn serve<S: ByteStream>(
    proxy: &HttpProxy,
    stream: S,
    opening: BytesMut,
    origin: Origin,
    drain: &DrainWatch,
    opened: Instant,
) {
    let certificate = proxy.client_identity(&stream).map(String::into_boxed_str);
    let mut client = Client::new(stream, opening, origin, certificate);
    let ending = serve_requests(proxy, &mut client, origin.client, drain, opened).await;
    upstream::close_kept(&mut client);
    if client.reset {
        return;
    }
    // A plain close sends FIN; there is nothing a reset could destroy. (A
    // TLS session still gets its close_notify, from the graceful close.)
    if ending == Ending::ClientAsked
        && client.buf.is_empty()
        && client.stream.plain().is_some()
        && nothing_unread(client.stream.tcp())
    {
        return;
    }
    let linger = if client.upload_unread {
        Linger::Upload
    } else {
        Linger::Brief
    };
    linger_close(&mut client.stream, linger, drain).await;
}

/// No byte came from the client since baton's last read drained its
/// socket, as far as the reactor has seen: closing now cannot turn into a
/// reset. tokio's cached readiness answers without a syscall (a peek would
/// cost one per connection); a byte that came after the reactor last
/// looked, from a client that said it was done, is as unforeseeable as one
/// that comes just after any check. A task out of its scheduling budget is
/// told "pending" whatever the readiness: then the kernel is asked.
fn nothing_unread(stream: &tokio::net::TcpStream) -> bool {
    crate::stream::reactor_saw_nothing(stream)
        || (!tokio::task::coop::has_budget_remaining() && kernel_holds_nothing(stream))
}

/// One non-blocking peek: the kernel holds no byte baton has not read.
fn kernel_holds_nothing(stream: &tokio::net::TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    match socket2::SockRef::from(stream).peek(&mut byte) {
        Ok(n) => n == 0,
        Err(err) => err.kind() == std::io::ErrorKind::WouldBlock,
    }
}

async fn serve_requests<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    peer: SocketAddr,
    drain: &DrainWatch,
    opened: Instant,
) -> Ending {
    let ended = {
        let mut first = Some(opened);
        // One grace for the connection's life: its wait for the drain
        // stays in the drain's list between requests, where one made for
        // each wait took a place there and gave it back every request. No
        // later wait counts it afresh: once the drain began, the next
        // answer says `Connection: close`.
        let grace = drain.grace_over(proxy.keepalive_drain_grace);
        tokio::pin!(grace);
        loop {
            let waited = next_head(proxy, client, drain, first.take(), grace.as_mut()).await;
            let (head, began) = match waited {
                Next::Head(head, began) => (head, began),
                Next::End(why) => break why,
            };
            // Only without a body: an upload the answer cut short may still
            // be on its way, and its bytes would meet a closed socket.
            let client_closes = !head.keep_alive && head.framing == Framing::Empty;
            if serve_one(proxy, client, head, drain, began).await == After::Close {
                return if client_closes {
                    Ending::ClientAsked
                } else {
                    Ending::Other
                };
            }
        }
    };
    // Out of the grace's scope: the task is no larger for what answering
    // a refused or late head takes beside it.
    end_without_a_request(proxy, client, peer, ended).await;
    Ending::Other
}

/// Serves one request, and the tunnel its backend may switch it to. A
/// function of its own: awaited in the loop beside the exchange, the
/// tunnel made the compiler keep the loop's locals apart from the refusal's
/// state, and every connection's task 184 bytes larger.
async fn serve_one<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    head: RequestHead,
    drain: &DrainWatch,
    began: Instant,
) -> After {
    // Boxed: an idle connection's task keeps only the loop's state, not
    // the largest state an exchange ever needs, nor a tunnel's.
    match crate::in_place::boxed(|| exchange(proxy, client, head, drain, began)).await {
        Served::Done(after) => after,
        Served::Upgraded(tunnel) => {
            crate::in_place::boxed(|| tunnel.run(proxy, client, drain)).await;
            After::Close
        }
    }
}

/// Answers, logs and counts what came instead of a request.
async fn end_without_a_request<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    peer: SocketAddr,
    why: NoRequest,
) {
    match why {
        NoRequest::Refused(refusal, started) => {
            refuse(proxy, client, &refusal, peer, started).await;
        }
        NoRequest::Slow(started) => {
            if crate::telemetry::may_say_client_fault() {
                tracing::info!(listener = %proxy.listener, client = %peer, "no request head within header_timeout; 408");
            }
            let timeout = Termination::ClientTimeout(Phase::Request);
            let answer = Answer {
                bytes: TIMEOUT_RESPONSE,
                head: TIMEOUT_RESPONSE.len(),
            };
            let answered = answer_refused(proxy, client, answer, 408, timeout).await;
            record::unserved(
                proxy.access_log.as_ref(),
                &proxy.own_target().metrics,
                &RequestId::new(),
                peer,
                answered,
                started,
            );
        }
        NoRequest::Left(started) => {
            let left = record::Unserved {
                status: None,
                termination: Termination::ClientAborted(Phase::Request),
                protocol: "HTTP/1.1",
                bytes_in: client.buf.len() as u64,
                bytes_out: 0,
                body_out: 0,
            };
            let (log, metrics) = (proxy.access_log.as_ref(), &proxy.own_target().metrics);
            record::unserved(log, metrics, &RequestId::new(), peer, left, started);
        }
        NoRequest::Done => {}
    }
}

/// Waits for the next request head; `grace` is the connection's drain
/// grace (see `serve_requests`), which closes it only while idle.
async fn next_head<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    drain: &DrainWatch,
    opened: Option<Instant>,
    mut grace: Pin<&mut impl Future<Output = ()>>,
) -> Next {
    let idle_since = Instant::now();
    let mut head_since = opened;
    // The head's first byte: the header clock may run from the
    // connection's opening, before any.
    let mut began = None;
    let mut prompted = false;
    // How much of the head the last parse saw.
    let mut parsed = 0;
    // The grace is the whole wait's, not each pass's: made afresh at every
    // pass, it began again at every empty line (or read that gave no
    // bytes), and a client sending a CRLF now and then held its idle
    // connection in a drain to idle_timeout.
    loop {
        if drop_empty_lines(&mut client.buf) {
            parsed = 0;
        }
        // Empty lines begin no head, nor a lone CR whose LF may make one
        // of it (parsed, it started the header clock: a 408 at
        // `header_timeout`, not idle in a drain).
        began = match client.buf[..] {
            [] => None,
            [b'\r'] => {
                // Kept alone, not in the read buffer that one byte would
                // hold through the idle wait (`idle_timeout`): an idle
                // connection holds no buffer.
                if client.buf.capacity() > 1 {
                    client.buf = BytesMut::from(&b"\r"[..]);
                }
                None
            }
            _ => Some(began.unwrap_or_else(Instant::now)),
        };
        if let Some(began) = began.filter(|_| head::worth_parsing(&client.buf, parsed)) {
            parsed = client.buf.len();
            head_since.get_or_insert(began);
            match head::parse_request(&client.buf) {
                Ok(Parsed::Complete(head)) => {
                    client.buf.advance(head.consumed);
                    return Next::Head(head, began);
                }
                Ok(Parsed::Partial) if !prompted => {
                    ack_promptly(&client.stream);
                    prompted = true;
                }
                Ok(Parsed::Partial) => {}
                Err(refusal) => return Next::End(NoRequest::Refused(refusal, began)),
            }
        }
        let deadline = match head_since {
            Some(since) => since + proxy.header_timeout,
            None => idle_since + proxy.idle_timeout,
        };
        let idle = head_since.is_none();
        tokio::select! {
            // Bytes that arrived win over any clock that ran out with them.
            biased;
            ready = client.stream.readable() => {
                if ready.is_err() {
                    return left(began);
                }
                match read_now(&mut client.stream, &mut client.buf).await {
                    Ok(Some(0)) | Err(_) => return left(began),
                    Ok(_) => {}
                }
            }
            () = client.alarm.until(deadline) => {
                return match head_since {
                    Some(since) => Next::End(NoRequest::Slow(since)),
                    None => Next::End(NoRequest::Done),
                };
            }
            () = grace.as_mut(), if idle => {
                tracing::debug!(listener = %proxy.listener, expected = true, "closing idle keep-alive connection for drain");
                drain.closed_idle();
                return Next::End(NoRequest::Done);
            }
        }
    }
}

/// Drops empty lines before a request line (RFC 9112 §2.2: a server
/// ignores them; some clients send a CRLF after a POST's body). Left in,
/// they started the header clock on a connection waiting for its next
/// request (a 408 at `header_timeout` instead of a quiet close at
/// `idle_timeout`) and kept it from counting as idle in a drain. A lone CR
/// waits for its LF. True if it dropped any.
fn drop_empty_lines(buf: &mut BytesMut) -> bool {
    let mut empty = 0;
    loop {
        match buf.get(empty..) {
            Some([b'\r', b'\n', ..]) => empty += 2,
            Some([b'\n', ..]) => empty += 1,
            _ => break,
        }
    }
    if empty > 0 {
        buf.advance(empty);
        release_if_empty(buf);
    }
    empty > 0
}

/// The client closed or reset its connection: in the middle of a head
/// begun then, or between requests.
fn left(began: Option<Instant>) -> Next {
    Next::End(began.map_or(NoRequest::Done, NoRequest::Left))
}

/// Answers a head baton will not serve, and closes.
async fn refuse<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    refusal: &Refusal,
    peer: SocketAddr,
    started: Instant,
) {
    let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let id = RequestId::new();
    if crate::telemetry::may_say_client_fault() {
        tracing::info!(listener = %proxy.listener, client = %peer, request_id = %id, status = status.as_u16(), cause = %refusal, "refused a request head");
    }
    let page = format!(
        "{} {}\nrequest id: {id}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error")
    );
    let mut out = BytesMut::new();
    let head = rewrite::own_answer(status, &page, None, true, &mut out);
    let answer = Answer { bytes: &out, head };
    let answered =
        answer_refused(proxy, client, answer, status.as_u16(), Termination::Refused).await;
    // A head refused for what it asks (417, 405, 431) may come with a body
    // its client is still writing; a malformed one is not worth the wait.
    client.upload_unread = !matches!(refusal, Refusal::BadRequest(_));
    release_if_empty(&mut client.buf);
    record::unserved(
        proxy.access_log.as_ref(),
        &proxy.own_target().metrics,
        &id,
        peer,
        answered,
        started,
    );
}

/// An answer of baton's own, whole, and how much of it is its head.
struct Answer<'a> {
    bytes: &'a [u8],
    head: usize,
}

/// Writes `answer` to a head baton refused, and what went each way for
/// its line: the bytes read with the head, the answer's if written.
async fn answer_refused<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    answer: Answer<'_>,
    status: u16,
    termination: Termination,
) -> record::Unserved {
    let bytes_in = client.buf.len() as u64;
    let written = write_all(&mut client.stream, answer.bytes, proxy.idle_timeout).await;
    let (bytes_out, body_out) = match written {
        Ok(()) => (answer.bytes.len(), answer.bytes.len() - answer.head),
        Err(_) => (0, 0),
    };
    record::Unserved {
        status: Some(status),
        termination,
        protocol: "HTTP/1.1",
        bytes_in,
        bytes_out: bytes_out as u64,
        body_out: body_out as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A client and the server's side of its connection, on loopback.
    async fn connected() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (served, _) = listener.accept().await.expect("accept");
        (client, served)
    }

    /// The check costs no syscall, so it sees only what the reactor has
    /// seen: a byte is known once the runtime has polled for events (as it
    /// does at every wait), and a read that drained the socket forgets it.
    #[tokio::test]
    async fn a_byte_the_reactor_saw_is_unread_until_a_read_drains_it() {
        let (mut client, mut served) = connected().await;
        let settle = || tokio::time::sleep(std::time::Duration::from_millis(50));
        client.write_all(b"GET").await.expect("send");
        settle().await;
        let mut head = [0u8; 64];
        assert_eq!(served.read(&mut head).await.expect("read"), 3);
        assert!(nothing_unread(&served), "a short read drained the socket");
        client.write_all(b"x").await.expect("send");
        settle().await;
        assert!(!nothing_unread(&served), "a stray byte came");
        assert_eq!(served.read(&mut head).await.expect("read"), 1);
        assert!(nothing_unread(&served));
        client.shutdown().await.expect("FIN");
        settle().await;
        assert!(!nothing_unread(&served), "the client's FIN is news too");
    }

    /// Out of budget, tokio says "pending" however ready the socket is; the
    /// check must then not take that for "nothing came".
    #[tokio::test]
    async fn a_task_out_of_budget_still_sees_an_unread_byte() {
        let (mut client, served) = connected().await;
        client.write_all(b"x").await.expect("send");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let seen = crate::stream::out_of_budget(&served, || nothing_unread(&served)).await;
        assert_eq!(seen, (true, false), "(budget spent, nothing unread)");
    }
}
