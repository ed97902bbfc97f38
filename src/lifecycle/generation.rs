//! Generation N+1 from generation N's point of view ([`hand_over`]) and the
//! reverse ([`Parent`]). N starts N+1 from the executable path on disk, offers
//! it every listening socket, and only after N+1 says `Ready` does N let it
//! accept, and name it to systemd once it does. Any failure before `Accepting` kills N+1 and
//! leaves N exactly as it was. N+1 is started detached and held by pidfd
//! ([`super::process`] says why).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::process::Signal;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::departure::{Departure, StopBudget};
use super::handoff::{
    self, BackendCarry, Channel, HandoffError, Message, Report, ResolvedCarry, SocketEntry, ENV_FD,
};
use super::inventory::Inventory;
use super::process::{self, Named, Process};
use super::systemd;
use crate::exit::Exit;
use crate::tls::tickets::TicketKeys;

/// How to start the next generation: the path and arguments this one was
/// started with (the path is read at start, so an upgrade's new file runs).
#[derive(Debug, Clone)]
pub struct Exec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl Exec {
    pub fn of_this_process() -> std::io::Result<Exec> {
        let mut args = std::env::args_os();
        let argv0 = args.next().map(PathBuf::from);
        let program = match argv0 {
            Some(p) if p.is_absolute() => p,
            _ => std::env::current_exe()?,
        };
        Ok(Exec {
            program,
            args: args.collect(),
        })
    }
}

/// A new generation that has taken over accepting.
pub struct Successor {
    pub process: Process,
    /// Names of the sockets it took over (under these names or new ones);
    /// the others are ours to close.
    pub adopted: Vec<String>,
    /// Still open: our drain reports its counters to the successor here,
    /// and it tells us how it ends.
    pub channel: Arc<Channel>,
    /// It takes the word to stop ([`Message::Stop`]); an earlier release
    /// is sent SIGTERM.
    hears_stop: bool,
    /// How long its ordered stop may take, if it said.
    pub stop_budget: Option<Duration>,
    /// It sends [`Message::Leaving`] as it exits.
    tells_its_end: bool,
    /// `adopted` names every socket it took (see [`Message::Ready`]).
    pub names_every_socket: bool,
}

/// How a successor heard that the service stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopPassed {
    /// By [`Message::Stop`]: it leaves outliving the others to us.
    Word,
    /// By SIGTERM (a release that does not take the word).
    Signal,
}

impl Successor {
    /// The service stops, and the stop caught us handing over: the
    /// successor stops too. Under systemd the stop's SIGTERM reaches it as
    /// well; a word it takes as that same stop, where a second SIGTERM
    /// would force its connections closed.
    pub async fn pass_on_stop(&self) -> std::io::Result<StopPassed> {
        if self.hears_stop {
            match self.channel.send(&Message::Stop, &[]).await {
                Ok(()) => return Ok(StopPassed::Word),
                Err(err) => {
                    tracing::warn!(cause = %err, "could not pass the stop on by word; signalling")
                }
            }
        }
        self.process
            .signal(Signal::TERM)
            .map(|()| StopPassed::Signal)
    }

    /// Starts listening for how it ends, for as long as we outlive it,
    /// and for the stop's budgets it passes down (kept in `budget`, if
    /// any: a successor that stops with us passes none).
    pub fn listen_for_its_end(
        &self,
        budget: Option<Arc<StopBudget>>,
    ) -> std::io::Result<Departure> {
        Departure::listen(&self.channel, &self.process, self.tells_its_end, budget)
    }
}

/// Kills the child unless disarmed: a handoff that fails, or is abandoned
/// (a stop aborts the reload task), never leaves it running.
struct KillGuard<'a> {
    process: Option<&'a Process>,
}

