//! Active health checks: the I/O at the edge of the health state machine.
//! One task per checked backend, jittered so checks to many backends do not
//! fire in lockstep, paused while the operator drains the backend, stopped
//! at teardown or when a member resolved from DNS leaves its pool. An `http` check GETs `path` (2xx/3xx is healthy); a `tcp`
//! check connects.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::stream::{BackendStream, ConnectFault};
use super::{AdminState, Backend, Pool};
use crate::config::{HealthConfig, HealthKind};
use crate::telemetry::Throttle;

/// Why a check did not pass.
pub enum Fault {
    /// The backend failed it.
    Failed(String),
    /// baton ran short (fds, memory) and could not make it: it says
    /// nothing of the backend.
    Shortage(String),
}

/// One check. One that runs out of time says whether it had connected:
/// an application that accepts and hangs is not a backend that cannot be
/// reached (a firewall, a route), and the connect's own limit, the same,
/// raced this one to say which. (Over TLS, connected means the handshake
/// done: one the application never answers is said as no connection.)
pub async fn check(config: &HealthConfig, backend: &Backend) -> Result<(), Fault> {
    let connected = AtomicBool::new(false);
    match tokio::time::timeout(config.timeout, attempt(config, backend, &connected)).await {
        Ok(result) => result,
        Err(_) if connected.load(Ordering::Relaxed) => Err(Fault::Failed(format!(
            "connected, but no answer within {:?}",
            config.timeout
        ))),
        Err(_) => Err(Fault::Failed(format!(
            "connect: {}",
            ConnectFault::Timeout(config.timeout)
        ))),
    }
}

async fn attempt(
    config: &HealthConfig,
    backend: &Backend,
    connected: &AtomicBool,
) -> Result<(), Fault> {
    let stream = match backend.connect_own(config.timeout).await {
        Ok(stream) => stream,
        Err(ConnectFault::Shortage(err)) => return Err(Fault::Shortage(err.to_string())),
        Err(fault) => return Err(Fault::Failed(format!("connect: {fault}"))),
    };
    connected.store(true, Ordering::Relaxed);
    if config.kind == HealthKind::Tcp {
        // Over TLS, with a close_notify: a backend logs a close without
        // one as a truncated session, at every check.
        stream.close_quietly();
        return Ok(());
    }
    let server_name = backend.tls.as_ref().and_then(|tls| tls.server_dns_name());
    let host = host_of(
        config.host.as_deref(),
        server_name.as_deref(),
        backend.resolved_from.as_deref(),
        backend.address,
    );
    ask(config, &host, stream).await.map_err(Fault::Failed)
}

/// The format of [`asked`]'s words, their first word: a release that words
/// them otherwise raises it, and verdicts carried across that upgrade are
/// kept (words of two formats cannot be compared).
const ASKED_FORMAT: &str = "1";

/// What a check asks, in words: a verdict of other words (a new path, a
/// `Host`, TLS added to the pool) is no verdict of this check's. (A CA
/// bundle changed under the same pool is not in them: its verdicts carry.)
pub fn asked(
    health: &HealthConfig,
    tls: Option<&crate::tls::upstream::UpstreamTls>,
    send_proxy: Option<crate::proxy_protocol::Version>,
) -> String {
    let mut words = match health.kind {
        HealthKind::Tcp => format!("{ASKED_FORMAT} tcp"),
        HealthKind::Http => format!(
            "{ASKED_FORMAT} http GET {} host {}",
            health.path,
            health.host.as_deref().unwrap_or("-")
        ),
    };
    if let Some(tls) = tls {
        words.push_str(&format!(" tls {} verify {}", tls.names(), tls.verify));
    }
    if let Some(version) = send_proxy {
        words.push_str(&format!(" proxy {version:?}"));
    }
    words
}

