//! Running a command inside a running task (a template's change script, a script
//! check, and `alloc exec`'s interactive sessions). A task's process is the host's own, spawned for the driver
//! through `berth:host/process`, so the host enters it itself
//! ([`berth_sys::process::enter`]); the driver only says, by declaring the `exec`
//! capability, that its tasks may be entered.

use std::sync::Arc;

use berth_model::driver::TaskHandle;
use berth_sys::process::enter::{EnterSpec, Ran};
use berth_sys::process::session::{Session, WindowSize};
use berth_sys::process::{ProcessError, ProcessRef};

use super::Driver;
use crate::host_api::process::{MAX_ARG_BYTES, MAX_ARGS};

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
    #[error(
        "the command has {args} arguments, {vars} environment variables and {bytes} bytes of \
         them (at most {MAX_ARGS} each and {MAX_ARG_BYTES} bytes in all)"
    )]
    TooLarge {
        args: usize,
        vars: usize,
        bytes: usize,
    },
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
        let (owner, target, spec) = self.entry(handle, spec)?;
        Ok(self
            .runtime
            .processes()
            .run_inside(&owner, target, &spec)
            .await?)
    }

    /// Starts `spec` inside the task of `handle` as an interactive session (`alloc
    /// exec`), on a terminal of `terminal`'s size or on pipes.
    pub async fn start_session_in_task(
        &self,
        handle: &TaskHandle,
        spec: &EnterSpec,
        terminal: Option<WindowSize>,
    ) -> Result<Session, ExecError> {
        let (owner, target, spec) = self.entry(handle, spec)?;
        Ok(self
            .runtime
            .processes()
            .start_session(&owner, target, &spec, terminal)
            .await?)
    }

    /// Whether and where a command may enter the task of `handle`: the process, and
    /// the spec as the driver allows it.
    fn entry(
        &self,
        handle: &TaskHandle,
        spec: &EnterSpec,
    ) -> Result<(Arc<str>, ProcessRef, EnterSpec), ExecError> {
        let driver = self.name().to_string();
        if !self.capabilities().exec {
            return Err(ExecError::NotSupported { driver });
        }
        let bytes: usize = spec.argv.iter().map(String::len).sum::<usize>()
            + spec
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        if spec.argv.len() > MAX_ARGS || spec.env.len() > MAX_ARGS || bytes > MAX_ARG_BYTES {
            return Err(ExecError::TooLarge {
                args: spec.argv.len(),
                vars: spec.env.len(),
                bytes,
            });
        }
        // Only the built-in raw_exec's tasks run unconfined whatever their job names.
        let spec = EnterSpec {
            unconfined_allowed: matches!(self.origin(), super::DriverOrigin::Builtin)
                && driver == "raw_exec",
            ..spec.clone()
        };
        let target = match (handle.ends_with, handle.spawned.as_slice()) {
            (Some(process), _) => process,
            (None, [only]) => *only,
            _ => return Err(ExecError::NoProcess { driver }),
        };
        Ok((driver.as_str().into(), target, spec))
    }
}
