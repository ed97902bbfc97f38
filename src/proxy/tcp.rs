//! L4 proxying: pick a backend, connect within `connect_timeout` (one retry
//! on another backend when the connect fails: nothing was sent yet), then
//! copy both ways until both sides are done. A FIN is forwarded as a write
//! shutdown, so a half-closed client still gets its reply; a reset (or
//! any failure) on one side resets the other (`reset`).
//!
//! The copy holds a buffer only while bytes are on their way (a per-thread
//! spare): an idle proxied connection costs its two sockets and a small
//! task, not two 8 KiB buffers (`tokio::io::copy_bidirectional` keeps
//! those for life).
//! No traffic either way for `tunnel_timeout` closes both sides (for
//! `idle_timeout` once one side has closed its half), and TCP keep-alive
//! on both sockets finds a peer that vanished sooner. A TLS
//! client's bytes are copied through its session instead, each way with a
//! buffer lent while bytes are on their way (a TLS session holds its own).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::idle::{Activity, Observed};
use super::longlived;
use super::reset;
use super::side::{both_ways, on, side_of, Side, Sided, UpFailed};
use crate::access_log::{AccessLog, Entry, Marks, Phase, Termination};
use crate::backend::stream::BackendStream;
use crate::backend::Backend;
use crate::backend::{Lease, Pool};
use crate::metrics::{self, UpstreamErrorKind};
use crate::proxy::h1::io::{read_now, relay, release_if_empty, Counting, Tally};
use crate::proxy::request_id::RequestId;
use crate::proxy::ProxyError;
use crate::proxy_protocol::{send::Speaker, Origin};
use crate::stream::ByteStream;
use crate::wake_gate::{first_of, First};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

pub struct TcpProxy {
    pub listener: Arc<str>,
    /// `baton_tcp_bytes_total`, counted as bytes go.
    pub bytes: metrics::TcpBytes,
    pub pool: Arc<Pool>,
    pub connect_timeout: Duration,
    pub tunnel_timeout: Duration,
    /// The listener's `idle_timeout`: a tunnel's limit once the backend
    /// has closed its half.
    pub half_closed_timeout: Duration,
    /// One line per connection, if set (`access_log`).
    pub access_log: Option<AccessLog>,
}

