//! What each command does, at the program's edge: load the config, build the
//! runtime, print results for a person, and turn outcomes into exit codes.

use std::time::Duration;

use crate::cli::{Command, ConfigArg, RunArgs};
use crate::config::{self, duration::display, ConfigError, Overrides};
use crate::daemon::{self, exit, Setup};
use crate::lifecycle::control::{self, CallError, Request};
use crate::lifecycle::generation::{Exec, Parent};
use crate::lifecycle::handoff::Channel;

/// `baton reload`/`status`: the daemon cannot be reached.
pub const UNREACHABLE: i32 = 69;

pub fn dispatch(command: Command) -> i32 {
    match command {
        Command::Run(args) => run(args),
        Command::Check(args) => check(&args),
        Command::Reload(args) => reload(&args),
        Command::Demo(args) => crate::demo::main(&args),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn print_config_error(err: &ConfigError) {
    eprintln!("baton: config invalid: {err}");
}

fn run(args: RunArgs) -> i32 {
    crate::telemetry::init();
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("baton: cannot start the runtime: {err}");
            return exit::FAILURE;
        }
    };
    let code = rt.block_on(run_async(args));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn run_async(args: RunArgs) -> i32 {
    let parent = match Channel::from_env() {
        Ok(None) => None,
        Ok(Some(channel)) => match Parent::receive(channel).await {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::error!(cause = %err, "no handoff from the old generation");
                return exit::FAILURE;
            }
        },
        Err(err) => {
            tracing::error!(cause = %err, "bad handoff environment");
            return exit::FAILURE;
        }
    };
    let overrides = Overrides {
        drain_timeout: args.drain_timeout,
        pre_stop_delay: args.pre_stop_delay,
    };
    let config = match config::load(&args.config.config, &overrides) {
        Ok(c) => c,
        Err(err) => {
            print_config_error(&err);
            if let Some((parent, _)) = &parent {
                parent
                    .fail(exit::CONFIG, &format!("config invalid: {err}"))
                    .await;
            }
            return exit::CONFIG;
        }
    };
    let exec = match Exec::of_this_process() {
        Ok(e) => e,
        Err(err) => {
            tracing::error!(cause = %err, "cannot find our own executable");
            return exit::FAILURE;
        }
    };
    let metrics = match crate::metrics::install() {
        Ok(h) => Some(h),
        Err(err) => {
            tracing::warn!(cause = %err, "metrics disabled");
            None
        }
    };
    daemon::run(Setup {
        config,
        exec,
        parent,
        metrics,
    })
    .await
}

fn check(args: &ConfigArg) -> i32 {
    let overrides = Overrides {
        drain_timeout: std::env::var("BATON_DRAIN_TIMEOUT").ok(),
        pre_stop_delay: std::env::var("BATON_PRE_STOP_DELAY").ok(),
    };
    let c = match config::load(&args.config, &overrides) {
        Ok(c) => c,
        Err(err) => {
            print_config_error(&err);
            return exit::CONFIG;
        }
    };
    println!("config {} is valid", c.source.display());
    println!("admin.listen            {}", c.admin.listen);
    println!("control.socket          {}", c.control.socket.display());
    println!(
        "shutdown.pre_stop_delay {}",
        display(c.shutdown.pre_stop_delay)
    );
    println!(
        "shutdown.drain_timeout  {}",
        display(c.shutdown.drain_timeout)
    );
    println!(
        "reload.ready_timeout    {}",
        display(c.reload.ready_timeout)
    );
    println!(
        "reload.drain_timeout    {}",
        display(c.reload.drain_timeout)
    );
    println!("reload.max_draining     {}", c.reload.max_draining);
    for l in &c.listeners {
        let pool = &c.pools[l.pool].name;
        println!(
            "listener {} {} {} -> pool {} (reuseport {}, backlog {}, max_connections {})",
            l.name,
            l.protocol.as_str(),
            l.bind,
            pool,
            l.reuseport,
            l.backlog,
            l.max_connections
        );
    }
    for p in &c.pools {
        println!("pool {}: {} backend(s)", p.name, p.backends.len());
    }
    println!("TimeoutStopSec={}", c.timeout_stop().as_secs());
    exit::OK
}

fn reload(args: &ConfigArg) -> i32 {
    let c = match config::load(&args.config, &Overrides::default()) {
        Ok(c) => c,
        Err(err) => {
            print_config_error(&err);
            return exit::CONFIG;
        }
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("baton: cannot start the runtime: {err}");
            return exit::FAILURE;
        }
    };
    let wait = c.reload.ready_timeout + Duration::from_secs(10);
    match rt.block_on(control::call(&c.control.socket, Request::Reload, wait)) {
        Ok(reply) if reply.ok => {
            println!("{}", reply.message);
            exit::OK
        }
        Ok(reply) => {
            eprintln!("baton: {}", reply.message);
            reply.exit_code
        }
        Err(err @ CallError::Unreachable { .. }) => {
            eprintln!("baton: {err}");
            UNREACHABLE
        }
        Err(err) => {
            eprintln!("baton: {err}");
            exit::FAILURE
        }
    }
}
