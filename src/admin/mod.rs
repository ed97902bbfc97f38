//! The admin surface: probes, status and metrics over hyper, on its own
//! listener (handed over like any other, so no probe is refused during a
//! reload). It reads shared state through [`AdminShared`]'s narrow handles
//! and never reaches into connections.

mod bounded;
pub mod client;
mod generations;
mod places;
mod port_holder;
mod render;
mod routes;

pub use render::Renderer;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use http::header::{HeaderValue, CONNECTION};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::Pool;
use crate::config::{AdminConfig, Protocol};
use crate::connection::ListenerStats;
use crate::lifecycle::{control, Phase};
use crate::shortage::{self, Refill, SpareFd};
use crate::telemetry::{accept_failed, Throttle};

/// This generation, as `/status` reports it.
#[derive(Debug, Clone)]
pub struct GenerationInfo {
    pub number: u64,
    pub pid: u32,
    pub started_at: SystemTime,
}

/// One listener, as `/status` reports it.
pub struct ListenerView {
    pub name: String,
    pub bind: SocketAddr,
    pub protocol: Protocol,
    pub stats: Arc<ListenerStats>,
    /// The accept queues of its listening sockets.
    pub queues: Vec<Arc<crate::metrics::kernel::AcceptQueue>>,
}

impl ListenerView {
    /// Connections in the kernel accept queues of its sockets.
    pub fn backlog(&self) -> u64 {
        self.queues.iter().map(|q| q.waiting()).sum()
    }
}

/// What the data plane looks like once built (absent during start-up).
#[derive(Default)]
pub struct Topology {
    pub listeners: Vec<ListenerView>,
    pub pools: Vec<Arc<Pool>>,
}

/// Everything the admin server may read.
pub struct AdminShared {
    pub config: AdminConfig,
    pub generation: GenerationInfo,
    pub phase: watch::Receiver<Phase>,
    pub topology: RwLock<Arc<Topology>>,
    pub metrics: Option<PrometheusHandle>,
    /// What older generations reported (see `generations`).
    pub inherited: RwLock<crate::lifecycle::handoff::Report>,
    /// The listeners, pools and backends of our config: an inherited
    /// series naming any other is dropped (see `set_inherited`).
    pub configured: crate::metrics::exposition::Configured,
    /// Listeners whose draining connections `/metrics` has shown: set to 0
    /// once the older generation holding them is gone, not left at its
    /// last count (one our config lacks then leaves `/metrics`, see
    /// `exposition::without_gone`).
    pub draining_shown: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// True once a reload's new generation has taken our backends' states
    /// (at the go-ahead; false again if that reload fails after all). A
    /// drain or restore posted here after that would change only this
    /// generation, which no longer picks backends: it is refused, to be
    /// sent again to the serving one. Held across a post and across the
    /// taking, so a post lands wholly before the states are taken, or is
    /// refused.
    pub handed_over: std::sync::Mutex<bool>,
    /// The thread that renders `/metrics`, one scrape at a time.
    pub rendering: render::Renderer,
    /// Every admin connection's task: a stop waits for them (briefly) once
    /// the admin closed, so that what was queued at the close is answered,
    /// not reset by the exit.
    pub answering: TaskTracker,
    /// Worker threads that have stopped running (see `workers::watch`).
    pub stuck_workers: Arc<crate::workers::Stuck>,
}

impl AdminShared {
    pub fn set_topology(&self, topology: Topology) {
        if let Ok(mut t) = self.topology.write() {
            *t = Arc::new(topology);
        }
    }

    /// Takes the backends' states for a newer generation (`take`), from
    /// which point backend posts are refused.
    pub fn hand_over_backends<T>(&self, take: impl FnOnce() -> T) -> T {
        let mut handed = self
            .handed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *handed = true;
        take()
    }

    /// The reload that took them failed: this generation serves on, and
    /// takes backend posts again.
    pub fn keep_backends(&self) {
        *self
            .handed_over
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = false;
    }