impl TcpProxy {
    /// Serves one client connection: connects it to a backend and carries
    /// its bytes both ways until both ends are done, one fails, or it falls
    /// idle. The task owns its proxy's `Arc`.
    pub async fn serve<S: ByteStream>(
        self: Arc<Self>,
        client: S,
        origin: Origin,
        accepted: Instant,
    ) {
        let peer = origin.client;
        let id = RequestId::new();
        // Before the line: it reads the counts when it is written.
        let moved = Moved::new(&self.bytes);
        let mut line = self.access_log.as_ref().map(|log| Line {
            log,
            id: id.clone(),
            client: peer,
            pool: &self.pool.name,
            backend: None,
            marks: Marks::since(accepted),
            moved: &moved,
            termination: Termination::Drained(Phase::Queue),
        });
        let header = self
            .pool
            .send_proxy
            .map(|version| Speaker::of(&client, origin).header(version, &id));
        let connected = tokio::select! {
            biased;
            connected = self.connect(header.as_deref(), &mut line) => Some(connected),
            () = gone_before_a_byte(client.tcp()) => None,
        };
        let Some(connected) = connected else {
            if let Some(line) = line.as_mut() {
                let phase = match line.marks.leased {
                    Some(_) => Phase::Connect,
                    None => Phase::Queue,
                };
                line.termination = Termination::ClientAborted(phase);
            }
            return;
        };
        let (upstream, lease) = match connected {
            Ok(connected) => connected,
            Err(err) => {
                // Counted as HTTP counts it: by what failed, not by the
                // pool's health after (a connect failure that took the
                // last backend down is a connect failure).
                if matches!(err, ProxyError::NoBackend { .. }) {
                    super::no_backend(&self.listener, &self.pool.name);
                }
                if crate::telemetry::may_say_backend_fault() {
                    tracing::info!(listener = %self.listener, client = %peer, pool = %self.pool.name, cause = %err, "no backend connection for the session; closing");
                }
                if let Some(line) = line.as_mut() {
                    line.termination = err.termination(&line.marks);
                }
                return;
            }
        };
        if let Some(line) = line.as_mut() {
            line.termination = Termination::Drained(Phase::Data);
        }
        longlived::keep_alive(client.tcp());
        longlived::keep_alive(upstream.tcp());
        let mut ends = reset::Ends::new(client, upstream);
        let activity = Arc::new(Activity::default());
        let copying = async {
            match (ends.client.plain(), ends.backend.plain()) {
                (Some(client), Some(backend)) => {
                    copy_both_ways(client, backend, &activity, &moved).await
                }
                // Boxed: only TLS connections carry its larger state.
                _ => {
                    crate::in_place::boxed(|| {
                        copy_through(&mut ends.client, &mut ends.backend, &activity, &moved)
                    })
                    .await
                }
            }
        };
        let idle = activity.idle_for_or(self.tunnel_timeout, self.half_closed_timeout);
        let ended = match first_of(copying, idle).await {
            First::Main(Ok(())) => Termination::Completed,
            First::Main(Err(err)) if side_of(&err) == Some(Side::Backend) => {
                let backend = lease.backend();
                backend.upstream_failed(
                    UpstreamErrorKind::Protocol,
                    &format!("tunnel broke off: {err}"),
                    false,
                );
                if crate::telemetry::may_say_backend_fault() {
                    tracing::info!(listener = %self.listener, pool = %backend.pool, backend = %backend.label, cause = %err, "backend ended the tcp stream with an error");
                }
                reset::once_taken(ends.client.tcp()).await;
                Termination::BackendFailed(Phase::Data)
            }
            First::Main(Err(err)) => {
                tracing::debug!(listener = %self.listener, pool = %lease.backend().pool, backend = %lease.backend().label, cause = %err, "tcp stream ended with an error");
                reset::once_taken(ends.backend.tcp()).await;
                Termination::ClientAborted(Phase::Data)
            }
            First::Rare(()) => {
                // Within the budget for clients' faults: a client can
                // leave as many connections idle as it may open.
                if crate::telemetry::may_say_client_fault() {
                    tracing::info!(listener = %self.listener, client = %peer, pool = %lease.backend().pool, backend = %lease.backend().label, "no traffic either way within tunnel_timeout (idle_timeout once the backend closed its half); closing");
                }
                Termination::ClientTimeout(Phase::Data)
            }
        };
        // Only now: a force while a reset waited for its peer to take
        // what was sent (`once_taken`) still resets both.
        ends.ended();
        if let Some(line) = line.as_mut() {
            line.termination = ended;
        }
    }

    /// The line of a connection closed before it was served (a refused
    /// PROXY header or TLS handshake), accepted at `accepted`.
    /// Written as a served one's is (`Line`), with nothing moved.
    pub fn refused(&self, client: SocketAddr, accepted: Instant, termination: Termination) {
        let Some(log) = &self.access_log else {
            return;
        };
        let moved = Moved::new(&self.bytes);
        drop(Line {
            log,
            id: RequestId::new(),
            client,
            pool: &self.pool.name,
            backend: None,
            marks: Marks::since(accepted),
            moved: &moved,
            termination,
        });
    }

