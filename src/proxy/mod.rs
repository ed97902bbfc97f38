//! One connection's life, by protocol: `tcp` splices bytes, `http` tells
//! HTTP/1 (`h1`, baton's own path) from h2c (`h2`, hyper's). Failures are
//! classified here once, which decides the status a client sees, the log
//! level and the metric label.

pub mod activity;
pub mod body;
pub mod clock;
pub mod h1;
pub mod h2;
pub mod h2_record;
pub mod head;
pub mod headers;
pub mod idle;
pub mod longlived;
pub mod tcp;
pub mod web;

use http::StatusCode;

use crate::access_log::{Marks, Phase, Termination};
use crate::backend::stream::ConnectFault;
use crate::backend::{Backend, NoLease};
use crate::metrics::UpstreamErrorKind;

/// A request id unique on this host for a long while: this process's pid
/// and a per-process count, in hex. Ties what a client was told to the log.
/// Made for every request, so written by hand: `format!` and a `getpid`
/// each time cost 4 % of an exchange's instructions (callgrind).
pub fn request_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    static PID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = *PID.get_or_init(|| u64::from(std::process::id()));
    let mut id = String::with_capacity(24);
    push_hex(&mut id, pid);
    id.push('-');
    push_hex(&mut id, n);
    id
}

/// `value` in lower-case hex, without leading zeros.
fn push_hex(out: &mut String, value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let nibbles = (64 - value.leading_zeros()).div_ceil(4).max(1);
    for i in (0..nibbles).rev() {
        out.push(char::from(DIGITS[((value >> (i * 4)) & 0xf) as usize]));
    }
}

/// An exchange's id: the client's own `X-Request-Id` (`sent`) where the
/// listener believes what its clients say of themselves (`forwarded`
/// other than `replace`), else a new one. Only a short printable one is
/// kept: it also goes into a PROXY v2 header, at most 128 bytes.
pub fn request_id_from(sent: Option<&[u8]>, forwarded: crate::config::Forwarded) -> String {
    let kept = sent
        .filter(|_| forwarded != crate::config::Forwarded::Replace)
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.iter().all(u8::is_ascii_graphic));
    match kept {
        Some(id) => String::from_utf8_lossy(id).into_owned(),
        None => request_id(),
    }
}

/// Work a listener could give to no backend of `pool`: counted and
/// logged, the same for every protocol.
pub fn no_backend(listener: &str, pool: &str) {
    crate::metrics::no_backend(listener, pool);
    tracing::warn!(listener, pool, "no backend available");
}

/// The body of baton's answer to a failed request: the status and a
/// request id, never a backend's name, address or OS error: those go to
/// the log under the same id (and the backend's `last_error` in `/status`).
pub fn error_page(pool: &str, err: &ProxyError, id: &str) -> String {
    let status = err.status();
    tracing::info!(request_id = %id, status = status.as_u16(), pool, cause = %err, "answered with an error");
    let reason = status.canonical_reason().unwrap_or("Error");
    format!("{} {reason}\nrequest id: {id}\n", status.as_u16())
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("bad request: {why}")]
    Client { why: &'static str },
    #[error("no request body within {seconds}s")]
    ClientTimeout { seconds: f64 },
    #[error("no backend of pool \"{pool}\" can take the request")]
    NoBackend { pool: String },
    #[error("every backend of pool \"{pool}\" stayed at its cap for queue_timeout")]
    QueueTimeout { pool: String },
    #[error("backend {backend} ({address}) unreachable: {cause}")]
    Connect {
        backend: String,
        address: std::net::SocketAddr,
        cause: String,
    },
    #[error("backend {backend} did not answer within {seconds}s")]
    Timeout { backend: String, seconds: f64 },
    #[error("backend {backend} failed: {cause}")]
    Upstream { backend: String, cause: String },
}

impl ProxyError {
    /// A connection to `backend` that was not made.
    pub fn connect(backend: &Backend, fault: &ConnectFault) -> ProxyError {
        ProxyError::Connect {
            backend: backend.name.clone(),
            address: backend.address,
            cause: fault.to_string(),
        }
    }

    /// Charges this failure to `backend`, once, whatever the protocol: the
    /// error counter by kind, the passive health verdict (a connect
    /// failure or a timeout counts against it; a broken response does
    /// not, its connection may have been the only bad one), and the log.
    pub fn blame(&self, backend: &Backend) {
        if let Some(kind) = self.upstream_kind() {
            let blames_backend = matches!(
                self,
                ProxyError::Connect { .. } | ProxyError::Timeout { .. }
            );
            backend.upstream_failed(kind, &self.to_string(), blames_backend);
        }
        tracing::warn!(backend = %backend.name, cause = %self, "backend request failed");
    }

    /// A pool that gave no lease.
    pub fn refused(pool: &str, why: NoLease) -> ProxyError {
        let pool = pool.to_string();
        match why {
            NoLease::NoBackend => ProxyError::NoBackend { pool },
            NoLease::QueueTimeout => ProxyError::QueueTimeout { pool },
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Client { .. } => StatusCode::BAD_REQUEST,
            ProxyError::ClientTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::NoBackend { .. } | ProxyError::QueueTimeout { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::Connect { .. } | ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The client broke the request: nothing more on its connection can
    /// be trusted.
    pub fn is_client_fault(&self) -> bool {
        matches!(
            self,
            ProxyError::Client { .. } | ProxyError::ClientTimeout { .. }
        )
    }

    /// Who an exchange answered with this error blames, and when (the
    /// access log's termination state).
    pub fn termination(&self, marks: &Marks) -> Termination {
        match self {
            ProxyError::Client { .. } => Termination::Refused,
            ProxyError::ClientTimeout { .. } => Termination::ClientTimeout(Phase::Request),
            ProxyError::NoBackend { .. } => Termination::BackendFailed(Phase::Queue),
            ProxyError::QueueTimeout { .. } => Termination::QueueTimeout,
            ProxyError::Connect { .. } => Termination::BackendFailed(Phase::Connect),
            ProxyError::Timeout { .. } => Termination::BackendTimeout(Phase::Head),
            // It had a connection: it failed before its head, or after.
            ProxyError::Upstream { .. } => Termination::BackendFailed(if marks.head.is_some() {
                Phase::Data
            } else {
                Phase::Head
            }),
        }
    }

    /// The `kind` label of `baton_upstream_errors_total`, if it counts there.
    pub fn upstream_kind(&self) -> Option<UpstreamErrorKind> {
        match self {
            ProxyError::Client { .. }
            | ProxyError::ClientTimeout { .. }
            | ProxyError::NoBackend { .. }
            | ProxyError::QueueTimeout { .. } => None,
            ProxyError::Connect { .. } => Some(UpstreamErrorKind::Connect),
            ProxyError::Timeout { .. } => Some(UpstreamErrorKind::Timeout),
            ProxyError::Upstream { .. } => Some(UpstreamErrorKind::Protocol),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids_are_pid_and_count_in_hex() {
        let (a, b) = (super::request_id(), super::request_id());
        let pid = format!("{:x}", std::process::id());
        let count = |id: &str| {
            let (p, n) = id.split_once('-').expect("pid-count");
            assert_eq!(p, pid);
            u64::from_str_radix(n, 16).expect("hex")
        };
        assert_eq!(count(&b), count(&a) + 1);
        let mut hex = String::new();
        super::push_hex(&mut hex, 0);
        super::push_hex(&mut hex, 0xabc0_0001);
        assert_eq!(hex, "0abc00001");
    }
}
