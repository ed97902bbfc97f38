//! Where nothing would outlive a reload's old generation: baton as PID 1
//! of its PID namespace (the kernel ends the namespace with it), or the
//! child of a container's minimal init, which exits when its one child
//! does (tini, dumb-init, catatonit, a shell entrypoint). There the new
//! generation, started detached, went down with the old one at the end of
//! its drain. So `baton run` stays on as a keeper, as nginx's master
//! process does: generation 1 runs as its child, and every later one is
//! re-parented to it (its child subreaper); it passes the signals a
//! container runtime sends (`docker stop`, `docker kill -s HUP`) to every
//! generation, as systemd signals a unit's whole cgroup; and it exits,
//! once the last generation has, with that one's code (the serving one's
//! at a stop). It holds no socket and no channel: no generation waits on
//! it, and it answers nothing.

use std::os::unix::process::CommandExt;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::generation::Exec;
use crate::exit::Exit;

/// Set for generation 1 under a keeper, and so for every later one (they
/// inherit its environment): none of them keeps.
pub const ENV_KEPT: &str = "BATON_KEPT";

/// The signals a keeper passes to every generation.
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
    super::process::init_that_exits_with_us().is_some()
        && nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Runs generation 1 as a child and keeps it and every later generation
/// until the last has exited; its exit is theirs.
pub fn keep() -> Exit {
    let mut held = SigSet::empty();
    PASSED.iter().for_each(|&s| held.add(s));
    held.add(Signal::SIGCHLD);
    if let Err(err) = held.thread_block() {
        eprintln!("baton: the keeper cannot hold its signals: {err}");
        return Exit::Failure;
    }
    let first = match generation_1() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("baton: the keeper cannot start generation 1: {err}");
            return Exit::Failure;
        }
    };
    eprintln!(
        "baton: keeping generation 1 (pid {}) and its successors: a reload's new generation outlives the old one here",
        first.id()
    );
    let mut last = Exit::Clean;
    loop {
        match held.wait() {
            Ok(Signal::SIGCHLD) => match reap(&mut last) {
                Generations::Left => return last,
                Generations::Running => {}
            },
            Ok(passed) => pass_on(passed),
            Err(err) => {
                eprintln!("baton: the keeper lost its signals: {err}");
                return Exit::Failure;
            }
        }
    }
}

/// This very command again, as generation 1: its signals as they were
/// before the keeper held them.
#[allow(unsafe_code)]
fn generation_1() -> std::io::Result<std::process::Child> {
    let exec = Exec::of_this_process()?;
    let mut command = std::process::Command::new(&exec.program);
    command.args(&exec.args).env(ENV_KEPT, "1");
    // SAFETY: runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: pthread_sigmask is one, on a
    // set built on the stack.
    unsafe {
        command.pre_exec(|| {
            nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
                .map_err(std::io::Error::from)
        });
    }
    command.spawn()
}

enum Generations {
    Running,
    Left,
}

/// Reaps every child that has exited, noting the last one's code (a
/// generation, or an orphan re-parented here); says whether any is left.
fn reap(last: &mut Exit) -> Generations {
    loop {
        match nix::sys::wait::waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => *last = Exit::from_code(code),
            Ok(WaitStatus::Signaled(..)) => *last = Exit::Failure,
            Ok(WaitStatus::StillAlive) => return Generations::Running,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return Generations::Left,
        }
    }
}

/// `signal` to every child: the generations, as systemd signals every
/// process of a unit. Listed by /proc, when it numbers processes as our
/// namespace does (one mounted for an outer namespace would name others).
fn pass_on(signal: Signal) {
    let ours = std::fs::read_link("/proc/self")
        .is_ok_and(|me| me.as_os_str() == std::process::id().to_string().as_str());
    let children = std::fs::read_to_string("/proc/thread-self/children");
    let (true, Ok(children)) = (ours, children) else {
        eprintln!("baton: the keeper cannot list its generations (is /proc this namespace's?) to pass {signal} on");
        return;
    };
    for pid in children.split_whitespace().filter_map(|p| p.parse().ok()) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
    }
}
