//! A `group` block, with its `volume` and `ephemeral_disk` blocks.

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::{BlockNode, Value};
use berth_jobspec::fields as schema;

use super::check_label;
use super::connect::connect_proxy;
use super::constraints::constraints;
use super::ignored::{
    GROUP_SCHEDULER_LEVEL, GROUP_UNSUPPORTED, PLACEMENT, scheduler_level, unsupported,
};
use super::network::{NetworkBlock, network};
use super::restart::restart;
use super::service::service;
use super::task::task;
use crate::Findings;
use crate::reschedule;
use berth_jobspec::names::NameKind;
use berth_jobspec::*;

/// A group of a job of `job_type` (`single`: a system or sysbatch job), under the job's
/// `reschedule` block.
pub(super) type GroupKind<'a> = (JobType, &'a reschedule::Written);

pub(super) fn group(
    parent: &str,
    name: &str,
    block: &BlockNode,
    (job_type, job_reschedule): GroupKind<'_>,
    problems: &mut Findings,
) -> Group {
    let path = format!("{parent}.group.{name}");
    check_label(NameKind::Group, name, &path, block.at, problems);
    let mut fields = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            schema::group::COUNT.hcl,
            schema::group::VOLUME.hcl,
            "service",
            schema::group::RESTART.hcl,
            schema::group::META.hcl,
            schema::group::TASK.hcl,
            "network",
            schema::group::CONSTRAINT.hcl,
            "affinity",
            "spread",
            "update",
            "migrate",
            "reschedule",
            "scaling",
            schema::group::EPHEMERAL_DISK.hcl,
            schema::group::SHUTDOWN_DELAY.hcl,
            "stop_after_client_disconnect",
            "max_client_disconnect",
            "prevent_reschedule_on_lost",
            "disconnect",
            "consul",
            "vault",
        ],
    );
    let count = fields
        .number(schema::group::COUNT.hcl, 10_000, problems)
        .unwrap_or(1) as u32;
    // Nomad refuses a count above 1 on a system job; 0 places nothing (the group is
    // off). Its sysbatch scheduler, too, runs one alloc of a group per node, so a
    // larger count is refused there as well rather than silently ignored.
    if job_type.per_node() && count > 1 {
        fields.problem_with(
            problems,
            schema::group::COUNT.hcl,
            format!(
                "a {job_type} job runs one alloc of each group per node: count may be 0 or 1, \
                 not {count}"
            ),
        );
    }
    scheduler_level(&mut fields, &block.body, PLACEMENT, problems);
    scheduler_level(&mut fields, &block.body, GROUP_SCHEDULER_LEVEL, problems);
    unsupported(&mut fields, &block.body, GROUP_UNSUPPORTED, problems);
    let group_reschedule = reschedule::written(&mut fields, job_type.per_node(), problems);
    let reschedule = if job_type.per_node() {
        ReschedulePolicy::disabled()
    } else {
        let defaults = ReschedulePolicy::default_for(job_type);
        reschedule::merged(&path, defaults, job_reschedule, &group_reschedule, problems)
    };
    let constraints = constraints(&mut fields, problems);
    let volumes = fields
        .labeled_blocks(schema::group::VOLUME.hcl, problems)
        .into_iter()
        .filter_map(|(name, block)| volume(&path, &name, block, problems))
        .collect();
    let NetworkBlock {
        mode: network_mode,
        ports,
        dns,
        hostname,
    } = network(&mut fields, problems);
    let service_blocks = fields.blocks("service");
    let services: Vec<Service> = service_blocks
        .iter()
        .map(|b| service(&path, b, &ports, problems))
        .collect();
    let restart = match fields.single_block(schema::group::RESTART.hcl, problems) {
        Some(block) => restart(&path, block, RestartPolicy::default_for(job_type), problems),
        None => RestartPolicy::default_for(job_type),
    };
    let proxies: Vec<Task> = service_blocks
        .iter()
        .zip(&services)
        .filter_map(|(block, service)| {
            connect_proxy(&path, block, service, &restart, &ports, problems)
        })
        .collect();
    let shutdown_delay = fields
        .duration(schema::group::SHUTDOWN_DELAY.hcl, problems)
        .unwrap_or_default();
    let ephemeral_disk_mb = match fields.single_block(schema::group::EPHEMERAL_DISK.hcl, problems) {
        Some(disk) => ephemeral_disk(&path, disk, problems),
        None => DEFAULT_EPHEMERAL_DISK_MB,
    };
    let meta = fields.string_map(schema::group::META.hcl, problems);
    let mut tasks: Vec<Task> = fields
        .labeled_blocks(schema::group::TASK.hcl, problems)
        .into_iter()
        .map(|(name, block)| task(&path, &name, block, &restart, &ports, problems))
        .collect();
    // A connect sidecar_task named as a task of the group, or as another sidecar_task:
    // two tasks of one name would share a directory, records and network (attack
    // review). Two `task` blocks of one name are refused where they are read.
    let written = tasks.len();
    tasks.extend(proxies);
    let mut seen = std::collections::BTreeSet::new();
    for (at, task) in tasks.iter().enumerate() {
        if !seen.insert(task.name.as_str()) && at >= written {
            fields.problem(
                problems,
                "",
                block.at,
                format!(
                    "the connect sidecar_task {:?} has the name of another task of the \
                     group: give it another",
                    task.name
                ),
            );
        }
    }
    // A docker task's own network (Docker's default bridge) forwards the group's ports
    // to their `to` in a host-mode group too.
    if network_mode == NetworkMode::Host && tasks.iter().any(|t| t.driver == "docker") {
        let ports = format!("{path}.network.port.");
        problems
            .warnings
            .retain(|w| !(w.path.starts_with(&ports) && w.path.ends_with(".to")));
    }
    if tasks.is_empty() && !block.body.writes_block(schema::group::TASK.hcl) {
        fields.problem(
            problems,
            "",
            block.at,
            "a group needs at least one task".into(),
        );
    }
    // Nomad's check: the logs a task may keep (one stream's worth) must fit in the
    // alloc's disk, with room to spare.
    for task in &tasks {
        let log_storage_mb = u64::from(task.logs.max_files) * (task.logs.max_file_size >> 20);
        if log_storage_mb >= ephemeral_disk_mb {
            fields.problem(
                problems,
                schema::group::EPHEMERAL_DISK.hcl,
                block.at,
                format!(
                    "task {:?}: log storage ({log_storage_mb} MB: logs {{ max_files × \
                     max_file_size }}) must be less than the group's ephemeral_disk size \
                     ({ephemeral_disk_mb} MB)",
                    task.name
                ),
            );
        }
    }
    fields.finish(problems);
    Group {
        name: name.to_string(),
        count,
        volumes,
        services,
        restart,
        meta,
        constraints,
        tasks,
        ports,
        network_mode,
        dns,
        hostname,
        shutdown_delay,
        ephemeral_disk_mb,
        reschedule,
    }
}

