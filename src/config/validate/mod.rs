//! `FileConfig` → `Config`. Every check pushes a problem naming its key path
//! (`listeners[1].pool: ...`) and carries on, so one `baton check` lists
//! every mistake at once instead of one per run. The sections with the
//! most checks have files of their own: `pools`, `dns`, `listeners` and `tls`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::duration::{self, Written};
use super::file::{self, DurationValue, FileConfig};
use super::*;

/// The largest `admin.token_file`: a token is a line; a larger file is not
/// one (a device, a log named by mistake).
const MAX_TOKEN_FILE: u64 = 64 << 10;

mod cross;
mod dns;
mod listeners;
mod pools;
mod proxy_protocol;
mod tls;

/// The `[admin]` section alone, validated: what `baton status` and
/// `baton backend` need to find the daemon, whatever else in the file is
/// broken (an operator mid-edit, a certificate gone) while it serves.
pub fn admin_only(
    raw: &file::AdminFile,
    path: &Path,
    token: Token,
) -> Result<AdminConfig, Vec<String>> {
    let mut v = Validator::new(path);
    let admin = v.admin(raw, token);
    if v.problems.is_empty() {
        Ok(admin)
    } else {
        Err(v.problems)
    }
}

/// `control.socket` alone, validated, and `reload.ready_timeout` (its
/// default when it is itself what is wrong): where `baton reload` asks a
/// daemon to reload a file that is broken elsewhere (so the daemon counts
/// and reports the failure as its own), and how long the new generation
/// may take to say it is ready.
pub fn reload_target(
    control: &file::ControlFile,
    reload: &file::ReloadFile,
    path: &Path,
) -> Result<(PathBuf, Duration), Vec<String>> {
    let mut v = Validator::new(path);
    let socket = v.control_socket(control);
    if !v.problems.is_empty() {
        return Err(v.problems);
    }
    let ready_timeout = v.ready_timeout(reload);
    Ok((socket, ready_timeout))
}

/// Whether `admin.token_file` is read: a command that only reads
/// (`baton status`: `/status` asks no token) runs where it may not be
/// readable, as a monitoring user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    Read,
    Unread,
}

/// Builds a validated config, or every problem found.
pub fn from_file(
    raw: FileConfig,
    path: &Path,
    overrides: &Overrides,
) -> Result<Config, Vec<String>> {
    let mut v = Validator::new(path);
    let workers = match v.count("workers", raw.workers, 0, 0, 256) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let busy_poll = v.busy_poll(raw.busy_poll.as_ref());
    let shutdown = v.shutdown(&raw.shutdown, overrides);
    // Where the stop's drain budget came from, for a problem with the
    // reload's, which defaults to it: a flag or the unit's environment is
    // not in the file the problem names.
    let stop_drain_from = if overrides.drain_timeout.is_some() {
        "--drain-timeout (or BATON_DRAIN_TIMEOUT)"
    } else {
        "shutdown.drain_timeout"
    };
    let reload = v.reload(&raw.reload, &shutdown, stop_drain_from);
    let admin = v.admin(&raw.admin, Token::Read);
    let control = ControlConfig {
        socket: v.control_socket(&raw.control),
    };
    let ticket_rotation = v.ticket_rotation(raw.tls.ticket_rotation.as_ref());
    let resolver = v.resolver(&raw.resolver);
    let pools = v.pools(&raw.pools, &pools_only_tcp_uses(&raw.listeners));
    if admin.listen == AdminListen::Unix(control.socket.clone()) {
        v.problem(
            "admin.listen",
            format!(
                "{} is control.socket's path too; give each its own",
                admin.listen
            ),
        );
    }
    let listeners = v.listeners(&raw.listeners, &pools, admin.listen.tcp());
    v.grace_within_drains(
        &listeners,
        [
            (shutdown.drain_timeout, stop_drain_from),
            (reload.drain_timeout, "reload.drain_timeout"),
        ],
    );
    v.no_listener_is_its_own_backend(&listeners, &pools);
    v.one_format_a_destination(&listeners);
    v.every_pool_used(&listeners, &pools);
    if v.problems.is_empty() {
        Ok(Config {
            source: path.to_path_buf(),
            workers,
            pin_workers: raw.pin_workers.unwrap_or(false),
            busy_poll,
            admin,
            control,
            shutdown,
            reload,
            ticket_rotation,
            listeners,
            pools,
            resolver,
            warnings: v.warnings,
            files_read: v.files_read,
        })
    } else {
        Err(v.problems)
    }
}

/// The pools only TCP listeners use (each listener's `pool`; routes are
/// HTTP's): their health check connects unless its `kind` (or a `path`)
/// says otherwise,
/// as HAProxy's `check` does in `mode tcp`. An HTTP check's GET to a
/// database's port fails every time, and would take the pool down.
fn pools_only_tcp_uses(listeners: &[file::ListenerFile]) -> HashSet<String> {
    let mut tcp = HashSet::new();
    let mut http = HashSet::new();
    for l in listeners {
        if l.protocol.as_deref() == Some("tcp") {
            tcp.extend(l.pool.clone());
        } else {
            http.extend(l.pool.clone());
            http.extend(l.routes.iter().filter_map(|r| r.pool.clone()));
        }
    }
    &tcp - &http
}

struct Validator {
    problems: Vec<String>,
    /// Found but not fatal; they reach `Config::warnings`.
    warnings: Vec<String>,
    /// The files read, with their keys (`Config::files_read`).
    files_read: Vec<(String, PathBuf)>,
    /// The config file's folder: relative paths in the file are relative to it.
    base: PathBuf,
    /// The system's CA bundle, once a pool's `tls` read it (`None` inside
    /// when it failed): read and warned of once, however many pools use it.
    system_roots: Option<Option<Arc<rustls::RootCertStore>>>,
}

impl Validator {
    /// For the file at `path` (its relative paths are relative to its folder).
    fn new(path: &Path) -> Validator {
        Validator {
            problems: Vec::new(),
            warnings: Vec::new(),
            files_read: Vec::new(),
            base: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            system_roots: None,
        }
    }

    fn problem(&mut self, key: &str, message: impl std::fmt::Display) {
        self.problems.push(format!("{key}: {message}"));
    }

    /// Notes a file the daemon reads, under `key`.
    fn reads(&mut self, key: &str, path: &Path) {
        self.files_read.push((key.to_string(), path.to_path_buf()));
    }

    fn warning(&mut self, key: &str, message: impl std::fmt::Display) {
        self.warnings.push(format!("{key}: {message}"));
    }

    fn ready_timeout(&mut self, raw: &file::ReloadFile) -> Duration {
        let key = "reload.ready_timeout";
        let timeout = self.timeout(key, raw.ready_timeout.as_ref(), Duration::from_secs(30));
        if (Duration::from_millis(1)..Duration::from_secs(1)).contains(&timeout) {
            self.warning(key, format!("{timeout:?} is shorter than a second: a new generation reads its config, binds, starts its workers and checks its backends within it, and a reload it does not fit in fails"));
        }
        timeout
    }

