//! `baton reload`: asks the running daemon over its control socket and
//! waits until the new generation serves (or the reload failed, and why).

use crate::cli::ReloadArgs;
use crate::exit::Exit;
use crate::lifecycle::control::{self, CallError, Request};

/// Said when the daemon cannot be reached: the path is read from the config
/// on disk, and a daemon whose config was changed to move `control.socket`
/// still listens at the old one until a reload applies the change.
const MOVED_SOCKET: &str = "if the config now names another control.socket than the running daemon's, reload it once by signal: systemctl kill -s HUP --kill-whom=main baton (or kill -HUP its pid)";

pub fn reload(args: ReloadArgs) -> Exit {
    let overrides = super::run::overrides(args.budgets);
    let Ok(c) = super::load_config(&args.config.config, &overrides) else {
        return Exit::Config;
    };
    let rt = match super::runtime(1) {
        Ok(rt) => rt,
        Err(exit) => return exit,
    };
    let wait = c.reload_wait();
    match rt.block_on(control::call(&c.control.socket, Request::Reload, wait)) {
        Ok(reply) if reply.ok => {
            println!("{}", reply.message);
            Exit::Clean
        }
        Ok(reply) => {
            eprintln!("baton: {}", reply.message);
            Exit::from_code(reply.exit_code)
        }
        Err(err @ CallError::Unreachable { .. }) => {
            eprintln!("baton: {err}");
            eprintln!("baton: {MOVED_SOCKET}");
            Exit::Unreachable
        }
        Err(err) => {
            eprintln!("baton: {err}");
            Exit::Failure
        }
    }
}