impl Drop for KillGuard<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.process {
            let _ = p.signal(Signal::KILL);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Channel(#[from] HandoffError),
    #[error("new generation failed: {reason}")]
    Failed { exit_code: i32, reason: String },
    /// Its exit status is its parent's (a detached grandchild's): baton's
    /// log has its last lines.
    #[error("new generation (pid {pid}) exited before it took over, without saying why: its last lines are in baton's log (journalctl -u baton under systemd)")]
    Exited { pid: u32 },
    #[error("new generation was not ready within {0:?}; it was killed")]
    Timeout(Duration),
    #[error("new generation did not say it accepts within {0:?} of the go-ahead; it was killed")]
    NotAccepting(Duration),
    #[error(
        "new generation sent a \"{0}\" message out of turn: are both generations the same release?"
    )]
    OutOfTurn(&'static str),
    /// The reload's own task failed (a panic): a bug of baton's.
    #[error("the reload failed inside this generation (a bug of baton's; please report it): {0}")]
    Internal(String),
    #[error("a stop began before the new generation was ready; it was killed")]
    Abandoned,
    /// Said by N+1, whose ready N neither answered nor killed it for.
    #[error("the old generation gave no go-ahead within {0:?} of our ready (it does at once, or kills us: is it frozen, by SIGSTOP, a debugger or a frozen cgroup?); giving up, so the old generation serves on once it runs again")]
    NoGoAhead(Duration),
    #[error("baton runs as PID 1 (a container without an init) with no keeper (BATON_KEPT set, or the keeper could not be made: the log says why), where a new generation would be killed when this one exits; start `baton run` without BATON_KEPT (it then keeps its generations), or replace the container")]
    Pid1,
    #[error("PID 1 is {init:?}, a container's init that exits when its one child does (baton's parent, or a shell between them that exits with baton), and no keeper runs (BATON_KEPT set, or the keeper could not be made: the log says why): a new generation would be killed when this one exits; start `baton run` without BATON_KEPT (it then keeps its generations), or replace the container")]
    InitExitsWithUs { init: String },
}

impl HandoverError {
    /// How `baton reload` ends (an invalid config is 78 still).
    pub fn exit_code(&self) -> Exit {
        match self {
            HandoverError::Failed { exit_code, .. }
                if Exit::from_code(*exit_code) == Exit::Config =>
            {
                Exit::Config
            }
            _ => Exit::Failure,
        }
    }
}

/// What generation N offers: the next number, sockets by name (our own
/// duplicates, closed after sending), and the pids of generations already
/// draining.
pub struct Offer {
    pub generation: u64,
    pub sockets: Vec<(SocketEntry, OwnedFd)>,
    pub draining: Vec<Named>,
    pub backends: Vec<BackendCarry>,
    pub report: Report,
    pub tickets: TicketKeys,
    /// The last good DNS answers of named backends.
    pub resolved: Vec<ResolvedCarry>,
    /// N's start is over (see [`Message::Offer`]'s `started`).
    pub started: bool,
    /// What N+1 is told with the go-ahead, taken then.
    pub at_go_ahead: Box<dyn Fn() -> GoAhead + Send>,
}

/// Backend states and counters as they are when N+1 is told to go ahead:
/// the offer's are as old as N+1's start.
pub struct GoAhead {
    /// Each backend's admin state and health verdict.
    pub backends: Vec<BackendCarry>,
    /// Absent from an older release: the offer's then stands.
    pub report: Option<Report>,
}

/// Runs the whole handoff from N's side, bounded by `ready_timeout`.
/// `abandon` (a stop beginning) kills N+1 if it comes before N+1 is told
/// to accept; after that the handoff completes, and stopping N+1 too is the
/// caller's part.
pub async fn hand_over(
    exec: &Exec,
    offer: Offer,
    ready_timeout: Duration,
    abandon: CancellationToken,
) -> Result<Successor, HandoverError> {
    // The new generation is started detached, so it is the reaper's child:
    // ours, as PID 1, and the kernel kills all of a PID namespace when its
    // PID 1 exits, at the end of our drain; or a container's minimal init,
    // which exits when we do, its one child.
    if std::process::id() == 1 {
        return Err(HandoverError::Pid1);
    }
    if let Some(init) = super::keeper::init_that_exits_with_us() {
        return Err(HandoverError::InitExitsWithUs { init });
    }
    let deadline = Instant::now() + ready_timeout;
    let (channel, theirs) = Channel::pair()?;
    let mut command = Command::new(&exec.program);
    command
        .args(&exec.args)
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_FDNAMES")
        .env_remove("WATCHDOG_PID")
        .env(ENV_FD, theirs.as_raw_fd().to_string())
        .stdin(Stdio::null());
    // Before `spawn_detached`'s own step: its grandchild, the new
    // generation, inherits the flag as the middle process leaves it.
    handoff::inherited_by(&mut command, &theirs);
    // Bounded too: a spawn helper killed before it named the new process
    // leaves that process waiting for our word, and our read for its pid;
    // given up, our end of the word closes and the process exits.
    let spawned = tokio::time::timeout_at(deadline, process::spawn_detached(command))
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no new process named within ready_timeout",
            ))
        });
    let child = spawned.map_err(|source| HandoverError::Spawn {
        program: exec.program.display().to_string(),
        source,
    })?;
    drop(theirs);
    let mut guard = KillGuard {
        process: Some(&child),
    };
    tracing::info!(
        pid = child.pid(),
        generation = offer.generation,
        "started new generation"
    );
    let result = converse(
        &channel,
        &child,
        offer,
        Limits {
            deadline,
            ready_timeout,
            abandon,
        },
    )
    .await;
    match result {
        Ok(Takeover {
            adopted,
            renamed,
            hears_stop,
            stop_budget,
            tells_its_end,
            names_every_socket,
        }) => {
            guard.process = None;
            drop(guard);
            Ok(Successor {
                process: child,
                adopted: [adopted, renamed].concat(),
                channel: Arc::new(channel),
                hears_stop,
                stop_budget,
                tells_its_end,
                names_every_socket,
            })
        }
        Err(err) => {
            // A broken channel (a hang-up, a failed send) usually means the
            // child died: say so.
            let exited = matches!(err, HandoverError::Channel(_))
                && tokio::time::timeout(Duration::from_secs(1), child.exited())
                    .await
                    .is_ok();
            drop(guard);
            Err(if exited {
                HandoverError::Exited { pid: child.pid() }
            } else {
                err
            })
        }
    }
}

