//! A connection after a 101: the client's and the backend's joined until
//! both end, with the exchange's record held to log it then. It runs
//! outside the exchange that switched (`Served::Upgraded`), boxed at its
//! own size: an idle WebSocket holds the tunnel's state, not the largest
//! state a request ever needs.

use std::sync::atomic::AtomicU64;

use super::exchange::Client;
use super::io::{ack_promptly, release_if_empty, write_all, Counting};
use super::record::Record;
use super::upstream::Upstream;
use crate::access_log::{Phase, Termination};
use crate::backend::Lease;
use crate::lifecycle::drain::DrainWatch;
use crate::metrics::UpstreamErrorKind;
use crate::proxy::longlived::{self, TunnelEnd};
use crate::proxy::reset;
use crate::proxy::side::Side;
use crate::proxy::web::HttpProxy;
use crate::stream::ByteStream;

/// A backend connection that answered 101.
pub struct Switched {
    pub up: Upstream,
    /// The upgrade is to WebSocket (its frames are counted).
    pub websocket: bool,
}

/// An upgraded exchange: its record, the backend's place it holds, and
/// the backend connection it switched.
pub struct Tunnel<'p> {
    record: Record<'p>,
    lease: Lease,
    switched: Switched,
    /// Request body bytes read before the switch.
    body_bytes: u64,
}

impl<'p> Tunnel<'p> {
    pub(super) fn new(
        record: Record<'p>,
        lease: Lease,
        switched: Switched,
        body_bytes: u64,
    ) -> Tunnel<'p> {
        Tunnel {
            record,
            lease,
            switched,
            body_bytes,
        }
    }

    /// Carries the tunnel until it ends, then logs and counts it as a
    /// TCP-mode connection's end is (`cD`, `SD`, `CD`). The connection
    /// closes after. Not an `async fn`: the tunnel is taken out of its box
    /// as the future is made (the box freed then), and its parts are the
    /// future's own, used in place, where an `async fn` would keep its
    /// argument and the parts taken from it both (rust-lang/rust#62958).
    pub fn run<'a, S: ByteStream>(
        self: Box<Self>,
        proxy: &'a HttpProxy,
        client: &'a mut Client<S>,
        drain: &'a DrainWatch,
    ) -> impl std::future::Future<Output = ()> + use<'a, 'p, S> {
        let Tunnel {
            mut record,
            lease,
            switched,
            body_bytes,
        } = *self;
        async move {
            let moved = Moved {
                down: &record.trace.attempt.bytes_out,
                up: &record.trace.attempt.tunnelled_in,
            };
            let end = tunnel(proxy, client, switched, drain, moved).await;
            record.trace.note();
            let termination = match end {
                TunnelEnd::Closed => {
                    record.trace.status = Some(101);
                    Termination::Completed
                }
                TunnelEnd::Idle => Termination::ClientTimeout(Phase::Data),
                TunnelEnd::Failed(Side::Backend) => {
                    let backend = lease.backend();
                    backend.upstream_failed(
                        UpstreamErrorKind::Protocol,
                        "upgraded tunnel broke off",
                        false,
                    );
                    // Said, as TCP mode says a session the backend broke:
                    // else only a count and `/status` told of it.
                    if crate::telemetry::may_say_backend_fault() {
                        tracing::info!(listener = %proxy.listener, pool = %backend.pool, backend = %backend.label, request_id = %record.trace.request_id, "backend broke off an upgraded connection (a WebSocket); resetting the client's");
                    }
                    Termination::BackendFailed(Phase::Data)
                }
                TunnelEnd::Failed(Side::Client) => Termination::ClientAborted(Phase::Data),
            };
            record.end(termination, body_bytes);
        }
    }
}

/// Where a tunnel counts the bytes it moves, for the access log.
struct Moved<'a> {
    /// To the client.
    down: &'a AtomicU64,
    /// From the client to the backend.
    up: &'a AtomicU64,
}

/// After a 101: what either side sent past the switch goes first, then the
/// two connections are joined until both end, a FIN either way passed on
/// (the lease is held meanwhile).
/// A side that fails has the other reset, once it took what it was sent,
/// as in TCP mode; the client's is then closed with no FIN ahead of it
/// (`Client::reset`).
async fn tunnel<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    switched: Switched,
    drain: &DrainWatch,
    moved: Moved<'_>,
) -> TunnelEnd {
    let Switched { mut up, websocket } = switched;
    let end = joined(proxy, client, &mut up, websocket, drain, moved).await;
    match end {
        TunnelEnd::Failed(Side::Backend) => {
            reset::once_taken(client.stream.tcp()).await;
            client.reset = true;
        }
        TunnelEnd::Failed(Side::Client) => reset::once_taken(up.stream.tcp()).await,
        TunnelEnd::Closed | TunnelEnd::Idle => {}
    }
    end
}

/// The tunnel's bytes: what each side sent past the switch, then both
/// ways until it ends.
async fn joined<S: ByteStream>(
    proxy: &HttpProxy,
    client: &mut Client<S>,
    up: &mut Upstream,
    websocket: bool,
    drain: &DrainWatch,
    moved: Moved<'_>,
) -> TunnelEnd {
    let stall = proxy.idle_timeout;
    // A tunnel's bytes may come in any rhythm: as on a TCP-mode listener.
    ack_promptly(&client.stream);
    longlived::keep_alive(client.stream.tcp());
    longlived::keep_alive(up.stream.tcp());
    // The backend's first: owed to the client even if the client's own
    // early bytes then find the backend gone.
    let mut to_client = Counting::new(&mut client.stream, moved.down);
    if !up.buf.is_empty() && write_all(&mut to_client, &up.buf, stall).await.is_err() {
        return TunnelEnd::Failed(Side::Client);
    }
    let mut to_backend = Counting::new(&mut up.stream, moved.up);
    if !client.buf.is_empty()
        && write_all(&mut to_backend, &client.buf, stall)
            .await
            .is_err()
    {
        return TunnelEnd::Failed(Side::Backend);
    }
    // Both buffers go back now: an idle WebSocket held them for the hour.
    client.buf.clear();
    release_if_empty(&mut client.buf);
    let frames = longlived::frames_sent(websocket, &up.buf);
    up.buf.clear();
    release_if_empty(&mut up.buf);
    longlived::tunnel(
        &mut to_client,
        &mut to_backend,
        frames,
        drain.clone(),
        &proxy.listener,
        longlived::TunnelLimits {
            tunnel: proxy.tunnel_timeout,
            half_closed: proxy.idle_timeout,
        },
    )
    .await
}
