//! Other baton processes as this one holds them: by pidfd, never by a bare
//! pid, and the next generation started *detached*.
//!
//! Why detached: systemd decides once, when `MAINPID=` names a new main
//! process, whether it is its own child. A main that is not ("alien") gets
//! SIGTERM on `systemctl stop` and, with nothing else left in the unit's
//! cgroup to wait for, SIGKILL a millisecond later: no drain, in-flight
//! requests cut. So N+1 is started through a middle process that exits at
//! once: N+1 is re-parented to PID 1 (systemd) before N ever names it.
//! Outside systemd it is re-parented to the nearest child subreaper (the
//! demo and the tests are one) or to init, which reaps it.
//!
//! Why pidfds: a pid of a process that has exited can be reused by an
//! unrelated one, which a root daemon's SIGUSR2 (default action: terminate)
//! or SIGKILL must never reach. A pidfd names one process for good.
//!
//! `unsafe`: between fork and exec, the second fork, the pid's write and
//! the wait for our word; registering the pidfd.
#![allow(unsafe_code)]

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, Interest};

/// One process, held by pidfd.
#[derive(Debug)]
pub struct Process {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
}

impl Process {
    /// Takes hold of a process known by pid (a draining generation named in
    /// a handoff, while it is known to be alive).
    pub fn open(pid: u32) -> std::io::Result<Process> {
        let raw = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| std::io::Error::other(format!("not a pid: {pid}")))?;
        Process::held(pid, pidfd_open(raw, PidfdFlags::NONBLOCK)?)
    }

    /// Takes hold of a process named by another (see [`Named`]): its pidfd
    /// opened first, then its start time read again. The same, the process
    /// held is the one named: alive at that read, it was alive at the open
    /// too. Another (its pid reused since it was named), an error.
    pub fn open_named(named: Named) -> std::io::Result<Process> {
        let held = Process::open(named.pid)?;
        match named.started {
            Some(started) if start_time(named.pid) != Some(started) => Err(std::io::Error::other(
                format!("pid {} names another process now", named.pid),
            )),
            _ => Ok(held),
        }
    }

    /// This process as another may name it: its start time read while it is
    /// sure to be alive (the pidfd still shows it running after the read).
    /// None once it has exited: its pid, named bare, may be another's.
    pub fn named(&self) -> Option<Named> {
        let started = start_time(self.pid);
        self.is_alive().then_some(Named {
            pid: self.pid,
            started,
        })
    }

    /// A second hold of the same process (a duplicate of its pidfd), for a
    /// task that waits for its exit apart from this one.
    pub fn try_clone(&self) -> std::io::Result<Process> {
        Process::held(self.pid, self.pidfd.get_ref().try_clone()?)
    }

    fn held(pid: u32, fd: OwnedFd) -> std::io::Result<Process> {
        // SAFETY: `OwnedFd` is a valid open fd that stays open, and always
        // returns the same number, for as long as the `AsyncFd` owns it.
        let pidfd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
        Ok(Process {
            pid,
            pidfd: pidfd.map_err(std::io::Error::from)?,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Signals this very process; an error if it has exited.
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        Ok(pidfd_send_signal(self.pidfd.get_ref().as_fd(), signal)?)
    }

    /// Whether it still runs (a pidfd turns readable when its process exits).
    pub fn is_alive(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            self.pidfd.get_ref(),
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
    }

    /// Resolves once the process has exited. Its status is not ours to read:
    /// a detached process is not our child.
    pub async fn exited(&self) {
        // Readable means exited; an error means the same for our purpose.
        let _ = self.pidfd.readable().await;
    }
}

/// A process as one process names it to another: its pid, and when it
/// started where /proc tells it. A pid alone may be reused by the time the
/// other opens it; with the start time it names one process for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named {
    pub pid: u32,
    pub started: Option<u64>,
}

impl Named {
    pub fn this_process() -> Named {
        let pid = std::process::id();
        Named {
            pid,
            started: start_time(pid),
        }
    }
}

/// When `pid` started, in clock ticks since boot: `/proc/PID/stat`'s 22nd
/// field. None where /proc is not this pid namespace's (a container's view
/// of the host's): its `PID` is another process there.
fn start_time(pid: u32) -> Option<u64> {
    if !proc_is_ours() {
        return None;
    }
    stat_field(pid, 22)?.parse().ok()
}

