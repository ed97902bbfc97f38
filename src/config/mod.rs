//! The validated configuration: real addresses, durations and indices, built
//! from the TOML file by [`load`]. Every other module reads only these types;
//! the raw serde mirror stays in `file`, and `validate` is the one place that
//! turns one into the other and names each problem by its key path.

pub mod duration;
pub mod file;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::tls::TlsSettings;

pub use validate::{from_file, strip_port, Token};

/// The default config path, as DESIGN.md's `baton run` says.
pub const DEFAULT_PATH: &str = "/etc/baton/baton.toml";

/// A listener's `max_connections` when its config gives none.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Budgets given on the command line or in the environment; they beat the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub drain_timeout: Option<String>,
    pub pre_stop_delay: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from, so errors and `baton check` can name it.
    pub source: PathBuf,
    /// Worker threads carrying connections (`workers`; 0 in the file
    /// means one per CPU, resolved here).
    pub workers: usize,
    /// Whether each worker is held to a CPU of its own (`pin_workers`).
    pub pin_workers: bool,
    /// How long a worker out of work keeps polling for events before it
    /// sleeps, while traffic is dense (`busy_poll`; zero: never).
    pub busy_poll: Duration,
    pub admin: AdminConfig,
    pub control: ControlConfig,
    pub shutdown: ShutdownConfig,
    pub reload: ReloadConfig,
    /// How often the session-ticket keys rotate (`[tls] ticket_rotation`);
    /// a ticket opens for two periods at most.
    pub ticket_rotation: Duration,
    pub listeners: Vec<ListenerConfig>,
    pub pools: Vec<PoolConfig>,
    /// How backends named by DNS are resolved (`[resolver]`).
    pub resolver: ResolverConfig,
    /// Not wrong yet, but soon to be (a certificate expiring within two
    /// weeks), each naming its key: `check` prints them and `run` logs
    /// them, and neither fails for them.
    pub warnings: Vec<String>,
    /// The files the daemon reads at start and at each reload (keys,
    /// certificates, CA bundles, the admin token), each with its key: `check`
    /// runs as root and reads anything, the service as its `User=`.
    pub files_read: Vec<(String, PathBuf)>,
}

#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: AdminListen,
    pub liveness_paths: Vec<String>,
    pub readiness_paths: Vec<String>,
    /// The bearer token mutating calls must carry, read from `token_file`.
    pub token: Option<String>,
    /// Where `token` was read (the CLI sends it only to a port held by a
    /// user who may read this file: `admin::port_holder`).
    pub token_file: Option<PathBuf>,
}

/// Where the admin server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminListen {
    Tcp(SocketAddr),
    /// A Unix socket (`unix:/run/baton/admin.sock`), made mode 0600 as the
    /// control socket is, answering root and baton's own user alone (peer
    /// credentials); the token, where one is set, still guards the
    /// backend API's writes there.
    Unix(PathBuf),
}

impl AdminListen {
    /// Its TCP address, if it has one (the listeners' ports are checked
    /// against it).
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            AdminListen::Tcp(addr) => Some(*addr),
            AdminListen::Unix(_) => None,
        }
    }
}

/// As the config writes it.
impl std::fmt::Display for AdminListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminListen::Tcp(addr) => write!(f, "{addr}"),
            AdminListen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub socket: PathBuf,
}

#[derive(Debug, Clone, Copy)]
pub struct ShutdownConfig {
    pub pre_stop_delay: Duration,
    pub drain_timeout: Duration,
}

#[derive(Debug, Clone, Copy)]
pub struct ReloadConfig {
    pub ready_timeout: Duration,
    pub drain_timeout: Duration,
    pub max_draining: usize,
    pub close_spread: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Tcp,
}

