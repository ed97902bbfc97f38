//! The proxies under test, each started and reloaded the way its users do:
//! baton (`baton reload` over its control socket), HAProxy in master-worker
//! mode (SIGUSR2 to the master; listeners pass to the new worker) and nginx
//! (SIGHUP to the master, as `nginx -s reload`). Every process started here
//! is stopped by pid when the `Proxy` drops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// HAProxy's frontend lines that add to every request the four fields
/// baton adds by default (`x-forwarded-for`, `x-forwarded-proto`,
/// `x-request-id`, `via`), so that each proxy does the same job and the
/// backend reads the same size of head behind each. A production
/// HAProxy has `option forwardfor` as a rule; baton cannot leave out its
/// id and `via`.
const HAPROXY_SAME_FIELDS: &str = "  option forwardfor\n  http-request set-header X-Forwarded-Proto http\n  \
     unique-id-format %{+X}o\\ %pid-%rt\n  unique-id-header X-Request-Id\n  http-request add-header Via \"1.1 haproxy\"\n";

/// nginx's `location` lines for the same four fields.
const NGINX_SAME_FIELDS: &str = "      proxy_set_header X-Forwarded-For $remote_addr;\n      proxy_set_header X-Forwarded-Proto $scheme;\n      \
     proxy_set_header X-Request-Id $request_id;\n      proxy_set_header Via \"1.1 nginx\";\n";

/// What a proxy is set up to speak to its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// HTTP/1.1 (baton and HAProxy also take h2c with prior knowledge).
    Http,
    /// nginx needs its listener marked `http2` for h2c (and then refuses
    /// HTTP/1.1 there); the others take it on their HTTP listener.
    H2c,
    /// Plain TCP (nginx would need its stream module, which Debian's nginx
    /// package does not carry).
    Tcp,
    /// HTTP/1.1 with upgrades passed on (nginx needs them asked for; the
    /// others pass them on as they are): WebSocket tunnels.
    WebSocket,
    /// HTTP/1.1 over TLS (1.2 and 1.3, ALPN http/1.1), with the certificate
    /// given to `Proxy::start_tls`; session tickets on with each proxy's
    /// default keys (HAProxy and nginx make theirs at start).
    Https,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Baton,
    Haproxy,
    Nginx,
    /// No proxy: straight to the backend (throughput's reference).
    Direct,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Baton => "baton",
            Kind::Haproxy => "haproxy (master-worker)",
            Kind::Nginx => "nginx (-s reload)",
            Kind::Direct => "direct to backend",
        }
    }

    /// Whether the peer is installed (benches/peers/setup.sh installs them).
    pub fn available(self) -> bool {
        match self {
            Kind::Baton | Kind::Direct => true,
            Kind::Haproxy => Path::new("/usr/sbin/haproxy").exists(),
            Kind::Nginx => Path::new("/usr/sbin/nginx").exists(),
        }
    }
}

pub struct Proxy {
    pub kind: Kind,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Each of several workers held to a core of its own (baton's
    /// `pin_workers`, HAProxy's `cpu-map`, nginx's `worker_cpu_affinity`).
    hold_workers: bool,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Found before any is killed: nginx's workers carry no config path
        // in their command line (they are "nginx: worker process") and are
        // known only as children of their master, which outlive it.
        let all = self.pids();
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        for pid in all {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Every process in `/proc`, with its directory there.
fn processes() -> impl Iterator<Item = (i32, PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<i32>().ok()?, e.path())))
}

fn pids_with_arg(arg: &Path) -> Vec<i32> {
    let needle = arg.as_os_str().as_encoded_bytes().to_vec();
    processes()
        .filter(|(_, dir)| {
            let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
            cmdline.split(|b| *b == 0).any(|a| a == needle.as_slice())
        })
        .map(|(pid, _)| pid)
        .collect()
}

impl Proxy {
    /// Starts `kind` listening on `port`, proxying HTTP to `backend`, with
    /// `threads` worker threads/processes; waits until it answers.
    pub fn start(
        kind: Kind,
        port: u16,
        backend: SocketAddr,
        threads: usize,
        pin: Option<usize>,
    ) -> Proxy {
        Proxy::start_mode(kind, port, backend, threads, pin, Mode::Http)
    }