/// Field `n` of `/proc/PID/stat`, counted from 1 as proc(5) counts them.
/// The second, the name in parentheses, may hold spaces and parentheses
/// itself: the fields after it are counted from its last `)`.
pub(super) fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    let word = after_name.split_whitespace().nth(n.checked_sub(3)?)?;
    Some(word.to_string())
}

/// Whether /proc numbers processes as this pid namespace does (it was
/// mounted in it): it numbers us as we are.
pub(super) fn proc_is_ours() -> bool {
    std::fs::read_to_string("/proc/self/stat")
        .is_ok_and(|stat| stat.split(' ').next() == Some(std::process::id().to_string().as_str()))
}

/// Starts `command` detached (see the module doc) and holds it by pidfd.
/// Fails if the program cannot be executed, as a plain spawn would.
///
/// The pidfd is opened while the new process is sure to be alive: it waits
/// before its exec until we have opened it. Opened after, the pid could
/// already be another process's: a new generation can exit in its first
/// milliseconds (a stop, a crashing release), its reaper reaps it at once,
/// and the pid is free; a failed reload's SIGKILL would then go to whoever
/// took it.
pub async fn spawn_detached(mut command: std::process::Command) -> std::io::Result<Process> {
    let (pid_read, pid_write) = cloexec_pipe()?;
    // Read as the runtime's, not on a blocking thread: the spawn below
    // holds one until the exec, which waits for what this read brings.
    let mut pid_read = tokio::net::unix::pipe::Receiver::from_file(pid_read)?;
    let (go_read, go_write) = cloexec_pipe()?;
    let (go_read_raw, go_write_raw) = (go_read.as_raw_fd(), go_write.as_raw_fd());
    // SAFETY: runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: pthread_sigmask, sigaction,
    // write, read, close, kill and _exit are; fork no longer is by POSIX's 2024
    // list (for its atfork handlers), but this child of a fork runs one
    // thread, whose handlers' locks no other thread can hold. The middle
    // process reports the grandchild's pid and exits without returning
    // into Rust code; the grandchild waits for our word, then returns and
    // execs. Every pipe end is close-on-exec, so the grandchild keeps none.
    // The new generation's signals are quieted here, in the child (see
    // `quiet_until_handled`): what is set passes the second fork and exec.
    unsafe {
        command.pre_exec(move || {
            quiet_until_handled()?;
            match nix::libc::fork() {
                -1 => Err(std::io::Error::last_os_error()),
                0 => wait_for_word(go_read_raw, go_write_raw),
                grandchild => {
                    // A closed read end is a short write here, not the
                    // end of this process by SIGPIPE (std set it back to
                    // its default for the child) before its kill below.
                    nix::libc::signal(nix::libc::SIGPIPE, nix::libc::SIG_IGN);
                    let bytes = grandchild.to_ne_bytes();
                    let written =
                        nix::libc::write(pid_write.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                    if written != 4 {
                        // Unnamed, it would wait for our word for good.
                        nix::libc::kill(grandchild, nix::libc::SIGKILL);
                        nix::libc::_exit(1);
                    }
                    nix::libc::_exit(0)
                }
            }
        });
    }
    // std's spawn returns once the grandchild has exec'd (its error pipe
    // closes on exec) or reports the exec's failure: so it runs on a
    // thread of its own, beside our reading of the pid, which the exec
    // waits for.
    let spawning = crate::shortage::on_a_thread("baton-spawn", move || {
        let spawned = command.spawn();
        drop(go_read);
        spawned?.wait()
    })
    .map_err(|e| std::io::Error::new(e.kind(), format!("no thread to start it from: {e}")))?;
    let mut bytes = [0u8; 4];
    let pid = pid_read
        .read_exact(&mut bytes)
        .await
        .map(|_| i32::from_ne_bytes(bytes));
    // Not opened (no pid, or none of a live process): our end of the word
    // closes unwritten and the grandchild exits before its exec.
    let held = pid.and_then(|pid| {
        let pid = u32::try_from(pid)
            .map_err(|_| std::io::Error::other("the spawn helper sent a bad pid"))?;
        Process::open(pid)
    });
    if held.is_ok() {
        std::fs::File::from(go_write).write_all(b"!")?;
    } else {
        drop(go_write);
    }
    let spawned = spawning.await?;
    // The grandchild gave up (ECANCELED, its exec's error to std) because
    // we could not hold it: why we could not is the reason to tell.
    let gave_up = |e: &std::io::Error| e.raw_os_error() == Some(nix::libc::ECANCELED);
    let middle = match spawned {
        Err(e) if held.is_err() && gave_up(&e) => return held,
        spawned => spawned?,
    };
    if !middle.success() {
        return Err(std::io::Error::other(format!(
            "the spawn helper failed ({middle})"
        )));
    }
    held
}

/// The grandchild's wait, before its exec, for the word that its spawner
/// holds it by pidfd; an error (the exec's, as std reports it) if the
/// spawner closed its end without one. Async-signal-safe: close and read.
fn wait_for_word(read: RawFd, spawners_end: RawFd) -> std::io::Result<()> {
    // SAFETY: our copy of the spawner's end, closed so that its close
    // there is seen here; the fds are the pipe's, open in this process.
    unsafe { nix::libc::close(spawners_end) };
    let mut word = 0u8;
    loop {
        // SAFETY: reads one byte into a byte of our own.
        match unsafe { nix::libc::read(read, (&raw mut word).cast(), 1) } {
            1 => return Ok(()),
            -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return Err(std::io::Error::from_raw_os_error(nix::libc::ECANCELED)),
        }
    }
}

/// For a new generation's spawn, in the child before exec: SIGUSR1 blocked
/// (see `signals::hold_sigusr1`), and SIGHUP, SIGQUIT and SIGUSR2 ignored
/// until its handlers are in place, so one sent to the whole unit
/// (`systemctl kill -s HUP baton`) in its first milliseconds cannot end it
/// by its default action. Ignored, not blocked: a handler installed later
/// takes an ignored signal over, where a blocked one stays blocked in a
/// generation that does not unblock it (an older release, which a
/// rollback reloads into, unblocks SIGUSR1 alone). A SIGHUP in that
/// instant is lost: a reload asked of a reload still starting. SIGTERM and
/// SIGINT keep their default once it has exec'd: a stop then ends a
/// generation that holds nothing yet, and its reload fails, as the stop
/// wants. (Before its exec the child still has the older generation's
/// handlers: a stop in that instant marks only the child's copy of their
/// memory, which exec discards, and wakes the older one's signal driver
/// for nothing; a stop sent to the whole unit reaches the older one too,
/// which passes it on by word.)
/// Async-signal-safe: pthread_sigmask and sigaction only.
pub(super) fn quiet_until_handled() -> std::io::Result<()> {
    use nix::sys::signal::Signal;
    super::signals::hold_sigusr1();
    ignore_signals(&[Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR2])
}

/// Sets `signals` ignored in this process: for a child between fork and
/// exec (exec keeps an ignored signal ignored), where only
/// async-signal-safe calls are allowed; sigaction is one.
pub(super) fn ignore_signals(signals: &[nix::sys::signal::Signal]) -> std::io::Result<()> {
    use nix::sys::signal::{signal, SigHandler};
    for &ignored in signals {
        // SAFETY: SIG_IGN runs no code of ours.
        unsafe { signal(ignored, SigHandler::SigIgn) }?;
    }
    Ok(())
}

fn cloexec_pipe() -> std::io::Result<(std::fs::File, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((std::fs::File::from(read), write))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process named with its start time is held only while its pid
    /// still names the process that started then; named with none (by an
    /// older release), by its pid alone.
    #[tokio::test]
    async fn a_named_process_is_held_only_if_it_started_when_named() {
        let us = Named::this_process();
        let started = us.started.expect("this host's /proc tells a start time");
        let held = Process::open_named(us).expect("held");
        assert_eq!(held.named(), Some(us), "named as it names itself");
        let reused = Named {
            started: Some(started + 1),
            ..us
        };
        let refused = Process::open_named(reused).expect_err("another process");
        assert!(
            refused.to_string().contains("names another process"),
            "{refused}"
        );
        let by_pid = Named {
            started: None,
            ..us
        };
        assert!(Process::open_named(by_pid).is_ok());
    }
}
