//! sd_notify, the only way baton talks to systemd. Every call is a no-op
//! when `NOTIFY_SOCKET` is unset (not under systemd), and a failure to
//! notify is logged, never fatal: serving traffic matters more.

use sd_notify::NotifyState;

fn notify(states: &[NotifyState]) {
    if let Err(err) = sd_notify::notify(false, states) {
        tracing::warn!(cause = %err, "sd_notify failed");
    }
}

pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    notify(&[NotifyState::Status(status)]);
}

/// A real stop; never sent by an old generation draining after a reload.
pub fn stopping() {
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: draining"),
    ]);
}

pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// Names the process systemd should treat as the service's main one.
pub fn main_pid(pid: u32) {
    notify(&[NotifyState::MainPid(pid)]);
}

/// Whether we run under systemd's notify protocol at all.
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// Keeps a listening socket in systemd's fd store under `name`, so a
/// `systemctl restart` keeps the kernel socket (and its queue) open across
/// the gap. Storing the same socket again is harmless (systemd dedups).
pub fn store_fd(name: &str, fd: std::os::fd::BorrowedFd<'_>) {
    let states = [NotifyState::FdStore, NotifyState::FdName(name)];
    if let Err(err) = sd_notify::notify_with_fds(false, &states, &[fd]) {
        tracing::warn!(cause = %err, name, "cannot store fd with systemd");
    }
}

/// Drops a stored socket the config no longer names.
pub fn remove_stored_fd(name: &str) {
    notify(&[
        NotifyState::Custom("FDSTOREREMOVE=1"),
        NotifyState::FdName(name),
    ]);
}

/// Pings the watchdog at half of `WATCHDOG_USEC` until `stop`, from a task
/// on the runtime, so a stuck runtime stops the pings.
pub async fn watchdog(stop: tokio_util::sync::CancellationToken) {
    let Some(usec) = watchdog_usec() else {
        return;
    };
    let period = std::time::Duration::from_micros(usec / 2);
    loop {
        notify(&[NotifyState::Watchdog]);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
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