    /// `control.socket`, or its default.
    fn control_socket(&mut self, raw: &file::ControlFile) -> PathBuf {
        self.socket_path(
            "control.socket",
            raw.socket.as_deref(),
            "/run/baton/control.sock",
        )
    }

    /// A Unix socket's path (as [`Validator::path`]), refused when longer
    /// than sockaddr_un's `sun_path` holds with its closing NUL: the bind
    /// would fail only at start, or at a reload.
    fn socket_path(&mut self, key: &str, written: Option<&str>, default: &str) -> PathBuf {
        let path = self.path(written, default);
        self.no_nul(key, &path);
        if path.is_dir() || path.as_os_str().as_encoded_bytes().ends_with(b"/") {
            self.problem(
                key,
                format!(
                    "{} is a folder: name the socket in it, like {}",
                    path.display(),
                    path.join("baton.sock").display()
                ),
            );
        }
        if path.as_os_str().len() >= 108 {
            self.problem(
                key,
                format!(
                    "{} is longer than a Unix socket's path may be (107 bytes)",
                    path.display()
                ),
            );
        }
        path
    }

    /// A path with a NUL byte passes every check but fails its first use
    /// (no system call takes it): at `run`, with exit 1, where `check`
    /// said the config was good.
    fn no_nul(&mut self, key: &str, path: &Path) {
        if path.as_os_str().as_encoded_bytes().contains(&0) {
            self.problem(key, "holds a NUL byte, which no path may");
        }
    }

    fn path(&self, written: Option<&str>, default: &str) -> PathBuf {
        let p = PathBuf::from(written.unwrap_or(default));
        if p.is_absolute() {
            p
        } else {
            self.base.join(p)
        }
    }

    /// A phase budget: negative means the phase takes no time.
    fn phase(&mut self, key: &str, value: Option<&DurationValue>, default: Duration) -> Duration {
        match value.map(duration::parse) {
            None | Some(Ok(Written::Default)) => default,
            Some(Ok(Written::None)) => Duration::ZERO,
            Some(Ok(Written::Exactly(d))) => d,
            Some(Err(message)) => {
                self.problem(key, message);
                default
            }
        }
    }

    /// A timeout bounding a wait on someone else: positive (see
    /// [`Self::period`]), and warned of under a millisecond: no wait baton
    /// bounds is met in less (a connect, a check, a new generation's
    /// start), so it is a typo of `us` for `ms` or `s`, most likely.
    /// Warned, not refused: it runs, badly.
    fn timeout(&mut self, key: &str, value: Option<&DurationValue>, default: Duration) -> Duration {
        let timeout = self.period(key, value, default);
        if timeout < Duration::from_millis(1) {
            self.warning(key, format!("{timeout:?} is shorter than a millisecond: nearly every wait it bounds will fail"));
        }
        timeout
    }

    /// A positive span (a timeout, an interval): "none" would fail every
    /// wait at once, or repeat at once, so a negative value is refused
    /// rather than obeyed.
    fn period(&mut self, key: &str, value: Option<&DurationValue>, default: Duration) -> Duration {
        match value.map(duration::parse) {
            Some(Ok(Written::None)) => {
                self.problem(
                    key,
                    "must be positive (a timeout of none would fail every wait)",
                );
                default
            }
            _ => self.phase(key, value, default),
        }
    }

    /// A spin longer than a tenth of a second would keep a core busy
    /// through pauses that are not traffic's gaps (a typo of `ms` for
    /// `us`, most likely).
    fn busy_poll(&mut self, value: Option<&DurationValue>) -> Duration {
        const KEY: &str = "busy_poll";
        const MOST: Duration = Duration::from_millis(100);
        let window = self.phase(KEY, value, Duration::ZERO);
        if window > MOST {
            self.problem(
                KEY,
                "must be at most 100ms (a worker spins this long before it sleeps)",
            );
            return Duration::ZERO;
        }
        window
    }

    /// A ticket lives two periods, and says so in whole seconds: under a
    /// second it would say 0 (clients keep no ticket), over three and a
    /// half days more than the seven RFC 8446 §4.6.1 allows a server to
    /// send (some clients then drop the ticket or the connection).
    fn ticket_rotation(&mut self, value: Option<&DurationValue>) -> Duration {
        const KEY: &str = "tls.ticket_rotation";
        const MOST: Duration = Duration::from_secs(84 * 3600);
        let period = self.period(KEY, value, Duration::from_secs(12 * 3600));
        if period < Duration::from_secs(1) || period > MOST {
            self.problem(
                KEY,
                format!(
                    "{} is out of range: must be from 1s to 84h (a ticket lives two \
                     periods, and TLS 1.3 lets it live 7 days at most)",
                    humantime::format_duration(period)
                ),
            );
        }
        period
    }

    fn override_phase(&mut self, key: &str, value: &Option<String>) -> Option<Written> {
        let text = value.as_ref()?;
        match duration::parse(&DurationValue::Text(text.clone())) {
            Ok(w) => Some(w),
            Err(message) => {
                self.problem(key, message);
                None
            }
        }
    }

    fn shutdown(&mut self, raw: &file::ShutdownFile, overrides: &Overrides) -> ShutdownConfig {
        let mut pre_stop_delay = self.phase(
            "shutdown.pre_stop_delay",
            raw.pre_stop_delay.as_ref(),
            Duration::from_secs(5),
        );
        let mut drain_timeout = self.phase(
            "shutdown.drain_timeout",
            raw.drain_timeout.as_ref(),
            Duration::from_secs(10),
        );
        let key = "--pre-stop-delay (or BATON_PRE_STOP_DELAY)";
        if let Some(w) = self.override_phase(key, &overrides.pre_stop_delay) {
            pre_stop_delay = resolve(w, Duration::from_secs(5));
        }
        let key = "--drain-timeout (or BATON_DRAIN_TIMEOUT)";
        if let Some(w) = self.override_phase(key, &overrides.drain_timeout) {
            drain_timeout = resolve(w, Duration::from_secs(10));
        }
        ShutdownConfig {
            pre_stop_delay,
            drain_timeout,
        }
    }

    fn reload(
        &mut self,
        raw: &file::ReloadFile,
        shutdown: &ShutdownConfig,
        stop_drain_from: &str,
    ) -> ReloadConfig {
        let ready_timeout = self.ready_timeout(raw);
        let drain_timeout = self.phase(
            "reload.drain_timeout",
            raw.drain_timeout.as_ref(),
            shutdown.drain_timeout,
        );
        let max_draining = self.count("reload.max_draining", raw.max_draining, 4, 1, 64);
        let close_spread = self.phase(
            "reload.close_spread",
            raw.close_spread.as_ref(),
            Duration::ZERO,
        );
        // Spread past the drain's deadline, the streams still open at it
        // are cut together: the reconnect storm the spread exists to avoid.
        if !drain_timeout.is_zero() && close_spread >= drain_timeout {
            let inherited = match raw.drain_timeout {
                None => format!(", the stop's from {stop_drain_from}"),
                Some(_) => String::new(),
            };
            self.problem(
                "reload.close_spread",
                format!(
                    "{} must be shorter than reload.drain_timeout ({}{inherited}): the streams still open at the drain's deadline would all be cut at once",
                    humantime::format_duration(close_spread),
                    humantime::format_duration(drain_timeout)
                ),
            );
        }
        ReloadConfig {
            ready_timeout,
            drain_timeout,
            max_draining,
            close_spread,
        }
    }