/// What an HTTP listener does with forwarding headers (`forwarded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    /// `X-Forwarded-For` from the peer alone; every forwarding header the
    /// client sent is dropped (nothing a client says is trusted).
    Replace,
    /// The client's `X-Forwarded-For` lines, joined, then the peer: for a
    /// listener behind a proxy that is trusted.
    Append,
    /// Forwarding headers pass untouched and none is added.
    Off,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Tcp => "tcp",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub name: String,
    pub bind: SocketAddr,
    pub protocol: Protocol,
    /// Index into [`Config::pools`] of the default pool.
    pub pool: usize,
    pub routes: Vec<RouteConfig>,
    /// How many SO_REUSEPORT sockets share this address (accept sharding).
    pub reuseport: usize,
    pub backlog: i32,
    /// The kernel queues a connection for accepting only once its first
    /// bytes came (`TCP_DEFER_ACCEPT`): for protocols whose client speaks
    /// first, it saves a wake-up and an empty read a connection.
    pub defer_accept: bool,
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub keepalive_drain_grace: Duration,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    /// A TCP-mode or upgraded connection with no traffic either way for
    /// this long is closed.
    pub tunnel_timeout: Duration,
    /// Bytes a second a request body must average, once past a first
    /// `header_timeout`, while it holds a backend connection; 0 is no
    /// minimum (`proxy::pace`).
    pub body_min_rate: u64,
    pub forwarded: Forwarded,
    /// Streams one h2 client may have open at once.
    pub h2_max_concurrent_streams: u32,
    /// TLS termination (`tls`); `None` serves plain TCP.
    pub tls: Option<Arc<TlsSettings>>,
    /// PROXY headers taken from a balancer in front (`proxy_protocol`).
    pub proxy_protocol: Option<Arc<crate::proxy_protocol::ReceiveSettings>>,
    /// Where its requests are logged (`access_log`).
    pub access_log: Option<crate::access_log::Settings>,
}

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub path_prefix: Option<String>,
    /// Lower-cased, without a port or a final dot (requests' are
    /// compared without theirs).
    pub host: Option<String>,
    /// Index into [`Config::pools`].
    pub pool: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    RoundRobin,
    LeastConn,
    RandomTwo,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub balance: Balance,
    pub health: Option<HealthConfig>,
    pub backends: Vec<BackendConfig>,
    /// Requests or connections one backend takes at once; 0 is no cap.
    pub max_connections_per_backend: usize,
    /// How long work waits, first come first served, for a backend under
    /// its cap, before a 503.
    pub queue_timeout: Duration,
    /// TLS to the backends (their traffic and health checks), if set.
    pub tls: Option<Arc<crate::tls::upstream::UpstreamTls>>,
    /// A PROXY header first on every backend connection (`send_proxy`).
    pub send_proxy: Option<crate::proxy_protocol::Version>,
    /// Backends named by DNS (a host name `address`, or `srv`), resolved
    /// while the generation runs; `backends` holds the IP ones alone.
    pub named: Vec<NamedConfig>,
    /// How often named backends are resolved again (`resolve_interval`);
    /// a record's shorter TTL comes first.
    pub resolve_interval: Duration,
}

/// What a named backend asks DNS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsQuery {
    /// `app1.internal:8080`: every address of the name (A, else AAAA), at that port.
    Host { host: String, port: u16 },
    /// `_http._tcp.app.internal`: one backend per SRV record, its port and
    /// weight from the record.
    Srv(String),
}

impl std::fmt::Display for DnsQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DnsQuery::Host { host, port } => write!(f, "{host}:{port}"),
            DnsQuery::Srv(name) => f.write_str(name),
        }
    }
}

/// A backend named by DNS: one member backend per address it resolves to.
#[derive(Debug, Clone)]
pub struct NamedConfig {
    /// The backend's name (a `srv` entry is named by its record name);
    /// every member shares it.
    pub name: String,
    pub query: DnsQuery,
    /// Each member's weight (a host name's; SRV members take the record's).
    pub weight: u32,
}

/// `[resolver]`: where named backends are looked up.
#[derive(Debug, Clone, Default)]
pub struct ResolverConfig {
    /// `ip:port` of each name server; empty means /etc/resolv.conf's.
    pub nameservers: Vec<SocketAddr>,
    /// How long one query waits for an answer.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthKind {
    Http,
    Tcp,
}