/// What N+1 said of itself when it was ready.
struct Takeover {
    adopted: Vec<String>,
    /// Adopted under new names: handed over, but out of the fd store.
    renamed: Vec<String>,
    hears_stop: bool,
    stop_budget: Option<Duration>,
    tells_its_end: bool,
    names_every_socket: bool,
}

/// How long N+1 has, from the go-ahead, to take it (sent only as fast as
/// it reads) and say it accepts; and how long it waits for the go-ahead
/// once it said it is ready.
const ACCEPTING_WAIT: Duration = Duration::from_secs(10);

/// A successor's stop budget as it said it, bounded by what a config can
/// give (a pre-stop pause and a drain, each at most `LONGEST`): a larger
/// figure, from another release or a corrupt message, would overflow the
/// deadline an older generation makes of it, and panic there.
fn stop_budget(ms: u64) -> Duration {
    Duration::from_millis(ms).min(crate::config::duration::LONGEST * 2)
}

/// What ends a wait for N+1 early.
struct Limits {
    deadline: Instant,
    ready_timeout: Duration,
    abandon: CancellationToken,
}

async fn converse(
    channel: &Channel,
    child: &Process,
    offer: Offer,
    limits: Limits,
) -> Result<Takeover, HandoverError> {
    let (entries, fds): (Vec<_>, Vec<OwnedFd>) = offer.sockets.into_iter().unzip();
    let offered: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let at_go_ahead = offer.at_go_ahead;
    let message = Message::Offer {
        generation: offer.generation,
        sockets: entries,
        draining: offer.draining.iter().map(|n| n.pid).collect(),
        draining_started: offer.draining.iter().map(|n| n.started).collect(),
        backends: offer.backends,
        report: Some(offer.report),
        tickets: Some(Box::new(offer.tickets)),
        resolved: offer.resolved,
        ready_ms: Some(
            u64::try_from(
                limits
                    .deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
        ),
        started: offer.started,
    };
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
    send_offer(channel, child, &limits, &message, &borrowed).await?;
    drop(borrowed);
    drop(fds);
    let takeover = match next(channel, child, &limits, Some(&limits.abandon)).await? {
        Message::Ready {
            adopted,
            hears_stop,
            stop_budget_ms,
            tells_its_end,
            renamed,
            names_every_socket,
        } => Takeover {
            adopted,
            renamed,
            hears_stop,
            stop_budget: stop_budget_ms.map(stop_budget),
            tells_its_end,
            names_every_socket,
        },
        Message::Failed { exit_code, reason } => {
            return Err(HandoverError::Failed { exit_code, reason })
        }
        other => return Err(HandoverError::OutOfTurn(other.kind())),
    };
    let GoAhead { backends, report } = at_go_ahead();
    let commit = Message::Commit { backends, report };
    // From the go-ahead N+1 has a bound of its own, not the ready deadline,
    // which may fall just after it opened its doors (a kill then resets
    // what it took): to take the go-ahead (which carries every counter
    // series: sent only as fast as N+1 reads it), listen and start its
    // accept loops.
    let accepting = Limits {
        deadline: Instant::now() + ACCEPTING_WAIT,
        ready_timeout: ACCEPTING_WAIT,
        abandon: limits.abandon.clone(),
    };
    // A stop while it goes still abandons N+1, which has not taken it.
    let sent = bounded(
        child,
        &accepting,
        Some(&limits.abandon),
        channel.send(&commit, &[]),
    )
    .await;
    match sent {
        Err(err @ (HandoverError::Channel(_) | HandoverError::Exited { .. })) => {
            return Err(last_word(channel, err).await)
        }
        other => other.map_err(not_accepting)?,
    }
    // From here N+1 accepts: a stop no longer abandons it.
    match next(channel, child, &accepting, None).await {
        Ok(Message::Accepting) => {}
        // It could not listen on a socket it bound: we still accept.
        Ok(Message::Failed { exit_code, reason }) => {
            return Err(HandoverError::Failed { exit_code, reason })
        }
        Ok(other) => return Err(HandoverError::OutOfTurn(other.kind())),
        Err(err) => return Err(not_accepting(err)),
    }
    // Sockets N+1 did not adopt (a listener removed or moved), or adopted
    // under a new name, leave systemd's fd store now, while we are main
    // and heard:
    // left there until we exit, they would go on listening, taking
    // connections nobody accepts (a share of a SO_REUSEPORT group's).
    let dropped: Vec<String> = offered
        .into_iter()
        .filter(|name| !takeover.adopted.contains(name))
        .collect();
    systemd::FdStoreUpdate::new(dropped, Vec::new()).send();
    // N+1 is named main by the serving loop that hears this outcome
    // (`systemd::handed_over`), not here: a stop seen first there keeps
    // us main, as `Reloading::settle_for_stop` assumes.
    Ok(takeover)
}

/// A wait after the go-ahead that ran out: N+1 did not take it, or did
/// not say it accepts.
fn not_accepting(err: HandoverError) -> HandoverError {
    match err {
        HandoverError::Timeout(wait) => HandoverError::NotAccepting(wait),
        other => other,
    }
}

/// Sends the offer. A long one is only sent as fast as N+1 reads it, so
/// the wait is bounded like any other; an N+1 that broke off says why.
async fn send_offer(
    channel: &Channel,
    child: &Process,
    limits: &Limits,
    message: &Message,
    fds: &[BorrowedFd<'_>],
) -> Result<(), HandoverError> {
    let sent = bounded(
        child,
        limits,
        Some(&limits.abandon),
        channel.send(message, fds),
    )
    .await;
    match sent {
        Err(err @ (HandoverError::Channel(_) | HandoverError::Exited { .. })) => {
            Err(last_word(channel, err).await)
        }
        other => other,
    }
}

/// The child's next message, unless it exits, the deadline passes or
/// `abandon` fires first.
async fn next(
    channel: &Channel,
    child: &Process,
    limits: &Limits,
    abandon: Option<&CancellationToken>,
) -> Result<Message, HandoverError> {
    let received = bounded(child, limits, abandon, async {
        channel.recv().await.map(|(message, _)| message)
    })
    .await;
    match received {
        Err(err @ HandoverError::Exited { .. }) => Err(last_word(channel, err).await),
        other => other,
    }
}

/// `step` on the channel, unless the child exits, the deadline passes or
/// `abandon` fires first.
async fn bounded<T>(
    child: &Process,
    limits: &Limits,
    abandon: Option<&CancellationToken>,
    step: impl std::future::Future<Output = Result<T, HandoffError>>,
) -> Result<T, HandoverError> {
    let abandoned = async {
        match abandon {
            Some(token) => token.cancelled().await,
            None => std::future::pending().await,
        }
    };
    // Biased: a child that says why it fails and then exits has its message
    // queued before its exit is seen, so the message is read first.
    tokio::select! {
        biased;
        done = step => done.map_err(HandoverError::from),
        () = child.exited() => Err(HandoverError::Exited { pid: child.pid() }),
        () = tokio::time::sleep_until(limits.deadline) => Err(HandoverError::Timeout(limits.ready_timeout)),
        () = abandoned => Err(HandoverError::Abandoned),
    }
}

/// Why the child broke off, if it said so before it went: its `Failed`
/// (still queued for us to read), else `err`.
async fn last_word(channel: &Channel, err: HandoverError) -> HandoverError {
    match tokio::time::timeout(Duration::from_millis(200), channel.recv()).await {
        Ok(Ok((Message::Failed { exit_code, reason }, _))) => {
            HandoverError::Failed { exit_code, reason }
        }
        _ => err,
    }
}

/// What a new generation starts from beside its config: its number, the
/// sockets it may adopt, and what the older generation carried over. Taken
/// from the offer once ([`Parent::receive`]), so nothing else reads the
/// offer's parts; a first start has [`Inheritance::default`] or, under
/// systemd, [`Inheritance::from_systemd`].
pub struct Inheritance {
    pub generation: u64,
    /// Listening sockets, claimed by name (see [`super::endpoint::listen`]).
    pub sockets: Inventory,
    /// Generations draining now, the offering one last: held from the
    /// moment we learn of them, so a later signal reaches no other process.
    pub draining: Vec<Process>,
    pub backends: Vec<BackendCarry>,
    /// The old generation's counters and live generations at the offer.
    pub report: Report,
    /// Its session-ticket keys (none from a release without them).
    pub tickets: Option<TicketKeys>,
    /// Its last good DNS answers (none from a release without them).
    pub resolved: Vec<ResolvedCarry>,
    /// When the old generation stops waiting for us to be ready, by its
    /// own `ready_timeout`: a reload that raises it takes effect from the
    /// next reload, not this one (none on a first start, or from a
    /// release that does not say).
    pub ready_by: Option<Instant>,
    /// The generation we took over from had said `READY=1` (false on a
    /// first start, which has no such generation).
    pub predecessor_started: bool,
}

impl Default for Inheritance {
    /// A first start: generation 1, nothing handed over.
    fn default() -> Self {
        Inheritance {
            generation: 1,
            sockets: Inventory::default(),
            draining: Vec::new(),
            backends: Vec::new(),
            report: Report::default(),
            tickets: None,
            resolved: Vec::new(),
            ready_by: None,
            predecessor_started: false,
        }
    }
}

impl Inheritance {
    /// A first start with whatever sockets systemd passed (socket
    /// activation or its fd store); passed sockets that cannot be taken
    /// are ignored, and the config's are bound instead.
    pub fn from_systemd() -> Inheritance {
        let passed = super::handoff::from_systemd()
            .and_then(|(entries, fds)| Inventory::new(entries, fds).map_err(std::io::Error::other));
        let sockets = match passed {
            Ok(inventory) => {
                if !inventory.is_empty() {
                    tracing::info!(sockets = inventory.len(), "adopting sockets from systemd");
                }
                inventory
            }
            Err(err) => {
                tracing::warn!(cause = %err, "ignoring sockets passed by systemd");
                Inventory::default()
            }
        };
        Inheritance {
            sockets,
            ..Inheritance::default()
        }
    }
}

/// Generation N as seen from N+1, between the offer and `Accepting`: the
/// conversation only (what N offered is the [`Inheritance`]).
pub struct Parent {
    channel: Channel,
}

impl Parent {
    /// Reads the offer. One that cannot be read (its fds cut short by our
    /// fd limit, a malformed message) is said to the old generation, so
    /// the reload it answers names the cause, not an exit.
    pub async fn receive(channel: Channel) -> Result<(Parent, Inheritance), HandoverError> {
        let parent = Parent { channel };
        match parent.read_offer().await {
            Ok(inheritance) => Ok((parent, inheritance)),
            // Gone: nobody to tell.
            Err(err @ HandoverError::Channel(HandoffError::Closed)) => Err(err),
            Err(err) => {
                let reason = format!("cannot read the old generation's offer: {err}");
                parent.fail(err.exit_code(), &reason).await;
                Err(err)
            }
        }
    }

    async fn read_offer(&self) -> Result<Inheritance, HandoverError> {
        let channel = &self.channel;
        let received = tokio::time::timeout(Duration::from_secs(10), channel.recv()).await;
        let (message, fds) = match received {
            Ok(r) => r?,
            Err(_) => return Err(HandoverError::Timeout(Duration::from_secs(10))),
        };
        let Message::Offer {
            generation,
            sockets,
            draining,
            draining_started,
            backends,
            report,
            tickets,
            resolved,
            ready_ms,
            started,
        } = message
        else {
            return Err(HandoverError::OutOfTurn(message.kind()));
        };
        let sockets = Inventory::new(sockets, fds).map_err(|e| HandoverError::Failed {
            exit_code: Exit::Failure.code(),
            reason: e.to_string(),
        })?;
        // One that already exited cannot be opened (nor one whose pid now
        // names another process): nothing to hold.
        let started_at = draining_started.into_iter().chain(std::iter::repeat(None));
        let draining = draining
            .into_iter()
            .zip(started_at)
            .filter_map(|(pid, started)| Process::open_named(Named { pid, started }).ok())
            .collect();
        let inheritance = Inheritance {
            generation,
            sockets,
            draining,
            backends,
            report: report.unwrap_or_default(),
            tickets: tickets.map(|keys| *keys),
            resolved,
            ready_by: ready_ms.and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms))),
            predecessor_started: started,
        };
        Ok(inheritance)
    }

    /// Says we are ready (and how long our stop may take) and waits for
    /// the go-ahead to accept; returns the backend states and counters as
    /// they are now.
    pub async fn ready(
        &self,
        adopted: Vec<String>,
        renamed: Vec<String>,
        stop_budget: Duration,
    ) -> Result<GoAhead, HandoverError> {
        let ready = Message::Ready {
            adopted,
            renamed,
            hears_stop: true,
            stop_budget_ms: Some(u64::try_from(stop_budget.as_millis()).unwrap_or(u64::MAX)),
            tells_its_end: true,
            names_every_socket: true,
        };
        self.channel.send(&ready, &[]).await?;
        // A handoff stuck here is the old generation's to finish: say so.
        tracing::info!("ready; waiting for the old generation's go-ahead");
        // Bounded: a running N answers at once (or kills us, past its own
        // ready deadline). Unbounded, a frozen N had us hold its sockets,
        // and ignore a stop, for as long as it stayed frozen.
        let said = tokio::time::timeout(ACCEPTING_WAIT, self.channel.recv())
            .await
            .map_err(|_| HandoverError::NoGoAhead(ACCEPTING_WAIT))??;
        match said.0 {
            Message::Commit { backends, report } => Ok(GoAhead { backends, report }),
            other => Err(HandoverError::OutOfTurn(other.kind())),
        }
    }

    /// Confirms we accept. The channel stays open: the old generation
    /// reports its counters on it while it drains (see [`reports`]), and
    /// we tell it as we exit (see [`leaving`](crate::lifecycle::departure::leaving)).
    pub async fn accepting(self) -> Result<Arc<Channel>, HandoverError> {
        self.channel.send(&Message::Accepting, &[]).await?;
        Ok(Arc::new(self.channel))
    }

    /// Tells N why we cannot take over, before we exit with `exit`.
    pub async fn fail(&self, exit: Exit, reason: &str) {
        let message = Message::Failed {
            exit_code: exit.code(),
            reason: reason.to_string(),
        };
        if let Err(err) = self.channel.send(&message, &[]).await {
            tracing::warn!(cause = %err, "could not report failure to the old generation");
        }
    }
}

