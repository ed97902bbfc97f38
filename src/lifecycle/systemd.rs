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
