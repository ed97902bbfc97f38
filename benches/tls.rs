//! `cargo bench --bench tls [-- --seconds S]`
//!
//! TLS termination in baton, HAProxy and nginx, side by side: each proxy
//! alone on core 0 with one worker, the load and the backend on core 1,
//! the same certificate (an rcgen ECDSA P-256 leaf signed by an rcgen CA),
//! TLS 1.2 and 1.3 allowed (1.3 is what every client here negotiates, with
//! X25519), ALPN http/1.1. Per proxy:
//!
//! - HTTPS keep-alive requests/s (`wrk -t2 -c64`), with the proxy's CPU per
//!   request;
//! - full handshakes/s: 64 rustls clients in this process, each looping
//!   connect, handshake, one `Connection: close` request, with resumption
//!   disabled (wrk cannot do this: it resumes its OpenSSL session on every
//!   reconnection). The clients skip certificate verification so that the
//!   client side stays lighter than the server side;
//! - resumed handshakes/s: the same, each client keeping its own session
//!   cache, so every handshake after its first resumes a TLS 1.3 ticket;
//! - resumption across a reload: 200 returning clients (each with its own
//!   session cache, verifying the certificate) visit once, then once more
//!   (the share resumed before), the proxy reloads the way its operators
//!   do, and 1 s later each visits again (the share resumed after);
//! - resident memory per idle TLS keep-alive connection: 2,000 connections
//!   each after one request, on a fresh proxy.
//!
//! The handshake cells give the proxy's core use during the run: near
//! 100 % the proxy is the bottleneck, below it the client is. Prints a table
//! and the ratios baton ÷ better peer; it asserts nothing.

#[path = "support/mod.rs"]
mod support;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use support::client::Conn;
use support::measure::{cell, core_busy, core_ticks, cpu_during, rss_kib, wrk};
use support::proxies::{Kind, Proxy};
use support::tls::{negotiated, Authority};

const PROXY_CORE: usize = 0;
const LOAD_CORE: usize = 1;
/// Concurrent clients in the handshake loops (wrk's `-c64`).
const CLIENTS: usize = 64;
/// Returning clients across the reload.
const RETURNING: usize = 200;
/// Idle TLS connections held for the memory figure.
const HELD: usize = 2_000;
/// The name the certificate carries and the clients send (SNI).
const NAME: &str = "localhost";

/// Accepts any certificate and signature: the load clients' handshakes
/// then cost the client no signature checks, so the proxy, not the
/// client, is what a handshake rate measures.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

type Cert<'a> = CertificateDer<'a>;
type Signed = DigitallySignedStruct;
type SignatureCheck = Result<HandshakeSignatureValid, rustls::Error>;

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(&self, _: &[u8], _: &Cert<'_>, _: &Signed) -> SignatureCheck {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(&self, _: &[u8], _: &Cert<'_>, _: &Signed) -> SignatureCheck {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A load client's connector: no verification, ALPN http/1.1, `resumption`.
fn load_connector(resumption: Resumption) -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = resumption;
    TlsConnector::from(Arc::new(config))
}

async fn connect(
    connector: &TlsConnector,
    addr: SocketAddr,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(NAME).expect("server name");
    connector.connect(name, tcp).await
}

/// A handshake, then one request (asking the proxy to close after it with
/// `close`): the client, ready for more if not `close`, and whether the
/// handshake resumed a session.
async fn exchange(
    handshake: impl Future<Output = std::io::Result<TlsStream<TcpStream>>>,
    close: bool,
) -> Option<(Conn<TlsStream<TcpStream>>, bool)> {
    let once = async {
        let stream = handshake.await.ok()?;
        let resumed = negotiated(&stream).1;
        let mut conn = Conn::over(stream);
        conn.request("/", close).await.ok()?;
        Some((conn, resumed))
    };
    tokio::time::timeout(Duration::from_secs(10), once)
        .await
        .ok()
        .flatten()
}

/// What a handshake loop did.
#[derive(Default)]
struct Tally {
    done: u64,
    resumed: u64,
    failed: u64,
    /// Each exchange, connect to response, µs.
    micros: Vec<u64>,
    seconds: f64,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.done as f64 / self.seconds.max(1e-9)
    }
}