    fn count(
        &mut self,
        key: &str,
        value: Option<file::Whole>,
        default: usize,
        min: i64,
        max: i64,
    ) -> usize {
        match value.map(|whole| whole.0) {
            None => default,
            Some(n) if (min..=max).contains(&n) => n as usize,
            Some(n) => {
                self.problem(key, format!("{n} is out of range ({min} to {max})"));
                default
            }
        }
    }

    fn admin(&mut self, raw: &file::AdminFile, token: Token) -> AdminConfig {
        let listen = self.admin_listen(raw.listen.as_deref());
        let liveness_paths = self.paths("admin.liveness_paths", &raw.liveness_paths, "/healthz");
        let readiness_paths = self.paths("admin.readiness_paths", &raw.readiness_paths, "/readyz");
        self.probe_paths_apart(&liveness_paths, &readiness_paths);
        let token = match token {
            Token::Read => raw.token_file.as_deref().and_then(|f| self.token(f)),
            Token::Unread => None,
        };
        let token_file = token
            .as_ref()
            .and(raw.token_file.as_deref())
            .map(|f| self.path(Some(f), f));
        let open_to_all = raw.allow_remote_without_token.unwrap_or(false);
        let remote = listen.tcp().filter(|addr| !addr.ip().is_loopback());
        if remote.is_some() && raw.token_file.is_none() && !open_to_all {
            self.problem(
                "admin.listen",
                format!(
                    "{listen} is not a loopback address and admin.token_file is not set: anyone who reaches it could drain backends; set a token, or admin.allow_remote_without_token = true"
                ),
            );
        }
        AdminConfig {
            listen,
            liveness_paths,
            readiness_paths,
            token,
            token_file,
        }
    }

    /// `admin.listen`: an address, or `unix:` and a path (relative paths
    /// are the config folder's, as `control.socket`'s).
    fn admin_listen(&mut self, written: Option<&str>) -> AdminListen {
        let default = AdminListen::Tcp(SocketAddr::from(([127, 0, 0, 1], 9901)));
        match written.map(|text| (text, text.strip_prefix("unix:"))) {
            None => default,
            Some((_, Some(""))) => {
                self.problem(
                    "admin.listen",
                    "\"unix:\" needs the socket's path, like \"unix:/run/baton/admin.sock\"",
                );
                default
            }
            Some((_, Some(path))) => {
                AdminListen::Unix(self.socket_path("admin.listen", Some(path), ""))
            }
            Some((text, None)) => {
                let addr = self.socket_addr("admin.listen", text);
                // (A stand-in for one that did not parse has port 0 too.)
                if text.parse::<SocketAddr>().is_ok_and(|a| a.port() == 0) {
                    self.warning("admin.listen", "port 0 takes whichever port is free, which baton status, baton backend and probes cannot know: name one");
                }
                AdminListen::Tcp(addr)
            }
        }
    }

    fn paths(&mut self, key: &str, raw: &Option<Vec<String>>, default: &str) -> Vec<String> {
        let Some(paths) = raw else {
            return vec![default.to_string()];
        };
        if paths.is_empty() {
            self.problem(key, "needs at least one path");
        }
        for (i, p) in paths.iter().enumerate() {
            if !p.starts_with('/') {
                self.problem(
                    &format!("{key}[{i}]"),
                    format!("\"{p}\" must start with '/'"),
                );
            }
        }
        paths.clone()
    }

    /// A probe path that is also the other probe's, or one of the admin
    /// port's own endpoints, would answer in their place: the liveness
    /// probe is matched first, so `readiness_paths = ["/healthz"]` kept
    /// readiness at 200 through a stop, and `/status` or `/metrics` among
    /// them hid `baton status` or the scrape.
    fn probe_paths_apart(&mut self, liveness: &[String], readiness: &[String]) {
        let lists = [
            ("admin.liveness_paths", liveness),
            ("admin.readiness_paths", readiness),
        ];
        for (key, paths) in lists {
            for (i, p) in paths.iter().enumerate() {
                let taken = if p == "/status" || p == "/metrics" || p.starts_with("/backends/") {
                    Some("an admin endpoint of baton's own".to_string())
                } else if key == "admin.readiness_paths" && liveness.contains(p) {
                    Some("also in admin.liveness_paths".to_string())
                } else if p.contains(['?', '#']) {
                    Some(
                        "a path with a query or fragment, which no request path matches"
                            .to_string(),
                    )
                } else {
                    None
                };
                if let Some(taken) = taken {
                    self.problem(&format!("{key}[{i}]"), format!("\"{p}\" is {taken}"));
                }
            }
        }
    }

    /// The token lets its holder drain and re-weight backends: a file
    /// every user of the host may read hands that to all of them (ssh
    /// refuses a key kept so). A warning, not an error: such a config
    /// served before.
    fn token_kept_close(&mut self, key: &str, path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o004 != 0 {
            self.warning(
                key,
                format!(
                    "{} may be read by every user of this host (mode {mode:04o}), and the token drains backends: chmod o-r it",
                    path.display()
                ),
            );
        }
    }

    /// `admin.token_file`'s token: a regular file of at most
    /// `MAX_TOKEN_FILE` bytes (`named_file`).
    fn token(&mut self, file: &str) -> Option<String> {
        let path = self.path(Some(file), file);
        self.reads("admin.token_file", &path);
        let read = crate::named_file::read(&path, MAX_TOKEN_FILE).and_then(|bytes| {
            String::from_utf8(bytes).map_err(|_| {
                let not_text = std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8");
                crate::named_file::NamedFileError::Read(not_text)
            })
        });
        match read {
            Ok(text) if text.trim().is_empty() => {
                self.problem("admin.token_file", format!("{} is empty", path.display()));
                None
            }
            Ok(text) => {
                let token = text.trim().to_string();
                // An HTTP header carries it: a token with any other byte
                // never matches, and every call is refused. A warning, not
                // an error: such a config served before, and must not stop
                // a restart after an upgrade.
                if !token
                    .bytes()
                    .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
                {
                    self.warning(
                        "admin.token_file",
                        format!(
                            "{}: the token is not printable ASCII, which an Authorization header cannot carry: no backend call can authenticate",
                            path.display()
                        ),
                    );
                }
                self.token_kept_close("admin.token_file", &path);
                Some(token)
            }
            Err(err) => {
                self.problem("admin.token_file", format!("{} {err}", path.display()));
                None
            }
        }
    }

