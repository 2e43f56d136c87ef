//! What the agent's API holds at once, on all its listeners: blocking queries waiting,
//! streams open, file reads in memory. Held per agent: two agents in one process (tests,
//! benches) each have their own, where process-wide counters made one agent's load
//! refuse the other's clients.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Blocking queries that may wait at once. Each holds a connection: past this many, a
/// query waits a second at most, so long-polls never take the connections other
/// requests need (the TCP listener's `max_connections` is 1024 by default; the
/// operator's socket has its own).
pub const MAX_WAITING: usize = 256;
/// Streams open at once (log follows and event streams together).
pub const MAX_STREAMS: usize = 128;
/// `cat` and `readat` answers held in the agent's memory at once (read, or being sent).
pub const MAX_READS_IN_MEMORY: usize = 32;

/// The agent's API places ([`MAX_WAITING`], [`MAX_STREAMS`], [`MAX_READS_IN_MEMORY`]).
#[derive(Debug)]
pub struct ApiPlaces {
    pub waiting: Places,
    pub streams: Places,
    pub reads: Places,
}

impl Default for ApiPlaces {
    fn default() -> Self {
        Self {
            waiting: Places::new(MAX_WAITING),
            streams: Places::new(MAX_STREAMS),
            reads: Places::new(MAX_READS_IN_MEMORY),
        }
    }
}

/// At most `max` holders at once.
#[derive(Debug)]
pub struct Places {
    taken: Arc<AtomicUsize>,
    max: usize,
}

/// One holder's place, given back when dropped.
#[derive(Debug)]
pub struct Place {
    taken: Arc<AtomicUsize>,
}

impl Places {
    pub fn new(max: usize) -> Self {
        Self {
            taken: Arc::default(),
            max,
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A place, or `None` when all are taken.
    pub fn enter(&self) -> Option<Place> {
        self.taken
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |taken| {
                (taken < self.max).then_some(taken + 1)
            })
            .ok()
            .map(|_| Place {
                taken: self.taken.clone(),
            })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.taken.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_most_no_place_is_given_until_one_comes_back() {
        let places = Places::new(3);
        let mut held: Vec<Place> = std::iter::from_fn(|| places.enter()).take(10).collect();
        assert_eq!(held.len(), 3);
        assert!(places.enter().is_none());
        held.pop();
        assert!(places.enter().is_some(), "a dropped place comes back");
        // Another agent's places are its own.
        assert!(ApiPlaces::default().waiting.enter().is_some());
    }
}
