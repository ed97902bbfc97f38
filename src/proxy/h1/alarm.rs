//! One timer for a client connection's whole life, armed lazily: each
//! wait names its deadline, and the timer moves only when it must ring
//! sooner than it is set to. A keep-alive connection's deadlines (the
//! next request within `idle_timeout`, the response within
//! `response_timeout`) only move later, so the timer, once set, rings at
//! most once per timeout and is then set again to the deadline that holds
//! by then; a new timer per wait (what this replaced) cost a register and a
//! removal in tokio's timer wheel twice a request, a twelfth of a
//! keep-alive request's instructions.

use std::pin::Pin;

use tokio::time::{Instant, Sleep};

/// Where a new alarm is set: later than any deadline it is asked for.
const UNSET: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

pub struct Alarm {
    /// Boxed: pinned once for the connection, and kept out of the
    /// connection task's state.
    sleep: Pin<Box<Sleep>>,
}

impl Alarm {
    pub fn new() -> Alarm {
        // Set far off, so the first wait moves it where it belongs: a
        // timer set in the past would ring at once, and tokio wakes its
        // driver through a syscall for a timer due before all others.
        Alarm {
            sleep: Box::pin(tokio::time::sleep_until(Instant::now() + UNSET)),
        }
    }

    /// Resolves once `deadline` has passed.
    pub async fn until(&mut self, deadline: Instant) {
        loop {
            let sleep = self.sleep.as_mut();
            if sleep.is_elapsed() || sleep.deadline() > deadline {
                sleep.reset(deadline);
            }
            self.sleep.as_mut().await;
            if Instant::now() >= deadline {
                return;
            }
        }
    }
}

impl Default for Alarm {
    fn default() -> Self {
        Alarm::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Sets the alarm for `first` (a wait given up at once), then waits
    /// for `then`; returns how long that took.
    async fn waited(first: Duration, then: Duration) -> Duration {
        let mut alarm = Alarm::new();
        let start = Instant::now();
        let early =
            tokio::time::timeout(Duration::from_millis(10), alarm.until(start + first)).await;
        assert!(early.is_err(), "{first:?} has not passed");
        alarm.until(start + then).await;
        Instant::now() - start
    }

    fn about(waited: Duration, expected: Duration) -> bool {
        waited >= expected && waited < expected + Duration::from_millis(10)
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_deadline_rings_on_time_though_the_timer_was_set_sooner() {
        let took = waited(Duration::from_secs(1), Duration::from_secs(3)).await;
        assert!(about(took, Duration::from_secs(3)), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sooner_deadline_moves_the_timer() {
        let took = waited(Duration::from_secs(60), Duration::from_secs(2)).await;
        assert!(about(took, Duration::from_secs(2)), "{took:?}");
    }
}
