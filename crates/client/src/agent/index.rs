//! The agent's change index: what Nomad's API calls the index (`X-Nomad-Index`), raised
//! on every change a client could watch (a task event, a job recorded, stopped or
//! collected). Blocking queries wait on it.
//!
//! Each change sets it to the clock in milliseconds, or one more than before when the
//! clock has not moved past it: so it only grows, across restarts too, without a write
//! per change, and the times berth records (a job's submit time, an event's time) are
//! indexes in the same scale, never ahead of the index of the change that made them.

use std::time::Duration;

use tokio::sync::watch;

pub struct ChangeIndex {
    current: watch::Sender<u64>,
    /// In a cluster the index is the cluster store's revision (every change a client
    /// could watch is written there): local bumps do nothing, [`ChangeIndex::advance_to`]
    /// moves it.
    follows_store: bool,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2))
}

impl Default for ChangeIndex {
    fn default() -> Self {
        ChangeIndex {
            current: watch::Sender::new(now_ms().max(1)),
            follows_store: false,
        }
    }
}

impl ChangeIndex {
    pub fn current(&self) -> u64 {
        *self.current.borrow()
    }

    /// An index that is the cluster store's revision, from `revision` on.
    pub fn following_store(revision: u64) -> ChangeIndex {
        ChangeIndex {
            current: watch::Sender::new(revision.max(1)),
            follows_store: true,
        }
    }

    /// The store is at `revision` (never moves the index back).
    pub fn advance_to(&self, revision: u64) {
        self.current.send_if_modified(|index| {
            let moved = revision > *index;
            *index = (*index).max(revision);
            moved
        });
    }

    /// Something changed.
    pub fn bump(&self) {
        if self.follows_store {
            return;
        }
        let now = now_ms();
        self.current
            .send_modify(|index| *index = index.saturating_add(1).max(now));
    }

    /// Waits until the index is past `index`, or `wait` passed; the index then. An
    /// `index` from the future (a client that watched an agent before this one started)
    /// answers at once, as a reset: the client starts again from what it gets.
    pub async fn wait_past(&self, index: u64, wait: Duration) -> u64 {
        let mut changes = self.current.subscribe();
        let now = *changes.borrow_and_update();
        if now > index || index > now.saturating_add(1_000_000_000) {
            return now;
        }
        let _ = tokio::time::timeout(wait, changes.wait_for(|current| *current > index)).await;
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_ends_at_the_next_change_and_otherwise_at_its_deadline() {
        let index = std::sync::Arc::new(ChangeIndex::default());
        let at = index.current();
        assert_eq!(index.wait_past(at - 1, Duration::from_secs(60)).await, at);
        let started = std::time::Instant::now();
        assert_eq!(index.wait_past(at, Duration::from_millis(50)).await, at);
        assert!(started.elapsed() >= Duration::from_millis(50));
        let bumper = index.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            bumper.bump();
        });
        let bumped = index.wait_past(at, Duration::from_secs(60)).await;
        // One more, or the clock when it has moved past.
        assert!(
            bumped > at && bumped + 1_000 >= now_ms(),
            "{bumped} after {at}"
        );
        // From the future: at once.
        assert_eq!(
            index.wait_past(u64::MAX - 1, Duration::from_secs(60)).await,
            bumped
        );
    }
}
