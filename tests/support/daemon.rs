//! The real `baton` binary under test: a config written to a temp dir, the
//! process spawned with its log captured, and helpers to reload, signal,
//! wait for exits and read `/proc`. The test process makes itself a child
//! subreaper, so generations re-parented when their parent exits can still
//! be waited for and their exit codes read.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Mutex, Once};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::TIMEOUT;

pub const BIN: &str = env!("CARGO_BIN_EXE_baton");

/// A config, built up by listeners and pools; ports are chosen at start.
#[derive(Clone, Default)]
pub struct Spec {
    /// Top-level keys (`workers = 1`), written before any table.
    top: String,
    sections: String,
    /// Extra keys under `[admin]`.
    admin: String,
    listeners: Vec<(String, String, String, String)>,
    /// Pools: name, extra keys (`balance = ...`), backends with weights.
    pools: Vec<PoolSpec>,
    /// Listeners bound where the test says, not at a port chosen at start.
    binds: HashMap<String, SocketAddr>,
}

/// A pool: name, extra keys, backends with their weights.
type PoolSpec = (String, String, Vec<(SocketAddr, u32)>);

impl Spec {
    pub fn new() -> Spec {
        Spec::default().section("[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"5s\"\n")
    }

    /// A top-level key (`"workers = 1"`).
    pub fn top(mut self, key: &str) -> Spec {
        self.top.push_str(key);
        self.top.push('\n');
        self
    }

    /// Extra keys under `[admin]` (`token_file = ...`).
    pub fn admin(mut self, keys: &str) -> Spec {
        self.admin.push_str(keys);
        self.admin.push('\n');
        self
    }

    /// Raw TOML appended as is (a `[reload]` section, say).
    pub fn section(mut self, toml: &str) -> Spec {
        self.sections.push_str(toml);
        self.sections.push('\n');
        self
    }

    pub fn http(self, name: &str, pool: &str) -> Spec {
        self.listener(name, "http", pool, "")
    }

    pub fn tcp(self, name: &str, pool: &str) -> Spec {
        self.listener(name, "tcp", pool, "")
    }

    /// A listener with extra keys (`"keepalive_drain_grace = \"1s\""`).
    pub fn listener(mut self, name: &str, protocol: &str, pool: &str, extra: &str) -> Spec {
        self.listeners
            .push((name.into(), protocol.into(), pool.into(), extra.into()));
        self
    }

    /// Binds listener `name` at `at` (a socket the test passes in).
    pub fn bind(mut self, name: &str, at: SocketAddr) -> Spec {
        self.binds.insert(name.into(), at);
        self
    }

    pub fn pool(self, name: &str, backends: &[SocketAddr]) -> Spec {
        let weighted: Vec<(SocketAddr, u32)> = backends.iter().map(|a| (*a, 1)).collect();
        self.pool_with(name, "", &weighted)
    }

    /// A pool with extra keys (`balance`, `health`) and weighted backends,
    /// named `{pool}-{position}`.
    pub fn pool_with(mut self, name: &str, extra: &str, backends: &[(SocketAddr, u32)]) -> Spec {
        self.pools
            .push((name.into(), extra.into(), backends.to_vec()));
        self
    }

    /// Free ports for the admin listener and every listener, and the
    /// config text naming them, in a fresh temp dir (which holds the
    /// control socket).
    pub fn lay_out(&self) -> Layout {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ports = free_addrs(1 + self.listeners.len()).into_iter();
        let admin = ports.next().expect("admin port");
        let addrs: HashMap<String, SocketAddr> = self
            .listeners
            .iter()
            .map(|(name, ..)| name.clone())
            .zip(ports)
            .collect();
        let text = self.render(dir.path(), admin, &addrs);
        Layout {
            dir,
            admin,
            addrs,
            text,
        }
    }