#[derive(Debug, Clone)]
pub struct HealthConfig {
    pub kind: HealthKind,
    pub path: String,
    /// The `Host` an `http` check asks with, as the config wrote it (see
    /// `backend::probe::host_of` for what stands in for it).
    pub host: Option<String>,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
}

#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub name: String,
    pub address: SocketAddr,
    pub weight: u32,
}

impl Config {
    /// How long a stop keeps its doors open: `pre_stop_delay`, and never
    /// less than [`DEFERRED_AT_MOST`] while a listener defers accepting
    /// (the kernel may hold a connection back that long, and closing the
    /// doors before would reset it).
    ///
    /// [`DEFERRED_AT_MOST`]: crate::defer_accept::DEFERRED_AT_MOST
    pub fn stop_pause(&self) -> Duration {
        self.shutdown.pre_stop_delay.max(self.held_back_wait())
    }

    /// How long a connection the kernel holds back for its first bytes
    /// may stay held once the deferral ends: [`DEFERRED_AT_MOST`] while a
    /// listener defers accepting, none otherwise. The least pause of any
    /// stop, one that caught a first start included.
    ///
    /// [`DEFERRED_AT_MOST`]: crate::defer_accept::DEFERRED_AT_MOST
    pub fn held_back_wait(&self) -> Duration {
        if self.listeners.iter().any(|l| l.defer_accept) {
            crate::defer_accept::DEFERRED_AT_MOST
        } else {
            Duration::ZERO
        }
    }

    /// From the stop signal to the drain's deadline: the pause, then
    /// `drain_timeout`. What every generation's stop counts, an older one
    /// still draining included, so that all of them end together.
    pub fn stop_budget(&self) -> Duration {
        self.stop_pause() + self.shutdown.drain_timeout
    }

    /// `TimeoutStopSec` systemd needs so it never cuts a stop short.
    pub fn timeout_stop(&self) -> Duration {
        self.stop_budget() + Duration::from_secs(5)
    }

    /// The client connections the listeners take at once, in all.
    pub fn max_connections(&self) -> usize {
        self.listeners.iter().map(|l| l.max_connections).sum()
    }

    /// The listening sockets a generation holds and hands over: a shard of
    /// each listener for every worker (or `reuseport` of them, if more),
    /// then admin and control.
    pub fn listening_sockets(&self) -> usize {
        let shards: usize = self
            .listeners
            .iter()
            .map(|l| l.reuseport.max(self.workers))
            .sum();
        shards + 2
    }

    /// How long `baton reload` waits for the reload it asked for: the new
    /// generation's `ready_timeout`, and 10 s for the rest of the handoff.
    pub fn reload_wait(&self) -> Duration {
        reload_wait(self.reload.ready_timeout)
    }
}

/// Everything wrong with a config file, each problem naming its key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{}", render_invalid(path, problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

impl ConfigError {
    /// The error as a command says it: a file this user cannot read is no
    /// invalid config (and who was refused is said), the others are.
    pub fn said(&self) -> String {
        match self {
            ConfigError::Read { source, .. } => {
                format!("{self}{}", crate::named_file::refused_as(source))
            }
            _ => format!("config invalid: {self}"),
        }
    }
}

fn render_invalid(path: &Path, problems: &[String]) -> String {
    let mut out = format!("{}: {} problem(s)", path.display(), problems.len());
    for problem in problems {
        out.push_str("\n  ");
        out.push_str(problem);
    }
    out
}

