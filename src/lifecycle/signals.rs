//! Signals mapped to intent in one place. This module only translates; the
//! supervisor in `daemon` decides what each command does in each phase.

use tokio::signal::unix::{signal, Signal, SignalKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// SIGHUP: start a new generation.
    Reload,
    /// SIGTERM or SIGINT: the ordered stop (a second one forces).
    Stop,
    /// SIGUSR2: a draining generation force-closes what it still holds now
    /// (a newer generation sends it when `reload.max_draining` is exceeded).
    /// A serving generation ignores it.
    ForceDrain,
}

/// SIGUSR1 (logrotate's `systemctl kill --signal=USR1 baton`, which reaches
/// every process of the unit) must never kill a baton process, and its
/// default action is to: a `baton reload` run by `ExecReload`, a `baton
/// check` run by `ExecStartPre`, a new generation before its handlers are
/// in place. So every baton process blocks it first thing (a blocked
/// signal waits, and the mask survives `exec`, so a new generation is
/// covered from its first instruction); only a generation that reopens
/// logs on it lets it through, once its handler is installed.
pub fn hold_sigusr1() {
    let _ = usr1().thread_block();
}

fn usr1() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGUSR1);
    set
}

pub struct Signals {
    hup: Signal,
    term: Signal,
    int: Signal,
    usr1: Signal,
    usr2: Signal,
    /// What SIGUSR1 does (reopen the access logs), in whatever phase the
    /// generation is: logrotate's signal must never wait for a phase.
    reopen: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Signals {
    /// Installs every handler; called first thing, so a SIGHUP during
    /// start-up is never the default "terminate".
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
            reopen: None,
        })
        .inspect(|_| {
            // The handler is in place: this thread may take SIGUSR1 now
            // (threads created later inherit that and may take it too; the
            // thread that spawns a new generation blocks it again first).
            let _ = usr1().thread_unblock();
        })
    }

    /// Runs `hook` at every SIGUSR1 from now on.
    pub fn on_reopen(&mut self, hook: impl Fn() + Send + Sync + 'static) {
        self.reopen = Some(Box::new(hook));
    }

    /// The next signal that means something; stray ones are logged here.
    pub async fn recv(&mut self) -> Command {
        loop {
            tokio::select! {
                _ = self.hup.recv() => return Command::Reload,
                _ = self.term.recv() => return Command::Stop,
                _ = self.int.recv() => return Command::Stop,
                _ = self.usr1.recv() => match &self.reopen {
                    Some(reopen) => {
                        tracing::info!(signal = "SIGUSR1", "reopening the access logs");
                        reopen();
                    }
                    None => tracing::info!(signal = "SIGUSR1", "ignored signal"),
                },
                _ = self.usr2.recv() => return Command::ForceDrain,
            }
        }
    }
}