    fn socket_addr(&mut self, key: &str, text: &str) -> SocketAddr {
        match text.parse::<SocketAddr>() {
            // baton binds IPv6 sockets v6-only (`[::]` takes no IPv4
            // client), where an IPv4-mapped address cannot be bound: `run`
            // failed with EINVAL on what `check` took.
            Ok(SocketAddr::V6(v6)) if v6.ip().to_ipv4_mapped().is_some() => {
                let v4 = SocketAddr::from((v6.ip().to_canonical(), v6.port()));
                self.problem(
                    key,
                    format!("\"{text}\" is an IPv4 address written as IPv6, which a v6-only socket cannot bind: write \"{v4}\""),
                );
                v4
            }
            // Linux binds a scope only to a link-local address and reads
            // it back as 0 on any other, so the socket was never known as
            // this address again: each reload bound it afresh (the admin's
            // failed, a listener's old shard closed with its queue).
            Ok(SocketAddr::V6(v6)) if v6.scope_id() != 0 && !link_local(v6.ip()) => {
                let unscoped = SocketAddr::from((*v6.ip(), v6.port()));
                self.problem(
                    key,
                    format!("\"{text}\" gives a scope (%{}) to an address that is not link-local (fe80::/10): write \"{unscoped}\"", v6.scope_id()),
                );
                unscoped
            }
            // Without its interface a link-local address cannot be bound
            // (EINVAL at `run`, where `check` took it).
            Ok(SocketAddr::V6(v6)) if v6.scope_id() == 0 && link_local(v6.ip()) => {
                self.problem(
                    key,
                    format!("\"{text}\" is link-local and needs its interface's number: \"[{}%N]:{}\", N as `ip -6 addr` numbers it (names are not read)", v6.ip(), v6.port()),
                );
                SocketAddr::V6(v6)
            }
            Ok(addr) => addr,
            Err(_) => {
                self.problem(
                    key,
                    format!("\"{text}\" is not an address like \"0.0.0.0:8080\" or \"[::]:8080\""),
                );
                SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }

    fn name(&mut self, key: &str, name: Option<&str>) -> String {
        let Some(name) = name else {
            self.problem(key, "is required");
            return String::new();
        };
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            self.problem(
                key,
                format!("\"{name}\" must be 1-64 characters of letters, digits, '-', '_' or '.'"),
            );
        }
        name.to_string()
    }
}

fn resolve(w: Written, default: Duration) -> Duration {
    match w {
        Written::Default => default,
        Written::None => Duration::ZERO,
        Written::Exactly(d) => d,
    }
}

/// `api.example.com:8080` → `api.example.com` (an IPv6 literal keeps its brackets).
pub fn strip_port(host: &str) -> &str {
    match host.rfind(':') {
        Some(i) if !host[i..].contains(']') && host[..i].matches(':').count() == 0 => &host[..i],
        Some(i) if host.starts_with('[') && host[..i].ends_with(']') => &host[..i],
        _ => host,
    }
}

/// Whether `ip` is link-local (fe80::/10), the one kind of IPv6 address a
/// scope (an interface) belongs to.
fn link_local(ip: &std::net::Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::super::{parse, ConfigError, Overrides};
    use std::path::Path;
    use std::time::Duration;

    const GOOD: &str = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:8080"
pool = "app"

[[pools]]
name = "app"
backends = [{ name = "a", address = "127.0.0.1:9001" }]
"#;

    /// `GOOD` with `keys` added to its listener.
    fn listener_keys(keys: &str) -> String {
        GOOD.replace("pool = \"app\"\n", &format!("pool = \"app\"\n{keys}"))
    }

    /// Every problem `text` has (it must have some).
    pub(super) fn problems(text: &str) -> Vec<String> {
        match parse(
            text,
            Path::new("/etc/baton/baton.toml"),
            &Overrides::default(),
        ) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    /// The warnings of `text` (which must be valid), read as if from
    /// /tmp (a folder there is, for the paths relative to it).
    pub(super) fn warnings(text: &str) -> Vec<String> {
        parse(text, Path::new("/tmp/baton.toml"), &Overrides::default())
            .expect("warned, not refused")
            .warnings
    }

    /// Asserts `found` is one warning, at `key`, saying `part`.
    pub(super) fn warned_once(found: &[String], key: &str, part: &str) {
        assert!(
            found.len() == 1 && found[0].starts_with(key) && found[0].contains(part),
            "{found:?}"
        );
    }

    /// Asserts `text` has one problem, at `key`, saying `said`.
    fn refused_once(text: &str, key: &str, said: &str) {
        let found = problems(text);
        assert!(
            found.len() == 1 && found[0].starts_with(key) && found[0].contains(said),
            "{text}: {found:?}"
        );
    }

    /// A health check that names no kind connects for a pool only TCP
    /// listeners use (HAProxy's `check` in `mode tcp`): an HTTP GET to a
    /// database's port failed every check and took the pool down. Any
    /// HTTP listener or route on the pool keeps it HTTP.
    #[test]
    fn an_unnamed_check_kind_follows_the_listeners_of_its_pool() {
        use crate::config::HealthKind;
        let tcp = GOOD
            .replace("pool = \"app\"\n", "pool = \"app\"\nprotocol = \"tcp\"\n")
            .replace(
                "backends = [",
                "health = { interval = \"5s\" }\nbackends = [",
            );
        let kind_of = |text: &str| {
            parse(text, Path::new("x.toml"), &Overrides::default())
                .expect("valid")
                .pools[0]
                .health
                .as_ref()
                .map(|h| h.kind)
        };
        assert_eq!(kind_of(&tcp), Some(HealthKind::Tcp));
        let named = tcp.replace("health = { ", "health = { kind = \"http\", ");
        assert_eq!(kind_of(&named), Some(HealthKind::Http));
        let with_path = tcp.replace("health = { ", "health = { path = \"/up\", ");
        assert_eq!(
            kind_of(&with_path),
            Some(HealthKind::Http),
            "a path asks for HTTP"
        );
        let with_host = tcp.replace("health = { ", "health = { host = \"db.example\", ");
        assert_eq!(
            kind_of(&with_host),
            Some(HealthKind::Http),
            "so does a host"
        );
        let shared = format!(
            "{tcp}\n[[listeners]]\nname = \"web2\"\nbind = \"127.0.0.1:8081\"\npool = \"app\"\n"
        );
        assert_eq!(kind_of(&shared), Some(HealthKind::Http));
    }

    /// The first matching route wins: one an earlier route takes every
    /// request of is warned of (nginx users expect the longest prefix).
    #[test]
    fn a_route_an_earlier_one_covers_is_warned_of() {
        let routed = |routes: &str| {
            let text = format!(
                "{}\n[[pools]]\nname = \"api\"\nbackends = [{{ name = \"b\", address = \"127.0.0.1:9002\" }}]\n",
                listener_keys(&format!("routes = [{routes}]\n"))
            );
            warnings(&text)
        };
        warned_once(
            &routed("{ path_prefix = \"/\", pool = \"app\" }, { path_prefix = \"/api\", pool = \"api\" }"),
            "listeners[0].routes[1]",
            "routes[0]",
        );
        let same_host = routed(
            "{ host = \"x.example.com\", pool = \"api\" }, { host = \"X.example.com\", path_prefix = \"/a\", pool = \"app\" }",
        );
        assert_eq!(same_host.len(), 1, "{same_host:?}");
        for fine in [
            "{ path_prefix = \"/api\", pool = \"api\" }, { path_prefix = \"/\", pool = \"app\" }",
            "{ host = \"x.example.com\", pool = \"api\" }, { path_prefix = \"/a\", pool = \"app\" }",
            "{ path_prefix = \"/a\", pool = \"api\" }, { host = \"x.example.com\", pool = \"app\" }",
        ] {
            assert!(routed(fine).is_empty(), "{fine}: {:?}", routed(fine));
        }
    }

    #[test]
    fn pool_keys_that_do_nothing_are_warned_of() {
        let warned =
            |keys: &str| warnings(&GOOD.replace("backends = [", &format!("{keys}\nbackends = [")));
        warned_once(
            &warned("queue_timeout = \"2s\""),
            "pools[0].queue_timeout",
            "does nothing",
        );
        assert!(warned("queue_timeout = \"2s\"\nmax_connections_per_backend = 10").is_empty());
        warned_once(
            &warned("resolve_interval = \"5s\""),
            "pools[0].resolve_interval",
            "does nothing",
        );
    }

    /// What a config takes but may not mean: said, not refused (a config
    /// that ran must still reload).
    #[test]
    fn settings_that_may_not_mean_what_they_say_are_warned_of() {
        let warned = |keys: &str| warnings(&listener_keys(keys));
        warned_once(
            &warned("proxy_protocol = { trusted = [\"10.0.0.0/8\", \"0.0.0.0/0\"] }\n"),
            "listeners[0].proxy_protocol.trusted[1]",
            "trusts every address",
        );
        warned_once(
            &warned("access_log = { path = \"stderr\" }\n"),
            "listeners[0].access_log.path",
            "is the file /tmp/stderr",
        );
        assert!(warned("access_log = { path = \"stdout\" }\n").is_empty());
    }

    #[test]
    fn defaults_fill_a_minimal_file() {
        let c = parse(GOOD, Path::new("x.toml"), &Overrides::default()).expect("valid");
        assert_eq!(c.listeners[0].backlog, 1024);
        assert!(c.listeners[0].defer_accept, "an HTTP listener defers");
        assert_eq!(c.reload.drain_timeout, c.shutdown.drain_timeout);
        assert_eq!(c.timeout_stop().as_secs(), 20);
    }

    /// The defaults README's tables promise, and the balance its example
    /// names (a changed default changes every installation that leaves
    /// the key out).
    #[test]
    fn the_defaults_are_the_ones_readme_gives() {
        use crate::config::{Balance, Forwarded};
        let c = parse(GOOD, Path::new("x.toml"), &Overrides::default()).expect("valid");
        let secs = Duration::from_secs;
        let l = &c.listeners[0];
        assert_eq!(
            (l.max_connections, l.reuseport, l.h2_max_concurrent_streams),
            (10_000, 1, 100)
        );
        assert_eq!(
            [
                l.header_timeout,
                l.idle_timeout,
                l.keepalive_drain_grace,
                l.connect_timeout,
                l.response_timeout,
                l.tunnel_timeout,
            ],
            [secs(10), secs(60), secs(1), secs(2), secs(60), secs(3600)]
        );
        assert_eq!((l.body_min_rate, l.forwarded), (0, Forwarded::Replace));
        let p = &c.pools[0];
        assert_eq!(
            (p.balance, p.max_connections_per_backend, p.queue_timeout),
            (Balance::RoundRobin, 0, secs(5))
        );
        assert_eq!(p.resolve_interval, secs(30));
        assert_eq!(
            (c.shutdown.pre_stop_delay, c.shutdown.drain_timeout),
            (secs(5), secs(10))
        );
        assert_eq!(
            (
                c.reload.ready_timeout,
                c.reload.max_draining,
                c.reload.close_spread
            ),
            (secs(30), 4, Duration::ZERO)
        );
        assert_eq!(c.ticket_rotation, secs(12 * 3600));
        assert_eq!(
            (&c.admin.liveness_paths[..], &c.admin.readiness_paths[..]),
            (&["/healthz".to_string()][..], &["/readyz".to_string()][..])
        );
    }

    /// [`GOOD`] with `before` ahead of it and its listener of `protocol`
    /// given `line` too.
    fn good_with(before: &str, protocol: &str, line: &str) -> crate::config::Config {
        let text = GOOD.replace(
            "pool = \"app\"\n\n[[pools]]",
            &format!("pool = \"app\"\nprotocol = \"{protocol}\"\n{line}\n[[pools]]"),
        );
        parse(
            &format!("{before}{text}"),
            Path::new("x.toml"),
            &Overrides::default(),
        )
        .expect("valid")
    }

    /// `defer_accept` is on for HTTP, whose clients speak first, and off
    /// for TCP mode, whose protocol may have its server speak first;
    /// either may be set otherwise.
    #[test]
    fn defer_accept_follows_the_protocol_unless_given() {
        let with =
            |line: &str, protocol: &str| good_with("", protocol, line).listeners[0].defer_accept;
        assert!(with("", "http"));
        assert!(!with("", "tcp"));
        assert!(!with("defer_accept = false", "http"));
        assert!(with("defer_accept = true", "tcp"));
    }

    /// A stop's pause is `pre_stop_delay`, but never under the 1.5 s a
    /// deferring listener's held-back connections need (all a stop that
    /// caught a first start waits), and the stop's budgets
    /// (`TimeoutStopSec` here) count the pause, not the key.
    #[test]
    fn the_stop_pause_covers_held_back_connections_and_the_budgets_count_it() {
        let with = |shutdown: &str, protocol: &str| {
            good_with(
                &format!("[shutdown]\n{shutdown}\ndrain_timeout = \"2s\"\n"),
                protocol,
                "",
            )
        };
        let c = with("pre_stop_delay = \"-1s\"", "http");
        assert_eq!(c.stop_pause(), Duration::from_millis(1500));
        assert_eq!(c.stop_budget(), Duration::from_millis(3500));
        assert_eq!(c.timeout_stop(), Duration::from_millis(8500));
        let c = with("pre_stop_delay = \"-1s\"", "tcp");
        assert_eq!(c.stop_pause(), Duration::ZERO, "nothing defers");
        assert_eq!(c.timeout_stop(), Duration::from_secs(7));
        assert_eq!(c.held_back_wait(), Duration::ZERO);
        let c = with("pre_stop_delay = \"3s\"", "http");
        assert_eq!(c.stop_pause(), Duration::from_secs(3));
        assert_eq!(c.held_back_wait(), Duration::from_millis(1500));
    }

    /// A table written where another kind of value goes (or one bracket
    /// for a list of tables) is refused saying what goes there, not
    /// naming a Rust type ("expected struct AccessLogFile").
    #[test]
    fn a_value_of_the_wrong_shape_says_what_goes_there() {
        let said = |text: &str| match parse(text, Path::new("x.toml"), &Overrides::default()) {
            Err(ConfigError::Syntax { message, .. }) => message,
            other => panic!("expected a type error, got {other:?}"),
        };
        let one_bracket = GOOD.replace("[[listeners]]", "[listeners]");
        assert!(
            said(&one_bracket).contains("two brackets"),
            "{}",
            said(&one_bracket)
        );
        let inline = listener_keys("access_log = \"/x.log\"\n");
        let message = said(&inline);
        assert!(
            message.contains("e.g. { path =") && !message.contains("struct"),
            "{message}"
        );
        for weight in ["\"2\"", "2.5"] {
            let quoted = GOOD.replace(
                "address = \"127.0.0.1:9001\"",
                &format!("address = \"127.0.0.1:9001\", weight = {weight}"),
            );
            let message = said(&quoted);
            assert!(
                message.contains("a whole number written without quotes")
                    && !message.contains("i64"),
                "{message}"
            );
        }
    }

    /// A value of another type than a duration is refused at its line
    /// saying what a duration looks like.
    #[test]
    fn a_duration_of_the_wrong_type_says_what_a_duration_is() {
        let text = format!("[shutdown]\ndrain_timeout = true\n{GOOD}");
        match parse(&text, Path::new("x.toml"), &Overrides::default()) {
            Err(ConfigError::Syntax { message, .. }) => {
                assert!(message.contains("drain_timeout = true"), "{message}");
                assert!(
                    message.contains(r#"a duration such as "250ms""#),
                    "{message}"
                );
            }
            other => panic!("expected a type error, got {other:?}"),
        }
        let seconds = format!("[shutdown]\ndrain_timeout = 7\n{GOOD}");
        let c = parse(&seconds, Path::new("x.toml"), &Overrides::default()).expect("valid");
        assert_eq!(c.shutdown.drain_timeout.as_secs(), 7);
    }

    /// A probe path must answer for its probe alone: one in both lists, or
    /// one of the admin port's own endpoints, is refused naming its key.
    #[test]
    fn probe_paths_that_would_answer_for_another_endpoint_are_refused() {
        for (admin, key, said) in [
            (
                "readiness_paths = [\"/healthz\"]",
                "admin.readiness_paths[0]",
                "also in admin.liveness_paths",
            ),
            (
                "liveness_paths = [\"/live\", \"/status\"]",
                "admin.liveness_paths[1]",
                "an admin endpoint of baton's own",
            ),
            (
                "readiness_paths = [\"/backends/a\"]",
                "admin.readiness_paths[0]",
                "an admin endpoint of baton's own",
            ),
            (
                "liveness_paths = [\"/live?x=1\"]",
                "admin.liveness_paths[0]",
                "a query or fragment",
            ),
        ] {
            refused_once(&format!("[admin]\n{admin}\n{GOOD}"), key, said);
        }
        let apart = format!(
            "[admin]\nliveness_paths = [\"/live\"]\nreadiness_paths = [\"/healthz\"]\n{GOOD}"
        );
        parse(&apart, Path::new("x.toml"), &Overrides::default()).expect("paths apart");
    }

    #[test]
    fn a_check_timeout_past_its_interval_is_warned_of() {
        let text = GOOD.replace(
            "backends =",
            "health = { kind = \"tcp\", interval = \"2s\", timeout = \"30s\" }\nbackends =",
        );
        warned_once(
            &warnings(&text),
            "pools[0].health.timeout",
            "goes down only after 96s",
        );
        let within = GOOD.replace(
            "backends =",
            "health = { kind = \"tcp\", interval = \"2s\", timeout = \"2s\" }\nbackends =",
        );
        assert_eq!(warnings(&within), Vec::<String>::new());
    }

    /// Values that pass their own range but cannot work are refused,
    /// naming the key: a close spread the drain's deadline cuts short, a
    /// backend on port 0, and checks every millisecond; and one address in
    /// two pools without names is refused at the address, not at a `name`
    /// key the operator never wrote; and a listener on the admin's port at
    /// the wildcard address, or at an IPv4-mapped IPv6 one, which `run`
    /// could not bind; and a health check's path no request line can carry.
    #[test]
    fn values_that_cannot_work_are_refused() {
        for (text, key, said) in [
            (
                format!("[reload]\nclose_spread = \"5m\"\n{GOOD}"),
                "reload.close_spread",
                "shorter than reload.drain_timeout (10s, the stop's from shutdown.drain_timeout)",
            ),
            (
                GOOD.replace("127.0.0.1:9001", "127.0.0.1:0"),
                "pools[0].backends[0].address",
                "0 is not a port",
            ),
            (
                GOOD.replace(
                    "backends =",
                    "health = { kind = \"tcp\", interval = \"1ms\" }\nbackends =",
                ),
                "pools[0].health.interval",
                "at least 100ms",
            ),
            (
                GOOD.replace(
                    "backends =",
                    "health = { kind = \"tcp\", host = \"www.example.com\" }\nbackends =",
                ),
                "pools[0].health.host",
                "is for an http check",
            ),
            (
                GOOD.replace(
                    "backends =",
                    "health = { kind = \"http\", host = \"http://www.example.com/\" }\nbackends =",
                ),
                "pools[0].health.host",
                "is not a host name",
            ),
            (
                format!(
                    "{GOOD}\n[[pools]]\nname = \"other\"\nbackends = [{{ address = \"127.0.0.1:9002\" }}]\n[[pools]]\nname = \"third\"\nbackends = [{{ address = \"127.0.0.1:9002\" }}]\n"
                ),
                "pools[2].backends[0].address",
                "give each of the two a name",
            ),
            (
                GOOD.replace(
                    "backends =",
                    "health = { path = \"/health check\" }\nbackends =",
                ),
                "pools[0].health.path",
                "a request target",
            ),
            (
                GOOD.replace(
                    "backends =",
                    "health = { path = \"/h\\r\\nHost: x\" }\nbackends =",
                ),
                "pools[0].health.path",
                "percent-encode",
            ),
            (
                GOOD.replace("127.0.0.1:8080", "[::ffff:127.0.0.1]:8080"),
                "listeners[0].bind",
                "write \"127.0.0.1:8080\"",
            ),
            (
                GOOD.replace("127.0.0.1:8080", "[::1%1]:8080"),
                "listeners[0].bind",
                "not link-local (fe80::/10): write \"[::1]:8080\"",
            ),
            (
                GOOD.replace("127.0.0.1:8080", "[fe80::1]:8080"),
                "listeners[0].bind",
                "needs its interface's number: \"[fe80::1%N]:8080\"",
            ),
            (
                GOOD.replace("127.0.0.1:8080", "0.0.0.0:9901"),
                "listeners[0].bind",
                "admin server (127.0.0.1:9901",
            ),
            (
                listener_keys("routes = [{ host = \"api.example.com/\", pool = \"app\" }]\n"),
                "listeners[0].routes[0].host",
                "no request's Host would match it",
            ),
            (
                listener_keys("routes = [{ host = \"api.example.com..\", pool = \"app\" }]\n"),
                "listeners[0].routes[0].host",
                "no request's Host would match it",
            ),
            (
                listener_keys("routes = [{ host = \"*.example.com\", pool = \"app\" }]\n"),
                "listeners[0].routes[0].host",
                "no request's Host would match it",
            ),
            (
                listener_keys("routes = [{ path_prefix = \"/a b\", pool = \"app\" }]\n"),
                "listeners[0].routes[0].path_prefix",
                "a path as requests send it",
            ),
            (
                listener_keys("routes = [{ path_prefix = \"/x?y\", pool = \"app\" }]\n"),
                "listeners[0].routes[0].path_prefix",
                "without '?'",
            ),
            (
                format!("[resolver]\nnameservers = [\"10.0.0.2:0\"]\n{GOOD}"),
                "resolver.nameservers[0]",
                "has port 0",
            ),
            (
                format!("[control]\nsocket = \"/run/baton/c\\u0000.sock\"\n{GOOD}"),
                "control.socket",
                "NUL byte",
            ),
            (
                listener_keys("access_log = { path = \"/tmp/a\\u0000b\" }\n"),
                "listeners[0].access_log.path",
                "NUL byte",
            ),
            (
                listener_keys("access_log = { path = \"/tmp/\" }\n"),
                "listeners[0].access_log.path",
                "is a folder",
            ),
        ] {
            refused_once(&text, key, said);
        }
        let other_family = GOOD.replace("127.0.0.1:8080", "[::]:9901");
        parse(&other_family, Path::new("x.toml"), &Overrides::default())
            .expect("IPv6's wildcard is apart from 127.0.0.1");
        let encoded = GOOD.replace(
            "backends =",
            "health = { path = \"/health%20check?probe=1\" }\nbackends =",
        );
        parse(&encoded, Path::new("x.toml"), &Overrides::default()).expect("an encoded path");
        for host in [
            "API.example.com.",
            "10.0.0.1:8080",
            "[::1]:8080",
            "localhost",
            "my_app.internal",
            "xn--bcher-kva.example",
        ] {
            let routed = listener_keys(&format!(
                "routes = [{{ host = \"{host}\", pool = \"app\" }}]\n"
            ));
            parse(&routed, Path::new("x.toml"), &Overrides::default()).expect(host);
        }
        let spread = format!("[reload]\nclose_spread = \"5s\"\n{GOOD}");
        parse(&spread, Path::new("x.toml"), &Overrides::default()).expect("5s within 10s");
    }

    #[test]
    fn an_address_that_does_not_parse_is_one_problem() {
        let text = GOOD.replace(
            "backends = [{ name = \"a\", address = \"127.0.0.1:9001\" }]",
            "backends = [{ address = \"nowhere\" }, { address = \"nowhere2\" }]",
        );
        let found = problems(&text);
        assert_eq!(found.len(), 2, "one each: {found:?}");
        assert!(
            found.iter().all(|p| !p.contains("127.0.0.1:0")),
            "{found:?}"
        );
    }

    #[test]
    fn a_timeout_under_a_millisecond_is_warned_of() {
        let text = listener_keys("connect_timeout = \"5us\"\n");
        let config =
            parse(&text, Path::new("x.toml"), &Overrides::default()).expect("warned, not refused");
        assert_eq!(
            config.warnings,
            ["listeners[0].connect_timeout: 5µs is shorter than a millisecond: nearly every wait it bounds will fail"]
        );
        let fine = listener_keys("connect_timeout = \"1ms\"\n");
        let config = parse(&fine, Path::new("x.toml"), &Overrides::default()).expect("valid");
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    /// What passed `check` and then failed at run, or did nothing: a
    /// ready_timeout no generation fits in, an admin port nobody can know,
    /// a tcp check's path; a socket path that is a folder is refused.
    #[test]
    fn settings_that_cannot_work_are_said() {
        let warned = |before: &str| warnings(&format!("{before}{GOOD}"));
        warned_once(
            &warned("[reload]\nready_timeout = \"200ms\"\n"),
            "reload.ready_timeout",
            "shorter than a second",
        );
        assert!(warned("[reload]\nready_timeout = \"1s\"\n").is_empty());
        warned_once(
            &warned("[admin]\nlisten = \"127.0.0.1:0\"\n"),
            "admin.listen",
            "port 0",
        );
        let tcp_check = GOOD.replace(
            "backends = [",
            "health = { kind = \"tcp\", path = \"/x\" }\nbackends = [",
        );
        warned_once(
            &warnings(&tcp_check),
            "pools[0].health.path",
            "does nothing",
        );
        refused_once(
            &format!("[control]\nsocket = \"/tmp/\"\n{GOOD}"),
            "control.socket",
            "is a folder",
        );
        refused_once(
            &format!("[admin]\nlisten = \"unix:/tmp\"\n{GOOD}"),
            "admin.listen",
            "is a folder",
        );
    }

    #[test]
    fn http_keys_on_a_tcp_listener_are_warned_of_by_name() {
        let tcp =
            listener_keys("protocol = \"tcp\"\nforwarded = \"append\"\nheader_timeout = \"5s\"\n");
        let config =
            parse(&tcp, Path::new("x.toml"), &Overrides::default()).expect("warned, not refused");
        let said = "does nothing on a protocol = \"tcp\" listener (HTTP only)";
        assert_eq!(
            config.warnings,
            [
                format!("listeners[0].header_timeout: {said}"),
                format!("listeners[0].forwarded: {said}"),
            ]
        );
    }

    /// `busy_poll`: off unless given, a window as written, and a spin
    /// past 100ms (likely `ms` meant for `us`) refused naming the key.
    #[test]
    fn busy_poll_is_off_unless_given_and_bounded() {
        let parsed = |text: &str| parse(text, Path::new("x.toml"), &Overrides::default());
        assert_eq!(parsed(GOOD).expect("valid").busy_poll, Duration::ZERO);
        let set = parsed(&format!("busy_poll = \"50us\"\n{GOOD}")).expect("valid");
        assert_eq!(set.busy_poll, Duration::from_micros(50));
        refused_once(
            &format!("busy_poll = \"soon\"\n{GOOD}"),
            "busy_poll",
            "invalid",
        );
        refused_once(
            &format!("busy_poll = \"150ms\"\n{GOOD}"),
            "busy_poll",
            "at most 100ms",
        );
    }

    /// A backend named by digits alone would be taken for an index by the
    /// backend API: refused, naming the key.
    #[test]
    fn a_backend_name_of_digits_alone_is_refused() {
        let text = GOOD.replace("name = \"a\"", "name = \"1\"");
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("pools[0].backends[0].name: \"1\" is all digits"),
            "{found:?}"
        );
        let fine = GOOD.replace("name = \"a\"", "name = \"1a\"");
        parse(&fine, Path::new("x.toml"), &Overrides::default()).expect("a letter makes a name");
    }

    /// A ticket's lifetime (two periods, in whole seconds) must say more
    /// than 0 and at most RFC 8446's 7 days.
    #[test]
    fn a_ticket_rotation_out_of_tls_range_is_refused() {
        for (value, shown) in [("500ms", "500ms"), ("85h", "3days 13h")] {
            let text = format!("[tls]\nticket_rotation = \"{value}\"\n{GOOD}");
            let found = problems(&text);
            assert_eq!(found.len(), 1, "{value}: {found:?}");
            assert!(
                found[0].starts_with("tls.ticket_rotation: ") && found[0].contains("1s to 84h"),
                "{value}: {found:?}"
            );
            assert!(found[0].contains(shown), "{value}: {found:?}");
        }
        for value in ["1s", "84h", "0"] {
            let text = format!("[tls]\nticket_rotation = \"{value}\"\n{GOOD}");
            parse(&text, Path::new("x.toml"), &Overrides::default()).expect(value);
        }
    }

    #[test]
    fn every_unknown_key_is_named_by_its_path_with_the_other_problems() {
        let text = format!(
            "wrokers = 2\n[admin]\nlisen = \"x\"\n{}",
            GOOD.replace("pool = \"app\"", "pool = \"ap\"\nbogus = 1")
                .replace(
                    "address = \"127.0.0.1:9001\"",
                    "address = \"127.0.0.1:9001\", wieght = 2"
                )
        );
        assert_eq!(
            problems(&text),
            vec![
                "admin.lisen: unknown key",
                "listeners[0].bogus: unknown key",
                "pools[0].backends[0].wieght: unknown key",
                "wrokers: unknown key",
                "listeners[0].pool: no pool named \"ap\"; did you mean \"app\"?",
            ]
        );
    }

    /// The admin and control sockets go to the next generation by these
    /// names: a listener by either name would be taken for them.
    #[test]
    fn a_listener_may_not_take_the_name_of_batons_own_sockets() {
        for reserved in ["admin", "control"] {
            let text = GOOD.replace("name = \"web\"", &format!("name = \"{reserved}\""));
            assert_eq!(
                problems(&text),
                [format!("listeners[0].name: \"{reserved}\" names baton's own {reserved} socket (handed over by that name at a reload); choose another")]
            );
        }
    }

    /// `status` and `backend` read `[admin]` alone: the rest may be
    /// broken, but a typo in `[admin]` would send them to another address.
    #[test]
    fn the_admin_section_alone_is_read_and_its_typos_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("baton.toml");
        let broken_elsewhere = GOOD.replace("pool = \"app\"", "pool = \"ap\"\nbogus = 1");
        std::fs::write(
            &path,
            format!("[admin]\nlisten = \"127.0.0.1:9911\"\n{broken_elsewhere}"),
        )
        .expect("write");
        let admin =
            super::super::load_admin(&path, super::Token::Read).expect("admin alone is fine");
        assert_eq!(
            admin.listen,
            super::AdminListen::Tcp(([127, 0, 0, 1], 9911).into())
        );
        std::fs::write(
            &path,
            format!("[admin]\nlisen = \"127.0.0.1:9911\"\n{GOOD}"),
        )
        .expect("write");
        match super::super::load_admin(&path, super::Token::Read) {
            Err(ConfigError::Invalid { problems, .. }) => {
                assert_eq!(problems, ["admin.lisen: unknown key"]);
            }
            other => panic!("expected the typo refused, got {other:?}"),
        }
    }

    #[test]
    fn unknown_pool_is_named_with_a_suggestion() {
        let p = problems(&GOOD.replace("pool = \"app\"", "pool = \"ap\""));
        assert_eq!(
            p,
            vec!["listeners[0].pool: no pool named \"ap\"; did you mean \"app\"?"]
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = GOOD
            .replace("127.0.0.1:8080", "nowhere")
            .replace("name = \"web\"", "name = \"web\"\nidle_timeout = \"soon\"");
        let p = problems(&text);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("listeners[0].bind:"));
        assert!(p[1].starts_with("listeners[0].idle_timeout:"));
    }

    #[test]
    fn unknown_keys_are_syntax_errors_naming_the_key() {
        let err = parse(
            &format!("{GOOD}\n[shutdown]\ndrain = \"1s\"\n"),
            Path::new("b.toml"),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("b.toml") && err.contains("drain"), "{err}");
    }

    /// `reload.drain_timeout` not written is the stop's: a spread too long
    /// for it names where that came from (a flag or the unit's
    /// environment is not in the file).
    #[test]
    fn a_spread_too_long_for_the_stops_budget_names_where_it_came_from() {
        let text = format!(
            "[reload]\nclose_spread = \"30s\"\n{GOOD}\n[shutdown]\ndrain_timeout = \"1m\"\n"
        );
        parse(&text, Path::new("x.toml"), &Overrides::default()).expect("30s within 1m");
        let o = Overrides {
            drain_timeout: Some("20s".into()),
            pre_stop_delay: None,
        };
        let err = parse(&text, Path::new("x.toml"), &o)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("reload.close_spread: 30s must be shorter than reload.drain_timeout (20s, the stop's from --drain-timeout (or BATON_DRAIN_TIMEOUT))"),
            "{err}"
        );
        let written = text.replace("close_spread", "drain_timeout = \"20s\"\nclose_spread");
        let err = parse(&written, Path::new("x.toml"), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("reload.drain_timeout (20s):"), "{err}");
    }

    #[test]
    fn overrides_beat_the_file() {
        let text = format!("{GOOD}\n[shutdown]\ndrain_timeout = \"3s\"\npre_stop_delay = \"2s\"\n");
        let o = Overrides {
            drain_timeout: Some("7s".into()),
            pre_stop_delay: Some("-1s".into()),
        };
        let c = parse(&text, Path::new("x.toml"), &o).expect("valid");
        assert_eq!(c.shutdown.drain_timeout.as_secs(), 7);
        assert!(c.shutdown.pre_stop_delay.is_zero());
    }

    #[test]
    fn a_remote_admin_needs_a_token_unless_allowed() {
        let remote = format!("[admin]\nlisten = \"0.0.0.0:9901\"\n{GOOD}");
        let p = problems(&remote);
        assert!(
            p[0].starts_with("admin.listen: 0.0.0.0:9901 is not a loopback address"),
            "{p:?}"
        );
        let allowed = remote.replace("[admin]\n", "[admin]\nallow_remote_without_token = true\n");
        assert!(parse(&allowed, Path::new("x.toml"), &Overrides::default()).is_ok());
    }

    #[test]
    fn ports_are_stripped_from_hosts() {
        assert_eq!(super::strip_port("api.example.com:8080"), "api.example.com");
        assert_eq!(super::strip_port("api.example.com"), "api.example.com");
        assert_eq!(super::strip_port("[::1]:80"), "[::1]");
    }
}