    fn topology(&self) -> Arc<Topology> {
        self.topology
            .read()
            .map(|t| Arc::clone(&t))
            .unwrap_or_default()
    }
}

/// The admin server's listening socket (`admin.listen`).
pub enum AdminListener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// One admin connection, on either kind of socket.
enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AdminListener {
    /// The next connection, on whichever kind of socket this is.
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            AdminListener::Tcp(l) => l.accept().await.map(|(s, _)| Accepted::Tcp(s)),
            AdminListener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
        }
    }
}

impl Accepted {
    /// Itself if its peer may call the API. On a Unix socket only root and
    /// baton's own user may, as on the control socket: the socket's 0600
    /// is its access rule where baton made it, but one systemd made and
    /// handed over keeps the mode systemd gave it (0666 by default).
    /// Asked before the connection takes a place: a refused peer takes
    /// none (answered by [`refuse`], `refusing` bounding how many at
    /// once), so another local user's flood of connections cannot make
    /// allowed callers give theirs up.
    /// A refused one gives back the spare's place when it closes, if it
    /// took it (`spare`).
    fn admitted(self, refusing: &Arc<Semaphore>, spare: &Arc<SpareFd>) -> Option<Accepted> {
        let Accepted::Unix(stream) = self else {
            return Some(self);
        };
        match control::refused_peer(&stream) {
            Ok(None) => Some(Accepted::Unix(stream)),
            Ok(Some(uid)) => {
                if crate::telemetry::may_say_client_fault() {
                    tracing::warn!(uid, "admin connection refused: only root and baton's own user may call the API on its Unix socket");
                }
                let permit = Arc::clone(refusing).try_acquire_owned().ok();
                refuse(stream, uid, permit, spare.refilled_at_end());
                None
            }
            Err(err) => {
                tracing::warn!(cause = %err, "admin connection refused: SO_PEERCRED");
                drop(stream);
                spare.refill();
                None
            }
        }
    }

    /// Serves it (see [`answer`]).
    fn answer(
        self,
        state: Arc<AdminShared>,
        place: Option<places::Place>,
        stop: CancellationToken,
        kept: Kept,
    ) {
        match self {
            Accepted::Tcp(stream) => answer(stream, state, place, stop, kept),
            Accepted::Unix(stream) => answer(stream, state, place, stop, kept),
        }
    }
}

/// How an admin connection is kept: the spare fd's place given back once
/// it closes, and whether it holds that place now. One that does is not
/// kept alive after its request and gets 1 s, not 10, to send its head:
/// an idle connection would hold the place while probes meet EMFILE.
struct Kept {
    refill: Refill,
    in_spares_place: bool,
}

/// Refused peers answered at once, at most: past it one is just closed.
const REFUSALS_AT_ONCE: usize = 8;

