//! Fetches the task's `artifact` blocks into its directory before it first starts
//! (`berth-artifact`), in order, each with the task's names interpolated. A failed fetch
//! is Nomad's "Failed Artifact Download": the restart policy decides whether the task is
//! tried again. Once all were fetched the alloc's hook state says so, and a restart of
//! the task (or of the agent) does not fetch them again.

use super::hooks::{Prestart, TaskHook, TaskHookContext, TaskPrepare};
use super::interpolate_hook::runtime_names;
use berth_jobspec::interpolate::interpolate;
use berth_model::events::EventKind;
use berth_state::Commit;

pub struct ArtifactHook;

fn done_key(task: &str) -> String {
    format!("artifacts:{task}")
}

impl TaskHook for ArtifactHook {
    fn name(&self) -> &'static str {
        "artifacts"
    }

    fn failure_is_recoverable(&self) -> bool {
        true
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let artifacts = &ctx.task.artifacts;
            if artifacts.is_empty() {
                return Ok(());
            }
            let store = ctx.events.as_ref().map(|events| &events.sink.store);
            let key = done_key(&ctx.task.name);
            if store
                .is_some_and(|store| matches!(store.hook_state(&ctx.alloc_id, &key), Ok(Some(_))))
            {
                return Ok(());
            }
            ctx.report(
                EventKind::DownloadingArtifacts,
                "Client is downloading artifacts",
            );
            // `chown = true` gives the files to the task's user.
            let user = ctx.task_user().map_err(|e| self.fail(e))?;
            let lookup = runtime_names(ctx, &prepare.env);
            let names = |text: &str| interpolate(text, &lookup);
            for artifact in artifacts {
                let failed = |message: String| {
                    ctx.report(EventKind::ArtifactDownloadFailed, message.clone());
                    self.fail(message)
                };
                let plan = artifact.plan(&names).map_err(|e| failed(e.to_string()))?;
                let give: Option<berth_artifact::Give> = match (artifact.chown, user) {
                    (true, Some(user)) => {
                        let sys = ctx.sys.clone();
                        Some(std::sync::Arc::new(move |fd| sys.give_file(fd, user)))
                    }
                    _ => None,
                };
                let fetched =
                    berth_artifact::fetch(&plan, &prepare.task_dir, &ctx.config.artifact, give)
                        .await
                        .map_err(|error| {
                            failed(match error {
                                // It names the URL itself.
                                berth_artifact::ArtifactError::Download(_) => error.to_string(),
                                other => format!(
                                    "{}: {other}",
                                    berth_artifact::download::shown(&plan.url)
                                ),
                            })
                        })?;
                tracing::info!(task = %ctx.task.name, url = %berth_artifact::download::shown(&plan.url), bytes = fetched.downloaded,
                    entries = fetched.entries, "artifact fetched");
            }
            if let Some(store) = store
                && let Err(error) =
                    store.put_hook_state(&ctx.alloc_id, &key, b"fetched", Commit::Lazy)
            {
                tracing::warn!(alloc = %ctx.alloc_id, task = %ctx.task.name, %error,
                    "recording that the artifacts were fetched: a restart fetches them again");
            }
            Ok(())
        })
    }
}
