//! Renders the task's `template` blocks into its directory before it starts (in
//! consul-template's language, `berth-template`), adds the `env = true` ones to its
//! environment, and, once it runs, has `template_watch` render them again when what
//! they read changes; writes a dispatched job's payload to the task's
//! `dispatch_payload` file.
//! How files are written, beneath the task's directory and never through a link, is
//! `template_render`'s.

use std::sync::{Arc, Mutex};

use super::hooks::{BoxFuture, Prestart, TaskHook, TaskHookContext, TaskPrepare};
use super::template_render::{
    Rendering, on_render_thread, parse_all, template_env, write_beneath_for,
};

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
            let rendering = Arc::new(Rendering {
                templates: ctx.task.templates.clone(),
                parsed,
                env: Arc::new(prepare.env.iter().cloned().collect()),
                task_dir: prepare.task_dir.clone(),
                user,
                services: ctx.services.clone(),
                node_address: crate::consul::service_address(ctx.config.consul.as_ref()),
                runtime: tokio::runtime::Handle::current(),
                last: Mutex::new(Vec::new()),
            });
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
}

impl Drop for TemplateHook {
    fn drop(&mut self) {
        self.stop_watching();
    }
}
