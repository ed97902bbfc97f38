//! sd_notify, the only way baton talks to systemd. Every call is a no-op
//! when `NOTIFY_SOCKET` is unset (not under systemd), and a failure to
//! notify is logged, never fatal: serving traffic matters more.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
use sd_notify::NotifyState;

/// The socket every notice leaves by, made at the start and kept. One made
/// for each notice (as the sd-notify crate does) could not be made once
/// the fd table was full, as a loaded generation's is when it hands over:
/// its `MAINPID=` lost, systemd took the old generation's exit for the
/// service's end and stopped the new one with it. `None` until made, and
/// made again at the next notice if it could not be.
static NOTIFIER: Mutex<Option<Notifier>> = Mutex::new(None);

/// How long a notice may wait for systemd to take it: a stalled PID 1
/// must not hold the thread that tells (health checks, admin, handoff).
const NOTICE_WAIT: Duration = Duration::from_secs(1);

struct Notifier {
    socket: UnixDatagram,
    to: UnixAddr,
}

impl Notifier {
    /// One for `NOTIFY_SOCKET` (a path, or `@` and an abstract name).
    fn open(target: &std::ffi::OsStr) -> std::io::Result<Notifier> {
        use std::os::unix::ffi::OsStrExt;
        let to = match target.as_bytes() {
            [b'@', name @ ..] => UnixAddr::new_abstract(name),
            path => UnixAddr::new(path),
        }
        .map_err(std::io::Error::from)?;
        let socket = UnixDatagram::unbound()?;
        socket.set_write_timeout(Some(NOTICE_WAIT))?;
        Ok(Notifier { socket, to })
    }

    fn send(&self, message: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
        let send = || {
            sendmsg(
                self.socket.as_raw_fd(),
                &[IoSlice::new(message)],
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                Some(&self.to),
            )
        };
        // A send that waits (its timeout set) is not restarted after a
        // signal: a SIGTERM or SIGHUP just then lost the notice.
        let sent = loop {
            match send() {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other?,
            }
        };
        if sent == message.len() {
            Ok(())
        } else {
            Err(std::io::ErrorKind::WriteZero.into())
        }
    }
}

/// Makes the notify socket now, while fds are to be had (a no-op when
/// not under systemd's notify protocol).
pub fn keep_notify_socket() {
    if let Err(err) = with_notifier(|_| Ok(())) {
        tracing::warn!(cause = %err, "cannot make a socket to notify systemd");
    }
}

/// Runs `send` with the kept notify socket, made first if it is not yet.
fn with_notifier(send: impl FnOnce(&Notifier) -> std::io::Result<()>) -> std::io::Result<()> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let mut kept = NOTIFIER.lock().unwrap_or_else(PoisonError::into_inner);
    if kept.is_none() {
        *kept = Some(Notifier::open(&target)?);
    }
    match kept.as_ref() {
        Some(notifier) => send(notifier),
        None => Ok(()),
    }
}

/// The states as the protocol has them: a line each.
fn message(states: &[NotifyState]) -> String {
    states.iter().map(|s| format!("{s}\n")).collect()
}

fn notify(states: &[NotifyState]) {
    if let Err(err) = with_notifier(|n| n.send(message(states).as_bytes(), &[])) {
        tracing::warn!(cause = %err, "sd_notify failed");
    }
}

/// Sends `states` with `fds` (`FDSTORE=1`).
fn notify_with_fds(states: &[NotifyState], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    with_notifier(|n| n.send(message(states).as_bytes(), &raw))
}

pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    notify(&[NotifyState::Status(status)]);
}

/// A real stop; never sent by an old generation draining after a reload.
/// `EXTEND_TIMEOUT_USEC=` asks systemd for `needs` from now, whatever the
/// unit's `TimeoutStopSec=`: one left shorter than the config's budgets
/// (a drain raised in the config, or by a drop-in's `Environment=`) had
/// systemd SIGKILL every generation partway through the drain, the exit
/// code and the last log lines with them. The stop is bounded by baton's
/// own deadlines all the same.
fn stopping(needs: Duration) {
    let extend = extend_timeout(needs);
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: draining"),
        NotifyState::Custom(&extend),
    ]);
}