    /// A backend connection, `proxy_header` first on it (`send_proxy`): a
    /// second backend is tried if the first cannot be reached. The error
    /// says why there is none (the access log's termination). The access
    /// log's `line` is marked as it goes: when a backend was picked (and
    /// which), when its connection was in hand.
    async fn connect(
        &self,
        proxy_header: Option<&[u8]>,
        line: &mut Option<Line<'_>>,
    ) -> Result<(BackendStream, Lease), ProxyError> {
        let mut failed: Option<(usize, ProxyError)> = None;
        loop {
            let lease = match self.pool.lease(failed.as_ref().map(|f| f.0)).await {
                Ok(lease) => lease,
                // None up, or none under its cap within queue_timeout; or
                // nobody else to try: the first failure is the answer.
                Err(why) => {
                    return Err(
                        failed.map_or_else(|| ProxyError::refused(&self.pool.name, why), |f| f.1)
                    )
                }
            };
            if let Some(line) = line.as_mut() {
                line.marks.leased = Some(Instant::now());
                line.backend = Some(Arc::clone(lease.shared()));
                line.termination = Termination::Drained(Phase::Connect);
            }
            let backend = lease.backend();
            match backend.connect(self.connect_timeout, proxy_header).await {
                Ok(stream) => {
                    backend.answered();
                    if let Some(line) = line.as_mut() {
                        line.marks.connected = Some(Instant::now());
                    }
                    return Ok((stream, lease));
                }
                Err(fault) => {
                    let err = ProxyError::connect(backend, &fault);
                    if failed.is_some() {
                        err.blame(backend, None);
                        return Err(err);
                    }
                    err.blame_and_retry(backend, None);
                    failed = Some((backend.index, err));
                }
            }
        }
    }
}

/// A TCP connection's access-log line, written when its task ends,
/// however it ends (the drain deadline's cut included: `KD`).
struct Line<'a> {
    log: &'a AccessLog,
    id: RequestId,
    client: SocketAddr,
    pool: &'a str,
    backend: Option<Arc<Backend>>,
    marks: Marks,
    moved: &'a Moved<'a>,
    termination: Termination,
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        let (to_backend, to_client) = self.moved.taken();
        self.log.write(&Entry {
            request_id: &self.id,
            client: self.client,
            pool: self.pool,
            backend: self.backend.as_deref().map(|b| b.label.as_str()),
            method: "-",
            target: "-",
            protocol: "TCP",
            status: None,
            bytes_in: to_backend,
            bytes_out: to_client,
            body_out: to_client,
            marks: self.marks,
            termination: self.termination,
            referer: None,
            user_agent: None,
        });
    }
}

/// Bytes copied each way so far, counted as they go: a connection cut by
/// `tunnel_timeout`, an error or the drain still says how much it moved.
struct Moved<'a> {
    to_backend: Way<'a>,
    to_client: Way<'a>,
}

impl<'a> Moved<'a> {
    fn new(metric: &'a metrics::TcpBytes) -> Moved<'a> {
        let way = |metric| Way {
            bytes: AtomicU64::new(0),
            counted: AtomicU64::new(0),
            metric,
        };
        Moved {
            to_backend: way(&metric.to_backend),
            to_client: way(&metric.to_client),
        }
    }

    /// To the backend, to the client.
    fn taken(&self) -> (u64, u64) {
        (
            self.to_backend.bytes.load(Ordering::Relaxed),
            self.to_client.bytes.load(Ordering::Relaxed),
        )
    }
}

/// One way's bytes: this connection's, for its access-log line, and the
/// listener's `baton_tcp_bytes_total`, which moves as the bytes do (a
/// session of days shows its traffic while it lasts, not in one step as
/// it ends), every [`COUNT_EVERY`] bytes and at the end: the counter is
/// shared by every connection on every worker, so one update per copied
/// chunk would make them all contend for it.
struct Way<'a> {
    bytes: AtomicU64,
    /// Of `bytes`, those the metric counts already.
    counted: AtomicU64,
    metric: &'a ::metrics::Counter,
}

/// How many bytes a connection moves one way between updates of
/// `baton_tcp_bytes_total`.
const COUNT_EVERY: u64 = 64 << 10;

impl Tally for Way<'_> {
    fn add(&self, bytes: u64) {
        let total = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let counted = self.counted.load(Ordering::Relaxed);
        if total - counted >= COUNT_EVERY {
            self.counted.store(total, Ordering::Relaxed);
            self.metric.increment(total - counted);
        }
    }
}

