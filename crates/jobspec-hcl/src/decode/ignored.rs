//! What a jobspec may write that has no effect on berth's scheduler (a warning each)
//! or that berth cannot give a task (a problem each), by block.

use berth_hcl::Location;
use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BodyNode;

use crate::Findings;

/// A construct for Nomad's scheduler, and why it has no effect on one node.
pub(super) type Ignored = (&'static str, &'static str);

/// Where allocs go among nodes: jobs and groups both have these.
pub(super) const PLACEMENT: &[Ignored] = &[
    ("affinity", "it is a placement preference among nodes"),
    ("spread", "it spreads allocs across nodes"),
    (
        "update",
        "rolling updates and canaries are deployments across nodes",
    ),
    ("migrate", "it moves allocs off draining nodes"),
];

pub(super) const JOB_SCHEDULER_LEVEL: &[Ignored] = &[
    ("multiregion", "it deploys across regions"),
    (
        "all_at_once",
        "it is how Nomad's scheduler places the job's allocs",
    ),
    ("ui", "it describes the job in Nomad's web UI"),
    (
        "consul",
        "berth registers services with the Consul agent of its own config",
    ),
];

pub(super) const GROUP_SCHEDULER_LEVEL: &[Ignored] = &[
    ("scaling", "it is read by Nomad's autoscaler"),
    (
        "stop_after_client_disconnect",
        "it concerns a client that loses its servers",
    ),
    (
        "max_client_disconnect",
        "it concerns a client that loses its servers",
    ),
    (
        "prevent_reschedule_on_lost",
        "it concerns a client that loses its servers",
    ),
    ("disconnect", "it concerns a client that loses its servers"),
    (
        "consul",
        "berth registers services with the Consul agent of its own config",
    ),
];

pub(super) const TASK_SCHEDULER_LEVEL: &[Ignored] = &[
    ("affinity", "it is a placement preference among nodes"),
    (
        "leader",
        "berth does not stop a group's other tasks when this one ends",
    ),
    ("scaling", "it is read by Nomad's autoscaler"),
    (
        "consul",
        "berth registers services with the Consul agent of its own config",
    ),
    ("action", "berth has no API to run a task's actions yet"),
];

pub(super) const RESOURCES_SCHEDULER_LEVEL: &[Ignored] = &[
    ("disk", "berth reserves no disk for a task"),
    ("iops", "berth reserves no IOPS for a task"),
    ("network", "berth gives tasks the host's network"),
    ("numa", "berth does not pin tasks to NUMA nodes"),
];

/// Constructs that change what the task gets, which berth cannot give: refused, so that
/// no task starts without what its author counted on.
pub(super) const JOB_UNSUPPORTED: &[Ignored] = &[(
    "vault",
    "berth cannot fetch Vault tokens or secrets, and the tasks would start without them",
)];

pub(super) const GROUP_UNSUPPORTED: &[Ignored] = &[(
    "vault",
    "berth cannot fetch Vault tokens or secrets, and the tasks would start without them",
)];

pub(super) const TASK_UNSUPPORTED: &[Ignored] = &[
    (
        "vault",
        "berth cannot fetch Vault tokens or secrets, and the task would start without them",
    ),
    (
        "secret",
        "berth cannot fetch secrets from a secrets provider",
    ),
];

pub(super) const RESOURCES_UNSUPPORTED: &[Ignored] =
    &[("device", "berth cannot give a task devices such as GPUs")];

/// Where `name` (an attribute or a block) is written in `body`, if it is.
pub(super) fn written(body: &BodyNode, name: &str) -> Option<Location> {
    body.attrs
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.at)
        .or_else(|| body.blocks.iter().find(|b| b.kind == name).map(|b| b.at))
}

/// One warning for each of `constructs` the block has: it is accepted and has no effect.
pub(super) fn scheduler_level(
    fields: &mut Fields,
    body: &BodyNode,
    constructs: &[Ignored],
    problems: &mut Findings,
) {
    for (name, at, why) in present(fields, body, constructs) {
        problems.warnings.push(Problem {
            path: format!("{}.{name}", fields.path),
            at: Some(at),
            message: format!("{name} has no effect on a single berth node: {why}"),
        });
    }
}

/// A problem for each of `constructs` the block has.
pub(super) fn unsupported(
    fields: &mut Fields,
    body: &BodyNode,
    constructs: &[Ignored],
    problems: &mut Findings,
) {
    for (name, at, why) in present(fields, body, constructs) {
        fields.problem(
            problems,
            name,
            at,
            format!("{name} is not supported: {why}"),
        );
    }
}

/// Which of `constructs` the block has, and where; each is marked read.
pub(super) fn present(
    fields: &mut Fields,
    body: &BodyNode,
    constructs: &[Ignored],
) -> Vec<(&'static str, Location, &'static str)> {
    let mut found = Vec::new();
    for (name, why) in constructs {
        if let Some(at) = written(body, name) {
            fields.attr(name);
            fields.blocks(name);
            found.push((*name, at, *why));
        }
    }
    found
}