/// The admin section of the config at `path`, read leniently: only its
/// syntax and `[admin]` need to be right (see `validate::admin_only`). A
/// typo in `[admin]` (`lisen`) would send the command to the default
/// address, maybe another baton's: refused, as `check` refuses it.
pub fn load_admin(path: &Path, token: Token) -> Result<AdminConfig, ConfigError> {
    #[derive(serde::Deserialize)]
    struct AdminOnly {
        #[serde(default)]
        admin: file::AdminFile,
    }
    let text = read(path)?;
    let (raw, unknown) =
        read_noting_unknown::<AdminOnly>(&text, path, |key| key.starts_with("admin."))?;
    checked(validate::admin_only(&raw.admin, path, token), unknown, path)
}

/// How long `baton reload` waits for a reload whose new generation has
/// `ready_timeout`: that, and 10 s for the rest of the handoff.
fn reload_wait(ready_timeout: Duration) -> Duration {
    ready_timeout + Duration::from_secs(10)
}

/// Where `baton reload` asks for a reload of the config at `path` and how
/// long it waits, read leniently: only its syntax and `[control]` need to
/// be right (see `validate::reload_target`).
pub fn load_reload_target(path: &Path) -> Result<(PathBuf, Duration), ConfigError> {
    #[derive(serde::Deserialize)]
    struct ControlOnly {
        #[serde(default)]
        control: file::ControlFile,
        #[serde(default)]
        reload: file::ReloadFile,
    }
    let text = read(path)?;
    let (raw, unknown) =
        read_noting_unknown::<ControlOnly>(&text, path, |key| key.starts_with("control."))?;
    let (socket, ready_timeout) = checked(
        validate::reload_target(&raw.control, &raw.reload, path),
        unknown,
        path,
    )?;
    Ok((socket, reload_wait(ready_timeout)))
}

/// Reads, parses and validates the config at `path`, applying `overrides`.
pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
    parse(&read(path)?, path, overrides)
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses and validates config text as if read from `path`. Every unknown
/// key is a problem, named by its path, beside whatever else is wrong.
pub fn parse(text: &str, path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
    let (raw, unknown) = read_noting_unknown::<file::FileConfig>(text, path, |_| true)?;
    checked(from_file(raw, path, overrides), unknown, path)
}

/// `text` deserialized, with the unknown keys `counts` keeps, each as a
/// problem (`listeners[0].bogus: unknown key`); serde ignores them, so all
/// are found, not the first alone.
fn read_noting_unknown<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &Path,
    counts: impl Fn(&str) -> bool,
) -> Result<(T, Vec<String>), ConfigError> {
    let syntax = |err: toml::de::Error| ConfigError::Syntax {
        path: path.to_path_buf(),
        message: err.to_string().trim_end().to_string(),
    };
    let mut unknown = Vec::new();
    let reader = toml::Deserializer::parse(text).map_err(syntax)?;
    let raw = serde_ignored::deserialize(reader, |key| {
        let key = key_path(&key);
        if counts(&key) {
            unknown.push(format!("{key}: unknown key"));
        }
    })
    .map_err(syntax)?;
    Ok((raw, unknown))
}

/// What validation made of a file, with its unknown keys listed first.
fn checked<T>(
    validated: Result<T, Vec<String>>,
    mut unknown: Vec<String>,
    path: &Path,
) -> Result<T, ConfigError> {
    match validated {
        Ok(config) if unknown.is_empty() => return Ok(config),
        Ok(_) => {}
        Err(mut problems) => unknown.append(&mut problems),
    }
    Err(ConfigError::Invalid {
        path: path.to_path_buf(),
        problems: unknown,
    })
}

/// `key` as the problems write a path: `listeners[0].bogus`.
fn key_path(key: &serde_ignored::Path<'_>) -> String {
    match key {
        serde_ignored::Path::Root => String::new(),
        serde_ignored::Path::Seq { parent, index } => format!("{}[{index}]", key_path(parent)),
        serde_ignored::Path::Map { parent, key } => match key_path(parent) {
            above if above.is_empty() => key.clone(),
            above => format!("{above}.{key}"),
        },
        serde_ignored::Path::Some { parent }
        | serde_ignored::Path::NewtypeStruct { parent }
        | serde_ignored::Path::NewtypeVariant { parent } => key_path(parent),
    }
}