impl Drop for Way<'_> {
    /// The rest, however the connection ended (a tunnel the drain's
    /// deadline forces is dropped where it waits).
    fn drop(&mut self) {
        let rest = *self.bytes.get_mut() - *self.counted.get_mut();
        if rest > 0 {
            self.metric.increment(rest);
        }
    }
}

/// Resolves if the client resets its connection before it sends a byte:
/// one that leaves while it waits in line (or while its backend connection
/// is made) gives up its place and reaches no backend, so a flood of
/// connections reset at once does not queue ahead of real clients and open
/// empty backend connections. Pends for good once a byte or a FIN came:
/// bytes wait in the socket for the tunnel, and a client may close its
/// half at once and still read what a server-speaks-first backend says
/// (`nc -N`), as HAProxy forwards it without `abortonclose`.
async fn gone_before_a_byte(client: &TcpStream) {
    let mut byte = [0u8; 1];
    if client.peek(&mut byte).await.is_ok() {
        std::future::pending::<()>().await;
    }
}

/// Copies both ways (client `a`, backend `b`) until both directions
/// ended; an error ends both, but a failed write to the backend (see
/// [`both_ways`]).
async fn copy_both_ways(
    a: &mut TcpStream,
    b: &mut TcpStream,
    activity: &Activity,
    moved: &Moved<'_>,
) -> std::io::Result<()> {
    let (a_read, a_write) = a.split();
    let (b_read, b_write) = b.split();
    let up_failed = UpFailed::default();
    let down_ended = Notify::new();
    let down = async {
        let ended = one_way(
            (b_read, Side::Backend),
            (a_write, Side::Client),
            activity,
            &moved.to_client,
            AfterEnd::HoldFinIf(&up_failed),
        )
        .await;
        down_ended.notify_one();
        ended
    };
    both_ways(
        one_way(
            (a_read, Side::Client),
            (b_write, Side::Backend),
            activity,
            &moved.to_backend,
            AfterEnd::WatchClient(&down_ended),
        ),
        down,
        &up_failed,
    )
    .await
}

