//! Active health checks: the I/O at the edge of the health state machine.
//! One task per checked backend, jittered so checks to many backends do not
//! fire in lockstep, paused while the operator drains the backend, stopped
//! at teardown or when a member resolved from DNS leaves its pool. An `http` check GETs `path` (2xx/3xx is healthy); a `tcp`
//! check connects.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::stream::{BackendStream, ConnectFault};
use super::{AdminState, Backend, Pool};
use crate::config::{HealthConfig, HealthKind};

/// Why a check did not pass.
pub enum Fault {
    /// The backend failed it.
    Failed(String),
    /// baton ran short (fds, memory) and could not make it: it says
    /// nothing of the backend.
    Shortage(String),
}

/// One check.
pub async fn check(config: &HealthConfig, backend: &Backend) -> Result<(), Fault> {
    match tokio::time::timeout(config.timeout, attempt(config, backend)).await {
        Ok(result) => result,
        Err(_) => Err(Fault::Failed(format!(
            "no answer within {:?}",
            config.timeout
        ))),
    }
}

async fn attempt(config: &HealthConfig, backend: &Backend) -> Result<(), Fault> {
    let stream = match backend.connect_own(config.timeout).await {
        Ok(stream) => stream,
        Err(ConnectFault::Shortage(err)) => return Err(Fault::Shortage(err.to_string())),
        Err(fault) => return Err(Fault::Failed(format!("connect: {fault}"))),
    };
    if config.kind == HealthKind::Tcp {
        return Ok(());
    }
    ask(config, &host_of(backend), stream)
        .await
        .map_err(Fault::Failed)
}

/// The `Host` a check asks with: a member's DNS name and port, as the
/// config gave it (an application that checks Host, as Django's
/// `ALLOWED_HOSTS` or Rails' host authorization do, refuses its address
/// and failed every check of a pool that served its traffic well), else
/// the backend's address.
fn host_of(backend: &Backend) -> String {
    let named = backend
        .resolved_from
        .as_deref()
        .filter(|name| ::http::uri::Authority::try_from(*name).is_ok());
    match named {
        Some(name) => name.to_string(),
        None => backend.address.to_string(),
    }
}

/// An `http` check's GET on its connection.
async fn ask(config: &HealthConfig, host: &str, mut stream: BackendStream) -> Result<(), String> {
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: baton-health\r\nConnection: close\r\n\r\n",
        config.path
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut head = [0u8; 12];
    stream
        .read_exact(&mut head)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let status = std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|s| s.parse::<u16>().ok());
    match status {
        Some(code) if head.starts_with(b"HTTP/1.") && (200..400).contains(&code) => Ok(()),
        Some(code) => Err(format!("status {code}")),
        None => Err("not an HTTP answer".into()),
    }
}

/// Runs one check of every checked backend at once, so a start-up or a
/// takeover knows the health of each before it serves; waits `within` at
/// most, and no longer once `cut` resolves (a stop during a first start).
/// A check that takes longer (a backend that accepts and hangs, under a
/// long `health.timeout`) goes on and records its result when it ends:
/// waiting for it made a reload during such an outage overrun
/// `reload.ready_timeout` and fail, where DESIGN says it must work; and a
/// stop that ended the wait still serves what queued, with the verdicts
/// of the checks that answer meanwhile.
pub async fn first_round(pools: &[Arc<Pool>], within: Duration, cut: impl Future<Output = ()>) {
    let mut checks = tokio::task::JoinSet::new();
    for pool in pools {
        let Some(config) = pool.health.clone() else {
            continue;
        };
        for backend in &pool.backends().backends {
            if backend.admin() != AdminState::Enabled {
                continue;
            }
            let (backend, config) = (Arc::clone(backend), config.clone());
            checks.spawn(async move {
                let result = check(&config, &backend).await;
                record(&backend, result);
            });
        }
    }
    let all_in = async { while checks.join_next().await.is_some() {} };
    // In this order: a round with nothing (left) to wait for is over,
    // whatever came meanwhile.
    let ended = tokio::select! {
        biased;
        waited = tokio::time::timeout(within, all_in) => waited.map_err(|_| RoundCut::Budget),
        () = cut => Err(RoundCut::Stop),
    };
    match ended {
        Ok(()) => return,
        Err(RoundCut::Budget) => tracing::warn!(
            waited = ?within,
            running = checks.len(),
            "first health round not over within its budget (half of reload.ready_timeout, less in a reload that raised it): going on with the verdicts carried over; the checks still running record theirs when they end"
        ),
        Err(RoundCut::Stop) => tracing::info!(
            running = checks.len(),
            "stop signal during start-up: not waiting for the first health round; the checks still running record theirs when they end"
        ),
    }
    checks.detach_all();
}

/// Why the first round was not waited for to its end.
enum RoundCut {
    Budget,
    Stop,
}

/// Starts the periodic checks, and the sweep of idle backend connections;
/// they end when `stop` is cancelled.
pub fn spawn_all(pools: &[Arc<Pool>], stop: &CancellationToken) {
    tokio::spawn(sweep_idle(pools.to_vec(), stop.clone()));
    for pool in pools {
        let Some(config) = pool.health.clone() else {
            continue;
        };
        for backend in &pool.backends().backends {
            tokio::spawn(run(Arc::clone(backend), config.clone(), stop.clone()));
        }
    }
}

/// Starts the periodic checks of a member that joined a pool while
/// serving; they end when `stop` is cancelled or the member leaves.
pub fn spawn_member(pool: &Pool, backend: &Arc<Backend>, stop: &CancellationToken) {
    if let Some(config) = pool.health.clone() {
        tokio::spawn(run(Arc::clone(backend), config, stop.clone()));
    }
}

/// Closes idle backend connections past their limit, so they do not
/// linger (in CLOSE_WAIT once the backend gave up on them) after traffic
/// stops.
async fn sweep_idle(pools: Vec<Arc<Pool>>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(super::idle::IDLE_LIMIT) => {}
        }
        for pool in &pools {
            for backend in &pool.backends().backends {
                backend.idle.sweep();
            }
        }
    }
}

async fn run(backend: Arc<Backend>, config: HealthConfig, stop: CancellationToken) {
    let gone = backend.gone().clone();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = gone.cancelled() => return,
            () = tokio::time::sleep(jittered(config.interval)) => {}
        }
        if backend.admin() != AdminState::Enabled {
            continue;
        }
        let result = tokio::select! {
            () = stop.cancelled() => return,
            () = gone.cancelled() => return,
            r = check(&config, &backend) => r,
        };
        record(&backend, result);
    }
}

fn record(backend: &Backend, result: Result<(), Fault>) {
    match result {
        Ok(()) => backend.observe_check(true, "ok".into()),
        Err(Fault::Failed(why)) => backend.observe_check(false, why),
        Err(Fault::Shortage(why)) => {
            tracing::warn!(pool = %backend.pool, backend = %backend.name, cause = why, "health check not made: baton ran short; the backend keeps its state");
        }
    }
}

/// `interval` ± 10 %, so many backends' checks spread out over time.
fn jittered(interval: Duration) -> Duration {
    static NEXT: AtomicU64 = AtomicU64::new(0x853c_49e6_748f_ea9b);
    let unit = crate::splitmix::unit(crate::splitmix::next(&NEXT));
    interval.mul_f64(0.9 + 0.2 * unit)
}