    fn render(
        &self,
        dir: &std::path::Path,
        admin: SocketAddr,
        ports: &HashMap<String, SocketAddr>,
    ) -> String {
        let mut t = format!(
            "{}[admin]\nlisten = \"{admin}\"\n{}\n[control]\nsocket = \"{}\"\n\n{}\n",
            self.top,
            self.admin,
            dir.join("control.sock").display(),
            self.sections
        );
        for (name, protocol, pool, extra) in &self.listeners {
            let _ = write!(
                t,
                "[[listeners]]\nname = \"{name}\"\nbind = \"{}\"\nprotocol = \"{protocol}\"\npool = \"{pool}\"\n{extra}\n\n",
                self.binds.get(name).unwrap_or(&ports[name])
            );
        }
        for (name, extra, backends) in &self.pools {
            let list: Vec<String> = backends
                .iter()
                .enumerate()
                .map(|(j, (a, w))| {
                    format!("{{ name = \"{name}-{j}\", address = \"{a}\", weight = {w} }}")
                })
                .collect();
            let _ = write!(
                t,
                "[[pools]]\nname = \"{name}\"\n{extra}\nbackends = [{}]\n\n",
                list.join(", ")
            );
        }
        t
    }
}

/// A spec made concrete for one daemon (see [`Spec::lay_out`]).
pub struct Layout {
    pub dir: tempfile::TempDir,
    pub admin: SocketAddr,
    pub addrs: HashMap<String, SocketAddr>,
    pub text: String,
}

/// Every port [`free_addrs`] and [`free_addr`] handed out in this test
/// process. Tests in one binary run side by side, and a daemon binds its
/// listeners with `SO_REUSEPORT`: two daemons given the same let-go port
/// would both bind it and split its connections (a CI run saw a second
/// test's shards join a listener whose sockets the first test counted).
/// Also where the next search starts.
static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// Where the daemons' ports come from: below the kernel's ephemeral range
/// (`ip_local_port_range`), which every bind to port 0 and every outgoing
/// connection draws from. A port found there and let go until the daemon
/// binds it could be taken meanwhile by another test's backend or client
/// connection (a CI run: "cannot bind ...: Address already in use");
/// below it, only a bind that names the port can take it.
fn daemon_ports() -> std::ops::Range<u16> {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    ephemeral_from.saturating_sub(10_000).max(1_024)..ephemeral_from
}

/// `n` loopback addresses nobody listens on now, all different and none
/// handed out before in this process, from [`daemon_ports`] (each test
/// binary starts its search at a place of its own, by pid): each is held
/// until all are found, so no other search here can take one meanwhile.
pub fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let ports = daemon_ports();
    let span = u32::from(ports.end - ports.start);
    let first = match handed.last() {
        Some(&last) => u32::from(last - ports.start) + 1,
        None => std::process::id() % span,
    };
    let mut held = Vec::new();
    let mut found = Vec::with_capacity(n);
    for next in first..first + span {
        if found.len() == n {
            break;
        }
        let port = ports.start + (next % span) as u16;
        if handed.contains(&port) {
            continue;
        }
        let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) else {
            continue;
        };
        handed.push(port);
        found.push(SocketAddr::from(([127, 0, 0, 1], port)));
        held.push(listener);
    }
    assert_eq!(found.len(), n, "free ports in {ports:?}");
    found
}

/// An address where nothing answers, kept so for as long as the returned
/// socket lives: it is bound (so no other test's listener can take the
/// port, as one could take a port `free_addr` let go of) but never
/// listens, so every connect to it is refused.
pub fn dead_addr() -> (SocketAddr, socket2::Socket) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    socket.bind(&any.into()).expect("bind");
    let addr = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("bound address");
    (addr, socket)
}

/// One address as [`free_addrs`] finds them.
pub fn free_addr() -> SocketAddr {
    free_addrs(1)[0]
}

static SUBREAPER: Once = Once::new();

