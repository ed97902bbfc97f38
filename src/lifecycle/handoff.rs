//! The fd handoff between generation N and N+1: versioned JSON messages and
//! SCM_RIGHTS fds over a SOCK_SEQPACKET socketpair that N+1 inherits at spawn
//! (no named socket ever hands out fds). Its `unsafe` turns raw fds the
//! kernel gave us into owned ones, and clears the inherited end's
//! close-on-exec flag between fork and exec.
//!
//! The conversation, driven by `generation`:
//! ```text
//! N → N+1  Offer { generation, sockets, draining, backends, report,
//!                 tickets, resolved } + fds (same order)
//! N+1 → N  Ready | Failed { exit_code, reason }
//! N → N+1  Commit { backends, report }  (backend states and counters as
//!                             of now: an admin drain posted while N+1 was
//!                             starting is not lost, nor what N counted)
//! N+1 → N  Accepting         (N tells systemd MAINPID=N+1, stops accepting
//!                             and drains)
//! N → N+1  Stop              (only when a stop caught N handing over: the
//!                             service stops, N+1 with it)
//! N+1 → N  Leaving { exit_code }  (as N+1 exits, if N still runs: N's
//!                             exit code tells what became of the service)
//! N+1 → N  StopBudget { .. }  (once N+1 handed over in turn: the stop's
//!                             budget now; N passes it on to N-1)
//! ```
//!
//! A message of any length travels: `framing` cuts a long one into pieces
//! and puts it back together. Callers send and receive whole messages.
#![allow(unsafe_code)]

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::Mutex;

use super::framing::{self, Reassembly, MAX_MESSAGE};

/// Bumped only when one release cannot read another's messages (a field
/// removed, renamed or retyped): a field added with a serde default keeps
/// it, and both an upgrade and a rollback take over by reload. A mismatch
/// fails the reload cleanly, and only a restart takes over.
pub const PROTOCOL_VERSION: u32 = 1;
/// The environment variable naming the inherited socketpair end in N+1.
pub const ENV_FD: &str = "BATON_HANDOFF_FD";
/// At most this many fds travel in one datagram (the kernel's SCM_MAX_FD is
/// 253); a message with more spreads them over its pieces (`framing`).
pub const MAX_FDS: usize = 250;
/// The longest datagram read: above any piece `framing` cuts, and above
/// any whole message an earlier release could send in one datagram.
const MAX_DATAGRAM: usize = 1024 * 1024;

/// One socket in an offer: its listener name and the address it is bound to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SocketEntry {
    pub name: String,
    pub addr: String,
}

/// A backend's operator state and health verdict, carried to the next
/// generation so a reload neither undoes a drain nor starts health from zero.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendCarry {
    pub pool: String,
    pub name: String,
    pub address: String,
    pub admin: CarriedAdmin,
    pub healthy: Option<bool>,
    /// The checks in a row against that verdict (passes while down,
    /// failures while up): carried too, or a reload would send a backend
    /// rising or falling back to zero, and reloads closer together than
    /// `rise` intervals would keep a recovered backend down for good.
    /// Absent (0) from a release before it.
    #[serde(default)]
    pub streak: u32,
    /// What the verdict's checks asked (`Pool::checked_by`): a reload
    /// that changes the check (its path, kind, `Host`, the pool's TLS)
    /// lets its own first round decide, as for a pool that gains checks.
    /// Absent from a release before it: the verdict is carried.
    #[serde(default)]
    pub checked_by: Option<String>,
}

/// A generation's state as `/status` shows it and a report carries it (the
/// same words as before it was typed; a word a newer release sends and
/// this one does not know reads as `unknown`, not a failed report).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GenerationState {
    Starting,
    Active,
    Draining,
    #[serde(other)]
    #[default]
    Unknown,
}

/// A backend's admin state as it crosses to the next generation (the same
/// words as before it was typed, so older releases read it). A state a
/// newer release knows and this one does not is taken as draining (see
/// `daemon::build::carried_admin`), not a failed handoff.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CarriedAdmin {
    Enabled,
    Draining,
    Out,
    #[serde(other)]
    Unknown,
}

/// The last good DNS answer for a named backend, so the next generation
/// starts from it even when DNS is down at the reload. Matched by pool,
/// name and query (a changed query starts afresh).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResolvedCarry {
    pub pool: String,
    pub name: String,
    pub query: String,
    pub resolved: Vec<CarriedAddress>,
    /// Members gone from the answer that still serve, within their hold or
    /// since no other member of the name can take work yet (a move in
    /// progress): the next generation keeps them as long. Absent from an
    /// older release.
    #[serde(default)]
    pub serving: Vec<CarriedAddress>,
    /// How long DNS had answered that the name has no address, in ms,
    /// when it still did: the next generation's hold counts on from there.
    /// Absent from an older release.
    #[serde(default)]
    pub empty_ms: Option<u64>,
    /// How long ago DNS last answered so, in ms: a pause past twice the
    /// hold since then ends the run, in the next generation as it would
    /// have here. Absent from an older release (taken as just now).
    #[serde(default)]
    pub empty_last_ms: Option<u64>,
}

/// One address of a carried answer, as `backend::members::Resolved` holds
/// it (the same fields on the wire): the handoff speaks its own types, so
/// `lifecycle` imports nothing of the data plane.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CarriedAddress {
    pub address: std::net::SocketAddr,
    pub weight: u32,
    pub from: String,
    /// A member still serving: how long ago it left the answer, in ms, so
    /// its hold goes on counting in the next generation (0 for an address
    /// in the answer; absent from an older release).
    #[serde(default)]
    pub gone_ms: u64,
}

