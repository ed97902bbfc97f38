//! The backend connection an exchange goes out on, and where it goes back
//! after a clean end. Most go to the backend's idle list, for any client's
//! next request. One that began with a client's PROXY header (`send_proxy`)
//! names that client, so it is kept by that client's connection alone, for
//! its next request to the same backend, and closes with it.

use bytes::BytesMut;
use tokio::time::Instant;

use crate::backend::idle::{still_open, Check, IDLE_LIMIT};
use crate::backend::stream::{holds_nothing_back, BackendStream};
use crate::backend::Backend;
use crate::proxy::request_id::RequestId;
use crate::proxy::ProxyError;
use crate::proxy_protocol::send::Speaker;
use crate::stream::ByteStream;

use super::exchange::Client;

/// A backend connection for one exchange.
pub struct Upstream {
    pub stream: BackendStream,
    pub buf: BytesMut,
    /// Kept from an earlier exchange: it may have been closed under us.
    pub reused: bool,
}

/// A backend connection that speaks for one client (it carried its PROXY
/// header), kept between that client's requests.
pub struct Kept {
    backend: usize,
    stream: BackendStream,
    since: Instant,
    /// As its last response asks (see [`Check::after_response`]).
    check: Check,
}

/// A kept connection to `backend` (the client's own, under `send_proxy`;
/// else one from the backend's idle list) found usable by `reuse`'s check,
/// or a new one (always, when `reuse` is `None`). `request_id` names the
/// exchange in a new connection's PROXY header.
pub async fn connection<S: ByteStream>(
    client: &mut Client<S>,
    backend: &Backend,
    reuse: Option<Check>,
    connect_timeout: std::time::Duration,
    request_id: &RequestId,
) -> Result<Upstream, ProxyError> {
    if let (Some(check), Some(_)) = (reuse, backend.send_proxy) {
        if let Some(kept) = client.kept.take() {
            if kept.backend == backend.index && usable(&kept, check) {
                return Ok(Upstream::kept(kept.stream));
            }
            kept.stream.close_quietly();
        }
    }
    let header = backend.send_proxy.map(|version| {
        // Made once per client connection: its TLS facts take a parse of
        // the client's certificate.
        let speaker = client
            .speaker
            .get_or_insert_with(|| Box::new(Speaker::of(&client.stream, client.origin)));
        speaker.header(version, request_id.as_str())
    });
    open(backend, header.as_deref(), reuse, connect_timeout).await
}

/// A connection from the backend's idle list, found usable by `reuse`'s
/// check (unless `reuse` is `None`, or a client's PROXY `header` begins
/// the connection: such a one is never shared), or a new one.
pub async fn open(
    backend: &Backend,
    header: Option<&[u8]>,
    reuse: Option<Check>,
    connect_timeout: std::time::Duration,
) -> Result<Upstream, ProxyError> {
    if let (None, Some(check)) = (header, reuse) {
        if let Some(stream) = backend.idle.take(check) {
            return Ok(Upstream::kept(stream));
        }
        if let Some(stream) = backend.idle_elsewhere() {
            return Ok(Upstream::kept(stream));
        }
    }
    let stream = backend
        .connect(connect_timeout, header)
        .await
        .map_err(|fault| ProxyError::connect(backend, &fault))?;
    Ok(Upstream {
        stream,
        buf: BytesMut::new(),
        reused: false,
    })
}

impl Upstream {
    fn kept(stream: BackendStream) -> Upstream {
        Upstream {
            stream,
            buf: BytesMut::new(),
            reused: true,
        }
    }
}

/// Keeps a connection that ended cleanly with keep-alive on both sides,
/// to be checked at least as `check` says before its next exchange: the
/// client's own under `send_proxy`, else the backend's idle list.
pub fn keep<S>(client: &mut Client<S>, backend: &Backend, mut stream: BackendStream, check: Check) {
    match backend.send_proxy {
        None => backend.idle.put(stream, check),
        Some(_) if !holds_nothing_back(&mut stream) => stream.close_quietly(),
        Some(_) => {
            client.kept = Some(Kept {
                backend: backend.index,
                stream,
                since: Instant::now(),
                check,
            })
        }
    }
}

/// Closes the connection kept for `client` as its own connection ends: a
/// TLS backend gets its `close_notify` (dropped, each was a truncated
/// session in the backend's log).
pub fn close_kept<S>(client: &mut Client<S>) {
    if let Some(kept) = client.kept.take() {
        kept.stream.close_quietly();
    }
}

/// Within the idle limit the backend lists use, and not closed meanwhile
/// (checked as the request's `check` or the kept one's, the stricter).
fn usable(kept: &Kept, check: Check) -> bool {
    kept.since.elapsed() < IDLE_LIMIT && still_open(kept.stream.tcp(), check.max(kept.check))
}
