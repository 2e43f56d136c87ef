//! Run-time interpolation of the task's env (Nomad's `${NOMAD_ALLOC_DIR}`, `${attr.*}`,
//! `${node.*}`, `${meta.*}`, `${env["X"]}`), after the task's directory, volumes and CSI
//! endpoint are known and before the operator's WASM hooks see the task. The driver
//! config is interpolated later, with the env every hook has added to
//! (`driver_config_hook.rs`).

use std::collections::BTreeMap;

use super::hooks::{Prestart, TaskHook, TaskHookContext, TaskPrepare};
use berth_jobspec::interpolate::interpolate;

pub struct InterpolateHook;

/// What `${name}` means for this task: its env (which holds `NOMAD_*`), `meta.*` (job,
/// then group, then task meta, the later winning, as Nomad merges them), and the node's
/// attributes with `attr.driver.<its driver>`.
pub fn runtime_names(
    ctx: &TaskHookContext,
    env: &[(String, String)],
) -> impl Fn(&str) -> Option<String> + use<> {
    let mut names: BTreeMap<String, String> = (*ctx.facts).clone();
    names.insert(format!("attr.driver.{}", ctx.driver.name()), "1".into());
    for (key, value) in ctx
        .job
        .meta
        .iter()
        .chain(&ctx.group.meta)
        .chain(&ctx.task.meta)
    {
        names.insert(format!("meta.{key}"), value.clone());
    }
    for (key, value) in env {
        names.insert(key.clone(), value.clone());
    }
    move |name: &str| names.get(name).cloned()
}

impl TaskHook for InterpolateHook {
    fn name(&self) -> &'static str {
        "interpolate"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let lookup = runtime_names(ctx, &prepare.env);
            for (_, value) in prepare.env.iter_mut() {
                *value = interpolate(value, &lookup);
            }
            prepare.interpolated_env = prepare.env.clone();
            Ok(())
        })
    }
}
