//! A service's `connect { sidecar_service }`: the Envoy sidecar task it adds.

use berth_hcl::Problem;
use berth_hcl::tree::{BlockNode, Value};

use super::task::task;
use crate::Findings;
use berth_jobspec::*;

/// The sidecar proxy task of a group service with `connect { sidecar_service {} }`, as
/// Nomad injects it: `connect-proxy-<service>`, a prestart sidecar, from the service's
/// `sidecar_task` block. Nomad's default runs Envoy's image in Docker, which berth does
/// not have, so here the block must say how to run Envoy.
pub(super) fn connect_proxy(
    parent: &str,
    block: &BlockNode,
    service: &Service,
    restart: &RestartPolicy,
    ports: &[PortLabel],
    problems: &mut Findings,
) -> Option<Task> {
    service.connect.as_ref()?.sidecar_service.as_ref()?;
    let sidecar = block
        .body
        .blocks
        .iter()
        .filter(|b| b.kind == "connect")
        .flat_map(|c| &c.body.blocks)
        .find(|b| b.kind == "sidecar_task");
    let Some(sidecar) = sidecar else {
        problems.problems.push(Problem {
            path: format!("{parent}.service.{}.connect", service.name),
            at: Some(service.at),
            message: format!(
                "service {:?}: connect sidecar_service needs a sidecar_task {{ driver, config }} \
                 on berth: Nomad's default sidecar runs Envoy's image in Docker, which berth \
                 does not have",
                service.name
            ),
        });
        return None;
    };
    // `name` renames the task; the rest is a task's body.
    let mut body = sidecar.clone();
    let name = match body.body.attrs.iter().position(|a| a.name == "name") {
        Some(index) => match body.body.attrs.remove(index).value.value {
            Value::String(name) => name,
            _ => format!("connect-proxy-{}", service.name),
        },
        None => format!("connect-proxy-{}", service.name),
    };
    let mut task = task(parent, &name, &body, restart, ports, problems);
    task.lifecycle = Some(Lifecycle {
        hook: LifecycleHook::Prestart,
        sidecar: true,
    });
    task.connect_proxy_for = Some(service.name.clone());
    Some(task)
}
