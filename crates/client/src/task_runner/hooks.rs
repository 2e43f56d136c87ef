//! The task runner's hooks: one trait with a default no-op per phase, one file per
//! hook, and the order in one list (`task_hooks` in the runner).
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
use std::sync::{Arc, Mutex};

use crate::config::AgentConfig;
use berth_csi::CsiNode;
use berth_jobspec::{Group, Job, Task};
use berth_model::driver::ExitResult;
use berth_model::events::EventKind;
use berth_model::hook_resources::HookResources;
use berth_model::mount::HandedMount;
use berth_runtime::driver::Driver;
use berth_runtime::hook::Hook;
use berth_sys::alloc_dir::AllocDir;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a hook's prestart returns.
pub type Prestart<'a> = BoxFuture<'a, Result<(), HookError>>;

/// What every task hook can see.
pub struct TaskHookContext {
    pub alloc_id: String,
    pub job: Arc<Job>,
    pub group: Arc<Group>,
    pub task: Task,
    /// The uid (and, as its group, the alloc's gid) the alloc took for this task from
    /// `user { dynamic_range }`; `None` when it runs as its job's user, or as today's.
    pub dynamic_user: Option<berth_model::driver::TaskUser>,
    pub alloc_dir: AllocDir,
    pub driver: Arc<Driver>,
    pub config: Arc<AgentConfig>,
    pub resources: Arc<HookResources>,
    /// The operator's WASM hooks that run for this task, in order.
    pub plugin_hooks: Vec<Arc<Hook>>,
    /// Events hooks want shown; the runner emits them after each hook phase.
    pub reports: Arc<Mutex<Vec<(EventKind, String)>>>,
    pub csi: Arc<CsiNode>,
    /// The privileged operations (cgroups, ownership, users).
    pub sys: Arc<dyn berth_sys::Sys>,
    pub services: Arc<crate::consul::ServiceClient>,
    /// Signs the task's workload identities.
    pub identities: Arc<crate::identity::Keyring>,
    /// This node's attributes, for `${attr.…}` and `${node.…}`.
    pub facts: crate::node::Facts,
    /// Set by the task runner: emits an event at once, for hooks that watch the task in
    /// the background (the CSI plugin supervisor).
    pub events: Option<super::events::TaskEvents>,
    /// Set by the task runner: asks it to restart the task, with the reason.
    pub restart: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// Set by the task runner: what a user may ask of the task (a restart outside the
    /// policy, a signal), for hooks that act on a running task (templates).
    pub control: Option<super::control::TaskControl>,
    /// Makes the task's own network when its driver asks for one (an image task's
    /// Docker default, in a host-mode group).
    pub own_network: Option<berth_model::driver::TaskNetworkMaker>,
    /// Releases that network once the task is over for good.
    pub release_own_network: Option<berth_model::driver::ReleaseTaskNetwork>,
}

impl TaskHookContext {
    /// The user the task runs as (its own dynamic uid, its job's `user`, or `None`:
    /// the agent's), by the rule of `validate::task_user` the runner starts it with.
    pub fn task_user(
        &self,
    ) -> Result<Option<berth_model::driver::TaskUser>, crate::validate::UserRefusal> {
        let user = crate::validate::task_user(
            &self.job,
            &self.task,
            self.driver.capabilities().fs_isolation,
            &self.config,
            &|name| self.sys.lookup_user(name),
            crate::validate::DynamicIds::Taken(self.dynamic_user),
        )?;
        Ok(user.map(|(_, user)| user))
    }

    /// Queues a task event from a hook.
    pub fn report(&self, kind: EventKind, message: impl Into<String>) {
        self.reports.lock().unwrap().push((kind, message.into()));
    }
}

/// What prestart hooks build up for the driver.
#[derive(Debug, Clone, Default)]
pub struct TaskPrepare {
    pub task_dir: PathBuf,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<HandedMount>,
    /// The driver config with run-time names interpolated (`None`: as in the jobspec).
    pub config: Option<serde_json::Value>,
    /// The env as the interpolation hook left it, before identities, templates and the
    /// operator's hooks add to it: what berth and the job define, which those later
    /// additions may not redefine in the driver config.
    pub interpolated_env: Vec<(String, String)>,
}

/// A hook's failure; the message is shown in the Setup Failure event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{hook}: {message}")]
pub struct HookError {
    /// `task_dir`, or for a WASM hook its label (`hook "policy" (/h/policy.wasm)`).
    pub hook: String,
    pub message: String,
}

pub trait TaskHook: Send + Sync {
    fn name(&self) -> &'static str;

    fn prestart<'a>(
        &'a self,
        _ctx: &'a TaskHookContext,
        _prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async { Ok(()) })
    }

    /// Whether a failure of this hook's prestart is worth another try (a download),
    /// under the task's restart policy, rather than the task's end (a bad config). Such a
    /// hook reports its own failure event (Nomad names it by hook); the runner adds none.
    fn failure_is_recoverable(&self) -> bool {
        false
    }

    /// This hook's failure, shown as `<name>: <message>` in the Setup Failure event.
    fn fail(&self, message: impl std::fmt::Display) -> HookError
    where
        Self: Sized,
    {
        HookError {
            hook: self.name().into(),
            message: message.to_string(),
        }
    }

    fn poststart<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// `exit` is `None` when the driver could not say how the task ended.
    fn exited<'a>(
        &'a self,
        _ctx: &'a TaskHookContext,
        _exit: Option<&'a ExitResult>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn stop<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// The task was recovered after an agent restart: prestart and poststart ran in
    /// the previous agent and are not run again.
    fn recovered<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}
