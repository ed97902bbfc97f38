//! Health as a pure state machine, separate from the operator's admin state:
//! consecutive results against `rise`/`fall` thresholds decide flips. The
//! first result of a backend with no verdict yet decides at once, so a
//! start-up is not held `rise` intervals long. No I/O here: probes feed it.

/// A change of verdict, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    Up,
    Down,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    rise: u32,
    fall: u32,
    /// `None` until the first result (or a carried-over verdict).
    healthy: Option<bool>,
    passes: u32,
    failures: u32,
}

impl Health {
    pub fn new(rise: u32, fall: u32) -> Health {
        Health {
            rise: rise.max(1),
            fall: fall.max(1),
            healthy: None,
            passes: 0,
            failures: 0,
        }
    }

    /// Starts from a verdict carried over from an older generation.
    pub fn with_verdict(rise: u32, fall: u32, healthy: bool) -> Health {
        Health {
            healthy: Some(healthy),
            ..Health::new(rise, fall)
        }
    }

    /// Starts from a verdict and its streak (see [`Health::streak`])
    /// carried over from an older generation: a backend `rise` checks
    /// from up there is as far from it here.
    pub fn carried(rise: u32, fall: u32, healthy: bool, streak: u32) -> Health {
        let mut health = Health::with_verdict(rise, fall, healthy);
        if healthy {
            health.failures = streak;
        } else {
            health.passes = streak;
        }
        health
    }

    /// The results in a row against the verdict: passes while down,
    /// failures while up (the other count is 0 then).
    pub fn streak(&self) -> u32 {
        if self.is_healthy() {
            self.failures
        } else {
            self.passes
        }
    }

    pub fn rise(&self) -> u32 {
        self.rise
    }

    pub fn fall(&self) -> u32 {
        self.fall
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy == Some(true)
    }

    pub fn has_verdict(&self) -> bool {
        self.healthy.is_some()
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    /// Forgets the verdict's momentum: a restored backend must pass `rise`
    /// checks before it takes traffic again.
    pub fn require_rise(&mut self) {
        self.healthy = Some(false);
        self.passes = 0;
        self.failures = 0;
    }

    /// Records one result; returns the flip it caused, if any.
    pub fn observe(&mut self, ok: bool) -> Option<Flip> {
        if ok {
            self.passes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.passes = 0;
        }
        match (self.healthy, ok) {
            (None, true) => self.set(true),
            (None, false) => self.set(false),
            (Some(false), true) if self.passes >= self.rise => self.set(true),
            (Some(true), false) if self.failures >= self.fall => self.set(false),
            _ => None,
        }
    }

    /// Real traffic failed `fall` times in a row: down, if it was up,
    /// and `rise` checks from up again (the checks' own failure streak is
    /// left as it was).
    pub fn fail_from_traffic(&mut self) -> Option<Flip> {
        if self.healthy != Some(true) {
            return None;
        }
        self.passes = 0;
        self.set(false)
    }

    fn set(&mut self, healthy: bool) -> Option<Flip> {
        let was = self.healthy;
        self.healthy = Some(healthy);
        match (was, healthy) {
            (Some(true), true) | (Some(false), false) => None,
            (_, true) => Some(Flip::Up),
            (_, false) => Some(Flip::Down),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_result_decides() {
        let mut h = Health::new(2, 3);
        assert_eq!(h.observe(true), Some(Flip::Up));
        let mut h = Health::new(2, 3);
        assert_eq!(h.observe(false), Some(Flip::Down));
    }

    #[test]
    fn flips_need_consecutive_results() {
        let mut h = Health::with_verdict(2, 3, true);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(true), None, "a pass resets the failure streak");
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), Some(Flip::Down));
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(true), Some(Flip::Up));
    }

    #[test]
    fn a_carried_streak_goes_on_where_it_was() {
        let mut down = Health::with_verdict(3, 3, false);
        assert_eq!(down.observe(true), None);
        assert_eq!(down.observe(true), None);
        let mut next = Health::carried(3, 3, false, down.streak());
        assert_eq!(
            next.observe(true),
            Some(Flip::Up),
            "the third pass in a row"
        );
        let mut up = Health::with_verdict(3, 2, true);
        assert_eq!(up.observe(false), None);
        let mut next = Health::carried(3, 2, true, up.streak());
        assert_eq!(
            next.observe(false),
            Some(Flip::Down),
            "the second failure in a row"
        );
        // A streak the new thresholds already meet flips at the next
        // result that continues it, not before.
        let mut lowered = Health::carried(1, 3, false, 2);
        assert!(!lowered.is_healthy());
        assert_eq!(lowered.observe(true), Some(Flip::Up));
    }

    #[test]
    fn a_restore_must_rise_again() {
        let mut h = Health::with_verdict(2, 3, true);
        h.require_rise();
        assert!(!h.is_healthy());
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(true), Some(Flip::Up));
    }

    #[test]
    fn traffic_takes_down_only_what_is_up_and_checks_bring_it_back() {
        let mut h = Health::with_verdict(2, 3, true);
        assert_eq!(h.observe(false), None, "a check's failure, one of three");
        assert_eq!(h.fail_from_traffic(), Some(Flip::Down));
        assert_eq!(h.fail_from_traffic(), None, "down already");
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(true), Some(Flip::Up), "rise passes");
        let mut unknown = Health::new(2, 3);
        assert_eq!(unknown.fail_from_traffic(), None, "the first check decides");
        assert!(!unknown.has_verdict());
    }
}
