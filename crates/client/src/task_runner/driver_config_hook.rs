//! The driver config's run-time interpolation (`${NOMAD_ALLOC_DIR}`, `${meta.owner}`, a
//! hook's `${GREETING}`) with the env the task starts with. It runs after every hook that
//! adds to that env (identities, templates with `env = true`, the operator's WASM hooks),
//! as Nomad builds a task's environment before it reads the driver config. It reads the
//! config as written, once, so no value is interpolated twice.
//!
//! What berth and the job define (`NOMAD_*`, the job's `env`, `meta.*`, `attr.*`) keeps
//! its value here: a later addition only fills a name nothing defined before it. A hook
//! (whose author is not trusted) or a template fed from Consul (whose data other users
//! write) can give the task `${GREETING}`, not a new `${NOMAD_ALLOC_DIR}` for its config.

use std::collections::BTreeMap;

use super::hooks::{Prestart, TaskHook, TaskHookContext, TaskPrepare};
use super::interpolate_hook::runtime_names;
use berth_jobspec::interpolate::interpolate_json;

pub struct DriverConfigHook;

impl TaskHook for DriverConfigHook {
    fn name(&self) -> &'static str {
        "driver_config"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let defined = runtime_names(ctx, &prepare.interpolated_env);
            let added: BTreeMap<&str, &str> = (prepare.env.iter())
                .filter(|(key, _)| !prepare.interpolated_env.iter().any(|(k, _)| k == key))
                .map(|(key, value)| (key.as_str(), value.as_str()))
                .collect();
            let lookup =
                |name: &str| defined(name).or_else(|| added.get(name).map(|v| v.to_string()));
            prepare.config = Some(interpolate_json(&ctx.task.config, &lookup));
            Ok(())
        })
    }
}
