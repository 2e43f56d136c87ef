//! The task runner's hooks: one trait with a default no-op per phase, one file per
//! hook, and the order in one list ([`task_hooks`]).
//!
//! ```text
//!   prestart ──► driver start ──► poststart ──► (wait) ──► exited ──► restart? ─┐
//!      ▲                                                                       │
//!      └───────────────────────────────────────────────────────────────────────┘
//!   stop: called when the task is asked to stop, before the driver kills it
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use crate::alloc_runner::alloc_dir::AllocDir;
use crate::alloc_runner::hook_resources::HookResources;
use crate::config::AgentConfig;
use crate::jobspec::{Group, Job, Task};
use crate::runtime::driver::Driver;
use crate::runtime::sandbox::HandedMount;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What every task hook can see.
pub struct TaskHookContext {
    pub alloc_id: String,
    pub job: Arc<Job>,
    pub group: Arc<Group>,
    pub task: Task,
    pub alloc_dir: AllocDir,
    pub driver: Arc<Driver>,
    pub config: Arc<AgentConfig>,
    pub resources: Arc<HookResources>,
}

/// What prestart hooks build up for the driver.
#[derive(Debug, Clone, Default)]
pub struct TaskPrepare {
    pub task_dir: PathBuf,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<HandedMount>,
}

/// A hook's failure; the message is shown in the Setup Failure event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{hook}: {message}")]
pub struct HookError {
    pub hook: &'static str,
    pub message: String,
}

pub trait TaskHook: Send + Sync {
    fn name(&self) -> &'static str;

    fn prestart<'a>(
        &'a self,
        _ctx: &'a TaskHookContext,
        _prepare: &'a mut TaskPrepare,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async { Ok(()) })
    }

    fn poststart<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn exited<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn stop<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// The hooks, in the order they run. Later hooks see what earlier ones prepared.
pub fn task_hooks() -> Vec<Box<dyn TaskHook>> {
    vec![
        Box::new(super::task_dir_hook::TaskDirHook),
        Box::new(super::volumes_hook::VolumesHook),
    ]
}
