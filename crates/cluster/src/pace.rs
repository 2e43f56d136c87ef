//! The pace of a loop that acts on a stream of changes (the scheduler's rounds, a node's
//! passes over its placements): a change that comes a while after the last pass is acted
//! on at once, so a job's start waits for no timer; one that comes sooner waits out the
//! rest of the gap, and the changes that come meanwhile are taken in the same pass, so a
//! stream of them makes a pass every gap, not one each.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Pace {
    gap: Duration,
    last: Option<Instant>,
}

impl Pace {
    /// The least time from one pass's start to the next's.
    pub fn new(gap: Duration) -> Pace {
        Pace { gap, last: None }
    }

    /// How long a pass that would begin now is to wait: zero when the last began at
    /// least a gap ago (or none has).
    pub fn rest(&self) -> Duration {
        self.rest_at(Instant::now())
    }

    fn rest_at(&self, now: Instant) -> Duration {
        self.last.map_or(Duration::ZERO, |last| {
            self.gap.saturating_sub(now.saturating_duration_since(last))
        })
    }

    /// A pass begins now.
    pub fn began(&mut self) {
        self.last = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_waits_only_for_what_is_left_of_the_gap_since_the_last() {
        let gap = Duration::from_millis(2);
        let mut pace = Pace::new(gap);
        let start = Instant::now();
        assert_eq!(
            pace.rest_at(start),
            Duration::ZERO,
            "the first pass waits for nothing"
        );
        pace.last = Some(start);
        assert_eq!(pace.rest_at(start), gap);
        assert_eq!(
            pace.rest_at(start + Duration::from_micros(500)),
            Duration::from_micros(1500)
        );
        assert_eq!(pace.rest_at(start + gap), Duration::ZERO);
        assert_eq!(pace.rest_at(start + Duration::from_secs(1)), Duration::ZERO);
        pace.began();
        assert!(pace.last.is_some_and(|last| last >= start));
        assert!(pace.rest() <= gap);
    }
}
