//! A task's `service` blocks: registered once the task has started (and again when it
//! is recovered after an agent restart, under the same IDs), deregistered when it exits
//! or is asked to stop, before the driver kills it. The service client does the talking
//! to Consul, with retries; a service that cannot be built is a task event.

use super::hooks::{BoxFuture, TaskHook, TaskHookContext};
use super::interpolate_hook::runtime_names;
use crate::consul::Owner;
use crate::consul::build::{ServiceSource, registrations};
use berth_model::events::EventKind;

pub struct ServicesHook;

fn owner(ctx: &TaskHookContext) -> Owner {
    Owner {
        alloc: ctx.alloc_id.clone(),
        task: Some(ctx.task.name.clone()),
        job: ctx.job.name.clone(),
    }
}

/// The names a service's name and tags may use: the task's `NOMAD_*` basics, its env,
/// meta and the node's attributes.
pub fn service_names(ctx: &TaskHookContext) -> impl Fn(&str) -> Option<String> + use<> {
    let mut env = vec![
        ("NOMAD_ALLOC_ID".to_string(), ctx.alloc_id.clone()),
        ("NOMAD_JOB_NAME".to_string(), ctx.job.name.clone()),
        ("NOMAD_JOB_ID".to_string(), ctx.job.name.clone()),
        ("NOMAD_GROUP_NAME".to_string(), ctx.group.name.clone()),
        ("NOMAD_TASK_NAME".to_string(), ctx.task.name.clone()),
    ];
    env.extend(ctx.task.env.iter().cloned());
    runtime_names(ctx, &env)
}

fn register(ctx: &TaskHookContext) {
    if ctx.task.services.is_empty() {
        return;
    }
    let lookup = service_names(ctx);
    let address = crate::consul::service_address(ctx.config.consul.as_ref());
    let alloc_address = ctx.resources.network().and_then(|n| n.address);
    let source = ServiceSource {
        alloc_id: &ctx.alloc_id,
        task: Some(&ctx.task.name),
        group: &ctx.group.name,
        ports: &ctx.group.ports,
        network_mode: ctx.group.network_mode,
        address: &address,
        alloc_address: alloc_address.as_deref(),
        lookup: &lookup,
    };
    match registrations(&ctx.task.services, &source) {
        Ok(registrations) => ctx.services.set(owner(ctx), registrations),
        Err(error) => ctx.report(
            EventKind::TaskHook,
            format!("services: {error}; the service is not registered"),
        ),
    }
}

impl TaskHook for ServicesHook {
    fn name(&self) -> &'static str {
        "services"
    }

    fn poststart<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { register(ctx) })
    }

    fn recovered<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { register(ctx) })
    }

    fn stop<'a>(&'a self, ctx: &'a TaskHookContext) -> BoxFuture<'a, ()> {
        Box::pin(async move { ctx.services.remove(&owner(ctx)) })
    }

    fn exited<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        _exit: Option<&'a berth_model::driver::ExitResult>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move { ctx.services.remove(&owner(ctx)) })
    }
}
