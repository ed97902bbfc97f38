//! Steady load of three kinds at once, each answer checked: HTTP keep-alive
//! clients, HTTP clients opening a connection per request, and TCP echo
//! clients. Bounded: every loop stops on `stop()` or after `HARD_LIMIT`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::backend::HttpBackend;
use super::client;

/// Long enough for the longest test that keeps a load running: the systemd
/// test builds a second baton from cold while its load runs (over two
/// minutes on a clean CI clone).
const HARD_LIMIT: Duration = Duration::from_secs(600);

#[derive(Default)]
pub struct Tally {
    pub ok: AtomicU64,
    pub failures: Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, what: String) {
        if let Ok(mut f) = self.failures.lock() {
            f.push(what);
        }
    }
}

/// The outcome of a load run.
#[derive(Debug)]
pub struct Report {
    pub ok: u64,
    pub failures: Vec<String>,
}

impl Report {
    pub fn assert_clean(&self) {
        assert!(self.ok > 0, "the load did nothing");
        assert!(
            self.failures.is_empty(),
            "{} failed of {}: {:#?}",
            self.failures.len(),
            self.ok + self.failures.len() as u64,
            &self.failures[..self.failures.len().min(10)]
        );
    }
}

pub struct Load {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    pub tally: Arc<Tally>,
}

/// Which listeners to load and which backend names may answer.
pub struct Targets {
    pub http: Option<SocketAddr>,
    pub tcp: Option<SocketAddr>,
    pub names: Vec<&'static str>,
}

impl Load {
    pub fn start(targets: Targets) -> Load {
        let stop = CancellationToken::new();
        let tally = Arc::new(Tally::default());
        let names = Arc::new(targets.names);
        let mut tasks = Vec::new();
        if let Some(addr) = targets.http {
            for i in 0..3 {
                tasks.push(tokio::spawn(keep_alive(
                    addr,
                    i,
                    Arc::clone(&names),
                    Arc::clone(&tally),
                    stop.clone(),
                )));
            }
            for i in 0..2 {
                tasks.push(tokio::spawn(per_request(
                    addr,
                    i,
                    Arc::clone(&names),
                    Arc::clone(&tally),
                    stop.clone(),
                )));
            }
        }
        if let Some(addr) = targets.tcp {
            for i in 0..2 {
                tasks.push(tokio::spawn(tcp_echo(
                    addr,
                    i,
                    Arc::clone(&tally),
                    stop.clone(),
                )));
            }
        }
        Load { stop, tasks, tally }
    }

    pub fn ok(&self) -> u64 {
        self.tally.ok.load(Ordering::Relaxed)
    }

    /// Waits until at least `more` further requests succeeded.
    pub async fn progress(&self, more: u64) {
        assert!(
            self.advanced(more).await,
            "no load progress within {:?}; failures so far: {:#?}",
            super::TIMEOUT,
            self.failures_so_far()
        );
    }

