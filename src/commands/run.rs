//! `baton run`: one generation, from its config (or its parent's
//! handoff) to its exit code.

use std::time::Duration;

use crate::cli::{BudgetArgs, RunArgs};
use crate::config::{Overrides, DEFAULT_MAX_CONNECTIONS};
use crate::daemon::{self, Setup};
use crate::exit::Exit;
use crate::lifecycle::fd_limit;
use crate::lifecycle::generation::{Exec, Inheritance, Parent};
use crate::lifecycle::handoff::Channel;
use crate::lifecycle::keeper;
use crate::lifecycle::signals::{Commands, Signals};

/// How long an exiting generation waits for a stalled journal (or
/// terminal) to take the log lines it holds (see `telemetry::stderr`).
const LOG_FLUSH_AT_EXIT: Duration = Duration::from_secs(1);

pub fn run(args: RunArgs) -> Exit {
    if keeper::wanted() {
        return keeper::keep();
    }
    crate::telemetry::init();
    let _flushed = crate::telemetry::stderr::FlushedAtExit(LOG_FLUSH_AT_EXIT);
    run_logged(args)
}

fn run_logged(args: RunArgs) -> Exit {
    crate::lifecycle::fd_limit::raise();
    // Before any fd of ours is opened: systemd's are the ones from fd 3 on,
    // and one an environment names but did not pass would be ours.
    // And before the runtime's threads: taking them unsets systemd's
    // variables, and a C library's `getenv` on another thread (a DNS
    // lookup's, a time zone's) may read the environment as it changes.
    // (The log's writer, started if stderr was full or is a terminal,
    // reads none.)
    let from_systemd = Inheritance::from_systemd();
    crate::lifecycle::systemd::keep_notify_socket();
    // While the process is one thread, the kernel grows its fd table
    // without waiting for an RCU grace period (12 ms a reload, measured,
    // once the runtime's threads exist): room for the default listener
    // now, and more once the config asks for more. (The config is not
    // read before the runtime: it may be a FIFO, read once, and signals
    // are not handled yet.)
    fd_limit::reserve_table(fd_limit::fds_for(DEFAULT_MAX_CONNECTIONS));
    let rt = match super::runtime(1) {
        Ok(rt) => rt,
        Err(exit) => return exit,
    };
    let code = rt.block_on(run_async(args, from_systemd));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

/// `from_systemd`: the sockets systemd passed, used on a first start
/// (under a handoff the old generation offers them, and systemd passed
/// none: see `hand_over`).
async fn run_async(args: RunArgs, from_systemd: Inheritance) -> Exit {
    let commands = match Signals::install() {
        Ok(signals) => Commands::from_signals(signals),
        Err(err) => {
            tracing::error!(cause = %err, "cannot install signal handlers");
            return Exit::Failure;
        }
    };
    let parent = match Channel::from_env() {
        Ok(None) => None,
        Ok(Some(channel)) => match Parent::receive(channel).await {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::error!(cause = %err, "no handoff from the old generation");
                return Exit::Failure;
            }
        },
        Err(err) => {
            tracing::error!(cause = %err, "bad handoff environment");
            return Exit::Failure;
        }
    };
    let config = match super::load_config(&args.config.config, &overrides(args.budgets)) {
        Ok(c) => c,
        Err(err) => {
            if let Some((parent, _)) = &parent {
                parent.fail(Exit::Config, &err.said()).await;
            }
            return Exit::Config;
        }
    };
    for warning in &config.warnings {
        tracing::warn!("config warning: {warning}");
    }
    fd_limit::reserve_table(fd_limit::fds_for(config.max_connections()));
    fd_limit::warn_if_short(config.max_connections());
    let exec = match Exec::of_this_process() {
        Ok(e) => e,
        Err(err) => {
            tracing::error!(cause = %err, "cannot find our own executable");
            return Exit::Failure;
        }
    };
    let metrics = match crate::metrics::install() {
        Ok(h) => Some(h),
        Err(err) => {
            tracing::warn!(cause = %err, "metrics disabled");
            None
        }
    };
    let (parent, inheritance) = match parent {
        Some((parent, inheritance)) => (Some(parent), inheritance),
        None => (None, from_systemd),
    };
    daemon::run(Setup {
        config,
        exec,
        parent,
        inheritance,
        metrics,
        commands,
    })
    .await
}

pub(super) fn overrides(budgets: BudgetArgs) -> Overrides {
    Overrides {
        drain_timeout: budgets.drain_timeout,
        pre_stop_delay: budgets.pre_stop_delay,
    }
}