/// One live generation, as the newest one's `/status` and `/metrics` show it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GenerationEntry {
    pub number: u64,
    pub pid: u32,
    pub state: GenerationState,
    pub started_at: f64,
    pub in_flight: u64,
    pub drain_deadline: Option<f64>,
    /// Open connections by listener name.
    pub active: std::collections::BTreeMap<String, u64>,
    pub process: crate::metrics::process::ProcessStats,
    /// Its work in flight on each backend (see
    /// [`crate::metrics::exposition::InFlightOnBackends`]). Absent from an
    /// older release.
    #[serde(default)]
    pub backends_in_flight: crate::metrics::exposition::InFlightOnBackends,
}

/// What an older generation tells the next: its cumulative counter series
/// (its own plus everything it inherited) and the generations still alive
/// behind it, itself first. Sent with the offer, then every half second
/// while it drains, and a last time as it exits.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub baseline: crate::metrics::exposition::Baseline,
    pub generations: Vec<GenerationEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Offer {
        generation: u64,
        sockets: Vec<SocketEntry>,
        /// Pids of older generations still draining (N itself included).
        draining: Vec<u32>,
        /// Their start times, in clock ticks since boot, each where /proc
        /// told it (absent from an older release): N+1 holds one only if
        /// its pid still names the process that started then.
        #[serde(default)]
        draining_started: Vec<Option<u64>>,
        #[serde(default)]
        backends: Vec<BackendCarry>,
        #[serde(default)]
        report: Option<Report>,
        /// The TLS session-ticket keys, so tickets issued before the reload
        /// open after it (absent from an older release, or of a shape this
        /// one cannot read: new keys then).
        #[serde(default, deserialize_with = "or_none")]
        tickets: Option<Box<crate::tls::tickets::TicketKeys>>,
        /// The last good answer of each named backend (absent from an
        /// older release, or of a shape this one cannot read: the new
        /// generation resolves at start then).
        #[serde(default, deserialize_with = "or_none")]
        resolved: Vec<ResolvedCarry>,
        /// How long the old generation still waits for `Ready`, in ms, as
        /// its own `ready_timeout` says (absent from an older release).
        #[serde(default)]
        ready_ms: Option<u64>,
        /// The old generation's start is over (it said `READY=1`); absent
        /// from an older release, and taken as over. One that took over
        /// during a first start still waiting for its first health round
        /// says `READY=1` at its own round's end, as the first start would
        /// have: said at the takeover, it made the unit active before the
        /// backends were checked.
        #[serde(default = "over")]
        started: bool,
    },
    /// N+1 is ready; `adopted` names the sockets it took over (N serves
    /// the accept queue of any other before closing it).
    Ready {
        adopted: Vec<String>,
        /// N+1 takes [`Message::Stop`] (an earlier release does not, and
        /// is sent SIGTERM instead).
        #[serde(default)]
        hears_stop: bool,
        /// How long N+1's ordered stop may take (its pause, `stop_pause`, plus
        /// its `shutdown.drain_timeout`): N, outliving it after a word,
        /// waits that long, not its own budget, which a reload may have
        /// made shorter.
        #[serde(default)]
        stop_budget_ms: Option<u64>,
        /// N+1 sends [`Message::Leaving`] as it exits: one that goes
        /// without it was killed or crashed (an earlier release never
        /// sends it, and its silence means nothing).
        #[serde(default)]
        tells_its_end: bool,
        /// Old names of sockets N+1 adopted under new ones (a listener
        /// the config renamed at the same address): N closes its copies
        /// as handed over, not serving their queues, and takes the old
        /// names out of systemd's fd store, where it is heard (N+1 stores
        /// the sockets under the new names). An earlier release sends
        /// none: N serves those queues and drops the names as unadopted.
        #[serde(default)]
        renamed: Vec<String>,
        /// `adopted` and `renamed` name every socket N+1 took: N may then
        /// stop the others listening for every holder (a removed
        /// listener). An earlier release may have taken a renamed socket
        /// without naming it: N only closes its own copies then.
        #[serde(default)]
        names_every_socket: bool,
    },
    Failed {
        exit_code: i32,
        reason: String,
    },
    /// Go ahead. `backends` repeats the offer's with what changed since,
    /// `report` the offer's with what N counted since: N+1 answers
    /// `/metrics` from it if N's first report after the takeover is late,
    /// where the offer's would show counters going back. (Each absent from
    /// a release that did not send it, and ignored by one that does not
    /// read it: either way the conversation holds.)
    Commit {
        #[serde(default)]
        backends: Vec<BackendCarry>,
        #[serde(default)]
        report: Option<Report>,
    },
    Accepting,
    /// From a draining generation to its successor (see [`Report`]).
    Report(Report),
    /// The service stops, and a stop caught N handing over: N+1 stops too,
    /// unless it already does. A word, not SIGTERM, because under systemd
    /// N+1 gets the stop's own SIGTERM as well, and a second SIGTERM
    /// forces (see `signals::StopsHeard`). N stays systemd's main process
    /// (it takes no `MAINPID=` once a stop began), so N goes last: N+1
    /// does not wait for the older generations, N waits for N+1.
    Stop,
    /// From a generation to the one it took over from, as it exits: its
    /// exit code. An older generation that outlives it (draining, or the
    /// main process of a stop that caught the reload) folds it into its
    /// own: a crash of the new generation while the old one is still
    /// systemd's main process must not end the service with success.
    Leaving {
        exit_code: i32,
    },
    /// From a generation to the one it took over from, once it handed
    /// over in turn: how long the service's stop may take now, as its own
    /// successor said (`Ready`'s `stop_budget_ms`). Passed on down the
    /// chain of draining generations, each of which ends a stop's drain by
    /// the serving generation's budget: a reload that changed the budget
    /// reached only the generation it took over from, and an older one
    /// kept the budget of its own successor (a drain raised since: cut
    /// short; lowered: outliving the main process). An earlier release
    /// reads past it.
    StopBudget {
        stop_budget_ms: u64,
    },
    /// A message of a later release that this one does not know: read
    /// past ([`Channel::recv`]), so a release that adds one does not end
    /// the conversation with an earlier one (a rollback hands over to it).
    /// Never sent.
    #[serde(other)]
    Unknown,
}

