//! Renders the task's `template` blocks into its directory before it starts (in
//! consul-template's language, `berth-template`), adds the `env = true` ones to its
//! environment, and, once it runs, has `template_watch` render them again when what
//! they read changes; writes a dispatched job's payload to the task's
//! `dispatch_payload` file.
//! How files are written, beneath the task's directory and never through a link, is
//! `template_render`'s.

use std::sync::{Arc, Mutex};

use super::hooks::{BoxFuture, Prestart, TaskHook, TaskHookContext, TaskPrepare};
use super::template_data::{Watched, read_back};
use super::template_render::{
    Rendering, on_render_thread, parse_all, render_limits, template_env, write_beneath_for,
};
use berth_state::Commit;

#[derive(Default)]
pub struct TemplateHook {
    /// This run's templates, for the watcher.
    rendering: Mutex<Option<Arc<Rendering>>>,
    /// The watcher of this run (see `template_watch`).
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl TemplateHook {
    fn stop_watching(&self) {
        if let Some(watcher) = self.watcher.lock().unwrap().take() {
            watcher.abort();
        }
    }
}

impl TaskHook for TemplateHook {
    fn name(&self) -> &'static str {
        "template"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            self.stop_watching();
            // A task with ids of its own owns what is written for it (a template of
            // mode 0600 is then readable by it, and by no other user but root).
            let owner = ctx.dynamic_user.map(|user| (user, &*ctx.sys));
            if let (Some(file), Some(payload)) = (&ctx.task.dispatch_payload, &ctx.job.payload) {
                write_beneath_for(&prepare.task_dir, file, payload, 0o644, owner).map_err(|e| {
                    self.fail(format!("writing the dispatch payload to {file}: {e}"))
                })?;
            }
            if ctx.task.templates.is_empty() {
                return Ok(());
            }
            let user = ctx.task_user().map_err(|e| self.fail(e))?;
            let parsed = parse_all(&ctx.task.templates)
                .map_err(|(destination, error)| self.fail(format!("{destination}: {error}")))?;
            // Checked at submit; again here, for a job submitted before the operator
            // denied a function.
            for (template, parsed) in ctx.task.templates.iter().zip(&parsed) {
                if let Some(refusal) = ctx.config.template.refusal(parsed.functions()) {
                    return Err(self.fail(format!("{}: {refusal}", template.destination)));
                }
            }
            let env = prepare.env.iter().cloned().collect();
            let rendering = rendering(ctx, parsed, env, prepare.task_dir.clone(), user);
            // One after another, each written before the next renders: a template may
            // read (`file`) what an earlier one wrote, as consul-template would wait
            // for it.
            let renderer = rendering.clone();
            let sys = ctx.sys.clone();
            let written = on_render_thread(move || {
                let mut last = Vec::new();
                for (index, template) in renderer.templates.iter().enumerate() {
                    let failed = |message: String| (template.destination.clone(), message);
                    let (text, watched) =
                        renderer.render(index).map_err(|e| failed(e.to_string()))?;
                    let owner = renderer.owner(index).map(|user| (user, &*sys));
                    write_beneath_for(
                        &renderer.task_dir,
                        &template.destination,
                        text.as_bytes(),
                        template.perms,
                        owner,
                    )
                    .map_err(|e| failed(e.to_string()))?;
                    last.push((text, watched));
                }
                Ok(last)
            })
            .await
            .map_err(|e| self.fail(e))?;
            let last: Vec<_> = written.map_err(|(destination, message): (String, String)| {
                self.fail(format!("{destination}: {message}"))
            })?;
            let mut added = Vec::new();
            for (template, (text, _)) in ctx.task.templates.iter().zip(&last) {
                if template.env {
                    added.extend(
                        template_env(text)
                            .map_err(|e| self.fail(format!("{}: {e}", template.destination)))?,
                    );
                }
            }
            *rendering.last.lock().unwrap() = last;
            remember_env(ctx, &rendering.env);
            for (key, value) in added {
                match prepare.env.iter_mut().find(|(k, _)| *k == key) {
                    Some(existing) => existing.1 = value,
                    None => prepare.env.push((key, value)),
                }
            }
            *self.rendering.lock().unwrap() = Some(rendering);
            Ok(())
        })
    }

    fn poststart<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(rendering) = self.rendering.lock().unwrap().clone() else {
                return;
            };
            if !rendering.watches() {
                return;
            }
            let (Some(control), Some(events)) = (ctx.control.clone(), ctx.events.clone()) else {
                return;
            };
            let watcher = tokio::spawn(super::template_watch::watch(
                rendering,
                control,
                events,
                ctx.sys.clone(),
            ));
            if let Some(old) = self.watcher.lock().unwrap().replace(watcher) {
                old.abort();
            }
        })
    }

    fn exited<'a>(
        &'a self,
        _ctx: &'a TaskHookContext,
        _exit: Option<&'a berth_model::driver::ExitResult>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.stop_watching() })
    }

    fn stop<'a>(&'a self, _ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.stop_watching() })
    }

    /// After an agent restart, the running task's templates are watched again: with
    /// the environment its start rendered with (recorded then), each file's text as it
    /// is on disk, so that a change while the agent was down is rendered and acted on
    /// at the watcher's first look.
    fn recovered<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if ctx.task.templates.iter().all(|t| t.once) {
                return;
            }
            let Some(env) = recorded_env(ctx) else {
                return;
            };
            let Ok(parsed) = parse_all(&ctx.task.templates) else {
                return;
            };
            let Ok(user) = ctx.task_user() else {
                return;
            };
            let task_dir = ctx.alloc_dir.task_dir(&ctx.task.name);
            let rendering = rendering(ctx, parsed, env, task_dir, user);
            let (Some(control), Some(events)) = (ctx.control.clone(), ctx.events.clone()) else {
                return;
            };
            let sys = ctx.sys.clone();
            // On the watcher's own task: what it reads (Consul, say) may be slow to
            // answer, and the runner supervises the task meanwhile.
            let watcher = tokio::spawn(async move {
                let renderer = rendering.clone();
                let last = on_render_thread(move || {
                    let limit = render_limits().max_output as u64;
                    (0..renderer.templates.len())
                        .map(|index| {
                            // What it reads comes from a render now (a render that fails
                            // is looked at again at the watcher's first look); its text
                            // from the disk.
                            let watched = renderer
                                .render(index)
                                .map(|(_, watched)| watched)
                                .unwrap_or_else(|_| [Watched::Services].into());
                            let destination = &renderer.templates[index].destination;
                            let text = read_back(&renderer.task_dir, destination, limit)
                                .unwrap_or_default();
                            (text, watched)
                        })
                        .collect::<Vec<_>>()
                })
                .await;
                let Ok(last) = last else {
                    return;
                };
                *rendering.last.lock().unwrap() = last;
                super::template_watch::watch(rendering, control, events, sys).await;
            });
            if let Some(old) = self.watcher.lock().unwrap().replace(watcher) {
                old.abort();
            }
        })
    }
}

