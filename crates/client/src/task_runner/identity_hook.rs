//! Signs the task's workload identities before it starts (`crate::identity`): each
//! token into its env (`NOMAD_TOKEN`, `NOMAD_TOKEN_<name>`) and/or a file of its
//! `secrets/` (`nomad_token`, `nomad_<name>.jwt`, the task's user's, mode 0600). While
//! the task runs, a token with a `ttl` is signed again when two thirds of it have
//! passed, its file rewritten, and the task told as its `change_mode` says.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::control::TaskControl;
use super::hooks::{BoxFuture, Prestart, TaskHook, TaskHookContext, TaskPrepare};
use super::template_render::write_beneath_for;
use crate::identity::{IdentityError, Keyring, Subject, claims};
use berth_jobspec::{Identity, IdentityChange};
use berth_model::events::EventKind;

#[derive(Default)]
pub struct IdentityHook {
    renewers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// One identity signed, off the runtime's threads (the keyring may ask the store).
async fn sign(
    keyring: &Arc<Keyring>,
    ctx: &TaskHookContext,
    identity: &Identity,
) -> Result<String, IdentityError> {
    let subject = Subject {
        job: &ctx.job.name,
        group: &ctx.group.name,
        task: &ctx.task.name,
        alloc: &ctx.alloc_id,
    };
    let claims = claims(&subject, identity);
    let keyring = keyring.clone();
    tokio::task::spawn_blocking(move || keyring.sign(&claims))
        .await
        .unwrap_or(Err(IdentityError::Interrupted))
}

impl IdentityHook {
    fn stop_renewing(&self) {
        for renewer in self.renewers.lock().unwrap().drain(..) {
            renewer.abort();
        }
    }
}

impl TaskHook for IdentityHook {
    fn name(&self) -> &'static str {
        "identity"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            self.stop_renewing();
            if ctx.task.identities.is_empty() {
                return Ok(());
            }
            let owner = ctx.task_user().map_err(|e| self.fail(e))?;
            for identity in &ctx.task.identities {
                let token = sign(&ctx.identities, ctx, identity)
                    .await
                    .map_err(|e| self.fail(format!("signing identity {:?}: {e}", identity.name)))?;
                if identity.env {
                    prepare.env.push((identity.env_name(), token.clone()));
                }
                if identity.file {
                    let give = owner.map(|user| (user, &*ctx.sys));
                    write_beneath_for(
                        &prepare.task_dir,
                        &identity.file_name(),
                        token.as_bytes(),
                        0o600,
                        give,
                    )
                    .map_err(|e| self.fail(format!("writing {}: {e}", identity.file_name())))?;
                }
            }
            Ok(())
        })
    }

    fn poststart<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.renew(ctx) })
    }

    fn recovered<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.renew(ctx) })
    }

    fn stop<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.stop_renewing() })
    }

    fn exited<'a>(
        &'a self,
        _ctx: &'a TaskHookContext,
        _exit: Option<&'a berth_model::driver::ExitResult>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.stop_renewing() })
    }
}

impl Drop for IdentityHook {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

impl IdentityHook {
    /// A renewer per identity with a `ttl` and a file.
    fn renew(&self, ctx: &TaskHookContext) {
        self.stop_renewing();
        let mut renewers = self.renewers.lock().unwrap();
        for identity in &ctx.task.identities {
            let (Some(ttl), true) = (identity.ttl, identity.file) else {
                continue;
            };
            let renewer = Renewer {
                identity: identity.clone(),
                ctx: RenewContext::of(ctx),
                every: (ttl * 2 / 3).max(Duration::from_millis(500)),
            };
            renewers.push(tokio::spawn(renewer.run()));
        }
    }
}

/// What a renewer needs of the task, owned.
struct RenewContext {
    keyring: Arc<Keyring>,
    job: String,
    group: String,
    task: String,
    alloc: String,
    task_dir: std::path::PathBuf,
    owner: Option<berth_model::driver::TaskUser>,
    sys: Arc<dyn berth_sys::Sys>,
    control: Option<TaskControl>,
    /// Restarts under the task's restart policy (a renewal every second cannot restart
    /// it without end).
    restart: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    events: Option<super::events::TaskEvents>,
}

impl RenewContext {
    fn of(ctx: &TaskHookContext) -> RenewContext {
        RenewContext {
            keyring: ctx.identities.clone(),
            job: ctx.job.name.clone(),
            group: ctx.group.name.clone(),
            task: ctx.task.name.clone(),
            alloc: ctx.alloc_id.clone(),
            task_dir: ctx.alloc_dir.task_dir(&ctx.task.name),
            owner: ctx.task_user().ok().flatten(),
            sys: ctx.sys.clone(),
            control: ctx.control.clone(),
            restart: ctx.restart.clone(),
            events: ctx.events.clone(),
        }
    }

    fn event(&self, message: String) {
        match &self.events {
            Some(events) => events.emit(EventKind::TaskHook, message),
            None => tracing::warn!(alloc = %self.alloc, task = %self.task, "{message}"),
        }
    }
}

struct Renewer {
    identity: Identity,
    ctx: RenewContext,
    every: Duration,
}

impl Renewer {
    async fn run(self) {
        loop {
            tokio::time::sleep(self.every).await;
            let ctx = &self.ctx;
            let subject = Subject {
                job: &ctx.job,
                group: &ctx.group,
                task: &ctx.task,
                alloc: &ctx.alloc,
            };
            let claims = claims(&subject, &self.identity);
            let keyring = ctx.keyring.clone();
            let signed = tokio::task::spawn_blocking(move || keyring.sign(&claims)).await;
            let token = match signed {
                Ok(Ok(token)) => token,
                Ok(Err(error)) => {
                    ctx.event(format!(
                        "identity {:?} could not be renewed: {error}",
                        self.identity.name
                    ));
                    continue;
                }
                Err(_) => return,
            };
            let give = ctx.owner.map(|user| (user, &*ctx.sys));
            if let Err(error) = write_beneath_for(
                &ctx.task_dir,
                &self.identity.file_name(),
                token.as_bytes(),
                0o600,
                give,
            ) {
                ctx.event(format!(
                    "identity {:?}: writing {}: {error}",
                    self.identity.name,
                    self.identity.file_name()
                ));
                continue;
            }
            match &self.identity.change_mode {
                IdentityChange::Noop => {}
                IdentityChange::Signal(signal) => {
                    if let Some(control) = &ctx.control
                        && let Err(error) = control.signal(signal).await
                    {
                        ctx.event(format!(
                            "identity {:?} renewed: {error}",
                            self.identity.name
                        ));
                    }
                }
                IdentityChange::Restart => {
                    if let Some(restart) = &ctx.restart {
                        let _ = restart.send(format!("identity {:?} renewed", self.identity.name));
                    }
                    // The next run renews anew.
                    return;
                }
            }
        }
    }
}