/// `CLIENTS` clients, each handshaking and sending one request per
/// connection for `seconds`: with `resume`, each keeps its own session
/// cache (its first handshake is full, the rest resume); without, none
/// resumes.
async fn handshakes(addr: SocketAddr, seconds: u32, resume: bool) -> Tally {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds.into());
    let shared = load_connector(Resumption::disabled());
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let connector = if resume {
                load_connector(Resumption::in_memory_sessions(4))
            } else {
                shared.clone()
            };
            tokio::spawn(async move {
                let mut t = Tally::default();
                while Instant::now() < deadline {
                    let began = Instant::now();
                    match exchange(connect(&connector, addr), true).await {
                        Some((_, resumed)) => {
                            t.done += 1;
                            t.resumed += u64::from(resumed);
                            t.micros.push(began.elapsed().as_micros() as u64);
                        }
                        None => t.failed += 1,
                    }
                }
                t
            })
        })
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.expect("client task");
        all.done += t.done;
        all.resumed += t.resumed;
        all.failed += t.failed;
        all.micros.extend(t.micros);
    }
    all.seconds = started.elapsed().as_secs_f64();
    all.micros.sort_unstable();
    all
}

/// The shares of resumed handshakes around a reload, in %.
struct Shares {
    /// 200 returning clients, each on its second visit, before the reload.
    before: f64,
    /// The same clients on their next visit, 1 s after the reload.
    after: f64,
    /// One client's 200 sequential connections before and after.
    one_before: f64,
    one_after: f64,
    /// Whether that client's first connection after the reload resumed.
    one_first_after: bool,
    /// How long baton's reload took to be acknowledged.
    reload: Option<Duration>,
    /// Protocol, key exchange and ALPN of a connection.
    negotiated: String,
}

/// One connection per client in turn, each one request: which resumed.
async fn visit(clients: &[support::tls::Client], addr: SocketAddr) -> Vec<bool> {
    let mut resumed = Vec::with_capacity(clients.len());
    for client in clients {
        let r = exchange(client.connect(addr, NAME), true).await;
        resumed.push(r.is_some_and(|(_, r)| r));
    }
    resumed
}

fn share(resumed: &[bool]) -> f64 {
    resumed.iter().filter(|r| **r).count() as f64 * 100.0 / resumed.len().max(1) as f64
}

async fn across_reload(proxy: &Proxy, authority: &Authority) -> Shares {
    let addr = proxy.addr;
    let returning: Vec<_> = (0..RETURNING)
        .map(|_| authority.client(&["http/1.1"]))
        .collect();
    let one = vec![authority.client(&["http/1.1"]); RETURNING];
    let negotiated = match exchange(one[0].connect(addr, NAME), true).await {
        Some((conn, _)) => {
            let tls = conn.stream().get_ref().1;
            format!(
                "{:?}, {:?}, ALPN {}",
                tls.protocol_version(),
                tls.negotiated_key_exchange_group().map(|g| g.name()),
                negotiated(conn.stream()).0.unwrap_or_default()
            )
        }
        None => "handshake failed".into(),
    };
    visit(&returning, addr).await;
    let before = share(&visit(&returning, addr).await);
    let one_before = share(&visit(&one, addr).await);
    let reload = proxy.reload().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = share(&visit(&returning, addr).await);
    let one_seq = visit(&one, addr).await;
    Shares {
        before,
        after,
        one_before,
        one_after: share(&one_seq),
        one_first_after: one_seq[0],
        reload,
        negotiated,
    }
}

/// RSS per idle TLS keep-alive connection on a fresh proxy: (KiB per
/// connection, idle MiB, MiB with them, connections held).
fn idle_connections(
    rt: &tokio::runtime::Runtime,
    kind: Kind,
    backend: SocketAddr,
    certificate: (&Path, &Path),
) -> (f64, f64, f64, usize) {
    let proxy = start(kind, backend, certificate);
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss_kib(&proxy.pids());
    let addr = proxy.addr;
    let held = rt.block_on(async move {
        let connector = load_connector(Resumption::disabled());
        let mut held = Vec::with_capacity(HELD);
        for _ in 0..HELD {
            match exchange(connect(&connector, addr), false).await {
                Some((conn, _)) => held.push(conn),
                None => break,
            }
        }
        held
    });
    std::thread::sleep(Duration::from_millis(500));
    let loaded = rss_kib(&proxy.pids());
    let per = loaded.saturating_sub(idle) as f64 / held.len().max(1) as f64;
    (
        per,
        idle as f64 / 1024.0,
        loaded as f64 / 1024.0,
        held.len(),
    )
}