/// Nomad's default `ephemeral_disk { size }`, in MB (meaning MiB, as for memory).
pub const DEFAULT_EPHEMERAL_DISK_MB: u64 = 300;

/// A group's `ephemeral_disk { size, sticky, migrate }`: `size` in MB (MiB), the most the
/// alloc's directory may hold, logs included. `sticky` and `migrate` move data between
/// nodes in Nomad; on one node an alloc's replacement starts fresh, so they are accepted
/// and have no effect.
pub(super) fn ephemeral_disk(parent: &str, block: &BlockNode, problems: &mut Vec<Problem>) -> u64 {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.ephemeral_disk"),
        block.at,
        &[schema::ephemeral_disk::SIZE.hcl, "sticky", "migrate"],
    );
    let size = fields
        .number(schema::ephemeral_disk::SIZE.hcl, 1 << 30, problems)
        .unwrap_or(DEFAULT_EPHEMERAL_DISK_MB);
    if size < 10 {
        fields.problem_with(
            problems,
            schema::ephemeral_disk::SIZE.hcl,
            format!("{size} MB is too little for an alloc (at least 10 MB)"),
        );
    }
    let _ = fields.bool("sticky", problems);
    let _ = fields.bool("migrate", problems);
    fields.finish(problems);
    size
}

pub(super) fn volume(
    parent: &str,
    name: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<VolumeRequest> {
    let path = format!("{parent}.volume.{name}");
    check_label(NameKind::Volume, name, &path, block.at, problems);
    // The old form kept the source in a `config` block; say how to write it now.
    if let Some(config) = block.body.blocks.iter().find(|b| b.kind == "config") {
        let source = config
            .body
            .attrs
            .iter()
            .find(|a| a.name == schema::volume::SOURCE.hcl)
            .and_then(|a| match &a.value.value {
                Value::String(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "...".into());
        problems.push(Problem {
            path: format!("{path}.config"),
            at: Some(config.at),
            message: format!(
                "volume \"config\" blocks are no longer supported: move `source` into the volume block, \
                 as in: volume {name:?} {{ type = \"host\", source = {source:?} }}"
            ),
        });
        return None;
    }
    let mut fields = Fields::new(
        &block.body,
        path,
        block.at,
        &[
            schema::volume::TYPE.hcl,
            schema::volume::SOURCE.hcl,
            schema::volume::READ_ONLY.hcl,
            schema::volume::ACCESS_MODE.hcl,
            schema::volume::ATTACHMENT_MODE.hcl,
            schema::volume::PER_ALLOC.hcl,
            "mount_options",
        ],
    );
    let volume_type_text = fields.required_string(schema::volume::TYPE.hcl, problems);
    let volume_type = fields.choose(
        volume_type_text,
        schema::volume::TYPE.hcl,
        &[("host", VolumeType::Host), ("csi", VolumeType::Csi)],
        problems,
        |other| format!("unknown volume type {other:?} (use \"host\" or \"csi\")"),
    );
    let source = fields.required_string(schema::volume::SOURCE.hcl, problems);
    let read_only = fields
        .bool(schema::volume::READ_ONLY.hcl, problems)
        .unwrap_or(false);
    let access_mode = fields.string(schema::volume::ACCESS_MODE.hcl, problems);
    let attachment_mode = fields.string(schema::volume::ATTACHMENT_MODE.hcl, problems);
    let per_alloc = fields
        .bool(schema::volume::PER_ALLOC.hcl, problems)
        .unwrap_or(false);
    fields.blocks("mount_options");
    fields.finish(problems);
    Some(VolumeRequest {
        name: name.to_string(),
        volume_type: volume_type?,
        source: source?,
        read_only,
        access_mode,
        attachment_mode,
        per_alloc,
        at: block.at,
    })
}
