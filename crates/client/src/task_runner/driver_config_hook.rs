//! The driver config's run-time interpolation (`${NOMAD_ALLOC_DIR}`, `${meta.owner}`, a
//! hook's `${GREETING}`) with the env the task starts with. It runs after every hook that
//! adds to that env (identities, templates with `env = true`, the operator's WASM hooks),
//! as Nomad builds a task's environment before it reads the driver config. It reads the
//! config as written, once, so no value is interpolated twice.

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
            let lookup = runtime_names(ctx, &prepare.env);
            prepare.config = Some(interpolate_json(&ctx.task.config, &lookup));
            Ok(())
        })
    }
}
