//! One connection's life, by protocol: `tcp` splices bytes, `http` tells
//! HTTP/1 (`h1`, baton's own path) from h2c (`h2`, its own h2 server). Failures are
//! classified here once, which decides the status a client sees, the log
//! level and the metric label.

pub mod activity;
pub mod body;
pub mod clock;
pub mod delivery;
pub mod h1;
pub mod h2;
pub mod headers;
pub mod idle;
pub mod longlived;
pub mod pace;
pub mod request_id;
pub mod reset;
pub mod side;
pub mod tcp;
pub mod web;

use http::StatusCode;

use crate::access_log::{Marks, Phase, Termination};
use crate::backend::stream::ConnectFault;
use crate::backend::{Backend, NoLease};
use crate::metrics::UpstreamErrorKind;

/// Work a listener could give to no backend of `pool`: counted and
/// logged, the same for every protocol.
pub fn no_backend(listener: &str, pool: &str) {
    crate::metrics::no_backend(listener, pool);
    if crate::telemetry::may_say_backend_fault() {
        tracing::warn!(listener, pool, "no backend available");
    }
}

/// The body of baton's answer to a failed request: the status and a
/// request id, never a backend's name, address or OS error: those go to
/// the log under the same id, within the budget of fault lines (and to the
/// backend's `last_error` in `/status`).
pub fn error_page(pool: &str, err: &ProxyError, id: &str) -> String {
    let status = err.status();
    let within_budget = if err.is_client_fault() {
        crate::telemetry::may_say_client_fault()
    } else {
        crate::telemetry::may_say_backend_fault()
    };
    if within_budget {
        tracing::info!(request_id = %id, status = status.as_u16(), pool, cause = %err, "answered with an error");
    }
    let reason = status.canonical_reason().unwrap_or("Error");
    format!("{} {reason}\nrequest id: {id}\n", status.as_u16())
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("bad request: {why}")]
    Client { why: &'static str },
    /// An h2 request with more fields than an HTTP/1 head may carry (431).
    #[error("request head with more than {max} fields")]
    TooManyFields { max: usize },
    /// An h2 request whose field list is larger than baton's bound
    /// (SETTINGS_MAX_HEADER_LIST_SIZE, as an HTTP/1 head's size is) (431).
    #[error("request header list larger than {max} bytes")]
    ListTooLarge { max: u32 },
    /// An h2 request with an `Expect` other than `100-continue`, which no
    /// one on the way will meet (417, as on the HTTP/1 path).
    #[error("an Expect other than 100-continue")]
    ExpectationFailed,
    #[error("no request body within {seconds}s")]
    ClientTimeout { seconds: f64 },
    #[error("request body slower than body_min_rate ({rate} bytes a second)")]
    BodyTooSlow { rate: u64 },
    /// The client went away while its body was coming (h2: it reset the
    /// stream, or its connection broke): nobody is there to answer.
    #[error("the client went away while sending its request")]
    ClientLeft,
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
    /// baton itself ran short (fds, memory) connecting to it.
    #[error("no connection to backend {backend} ({address}): baton ran short: {cause}")]
    Shortage {
        backend: String,
        address: std::net::SocketAddr,
        cause: String,
    },
    #[error("backend {backend} did not answer within {seconds}s")]
    Timeout { backend: String, seconds: f64 },
    #[error("backend {backend} failed: {cause}")]
    Upstream { backend: String, cause: String },
    /// The backend closed or reset while the request body was still
    /// going up, with no answer: it would not take the whole request (one
    /// over its size limit, a crash mid-upload), where `Upstream` before a
    /// head is one that took it and then failed.
    #[error("backend {backend} stopped taking the request: {cause}")]
    RequestCutOff { backend: String, cause: String },
}

impl ProxyError {
    /// A connection to `backend` that was not made.
    pub fn connect(backend: &Backend, fault: &ConnectFault) -> ProxyError {
        if let ConnectFault::Shortage(err) = fault {
            return ProxyError::Shortage {
                backend: backend.name.clone(),
                address: backend.address,
                cause: err.to_string(),
            };
        }
        ProxyError::Connect {
            backend: backend.name.clone(),
            address: backend.address,
            cause: fault.to_string(),
        }
    }

    /// Charges this failure to `backend`, once, whatever the protocol, and
    /// says it under the request's id (none on a TCP listener), the id an
    /// error page gives the client.
    pub fn blame(&self, backend: &Backend, request_id: Option<&str>) {
        self.charge(backend);
        self.say(backend, request_id, "backend request failed");
    }

    /// The same for a request (or TCP session) that may go on to another
    /// backend: one line that says both, so a failed request spends less
    /// of the budget. Said before one is looked for: where none can take
    /// it, the answer is this failure's (its 502, logged under the same id).
    pub fn blame_and_retry(&self, backend: &Backend, request_id: Option<&str>) {
        self.charge(backend);
        let what = "backend request failed; sending it to another backend if one can take it";
        self.say(backend, request_id, what);
    }