/// The microseconds in 64 bits, as systemd reads them: sd-notify's own
/// state takes 32, at most 71 minutes, and a longer drain was SIGKILLed
/// there.
fn extend_timeout(needs: Duration) -> String {
    let usec = u64::try_from(needs.as_micros()).unwrap_or(u64::MAX);
    format!("EXTEND_TIMEOUT_USEC={usec}")
}

fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// What this generation last told systemd of where it stands, kept with
/// the telling under one lock. A task that decided to say `READY=1` (the
/// first health round done, a periodic status line) could otherwise say it
/// just after a stop's `STOPPING=1`, which moved a unit still starting to
/// running as baton shut down, or after a reload's `RELOADING=1`, which it
/// ends before the new generation serves.
#[derive(Default)]
pub struct Standing(Mutex<Told>);

/// What this generation has told systemd.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
struct Told {
    stand: Stand,
    /// Its start is over (`READY=1` said, or due once a reload of ours
    /// ends): a takeover at once, a first start once its first health
    /// round has run. Until then neither a status line nor a reload that
    /// failed says `READY=1`, which would make a unit still starting
    /// active, and start what is ordered after it, before any backend
    /// was checked.
    started: bool,
}

#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
enum Stand {
    #[default]
    Serving,
    Reloading,
    Stopping,
}

/// What a task's report says, where this generation stands.
#[derive(Debug, PartialEq, Eq)]
enum Said {
    ReadyAndStatus,
    Status,
    Nothing,
}

impl Stand {
    fn report(self, ready: bool) -> Said {
        match self {
            Stand::Serving if ready => Said::ReadyAndStatus,
            Stand::Serving | Stand::Reloading => Said::Status,
            // Its `STATUS=stopping: draining` stays what `systemctl
            // status` shows.
            Stand::Stopping => Said::Nothing,
        }
    }
}

impl Told {
    /// `status`, with `READY=1` when serving and the start over; nothing
    /// once a stop began.
    fn say(&self, status: &str) {
        match self.stand.report(self.started) {
            Said::ReadyAndStatus => ready(status),
            Said::Status => self::status(status),
            Said::Nothing => {}
        }
    }
}

impl Standing {
    fn told(&self) -> std::sync::MutexGuard<'_, Told> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The start is over (see [`Told::started`]): `READY=1` with `status`,
    /// or, during a reload of ours, when it fails.
    pub fn started(&self, status: &str) {
        let mut told = self.told();
        told.started = true;
        told.say(status);
    }

    /// Whether the start is over (see [`Told::started`]).
    pub fn is_started(&self) -> bool {
        self.told().started
    }

    /// A reload of ours began: `RELOADING=1`. Nothing once a stop began.
    pub fn reloading(&self) {
        let mut told = self.told();
        if told.stand != Stand::Stopping {
            told.stand = Stand::Reloading;
            reloading();
        }
    }

    /// Serving again after a reload that failed: `READY=1` ends systemd's
    /// reload state, once the start is over (a first start still waiting
    /// for its first health round says it then). Nothing once a stop began.
    pub fn serving(&self, status: &str) {
        let mut told = self.told();
        if told.stand != Stand::Stopping {
            told.stand = Stand::Serving;
            told.say(status);
        }
    }

    /// A real stop began, which `needs` to run to its end: `STOPPING=1`,
    /// the last word.
    pub fn stopping(&self, needs: Duration) {
        let mut told = self.told();
        told.stand = Stand::Stopping;
        stopping(needs);
    }

    /// A task's report: `READY=1` with `status` when serving with the
    /// start over, `status` alone during a reload or a start, nothing once
    /// a stop began. `READY=1` again, whatever the pools: a new
    /// generation's first one may reach systemd before its `MAINPID=`
    /// does and be dropped, and repeated only while every pool had a
    /// healthy backend, it never landed with one down, leaving a unit
    /// whose start a reload caught `activating` until `TimeoutStartSec`
    /// failed it.
    pub fn report(&self, status: &str) {
        self.told().say(status);
    }
}