impl Message {
    /// Its type as it goes on the wire: what an error says of a message
    /// out of turn (its whole contents, an offer's every backend, would
    /// bury the point).
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Offer { .. } => "offer",
            Message::Ready { .. } => "ready",
            Message::Failed { .. } => "failed",
            Message::Commit { .. } => "commit",
            Message::Accepting => "accepting",
            Message::Report(_) => "report",
            Message::Stop => "stop",
            Message::Leaving { .. } => "leaving",
            Message::StopBudget { .. } => "stop_budget",
            Message::Unknown => "unknown",
        }
    }
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    version: u32,
    #[serde(flatten)]
    message: &'a Message,
}

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("handoff channel: {0}")]
    Io(#[from] std::io::Error),
    #[error("handoff channel: {0}")]
    Sys(#[from] nix::Error),
    #[error("the other generation closed the handoff channel")]
    Closed,
    #[error("handoff protocol version {got}, this binary speaks {expected}: these two releases cannot hand over by reload, only by a restart (`systemctl restart baton`, at a time you choose: README says what it costs)")]
    Version { got: u64, expected: u32 },
    #[error("malformed handoff message: {0}")]
    Malformed(String),
    #[error("{ENV_FD}={0} does not name an inherited handoff socket")]
    BadInherited(String),
    #[error("handoff message longer than {limit} bytes")]
    TooLarge { limit: usize },
}

/// One end of the handoff socketpair.
pub struct Channel {
    fd: AsyncFd<OwnedFd>,
    /// Held for a whole send, so the pieces of two messages never interleave.
    sending: Mutex<()>,
    /// Held for a whole receive; keeps the pieces read (and fds received)
    /// of a message across `recv` calls (see [`Reassembly`]).
    inbox: Mutex<Inbox>,
}

/// Has `command`'s process inherit `fd` (a pair's child end), and of the
/// fds above stdio that one alone: its close-on-exec flag cleared in the
/// child, between fork and exec, and every other's set. baton opens none
/// without the flag, but the first generation may have inherited some from
/// whoever started it (a shell, a supervisor, a container runtime), and
/// each generation would pass them on to the next for good.
pub fn inherited_by(command: &mut std::process::Command, fd: &OwnedFd) {
    use std::os::unix::process::CommandExt;
    let raw = fd.as_raw_fd();
    // SAFETY: runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: fcntl and a raw syscall are.
    // `fd` is open there: the caller holds it until the spawn has returned.
    unsafe {
        command.pre_exec(move || {
            if nix::libc::fcntl(raw, nix::libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            close_on_exec_but(raw);
            Ok(())
        });
    }
}

/// Sets close-on-exec on every fd above stdio but `kept`, by
/// `close_range` (Linux 5.11): the syscall itself, not glibc's wrapper,
/// which older glibcs lack. On an older kernel nothing is set, as before.
///
/// # Safety
/// Between fork and exec: async-signal-safe, it only makes a syscall.
unsafe fn close_on_exec_but(kept: RawFd) {
    use nix::libc::{c_uint, syscall, SYS_close_range, CLOSE_RANGE_CLOEXEC};
    const ABOVE_STDIO: c_uint = 3;
    let Ok(kept) = c_uint::try_from(kept) else {
        return;
    };
    if kept > ABOVE_STDIO {
        syscall(SYS_close_range, ABOVE_STDIO, kept - 1, CLOSE_RANGE_CLOEXEC);
    }
    let after = (kept + 1).max(ABOVE_STDIO);
    syscall(SYS_close_range, after, c_uint::MAX, CLOSE_RANGE_CLOEXEC);
}

/// What has arrived of the message being received.
#[derive(Default)]
struct Inbox {
    pieces: Reassembly,
    fds: Vec<OwnedFd>,
}

impl Channel {
    /// Creates the pair: our end, and the end the child inherits. Both are
    /// close-on-exec: the child's end has the flag cleared in the child
    /// alone, before its exec ([`inherited_by`]), so that nothing else this
    /// process spawns meanwhile (`busctl` at a stop beginning) inherits it
    /// and holds the channel open past the child's death. The caller drops
    /// the child's end right after spawning.
    pub fn pair() -> Result<(Channel, OwnedFd), HandoffError> {
        let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, flags)?;
        Ok((Self::new(ours)?, theirs))
    }

    /// Both ends of a pair, for tests elsewhere in the crate.
    #[cfg(test)]
    pub fn connected() -> (Channel, Channel) {
        let (ours, theirs) = Channel::pair().expect("a pair");
        (ours, Channel::new(theirs).expect("its other end"))
    }

    /// The end our parent left us, if we were started by a reload.
    pub fn from_env() -> Result<Option<Channel>, HandoffError> {
        let Ok(text) = std::env::var(ENV_FD) else {
            return Ok(None);
        };
        let raw: RawFd = text
            .parse()
            .map_err(|_| HandoffError::BadInherited(text.clone()))?;
        if raw < 3 {
            return Err(HandoffError::BadInherited(text));
        }
        // SAFETY: only borrowed for the type check below, while no other
        // code in this process can have closed it (we are still in start-up).
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        let ty = socket2::SockRef::from(&borrowed).r#type();
        if !matches!(ty, Ok(t) if t == socket2::Type::SEQPACKET) {
            return Err(HandoffError::BadInherited(text));
        }
        // SAFETY: the parent opened this fd for us alone and named it in the
        // environment; it is a SEQPACKET socket (checked above) and nothing
        // else in this process owns it. We take ownership exactly once.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        let sock = socket2::Socket::from(owned);
        sock.set_cloexec(true)?;
        sock.set_nonblocking(true)?;
        Ok(Some(Self::new(sock.into())?))
    }

    pub(super) fn new(fd: OwnedFd) -> Result<Channel, HandoffError> {
        // SAFETY: `OwnedFd` is a valid open fd that stays open, and always
        // returns the same number, for as long as the `AsyncFd` owns it.
        let fd =
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) };
        Ok(Channel {
            fd: fd.map_err(std::io::Error::from)?,
            sending: Mutex::new(()),
            inbox: Mutex::default(),
        })
    }

    /// Sends one message, its fds with its first datagrams. Not to be
    /// dropped part-way unless nothing more is sent on the channel: a
    /// message cut short fails the peer's next receive (every caller that
    /// could drop one drops the channel with it, or, as an exiting
    /// generation's last reports, sends nothing after).
    pub async fn send(
        &self,
        message: &Message,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), HandoffError> {
        let body = serde_json::to_vec(&EnvelopeOut {
            version: PROTOCOL_VERSION,
            message,
        })
        .map_err(|e| HandoffError::Malformed(e.to_string()))?;
        if body.len() > MAX_MESSAGE {
            return Err(HandoffError::TooLarge { limit: MAX_MESSAGE });
        }
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let fd_lots: Vec<&[RawFd]> = raw.chunks(MAX_FDS).collect();
        let _sending = self.sending.lock().await;
        let pieces = framing::frames(&body, fd_lots.len());
        for (i, (mark, piece)) in pieces.into_iter().enumerate() {
            let fds = fd_lots.get(i).copied().unwrap_or_default();
            self.send_datagram(&[IoSlice::new(mark), IoSlice::new(piece)], fds)
                .await?;
        }
        Ok(())
    }

    /// One datagram, waiting for room in the send buffer as long as needed.
    async fn send_datagram(&self, iov: &[IoSlice<'_>], fds: &[RawFd]) -> Result<(), HandoffError> {
        loop {
            let mut guard = self.fd.writable().await?;
            let sent = guard.try_io(|inner| {
                let cmsgs: Vec<ControlMessage> = if fds.is_empty() {
                    Vec::new()
                } else {
                    vec![ControlMessage::ScmRights(fds)]
                };
                let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
                sendmsg::<()>(inner.as_raw_fd(), iov, &cmsgs, flags, None)
                    .map_err(std::io::Error::from)
            });
            match sent {
                Ok(result) => return result.map(drop).map_err(HandoffError::from),
                Err(_would_block) => continue,
            }
        }
    }

    /// Receives one whole message and the fds that came with it. Safe to
    /// drop part-way: what was read stays in the inbox for the next call.
    pub async fn recv(&self) -> Result<(Message, Vec<OwnedFd>), HandoffError> {
        let mut inbox = self.inbox.lock().await;
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let (len, fds) = match self.recv_datagram(&mut buf).await {
                Ok(datagram) => datagram,
                // What came of a message cut off now is dropped (its fds
                // closed), not taken for the start of the next.
                Err(err) => {
                    *inbox = Inbox::default();
                    return Err(err);
                }
            };
            inbox.fds.extend(fds);
            match inbox.pieces.push(&buf[..len]) {
                Ok(Some(body)) => {
                    let fds = std::mem::take(&mut inbox.fds);
                    match decode(&body)? {
                        // Its fds, if any, close as they drop.
                        Message::Unknown => {
                            tracing::debug!("read past a message of a later release")
                        }
                        message => return Ok((message, fds)),
                    }
                }
                Ok(None) => {}
                Err(err) => {
                    *inbox = Inbox::default();
                    return Err(err);
                }
            }
        }
    }

    /// One datagram. An `ECONNRESET` is read past: the kernel reports it
    /// once, ahead of what is still queued, when the other end closed
    /// with messages of ours unread (a generation killed while our
    /// reports piled up); its own last messages, and then the close,
    /// come next.
    async fn recv_datagram(&self, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>), HandoffError> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|inner| recv_once(inner.get_ref().as_fd(), buf)) {
                Ok(Ok(Err(HandoffError::Sys(nix::errno::Errno::ECONNRESET)))) => continue,
                Ok(Ok(result)) => return result,
                Ok(Err(e)) => return Err(HandoffError::Io(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Listening sockets systemd passed us (socket activation, or its fd store
/// after a restart), with their `FDNAME`s. `LISTEN_PID` must name us; the
/// variables are unset so nothing we spawn sees them.
/// Every fd is owned before any is looked at: one that failed part-way left
/// the rest open and unowned, listening in the `SO_REUSEPORT` group of the
/// sockets bound in their place, with no one to accept what they took.
/// So the names are matched to the fds only once they are owned: a count
/// that does not match (a hand-set environment's) closes them.
pub fn from_systemd() -> std::io::Result<(Vec<SocketEntry>, Vec<OwnedFd>)> {
    let names = std::env::var("LISTEN_FDNAMES").ok();
    std::env::remove_var("LISTEN_FDNAMES");
    let passed = listen_fds()?;
    if passed.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let names: Vec<String> = match names {
        Some(names) => names.split(':').map(str::to_owned).collect(),
        // As libsystemd names them without the variable.
        None => vec!["unknown".to_owned(); passed.len()],
    };
    if names.len() != passed.len() {
        return Err(invalid_passing(format!(
            "LISTEN_FDNAMES has {} names for the {} sockets of LISTEN_FDS",
            names.len(),
            passed.len()
        )));
    }
    let mut entries = Vec::new();
    for (owned, name) in passed.iter().zip(names) {
        socket2::SockRef::from(owned).set_cloexec(true)?;
        entries.push(SocketEntry {
            name,
            addr: String::new(),
        });
    }
    Ok((entries, passed))
}

type Datagram = Result<(usize, Vec<OwnedFd>), HandoffError>;

/// One non-blocking `recvmsg`. The outer error is only "would block", which
/// `try_io` needs to see to wait for the next readiness.
fn recv_once(fd: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<Datagram> {
    Ok(match recv_datagram(fd, buf) {
        Err(HandoffError::Sys(nix::errno::Errno::EAGAIN)) => {
            return Err(std::io::ErrorKind::WouldBlock.into())
        }
        other => other,
    })
}

/// Reads one datagram into `buf`: its length and the fds that came with it.
/// rustix's receive, not nix's: with more fds than the buffer holds, the
/// kernel installs those that fit and says `MSG_CTRUNC`, and nix then
/// refuses to read the control messages, leaving those fds open and
/// unowned; rustix hands each over owned, closed when dropped.
fn recv_datagram(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Datagram {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let flags = RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC;
    let mut iov = [IoSliceMut::new(buf)];
    let msg = rustix::net::recvmsg(fd, &mut iov, &mut control, flags)
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error()))?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = message {
            fds.extend(passed);
        }
    }
    // The buffer has room to align itself, so up to two more fit; more than
    // a sender puts in one datagram is cut off all the same.
    let truncated = msg
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
        || fds.len() > MAX_FDS;
    if msg.bytes == 0 && fds.is_empty() {
        return Err(HandoffError::Closed);
    }
    if truncated {
        return Err(HandoffError::Malformed(format!(
            "datagram over {MAX_DATAGRAM} bytes or fd list truncated"
        )));
    }
    Ok((msg.bytes, fds))
}

/// The fds systemd passed, each owned: `LISTEN_FDS` of them from fd 3,
/// where `LISTEN_PID` is ours (libsystemd's `sd_listen_fds`). Read by
/// hand: sd_notify's `listen_fds` fails at an fd the count names that is
/// not open (a hand-set environment's) with those before it unowned. Here
/// they are owned, so closed, and the error names the fd.
fn listen_fds() -> std::io::Result<Vec<OwnedFd>> {
    /// `SD_LISTEN_FDS_START`.
    const FIRST: RawFd = 3;
    let pid = std::env::var("LISTEN_PID").ok();
    let count = std::env::var("LISTEN_FDS").ok();
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    let (Some(pid), Some(count)) = (pid, count) else {
        return Ok(Vec::new());
    };
    match pid.parse::<u32>() {
        Ok(pid) if pid == std::process::id() => {}
        Ok(_) => return Ok(Vec::new()),
        Err(_) => return Err(invalid_passing(format!("LISTEN_PID={pid:?} is not a pid"))),
    }
    let Ok(count) = count.parse::<RawFd>() else {
        return Err(invalid_passing(format!(
            "LISTEN_FDS={count:?} is not a count"
        )));
    };
    let mut passed = Vec::new();
    for raw in FIRST..FIRST.saturating_add(count) {
        // SAFETY: F_GETFD only reads the fd's flags; one not open is EBADF.
        if unsafe { libc::fcntl(raw, libc::F_GETFD) } == -1 {
            return Err(invalid_passing(format!(
                "LISTEN_FDS passes {count} sockets from fd {FIRST}, but fd {raw} is not open"
            )));
        }
        // SAFETY: open, and passed to us by systemd (LISTEN_PID is our
        // pid) with nothing of ours opened yet (`from_systemd` is first);
        // nothing else in this process owns it, and it is taken once here.
        passed.push(unsafe { OwnedFd::from_raw_fd(raw) });
    }
    Ok(passed)
}

fn invalid_passing(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what)
}

/// A part of the offer that only saves work (ticket keys, the last DNS
/// answers): one of a shape this release cannot read (a later release's,
/// met on a rollback) is left out, as an earlier release's absent part
/// is (new keys; a lookup at start), not a failed reload.
fn or_none<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).unwrap_or_else(|err| {
        tracing::info!(cause = %err, "a part of the offer of a shape this release cannot read; left out");
        T::default()
    }))
}

