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
//! nothing. A generation that ends as a failure (killed, crashed) with no
//! stop asked, older ones still draining and none listening (the serving
//! one died, its predecessor drains with its doors closed) has the keeper
//! start a fresh generation 1, as nginx's master starts a worker again:
//! the ports refused connections until the drain ended the keeper. With
//! no generation left it exits instead, with the failure's code, for the
//! container's restart policy to see.

mod init;
mod listening;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

pub use self::init::init_that_exits_with_us;
use super::generation::Exec;
use crate::exit::Exit;

/// Set for generation 1 under a keeper, and so for every later one (they
/// inherit its environment): none of them keeps.
pub const ENV_KEPT: &str = "BATON_KEPT";

/// How long a generation the keeper started again after a failure must
/// have run for the keeper to start another: one that cannot start (a port
/// taken, a config made invalid since) is not started in a loop; the
/// keeper then waits for the drains and exits with the code of the last
/// one. (A failure this soon after generation 1's own start is looked at
/// once this is over.)
const RESTART_AFTER: Duration = Duration::from_secs(5);

/// The signals that stop the generations: after one, nothing is started
/// again.
const STOPS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT];

/// Looks a second apart at whether a generation listens, after one failed:
/// the failed one may have been the serving one while its predecessor
/// still listened, closing its doors a few seconds later (a successor that
/// died just after it took over: the predecessor waits up to 2 s for its
/// first report to land, and 1.5 s more for a listener that defers
/// accepting).
const LOOKS_AFTER_A_FAILURE: u32 = 5;

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
/// under one, nor in a new generation a reload started: one re-parented to
/// a container's init (its old generation ran under an entrypoint script
/// that did not `exec` it) is a generation of that chain, with the
/// handoff to take, not the keeper of a chain of its own.
pub fn wanted() -> bool {
    if std::env::var_os(ENV_KEPT).is_some() || std::env::var_os(super::handoff::ENV_FD).is_some() {
        return false;
    }
    if std::process::id() == 1 {
        return true;
    }
    let Some(init) = init_that_exits_with_us() else {
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
    held.add(Signal::SIGALRM);
    let before = match held.thread_swap_mask(SigmaskHow::SIG_BLOCK) {
        Ok(before) => before,
        Err(err) => {
            say(&format!("the keeper cannot hold its signals: {err}"));
            return Exit::Failure;
        }
    };
    let group = match generation_1(before, None) {
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
    let mut restarts = Restarts {
        mask: before,
        stopping: false,
        started: Instant::now(),
        restarted: false,
        looks_left: 0,
        ended: Exit::Clean,
    };
    loop {
        match held.wait() {
            Ok(Signal::SIGCHLD) => {
                if reap(group, &mut last) {
                    restarts.failed(group, last);
                }
                if !any_left(group) {
                    return last;
                }
            }
            Ok(Signal::SIGALRM) => restarts.look(group),
            // To the whole group: generations still starting too.
            Ok(passed) => {
                restarts.stopping |= STOPS.contains(&passed);
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
/// Started again after a failure, it joins the group of the generations
/// still draining (`join`), which the keeper's signals reach.
#[allow(unsafe_code)]
fn generation_1(mask: SigSet, join: Option<Pid>) -> std::io::Result<std::process::Child> {
    let exec = Exec::of_this_process()?;
    let mut command = std::process::Command::new(&exec.program);
    command
        .args(&exec.args)
        .env(ENV_KEPT, "1")
        .process_group(join.map_or(0, Pid::as_raw));
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

/// When the keeper starts a generation again after a failure.
struct Restarts {
    /// The signal mask a generation starts with.
    mask: SigSet,
    /// A stop was passed on: nothing is started again.
    stopping: bool,
    /// When the keeper last started a generation.
    started: Instant,
    /// The last one started was started again after a failure.
    restarted: bool,
    /// Looks still to take at whether one listens (`LOOKS_AFTER_A_FAILURE`).
    looks_left: u32,
    /// The code of the generation whose failure the looks are for.
    ended: Exit,
}

impl Restarts {
    /// A generation of `group` ended as a failure, with `code`.
    fn failed(&mut self, group: Pid, code: Exit) {
        self.ended = code;
        self.looks_left = LOOKS_AFTER_A_FAILURE;
        self.look(group);
    }

    /// Starts a fresh generation 1 in `group` if older ones drain there
    /// and none listens; else looks again a second later, while looks are
    /// left. Too soon after generation 1's start, the keeper looks once
    /// that is over, spending no look; too soon after a start of its own
    /// after a failure, it starts nothing more (`RESTART_AFTER`).
    fn look(&mut self, group: Pid) {
        if self.stopping || self.looks_left == 0 || !any_left(group) {
            return;
        }
        let too_soon = RESTART_AFTER.saturating_sub(self.started.elapsed());
        if !too_soon.is_zero() {
            if self.restarted {
                self.looks_left = 0;
                say("the generation started again failed within 5 s: none is started again; the older ones drain on");
            } else {
                nix::unistd::alarm::set(whole_seconds(too_soon));
            }
            return;
        }
        self.looks_left -= 1;
        if listening::anyone_listens(group.as_raw()) {
            if self.looks_left > 0 {
                nix::unistd::alarm::set(1);
            }
            return;
        }
        self.looks_left = 0;
        self.started = Instant::now();
        self.restarted = true;
        match generation_1(self.mask, Some(group)) {
            Ok(child) => say(&format!(
                "a generation ended ({}) and none listens: starting generation 1 afresh (pid {}); the older ones drain on",
                self.ended.code(),
                child.id()
            )),
            Err(err) => say(&format!(
                "a generation ended and none listens, and none can be started: {err}"
            )),
        }
    }
}

/// `wait` in whole seconds, rounded up (what `alarm` takes).
fn whole_seconds(wait: Duration) -> u32 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX).max(1)
}

/// Reaps every child that has exited, noting a generation's code (`group`
/// holds the generations; one a signal killed is a failure) and not an
/// orphan's, re-parented here from elsewhere: each is looked at before it
/// is reaped (a zombie keeps its group). True if a generation ended as a
/// failure: killed, or an exit that is neither a clean or forced drain's
/// nor an invalid config's.
fn reap(group: Pid, last: &mut Exit) -> bool {
    use nix::sys::wait::{waitid, waitpid, Id};
    let exited = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    let mut failed = false;
    while let Some(pid) = waitid(Id::All, exited).ok().and_then(|s| s.pid()) {
        let generation = nix::unistd::getpgid(Some(pid)) == Ok(group);
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) if generation => {
                *last = Exit::from_code(code);
                failed |= !matches!(*last, Exit::Clean | Exit::Forced | Exit::Config);
            }
            Ok(WaitStatus::Signaled(..)) if generation => {
                *last = Exit::Failure;
                failed = true;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    failed
}

/// Whether any process of the generations' group lives (a reaped group
/// is gone; orphans re-parented here from elsewhere do not hold us).
fn any_left(group: Pid) -> bool {
    nix::sys::signal::killpg(group, None) != Err(nix::errno::Errno::ESRCH)
}
