//! The threads jobspecs are evaluated on: [`THREADS`] of them, with stacks of
//! [`STACK_BYTES`], started when the first jobspec is parsed.
//!
//! Evaluating what a job author sent takes CPU time (up to the budget's
//! [`super::budget::CPU_BUDGET`]) and recurses as deep as the jobspec nests (up to
//! [`super::nesting::MAX_NESTING`]). On the async runtime's workers it would hold them
//! from everything else the agent answers (the operator's `GET /v1/agent/health` waited
//! 3.8 s behind two expensive jobspecs); here it waits its turn, the workers stay free,
//! and the stack it recurses on is one sized for the bound. A panic in an evaluation is
//! caught here: the thread goes on with the next one.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

/// How many jobspecs are evaluated at once.
pub const THREADS: usize = 2;
/// The stack of each evaluating thread.
pub const STACK_BYTES: usize = 16 << 20;

/// Why an evaluation did not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the agent cannot start the threads that evaluate jobspecs: {0}")]
    NoThreads(String),
    #[error("the evaluation of the jobspec stopped on an internal error (see the agent's log)")]
    Panicked,
}

type Work = Box<dyn FnOnce() + Send>;

thread_local! {
    /// Whether this thread is one of the pool's (work it sends runs in place).
    static ON_POOL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The queue the pool's threads take work from; started once.
fn queue() -> Result<&'static Mutex<Sender<Work>>, PoolError> {
    static QUEUE: OnceLock<Result<Mutex<Sender<Work>>, PoolError>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (sender, receiver) = channel::<Work>();
            let receiver = Arc::new(Mutex::new(receiver));
            for index in 0..THREADS {
                let receiver = receiver.clone();
                std::thread::Builder::new()
                    .name(format!("berth-hcl-{index}"))
                    .stack_size(STACK_BYTES)
                    .spawn(move || serve(&receiver))
                    .map_err(|e| PoolError::NoThreads(e.to_string()))?;
            }
            Ok(Mutex::new(sender))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// One pool thread: runs what it takes from the queue, one at a time, for the life of
/// the process.
fn serve(receiver: &Mutex<Receiver<Work>>) {
    ON_POOL.with(|on| on.set(true));
    loop {
        // The lock is held while waiting: the other thread waits for the lock instead.
        let next = receiver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .recv();
        match next {
            Ok(work) => work(),
            Err(_) => return,
        }
    }
}

/// Sends `work` to the pool; `done` gets its result, or [`PoolError::Panicked`].
fn send<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
    done: impl FnOnce(Result<T, PoolError>) + Send + 'static,
) -> Result<(), PoolError> {
    let wrapped: Work = Box::new(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        if outcome.is_err() {
            tracing::error!("a jobspec evaluation panicked; the jobspec is refused");
        }
        done(outcome.map_err(|_| PoolError::Panicked));
    });
    queue()?
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send(wrapped)
        .map_err(|_| PoolError::NoThreads("the evaluating threads are gone".into()))
}

/// Runs `work` on the pool and waits for it, blocking this thread (in place when this
/// thread is the pool's).
pub fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolError> {
    if ON_POOL.with(|on| on.get()) {
        return Ok(work());
    }
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    send(work, move |outcome| {
        let _ = sender.send(outcome);
    })?;
    receiver.recv().unwrap_or(Err(PoolError::Panicked))
}

/// Runs `work` on the pool; the task awaiting it holds no thread meanwhile.
pub async fn run_async<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PoolError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    send(work, move |outcome| {
        let _ = sender.send(outcome);
    })?;
    receiver.await.unwrap_or(Err(PoolError::Panicked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_a_pool_thread_with_its_stack() {
        let name = run(|| std::thread::current().name().map(str::to_string)).unwrap();
        assert!(name.unwrap().starts_with("berth-hcl-"));
        // Work sent from the pool runs in place (no deadlock when both threads do).
        let nested = run(|| run(|| 7)).unwrap();
        assert_eq!(nested, Ok(7));
    }

    #[test]
    fn a_panic_is_an_error_and_the_pool_goes_on() {
        for _ in 0..THREADS + 1 {
            assert_eq!(run(|| -> u8 { panic!("boom") }), Err(PoolError::Panicked));
        }
        assert_eq!(run(|| 1 + 1), Ok(2));
    }

    #[tokio::test]
    async fn async_callers_wait_without_a_thread() {
        assert_eq!(run_async(|| "x".repeat(3)).await, Ok("xxx".to_string()));
    }
}