/// Whether the daemon with admin listener `admin` says it is ready
/// (`/readyz` 200) within `TIMEOUT`.
pub async fn ready_in_time(admin: SocketAddr) -> bool {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while tokio::time::Instant::now() < deadline {
        if let Ok(a) = super::client::get(admin, "/readyz").await {
            if a.status == 200 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// What a CLI invocation printed and returned.
#[derive(Debug)]
pub struct CliResult {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub struct Baton {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub admin: SocketAddr,
    pub addrs: HashMap<String, SocketAddr>,
    pub first_pid: u32,
    spec: Spec,
}

impl Drop for Baton {
    /// Kills every generation still running this config (one started by a
    /// reload nobody asked about afterwards too), found now: a pid seen
    /// earlier and reaped since may be another test's process by now.
    fn drop(&mut self) {
        for pid in processes_for(&self.config) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG));
        }
    }
}

impl Baton {
    /// Writes the config, starts `baton run`, waits until `/readyz` is 200.
    pub async fn start(spec: Spec) -> Baton {
        let baton = Baton::spawn(spec, &[]);
        baton.wait_ready().await;
        baton
    }

    /// Starts `baton run` with extra arguments, without waiting.
    pub fn spawn(spec: Spec, extra_args: &[&str]) -> Baton {
        Baton::spawn_under(spec, extra_args, &[])
    }

    /// Starts `baton run` under a wrapper command (`prlimit --nofile=64`).
    pub fn spawn_under(spec: Spec, extra_args: &[&str], wrapper: &[&str]) -> Baton {
        Baton::launch(spec, extra_args, wrapper, None, None)
    }

    /// Starts `baton run` with its stderr on `stderr` (a socket, as the
    /// journal's stream is) instead of the log file, without waiting.
    pub fn spawn_logging_to(spec: Spec, stderr: std::os::fd::OwnedFd) -> Baton {
        Baton::launch(spec, &[], &[], None, Some(Stdio::from(stderr)))
    }

    /// Starts `baton run` with its config behind a FIFO: it blocks reading
    /// it (start-up held still) until the test writes the returned text.
    pub fn spawn_reading_a_fifo(spec: Spec) -> (Baton, String) {
        let mut text = String::new();
        let baton = Baton::launch(spec, &[], &[], Some(&mut text), None);
        (baton, text)
    }

    // Reaped by pid (`wait_exit`, `Drop`), like every later generation,
    // which is not our child until re-parented to us.
    #[allow(clippy::zombie_processes)]
    fn launch(
        spec: Spec,
        extra_args: &[&str],
        wrapper: &[&str],
        fifo_for: Option<&mut String>,
        stderr: Option<Stdio>,
    ) -> Baton {
        SUBREAPER.call_once(|| {
            nix::sys::prctl::set_child_subreaper(true).expect("subreaper");
        });
        let Layout {
            dir,
            admin,
            addrs,
            text,
        } = spec.lay_out();
        let config = dir.path().join("baton.toml");
        match fifo_for {
            Some(out) => {
                nix::unistd::mkfifo(
                    &config,
                    nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
                )
                .expect("mkfifo");
                *out = text;
            }
            None => std::fs::write(&config, text).expect("write config"),
        }
        let log = std::fs::File::create(dir.path().join("baton.log")).expect("log file");
        let stderr = stderr.unwrap_or_else(|| Stdio::from(log));
        // Started through a link of its own, like /usr/bin/baton: a reload
        // runs whatever that path holds then (see `replace_executable`).
        let exe = dir.path().join("baton");
        std::os::unix::fs::symlink(BIN, &exe).expect("link baton");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = std::process::Command::new(program);
                c.args(args).arg(&exe);
                c
            }
            None => std::process::Command::new(&exe),
        };
        let child = command
            .arg("run")
            .arg("-c")
            .arg(&config)
            .args(extra_args)
            .env("BATON_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn baton");
        let first_pid = child.id();
        Baton {
            dir,
            config,
            admin,
            addrs,
            first_pid,
            spec,
        }
    }

    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.addrs[listener]
    }

    pub fn spec(&self) -> Spec {
        self.spec.clone()
    }

    pub async fn wait_ready(&self) {
        if !ready_in_time(self.admin).await {
            panic!(
                "baton not ready; log:\n{}",
                std::fs::read_to_string(self.log_path()).unwrap_or_default()
            );
        }
    }

    /// Replaces the executable path the daemon was started from, as a
    /// package upgrade does (write a new file, rename over the old one).
    pub fn replace_executable(&self, script: Option<&str>) {
        let exe = self.dir.path().join("baton");
        let staged = self.dir.path().join("baton.new");
        let _ = std::fs::remove_file(&staged);
        match script {
            Some(text) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::write(&staged, text).expect("write script");
                std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod");
            }
            None => std::os::unix::fs::symlink(BIN, &staged).expect("link baton"),
        }
        std::fs::rename(&staged, &exe).expect("rename over executable");
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("baton.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The pids of the generations reloads started so far, in order (as
    /// the log names them).
    pub fn started_pids(&self) -> Vec<u32> {
        self.log()
            .split("started new generation pid=")
            .skip(1)
            .filter_map(|rest| rest.split(' ').next()?.parse().ok())
            .collect()
    }

    /// Rewrites the config file with `text` (a broken one, say).
    pub fn write_config(&self, text: &str) {
        std::fs::write(&self.config, text).expect("rewrite config");
    }

    /// The config the daemon was started with, as written.
    pub fn config_text(&self) -> String {
        std::fs::read_to_string(&self.config).expect("read config")
    }

    /// Rewrites the config from `spec`, keeping every address.
    pub fn write_spec(&self, spec: &Spec, extra_addrs: &HashMap<String, SocketAddr>) {
        let mut addrs = self.addrs.clone();
        addrs.extend(extra_addrs.iter().map(|(k, v)| (k.clone(), *v)));
        std::fs::write(
            &self.config,
            spec.render(self.dir.path(), self.admin, &addrs),
        )
        .expect("write config");
    }

    /// Runs the real `baton reload` CLI.
    pub async fn reload(&self) -> CliResult {
        let out = tokio::process::Command::new(BIN)
            .arg("reload")
            .arg("-c")
            .arg(&self.config)
            .output()
            .await
            .expect("run baton reload");
        CliResult {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Asks for a reload on the control socket itself (not through the CLI,
    /// which reads the config file first); the reply is the raw JSON line.
    pub fn ask_reload(&self) -> tokio::task::JoinHandle<String> {
        let socket = self.dir.path().join("control.sock");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::UnixStream::connect(&socket)
                .await
                .expect("connect to the control socket");
            s.write_all(b"{\"command\":\"reload\"}\n")
                .await
                .expect("ask for a reload");
            let mut reply = String::new();
            let _ = tokio::time::timeout(super::TIMEOUT * 2, s.read_to_string(&mut reply)).await;
            reply
        })
    }

    /// Waits until `/status` lists only the serving generation: every older
    /// one has exited and its report channel is closed.
    pub async fn settled(&self) {
        let admin = self.admin;
        super::eventually("only one generation left in /status", || async move {
            let Ok(a) = super::client::get(admin, "/status").await else {
                return false;
            };
            serde_json::from_str::<serde_json::Value>(&a.body)
                .is_ok_and(|v| v["generations"].as_array().is_some_and(|g| g.len() == 1))
        })
        .await;
    }

    /// Reloads and insists it worked.
    pub async fn reload_ok(&self) -> u32 {
        let r = self.reload().await;
        assert_eq!(r.code, 0, "reload failed: {r:?}\nlog:\n{}", self.log());
        self.serving_pid().await
    }

    /// Waits until `n` client connections reached `listener` of the
    /// serving generation: held by it (served, or taken by a shard to wait
    /// for a place under `max_connections`) or in its listening sockets'
    /// accept queues (`baton_listener_backlog`). A cap that did not hold
    /// would serve one and let it go, and the count fall short.
    pub async fn until_connected(&self, listener: &str, n: usize) {
        let (pid, port) = (self.serving_pid().await, self.addr(listener).port());
        let backlog = format!("baton_listener_backlog{{listener=\"{listener}\"}}");
        let admin = self.admin;
        super::eventually(&format!("{n} connected to {listener}"), || {
            let backlog = backlog.clone();
            async move {
                let metrics = super::client::metrics(admin).await;
                let queued = super::client::series(&metrics, &backlog).unwrap_or(0.0) as usize;
                queued + client_connections(pid, port) == n
            }
        })
        .await;
    }

    /// The pid of the generation serving now, asked over the control socket.
    pub async fn serving_pid(&self) -> u32 {
        let socket = self.dir.path().join("control.sock");
        let reply = baton::lifecycle::control::call(
            &socket,
            baton::lifecycle::control::Request::Status,
            TIMEOUT,
        )
        .await
        .expect("control status");
        reply.pid.expect("status names a pid")
    }
}

pub fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).expect("send signal");
}

