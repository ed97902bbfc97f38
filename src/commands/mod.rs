//! What each command does, at the program's edge: load the config, build
//! the runtime, print results for a person, and turn outcomes into exit
//! codes ([`Exit`]). One file per command.

mod backend;
mod check;
mod reads;
mod reload;
mod run;
mod sandbox;
pub mod status;
mod unit;

use std::path::Path;

use crate::cli::Command;
use crate::config::{self, Config, ConfigError, Overrides};
use crate::exit::Exit;

pub fn dispatch(command: Command) -> Exit {
    match command {
        Command::Run(args) => run::run(args),
        Command::Check(args) => check::check(args),
        Command::Reload(args) => reload::reload(args),
        Command::Status(args) => status::status(&args),
        Command::Backend(args) => backend::backend(&args),
        Command::Demo(args) => {
            let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
            match runtime(threads) {
                Ok(rt) => crate::demo::main(&args, &rt),
                Err(exit) => exit,
            }
        }
    }
}

/// The runtime a command runs on, `threads` of them. `run`'s carries the
/// lifecycle, admin and probes only (connections live on the workers'
/// runtimes), so one thread is enough there.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, Exit> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|err| {
            eprintln!("baton: cannot start the runtime: {err}");
            Exit::Failure
        })
}

/// The config at `path`; if it is invalid, the reason is said here (the
/// caller ends with [`Exit::Config`]).
pub fn load_config(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
    config::load(path, overrides)
        .inspect_err(|err| crate::telemetry::say_error(&format!("baton: {}", err.said())))
}