fn start(kind: Kind, backend: SocketAddr, certificate: (&Path, &Path)) -> Proxy {
    Proxy::start_tls(kind, backend, Some(PROXY_CORE), certificate)
}

/// Who was busy during a run, in % of a core: the proxy, everything else
/// on its core, and the load's core.
#[derive(Clone, Copy, Default)]
struct Usage {
    proxy: f64,
    others: f64,
    load: f64,
}

/// Runs `load`: its result, the proxy's CPU seconds (user, kernel) and the
/// cores' use meanwhile.
fn observed<T>(proxy: &Proxy, load: impl FnOnce() -> T) -> (T, Option<(f64, f64)>, Usage) {
    let (ticks, started) = (core_ticks(), Instant::now());
    let (out, cpu) = cpu_during(proxy, load);
    let wall = started.elapsed().as_secs_f64();
    let busy = core_busy(&ticks, &core_ticks());
    let proxy_share = cpu.map_or(0.0, |(u, s)| (u + s) * 100.0 / wall);
    let usage = Usage {
        proxy: proxy_share,
        others: (busy.get(PROXY_CORE).copied().unwrap_or(0.0) * 100.0 - proxy_share).max(0.0),
        load: busy.get(LOAD_CORE).copied().unwrap_or(0.0) * 100.0,
    };
    (out, cpu, usage)
}

struct Row {
    /// wrk's rate and its cell.
    keepalive: (f64, String),
    /// Core use during the keep-alive, full and resumed runs.
    usage: [Usage; 3],
    full: (Tally, Option<(f64, f64)>),
    resumed: (Tally, Option<(f64, f64)>),
    shares: Shares,
    memory: (f64, f64, f64, usize),
}

fn measure(
    rt: &tokio::runtime::Runtime,
    kind: Kind,
    backend: SocketAddr,
    seconds: u32,
    authority: &Authority,
    certificate: (&Path, &Path),
) -> Row {
    let proxy = start(kind, backend, certificate);
    let url = format!("https://{}/", proxy.addr);
    let (run, cpu, keepalive_use) =
        observed(&proxy, || wrk(&url, seconds, false, &LOAD_CORE.to_string()));
    let keepalive = (run.as_ref().map_or(0.0, |r| r.rps), cell(run, cpu));
    let addr = proxy.addr;
    let (full, full_cpu, full_use) =
        observed(&proxy, || rt.block_on(handshakes(addr, seconds, false)));
    let (resumed, resumed_cpu, resumed_use) =
        observed(&proxy, || rt.block_on(handshakes(addr, seconds, true)));
    let shares = rt.block_on(across_reload(&proxy, authority));
    drop(proxy);
    let memory = idle_connections(rt, kind, backend, certificate);
    Row {
        keepalive,
        usage: [keepalive_use, full_use, resumed_use],
        full: (full, full_cpu),
        resumed: (resumed, resumed_cpu),
        shares,
        memory,
    }
}

/// A handshake loop's cell: rate, latency, CPU per handshake and how busy
/// the proxy's core was.
fn handshake_cell((t, cpu): &(Tally, Option<(f64, f64)>), resume: bool) -> String {
    let mut out = format!(
        "{:.0} (p50 {:.2} ms, p99 {:.2} ms",
        t.rate(),
        support::pct(&t.micros, 0.5),
        support::pct(&t.micros, 0.99)
    );
    if let Some((user, sys)) = cpu {
        out += &format!(
            "; CPU/handshake {:.0} µs",
            (user + sys) * 1e6 / t.done.max(1) as f64
        );
    }
    let share = t.resumed as f64 * 100.0 / t.done.max(1) as f64;
    if resume || t.resumed > 0 {
        out += &format!("; {share:.1} % resumed");
    }
    if t.failed > 0 {
        out += &format!("; {} failed", t.failed);
    }
    out + ")"
}

fn print_row(kind: Kind, row: &Row) {
    let (per, idle, loaded, held) = row.memory;
    println!(
        "| {} | {} | {} | {} | {:.1} % → {:.1} % | {per:.1} ({idle:.1} → {loaded:.1} MiB, {held} held) |",
        kind.name(),
        row.keepalive.1,
        handshake_cell(&row.full, false),
        handshake_cell(&row.resumed, true),
        row.shares.before,
        row.shares.after,
    );
}