/// The `Host` a check asks with: the check's `host`, else the pool's TLS
/// `server_name` when a DNS name (the name its SNI says: a server that
/// holds the two to agree answers 421 otherwise), else a member's DNS
/// name and port as the
/// config gave it, else the backend's address. An application that
/// checks Host (a virtual host, Django's `ALLOWED_HOSTS`, Rails' host
/// authorization) refuses an address, and failed every check of a pool
/// that served its traffic well.
fn host_of(
    configured: Option<&str>,
    server_name: Option<&str>,
    resolved_from: Option<&str>,
    address: std::net::SocketAddr,
) -> String {
    let named = resolved_from.filter(|name| ::http::uri::Authority::try_from(*name).is_ok());
    match configured.or(server_name).or(named) {
        Some(name) => name.to_string(),
        None => address.to_string(),
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
    let code = final_status(&mut stream).await?;
    stream.close_quietly();
    match code {
        code if (200..400).contains(&code) => Ok(()),
        code => Err(format!("GET {} answered {code}", config.path)),
    }
}

/// The most an answer's interim heads may take before its final one.
const MOST_INTERIM: usize = 64 << 10;

/// The status of the final response on `stream`: interim ones (1xx but
/// 101; 103 Early Hints before a health page's 200) are read past, as a
/// client must (RFC 9110 §15.2): taken for the answer, a 103 failed
/// every check of a healthy backend. Only a head's status line is needed.
async fn final_status<R: AsyncRead + Unpin>(stream: &mut R) -> Result<u16, String> {
    let mut buf = Vec::with_capacity(64);
    let mut skipped = 0;
    loop {
        while buf.len() < STATUS_LINE_START {
            read_more(stream, &mut buf).await?;
        }
        let head = &buf[..STATUS_LINE_START];
        let code = std::str::from_utf8(&head[9..12])
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
            .filter(|_| head.starts_with(b"HTTP/1."))
            .ok_or("not an HTTP answer")?;
        if !(100..200).contains(&code) || code == 101 {
            return Ok(code);
        }
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            if skipped + buf.len() > MOST_INTERIM {
                return Err(format!("interim responses past {} KiB", MOST_INTERIM >> 10));
            }
            read_more(stream, &mut buf).await?;
        };
        buf.drain(..end);
        skipped += end;
        if skipped > MOST_INTERIM {
            return Err(format!("interim responses past {} KiB", MOST_INTERIM >> 10));
        }
    }
}

/// `HTTP/1.1 200`: what a status line must have for its code.
const STATUS_LINE_START: usize = 12;

