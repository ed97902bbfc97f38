//! A daemon inside the test process: `baton::daemon::run` on a thread of
//! its own (its own runtime, as `baton run` has), its commands sent over a
//! channel where the binary hears signals.
//!
//! Why: a behaviour test that needs no second process starts faster (no
//! exec, no config file read back, no log to scrape) and reads the exit
//! code as a value. What it cannot do: a reload execs the next generation
//! from the binary on disk, which cannot happen inside this process, so
//! reload, handoff, signal and systemd tests keep spawning the real binary
//! (`support::daemon`).
//!
//! What is process-wide and so left alone: the Prometheus recorder is
//! global (none is installed: `/metrics` is empty here, and no test reads
//! counters another test would share), no signal handler is installed
//! (the test process keeps its own), systemd is never told anything (a
//! `NOTIFY_SOCKET` the tests inherited is unset once), and each daemon's
//! control socket lives in a temp dir of its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Once;
use std::time::Duration;

use baton::config::Overrides;
use baton::daemon::Setup;
use baton::exit::Exit;
use baton::lifecycle::generation::{Exec, Inheritance};
use baton::lifecycle::signals::{Command, Commands};
use tokio::sync::{mpsc, oneshot};

use super::daemon::{Spec, BIN};
use super::TIMEOUT;

static NO_SYSTEMD: Once = Once::new();

pub struct InProcess {
    pub admin: SocketAddr,
    addrs: HashMap<String, SocketAddr>,
    commands: mpsc::Sender<Command>,
    exited: Option<oneshot::Receiver<Exit>>,
    /// Holds the control socket until the daemon is gone.
    _dir: tempfile::TempDir,
}

impl Drop for InProcess {
    /// A test that ends (or fails) with its daemon still running stops it
    /// at once: two stops force the drain.
    fn drop(&mut self) {
        if self.exited.is_some() {
            let _ = self.commands.try_send(Command::Stop);
            let _ = self.commands.try_send(Command::Stop);
        }
    }
}

impl InProcess {
    /// Runs a daemon with `spec`'s config; returns once `/readyz` is 200.
    pub async fn start(spec: Spec) -> InProcess {
        let mut daemon = InProcess::spawn(spec);
        daemon.wait_ready().await;
        daemon
    }

    fn spawn(spec: Spec) -> InProcess {
        NO_SYSTEMD.call_once(|| {
            if std::env::var_os("NOTIFY_SOCKET").is_some() {
                std::env::remove_var("NOTIFY_SOCKET");
            }
        });
        let layout = spec.lay_out();
        let path = layout.dir.path().join("baton.toml");
        let config = baton::config::parse(&layout.text, &path, &Overrides::default())
            .unwrap_or_else(|e| panic!("config: {e}\n{}", layout.text));
        let (commands, heard) = Commands::channel();
        let setup = Setup {
            config,
            // Never run: no test here reloads (see the module's comment).
            exec: Exec {
                program: BIN.into(),
                args: Vec::new(),
            },
            parent: None,
            inheritance: Inheritance::default(),
            metrics: None,
            commands: heard,
        };
        let (done, exited) = oneshot::channel();
        std::thread::Builder::new()
            .name("baton-in-process".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("daemon runtime");
                let _ = done.send(runtime.block_on(baton::daemon::run(setup)));
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .expect("daemon thread");
        InProcess {
            admin: layout.admin,
            addrs: layout.addrs,
            commands,
            exited: Some(exited),
            _dir: layout.dir,
        }
    }

    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.addrs[listener]
    }

    /// Waits until `/readyz` is 200; a daemon that exits first says how.
    async fn wait_ready(&mut self) {
        let admin = self.admin;
        let exited = self.exited.as_mut().expect("not exited yet");
        tokio::select! {
            ready = super::daemon::ready_in_time(admin) => assert!(ready, "in-process baton not ready in time"),
            code = exited => panic!("in-process baton exited before it was ready: {code:?}"),
        }
    }

    /// Sends `command` as its signal would.
    pub async fn send(&self, command: Command) {
        self.commands
            .send(command)
            .await
            .expect("the daemon hears commands until it exits");
    }

    /// How the daemon exited (bounded by `TIMEOUT`).
    pub async fn exited(&mut self) -> Exit {
        let exited = self.exited.take().expect("exit awaited once");
        tokio::time::timeout(TIMEOUT, exited)
            .await
            .expect("the daemon exits in time")
            .expect("the daemon's thread reports its exit")
    }
}