    /// Whether `more` further requests succeed within `TIMEOUT`. A load
    /// whose loops have all ended (at `HARD_LIMIT`) fails at once, saying so.
    pub async fn advanced(&self, more: u64) -> bool {
        let target = self.ok() + more;
        let deadline = tokio::time::Instant::now() + super::TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            if self.ok() >= target {
                return true;
            }
            if self.tasks.iter().all(|t| t.is_finished()) {
                self.tally
                    .fail(format!("the load itself ended (limit {HARD_LIMIT:?})"));
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// The first failures seen, for a failing test to show.
    pub fn failures_so_far(&self) -> Vec<String> {
        self.tally
            .failures
            .lock()
            .map(|f| f.iter().take(10).cloned().collect())
            .unwrap_or_default()
    }

    pub async fn stop(self) -> Report {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let failures = self
            .tally
            .failures
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        Report {
            ok: self.tally.ok.load(Ordering::Relaxed),
            failures,
        }
    }
}

fn check(names: &[&'static str], path: &str, answer: &client::Answer) -> Result<(), String> {
    let expected = names
        .iter()
        .any(|n| answer.body == HttpBackend::body_for(n, path));
    if answer.status == 200 && expected {
        Ok(())
    } else {
        Err(format!(
            "{path}: status {} body {:?}",
            answer.status, answer.body
        ))
    }
}

async fn keep_alive(
    addr: SocketAddr,
    id: usize,
    names: Arc<Vec<&'static str>>,
    tally: Arc<Tally>,
    stop: CancellationToken,
) {
    let started = tokio::time::Instant::now();
    let mut sender = None;
    let mut seq = 0u64;
    while !stop.is_cancelled() && started.elapsed() < HARD_LIMIT {
        seq += 1;
        let path = format!("/ka/{id}/{seq}");
        // Replace a connection the server closed after `Connection: close`.
        if sender
            .as_ref()
            .is_none_or(|s: &hyper::client::conn::http1::SendRequest<_>| s.is_closed())
        {
            match client::connect(addr).await {
                Ok(s) => sender = Some(s),
                Err(e) => {
                    tally.fail(format!("keep-alive connect: {e}"));
                    // A refused connect returns at once: not a spin.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
            }
        }
        let Some(s) = sender.as_mut() else { continue };
        match client::send(s, addr, &path)
            .await
            .and_then(|a| check(&names, &path, &a))
        {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tally.fail(format!("keep-alive: {e}"));
                sender = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn per_request(
    addr: SocketAddr,
    id: usize,
    names: Arc<Vec<&'static str>>,
    tally: Arc<Tally>,
    stop: CancellationToken,
) {
    let started = tokio::time::Instant::now();
    let mut seq = 0u64;
    while !stop.is_cancelled() && started.elapsed() < HARD_LIMIT {
        seq += 1;
        let path = format!("/new/{id}/{seq}");
        match client::get(addr, &path)
            .await
            .and_then(|a| check(&names, &path, &a))
        {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tally.fail(format!("new connection: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// One TCP session: three messages echoed, then a half-close that must
/// come back as EOF after the echoes.
async fn tcp_session(addr: SocketAddr, id: usize, seq: u64) -> Result<(), String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut expected = Vec::new();
    for part in 0..3 {
        let msg = format!("client {id} session {seq} part {part}\n");
        s.write_all(msg.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        expected.extend_from_slice(msg.as_bytes());
    }
    s.shutdown().await.map_err(|e| format!("half-close: {e}"))?;
    let mut got = Vec::new();
    tokio::time::timeout(super::TIMEOUT, s.read_to_end(&mut got))
        .await
        .map_err(|_| "no EOF after half-close".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    if got == expected {
        Ok(())
    } else {
        Err(format!(
            "echo mismatch: {:?}",
            String::from_utf8_lossy(&got)
        ))
    }
}

async fn tcp_echo(addr: SocketAddr, id: usize, tally: Arc<Tally>, stop: CancellationToken) {
    let started = tokio::time::Instant::now();
    let mut seq = 0u64;
    while !stop.is_cancelled() && started.elapsed() < HARD_LIMIT {
        seq += 1;
        match tcp_session(addr, id, seq).await {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tally.fail(format!("tcp: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// One backend "a", baton with an `http` listener "web" (plus the `extra`
/// TOML), and HTTP load already flowing through it.
pub async fn baton_under_load(extra: &str) -> (HttpBackend, super::daemon::Baton, Load) {
    let backend = HttpBackend::start("a").await;
    let spec = super::daemon::Spec::new()
        .section(extra)
        .http("web", "app")
        .pool("app", &[backend.addr]);
    let baton = super::daemon::Baton::start(spec).await;
    let load = flowing_to_a(baton.addr("web")).await;
    (backend, baton, load)
}

/// HTTP load on `web`, whose answers must come from backend "a", already
/// flowing (its first 20 successes in).
pub async fn flowing_to_a(web: std::net::SocketAddr) -> Load {
    let load = Load::start(Targets {
        http: Some(web),
        tcp: None,
        names: vec!["a"],
    });
    load.progress(20).await;
    load
}