/// Waits for `pid` (a child, or a re-parented generation) to exit and
/// returns its exit code; `None` if it is still running after `TIMEOUT`.
pub async fn wait_exit(pid: u32) -> Option<i32> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let pid = Pid::from_raw(pid as i32);
    while tokio::time::Instant::now() < deadline {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return Some(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Some(128 + sig as i32),
            Ok(_) => {}
            Err(e) => panic!("waitpid {pid}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Holds `pid`'s soft fd limit at 3 (below every fd it has open, which
/// stay open), so it can open no new fd, until dropped (`prlimit`,
/// util-linux's).
pub struct NoFreeFd {
    pid: u32,
    soft: String,
}

impl NoFreeFd {
    pub fn hold(pid: u32) -> NoFreeFd {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
        let soft = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next())
            .expect("Max open files")
            .to_string();
        set_soft_fd_limit(pid, "3");
        NoFreeFd { pid, soft }
    }
}

impl Drop for NoFreeFd {
    fn drop(&mut self) {
        set_soft_fd_limit(self.pid, &self.soft);
    }
}

fn set_soft_fd_limit(pid: u32, soft: &str) {
    let done = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={soft}:"))
        .status()
        .expect("prlimit");
    assert!(done.success(), "prlimit --nofile={soft}: failed");
}

/// What a daemon tells systemd, on a notify socket of the test's own, as
/// systemd's would be.
pub struct Notifications {
    /// The daemon's `NOTIFY_SOCKET=...`.
    pub env: String,
    _dir: tempfile::TempDir,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reader: Option<tokio::task::JoinHandle<Vec<String>>>,
}

impl Notifications {
    /// Binds the socket and reads what comes as it comes (a datagram
    /// queue holds only a few).
    pub fn listen() -> Notifications {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let notify = std::os::unix::net::UnixDatagram::bind(&path).expect("notify socket");
        notify
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reading = std::sync::Arc::clone(&done);
        let reader = tokio::task::spawn_blocking(move || {
            let mut said = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match notify.recv(&mut buf) {
                    Ok(n) => said.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(_) if reading.load(std::sync::atomic::Ordering::SeqCst) => return said,
                    Err(_) => {}
                }
            }
        });
        Notifications {
            env: format!("NOTIFY_SOCKET={}", path.display()),
            _dir: dir,
            done,
            reader: Some(reader),
        }
    }

    /// Asserts, once the daemon is gone, that it said it was stopping
    /// and never that it was ready.
    pub async fn stopping_never_ready(self) {
        let said = self.said().await;
        assert!(
            said.iter().any(|s| s.contains("STOPPING=1")),
            "no STOPPING=1 in {said:?}"
        );
        assert!(
            said.iter().all(|s| !s.contains("READY=1")),
            "never ready, never said so: {said:?}"
        );
    }

    /// Puts `text` among what the daemon says, where it is now: what the
    /// daemon said before and after it can then be told apart.
    pub fn mark(&self, text: &str) {
        let path = self.env.trim_start_matches("NOTIFY_SOCKET=");
        let out = std::os::unix::net::UnixDatagram::unbound().expect("socket");
        out.send_to(text.as_bytes(), path).expect("mark");
    }

    /// Every message said, once the daemon is gone.
    pub async fn said(mut self) -> Vec<String> {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        match self.reader.take() {
            Some(reader) => reader.await.expect("join"),
            None => Vec::new(),
        }
    }
}

/// The reader ends with it, or a test that failed before [`said`] would
/// hang in its runtime's shutdown, which waits for blocking tasks.
///
/// [`said`]: Notifications::said
impl Drop for Notifications {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `pid`'s resident memory in KiB, as `/proc/PID/status` says (0 if gone).
pub fn rss_kib(pid: u32) -> u64 {
    status_number(pid, "VmRSS")
}

/// How many fds `pid`'s table of open files holds now (0 if gone).
pub fn fd_table_size(pid: u32) -> u64 {
    status_number(pid, "FDSize")
}

/// A number `/proc/PID/status` gives under `field` (kB when a size).
fn status_number(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time a process or thread used so far, in clock ticks, from the
/// text of its `/proc/.../stat` (utime + stime; 0 if unreadable).
pub fn stat_cpu_ticks(stat: &str) -> u64 {
    // After the name in parentheses: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    tick(14).unwrap_or(0) + tick(15).unwrap_or(0)
}

/// CPU time `pid` used so far, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
}

/// Clock ticks a second (`CLK_TCK`), what [`cpu_ticks`] counts in.
pub fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |t| t as u64)
}

