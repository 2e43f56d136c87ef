//! Running a command inside a running task (a template's change script, later script
//! checks and `alloc exec`). A task's process is the host's own, spawned for the driver
//! through `berth:host/process`, so the host enters it itself
//! ([`berth_sys::process::enter`]); the driver only says, by declaring the `exec`
//! capability, that its tasks may be entered.

use std::sync::Arc;

use berth_model::driver::TaskHandle;
use berth_sys::process::ProcessError;
use berth_sys::process::enter::{EnterSpec, Ran};

use super::Driver;

/// Why a command could not be run inside a task.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(
        "task driver {driver:?} cannot run commands inside its tasks (it does not declare the \
         exec capability)"
    )]
    NotSupported { driver: String },
    #[error(
        "task driver {driver:?} started this task without one main process berth runs, so \
         there is nothing to run a command inside"
    )]
    NoProcess { driver: String },
    #[error("running a command inside the task: {0}")]
    Process(#[from] ProcessError),
}

impl Driver {
    /// Runs `spec` inside the task of `handle`: in the process it ends with (or the only
    /// one it spawned), with that process's confinement.
    pub async fn run_in_task(
        &self,
        handle: &TaskHandle,
        spec: &EnterSpec,
    ) -> Result<Ran, ExecError> {
        let driver = self.name().to_string();
        if !self.capabilities().exec {
            return Err(ExecError::NotSupported { driver });
        }
        let target = match (handle.ends_with, handle.spawned.as_slice()) {
            (Some(process), _) => process,
            (None, [only]) => *only,
            _ => return Err(ExecError::NoProcess { driver }),
        };
        let owner: Arc<str> = driver.as_str().into();
        Ok(self
            .runtime
            .processes()
            .run_inside(&owner, target, spec)
            .await?)
    }
}
