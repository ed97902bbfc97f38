//! The process lifecycle: this process versus the next one, and systemd.
//! It knows about fds, generations and signals, and nothing about proxying.
//!
//! A reload, by function: the supervisor (`daemon`) gets `Reload` from
//! [`signals::Commands::recv`] or a [`control`] request, lists its sockets and
//! calls [`generation::hand_over`], which spawns N+1 with a [`handoff::Channel`]
//! end. N+1 reads the offer with [`generation::Parent::receive`], gets every
//! socket from [`endpoint::listen`] (claimed by name from the
//! [`inventory::Inventory`], else bound), builds everything, then
//! [`generation::Parent::ready`] waits for N's commit and
//! [`generation::Parent::accepting`] confirms. N then names N+1 to systemd
//! ([`systemd::handed_over`]), stops accepting and runs the [`drain::Drain`]
//! under its budget. N+1 is started detached and held by pidfd
//! ([`process`]).

pub mod control;
pub mod departure;
pub mod drain;
pub mod endpoint;
pub mod fd_limit;
pub mod framing;
pub mod generation;
pub mod handoff;
pub mod inventory;
pub mod keeper;
mod latch;
pub mod process;
pub mod signals;
pub mod systemd;

use std::time::SystemTime;

/// Where this generation is in its life; published on a `watch` by the
/// supervisor and read by `/readyz` and `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Building; `waiting_on` says what is not done yet.
    Starting { waiting_on: Vec<Check> },
    /// Serving and taking new connections.
    Active,
    /// A stop began: not ready any more, finishing in-flight work by
    /// `deadline` (none until the drain starts, after the pre-stop pause).
    Stopping { deadline: Option<SystemTime> },
    /// Handed over to a newer generation; finishing in-flight work by
    /// `deadline`.
    Draining { deadline: Option<SystemTime> },
}

/// One item of start-up, as `/readyz` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Phase {
    /// The generation's state as `/status` and its reports show it.
    pub fn state(&self) -> handoff::GenerationState {
        match self {
            Phase::Starting { .. } => handoff::GenerationState::Starting,
            Phase::Active => handoff::GenerationState::Active,
            Phase::Stopping { .. } | Phase::Draining { .. } => handoff::GenerationState::Draining,
        }
    }

    /// When the drain force-closes what is left, once a drain has a
    /// deadline: kept in the phase itself, so `/status` never shows a
    /// deadline for a generation that is not draining.
    pub fn drain_deadline(&self) -> Option<SystemTime> {
        match self {
            Phase::Stopping { deadline } | Phase::Draining { deadline } => *deadline,
            Phase::Starting { .. } | Phase::Active => None,
        }
    }

    /// Moves the drain deadline (a stop while draining brings it closer);
    /// a phase that does not drain has none to move.
    pub fn set_drain_deadline(&mut self, at: SystemTime) {
        if let Phase::Stopping { deadline } | Phase::Draining { deadline } = self {
            *deadline = Some(at);
        }
    }
}
