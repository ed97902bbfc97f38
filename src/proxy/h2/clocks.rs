//! The clocks of one h2c client connection, looked at together: a stalled
//! reader, an opening that does not come, a reset flood's grace, an idle
//! connection's GOAWAY and its close, and its close through a drain. Each
//! is a rule over the connection's activity (`activity::ConnState`) and
//! the moments this connection's life fixed (GOAWAY sent, the drain's
//! start); the connection's task keeps one timer, set to the earliest
//! moment any of them is next due, instead of a timer a clock (each a
//! `Sleep` held in the task for the connection's whole life: 1.2 KiB of
//! every idle h2 connection).

use std::time::Duration;

use tokio::time::Instant;

use crate::proxy::activity::{ConnState, Due};

/// What a connection's clocks allow.
pub struct Limits {
    /// How long response frames may wait for the client with none moving.
    pub stall: Duration,
    /// How long the preface and first SETTINGS may take.
    pub opening: Duration,
    /// How long without a stream until GOAWAY.
    pub idle: Duration,
    /// How long an idle client has to close after GOAWAY (counted from
    /// the later of the GOAWAY and the last byte written), and a flooding
    /// one's streams under way.
    pub goaway_grace: Duration,
    /// How long after a drain's start an idle connection is closed.
    pub drain_grace: Duration,
}

/// A clock whose time came: what the connection does about it.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Response frames waited `stall` with none moving: cut.
    Stalled,
    /// No preface and SETTINGS within `opening`: cut.
    OpeningOverdue,
    /// The client was found flooding: GOAWAY, then the cut a grace later.
    Flooded,
    /// A flooding client's grace is over: cut.
    FloodCut,
    /// No stream for `idle`: GOAWAY.
    Idle,
    /// The client did not close after the idle GOAWAY: closed, well.
    GoneQuiet,
    /// The drain is under way and the connection stayed idle through its
    /// grace: closed, well.
    IdleThroughDrain,
}

pub struct Clocks {
    limits: Limits,
    /// When the idle GOAWAY was put out.
    idle_goaway: Option<Instant>,
    /// When a flooding client is cut.
    flood_cut: Option<Instant>,
    drain_began: Option<Instant>,
    /// When the stalled-reader rule is looked at next: kept, so looks for
    /// other reasons do not put it off.
    stall_look: Instant,
}

/// A clock's answer: when it is next due (`None`: not on a clock, or
/// when `ConnState::changed` tells), or its verdict, due now.
type Answer = Result<Option<Instant>, Verdict>;

impl Clocks {
    pub fn new(limits: Limits, now: Instant) -> Clocks {
        Clocks {
            stall_look: now + limits.stall,
            limits,
            idle_goaway: None,
            flood_cut: None,
            drain_began: None,
        }
    }

    pub fn draining(&self) -> bool {
        self.drain_began.is_some()
    }

    /// The drain began: the connection puts out its GOAWAY (if it has not).
    pub fn drain_began(&mut self, now: Instant) {
        self.drain_began = Some(now);
    }

    /// The first clock due at `now`, else when to look next (the changes
    /// `ConnState::changed` tells want a look too). A verdict that does not
    /// end the connection (`Flooded`, `Idle`: the connection puts out its
    /// GOAWAY) is given once.
    pub fn look(&mut self, state: &ConnState, now: Instant) -> Result<Instant, Verdict> {
        let answers = [
            self.stall(state, now)?,
            Self::opening(state, self.limits.opening, now)?,
            self.flood(state, now)?,
            self.drain(state, now)?,
            self.idle(state, now)?,
        ];
        Ok(answers
            .into_iter()
            .flatten()
            .fold(self.stall_look, Instant::min))
    }

    fn stall(&mut self, state: &ConnState, now: Instant) -> Answer {
        if now >= self.stall_look {
            let next = state.next_stall_look(self.limits.stall, now);
            self.stall_look = next.ok_or(Verdict::Stalled)?;
        }
        Ok(Some(self.stall_look))
    }

    fn opening(state: &ConnState, limit: Duration, now: Instant) -> Answer {
        state.opening.due(limit).map_or(Ok(None), |due| {
            verdict_at(Due::by(due, now), Verdict::OpeningOverdue)
        })
    }

    /// A flooding client is told GOAWAY, then cut a grace later.
    fn flood(&mut self, state: &ConnState, now: Instant) -> Answer {
        match self.flood_cut {
            Some(cut) => verdict_at(Due::by(cut, now), Verdict::FloodCut),
            None if state.is_flooded() => {
                self.flood_cut = Some(now + self.limits.goaway_grace);
                Err(Verdict::Flooded)
            }
            None => Ok(None),
        }
    }

    /// An idle connection in a drain is closed as an idle HTTP/1 one is,
    /// `drain_grace` after the drain's start at the earliest (a client
    /// idle for long may be sending its next request right now), once it
    /// has gone quiet. h2's own graceful close waits for the client's
    /// answer to its PING, and a client that gives none (gone, or not
    /// reading an idle pooled connection) held the drain to its deadline,
    /// which then counted a forced close.
    fn drain(&self, state: &ConnState, now: Instant) -> Answer {
        let Some(began) = self.drain_began else {
            return Ok(None);
        };
        let grace = self.limits.drain_grace;
        let due = state.quiet(grace, began, began + grace, now);
        verdict_at(due, Verdict::IdleThroughDrain)
    }

