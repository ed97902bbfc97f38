//! # baton
//!
//! A load-balancing TCP/HTTP proxy daemon that never drops a connection
//! when it is reloaded, upgraded or stopped.
//!
//! # Layout
//! The data plane runs left to right; the lifecycle and admin sit beside it.
//! - [`workers`]: the data plane's threads, one runtime each, and
//!   [`workers::PerWorker`], the one way state is kept per worker.
//! - [`listener`]: a listening socket's accept loop; [`defer_accept`], the socket option the loop sets and a stop clears.
//! - [`connection`]: one client connection's bookkeeping; a PROXY header ([`proxy_protocol`]), TLS termination ([`tls`]); dispatch by protocol.
//! - [`proxy`]: one connection's life: [`proxy::tcp`] splices; [`proxy::web`] (an HTTP listener's connections) tells HTTP/1 ([`proxy::h1`], baton's own) from h2c ([`proxy::h2`], whose streams reach backends on [`proxy::h1::relay`]).
//! - [`backend`]: pools, backends, leases, and [`backend::balance`] picking; members swapped whole when DNS changes ([`backend::members`]).
//! - [`stream`]: the byte stream (TCP, or TLS over it) both [`proxy`] and [`backend`] are written against.
//! - [`resolve`]: backends named by DNS (host names, SRV), looked up at start and kept current while serving.
//! - [`lifecycle`]: generations (what an older one hands a new one: [`lifecycle::generation::Inheritance`]), fd handoff, every listening socket adopted or bound ([`lifecycle::endpoint::listen`]), drain, signals, systemd, control socket.
//! - [`daemon`]: the supervisor of one generation (the only writer of its phase), told to stop or reload by its [`lifecycle::signals::Commands`]: the process's signals, or a channel for a test that runs it in-process.
//! - [`admin`]: probes, `/status`, `/metrics` over their own listener.
//! - [`config`]: the TOML file, validated into typed settings.
//! - [`tls`]: listener certificates, loaded and checked at config load; SNI; the rustls config.
//! - [`metrics`], [`telemetry`], [`access_log`]: Prometheus names and handles; logging; one line per request.
//! - [`shortage`]: errors that say baton itself ran short (fds, memory), which no peer is blamed for.
//! - [`named_file`]: a file the config names (certificates, keys, the admin token), read only if regular and small.
//! - [`in_place`]: boxing a future by building it in its allocation, not copying it there whole.
//! - [`wake_gate`]: racing a busy future against a rare one (a drain's force, an idle clock) without polling the rare one at every wake-up.
//! - [`cli`], [`commands`], [`demo`], [`exit`]: the command line, what each command does (a file each), and how it ends.
#![deny(unsafe_code)]

/// `println!` for what a command prints for a person, which does not
/// panic (exit 101, "failed printing to stdout") when the reader went
/// away: `baton check | head -1`, or `grep -q` under `pipefail`. The rest
/// is lost, as it would be to any tool that SIGPIPE ends; the exit code
/// still tells the command's outcome.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `say!` without the line's end (`print!`).
macro_rules! say_text {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

pub mod access_log;
pub mod admin;
pub mod backend;
pub mod cli;
pub mod commands;
pub mod config;
pub mod connection;
pub mod daemon;
pub mod defer_accept;
pub mod demo;
pub mod exit;
pub mod in_place;
pub mod lifecycle;
pub mod listener;
pub mod metrics;
pub mod named_file;
pub mod proxy;
pub mod proxy_protocol;
pub mod resolve;
pub mod shortage;
pub mod splitmix;
pub mod stream;
pub mod telemetry;
pub mod tls;
pub mod wake_gate;
pub mod workers;

pub use config::Config;

/// The running version (overridable at build time, see `src/build.rs`).
pub const VERSION: &str = env!("BATON_VERSION");
/// The git commit this binary was built from.
pub const COMMIT: &str = env!("BATON_COMMIT");
/// What `baton --version` prints.
pub const LONG_VERSION: &str = concat!(
    env!("BATON_VERSION"),
    " (commit ",
    env!("BATON_COMMIT"),
    ")"
);