/// Answers a refused peer's request with a 403 that names why (as the
/// control socket answers its refusal), rather than a bare close its
/// `baton status` would show as a broken connection; then closes. Bounded
/// by [`places::LEAVING_GRACE`]; without a `permit` (as many are being
/// answered as may be), closed at once.
fn refuse(stream: UnixStream, uid: u32, permit: Option<OwnedSemaphorePermit>, refill: Refill) {
    let Some(permit) = permit else {
        // The fd closed before the spare's place is taken back.
        drop(stream);
        drop(refill);
        return;
    };
    tokio::spawn(async move {
        // First in, so dropped last: after the connection's fd closed.
        let _refill = refill;
        let service = service_fn(move |_req| async move {
            Ok::<_, std::convert::Infallible>(routes::refused_peer(uid))
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .keep_alive(false)
            .max_buf_size(ADMIN_READ_BUFFER)
            .serve_connection(TokioIo::new(bounded::Bounded::new(stream)), service);
        let _ = tokio::time::timeout(places::LEAVING_GRACE, conn).await;
        drop(permit);
    });
}

/// The most an admin connection buffers of a request head: the API's
/// requests are a line and a few fields. hyper's default (about 400 KiB)
/// let the 256 connections `places` allows hold ~100 MiB of memory the
/// data plane shares.
const ADMIN_READ_BUFFER: usize = 16 * 1024;

/// Serves admin requests until `stop`, then lets open ones finish briefly.
/// At most `places::MAX_CONNECTIONS` at once: a newcomer past it makes the
/// oldest give its place up.
pub async fn serve(listener: AdminListener, state: Arc<AdminShared>, stop: CancellationToken) {
    let places = places::Places::new();
    let refusing = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let accept_errors = Throttle::new();
    let spare = SpareFd::new();
    loop {
        let (stream, in_spares_place) = tokio::select! {
            // Once stopped, not one more connection is taken from a free
            // choice (the next generation answers from now on).
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(stream) => (stream, false),
                // The spare's place takes it (`/healthz` answers).
                Err(err) if shortage::fd_table_full(&err) && spare.give_up() => {
                    match spare.taken_by(listener.accept()) {
                        Some(stream) => (stream, true),
                        None => continue,
                    }
                }
                Err(err) => {
                    accept_failed(&err, &accept_errors, "admin accept failed; backing off");
                    spare.refill();
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(stream) = stream.admitted(&refusing, &spare) else {
            continue;
        };
        let place = tokio::select! {
            biased;
            () = stop.cancelled() => None,
            place = places.take(&stop) => place,
        };
        let kept = Kept {
            refill: spare.refilled_at_end(),
            in_spares_place,
        };
        stream.answer(Arc::clone(&state), place, stop.clone(), kept);
    }
    // What was queued before the stop is answered, once, not reset by the
    // close.
    while let Ok(Ok(stream)) =
        tokio::time::timeout(std::time::Duration::ZERO, listener.accept()).await
    {
        if let Some(stream) = stream.admitted(&refusing, &spare) {
            let kept = Kept {
                refill: spare.refilled_at_end(),
                in_spares_place: false,
            };
            stream.answer(Arc::clone(&state), None, stop.clone(), kept);
        }
    }
}

/// Serves one admin connection in a task of its own, holding `place` (none
/// for one taken once `stop` fired). When its place's `ending` fires it
/// ends: a kept-alive connection finishes the request it is on and closes,
/// an idle one closes at once. At `stop` (the next generation answers from
/// then on) a scraper so reconnects to the next generation, instead of
/// reading this draining one's metrics and `/status` for the whole drain;
/// a connection that has not sent its first request yet is answered once,
/// with `Connection: close`. One that has sent nothing when a newcomer
/// needs its place is closed; one on a request gets
/// [`places::LEAVING_GRACE`] to finish it, then is cut.
fn answer<S>(
    stream: S,
    state: Arc<AdminShared>,
    place: Option<places::Place>,
    stop: CancellationToken,
    kept: Kept,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let answering = state.answering.clone();
    answering.spawn(async move {
        // First in, so dropped last: after the connection's fd closed.
        let _refill = kept.refill;
        let ending = place
            .as_ref()
            .map_or_else(|| stop.clone(), |p| p.ending.clone());
        let served = Arc::new(AtomicBool::new(false));
        let (seen, last) = (Arc::clone(&served), ending.clone());
        let service = service_fn(move |req| {
            let state = Arc::clone(&state);
            seen.store(true, Ordering::Relaxed);
            let last = last.is_cancelled();
            async move {
                let mut response = routes::respond(&state, req).await;
                if last {
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .keep_alive(!kept.in_spares_place)
            .max_buf_size(ADMIN_READ_BUFFER)
            .timer(TokioTimer::new())
            .header_read_timeout(std::time::Duration::from_secs(match kept.in_spares_place {
                true => 1,
                false => 10,
            }))
            .serve_connection(TokioIo::new(bounded::Bounded::new(stream)), service);
        tokio::pin!(conn);
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            () = ending.cancelled() => {
                let for_a_newcomer = !stop.is_cancelled();
                if served.load(Ordering::Relaxed) {
                    conn.as_mut().graceful_shutdown();
                } else if for_a_newcomer {
                    return;
                }
                if !for_a_newcomer {
                    conn.await
                } else if let Ok(ended) = tokio::time::timeout(places::LEAVING_GRACE, conn).await {
                    ended
                } else {
                    tracing::debug!("admin connection cut: asked to give its place up, it did not finish its response");
                    return;
                }
            }
        };
        drop(place);
        if let Err(err) = ended {
            tracing::debug!(cause = %err, "admin connection ended with an error");
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    use super::*;

    fn shared() -> Arc<AdminShared> {
        let (_, phase) = watch::channel(Phase::Active);
        Arc::new(AdminShared {
            config: AdminConfig {
                listen: crate::config::AdminListen::Tcp(([127, 0, 0, 1], 0).into()),
                liveness_paths: vec!["/healthz".into()],
                readiness_paths: vec!["/readyz".into()],
                token: None,
                token_file: None,
            },
            generation: GenerationInfo {
                number: 1,
                pid: 1,
                started_at: SystemTime::now(),
            },
            phase,
            topology: RwLock::default(),
            metrics: None,
            inherited: RwLock::default(),
            configured: Default::default(),
            draining_shown: Default::default(),
            handed_over: std::sync::Mutex::new(false),
            rendering: render::Renderer::start().expect("the render thread"),
            answering: TaskTracker::new(),
            stuck_workers: Arc::default(),
        })
    }

    /// A series the older generation reported once and then no more (a
    /// DNS member it retired during the handoff) keeps its count in what
    /// this generation carries; one reported again takes the new count.
    #[test]
    fn an_inherited_series_no_longer_reported_keeps_its_count() {
        use crate::lifecycle::handoff::Report;
        let state = shared();
        let report = |text: &str| Report {
            baseline: crate::metrics::exposition::baseline(text),
            generations: Vec::new(),
        };
        let family = "# TYPE baton_requests_total counter\n";
        state.set_inherited(report(&format!(
            "{family}baton_requests_total{{code=\"2xx\"}} 5\nbaton_requests_total{{code=\"5xx\"}} 3\n\n"
        )));
        state.set_inherited(report(&format!(
            "{family}baton_requests_total{{code=\"5xx\"}} 4\n\n"
        )));
        let carried = state.inherited.read().expect("lock").baseline.clone();
        let count = |key: &str| carried.get(key).map(|s| s.value);
        assert_eq!(count("baton_requests_total{code=\"2xx\"}"), Some(5.0));
        assert_eq!(count("baton_requests_total{code=\"5xx\"}"), Some(4.0));
    }

    /// A connection asked to give its place up for a newcomer while its
    /// client does not read the response it is on is cut after
    /// `LEAVING_GRACE`, not once its write has stalled `bounded::STALLED`:
    /// 256 of them would otherwise keep every probe waiting that long.
    #[tokio::test(start_paused = true)]
    async fn one_asked_to_leave_with_a_response_nobody_reads_is_cut_after_the_grace() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let places = places::Places::new();
        let stop = CancellationToken::new();
        let place = places.take(&stop).await.expect("a place");
        let ending = place.ending.clone();
        answer(
            ours,
            shared(),
            Some(place),
            stop,
            Kept {
                refill: SpareFd::new().refilled_at_end(),
                in_spares_place: false,
            },
        );
        let request = b"GET /status HTTP/1.1\r\nhost: admin\r\n\r\n";
        theirs.write_all(request).await.expect("request");
        // Its answer fills the 64 bytes the pipe holds, and waits.
        tokio::time::sleep(Duration::from_millis(100)).await;
        ending.cancel();
        tokio::time::sleep(places::LEAVING_GRACE - Duration::from_millis(10)).await;
        theirs
            .write_all(b"x")
            .await
            .expect("still open within the grace");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            theirs.write_all(b"x").await.is_err(),
            "cut once the grace is over"
        );
    }
}