/// What a way does once its side ended (sent its FIN).
enum AfterEnd<'a> {
    /// The way up: the FIN passed on, the client is watched for a reset
    /// until the way down ends (notified).
    WatchClient(&'a Notify),
    /// The way down: the backend closed its half (the shorter idle limit
    /// applies), and its FIN is held once the way up failed (the tunnel
    /// ends in a reset, see `UpFailed`).
    HoldFinIf(&'a UpFailed),
}

/// Resolves with the client's reset if one comes before the way down ends
/// (`down_ended`): a client that closed its half and then vanished (a
/// reset) is passed on to the backend at once, which otherwise worked on
/// for no one until it wrote, or the tunnel's hour ran out.
async fn reset_or(client: &TcpStream, down_ended: &Notify) -> std::io::Result<()> {
    tokio::select! {
        // A tunnel whose way down ended is whole, whatever came after.
        biased;
        () = down_ended.notified() => Ok(()),
        ready = client.ready(Interest::ERROR) => {
            ready?;
            let reset = client.take_error()?;
            Err(reset.unwrap_or_else(|| std::io::ErrorKind::ConnectionReset.into()))
        }
    }
}

/// Copies both ways when either side is a TLS session, as
/// `copy_both_ways` does, each way a `relay` (a buffer lent while bytes
/// are on their way; the sessions hold buffers of their own).
async fn copy_through<S: ByteStream, B: ByteStream>(
    client: &mut S,
    backend: &mut B,
    activity: &Arc<Activity>,
    moved: &Moved<'_>,
) -> std::io::Result<()> {
    let (client_read, client_write) = client.halves();
    let (backend_read, backend_write) = backend.halves();
    let mut client_read =
        Observed::new(Sided::new(client_read, Side::Client), Arc::clone(activity));
    let mut backend_read = Observed::new(
        Sided::new(backend_read, Side::Backend),
        Arc::clone(activity),
    );
    let mut backend_write =
        Counting::new(Sided::new(backend_write, Side::Backend), &moved.to_backend);
    let mut client_write = Counting::new(Sided::new(client_write, Side::Client), &moved.to_client);
    let up_failed = UpFailed::default();
    both_ways(
        async {
            relay(&mut client_read, &mut backend_write).await?;
            backend_write.shutdown().await
        },
        async {
            relay(&mut backend_read, &mut client_write).await?;
            activity.backend_closed();
            if up_failed.is_set() {
                return Ok(());
            }
            client_write.shutdown().await
        },
        &up_failed,
    )
    .await
}

/// Copies until `from` ends, then shuts down `to`'s write side and does
/// what `after` says. A read
/// buffer is a spare taken when bytes arrive and given back once they are
/// written. A short read marks the socket drained (tokio's `poll_read`),
/// so the next turn waits in the reactor instead of reading only to hear
/// EAGAIN: two reads a round trip, not four.
async fn one_way(
    (mut from, from_side): (ReadHalf<'_>, Side),
    (mut to, to_side): (WriteHalf<'_>, Side),
    activity: &Activity,
    moved: &Way<'_>,
    after: AfterEnd<'_>,
) -> std::io::Result<()> {
    let mut buf = BytesMut::new();
    loop {
        crate::stream::read_ready(from.as_ref())
            .await
            .map_err(on(from_side))?;
        match read_now(&mut from, &mut buf).await.map_err(on(from_side))? {
            None => continue,
            Some(0) => {
                return match after {
                    AfterEnd::HoldFinIf(failed) => {
                        activity.backend_closed();
                        match failed.is_set() {
                            true => Ok(()),
                            false => to.shutdown().await.map_err(on(to_side)),
                        }
                    }
                    AfterEnd::WatchClient(down_ended) => {
                        to.shutdown().await.map_err(on(to_side))?;
                        reset_or(from.as_ref(), down_ended)
                            .await
                            .map_err(on(from_side))
                    }
                };
            }
            Some(_) => {}
        }
        activity.touch();
        let written = write_counted(&mut to, &buf, moved).await;
        buf.clear();
        release_if_empty(&mut buf);
        written.map_err(on(to_side))?;
    }
}

/// Writes `bytes` whole, counting each part as it goes: a copy cut part
/// way through (`tunnel_timeout`, a forced drain, a peer's reset) counts
/// what reached the other side, where a count after the whole write lost
/// the part written of the last piece.
async fn write_counted(
    to: &mut WriteHalf<'_>,
    bytes: &[u8],
    moved: &Way<'_>,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        let wrote = to.write(&bytes[done..]).await?;
        if wrote == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += wrote;
        moved.add(wrote as u64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    /// A side that sends `chunks` then fails, as a backend that resets.
    struct SendsThenFails(Vec<Vec<u8>>);

    impl AsyncRead for SendsThenFails {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.0.is_empty() {
                let reset = std::io::ErrorKind::ConnectionReset;
                return Poll::Ready(Err(reset.into()));
            }
            let chunk = self.0.remove(0);
            buf.put_slice(&chunk);
            Poll::Ready(Ok(()))
        }
    }

    /// A writer that takes bytes before its socket does, as a TLS session:
    /// what it took goes on only when it is flushed.
    #[derive(Default)]
    struct Session {
        taken: usize,
        sent: usize,
    }

    impl AsyncWrite for Session {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.taken += buf.len();
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.sent = self.taken;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    /// A side that fails after sending finds all it sent gone on through a
    /// TLS session before the failure ends the copy (the reset after it
    /// then lands behind every byte). `tokio::io::copy` flushed only when
    /// a read waited, and a read that failed at once left the session's
    /// bytes unsent.
    #[tokio::test]
    async fn what_a_side_sent_before_failing_leaves_the_session_first() {
        let mut from = SendsThenFails(vec![vec![1; 1000], vec![2; 500]]);
        let mut to = Session::default();
        let ended = super::relay(&mut from, &mut to).await;
        assert_eq!(
            ended.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset)
        );
        assert_eq!((to.taken, to.sent), (1500, 1500));
    }
}
