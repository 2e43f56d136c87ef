//! Runs the operator's WASM hooks ([`berth_runtime::hook`]) for a task, in order.
//! Prestart may add env and files or refuse the task; a hook that fails fails the task
//! with its reason (`on_failure = "fail"`) or is reported and skipped (`"ignore"`).
//! Notifications (poststart, exited, stop) cannot change the task; their failures are
//! reported as events.

use std::path::PathBuf;

use super::hooks::{BoxFuture, HookError, Prestart, TaskHook, TaskHookContext, TaskPrepare};
use berth_model::driver::ExitResult;
use berth_model::events::EventKind;
use berth_model::hook::OnFailure;
use berth_runtime::hook::{Hook, HookFailure, HookTaskContext, Notification};

pub struct WasmHooks;

fn hook_context(ctx: &TaskHookContext, env: &[(String, String)]) -> HookTaskContext {
    let task = &ctx.task;
    HookTaskContext {
        job_name: ctx.job.name.clone(),
        group_name: ctx.group.name.clone(),
        task_name: task.name.clone(),
        alloc_id: ctx.alloc_id.clone(),
        driver: task.driver.clone(),
        task_config: task.config.to_string(),
        env: env.to_vec(),
        meta: task.meta.clone(),
        volumes: task
            .volume_mounts
            .iter()
            .map(|m| {
                let volume_read_only = ctx
                    .group
                    .volumes
                    .iter()
                    .any(|v| v.name == m.volume && v.read_only);
                (
                    m.volume.clone(),
                    m.destination.clone(),
                    m.read_only || volume_read_only,
                )
            })
            .collect(),
    }
}

fn local_dir(ctx: &TaskHookContext) -> PathBuf {
    ctx.alloc_dir.task_dir(&ctx.task.name).join("local")
}

fn ignored(hook: &Hook, failure: &HookFailure) -> String {
    format!(
        "{} failed and was ignored (on_failure = \"ignore\"): {failure}",
        hook.label()
    )
}

impl TaskHook for WasmHooks {
    fn name(&self) -> &'static str {
        "wasm_hooks"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let local = prepare.task_dir.join("local");
            for hook in &ctx.plugin_hooks {
                let context = hook_context(ctx, &prepare.env);
                match hook.prestart(&context, &local).await {
                    Ok(output) => {
                        for (key, value) in output.env {
                            match prepare.env.iter_mut().find(|(k, _)| *k == key) {
                                Some(existing) => existing.1 = value,
                                None => prepare.env.push((key, value)),
                            }
                        }
                        for event in output.events {
                            ctx.report(
                                EventKind::TaskHook,
                                format!("hook {:?}: {event}", hook.name()),
                            );
                        }
                        if !output.files.is_empty() {
                            let files: Vec<String> = output
                                .files
                                .iter()
                                .map(|f| format!("local/{}", f.display()))
                                .collect();
                            ctx.report(
                                EventKind::TaskHook,
                                format!("hook {:?} wrote {}", hook.name(), files.join(", ")),
                            );
                        }
                    }
                    Err(failure) => match hook.spec().on_failure {
                        OnFailure::Fail => {
                            return Err(HookError {
                                hook: hook.label(),
                                message: failure.to_string(),
                            });
                        }
                        OnFailure::Ignore => {
                            ctx.report(EventKind::TaskHook, ignored(hook, &failure))
                        }
                    },
                }
            }
            Ok(())
        })
    }

    fn poststart<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(notify_all(ctx, Notification::Poststart))
    }

    fn exited<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        exit: Option<&'a ExitResult>,
    ) -> BoxFuture<'a, ()> {
        let notification = Notification::Exited {
            exit_code: exit.map_or(-1, |e| e.exit_code),
            signal: exit.map_or(0, |e| e.signal),
            failed: !exit.is_some_and(|e| e.successful()),
        };
        Box::pin(notify_all(ctx, notification))
    }

    fn stop<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(notify_all(ctx, Notification::Stop))
    }
}

async fn notify_all(ctx: &TaskHookContext, notification: Notification) {
    if ctx.plugin_hooks.is_empty() {
        return;
    }
    let context = hook_context(ctx, &ctx.task.env);
    let local = local_dir(ctx);
    for hook in &ctx.plugin_hooks {
        if let Err(failure) = hook.notify(notification, &context, &local).await {
            ctx.report(EventKind::TaskHook, format!("{}: {failure}", hook.label()));
        }
    }
}
