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
//! oldest is forgotten first, because a client that never ends the
//! streams baton reset (most stop sending at the reset) would otherwise
//! grow the list for the connection's life. DATA on a stream at or below
//! the last id forgotten is still let through (it costs nothing: the
//! connection's window bounds it), as a client may open many streams
//! before it sees the limit in baton's SETTINGS and have them all
//! refused; a header block there is not (RFC 9113 §5.1 allows limiting
//! the period over which frames are ignored), as each costs a decode.

/// The most ids kept, whatever the stream limit.
const MOST: usize = 4096;

/// Ids of the streams baton closed whose client had not ended them, the
/// oldest first. Empty, it holds no allocation: a connection whose
/// streams all end in turn costs nothing more.
#[derive(Debug)]
pub(super) struct ClosedByBaton {
    ids: Vec<u32>,
    bound: usize,
    /// The highest id forgotten to keep within `bound`.
    forgotten_up_to: u32,
}

impl ClosedByBaton {
    /// Keeps twice as many as a client may have streams open at once
    /// (all of them reset, and as many refused beyond the limit), and 128
    /// more: the 100 a client may open before it sees the limit; 4,096 at
    /// most, as each frame on a closed stream looks through them (16 KiB:
    /// at the largest `h2_max_concurrent_streams`, 20,128 ids were 80 KiB
    /// a frame, and an empty DATA frame costs the client 9 bytes).
    pub(super) fn new(max_streams: u32) -> ClosedByBaton {
        ClosedByBaton {
            ids: Vec::new(),
            bound: ((max_streams as usize).saturating_mul(2) + 128).min(MOST),
            forgotten_up_to: 0,
        }
    }

    /// Stream `id` was closed by baton before its client ended it.
    pub(super) fn remember(&mut self, id: u32) {
        if self.ids.len() == self.bound {
            let oldest = self.ids.remove(0);
            self.forgotten_up_to = self.forgotten_up_to.max(oldest);
        }
        self.ids.push(id);
    }

    /// Whether a header block on `id` may be the client's trailers, sent
    /// before it saw baton close the stream.
    pub(super) fn crossing(&self, id: u32) -> bool {
        self.ids.contains(&id)
    }

    /// Whether DATA on `id` may have crossed baton's close of the stream.
    pub(super) fn data_crossing(&self, id: u32) -> bool {
        id <= self.forgotten_up_to || self.crossing(id)
    }

    /// The client ended `id` itself: nothing more may come on it.
    pub(super) fn ended(&mut self, id: u32) {
        if self.ids.is_empty() {
            return;
        }
        self.ids.retain(|&kept| kept != id);
        if self.ids.is_empty() {
            self.ids = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ClosedByBaton, MOST};

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
    fn the_oldest_is_forgotten_past_the_bound_save_for_data() {
        let mut closed = ClosedByBaton::new(1);
        for id in (1..=261).step_by(2) {
            closed.remember(id);
        }
        assert!(!closed.crossing(1), "the oldest of 131, past 130");
        assert!(closed.data_crossing(1), "DATA below the last forgotten");
        assert!(closed.crossing(3) && closed.crossing(261));
        assert_eq!(closed.ids.len(), 130);
        assert!(!closed.data_crossing(263), "never closed by baton");
        assert_eq!(ClosedByBaton::new(10_000).bound, MOST);
    }
}