/// A run's templates, before anything is rendered.
fn rendering(
    ctx: &TaskHookContext,
    parsed: Vec<berth_template::Template>,
    env: std::collections::BTreeMap<String, String>,
    task_dir: std::path::PathBuf,
    user: Option<berth_model::driver::TaskUser>,
) -> Arc<Rendering> {
    Arc::new(Rendering {
        templates: ctx.task.templates.clone(),
        parsed,
        env: Arc::new(env),
        task_dir,
        user,
        services: ctx.services.clone(),
        node_address: crate::consul::service_address(ctx.config.consul.as_ref()),
        runtime: tokio::runtime::Handle::current(),
        last: Mutex::new(Vec::new()),
        consul_seen: Mutex::default(),
    })
}

/// The hook-state key of a task's template environment.
fn env_key(task: &str) -> String {
    format!("template:{task}")
}

/// Records the environment a task's templates rendered with, for the watcher of an
/// agent that restarts while the task runs.
fn remember_env(ctx: &TaskHookContext, env: &std::collections::BTreeMap<String, String>) {
    let Some(events) = &ctx.events else {
        return;
    };
    let Ok(bytes) = serde_json::to_vec(env) else {
        return;
    };
    let store = &events.sink.store;
    if let Err(error) = store.put_hook_state(
        &ctx.alloc_id,
        &env_key(&ctx.task.name),
        &bytes,
        Commit::Lazy,
    ) {
        tracing::warn!(alloc = %ctx.alloc_id, task = %ctx.task.name, %error,
            "recording the templates' environment: they are not watched after an agent restart");
    }
}

fn recorded_env(ctx: &TaskHookContext) -> Option<std::collections::BTreeMap<String, String>> {
    let events = ctx.events.as_ref()?;
    let bytes = (events.sink.store)
        .hook_state(&ctx.alloc_id, &env_key(&ctx.task.name))
        .ok()??;
    serde_json::from_slice(&bytes).ok()
}

impl Drop for TemplateHook {
    fn drop(&mut self) {
        self.stop_watching();
    }
}
