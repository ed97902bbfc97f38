//! `baton reload`: asks the running daemon over its control socket and
//! waits until the new generation serves (or the reload failed, and why).

use crate::cli::ReloadArgs;
use crate::exit::Exit;
use crate::lifecycle::control::{self, CallError, Request};

/// Said when the daemon cannot be reached: most often it is not running;
/// else the path is read from the config on disk, and a daemon whose
/// config was changed to move `control.socket` still listens at the old
/// one until a reload applies the change.
const MOVED_SOCKET: &str = "is baton running (systemctl status baton)? If it is, and the config now names another control.socket than the running daemon's, reload it once by signal: systemctl kill -s HUP --kill-whom=main baton (or kill -HUP its pid)";

/// Said when the socket is there but refuses this user: not a moved one.
const NOT_PERMITTED: &str = "the control socket admits root and the daemon's own user only: run baton reload as one of them (systemctl reload baton does)";

pub fn reload(args: ReloadArgs) -> Exit {
    let overrides = super::run::overrides(args.budgets);
    let path = &args.config.config;
    // A file the daemon will refuse is still sent to it when its control
    // socket can be read from it: the daemon's new generation refuses it
    // too, and the failed reload is counted where it is watched
    // (`baton_reloads_total{result="failed"}`, the shipped alert on it)
    // and logged in its journal, as a reload by signal is. Its verdict,
    // made with its own rights (a key only it may read), is the answer.
    let (socket, wait, own_verdict) = match crate::config::load(path, &overrides) {
        Ok(c) => {
            // What `check` would warn of (a certificate about to expire),
            // to who reloads by hand: the daemon only logs it.
            for warning in &c.warnings {
                eprintln!("baton: warning: {warning}");
            }
            (c.control.socket.clone(), c.reload_wait(), None)
        }
        Err(err) => match crate::config::load_reload_target(path) {
            Ok((socket, wait)) => (socket, wait, Some(err)),
            Err(_) => {
                eprintln!("baton: {}", err.said());
                return Exit::Config;
            }
        },
    };
    let rt = match super::runtime(1) {
        Ok(rt) => rt,
        Err(exit) => return exit,
    };
    let asked = rt.block_on(control::call(&socket, Request::Reload, wait));
    // This file's problems as read here, when the daemon's verdict (or a
    // refusal) is the answer.
    let as_read_here = |invalid: Option<crate::config::ConfigError>| {
        if let Some(invalid) = invalid {
            eprintln!("baton: warning: config invalid as read here: {invalid}");
        }
    };
    match (asked, own_verdict) {
        // The daemon's own file, read with its rights, was good: this one
        // is not, as read here (another file, or one this user may not
        // read all of).
        (Ok(reply), invalid) if reply.ok => {
            as_read_here(invalid);
            say!("{}", reply.message);
            Exit::Clean
        }
        (Ok(reply), invalid) => {
            eprintln!("baton: {}", reply.message);
            let exit = Exit::from_code(reply.exit_code);
            // The daemon refused this user (its own uid check, behind a
            // socket mode that let the user in).
            if exit == Exit::Unreachable {
                eprintln!("baton: {NOT_PERMITTED}");
                as_read_here(invalid);
            }
            exit
        }
        // There, but not for this user: the daemon's verdict could not be
        // asked, and this file, as read here, may be good for the daemon
        // (a key only it may read).
        (Err(err @ CallError::Unreachable { .. }), invalid @ Some(_)) if refused_us(&err) => {
            eprintln!("baton: {err}");
            eprintln!("baton: {NOT_PERMITTED}");
            as_read_here(invalid);
            Exit::Unreachable
        }
        // Not reached: the file's own fault is the answer, as before it
        // was sent.
        (Err(CallError::Unreachable { .. }), Some(invalid)) => {
            eprintln!("baton: {}", invalid.said());
            Exit::Config
        }
        (Err(err @ CallError::Unreachable { .. }), None) => {
            eprintln!("baton: {err}");
            eprintln!("baton: {}", hint_for(&err));
            Exit::Unreachable
        }
        (Err(err), invalid) => {
            eprintln!("baton: {err}");
            as_read_here(invalid);
            Exit::Failure
        }
    }
}

/// What to do about a daemon not reached: a socket that refused this user
/// is not one the config moved.
fn hint_for(err: &CallError) -> &'static str {
    if refused_us(err) {
        NOT_PERMITTED
    } else {
        MOVED_SOCKET
    }
}

/// The control socket is there and refused this user.
fn refused_us(err: &CallError) -> bool {
    matches!(err, CallError::Unreachable { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied)
}
