//! What evaluating one jobspec may spend: the bytes it builds, the values its functions
//! compare, and the CPU time of the thread that evaluates it. A job author is not
//! trusted, and the agent evaluates what they send, so each is bounded; past a bound the
//! evaluation stops with an error that names it, and the agent serves the next request.
//!
//! hcl-rs's functions are plain `fn`s, so the budget they draw from is the thread's: a
//! [`BudgetScope`] bounds what is evaluated on its thread until it is dropped. The
//! evaluator and the functions charge before they build or compare; each charge also
//! reads the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so time spent anywhere
//! between two charges is caught at the next one.

use std::cell::Cell;
use std::time::Duration;

/// What evaluating one jobspec may build in all: every function's result, and every
/// copy of a variable or local that a reference makes (`"${var.big}${var.big}…"`, or one
/// reference in a `for` body, counted for every element it may run over). Past it the
/// evaluation stops with an error, before the bytes are built where they can be counted
/// first, so a refused jobspec costs the agent about this much memory at most.
pub const EVALUATION_BUDGET: usize = 16 << 20;
/// What the functions of one jobspec may compare or scan in all, in bytes of the values
/// compared ([`super::functions::value_size`]): `distinct` and `toset` hash and compare
/// their list, `contains` compares its value with each element, `sort` its strings. A
/// call takes its share before it starts, so no single call runs long unbounded.
pub const COMPARISON_BUDGET: usize = 256 << 20;
/// The CPU time evaluating one jobspec may take, on the thread that evaluates it.
pub const CPU_BUDGET: Duration = Duration::from_secs(2);

/// Which bound an evaluation reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BudgetSpent {
    #[error(
        "evaluating this jobspec would build more than {} MiB (its functions' results, the \
         copies its references make, and what its loops build); berth allows {} MiB",
        EVALUATION_BUDGET >> 20,
        EVALUATION_BUDGET >> 20
    )]
    Memory,
    #[error(
        "evaluating this jobspec would compare more than {} MiB of values (distinct, toset, \
         contains, sort); berth allows {} MiB",
        COMPARISON_BUDGET >> 20,
        COMPARISON_BUDGET >> 20
    )]
    Comparisons,
    #[error(
        "evaluating this jobspec took more than {} s of CPU time; berth allows {} s",
        CPU_BUDGET.as_secs(),
        CPU_BUDGET.as_secs()
    )]
    CpuTime,
}

/// What the evaluation on this thread may still spend.
#[derive(Clone, Copy)]
struct Left {
    bytes: usize,
    comparisons: usize,
    /// The thread CPU time past which the evaluation stops.
    cpu_deadline: Duration,
}

thread_local! {
    /// `None`: no evaluation is bounded on this thread.
    static LEFT: Cell<Option<Left>> = const { Cell::new(None) };
    /// The first bound reached since the scope started.
    static REFUSED: Cell<Option<BudgetSpent>> = const { Cell::new(None) };
}

/// The CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Bounds the evaluations made on this thread until it is dropped.
pub struct BudgetScope {
    previous: Option<Left>,
    previously_refused: Option<BudgetSpent>,
}

impl BudgetScope {
    /// A scope of [`EVALUATION_BUDGET`] bytes, [`COMPARISON_BUDGET`] and [`CPU_BUDGET`].
    pub fn start() -> BudgetScope {
        BudgetScope::with(EVALUATION_BUDGET, COMPARISON_BUDGET, CPU_BUDGET)
    }

    /// A scope with other bounds (tests).
    pub fn with(bytes: usize, comparisons: usize, cpu: Duration) -> BudgetScope {
        let left = Left {
            bytes,
            comparisons,
            cpu_deadline: thread_cpu_time().saturating_add(cpu),
        };
        BudgetScope {
            previous: LEFT.with(|l| l.replace(Some(left))),
            previously_refused: REFUSED.with(|r| r.replace(None)),
        }
    }
}

impl Drop for BudgetScope {
    fn drop(&mut self) {
        LEFT.with(|l| l.set(self.previous));
        REFUSED.with(|r| r.set(self.previously_refused));
    }
}

/// Whether a [`BudgetScope`] bounds this thread's evaluations now.
pub fn in_force() -> bool {
    LEFT.with(|l| l.get().is_some())
}

/// The bound the scope in force reached, if any: the evaluation it bounds is refused,
/// and what it made is not read further.
pub fn refused() -> Option<BudgetSpent> {
    REFUSED.with(|r| r.get())
}

/// Takes `bytes` built and `compared` bytes of comparisons from the thread's budget,
/// and checks its CPU time. A charge past what is left is refused (a smaller one after
/// it may pass, as before); once the CPU time is spent every charge is refused.
fn take(bytes: usize, compared: usize) -> Result<(), BudgetSpent> {
    let Some(mut left) = LEFT.with(|l| l.get()) else {
        return Ok(());
    };
    let outcome = if bytes > left.bytes {
        Err(BudgetSpent::Memory)
    } else if compared > left.comparisons {
        Err(BudgetSpent::Comparisons)
    } else if thread_cpu_time() > left.cpu_deadline {
        Err(BudgetSpent::CpuTime)
    } else {
        left.bytes -= bytes;
        left.comparisons -= compared;
        LEFT.with(|l| l.set(Some(left)));
        Ok(())
    };
    if let Err(spent) = outcome {
        REFUSED.with(|r| {
            if r.get().is_none() {
                r.set(Some(spent));
            }
        });
    }
    outcome
}

/// Takes `bytes` from the thread's budget before they are built (and checks the time).
pub fn charge(bytes: usize) -> Result<(), BudgetSpent> {
    take(bytes, 0)
}

/// Takes `bytes` of values to compare or scan from the thread's budget, before the
/// comparisons are made (and checks the time).
pub fn charge_comparisons(bytes: usize) -> Result<(), BudgetSpent> {
    take(0, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_is_named_and_stays_reached() {
        let _scope = BudgetScope::with(100, 100, CPU_BUDGET);
        assert_eq!(charge(60), Ok(()));
        assert_eq!(charge(60), Err(BudgetSpent::Memory));
        assert_eq!(charge(40), Ok(()));
        assert_eq!(refused(), Some(BudgetSpent::Memory));
        {
            let _inner = BudgetScope::with(100, 100, CPU_BUDGET);
            assert_eq!(charge_comparisons(101), Err(BudgetSpent::Comparisons));
        }
        assert_eq!(refused(), Some(BudgetSpent::Memory));
    }

    #[test]
    fn cpu_time_is_the_threads() {
        let _scope = BudgetScope::with(usize::MAX, usize::MAX, Duration::from_millis(20));
        let started = thread_cpu_time();
        // Sleeping takes no CPU time.
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(charge(1), Ok(()));
        let mut spin = 0u64;
        while thread_cpu_time() < started + Duration::from_millis(30) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let spent = charge(1).unwrap_err();
        assert_eq!(spent, BudgetSpent::CpuTime);
        assert_eq!(charge(0), Err(BudgetSpent::CpuTime));
        assert!(
            spent.to_string().contains("more than 2 s of CPU time"),
            "{spent}"
        );
    }

    #[test]
    fn no_scope_no_bound() {
        assert_eq!(charge(usize::MAX), Ok(()));
        assert_eq!(charge_comparisons(usize::MAX), Ok(()));
    }
}