/// baton's share resumed after the reload against the better peer's.
fn share_vs_peers(rows: &[(Kind, Row)]) -> String {
    let baton = rows.iter().find(|(k, _)| *k == Kind::Baton);
    let peer = rows
        .iter()
        .filter(|(k, _)| *k != Kind::Baton)
        .map(|(_, r)| r.shares.after)
        .reduce(f64::max);
    match (baton, peer) {
        (Some((_, b)), Some(p)) => format!("{:.1} % vs {p:.1} % after", b.shares.after),
        _ => "—".into(),
    }
}

/// baton's figure over the better peer's (`higher`: more is better).
fn ratio(rows: &[(Kind, Row)], figure: impl Fn(&Row) -> f64, higher: bool) -> String {
    let baton = rows
        .iter()
        .find(|(k, _)| *k == Kind::Baton)
        .map(|(_, r)| figure(r));
    let peers = rows
        .iter()
        .filter(|(k, _)| *k != Kind::Baton)
        .map(|(_, r)| figure(r));
    let best = if higher {
        peers.fold(None, |b: Option<f64>, v| Some(b.map_or(v, |b| b.max(v))))
    } else {
        peers.fold(None, |b: Option<f64>, v| Some(b.map_or(v, |b| b.min(v))))
    };
    match (baton, best) {
        (Some(b), Some(p)) if p > 0.0 => format!("{:.2}×", b / p),
        _ => "—".into(),
    }
}

fn main() {
    let seconds: u32 = support::arg("--seconds", 5);
    if !Path::new("/usr/bin/wrk").exists() {
        println!("tls bench needs /usr/bin/wrk: benches/peers/setup.sh");
        return;
    }
    // Built before anything is pinned (see `shipped_baton`).
    support::proxies::shipped_baton();
    let backend = support::start_backend(1, &[LOAD_CORE]).addr;
    // The in-process clients run here, with the load.
    support::pin_this_thread(&[LOAD_CORE]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let authority = Authority::new();
    let leaf = authority.issue("leaf", &[NAME, "127.0.0.1"]);
    let certificate = (leaf.cert.as_path(), leaf.key.as_path());
    println!(
        "tls bench: {seconds}s per rate; each proxy alone on core {PROXY_CORE}, one worker; load and backend on core {LOAD_CORE}; \
         ECDSA P-256 certificate, ALPN http/1.1; keep-alive: wrk -t2 -c64; handshakes: {CLIENTS} rustls clients, one request per connection; \
         reload: {RETURNING} returning clients; memory: {HELD} idle TLS connections"
    );
    println!("| system | HTTPS keep-alive req/s | full handshakes/s | resumed handshakes/s | resumed before → after reload | KiB per idle TLS connection |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let mut rows = Vec::new();
    for kind in [Kind::Baton, Kind::Haproxy, Kind::Nginx] {
        if !kind.available() {
            println!("| {} | not installed | | | | |", kind.name());
            continue;
        }
        let row = measure(&rt, kind, backend, seconds, &authority, certificate);
        print_row(kind, &row);
        rows.push((kind, row));
    }
    println!(
        "| baton ÷ better peer | {} | {} | {} | {} | {} |",
        ratio(&rows, |r| r.keepalive.0, true),
        ratio(&rows, |r| r.full.0.rate(), true),
        ratio(&rows, |r| r.resumed.0.rate(), true),
        share_vs_peers(&rows),
        ratio(&rows, |r| r.memory.0, false),
    );
    println!();
    for (kind, row) in &rows {
        let u = &row.usage;
        println!(
            "- {}: core use during keep-alive, full, resumed: proxy {:.0}/{:.0}/{:.0} % of core {PROXY_CORE} \
             (other processes there {:.0}/{:.0}/{:.0} %), core {LOAD_CORE} (load) {:.0}/{:.0}/{:.0} % busy",
            kind.name(),
            u[0].proxy,
            u[1].proxy,
            u[2].proxy,
            u[0].others,
            u[1].others,
            u[2].others,
            u[0].load,
            u[1].load,
            u[2].load
        );
    }
    for (kind, row) in &rows {
        let s = &row.shares;
        println!(
            "- {}: {}; one client, {RETURNING} sequential connections: {:.1} % resumed before the reload, {:.1} % after (its first after: {}){}",
            kind.name(),
            s.negotiated,
            s.one_before,
            s.one_after,
            if s.one_first_after { "resumed" } else { "full" },
            s.reload
                .map(|d| format!("; reload acknowledged in {:.0} ms", d.as_secs_f64() * 1e3))
                .unwrap_or_default()
        );
    }
}
