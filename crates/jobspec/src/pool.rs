//! The threads jobspecs are evaluated on: [`THREADS`] of them, with stacks of
//! [`STACK_BYTES`], started when the first jobspec is parsed.
//!
//! Evaluating what a job author sent takes CPU time (up to the budget's
//! [`berth_hcl::budget::CPU_BUDGET`]) and recurses as deep as the jobspec nests (up to
//! [`berth_hcl::nesting::MAX_NESTING`]). On the async runtime's workers it would hold them
//! from everything else the agent answers (the operator's `GET /v1/agent/health` waited
//! 3.8 s behind two expensive jobspecs); here it waits its turn, the workers stay free,
//! and the stack it recurses on is one sized for the bound. A panic in an evaluation is
//! caught here: the thread goes on with the next one.
//!
//! The operator's requests ([`in_operator_lane`]) have a thread of their own: their
//! jobspecs never wait behind job authors' (two expensive ones hold both shared threads
//! for their whole budget, and 32 more may queue behind them).

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

/// How many jobspecs are evaluated at once.
pub const THREADS: usize = 2;
/// The stack of each evaluating thread.
pub const STACK_BYTES: usize = 16 << 20;

/// How many evaluations may wait for a thread. Past it a request is refused at once
/// (the agent is busy, try again) rather than queued behind minutes of others' work.
pub const MAX_WAITING: usize = 32;

/// Why an evaluation did not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(
        "the agent is evaluating too many jobspecs ({MAX_WAITING} wait already); try again \
         shortly"
    )]
    Busy,
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

/// Threads and the queue they take work from.
struct Pool {
    queue: Mutex<Sender<Work>>,
    /// Evaluations sent and not yet started.
    waiting: std::sync::atomic::AtomicUsize,
    max_waiting: usize,
}

impl Pool {
    fn start(name: &str, threads: usize, max_waiting: usize) -> Result<Pool, PoolError> {
        let (sender, receiver) = channel::<Work>();
        let receiver = Arc::new(Mutex::new(receiver));
        for index in 0..threads {
            let receiver = receiver.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .stack_size(STACK_BYTES)
                .spawn(move || serve(&receiver))
                .map_err(|e| PoolError::NoThreads(e.to_string()))?;
        }
        Ok(Pool {
            queue: Mutex::new(sender),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            max_waiting,
        })
    }
}

/// The agent's pool; started once.
fn pool() -> Result<&'static Arc<Pool>, PoolError> {
    static POOL: OnceLock<Result<Arc<Pool>, PoolError>> = OnceLock::new();
    POOL.get_or_init(|| Pool::start("berth-hcl", THREADS, MAX_WAITING).map(Arc::new))
        .as_ref()
        .map_err(Clone::clone)
}

/// The operator's lane: one thread of its own; started once, when first used.
fn operator_pool() -> Result<&'static Arc<Pool>, PoolError> {
    static POOL: OnceLock<Result<Arc<Pool>, PoolError>> = OnceLock::new();
    POOL.get_or_init(|| Pool::start("berth-hcl-operator", 1, MAX_WAITING).map(Arc::new))
        .as_ref()
        .map_err(Clone::clone)
}

tokio::task_local! {
    /// Set while the operator's request is served.
    static OPERATOR: ();
}