    /// GOAWAY for a connection without a stream for `idle` that has had
    /// none yet, then its close once quiet: h2's graceful close waits for
    /// the client's PING answer, and an idle client may give none.
    fn idle(&mut self, state: &ConnState, now: Instant) -> Answer {
        if let Some(said) = self.idle_goaway {
            let due = state.quiet(self.limits.goaway_grace, said, said, now);
            return verdict_at(due, Verdict::GoneQuiet);
        }
        if self.flood_cut.is_some() || self.drain_began.is_some() {
            return Ok(None);
        }
        let answer = verdict_at(state.idle(self.limits.idle, now), Verdict::Idle);
        if answer.is_err() {
            self.idle_goaway = Some(now);
        }
        answer
    }
}

/// `verdict` if `due` now, else when to look again.
fn verdict_at(due: Due, verdict: Verdict) -> Answer {
    match due {
        Due::Now => Err(verdict),
        Due::At(at) => Ok(Some(at)),
        Due::WhenEmptied => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::proxy::body::BodyGuard;

    const SECOND: Duration = Duration::from_secs(1);

    /// Far apart, so that each test meets only the clock it is about.
    fn limits() -> Limits {
        Limits {
            stall: 30 * SECOND,
            opening: 1000 * SECOND,
            idle: 10 * SECOND,
            goaway_grace: SECOND,
            drain_grace: 3 * SECOND,
        }
    }

    /// A connection accepted now, and its clocks. (The time is paused: it
    /// moves only by `advance`.)
    fn accepted() -> (Arc<ConnState>, Clocks, Instant) {
        let start = Instant::now();
        let state = Arc::new(ConnState::new(start));
        (state, Clocks::new(limits(), start), start)
    }

    /// Looks at `clocks` `by` after the start.
    async fn look_at(
        clocks: &mut Clocks,
        state: &ConnState,
        start: Instant,
        by: Duration,
    ) -> Result<Instant, Verdict> {
        tokio::time::advance(start + by - Instant::now()).await;
        clocks.look(state, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_gets_goaway_at_idle_then_closes_a_grace_after_it() {
        let (state, mut clocks, start) = accepted();
        assert_eq!(clocks.look(&state, start), Ok(start + 10 * SECOND));
        let idle = start + 10 * SECOND;
        assert_eq!(
            look_at(&mut clocks, &state, start, 10 * SECOND).await,
            Err(Verdict::Idle)
        );
        assert_eq!(
            clocks.look(&state, idle),
            Ok(idle + SECOND),
            "not before the GOAWAY is out"
        );
        assert_eq!(
            look_at(&mut clocks, &state, start, 11 * SECOND).await,
            Err(Verdict::GoneQuiet)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_written_after_the_goaway_puts_off_the_close_four_graces_at_most() {
        let (state, mut clocks, start) = accepted();
        assert_eq!(
            look_at(&mut clocks, &state, start, 10 * SECOND).await,
            Err(Verdict::Idle)
        );
        let mut by = 10 * SECOND;
        while by < 14 * SECOND {
            by += SECOND / 2;
            tokio::time::advance(SECOND / 2).await;
            state.wrote();
            let looked = clocks.look(&state, Instant::now());
            if by < 14 * SECOND {
                let next = (Instant::now() + SECOND).min(start + 14 * SECOND);
                assert_eq!(looked, Ok(next), "written to {by:?} after the start");
            } else {
                assert_eq!(
                    looked,
                    Err(Verdict::GoneQuiet),
                    "four graces after the GOAWAY"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_in_flight_holds_off_the_idle_clock_not_the_stall_look() {
        let (state, mut clocks, start) = accepted();
        let _busy = state.running();
        let looked = look_at(&mut clocks, &state, start, 60 * SECOND).await;
        assert_eq!(looked, Ok(start + 90 * SECOND));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_none_of_a_frame_is_stalled() {
        let (state, mut clocks, start) = accepted();
        let mut busy = state.running();
        busy.handed(100);
        assert_eq!(clocks.look(&state, start), Ok(start + 30 * SECOND));
        let looked = look_at(&mut clocks, &state, start, 30 * SECOND).await;
        assert_eq!(looked, Err(Verdict::Stalled));
    }

    #[tokio::test(start_paused = true)]
    async fn an_opening_that_does_not_come_is_overdue() {
        let (state, mut clocks, start) = accepted();
        assert_eq!(clocks.look(&state, start), Ok(start + 10 * SECOND));
        let _busy = state.running();
        let looked = look_at(&mut clocks, &state, start, 1000 * SECOND).await;
        assert_eq!(looked, Err(Verdict::OpeningOverdue));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flooding_client_is_told_goaway_then_cut_a_grace_later() {
        let (state, mut clocks, start) = accepted();
        let _open = state.running();
        for _ in 0..1000 {
            state.running().sent_on();
        }
        let flooded = start + 5 * SECOND;
        assert_eq!(
            look_at(&mut clocks, &state, start, 5 * SECOND).await,
            Err(Verdict::Flooded)
        );
        assert_eq!(
            clocks.look(&state, flooded),
            Ok(flooded + SECOND),
            "told once"
        );
        let cut = look_at(&mut clocks, &state, start, 6 * SECOND).await;
        assert_eq!(cut, Err(Verdict::FloodCut));
    }

    #[tokio::test(start_paused = true)]
    async fn a_drained_idle_connection_closes_once_the_drains_grace_is_over() {
        let (state, mut clocks, start) = accepted();
        let began = start + SECOND;
        tokio::time::advance(SECOND).await;
        clocks.drain_began(began);
        assert_eq!(clocks.look(&state, began), Ok(began + 3 * SECOND));
        let over = look_at(&mut clocks, &state, start, 4 * SECOND).await;
        assert_eq!(over, Err(Verdict::IdleThroughDrain));
    }
}
