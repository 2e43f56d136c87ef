//! `berth:host/timer`: sleeping that does not count against the call's deadline, and
//! saying when a task ends, so the host waits for that time instead of the driver.

use std::time::Duration;

use crate::bindings::host::timer::Host;
use crate::sandbox::PluginCtx;

const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// Why the host refused `task-ends-after`. The guest gets the text; the call is also
/// failed as a violation, even if the guest ignores the error.
#[derive(Debug, thiserror::Error)]
enum EndsAfterRefusal {
    #[error(
        "driver {driver:?} said when its task ends outside start-task and recover-task: only \
         a task being started or recovered can say so"
    )]
    OutsideTaskStart { driver: String },
}

impl Host for PluginCtx {
    async fn sleep(&mut self, millis: u64) -> wasmtime::Result<()> {
        let duration = Duration::from_millis(millis).min(MAX_SLEEP);
        self.clock.exempt(tokio::time::sleep(duration)).await;
        Ok(())
    }

    async fn task_ends_after(&mut self, millis: u64) -> wasmtime::Result<Result<(), String>> {
        // Only for the task this call starts or recovers: any other call has no task
        // whose wait the host could take over.
        let starting_or_recovering = self.task.is_some() || self.plugin.adoptable.is_some();
        if !starting_or_recovering {
            let refusal = EndsAfterRefusal::OutsideTaskStart {
                driver: self.plugin.name.to_string(),
            }
            .to_string();
            self.violations.push(refusal.clone());
            return Ok(Err(refusal));
        }
        // A wall-clock time, so that it means the same after an agent restart. Any
        // `millis` is fine: the task is the driver's, and a far end only means the host
        // waits long (it never computes past the clock's range).
        self.task_ends_at_ms = Some(berth_model::driver::unix_ms_now().saturating_add(millis));
        Ok(Ok(()))
    }
}
