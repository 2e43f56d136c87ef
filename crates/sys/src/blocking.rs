//! Blocking work done from async code: an fsync'd state commit, building or removing a
//! directory tree, reading `/proc/self/mountinfo`. On the agent's multi-threaded tokio
//! runtime such work runs through [`tokio::task::block_in_place`], so the worker thread
//! hands its other tasks to another worker before it blocks and no task stalls behind a
//! disk. Elsewhere (a current-thread runtime, a plain thread) it runs inline, where
//! blocking is what the caller expects.
//!
//! Callers keep their synchronous signatures: durable intent is still written before the
//! effect that relies on it, in the same order.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `work`, which may block, without stalling other tasks of a multi-threaded runtime.
pub fn run<T>(work: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    /// While one task blocks in `run`, another task that was queued behind it on the
    /// same worker still makes progress: the blocking is moved off the worker.
    #[test]
    fn blocking_work_does_not_stall_the_other_tasks() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let ticks = runtime.block_on(async {
            let ticker = tokio::spawn(async {
                let mut ticks = 0;
                let end = Instant::now() + Duration::from_millis(300);
                while Instant::now() < end {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks += 1;
                }
                ticks
            });
            tokio::spawn(async { super::run(|| std::thread::sleep(Duration::from_millis(300))) })
                .await
                .unwrap();
            ticker.await.unwrap()
        });
        // With the sleep on the only worker (plain std::thread::sleep) the ticker would
        // get no turn for 300 ms and count at most a couple of ticks.
        assert!(ticks >= 10, "the ticker ran only {ticks} times");
    }

    #[test]
    fn runs_inline_outside_a_multi_threaded_runtime() {
        assert_eq!(super::run(|| 7), 7);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(runtime.block_on(async { super::run(|| 8) }), 8);
    }
}
