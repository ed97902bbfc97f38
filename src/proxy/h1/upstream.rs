//! The backend connection an exchange goes out on, and where it goes back
//! after a clean end. Most go to the backend's idle list, for any client's
//! next request. One that began with a client's PROXY header (`send_proxy`)
//! names that client, so it is kept by that client's connection alone, for
//! its next request to the same backend, and closes with it.

use bytes::BytesMut;
use tokio::time::Instant;

use crate::backend::idle::{still_open, IDLE_LIMIT};
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
}

/// A kept connection to `backend` (the client's own, under `send_proxy`;
/// else one from the backend's idle list), or a new one. `request_id`
/// names the exchange in a new connection's PROXY header.
pub async fn connection<S: ByteStream>(
    client: &mut Client<S>,
    backend: &Backend,
    fresh_only: bool,
    connect_timeout: std::time::Duration,
    request_id: &RequestId,
) -> Result<Upstream, ProxyError> {
    if let (false, Some(_)) = (fresh_only, backend.send_proxy) {
        let kept = client
            .kept
            .take()
            .filter(|k| k.backend == backend.index && usable(k));
        if let Some(kept) = kept {
            return Ok(Upstream::kept(kept.stream));
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
    open(backend, header.as_deref(), fresh_only, connect_timeout).await
}

/// A connection from the backend's idle list (unless `fresh_only`, or
/// when it begins with a client's PROXY `header`: such a one is never
/// shared), or a new one.
pub async fn open(
    backend: &Backend,
    header: Option<&[u8]>,
    fresh_only: bool,
    connect_timeout: std::time::Duration,
) -> Result<Upstream, ProxyError> {
    if header.is_none() && !fresh_only {
        if let Some(stream) = backend.idle.take() {
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

/// Keeps a connection that ended cleanly with keep-alive on both sides:
/// the client's own under `send_proxy`, else the backend's idle list.
pub fn keep<S>(client: &mut Client<S>, backend: &Backend, mut stream: BackendStream) {
    match backend.send_proxy {
        None => backend.idle.put(stream),
        Some(_) if !holds_nothing_back(&mut stream) => {}
        Some(_) => {
            client.kept = Some(Kept {
                backend: backend.index,
                stream,
                since: Instant::now(),
            })
        }
    }
}

/// Within the idle limit the backend lists use, and not closed meanwhile.
fn usable(kept: &Kept) -> bool {
    kept.since.elapsed() < IDLE_LIMIT && still_open(kept.stream.tcp())
}