/// Appends what `stream` has next to `buf`; the end of the answer is an
/// error here (a whole head was still to come).
async fn read_more<R: AsyncRead + Unpin>(stream: &mut R, buf: &mut Vec<u8>) -> Result<(), String> {
    let mut chunk = [0u8; 1024];
    match stream.read(&mut chunk).await {
        Ok(0) => Err("read: the answer ended before its head".into()),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
        Err(e) => Err(format!("read: {e}")),
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
/// they end when `stop` is cancelled. Every checked backend of every pool
/// takes its first turn at its place in its interval (see `first_wait`),
/// jittered as every later turn is.
pub fn spawn_all(pools: &[Arc<Pool>], stop: &CancellationToken) {
    tokio::spawn(sweep_idle(pools.to_vec(), stop.clone()));
    let mut place = 0;
    for pool in pools {
        let Some(config) = pool.health.clone() else {
            continue;
        };
        for backend in &pool.backends().backends {
            let first = jittered(first_wait(config.interval, place));
            place += 1;
            tokio::spawn(run(
                Arc::clone(backend),
                config.clone(),
                first,
                stop.clone(),
            ));
        }
    }
}

/// Starts the periodic checks of a member that joined a pool while
/// serving; they end when `stop` is cancelled or the member leaves.
pub fn spawn_member(pool: &Pool, backend: &Arc<Backend>, stop: &CancellationToken) {
    if let Some(config) = pool.health.clone() {
        let first = jittered(config.interval);
        tokio::spawn(run(Arc::clone(backend), config, first, stop.clone()));
    }
}

/// How long the checked backend at `place` (counted over all pools) waits
/// for its first periodic check: a share of its interval that spreads any
/// number of backends, and any pool's among them, across it (the golden
/// ratio's multiples, as hashing spreads keys), as HAProxy spreads all its
/// servers' first checks. The first round checked every backend at once,
/// and a jitter of ±10 % alone left the next rounds in a burst (200
/// backends checked every 2 s within 0.4 s, and again after every reload)
/// for dozens of rounds.
fn first_wait(interval: Duration, place: usize) -> Duration {
    const GOLDEN: f64 = 0.618_033_988_749_894_9;
    let share = ((place as f64 + 1.0) * GOLDEN).fract();
    interval.mul_f64(share.max(0.01))
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

async fn run(
    backend: Arc<Backend>,
    config: HealthConfig,
    first: Duration,
    stop: CancellationToken,
) {
    let gone = backend.gone().clone();
    let mut wait = first;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = gone.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = jittered(config.interval);
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

/// One line a second for the checks a shortage kept baton from making:
/// every backend's checks meet the same shortage, each `interval`
/// (counted each in `baton_shortages_total{at="connect"}`).
static SHORTAGE_LINES: Throttle = Throttle::new();

fn record(backend: &Backend, result: Result<(), Fault>) {
    match result {
        Ok(()) => backend.observe_check(true, "ok".into()),
        Err(Fault::Failed(why)) => backend.observe_check(false, why),
        Err(Fault::Shortage(why)) => {
            if let Some(suppressed) = SHORTAGE_LINES.ready() {
                tracing::warn!(pool = %backend.pool, backend = %backend.label, cause = why, suppressed, "health check not made: baton ran short; the backend keeps its state");
            }
        }
    }
}

/// `interval` ± 10 %, so many backends' checks spread out over time.
fn jittered(interval: Duration) -> Duration {
    static NEXT: AtomicU64 = AtomicU64::new(0x853c_49e6_748f_ea9b);
    let unit = crate::splitmix::unit(crate::splitmix::next(&NEXT));
    interval.mul_f64(0.9 + 0.2 * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first periodic checks of any number of backends are spread
    /// over one interval: no two of the first 20 within 20 ms of a second,
    /// and every one within the interval.
    #[test]
    fn first_checks_are_spread_over_one_interval() {
        let second = Duration::from_secs(1);
        let mut waits: Vec<Duration> = (0..20).map(|p| first_wait(second, p)).collect();
        assert!(
            waits.iter().all(|w| !w.is_zero() && *w < second),
            "{waits:?}"
        );
        waits.sort();
        let closest = waits.windows(2).map(|w| w[1] - w[0]).min();
        assert!(closest >= Some(Duration::from_millis(20)), "{waits:?}");
    }

    async fn status_of(answer: &[u8]) -> Result<u16, String> {
        let mut reader = answer;
        final_status(&mut reader).await
    }

    #[test]
    fn a_check_asks_for_the_host_the_config_names_first() {
        let address = ([10, 0, 0, 5], 8443).into();
        let member = Some("app.internal:8443");
        assert_eq!(
            host_of(
                Some("www.example.com"),
                Some("tls.example.com"),
                member,
                address
            ),
            "www.example.com"
        );
        assert_eq!(
            host_of(None, Some("tls.example.com"), member, address),
            "tls.example.com",
            "as the SNI says"
        );
        assert_eq!(host_of(None, None, member, address), "app.internal:8443");
        assert_eq!(host_of(None, None, None, address), "10.0.0.5:8443");
    }

    #[tokio::test]
    async fn interim_answers_are_read_past_to_the_final_status() {
        let hints = b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n";
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            status_of(&[&hints[..], &hints[..], ok].concat()).await,
            Ok(200)
        );
        assert_eq!(status_of(ok).await, Ok(200));
        assert_eq!(status_of(b"HTTP/1.0 503 Busy\r\n\r\n").await, Ok(503));
        // A 101 to a GET that asked for no upgrade is its final answer.
        assert_eq!(status_of(b"HTTP/1.1 101 Switching\r\n\r\n").await, Ok(101));
    }

    #[tokio::test]
    async fn what_is_not_a_whole_answer_fails() {
        assert!(status_of(b"SSH-2.0-OpenSSH_9.2\r\n").await.is_err());
        assert!(status_of(b"HTTP/1.1 20").await.is_err());
        assert!(status_of(b"HTTP/1.1 103 Early Hints\r\n\r\n")
            .await
            .is_err());
        let endless = [
            &b"HTTP/1.1 103 Early Hints\r\n"[..],
            &vec![b'x'; MOST_INTERIM + 2048],
        ]
        .concat();
        let refused = status_of(&endless).await;
        assert_eq!(refused, Err("interim responses past 64 KiB".to_string()));
        // Many small ones count together.
        let hint = b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n";
        let many = [
            hint.repeat(MOST_INTERIM / hint.len() + 1),
            b"HTTP/1.1 200 OK\r\n\r\n".to_vec(),
        ]
        .concat();
        let refused = status_of(&many).await;
        assert_eq!(refused, Err("interim responses past 64 KiB".to_string()));
    }
}
