//! Streams baton closed while their client may still be sending on them,
//! remembered so that what crosses the close is told from a client's
//! fault (RFC 9113 §5.1).
//!
//! A client that sent END_STREAM or RST_STREAM on a stream knows it is
//! closed: a DATA or HEADERS frame on it after that is an error. But a
//! stream baton resets (or answers early, before the upload ended) may
//! still have the client's frames on their way, and those "MUST" be
//! ignored. So baton keeps the ids of those streams until the client's
//! own end of each comes, and at most a bounded number of them: the
//! oldest is forgotten first, as RFC 9113 §5.1 allows ("MAY choose to
//! limit the period over which it ignores frames"), because frames cross
//! a reset only for a round trip, and a client that never ends the
//! streams baton reset (most stop sending at the reset) would otherwise
//! grow the list for the connection's life.

/// Ids of the streams baton closed whose client had not ended them, the
/// oldest first. Empty, it holds no allocation: a connection whose
/// streams all end in turn costs nothing more.
#[derive(Debug)]
pub(super) struct ClosedByBaton {
    ids: Vec<u32>,
    bound: usize,
}

impl ClosedByBaton {
    /// Keeps twice as many as a client may have streams open at once (all
    /// of them reset, and as many refused beyond the limit), 64 at least.
    pub(super) fn new(max_streams: u32) -> ClosedByBaton {
        ClosedByBaton {
            ids: Vec::new(),
            bound: (max_streams as usize).saturating_mul(2).max(64),
        }
    }

    /// Stream `id` was closed by baton before its client ended it.
    pub(super) fn remember(&mut self, id: u32) {
        if self.ids.len() == self.bound {
            self.ids.remove(0);
        }
        self.ids.push(id);
    }

    /// Whether frames on `id` may be the client's, sent before it saw
    /// baton close the stream.
    pub(super) fn crossing(&self, id: u32) -> bool {
        self.ids.contains(&id)
    }

    /// The client ended `id` itself: nothing more may come on it.
    pub(super) fn ended(&mut self, id: u32) {
        self.ids.retain(|&kept| kept != id);
        if self.ids.is_empty() {
            self.ids = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ClosedByBaton;

    #[test]
    fn frames_cross_a_close_only_until_the_client_ends_the_stream() {
        let mut closed = ClosedByBaton::new(1);
        closed.remember(3);
        assert!(closed.crossing(3));
        assert!(!closed.crossing(1), "never closed by baton");
        closed.ended(3);
        assert!(!closed.crossing(3));
        assert_eq!(closed.ids.capacity(), 0, "an empty list holds nothing");
    }

    #[test]
    fn the_oldest_is_forgotten_past_the_bound() {
        let mut closed = ClosedByBaton::new(40);
        for id in (1..=161).step_by(2) {
            closed.remember(id);
        }
        assert!(!closed.crossing(1), "the oldest of 81, past 80");
        assert!(closed.crossing(3) && closed.crossing(161));
        assert_eq!(closed.ids.len(), 80);
    }
}