    /// The same, speaking `mode` to its clients.
    pub fn start_mode(
        kind: Kind,
        port: u16,
        backend: SocketAddr,
        threads: usize,
        pin: Option<usize>,
        mode: Mode,
    ) -> Proxy {
        assert!(mode != Mode::Https, "HTTPS needs a certificate: start_tls");
        Proxy::unstarted(kind, port, backend).launch(backend, threads, pin, mode)
    }

    /// The same, with each of its `threads` workers held to a core of its
    /// own, as each proxy is configured to do.
    pub fn start_held(
        kind: Kind,
        port: u16,
        backend: SocketAddr,
        threads: usize,
        mode: Mode,
    ) -> Proxy {
        let mut proxy = Proxy::unstarted(kind, port, backend);
        proxy.hold_workers = true;
        proxy.launch(backend, threads, None, mode)
    }

    /// One worker on a free port, over TLS with `certificate` (and its
    /// key), copied into the proxy's folder as `cert.pem` and `key.pem`,
    /// and as `both.pem` for HAProxy, which wants them in one file.
    pub fn start_tls(
        kind: Kind,
        backend: SocketAddr,
        pin: Option<usize>,
        (cert, key): (&Path, &Path),
    ) -> Proxy {
        let proxy = Proxy::unstarted(kind, super::free_port(), backend);
        let (cert, key) = (
            std::fs::read(cert).expect("read certificate"),
            std::fs::read(key).expect("read key"),
        );
        let dir = proxy.dir.path();
        std::fs::write(dir.join("cert.pem"), &cert).expect("write certificate");
        std::fs::write(dir.join("key.pem"), &key).expect("write key");
        std::fs::write(dir.join("both.pem"), [cert, key].concat()).expect("write pem");
        proxy.launch(backend, 1, pin, Mode::Https)
    }

    /// A proxy not started yet: its folder and address.
    fn unstarted(kind: Kind, port: u16, backend: SocketAddr) -> Proxy {
        Proxy {
            kind,
            addr: match kind {
                Kind::Direct => backend,
                _ => SocketAddr::from(([127, 0, 0, 1], port)),
            },
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            hold_workers: false,
        }
    }

