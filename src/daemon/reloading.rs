//! A reload under way, as the serving loop holds it: the handoff task, when
//! it began, and the token a stop uses to abandon it. Dropping a tokio
//! `JoinHandle` detaches its task, so a stop must settle the handoff
//! explicitly: before N+1 is told to accept it is killed; after, the
//! handoff completes and N+1 is stopped too. Either way no generation is
//! left running that nobody reaches.
//!
//! It also holds the draining generations beyond `reload.max_draining`:
//! forced only once the handoff succeeds, so a reload that fails (a typo
//! in the config) cuts nobody's connections; given back otherwise, and to
//! a stop (which waits for them).

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lifecycle::departure::Departure;
use crate::lifecycle::generation::{HandoverError, StopPassed, Successor};
use crate::lifecycle::process::Process;

/// A reload settled for a stop (see [`Reloading::settle_for_stop`]).
pub(super) struct Settled {
    /// What the reload's requester is told.
    pub said: String,
    /// Until when our stop waits for the new generation, if it stops too.
    pub outlive_until: Option<Instant>,
    /// How the new generation ends, once it has, if it took over.
    pub departure: Option<Departure>,
}

pub(super) struct Reloading {
    handle: JoinHandle<Result<Successor, HandoverError>>,
    pub started: Instant,
    abandon: CancellationToken,
    /// The oldest draining generations, one too many once this succeeds.
    beyond_max: Vec<Process>,
}

impl Reloading {
    /// `start` gets the token that abandons the handoff; `beyond_max` are
    /// the draining generations to force once it has succeeded.
    pub fn begin(
        start: impl FnOnce(CancellationToken) -> JoinHandle<Result<Successor, HandoverError>>,
        beyond_max: Vec<Process>,
    ) -> Reloading {
        let abandon = CancellationToken::new();
        Reloading {
            handle: start(abandon.clone()),
            started: Instant::now(),
            abandon,
            beyond_max,
        }
    }

    /// The handoff succeeded: one generation more drains, so the oldest
    /// beyond `max_draining` are forced to close.
    pub fn force_beyond_max(self) {
        for oldest in self.beyond_max {
            tracing::info!(
                pid = oldest.pid(),
                "too many generations draining; forcing the oldest to close"
            );
            let _ = oldest.signal(rustix::process::Signal::USR2);
        }
    }

    /// The handoff failed: the generations it would have forced drain on,
    /// oldest first, as they were.
    pub fn give_back(self, draining: &mut Vec<Process>) {
        draining.splice(0..0, self.beyond_max);
    }

    /// The handoff's outcome, once it has one.
    pub async fn finished(&mut self) -> Result<Successor, HandoverError> {
        (&mut self.handle)
            .await
            .unwrap_or_else(|e| Err(HandoverError::Internal(format!("reload task: {e}"))))
    }

    /// For a stop: abandons the handoff, or waits for it to complete and
    /// asks the new generation to stop as well. Returns what the reload's
    /// requester is told, until when to wait for the new generation, and
    /// how to hear its end.
    /// A new generation told by word joins `draining`: systemd took no
    /// `MAINPID=` once its stop began, so we are still its main process,
    /// and must exit last (once the main process exits, systemd signals
    /// what is left of the unit again, which a stopping generation takes
    /// as "force now"). Its stop, by its own config, may end later than
    /// ours: the wait lasts its budget, from now, when it begins.
    pub async fn settle_for_stop(mut self, draining: &mut Vec<Process>) -> Settled {
        self.abandon.cancel();
        let outcome = self.finished().await;
        self.settle(outcome, draining).await
    }

    /// [`Self::settle_for_stop`] with the handoff's outcome in hand: the
    /// serving loop's when a stop signal's handler had run by the time it
    /// took a success, its command not yet heard.
    pub async fn settle(
        self,
        outcome: Result<Successor, HandoverError>,
        draining: &mut Vec<Process>,
    ) -> Settled {
        match outcome {
            Ok(successor) => {
                let pid = successor.process.pid();
                tracing::info!(
                    pid,
                    "a stop began as the new generation took over; stopping it too"
                );
                let passed = successor.pass_on_stop().await;
                if let Err(err) = &passed {
                    tracing::warn!(pid, cause = %err, "could not ask the new generation to stop");
                }
                // Stopping, the oldest drain to the stop's end, not forced.
                self.give_back(draining);
                let mut outlive_until = None;
                // Stopping: no later reload's budget will come down.
                let departure = super::end::listen_for_its_end(&successor, None);
                if matches!(passed, Ok(StopPassed::Word)) {
                    outlive_until = successor.stop_budget.map(|budget| Instant::now() + budget);
                    draining.push(successor.process);
                }
                Settled {
                    said: format!(
                        "reload completed as a stop began; generation pid {pid} is stopping too"
                    ),
                    outlive_until,
                    departure,
                }
            }
            Err(err) => {
                tracing::info!(cause = %err, "reload abandoned for the stop");
                self.give_back(draining);
                Settled {
                    said: format!("reload abandoned: {err}"),
                    outlive_until: None,
                    departure: None,
                }
            }
        }
    }
}
