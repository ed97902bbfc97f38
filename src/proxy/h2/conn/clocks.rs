//! The connection's clocks: a response held up by its client past
//! `stall_limit`, a header block left unfinished, the keep-alive PING.

use std::future::Future;
use std::task::Context;

use bytes::Bytes;
use http::Request;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::super::frame::{write, Reason};
use super::super::recv::RecvBody;
use super::{protocol, ConnError, Connection, Exchange, KEEPALIVE_PING};

impl<S, F, B> Connection<S, F, B>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Request<RecvBody>) -> Exchange<B> + Unpin,
    B: Body<Data = Bytes> + Unpin,
{
    /// Resets each stream whose response has had a frame waiting for the
    /// client for `stall_limit` (see [`super::Limits::stall_limit`]). Looked at
    /// only while some response is held up, and then on one alarm for the
    /// first one due: nothing while bytes move.
    pub(super) fn watch_stalls(&mut self, cx: &mut Context<'_>) {
        if !self.blocked && self.stall_alarm.is_none() {
            return;
        }
        self.blocked = false;
        let limit = self.limits.stall_limit;
        loop {
            let now = Instant::now();
            let stalled: Vec<u32> = self
                .streams
                .iter()
                .filter(|(_, s)| s.delivery.waiting_since().is_some_and(|t| t + limit <= now))
                .map(|(&id, _)| id)
                .collect();
            for id in stalled {
                if let Some(stream) = self.streams.get(&id) {
                    stream.delivery.time_out();
                }
                if let Some(told) = &self.on_stall {
                    told();
                }
                self.reset(id, Reason::CANCEL);
            }
            let first = self
                .streams
                .values()
                .filter_map(|s| s.delivery.waiting_since())
                .min();
            let Some(first) = first else {
                self.stall_alarm = None;
                return;
            };
            let due = first + limit;
            let alarm = self
                .stall_alarm
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if alarm.deadline() != due {
                alarm.as_mut().reset(due);
            }
            if alarm.as_mut().poll(cx).is_pending() {
                return;
            }
        }
    }

    /// A header block left unfinished must end within `block_limit` of
    /// the turn that first saw it so: otherwise the connection ends
    /// (`ENHANCE_YOUR_CALM`). With another stream open no idle clock runs,
    /// and a CONTINUATION every half minute (under the PING's interval)
    /// held up to 128 KiB of block per connection for a quarter of an
    /// hour. A block whose frames come together never sets the alarm.
    pub(super) fn watch_block(&mut self, cx: &mut Context<'_>) -> Result<(), ConnError> {
        // Not counted while baton itself reads nothing (its room full):
        // the block's next frame may be waiting, unread.
        if !self.reader.inside_block() || !self.read_room() {
            self.block_alarm = None;
            return Ok(());
        }
        let limit = self.limits.block_limit;
        let alarm = self
            .block_alarm
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if alarm.as_mut().poll(cx).is_ready() {
            let why = "a header block left unfinished past header_timeout";
            return Err(protocol(Reason::ENHANCE_YOUR_CALM, why));
        }
        Ok(())
    }

    /// A PING once the client has been silent for `ping_interval`; the
    /// connection ends if no answer comes within `ping_timeout`. The alarm
    /// is moved only when it fires (no timer work while frames come).
    pub(super) fn keep_alive(&mut self, cx: &mut Context<'_>) -> Result<(), ConnError> {
        // A client that closed its side can answer no PING.
        if self.read_closed {
            return Ok(());
        }
        while self.alarm.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let next = match self.ping_sent {
                Some(sent) if now >= sent + self.limits.ping_timeout => {
                    return Err(ConnError::PingTimeout);
                }
                Some(sent) => sent + self.limits.ping_timeout,
                None if now >= self.last_read + self.limits.ping_interval => {
                    write::ping(&mut self.out, KEEPALIVE_PING, false);
                    self.ping_sent = Some(now);
                    now + self.limits.ping_timeout
                }
                None => self.last_read + self.limits.ping_interval,
            };
            self.alarm.as_mut().reset(next);
        }
        Ok(())
    }
}