    /// Writes its configuration, starts it and waits until it answers.
    fn launch(
        mut self,
        backend: SocketAddr,
        threads: usize,
        pin: Option<usize>,
        mode: Mode,
    ) -> Proxy {
        if self.kind == Kind::Direct {
            return self;
        }
        let port = self.addr.port();
        let config = match mode {
            Mode::Http => self.config(port, backend, threads),
            Mode::H2c => self.h2c_config(port, backend, threads),
            Mode::Tcp => self.tcp_config(port, backend, threads),
            Mode::WebSocket => self.websocket_config(port, backend, threads),
            Mode::Https => self.https_config(port, backend, threads),
        };
        let config = self.with_deferral(config, port);
        std::fs::write(self.config_path(), config).expect("write config");
        let mut cmd = match pin {
            Some(core) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &core.to_string()]);
                c.arg(self.program());
                c
            }
            None => Command::new(self.program()),
        };
        cmd.args(self.args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.kind == Kind::Baton {
            cmd.env("BATON_LOG", "warn");
        }
        self.child = Some(cmd.spawn().expect("start proxy"));
        self.wait_serving();
        self
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join(match self.kind {
            Kind::Baton => "baton.toml",
            Kind::Haproxy => "haproxy.cfg",
            Kind::Nginx | Kind::Direct => "nginx.conf",
        })
    }

    fn program(&self) -> &'static str {
        match self.kind {
            Kind::Baton => shipped_baton(),
            Kind::Haproxy => "/usr/sbin/haproxy",
            Kind::Nginx | Kind::Direct => "/usr/sbin/nginx",
        }
    }

    fn args(&self) -> Vec<String> {
        let cfg = self.config_path().display().to_string();
        let dir = self.dir.path().display().to_string();
        match self.kind {
            Kind::Baton => vec!["run".into(), "-c".into(), cfg],
            Kind::Haproxy => vec!["-W".into(), "-f".into(), cfg],
            Kind::Nginx | Kind::Direct => vec!["-p".into(), dir, "-c".into(), cfg],
        }
    }

    fn config(&self, port: u16, backend: SocketAddr, threads: usize) -> String {
        let dir = self.dir.path().display();
        // HAProxy refuses to start if maxconn needs more fds than allowed.
        let maxconn = super::fd_limit().saturating_sub(100) / 2;
        let pinned = self.hold_workers && threads > 1;
        let baton_pin = if pinned { "pin_workers = true\n" } else { "" };
        let haproxy_pin = if pinned {
            format!("  cpu-map auto:1/1-{threads} 0-{}\n", threads - 1)
        } else {
            String::new()
        };
        // `--busy-poll US`: baton's workers and HAProxy's threads both poll
        // rather than sleep (nginx has no such setting).
        let busy_poll: u32 = super::arg("--busy-poll", 0);
        let baton_busy = if busy_poll > 0 {
            format!("busy_poll = \"{busy_poll}us\"\n")
        } else {
            String::new()
        };
        let haproxy_busy = if busy_poll > 0 {
            "  busy-polling\n"
        } else {
            ""
        };
        let nginx_pin = if pinned {
            "worker_cpu_affinity auto;\n"
        } else {
            ""
        };
        match self.kind {
            Kind::Baton => format!(
                "workers = {threads}\n{baton_pin}{baton_busy}[admin]\nlisten = \"127.0.0.1:{}\"\n[control]\nsocket = \"{dir}/control.sock\"\n[shutdown]\npre_stop_delay = \"-1s\"\n\
                 [reload]\ndrain_timeout = \"30s\"\nmax_draining = 64\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:{port}\"\nmax_connections = 30000\npool = \"app\"\n\
                 [[pools]]\nname = \"app\"\nbackends = [{{ name = \"a\", address = \"{backend}\" }}]\n",
                super::free_port()
            ),
            Kind::Haproxy => format!(
                "global\n  master-worker\n  nbthread {threads}\n{haproxy_pin}{haproxy_busy}  maxconn {maxconn}\n  stats socket {dir}/haproxy.sock mode 600 level admin expose-fd listeners\n\
                 defaults\n  mode http\n  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n  timeout http-keep-alive 60s\n\
                 frontend web\n  bind 127.0.0.1:{port}\n{HAPROXY_SAME_FIELDS}  default_backend app\nbackend app\n  http-reuse always\n  server a {backend}\n"
            ),
            Kind::Nginx | Kind::Direct => format!(
                "worker_processes {threads};\n{nginx_pin}daemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\nworker_rlimit_nofile 40000;\n\
                 events {{ worker_connections 20000; }}\nhttp {{\n  access_log off;\n  keepalive_requests 1000000;\n  keepalive_timeout 60s;\n\
                 upstream app {{ server {backend}; keepalive 1024; keepalive_requests 1000000; }}\n  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
                 proxy_pass http://app;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n{NGINX_SAME_FIELDS}    }}\n  }}\n}}\n"
            ),
        }
    }

    /// `--defer-accept 1` (or `0`): every proxy's listener defers accepting
    /// a connection until its first bytes come (or none does): baton's
    /// `defer_accept`, HAProxy's `defer-accept`, nginx's `deferred`. Unset,
    /// each keeps its default (baton defers on HTTP listeners, the peers
    /// do not).
    fn with_deferral(&self, config: String, port: u16) -> String {
        let defer = match super::arg("--defer-accept", u8::MAX) {
            0 => false,
            1 => true,
            _ => return config,
        };
        match self.kind {
            Kind::Baton => config.replace(
                "name = \"web\"\n",
                &format!("name = \"web\"\ndefer_accept = {defer}\n"),
            ),
            Kind::Haproxy if defer => config.replace(
                &format!("bind 127.0.0.1:{port}"),
                &format!("bind 127.0.0.1:{port} defer-accept"),
            ),
            Kind::Nginx if defer => config.replace(
                &format!("listen 127.0.0.1:{port}"),
                &format!("listen 127.0.0.1:{port} deferred"),
            ),
            _ => config,
        }
    }

    fn h2c_config(&self, port: u16, backend: SocketAddr, threads: usize) -> String {
        let http = self.config(port, backend, threads);
        match self.kind {
            Kind::Nginx => http.replace(
                &format!("listen 127.0.0.1:{port};"),
                &format!("listen 127.0.0.1:{port} http2;"),
            ),
            _ => http,
        }
    }

    fn tcp_config(&self, port: u16, backend: SocketAddr, threads: usize) -> String {
        let http = self.config(port, backend, threads);
        match self.kind {
            Kind::Baton => http.replace("pool = \"app\"\n", "protocol = \"tcp\"\npool = \"app\"\n"),
            Kind::Haproxy => http
                .replace(HAPROXY_SAME_FIELDS, "")
                .replace("mode http", "mode tcp")
                .replace("  timeout http-keep-alive 60s\n", "")
                .replace("  http-reuse always\n", ""),
            Kind::Nginx | Kind::Direct => http,
        }
    }

    fn websocket_config(&self, port: u16, backend: SocketAddr, threads: usize) -> String {
        let http = self.config(port, backend, threads);
        match self.kind {
            Kind::Nginx | Kind::Direct => http.replace(
                "proxy_set_header Connection \"\";",
                "proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection \"upgrade\";",
            ),
            Kind::Baton | Kind::Haproxy => http,
        }
    }

    fn https_config(&self, port: u16, backend: SocketAddr, threads: usize) -> String {
        let http = self.config(port, backend, threads);
        let dir = self.dir.path().display();
        match self.kind {
            Kind::Baton => http.replace(
                "max_connections = 30000\n",
                &format!(
                    "max_connections = 30000\ntls = {{ certificates = [{{ cert = \"{dir}/cert.pem\", key = \"{dir}/key.pem\" }}], alpn = [\"http/1.1\"] }}\n"
                ),
            ),
            Kind::Haproxy => http.replace(
                &format!("bind 127.0.0.1:{port}\n"),
                &format!("bind 127.0.0.1:{port} ssl crt {dir}/both.pem alpn http/1.1\n"),
            ),
            // nginx 1.22's default protocols stop at TLS 1.2 (1.23.4 added
            // 1.3); tickets and the session cache stay at their defaults.
            Kind::Nginx | Kind::Direct => http.replace(
                &format!("listen 127.0.0.1:{port};"),
                &format!(
                    "listen 127.0.0.1:{port} ssl;\n    ssl_certificate {dir}/cert.pem;\n    ssl_certificate_key {dir}/key.pem;\n    ssl_protocols TLSv1.2 TLSv1.3;"
                ),
            ),
        }
    }

    fn wait_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(self.addr).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{} did not start listening on {}",
            self.kind.name(),
            self.addr
        );
    }

    /// Reloads the way its operators do; returns how long the reload took
    /// to be acknowledged (baton: until the new generation accepts; the
    /// peers signal and return at once, so theirs is not comparable).
    pub async fn reload(&self) -> Option<Duration> {
        let started = Instant::now();
        match self.kind {
            Kind::Baton => {
                let socket = self.dir.path().join("control.sock");
                let reply = baton::lifecycle::control::call(
                    &socket,
                    baton::lifecycle::control::Request::Reload,
                    Duration::from_secs(40),
                )
                .await
                .expect("baton reload");
                assert!(reply.ok, "baton reload failed: {}", reply.message);
                Some(started.elapsed())
            }
            Kind::Haproxy => {
                self.signal_master(Signal::SIGUSR2);
                None
            }
            Kind::Nginx => {
                self.signal_master(Signal::SIGHUP);
                None
            }
            Kind::Direct => None,
        }
    }

    fn signal_master(&self, sig: Signal) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), sig);
        }
    }

    /// Pids of this proxy's processes (for RSS): those naming its config,
    /// and their children (nginx workers rename themselves).
    pub fn pids(&self) -> Vec<i32> {
        let mut pids = pids_with_arg(&self.config_path());
        if let Some(c) = &self.child {
            pids.push(c.id() as i32);
        }
        for (pid, dir) in processes() {
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid.is_some_and(|p| pids.contains(&p)) {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

/// baton as `cargo build --release` makes it, built once a run into a
/// target directory of its own (each bench asks first thing: a thread
/// pinned for the load would pin the build to one core). A cargo config
/// that sets `build.target` puts it elsewhere, and this fails. `CARGO_BIN_EXE_baton`, which `cargo bench`
/// builds beside the benches, has the dev-dependencies' features: tokio's
/// `test-util`, whose paused clock every runtime park then locks and asks
/// about: work the binary that ships does not do.
pub fn shipped_baton() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let manifest = env!("CARGO_MANIFEST_DIR");
        let target = format!("{manifest}/target/shipped");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        eprintln!("building baton as shipped (cargo build --release) into {target}");
        let built = Command::new(cargo)
            .args([
                "build",
                "--release",
                "--bin",
                "baton",
                "--target-dir",
                &target,
            ])
            .current_dir(manifest)
            .status()
            .expect("run cargo build");
        assert!(built.success(), "cargo build --release failed");
        let path = format!("{target}/release/baton");
        assert!(
            std::path::Path::new(&path).exists(),
            "no {path} after the build (a cargo config's build.target puts it elsewhere)"
        );
        path
    })
}
