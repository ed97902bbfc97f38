//! A new generation's end, told to the one it took over from: N+1 sends
//! [`Message::Leaving`] with its exit code as it exits, and N, if it
//! still runs, folds it into its own. Why: until systemd takes N's
//! `MAINPID=` (at once on systemd 252 with cgroup v2; a systemd that
//! ignores it during `ExecReload=` takes a repetition after), N is the
//! unit's main process; an N+1 that crashes then would otherwise be
//! followed by N's clean exit, and systemd would take the service for
//! stopped on purpose, with no restart. Likewise a stop that caught a
//! reload: N, still main, exits last, and N+1's forced connections must
//! show in its exit code.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::handoff::{Channel, HandoffError, Message};
use super::process::Process;
use crate::exit::Exit;

/// What we hear of a successor's end (see [`Message::Leaving`]).
pub struct Departure {
    process: Process,
    heard: tokio::task::JoinHandle<Option<Exit>>,
}

/// How long a successor that has exited may take to be heard: its word,
/// or its end of the channel closing, is already in our socket's queue.
const LAST_WORD_WAIT: Duration = Duration::from_secs(1);

/// How long the service's stop may take, as the serving generation
/// counts it: what a draining generation ends a stop's drain by. Set at
/// the handoff from the successor's word, and again whenever a later
/// reload's budget comes down the chain ([`Message::StopBudget`]), which
/// goes on to the generation we took over from, if it still drains.
pub struct StopBudget {
    ms: watch::Sender<u64>,
}

impl StopBudget {
    /// `older`, the generation we took over from, is told this budget and
    /// each one after by a task of its own (the latest, when several came
    /// meanwhile): neither our drain nor our successor's last word waits
    /// on an older generation that is slow to read.
    pub fn new(budget: Duration, older: Option<Arc<Channel>>) -> Arc<StopBudget> {
        let (ms, told) = watch::channel(millis(budget));
        if let Some(older) = older {
            tokio::spawn(pass_on(older, told));
        }
        Arc::new(StopBudget { ms })
    }

    pub fn get(&self) -> Duration {
        Duration::from_millis(*self.ms.borrow())
    }

    fn heard(&self, ms: u64) {
        self.ms.send_replace(ms);
        tracing::info!(budget = ?self.get(), "a later reload set the stop's budget");
    }
}

/// Tells `older` each budget in turn until it is gone, or we are.
async fn pass_on(older: Arc<Channel>, mut budget: watch::Receiver<u64>) {
    loop {
        let word = Message::StopBudget {
            stop_budget_ms: *budget.borrow_and_update(),
        };
        match tokio::time::timeout(LAST_WORD_WAIT, older.send(&word, &[])).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::debug!(cause = %err, "the older generation is gone");
                return;
            }
            Err(_) => {
                tracing::warn!("the older generation did not take the stop's budget");
                return;
            }
        }
        if budget.changed().await.is_err() {
            return;
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Departure {
    /// Listens on `channel` for the last word of `process`, which
    /// promised one if `tells_its_end`, and for the stop's budgets it
    /// passes down (kept in `budget`).
    pub(super) fn listen(
        channel: &Arc<Channel>,
        process: &Process,
        tells_its_end: bool,
        budget: Option<Arc<StopBudget>>,
    ) -> std::io::Result<Departure> {
        Ok(Departure {
            process: process.try_clone()?,
            heard: tokio::spawn(hear_the_end(
                Arc::clone(channel),
                process.pid(),
                tells_its_end,
                budget,
            )),
        })
    }

    /// How the successor ended, as our exit code should count it: `None`
    /// while it runs, or when it left without a word it never promised (an
    /// earlier release); [`Exit::Failure`] when it promised one and was
    /// killed or crashed.
    pub async fn ended(self) -> Option<Exit> {
        // Its word may be in while it still winds down its runtime.
        if self.heard.is_finished() {
            return self.heard.await.ok().flatten();
        }
        if self.process.is_alive() {
            self.heard.abort();
            return None;
        }
        match tokio::time::timeout(LAST_WORD_WAIT, self.heard).await {
            Ok(Ok(end)) => end,
            _ => None,
        }
    }
}

/// Reads the successor's side of the channel until its last word, or
/// until it closes without one.
async fn hear_the_end(
    channel: Arc<Channel>,
    pid: u32,
    tells_its_end: bool,
    budget: Option<Arc<StopBudget>>,
) -> Option<Exit> {
    loop {
        match channel.recv().await {
            Ok((Message::Leaving { exit_code }, _)) => {
                tracing::info!(pid, exit_code, "the new generation exited");
                return Some(Exit::from_code(exit_code));
            }
            Ok((Message::StopBudget { stop_budget_ms }, _)) => {
                if let Some(budget) = &budget {
                    budget.heard(stop_budget_ms);
                }
            }
            Ok((other, _)) => {
                tracing::debug!(message = ?other, "unexpected message from the new generation")
            }
            Err(HandoffError::Closed) if tells_its_end => {
                tracing::error!(
                    pid,
                    "the new generation ended without a word: it was killed or crashed"
                );
                return Some(Exit::Failure);
            }
            Err(HandoffError::Closed) => return None,
            Err(err) => {
                tracing::warn!(cause = %err, "the new generation's channel broke");
                return None;
            }
        }
    }
}

/// Our exit code once told how the generation we handed over to ended:
/// the last of the two to exit speaks for the service, so its crash is a
/// failure and its forced connections are forced ones.
pub async fn exit_with_successor(own: Exit, successor: Option<Departure>) -> Exit {
    let ended = match successor {
        Some(departure) => departure.ended().await,
        None => None,
    };
    folded(own, ended)
}

fn folded(own: Exit, successor: Option<Exit>) -> Exit {
    match (own, successor) {
        (_, Some(Exit::Failure)) => Exit::Failure,
        (Exit::Clean, Some(Exit::Forced)) => Exit::Forced,
        (own, _) => own,
    }
}

/// Tells the generation we took over from, if it still runs, how we exit
/// (see [`Message::Leaving`]). Bounded: one that stopped reading must not
/// hold our exit.
pub async fn leaving(channel: &Channel, exit: Exit) {
    let word = Message::Leaving {
        exit_code: exit.code(),
    };
    match tokio::time::timeout(LAST_WORD_WAIT, channel.send(&word, &[])).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::debug!(cause = %err, "the older generation is gone"),
        Err(_) => tracing::warn!("the older generation did not take our last word"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_successors_crash_and_forced_connections_show_in_our_exit() {
        let cases = [
            (Exit::Clean, None, Exit::Clean),
            (Exit::Clean, Some(Exit::Clean), Exit::Clean),
            (Exit::Clean, Some(Exit::Forced), Exit::Forced),
            (Exit::Clean, Some(Exit::Failure), Exit::Failure),
            (Exit::Forced, Some(Exit::Clean), Exit::Forced),
            (Exit::Forced, Some(Exit::Failure), Exit::Failure),
            (Exit::Failure, Some(Exit::Forced), Exit::Failure),
        ];
        for (own, successor, expected) in cases {
            assert_eq!(
                folded(own, successor),
                expected,
                "{own:?} with {successor:?}"
            );
        }
    }
}