/// Names the successor as the service's main process and says the reload
/// is complete (`READY=1`: it accepts). By the protocol, the `RELOADING=1`
/// we sent ends at a `READY=1` from the main process; sent by us, still
/// main, this one is heard, where the successor's own may come before its
/// `MAINPID=` lands and be dropped (it repeats it every status line).
/// Not `READY=1` while our own start is not over (`started`): the
/// successor says it at its first round's end.
pub fn handed_over(successor: u32, started: bool) {
    match started {
        true => notify(&[NotifyState::MainPid(successor), NotifyState::Ready]),
        false => notify(&[NotifyState::MainPid(successor)]),
    }
}

/// Whether we run under systemd's notify protocol at all.
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// What systemd's fd store should hold after this generation took over:
/// every socket it holds, by name, and none of the names it dropped. The
/// store keeps the kernel sockets (and their queues) open across a
/// `systemctl restart`.
///
/// systemd takes these messages from the main process only, and a new
/// generation is main only once the old one's `MAINPID=` has landed, which
/// is certain only when the old generation has exited (it outlives a
/// repetition that lands). So a takeover sends the update at once (a
/// systemd that took `MAINPID=` already keeps it) and again then. Storing
/// the same socket twice is harmless: systemd keeps one.
pub struct FdStoreUpdate {
    remove: Vec<String>,
    store: Vec<(String, std::os::fd::OwnedFd)>,
}

impl FdStoreUpdate {
    pub fn new(remove: Vec<String>, store: Vec<(String, std::os::fd::OwnedFd)>) -> FdStoreUpdate {
        FdStoreUpdate { remove, store }
    }

    pub fn send(&self) {
        // Removed first: a stale entry may share a name we store now.
        release(&self.remove);
        for (name, fd) in &self.store {
            let states = [NotifyState::FdStore, NotifyState::FdName(name)];
            let fd = std::os::fd::AsFd::as_fd(fd);
            if let Err(err) = notify_with_fds(&states, &[fd]) {
                tracing::warn!(cause = %err, name, "cannot store fd with systemd");
            }
        }
    }
}

/// How long a stop waits for systemd to say whether it is a restart, at
/// most: as long as the pre-stop pause it runs alongside, at least a
/// second (what the 5 s that `TimeoutStopSec` gives beyond the pause and
/// the drain can spare), at most five.
fn job_query_wait(pause: Duration) -> Duration {
    let second = Duration::from_secs(1);
    pause.clamp(second, 5 * second)
}

/// Whether the stop under way is a `systemctl restart` (systemd's job on
/// this service is a restart), or why that cannot be told. Only a
/// restart has a next start to adopt the fd store's sockets; on any other
/// stop their copies in the store keep them listening until the unit ends,
/// and the connections that queue meanwhile are then reset instead of
/// refused. systemd 252 tells a stop from a restart only over D-Bus
/// (`RestartKillSignal=` came in 253): asked with `busctl`, which ships
/// with systemd, once a stop, rather than with a D-Bus crate in baton.
/// busctl must outlive the stop's SIGTERM: it runs in the unit's control
/// group, which systemd signals (`KillMode=control-group`) and signals
/// again for processes that appear while it does, so a busctl started
/// just then was killed before it answered (CI saw it under load). It
/// ignores the signals sent to the whole unit (`ignore_unit_signals`).
pub async fn restarting(pause: Duration) -> Result<bool, String> {
    let wait = job_query_wait(pause);
    let unit = own_unit().ok_or("no service of ours in /proc/self/cgroup")?;
    let mut busctl = tokio::process::Command::new("busctl");
    busctl
        .args(["--json=short", "call", "org.freedesktop.systemd1"])
        .args([
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
        ])
        .arg("ListJobs")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    ignore_unit_signals(busctl.as_std_mut());
    let child = busctl
        .spawn()
        .map_err(|err| format!("cannot run busctl: {err}"))?;
    let out = tokio::time::timeout(wait, child.wait_with_output())
        .await
        .map_err(|_| format!("no answer within {wait:?}"))?
        .map_err(|err| format!("busctl: {err}"))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(format!("busctl: {}: {}", out.status, said.trim()));
    }
    restart_job(&out.stdout, &unit).ok_or_else(|| "busctl: not a list of jobs".to_string())
}

