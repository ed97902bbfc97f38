//! Where nothing would outlive a reload's old generation: baton as PID 1
//! of its PID namespace (the kernel ends the namespace with it), or the
//! child of a container's minimal init, which exits when its one child
//! does (tini, dumb-init, catatonit, a shell entrypoint). There the new
//! generation, started detached, went down with the old one at the end of
//! its drain. So `baton run` stays on as a keeper, as nginx's master
//! process does: generation 1 runs as its child, in a process group of its
//! own that every later generation inherits, and every later one is
//! re-parented to the keeper (its child subreaper); the keeper passes the
//! signals a container runtime sends (`docker stop`, `docker kill -s HUP`)
//! to that group, as systemd signals a unit's whole cgroup; and it exits
//! once the group is empty, with the code of the last child it reaped (the
//! serving generation's, at a stop; 1 for one a signal killed). It holds
//! no socket and no channel: no generation waits on it, and it answers
//! nothing.

use std::io::Write;
use std::os::unix::process::CommandExt;

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::generation::Exec;
use crate::exit::Exit;

/// Set for generation 1 under a keeper, and so for every later one (they
/// inherit its environment): none of them keeps.
pub const ENV_KEPT: &str = "BATON_KEPT";

/// The signals a keeper passes to the generations.
const PASSED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGHUP,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Whether this `baton run` is one a reload's old generation would take
/// down with it, and becomes its generations' keeper (a child subreaper,
/// unless PID 1, which reaps orphans anyway). Not where it already runs
/// under one.
pub fn wanted() -> bool {
    if std::env::var_os(ENV_KEPT).is_some() {
        return false;
    }
    if std::process::id() == 1 {
        return true;
    }
    let Some(init) = super::process::init_that_exits_with_us() else {
        return false;
    };
    match nix::sys::prctl::set_child_subreaper(true) {
        Ok(()) => true,
        Err(err) => {
            say(&format!(
                "under {init:?}, but cannot keep generations ({err}): reloads will be refused"
            ));
            false
        }
    }
}

/// Runs generation 1 as a child and keeps it and every later generation
/// until none is left; its exit is theirs.
pub fn keep() -> Exit {
    reap_ourselves();
    let mut held = SigSet::empty();
    PASSED.iter().for_each(|&s| held.add(s));
    held.add(Signal::SIGCHLD);
    let before = match held.thread_swap_mask(SigmaskHow::SIG_BLOCK) {
        Ok(before) => before,
        Err(err) => {
            say(&format!("the keeper cannot hold its signals: {err}"));
            return Exit::Failure;
        }
    };
    let group = match generation_1(before) {
        Ok(child) => Pid::from_raw(child.id() as i32),
        Err(err) => {
            say(&format!("the keeper cannot start generation 1: {err}"));
            return Exit::Failure;
        }
    };
    say(&format!(
        "keeping generation 1 (pid {group}) and its successors: a reload's new generation outlives the old one here"
    ));
    let mut last = Exit::Clean;
    loop {
        match held.wait() {
            Ok(Signal::SIGCHLD) => {
                reap(&mut last);
                if !any_left(group) {
                    return last;
                }
            }
            // To the whole group: generations still starting too.
            Ok(passed) => {
                let _ = nix::sys::signal::killpg(group, passed);
            }
            Err(err) => {
                say(&format!("the keeper lost its signals: {err}"));
                return Exit::Failure;
            }
        }
    }
}

/// One line on stderr, never a panic (a keeper as PID 1 that panicked
/// would end the namespace, every generation in it).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "baton: {line}");
}

/// SIGCHLD at its default: one inherited ignored would have the kernel
/// reap the generations unseen, and their codes lost.
#[allow(unsafe_code)]
fn reap_ourselves() {
    // SAFETY: SIG_DFL runs no code of ours.
    let _ = unsafe { nix::sys::signal::signal(Signal::SIGCHLD, SigHandler::SigDfl) };
}

/// This very command again, as generation 1: with the signal mask it had
/// before the keeper held its signals, quieted until its handlers are in
/// place as every later generation is (`process::quiet_until_handled`),
/// and in a process group of its own, so that a terminal's Ctrl-C
/// (`docker run -it`) reaches the keeper alone, which passes it on once (a
/// second stop signal forces the drain).
#[allow(unsafe_code)]
fn generation_1(mask: SigSet) -> std::io::Result<std::process::Child> {
    let exec = Exec::of_this_process()?;
    let mut command = std::process::Command::new(&exec.program);
    command.args(&exec.args).env(ENV_KEPT, "1").process_group(0);
    // SAFETY: runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: pthread_sigmask and sigaction
    // are, on a set copied onto the stack.
    unsafe {
        command.pre_exec(move || {
            nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&mask), None)?;
            super::process::quiet_until_handled()
        });
    }
    command.spawn()
}

/// Reaps every child that has exited, noting the last one's code (a
/// generation, or an orphan re-parented here; one a signal killed is a
/// failure).
fn reap(last: &mut Exit) {
    loop {
        match nix::sys::wait::waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => *last = Exit::from_code(code),
            Ok(WaitStatus::Signaled(..)) => *last = Exit::Failure,
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Whether any process of the generations' group lives (a reaped group
/// is gone; orphans re-parented here from elsewhere do not hold us).
fn any_left(group: Pid) -> bool {
    nix::sys::signal::killpg(group, None) != Err(nix::errno::Errno::ESRCH)
}