/// Runs `request` (the operator's: the Unix socket, or the operator's token) so its
/// evaluations take the operator's lane.
pub async fn in_operator_lane<F: std::future::Future>(request: F) -> F::Output {
    OPERATOR.scope((), request).await
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

/// Sends `work` to the pool; `done` gets its result, or [`PoolError::Panicked`]. Work
/// whose caller has gone (`abandoned`) when its turn comes is not run: a client that
/// hangs up leaves nothing queued behind it. Refused with [`PoolError::Busy`] when
/// [`MAX_WAITING`] wait already.
fn send<T: Send + 'static>(
    pool: &Arc<Pool>,
    work: impl FnOnce() -> T + Send + 'static,
    abandoned: impl Fn() -> bool + Send + 'static,
    done: impl FnOnce(Result<T, PoolError>) + Send + 'static,
) -> Result<(), PoolError> {
    use std::sync::atomic::Ordering;
    if pool.waiting.fetch_add(1, Ordering::SeqCst) >= pool.max_waiting {
        pool.waiting.fetch_sub(1, Ordering::SeqCst);
        return Err(PoolError::Busy);
    }
    let started = pool.clone();
    let wrapped: Work = Box::new(move || {
        started.waiting.fetch_sub(1, Ordering::SeqCst);
        if abandoned() {
            return;
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        if outcome.is_err() {
            tracing::error!("a jobspec evaluation panicked; the jobspec is refused");
        }
        done(outcome.map_err(|_| PoolError::Panicked));
    });
    let sent = pool
        .queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send(wrapped)
        .map_err(|_| PoolError::NoThreads("the evaluating threads are gone".into()));
    if sent.is_err() {
        pool.waiting.fetch_sub(1, Ordering::SeqCst);
    }
    sent
}

/// Runs `work` on the pool and waits for it, blocking this thread (in place when this
/// thread is the pool's).
pub fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolError> {
    if ON_POOL.with(|on| on.get()) {
        return Ok(work());
    }
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    send(
        pool()?,
        work,
        || false,
        move |outcome| {
            let _ = sender.send(outcome);
        },
    )?;
    receiver.recv().unwrap_or(Err(PoolError::Panicked))
}

/// Runs `work` on the pool; the task awaiting it holds no thread meanwhile.
pub async fn run_async<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PoolError> {
    let lane = match OPERATOR.try_with(|_| ()) {
        Ok(()) => operator_pool()?,
        Err(_) => pool()?,
    };
    run_async_on(lane, work).await
}

async fn run_async_on<T: Send + 'static>(
    pool: &Arc<Pool>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PoolError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let sender = Arc::new(Mutex::new(Some(sender)));
    let watched = sender.clone();
    send(
        pool,
        work,
        // The awaiting future was dropped (its client hung up): nothing to run for.
        move || {
            watched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .is_none_or(|sender| sender.is_closed())
        },
        move |outcome| {
            if let Some(sender) = sender
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
            {
                let _ = sender.send(outcome);
            }
        },
    )?;
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

    /// Work whose awaiting future is dropped before its turn is not run, and past its
    /// `max_waiting` waiting evaluations the next is refused at once.
    #[tokio::test(flavor = "multi_thread")]
    async fn abandoned_work_is_skipped_and_a_full_queue_refuses() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const WAITING: usize = 4;
        let pool = Arc::new(Pool::start("berth-hcl-test", 1, WAITING).unwrap());
        let waiting = |pool: &Arc<Pool>| pool.waiting.load(Ordering::SeqCst);
        // Hold the one thread.
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let (held, holding) = tokio::sync::oneshot::channel::<()>();
        let holder = tokio::spawn({
            let pool = pool.clone();
            async move {
                run_async_on(&pool, move || {
                    let _ = held.send(());
                    let _ = hold.recv();
                })
                .await
            }
        });
        holding.await.unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let mut dropped = Vec::new();
        for _ in 0..WAITING {
            let (pool, ran) = (pool.clone(), ran.clone());
            dropped.push(tokio::spawn(async move {
                run_async_on(&pool, move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        while waiting(&pool) < WAITING {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(run_async_on(&pool, || 1).await, Err(PoolError::Busy));
        for waiter in &dropped {
            waiter.abort();
        }
        for waiter in dropped {
            let _ = waiter.await;
        }
        release.send(()).unwrap();
        holder.await.unwrap().unwrap();
        // The thread goes through the abandoned ones, running none.
        while waiting(&pool) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(run_async_on(&pool, || 2).await, Ok(2));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "abandoned work ran");
    }

    #[tokio::test]
    async fn async_callers_wait_without_a_thread() {
        assert_eq!(run_async(|| "x".repeat(3)).await, Ok("xxx".to_string()));
    }
}