/// What an offer's `started` is when an older release did not say.
fn over() -> bool {
    true
}

/// Decodes one message, checking the protocol version before the shape.
pub fn decode(bytes: &[u8]) -> Result<Message, HandoffError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| HandoffError::Malformed(e.to_string()))?;
    let got = value
        .get("version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| HandoffError::Malformed("no version".into()))?;
    // A `failed` is read whatever its version: a release of another
    // protocol says with it why it will not take over (the mismatch
    // itself), which `baton reload` then reports, and its shape is kept.
    let failed = value.get("type").and_then(serde_json::Value::as_str) == Some("failed");
    if failed && got != u64::from(PROTOCOL_VERSION) {
        if let Ok(said @ Message::Failed { .. }) = serde_json::from_value(value.clone()) {
            return Ok(said);
        }
    }
    if got != u64::from(PROTOCOL_VERSION) {
        return Err(HandoffError::Version {
            got,
            expected: PROTOCOL_VERSION,
        });
    }
    serde_json::from_value(value).map_err(|e| HandoffError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair's child end reaches the process it is given to, and no
    /// other this process spawns meanwhile.
    #[tokio::test]
    async fn only_the_process_given_a_pairs_end_inherits_it() {
        let (_ours, theirs) = Channel::pair().expect("pair");
        let probe = || {
            let mut sh = std::process::Command::new("sh");
            sh.arg("-c")
                .arg(format!("test -e /proc/self/fd/{}", theirs.as_raw_fd()));
            sh
        };
        let inherits =
            |mut command: std::process::Command| command.status().expect("run sh").success();
        assert!(!inherits(probe()), "another spawn does not inherit it");
        let mut given = probe();
        inherited_by(&mut given, &theirs);
        assert!(inherits(given), "the process it is given to does");
    }

    #[tokio::test]
    async fn messages_and_fds_cross_the_pair() {
        let (a, b_fd) = Channel::pair().expect("pair");
        let b = Channel::new(b_fd).expect("wrap");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let offer = Message::Offer {
            generation: 2,
            sockets: vec![SocketEntry {
                name: "web".into(),
                addr: listener.local_addr().expect("addr").to_string(),
            }],
            draining: vec![1],
            draining_started: vec![None],
            backends: Vec::new(),
            ready_ms: Some(6_000),
            started: true,
            report: None,
            tickets: Some(Box::new(
                crate::tls::tickets::TicketKeys::generate().expect("keys"),
            )),
            resolved: vec![ResolvedCarry {
                pool: "app".into(),
                name: "app1".into(),
                query: "app1.internal:8080".into(),
                resolved: vec![CarriedAddress {
                    address: ([10, 0, 0, 5], 8080).into(),
                    weight: 1,
                    from: "app1.internal:8080".into(),
                    gone_ms: 0,
                }],
                serving: vec![CarriedAddress {
                    address: ([10, 0, 0, 4], 8080).into(),
                    weight: 1,
                    from: "app1.internal:8080".into(),
                    gone_ms: 1500,
                }],
                empty_ms: Some(2500),
                empty_last_ms: Some(400),
            }],
        };
        a.send(&offer, &[listener.as_fd()]).await.expect("send");
        let (got, fds) = b.recv().await.expect("recv");
        assert_eq!(got, offer);
        assert_eq!(fds.len(), 1);
        let sock = socket2::Socket::from(fds.into_iter().next().expect("fd"));
        assert_eq!(
            sock.local_addr().expect("addr").as_socket(),
            listener.local_addr().ok()
        );
        drop(a);
        assert!(matches!(b.recv().await, Err(HandoffError::Closed)));
    }

    /// An offer whose report weighs `series` counters (about 150 bytes each).
    fn offer_of(series: usize, addr: String) -> Message {
        let baseline = (0..series)
            .map(|i| {
                let series = crate::metrics::exposition::Series {
                    family: "baton_upstream_errors_total".into(),
                    kind: "counter".into(),
                    value: i as f64,
                    help: Some("Failures talking to a backend, by kind.".into()),
                };
                (
                    format!("baton_upstream_errors_total{{backend=\"b{i}\"}}"),
                    series,
                )
            })
            .collect();
        Message::Offer {
            generation: 2,
            sockets: vec![SocketEntry {
                name: "web".into(),
                addr,
            }],
            draining: vec![1],
            draining_started: vec![None],
            backends: Vec::new(),
            tickets: None,
            resolved: Vec::new(),
            ready_ms: None,
            started: true,
            report: Some(Report {
                baseline,
                generations: Vec::new(),
            }),
        }
    }

    #[tokio::test]
    async fn an_offer_far_past_the_send_buffer_crosses_with_its_fds() {
        let (a, b_fd) = Channel::pair().expect("pair");
        let b = Channel::new(b_fd).expect("wrap");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let offer = offer_of(30_000, listener.local_addr().expect("addr").to_string());
        let fds = [listener.as_fd()];
        let (sent, received) = tokio::join!(a.send(&offer, &fds), b.recv());
        sent.expect("send");
        let (got, fds) = received.expect("recv");
        assert_eq!(got, offer);
        assert_eq!(fds.len(), 1);
        let commit = Message::Commit {
            backends: vec![],
            report: Some(Report::default()),
        };
        a.send(&commit, &[]).await.expect("send");
        assert_eq!(b.recv().await.expect("recv").0, commit);
    }

    /// More sockets than one datagram carries (a listener with a shard for
    /// each of 130 workers, twice) cross in one message, every one of them.
    #[tokio::test]
    async fn an_offer_with_more_fds_than_a_datagram_carries_crosses_whole() {
        let (a, b_fd) = Channel::pair().expect("pair");
        let b = Channel::new(b_fd).expect("wrap");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let offer = offer_of(1, listener.local_addr().expect("addr").to_string());
        let fds = vec![listener.as_fd(); MAX_FDS + 50];
        let crossing = async { tokio::join!(a.send(&offer, &fds), b.recv()) };
        let (sent, received) = tokio::time::timeout(std::time::Duration::from_secs(10), crossing)
            .await
            .expect("a refused send leaves the receiver waiting");
        sent.expect("send");
        let (got, fds) = received.expect("recv");
        assert_eq!(got, offer);
        assert_eq!(fds.len(), MAX_FDS + 50);
        let last = socket2::Socket::from(fds.into_iter().last().expect("fd"));
        assert_eq!(
            last.local_addr().expect("addr").as_socket(),
            listener.local_addr().ok()
        );
    }

    #[tokio::test]
    async fn a_receive_dropped_part_way_loses_nothing() {
        let (a, b_fd) = Channel::pair().expect("pair");
        let b = Channel::new(b_fd).expect("wrap");
        let offer = offer_of(30_000, "127.0.0.1:1".into());
        let sender = {
            let offer = offer.clone();
            tokio::spawn(async move {
                a.send(&offer, &[]).await.expect("send");
                a
            })
        };
        let mut tries = 0;
        let got = loop {
            tries += 1;
            // One poll, then dropped: it reads what the buffer holds.
            let once = tokio::time::timeout(std::time::Duration::ZERO, b.recv());
            if let Ok(received) = once.await {
                break received.expect("recv").0;
            }
            tokio::task::yield_now().await;
        };
        assert!(tries > 1, "the receive was never interrupted");
        assert_eq!(got, offer);
        drop(sender.await.expect("sender"));
    }

    /// Sends one raw datagram of `bytes` from `fd`, with `fds`.
    fn send_raw(fd: &OwnedFd, bytes: &[u8], fds: &[RawFd]) {
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
        sendmsg::<()>(
            fd.as_raw_fd(),
            &[IoSlice::new(bytes)],
            cmsgs,
            MsgFlags::empty(),
            None,
        )
        .expect("send a raw datagram");
    }

    /// A receive that fails part way through a message (a datagram with
    /// more fds than one may carry, after the message's first piece)
    /// forgets that message: the next one is read whole, where it was
    /// taken for the cut one's continuation and refused as "a message
    /// began before the previous one ended".
    #[tokio::test]
    async fn a_message_cut_off_by_a_failed_receive_is_forgotten() {
        let (a, b_fd) = Channel::pair().expect("pair");
        // Pieces are marked 0x01 (first) and 0x02 (more): see `framing`.
        send_raw(&b_fd, b"\x01{\"version\":", &[]);
        let one = std::fs::File::open("/proc/self/stat").expect("open");
        let too_many = vec![one.as_raw_fd(); MAX_FDS + 1];
        send_raw(&b_fd, b"\x021", &too_many);
        assert!(a.recv().await.is_err(), "the cut message is refused");
        let b = Channel::new(b_fd).expect("wrap");
        b.send(&Message::Accepting, &[]).await.expect("send");
        let next = a.recv().await.expect("the next message whole").0;
        assert_eq!(next, Message::Accepting);
    }

    /// A datagram with more fds than a receive takes: the kernel installs
    /// those that fit (and drops the rest); they are closed with the
    /// refused datagram, not left open. Seen by a pipe's read end, which
    /// reads its end of file only once every copy of the write end is
    /// closed.
    #[tokio::test]
    async fn the_fds_of_a_datagram_cut_short_are_closed() {
        let (a, b_fd) = Channel::pair().expect("pair");
        let flags = nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK;
        let (read_end, write_end) = nix::unistd::pipe2(flags).expect("pipe");
        // The kernel's most (`SCM_MAX_FD`): past the receive's room, so
        // the kernel itself cuts the list.
        send_raw(&b_fd, b"\x01{}", &vec![write_end.as_raw_fd(); 253]);
        drop(write_end);
        assert!(a.recv().await.is_err(), "the cut datagram is refused");
        // A moment's wait, for a copy a fork on another test's thread
        // holds until its exec.
        let mut byte = [0u8; 1];
        let mut read = nix::unistd::read(&read_end, &mut byte);
        for _ in 0..100 {
            if read != Err(nix::errno::Errno::EAGAIN) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            read = nix::unistd::read(&read_end, &mut byte);
        }
        assert_eq!(read, Ok(0), "every copy of the write end is closed");
    }

    /// The other end closed with a message of ours unread: the kernel
    /// reports ECONNRESET first, and what it sent before closing must
    /// still be read, then the close.
    #[tokio::test]
    async fn what_a_peer_said_before_it_closed_with_ours_unread_is_read() {
        let (a, b_fd) = Channel::pair().expect("pair");
        let b = Channel::new(b_fd).expect("wrap");
        let leaving = Message::Leaving { exit_code: 3 };
        b.send(&leaving, &[]).await.expect("send");
        a.send(&Message::Report(Report::default()), &[])
            .await
            .expect("send");
        drop(b);
        assert_eq!(a.recv().await.expect("its last word").0, leaving);
        assert!(matches!(a.recv().await, Err(HandoffError::Closed)));
    }

    #[test]
    fn a_version_mismatch_is_named() {
        let err = decode(br#"{"version":99,"type":"commit"}"#).unwrap_err();
        assert!(
            matches!(err, HandoffError::Version { got: 99, .. }),
            "{err}"
        );
        assert!(decode(br#"{"type":"commit"}"#).is_err());
        let other = br#"{"version":99,"type":"failed","exit_code":1,"reason":"protocol version 1, expected 99"}"#;
        assert!(
            matches!(decode(other), Ok(Message::Failed { exit_code: 1, .. })),
            "another protocol's failure is read, to be reported"
        );
        assert!(decode(b"\xff garbage").is_err());
        assert_eq!(
            decode(br#"{"version":1,"type":"commit"}"#).ok(),
            Some(Message::Commit {
                backends: vec![],
                report: None
            }),
            "an earlier release's commit"
        );
        assert!(
            decode(br#"{"version":1,"type":"ready"}"#).is_err(),
            "ready must name its sockets"
        );
        assert_eq!(
            decode(br#"{"version":1,"type":"ready","adopted":["web"]}"#).ok(),
            Some(Message::Ready {
                adopted: vec!["web".into()],
                hears_stop: false,
                stop_budget_ms: None,
                tells_its_end: false,
                renamed: vec![],
                names_every_socket: false,
            }),
            "an earlier release's ready: it is sent SIGTERM to stop, its silence as it exits means nothing, and no socket it did not name is stopped listening"
        );
        assert_eq!(
            decode(br#"{"version":1,"type":"leaving","exit_code":3}"#).ok(),
            Some(Message::Leaving { exit_code: 3 })
        );
    }

    /// An offer whose ticket keys or DNS answers this release cannot read
    /// is taken without them (new keys, a lookup at start), not refused:
    /// the sockets are what a reload needs.
    #[test]
    fn an_offers_parts_of_another_shape_are_left_out() {
        let offer = br#"{"version":1,"type":"offer","generation":2,"sockets":[],"draining":[1],"tickets":{"keys":"of a later shape"},"resolved":[{"pool":5}]}"#;
        match decode(offer) {
            Ok(Message::Offer {
                tickets, resolved, ..
            }) => assert!(tickets.is_none() && resolved.is_empty()),
            other => panic!("an offer, without them: {other:?}"),
        }
    }

    /// A message of a later release is read past, and the conversation
    /// goes on with the next: a release that adds one (a rollback hands
    /// over to an earlier release) must not end it.
    #[tokio::test]
    async fn a_message_of_a_later_release_is_read_past() {
        assert_eq!(
            decode(br#"{"version":1,"type":"heartbeat","at":5}"#).ok(),
            Some(Message::Unknown)
        );
        let (a, b_fd) = Channel::pair().expect("pair");
        let b = Channel::new(b_fd).expect("wrap");
        b.send(&Message::Unknown, &[]).await.expect("send");
        b.send(&Message::Accepting, &[]).await.expect("send");
        assert_eq!(a.recv().await.expect("the next").0, Message::Accepting);
    }

    #[test]
    fn states_cross_as_words_and_unknown_ones_are_not_failures() {
        let carry = |admin: &str| {
            let text = format!(
                r#"{{"pool":"p","name":"a","address":"127.0.0.1:1","admin":"{admin}","healthy":null}}"#
            );
            serde_json::from_str::<BackendCarry>(&text).map(|c| c.admin)
        };
        assert_eq!(carry("draining").ok(), Some(CarriedAdmin::Draining));
        assert_eq!(carry("out").ok(), Some(CarriedAdmin::Out));
        assert_eq!(carry("quarantined").ok(), Some(CarriedAdmin::Unknown));
        let older =
            r#"{"pool":"p","name":"a","address":"127.0.0.1:1","admin":"out","healthy":false}"#;
        let streak = serde_json::from_str::<BackendCarry>(older).map(|c| c.streak);
        assert_eq!(streak.ok(), Some(0), "an earlier release carries no streak");
        let written = serde_json::to_string(&CarriedAdmin::Enabled).expect("json");
        assert_eq!(written, r#""enabled""#, "the words older releases read");
        let state = |word: &str| serde_json::from_str::<GenerationState>(&format!("\"{word}\""));
        assert_eq!(state("draining").ok(), Some(GenerationState::Draining));
        assert_eq!(state("retiring").ok(), Some(GenerationState::Unknown));
        let shown = serde_json::to_string(&GenerationState::Active).expect("json");
        assert_eq!(shown, r#""active""#, "/status shows the same word");
    }
    /// Every message as release 0.1.0 sends it, in files none of which
    /// ever changes (`tests/golden/handoff/`; one is added only while
    /// 0.1.0 is untagged, for a message it adds): a later release that renames a
    /// field, changes a type or drops a message would take over from
    /// 0.1.0 with a failed reload, or lose what it carries, and no test
    /// that builds both sides from one source could see it.
    #[test]
    fn every_message_of_release_0_1_0_is_read() {
        macro_rules! golden {
            ($name:literal) => {
                decode(include_bytes!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/golden/handoff/0.1.0/",
                    $name,
                    ".json"
                )))
                .expect($name)
            };
        }
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
        } = golden!("offer")
        else {
            panic!("an offer")
        };
        assert_eq!(
            (generation, draining, ready_ms),
            (4, vec![4100, 4242], Some(30_000))
        );
        assert_eq!(sockets[1].name, "admin");
        assert!(started, "said by no release before it: taken as over");
        assert!(
            draining_started.is_empty(),
            "said by no release before it: the pids are opened as they are"
        );
        assert_eq!(backends[1].admin, CarriedAdmin::Draining);
        assert_eq!((backends[1].healthy, backends[1].streak), (Some(false), 2));
        assert_eq!(
            backends[1].checked_by, None,
            "said by no release before it: the verdict is carried"
        );
        assert!(
            tickets.is_some(),
            "the ticket keys, or TLS sessions end at the upgrade"
        );
        assert_eq!(resolved[0].serving[0].gone_ms, 1500);
        assert_eq!(
            resolved[0].empty_last_ms, None,
            "said by no release before it: the last empty answer is taken as just now"
        );
        let report = report.expect("the counters");
        assert_eq!(report.baseline.len(), 5);
        assert_eq!(report.generations[0].backends_in_flight["app"]["app1"], 2);
        let Message::Ready {
            stop_budget_ms,
            hears_stop,
            tells_its_end,
            renamed,
            names_every_socket,
            ..
        } = golden!("ready")
        else {
            panic!("ready")
        };
        assert_eq!(stop_budget_ms, Some(35_000));
        assert!(hears_stop && tells_its_end && names_every_socket);
        assert_eq!(renamed, ["admin"]);
        assert!(matches!(
            golden!("failed"),
            Message::Failed { exit_code: 2, .. }
        ));
        let Message::Commit { backends, report } = golden!("commit") else {
            panic!("commit")
        };
        assert_eq!((backends.len(), report.is_some()), (3, true));
        assert_eq!(golden!("accepting"), Message::Accepting);
        let Message::Report(report) = golden!("report") else {
            panic!("report")
        };
        assert_eq!(report.generations[1].state, GenerationState::Draining);
        assert_eq!(golden!("stop"), Message::Stop);
        assert_eq!(golden!("leaving"), Message::Leaving { exit_code: 0 });
        assert_eq!(
            golden!("stop_budget"),
            Message::StopBudget {
                stop_budget_ms: 65_000
            }
        );
    }

    /// A later release may add a field anywhere (each addition so far
    /// came with a serde default), and a rollback hands over to the
    /// release before it: every message of 0.1.0's with a field added to
    /// each object it holds reads the same as without. A
    /// `deny_unknown_fields` in any of the handoff's types, or a part read
    /// leniently that the new field turned into "another shape" (left out
    /// silently), fails here.
    #[test]
    fn fields_a_later_release_adds_are_read_past() {
        let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/handoff/0.1.0");
        let mut read = 0;
        for file in std::fs::read_dir(golden).expect("golden messages") {
            let path = file.expect("entry").path();
            let text = std::fs::read(&path).expect("golden message");
            let mut value: serde_json::Value = serde_json::from_slice(&text).expect("json");
            widen(&mut value, 0);
            let widened = serde_json::to_vec(&value).expect("json");
            let name = path.display();
            assert_eq!(
                decode(&widened).unwrap_or_else(|e| panic!("{name}: {e}")),
                decode(&text).expect("as it is"),
                "{name}"
            );
            read += 1;
        }
        assert_eq!(read, 9, "every message of 0.1.0");
    }

    /// Adds a field to every object in `value` that is a message's or a
    /// part's, not to a map whose keys are names (`maps` levels down from
    /// here are maps).
    fn widen(value: &mut serde_json::Value, maps: usize) {
        match value {
            serde_json::Value::Object(fields) => {
                for (key, inner) in fields.iter_mut() {
                    let below = match key.as_str() {
                        _ if maps > 0 => maps - 1,
                        "baseline" | "active" => 1,
                        "backends_in_flight" => 2,
                        _ => 0,
                    };
                    widen(inner, below);
                }
                if maps == 0 {
                    let added = serde_json::json!({ "of": ["any", 1, "shape"] });
                    fields.insert("added_by_a_later_release".into(), added);
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| widen(v, maps)),
            _ => {}
        }
    }
}
