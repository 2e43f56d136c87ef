//! One lock per job id, for what must not interleave on one job: a submit (or stop) and
//! a purge of it, and the collector forgetting it. Without it a purge that had found
//! the job without allocs removed its record just after a resubmit placed new ones: the
//! allocs ran on, listed under no job, and after a restart were "not recorded".
//!
//! Order: a job's lock before the agent's `submitting` lock, never the other way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::OwnedMutexGuard;

/// A job's lock is kept while someone holds or waits for it, and dropped after.
#[derive(Default)]
pub(super) struct JobLocks {
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl JobLocks {
    /// The lock of job `id`, shared with whoever holds or waits for it now.
    fn of(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap();
        // Only locks someone holds or waits for are alive: the map stays that small.
        locks.retain(|_, lock| lock.strong_count() > 0);
        if let Some(lock) = locks.get(id).and_then(Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(id.to_string(), Arc::downgrade(&lock));
        lock
    }

    /// Waits for job `id`'s lock.
    pub(super) async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
        self.of(id).lock_owned().await
    }

    /// Job `id`'s lock when no one holds it now.
    pub(super) fn try_lock(&self, id: &str) -> Option<OwnedMutexGuard<()>> {
        self.of(id).try_lock_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_job_waits_for_its_own_lock_only() {
        let locks = JobLocks::default();
        let held = locks.lock("a").await;
        assert!(locks.try_lock("a").is_none(), "a held lock is taken again");
        assert!(
            locks.try_lock("b").is_some(),
            "another job waits on a's lock"
        );
        drop(held);
        assert!(locks.try_lock("a").is_some(), "a released lock stays taken");
        drop(locks.lock("a").await);
        assert!(
            locks
                .locks
                .lock()
                .unwrap()
                .values()
                .all(|l| l.strong_count() == 0),
            "a lock no one holds is kept alive"
        );
    }
}
