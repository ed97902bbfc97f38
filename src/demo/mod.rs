//! `baton demo`: the product's promise, shown with nothing installed. It
//! starts two in-process HTTP backends, a real `baton run` (this executable)
//! on loopback, steady client traffic (keep-alive and new-connection-per-
//! request), and real reloads (real new processes) while the traffic runs;
//! then prints requests, failures, reloads and latency.

mod traffic;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use tokio::time::Instant;

use crate::cli::DemoArgs;
use crate::exit::Exit;
use crate::lifecycle::control::{self, Request};
use traffic::{Backend, Tally};

#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error("demo setup: {0}")]
    Io(#[from] std::io::Error),
    #[error("baton did not become ready within 10s; its log is {0}")]
    NotReady(PathBuf),
}

/// Runs the demo on `rt` (the command line's runtime, one thread a CPU).
pub fn main(args: &DemoArgs, rt: &tokio::runtime::Runtime) -> Exit {
    match rt.block_on(run(args)) {
        Ok(true) => Exit::Clean,
        Ok(false) => Exit::Failure,
        Err(err) => {
            eprintln!("baton demo: {err}");
            Exit::Failure
        }
    }
}

/// A loopback port nobody listens on right now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Setup {
    dir: PathBuf,
    config: PathBuf,
    proxy: SocketAddr,
    admin: SocketAddr,
}

fn write_config(backends: &[SocketAddr]) -> std::io::Result<Setup> {
    let dir = std::env::temp_dir().join(format!("baton-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let proxy = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let list: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "{{ name = \"backend-{}\", address = \"{a}\" }}",
                (b'a' + i as u8) as char
            )
        })
        .collect();
    let text = format!(
        "[admin]\nlisten = \"{admin}\"\n\n[control]\nsocket = \"{}\"\n\n[shutdown]\npre_stop_delay = \"-1s\"\ndrain_timeout = \"5s\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"{proxy}\"\npool = \"demo\"\n\n[[pools]]\nname = \"demo\"\nbackends = [{}]\n",
        dir.join("control.sock").display(),
        list.join(", ")
    );
    let config = dir.join("baton.toml");
    std::fs::write(&config, text)?;
    Ok(Setup {
        dir,
        config,
        proxy,
        admin,
    })
}

fn spawn_baton(setup: &Setup) -> std::io::Result<Child> {
    let log = std::fs::File::create(setup.dir.join("baton.log"))?;
    Command::new(std::env::current_exe()?)
        .arg("run")
        .arg("-c")
        .arg(&setup.config)
        .env("BATON_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
}

async fn wait_ready(admin: SocketAddr, log: &Path) -> Result<(), DemoError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if traffic::get_status(admin, "/readyz").await == Some(200) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(DemoError::NotReady(log.to_path_buf()))
}

async fn run(args: &DemoArgs) -> Result<bool, DemoError> {
    let backends = [
        Backend::start("backend-a").await?,
        Backend::start("backend-b").await?,
    ];
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    let setup = write_config(&addrs)?;
    // Generations outlive their parents; adopting them lets us reap them.
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
    let _first = spawn_baton(&setup)?;
    let log = setup.dir.join("baton.log");
    wait_ready(setup.admin, &log).await?;
    say!(
        "baton demo: 2 backends, proxy on {}, admin on {}; {:?} of traffic (4 keep-alive + 2 new-connection clients), {} live reloads",
        setup.proxy, setup.admin, args.duration, args.reloads
    );
    let tally = Tally::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let clients = traffic::start_clients(setup.proxy, &tally, &stop);
    let reloads_ok = drive(args, &setup, &tally).await;
    stop.cancel();
    for c in clients {
        let _ = c.await;
    }
    let exit = stop_baton(&setup).await;
    let summary = tally.summary();
    say!("{summary}");
    say!(
        "reloads: {reloads_ok}/{} succeeded; baton exited with code {} ({})",
        args.reloads,
        exit.code(),
        if exit == Exit::Clean {
            "drained cleanly"
        } else {
            "see its log"
        }
    );
    say!("baton's log: {}", log.display());
    Ok(tally.failed() == 0 && reloads_ok == args.reloads && exit == Exit::Clean)
}

/// Prints a line a second and reloads at even intervals; returns how many
/// reloads succeeded. Every reload is asked for before the end, even one
/// that comes late (a slow machine, a reload that took long): the end
/// chosen over a late reload, the demo said "1/2 succeeded" and failed.
async fn drive(args: &DemoArgs, setup: &Setup, tally: &Tally) -> u32 {
    let started = Instant::now();
    let step = args.duration / (args.reloads + 1);
    let mut next_reload = started + step;
    let mut reloads_done = 0;
    let mut ok = 0;
    let mut tick =
        tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
    let end = started + args.duration;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let t = started.elapsed().as_secs();
                say!("  t={t:>2}s  requests {:>7}  failed {}", tally.requests(), tally.failed());
            }
            () = tokio::time::sleep_until(next_reload), if reloads_done < args.reloads => {
                reloads_done += 1;
                next_reload += step;
                let asked = Instant::now();
                match control::call(&setup.dir.join("control.sock"), Request::Reload, Duration::from_secs(40)).await {
                    Ok(reply) if reply.ok => {
                        ok += 1;
                        say!("  reload {reloads_done}: {} (handoff {} ms)", reply.message, asked.elapsed().as_millis());
                    }
                    Ok(reply) => say!("  reload {reloads_done} FAILED: {}", reply.message),
                    Err(err) => say!("  reload {reloads_done} FAILED: {err}"),
                }
            }
            () = tokio::time::sleep_until(end), if reloads_done == args.reloads => return ok,
        }
    }
}

/// SIGTERM to whichever generation now serves (asked over the control
/// socket), then how it ended. The demo is a child subreaper, so every
/// generation, re-parented when its parent exits, is ours to wait for.
async fn stop_baton(setup: &Setup) -> Exit {
    let socket = setup.dir.join("control.sock");
    let pid = match control::call(&socket, Request::Status, Duration::from_secs(5)).await {
        Ok(reply) => reply.pid.and_then(|p| i32::try_from(p).ok()),
        Err(err) => {
            eprintln!("baton demo: cannot ask which generation serves: {err}");
            None
        }
    };
    let Some(pid) = pid.map(nix::unistd::Pid::from_raw) else {
        return Exit::Failure;
    };
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let waited = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || nix::sys::wait::waitpid(pid, None)),
    )
    .await;
    match waited {
        Ok(Ok(Ok(nix::sys::wait::WaitStatus::Exited(_, code)))) => Exit::from_code(code),
        _ => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            Exit::Failure
        }
    }
}