    fn say(&self, backend: &Backend, request_id: Option<&str>, what: &str) {
        if crate::telemetry::may_say_backend_fault() {
            let request_id = request_id.map(tracing::field::display);
            tracing::warn!(pool = %backend.pool, backend = %backend.label, request_id, cause = %self, "{what}");
        }
    }

    /// The error counter by kind, and the passive health verdict: a
    /// connect failure or a timeout counts against the backend; a broken
    /// response does not, its connection may have been the only bad one.
    fn charge(&self, backend: &Backend) {
        if let Some(kind) = self.upstream_kind() {
            let blames_backend = matches!(
                self,
                ProxyError::Connect { .. } | ProxyError::Timeout { .. }
            );
            backend.upstream_failed(kind, &self.to_string(), blames_backend);
        }
    }

    /// `backend`'s connection failed (`cause`) before a byte of its
    /// answer came.
    pub fn closed_before_a_response(backend: &Backend, cause: &str) -> ProxyError {
        ProxyError::Upstream {
            backend: backend.name.clone(),
            cause: format!("no response: {cause}"),
        }
    }

    /// A pool that gave no lease, as the answer: a queue timeout is
    /// counted here, not where the wait ended, as a retry that timed out
    /// in line answers with its first attempt's failure instead.
    pub fn refused(pool: &str, why: NoLease) -> ProxyError {
        let pool = pool.to_string();
        match why {
            NoLease::NoBackend => ProxyError::NoBackend { pool },
            NoLease::QueueTimeout => {
                crate::metrics::queue_timeout(&pool);
                ProxyError::QueueTimeout { pool }
            }
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Client { .. } | ProxyError::ClientLeft => StatusCode::BAD_REQUEST,
            ProxyError::TooManyFields { .. } | ProxyError::ListTooLarge { .. } => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            ProxyError::ExpectationFailed => StatusCode::EXPECTATION_FAILED,
            ProxyError::ClientTimeout { .. } | ProxyError::BodyTooSlow { .. } => {
                StatusCode::REQUEST_TIMEOUT
            }
            ProxyError::NoBackend { .. }
            | ProxyError::QueueTimeout { .. }
            | ProxyError::Shortage { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Connect { .. }
            | ProxyError::Upstream { .. }
            | ProxyError::RequestCutOff { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The client broke the request: nothing more on its connection can
    /// be trusted.
    pub fn is_client_fault(&self) -> bool {
        matches!(
            self,
            ProxyError::Client { .. }
                | ProxyError::TooManyFields { .. }
                | ProxyError::ListTooLarge { .. }
                | ProxyError::ExpectationFailed
                | ProxyError::ClientTimeout { .. }
                | ProxyError::BodyTooSlow { .. }
                | ProxyError::ClientLeft
        )
    }

    /// Who an exchange answered with this error blames, and when (the
    /// access log's termination state).
    pub fn termination(&self, marks: &Marks) -> Termination {
        match self {
            ProxyError::Client { .. }
            | ProxyError::TooManyFields { .. }
            | ProxyError::ListTooLarge { .. }
            | ProxyError::ExpectationFailed => Termination::Refused,
            ProxyError::ClientTimeout { .. } | ProxyError::BodyTooSlow { .. } => {
                Termination::ClientTimeout(Phase::Request)
            }
            ProxyError::ClientLeft => Termination::ClientAborted(Phase::Request),
            ProxyError::NoBackend { .. } => Termination::BackendFailed(Phase::Queue),
            ProxyError::QueueTimeout { .. } => Termination::QueueTimeout,
            ProxyError::Connect { .. } => Termination::BackendFailed(Phase::Connect),
            ProxyError::Shortage { .. } => Termination::Shortage,
            ProxyError::Timeout { .. } => Termination::BackendTimeout(Phase::Head),
            ProxyError::RequestCutOff { .. } => Termination::BackendFailed(Phase::Request),
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
            | ProxyError::TooManyFields { .. }
            | ProxyError::ListTooLarge { .. }
            | ProxyError::ExpectationFailed
            | ProxyError::ClientTimeout { .. }
            | ProxyError::BodyTooSlow { .. }
            | ProxyError::ClientLeft
            | ProxyError::NoBackend { .. }
            | ProxyError::QueueTimeout { .. }
            | ProxyError::Shortage { .. } => None,
            ProxyError::Connect { .. } => Some(UpstreamErrorKind::Connect),
            ProxyError::Timeout { .. } => Some(UpstreamErrorKind::Timeout),
            ProxyError::Upstream { .. } | ProxyError::RequestCutOff { .. } => {
                Some(UpstreamErrorKind::Protocol)
            }
        }
    }
}