/// Reads an old generation's reports until it exits (the channel closes),
/// handing each to `on_report`; `stop` hears its word that the service
/// stops; `on_exit` runs once it is gone.
pub async fn reports(
    channel: Arc<Channel>,
    on_report: impl Fn(Report),
    stop: CancellationToken,
    on_exit: impl FnOnce(),
) {
    loop {
        match channel.recv().await {
            Ok((Message::Report(report), _)) => on_report(report),
            Ok((Message::Stop, _)) => {
                tracing::info!("the older generation says the service stops");
                stop.cancel();
            }
            Ok((other, _)) => {
                tracing::debug!(message = ?other, "unexpected message from the old generation")
            }
            Err(HandoffError::Closed) => break,
            Err(err) => {
                tracing::warn!(cause = %err, "old generation's reports ended");
                break;
            }
        }
    }
    drop(channel);
    on_exit();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts as exposition text would carry them.
    fn counted(requests: u64) -> Report {
        let text =
            format!("# TYPE baton_requests_total counter\nbaton_requests_total {requests}\n");
        Report {
            baseline: crate::metrics::exposition::baseline(&text),
            generations: Vec::new(),
        }
    }

    /// A handoff with nothing to hand over but counters: the offer's
    /// `offered`, and what `at_go_ahead` reports then; N+1 is ourselves,
    /// the other end of `ours`, which the test plays.
    struct Conversation {
        ours: Channel,
        theirs: Channel,
        us: Process,
        offer: Offer,
        limits: Limits,
    }

    impl Conversation {
        fn new(offered: Report, at_go_ahead: impl Fn() -> Report + Send + 'static) -> Conversation {
            let (ours, theirs) = Channel::pair().expect("pair");
            Conversation {
                ours,
                theirs: Channel::new(theirs).expect("wrap"),
                us: Process::open(std::process::id()).expect("a pidfd of our own"),
                offer: Offer {
                    generation: 2,
                    sockets: Vec::new(),
                    draining: Vec::new(),
                    backends: Vec::new(),
                    report: offered,
                    tickets: TicketKeys::generate().expect("ticket keys"),
                    resolved: Vec::new(),
                    started: true,
                    at_go_ahead: Box::new(move || GoAhead {
                        backends: Vec::new(),
                        report: Some(at_go_ahead()),
                    }),
                },
                limits: Limits {
                    deadline: Instant::now() + Duration::from_secs(10),
                    ready_timeout: Duration::from_secs(10),
                    abandon: CancellationToken::new(),
                },
            }
        }
    }

    /// N+1's word that it is ready.
    fn ready() -> Message {
        Message::Ready {
            adopted: Vec::new(),
            hears_stop: true,
            stop_budget_ms: None,
            tells_its_end: true,
            renamed: Vec::new(),
            names_every_socket: true,
        }
    }

    /// N's counters go with the go-ahead as they are then, not as the
    /// offer had them when N+1 started: N+1 answers `/metrics` from them
    /// if N's first report after the takeover is late, and what N counted
    /// meanwhile (and answered scrapes with) must not go back.
    #[tokio::test]
    async fn the_go_ahead_carries_the_counters_as_of_then() {
        let requests = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let now = Arc::clone(&requests);
        let c = Conversation::new(counted(1), move || {
            counted(now.load(std::sync::atomic::Ordering::SeqCst))
        });
        let successor = async {
            let Message::Offer { report, .. } = c.theirs.recv().await.expect("offer").0 else {
                panic!("an offer first");
            };
            assert_eq!(report, Some(counted(1)));
            requests.store(5, std::sync::atomic::Ordering::SeqCst);
            c.theirs.send(&ready(), &[]).await.expect("ready");
            let commit = c.theirs.recv().await.expect("commit").0;
            c.theirs
                .send(&Message::Accepting, &[])
                .await
                .expect("accepting");
            commit
        };
        let (conversed, commit) =
            tokio::join!(converse(&c.ours, &c.us, c.offer, c.limits), successor);
        conversed.expect("the handoff completes");
        assert_eq!(
            commit,
            Message::Commit {
                backends: Vec::new(),
                report: Some(counted(5)),
            }
        );
    }

    /// A go-ahead past what the socket holds (a config with many
    /// backends has as many counter series) is sent only as fast as N+1
    /// reads it: one that stopped reading after its ready is given up on
    /// after the go-ahead's own bound, not waited for without end.
    #[tokio::test(start_paused = true)]
    async fn a_go_ahead_that_is_not_taken_is_given_up_on() {
        let text: String = (0..50_000)
            .map(|i| format!("baton_requests_total{{pool=\"p{i}\"}} {i}\n"))
            .collect();
        let many = Report {
            baseline: crate::metrics::exposition::baseline(&format!(
                "# TYPE baton_requests_total counter\n{text}"
            )),
            generations: Vec::new(),
        };
        let c = Conversation::new(Report::default(), move || many.clone());
        let successor = async {
            c.theirs.recv().await.expect("offer");
            c.theirs.send(&ready(), &[]).await.expect("ready");
        };
        // Time is paused: it runs on while everything waits, so an
        // unbounded send fails here rather than hanging the test.
        let both = async { tokio::join!(converse(&c.ours, &c.us, c.offer, c.limits), successor) };
        let (conversed, ()) = tokio::time::timeout(Duration::from_secs(60), both)
            .await
            .expect("given up on within the go-ahead's bound");
        assert!(
            matches!(conversed, Err(HandoverError::NotAccepting(_))),
            "{:?}",
            conversed.err()
        );
    }

    #[test]
    fn a_successors_stop_budget_never_overflows_a_deadline() {
        assert_eq!(stop_budget(5_500), Duration::from_millis(5_500));
        let most = stop_budget(u64::MAX);
        assert!(Instant::now().checked_add(most).is_some(), "{most:?}");
    }
}