/// Open fds of `pid`, from `/proc/PID/fd`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The fewest open fds `pid` shows over half a second: connections the
/// test itself just made to the admin or control socket close within it.
pub async fn settled_fd_count(pid: u32) -> usize {
    let mut fewest = usize::MAX;
    for _ in 0..10 {
        fewest = fewest.min(fd_count(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fewest
}

/// Live (non-zombie) baton daemons (`run`) of this config: not the CLI
/// commands (`reload`, `status`) a test runs against it meanwhile.
pub fn processes_for(config: &std::path::Path) -> Vec<u32> {
    let needle = config.as_os_str().as_encoded_bytes().to_vec();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        let mut args = cmdline.split(|b| *b == 0);
        if !zombie
            && args.clone().any(|arg| arg == b"run")
            && args.any(|arg| arg == needle.as_slice())
        {
            out.push(pid);
        }
    }
    out
}

/// Inodes of the sockets `pid` holds open, read from `/proc/PID/fd`.
pub fn socket_inodes(pid: u32) -> std::collections::HashSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Established TCP connections `pid` holds whose local port is `port`: the
/// client connections it serves on that listener (from `/proc/net/tcp*`).
pub fn client_connections(pid: u32, port: u16) -> usize {
    let held = socket_inodes(pid);
    let port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .map(|text| {
            text.lines()
                .skip(1)
                .filter(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    f.len() > 9
                        && f[1].ends_with(&port)
                        && f[3] == "01"
                        && f[9].parse().is_ok_and(|inode: u64| held.contains(&inode))
                })
                .count()
        })
        .sum()
}

/// Writes `text` into the FIFO at `path` once a reader has it open, or
/// fails after `TIMEOUT`: a plain write would wait forever for a reader
/// that died, and hang the test instead of failing it.
pub async fn feed_fifo(path: &std::path::Path, text: &str) {
    feed_fifo_then(path, text, None).await;
}

/// As [`feed_fifo`], but first, once the reader is there, a regular file
/// holding `replacement` takes the FIFO's place: the reader reads `text`,
/// whoever opens `path` next reads `replacement` (and never finds the
/// FIFO with nobody to write it).
pub async fn feed_fifo_then(path: &std::path::Path, text: &str, replacement: Option<&str>) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let deadline = tokio::time::Instant::now() + super::TIMEOUT;
    let mut fifo = loop {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path);
        match opened {
            Ok(f) => break f,
            // ENXIO: nobody reads it yet.
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no reader took {} in time: {e}", path.display()),
        }
    };
    if let Some(replacement) = replacement {
        let staged = path.with_extension("replacement");
        std::fs::write(&staged, replacement).expect("write the replacement");
        std::fs::rename(&staged, path).expect("replace the FIFO");
    }
    // A config is far smaller than a pipe's buffer: one write takes it.
    fifo.write_all(text.as_bytes()).expect("feed the FIFO");
}
