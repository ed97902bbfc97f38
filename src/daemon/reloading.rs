//! A reload under way, as the serving loop holds it: the handoff task, when
//! it began, and the token a stop uses to abandon it. Dropping a tokio
//! `JoinHandle` detaches its task, so a stop must settle the handoff
//! explicitly: before N+1 is told to accept it is killed; after, the
//! handoff completes and N+1 is stopped too. Either way no generation is
//! left running that nobody reaches.

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lifecycle::generation::{HandoverError, Successor};

pub(super) struct Reloading {
    handle: JoinHandle<Result<Successor, HandoverError>>,
    pub started: Instant,
    abandon: CancellationToken,
}

impl Reloading {
    /// `start` gets the token that abandons the handoff.
    pub fn begin(
        start: impl FnOnce(CancellationToken) -> JoinHandle<Result<Successor, HandoverError>>,
    ) -> Reloading {
        let abandon = CancellationToken::new();
        Reloading {
            handle: start(abandon.clone()),
            started: Instant::now(),
            abandon,
        }
    }

    /// The handoff's outcome, once it has one.
    pub async fn finished(&mut self) -> Result<Successor, HandoverError> {
        (&mut self.handle)
            .await
            .unwrap_or_else(|e| Err(HandoverError::OutOfTurn(format!("reload task: {e}"))))
    }

    /// For a stop: abandons the handoff, or waits for it to complete and
    /// asks the new generation to stop as well. Returns what the reload's
    /// requester is told.
    pub async fn settle_for_stop(mut self) -> String {
        self.abandon.cancel();
        match self.finished().await {
            Ok(successor) => {
                let pid = successor.process.pid();
                tracing::info!(
                    pid,
                    "a stop began as the new generation took over; stopping it too"
                );
                if let Err(err) = successor.process.signal(rustix::process::Signal::TERM) {
                    tracing::warn!(pid, cause = %err, "could not ask the new generation to stop");
                }
                format!("reload completed as a stop began; generation pid {pid} is stopping too")
            }
            Err(err) => {
                tracing::info!(cause = %err, "reload abandoned for the stop");
                format!("reload abandoned: {err}")
            }
        }
    }
}
