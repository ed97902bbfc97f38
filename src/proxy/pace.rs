//! The least pace a request body must keep while it holds a backend
//! connection (`body_min_rate`). A client that trickles its body, a byte
//! now and then but never idle for `idle_timeout`, would otherwise hold
//! that connection, and its place under `max_connections_per_backend`, for
//! as long as it likes (the "slow POST"; nginx is not exposed, as it reads
//! the whole body before it picks a backend, and HAProxy bounds it only
//! with `http-buffer-request`). The rule is Apache `mod_reqtimeout`'s body
//! rule (`body=20,MinRate=500`): a first grace, then a second more for
//! every `rate` bytes received. Only the time baton waits on the client
//! counts: while the backend takes nothing, the client cannot send.

use std::time::Duration;

/// The soonest a watch looks at a pace again. Its allowance shrinks no
/// faster than time passes, so a look after it runs out is never late;
/// but while the backend is waited on, a client already behind is not
/// cut and its allowance stays at zero: this keeps those looks to ten a
/// second.
pub const LOOK_AGAIN: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinPace {
    grace: Duration,
    bytes_per_second: u64,
}

impl MinPace {
    /// `None` for a rate of 0: no minimum.
    pub fn new(grace: Duration, bytes_per_second: u64) -> Option<MinPace> {
        (bytes_per_second > 0).then_some(MinPace {
            grace,
            bytes_per_second,
        })
    }

    pub fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }

    /// How much longer the client may take, having sent `received` bytes
    /// in `waited` of its own time: zero once it fell behind.
    pub fn allowance(&self, received: u64, waited: Duration) -> Duration {
        let nanos = u128::from(received) * 1_000_000_000 / u128::from(self.bytes_per_second);
        let earned = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        self.grace.saturating_add(earned).saturating_sub(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_of_zero_is_no_minimum() {
        assert_eq!(MinPace::new(Duration::from_secs(10), 0), None);
    }

    #[test]
    fn the_grace_then_a_second_for_every_rate_bytes() {
        let pace = MinPace::new(Duration::from_secs(10), 500).expect("a minimum");
        assert_eq!(pace.allowance(0, Duration::ZERO), Duration::from_secs(10));
        assert_eq!(
            pace.allowance(0, Duration::from_secs(4)),
            Duration::from_secs(6)
        );
        assert_eq!(
            pace.allowance(1_000, Duration::from_secs(11)),
            Duration::from_secs(1)
        );
        assert_eq!(pace.allowance(250, Duration::from_secs(11)), Duration::ZERO);
        // Saturated, not a panic.
        let most = Duration::from_secs(10) + Duration::from_nanos(u64::MAX);
        assert_eq!(pace.allowance(u64::MAX, Duration::ZERO), most);
    }
}