/// Makes the program `command` runs ignore, from its first instruction,
/// the signals sent to every process of the unit: the stop's SIGTERM (or
/// the SIGINT or SIGQUIT a unit may stop with), logrotate's SIGUSR1, a
/// reload's SIGHUP and the SIGUSR2 that ends older drains (whose default
/// actions kill). Set in the child
/// before exec, a setting exec keeps, whatever the spawning thread's mask
/// (std passes it on; the main thread, which takes SIGUSR1, may be the
/// one). Before that, a signal runs baton's own handler in the child,
/// which only wakes the parent's signal driver for nothing.
#[allow(unsafe_code)]
fn ignore_unit_signals(command: &mut std::process::Command) {
    use nix::sys::signal::Signal;
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: `ignore_signals` makes only
    // sigaction calls. It touches no memory of the parent's.
    unsafe {
        command.pre_exec(|| {
            super::process::ignore_signals(&[
                Signal::SIGTERM,
                Signal::SIGINT,
                Signal::SIGQUIT,
                Signal::SIGUSR1,
                Signal::SIGUSR2,
                Signal::SIGHUP,
            ])
        });
    }
}

/// Whether `ListJobs`' answer (busctl's JSON: `{"type":"a(usssoo)",
/// "data":[[[id, unit, type, state, job, unit path], ...]]}`) holds a
/// restart of `unit`; None if it is not such an answer.
fn restart_job(answer: &[u8], unit: &str) -> Option<bool> {
    let answer: serde_json::Value = serde_json::from_slice(answer).ok()?;
    let jobs = answer.get("data")?.get(0)?.as_array()?;
    Some(jobs.iter().any(|job| {
        job.get(1).and_then(|u| u.as_str()) == Some(unit)
            && matches!(
                job.get(2).and_then(|t| t.as_str()),
                Some("restart" | "try-restart")
            )
    }))
}

/// This process's service, from its cgroup (`0::/system.slice/baton.service`).
fn own_unit() -> Option<String> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroups.lines().find_map(|line| {
        let path = line.rsplit(':').next()?;
        let unit = path.rsplit('/').next()?;
        unit.ends_with(".service").then(|| unit.to_string())
    })
}

/// Takes `names` out of the fd store: systemd closes its copies, so once
/// ours close too the sockets are gone and a connection is refused at once.
fn release(names: &[String]) {
    for name in names {
        notify(&[
            NotifyState::Custom("FDSTOREREMOVE=1"),
            NotifyState::FdName(name),
        ]);
    }
}

/// A takeover's fd store update, to send again once the old generation
/// has exited ([`FdStoreUpdate`]). It holds duplicates of the sockets, so
/// it is dropped when this generation closes its doors: a later reload
/// that removes a listener must not find its socket still open (and
/// completing handshakes nobody accepts) in a copy kept for a repetition
/// that no longer matters. Sent, dropped and released under its lock, so
/// a stop's release is never followed by the repetition storing the
/// sockets again (the old generation may exit during the stop's pause).
#[derive(Clone, Default)]
pub struct PendingUpdate(Arc<Mutex<Option<FdStoreUpdate>>>);

impl PendingUpdate {
    pub fn hold(&self, update: FdStoreUpdate) {
        *self.lock() = Some(update);
    }

    /// Sends it, if it is still held, and lets it go.
    pub fn send(&self) {
        if let Some(update) = self.lock().take() {
            update.send();
        }
    }

    /// Lets it go unsent (closing the duplicates).
    pub fn drop_unsent(&self) {
        drop(self.lock().take());
    }

    /// Lets it go unsent and takes `names` out of the store.
    pub fn release(&self, names: &[String]) {
        let mut pending = self.lock();
        drop(pending.take());
        release(names);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<FdStoreUpdate>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Pings the watchdog at half of `WATCHDOG_USEC` until `stop`, from a task
/// on the runtime, so a stuck runtime stops the pings, and while `running`
/// says every worker thread runs (a stuck one stops them too).
pub async fn watchdog(
    stop: tokio_util::sync::CancellationToken,
    running: impl Fn() -> bool + Send + 'static,
) {
    let Some(usec) = watchdog_usec() else {
        return;
    };
    let period = ping_period(usec);
    loop {
        if running() {
            notify(&[NotifyState::Watchdog]);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

/// Half of `WATCHDOG_USEC`, but at least a millisecond: a `WatchdogSec=`
/// of a few microseconds made the supervisor's one thread (health checks,
/// admin, handoff) spin sending pings.
fn ping_period(usec: u64) -> Duration {
    Duration::from_micros(usec / 2).max(Duration::from_millis(1))
}

/// `WATCHDOG_USEC`, if the watchdog applies to us: as sd_watchdog_enabled(3)
/// reads it, `WATCHDOG_PID` (when set) must name us. A generation started
/// by a reload has no `WATCHDOG_PID` (it named the old main) and inherits
/// `WATCHDOG_USEC`, so it pings as soon as it serves.
fn watchdog_usec() -> Option<u64> {
    let usec = std::env::var("WATCHDOG_USEC")
        .ok()?
        .parse::<u64>()
        .ok()
        .filter(|u| *u > 0)?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.parse::<u32>().ok() != Some(std::process::id()) => None,
        _ => Some(usec),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{extend_timeout, ping_period, restart_job, Said, Stand, Standing};

    #[test]
    fn the_watchdog_pings_at_half_its_time_and_never_spins() {
        assert_eq!(ping_period(20_000_000), Duration::from_secs(10));
        assert_eq!(ping_period(1), Duration::from_millis(1));
        assert_eq!(ping_period(3), Duration::from_millis(1));
    }

    /// A task's report says `READY=1` only while serving, its line alone
    /// during a reload, and nothing once a stop began, which no later
    /// word undoes.
    #[test]
    fn a_report_says_ready_only_while_serving_and_nothing_once_stopping() {
        assert_eq!(Stand::Serving.report(true), Said::ReadyAndStatus);
        assert_eq!(Stand::Serving.report(false), Said::Status);
        assert_eq!(Stand::Reloading.report(true), Said::Status);
        assert_eq!(Stand::Stopping.report(true), Said::Nothing);
        let standing = Standing::default();
        standing.reloading();
        assert_eq!(standing.told().stand, Stand::Reloading);
        standing.serving("the reload failed");
        assert_eq!(standing.told().stand, Stand::Serving);
        standing.stopping(Duration::from_secs(20));
        standing.serving("a reload that failed as the stop began");
        standing.reloading();
        assert_eq!(
            standing.told().stand,
            Stand::Stopping,
            "a stop is the last word"
        );
    }

    /// busctl's answer to ListJobs during `systemctl restart baton` and
    /// during a stop, as systemd 252 gave it.
    #[test]
    fn only_a_restart_job_on_our_unit_is_a_restart() {
        let job = |unit: &str, kind: &str| {
            format!(
                r#"{{"type":"a(usssoo)","data":[[[124,"{unit}","{kind}","running","/org/freedesktop/systemd1/job/124","/org/freedesktop/systemd1/unit/x"]]]}}"#
            )
        };
        let restart = job("baton.service", "restart");
        assert_eq!(restart_job(restart.as_bytes(), "baton.service"), Some(true));
        let stop = job("baton.service", "stop");
        assert_eq!(restart_job(stop.as_bytes(), "baton.service"), Some(false));
        let other = job("nginx.service", "restart");
        assert_eq!(restart_job(other.as_bytes(), "baton.service"), Some(false));
        let none = r#"{"type":"a(usssoo)","data":[[]]}"#;
        assert_eq!(restart_job(none.as_bytes(), "baton.service"), Some(false));
        assert_eq!(restart_job(b"Failed to connect", "baton.service"), None);
    }

    /// A stop that needs two hours asks systemd for two hours: in the 32
    /// bits sd-notify's state takes, it asked for 71 minutes, and systemd
    /// SIGKILLed the drain there.
    #[test]
    fn a_long_stop_asks_for_all_it_needs() {
        assert_eq!(
            extend_timeout(Duration::from_secs(7200)),
            "EXTEND_TIMEOUT_USEC=7200000000"
        );
        assert_eq!(
            extend_timeout(Duration::from_millis(1500)),
            "EXTEND_TIMEOUT_USEC=1500000"
        );
    }
}
