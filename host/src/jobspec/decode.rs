//! From the located HCL tree to typed jobspec structures, collecting every problem. A
//! value that could not be evaluated ([`Value::Failed`]) was reported already: it draws
//! no second problem here (neither its type, nor "required", nor "needs").

use std::time::Duration;

use super::names::{NameKind, check_name, normalise_task_path};
use super::reschedule;
use super::spec::*;
use berth_hcl::Location;
use berth_hcl::Problem;
use berth_hcl::fields::{Fields, block_json};
use berth_hcl::tree::{BlockNode, BodyNode, Value};
use berth_model::limits::{MIN_CPU_MHZ, MIN_MEMORY_MB};
use berth_model::mount::Propagation;

pub(super) fn job(tree: &BodyNode, problems: &mut Findings) -> Option<Job> {
    let mut top = Fields::new(tree, "jobspec".into(), Location::default(), &["job"]);
    let jobs = top.labeled_blocks("job", problems);
    top.finish(problems);
    let [(name, block)] = jobs.as_slice() else {
        if jobs.len() > 1 {
            problems.push(Problem {
                path: "jobspec".into(),
                at: Some(jobs[1].1.at),
                message: "a jobspec holds exactly one job".into(),
            });
        } else if problems.is_empty() {
            problems.push(Problem {
                path: "jobspec".into(),
                at: None,
                message: "no job block found: a jobspec starts with job \"name\" { ... }".into(),
            });
        }
        return None;
    };
    let path = format!("job.{name}");
    check_label(NameKind::Job, name, &path, block.at, problems);
    let mut fields = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            "type",
            "datacenters",
            "meta",
            "group",
            "region",
            "namespace",
            "priority",
            "constraint",
            "affinity",
            "spread",
            "update",
            "migrate",
            "reschedule",
            "multiregion",
            "all_at_once",
            "node_pool",
            "ui",
            "consul",
            "vault",
            "vault_token",
            "consul_token",
            "periodic",
            "parameterized",
            "id",
            "name",
        ],
    );
    let job_type_text = fields.string("type", problems);
    let job_type = fields
        .choose(
            job_type_text,
            "type",
            &[
                ("service", JobType::Service),
                ("batch", JobType::Batch),
                ("system", JobType::System),
                ("sysbatch", JobType::SysBatch),
            ],
            problems,
            |other| {
                format!(
                    "unknown job type {other:?} (use \"service\", \"batch\", \"system\" or \
                     \"sysbatch\")"
                )
            },
        )
        .unwrap_or(JobType::Service);
    scheduler_level(&mut fields, &block.body, PLACEMENT, problems);
    scheduler_level(&mut fields, &block.body, JOB_SCHEDULER_LEVEL, problems);
    unsupported(&mut fields, &block.body, JOB_UNSUPPORTED, problems);
    let periodic = fields
        .single_block("periodic", problems)
        .and_then(|b| periodic(&path, b, problems));
    let parameterized = fields
        .single_block("parameterized", problems)
        .and_then(|b| parameterized(&path, b, problems));
    if let (Some(_), Some(_)) = (&periodic, &parameterized) {
        fields.problem(
            problems,
            "parameterized",
            written(&block.body, "parameterized").unwrap_or(block.at),
            "a job is periodic or parameterized, not both".into(),
        );
    }
    if (periodic.is_some() || parameterized.is_some())
        && !job_type.runs_to_completion()
        && !fields.failed("type")
    {
        fields.problem_with(
            problems,
            "type",
            "periodic and parameterized jobs must be of type \"batch\" or \"sysbatch\", as \
             in Nomad"
                .into(),
        );
    }
    for ignored in ["vault_token", "consul_token", "id", "name", "node_pool"] {
        fields.string(ignored, problems);
    }
    let constraints = constraints(&mut fields, problems);
    let datacenters = fields.string_list("datacenters", problems);
    let meta = fields.string_map("meta", problems);
    for ignored in ["region", "namespace"] {
        fields.string(ignored, problems);
    }
    fields.number("priority", 100, problems);
    let job_reschedule = reschedule::written(&mut fields, job_type.per_node(), problems);
    let groups: Vec<Group> = fields
        .labeled_blocks("group", problems)
        .into_iter()
        .map(|(name, block)| group(&path, &name, block, (job_type, &job_reschedule), problems))
        .collect();
    // A job asks for at most MAX_JOB_ALLOCS allocs in all: each group may count 10,000,
    // and dynamic groups multiply them (attack review: 1,000 groups of 10,000).
    let asked: u64 = groups.iter().map(|g| u64::from(g.count)).sum();
    if asked > MAX_JOB_ALLOCS {
        fields.problem(
            problems,
            "",
            block.at,
            format!(
                "the job's groups ask for {asked} allocs in all; a job may ask for at most \
                 {MAX_JOB_ALLOCS}"
            ),
        );
    }
    if groups.is_empty() && !block.body.writes_block("group") {
        fields.problem(
            problems,
            "",
            block.at,
            "a job needs at least one group".into(),
        );
    }
    fields.finish(problems);
    Some(Job {
        name: name.clone(),
        job_type,
        datacenters,
        meta,
        constraints,
        groups,
        periodic,
        parameterized,
        parent: None,
        payload: None,
        warnings: Vec::new(),
        submitted_by_operator: false,
    })
}

/// The most cron expressions one `periodic` block holds (each is evaluated for every
/// launch time).
const MAX_CRONS: usize = 32;

/// The most allocs one job asks for, its groups' counts summed (a group's own `count`
/// is at most 10,000 too).
pub const MAX_JOB_ALLOCS: u64 = 10_000;

fn periodic(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<Periodic> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.periodic"),
        block.at,
        &["cron", "crons", "prohibit_overlap", "time_zone", "enabled"],
    );
    let mut crons = fields.string_list("crons", problems);
    crons.extend(fields.string("cron", problems));
    if crons.is_empty() && !fields.failed("cron") && !fields.failed("crons") {
        fields.problem(
            problems,
            "crons",
            block.at,
            "a periodic block needs cron or crons".into(),
        );
    }
    let written_as = if fields.attr("cron").is_some() {
        "cron"
    } else {
        "crons"
    };
    if crons.len() > MAX_CRONS {
        fields.problem_with(
            problems,
            written_as,
            format!(
                "{} cron expressions; a periodic block has at most {MAX_CRONS}",
                crons.len()
            ),
        );
        crons.truncate(MAX_CRONS);
    }
    for text in &crons {
        if let Err(error) = text.parse::<super::cron::CronSpec>() {
            fields.problem_with(
                problems,
                written_as,
                format!("{text:?} is not a cron expression: {error}"),
            );
        }
    }
    if let Some(zone) = fields.string("time_zone", problems)
        && !matches!(zone.as_str(), "UTC" | "Etc/UTC" | "")
    {
        fields.problem_with(
            problems,
            "time_zone",
            format!("time zone {zone:?} is not supported: berth launches periodic jobs in UTC"),
        );
    }
    let prohibit_overlap = fields.bool("prohibit_overlap", problems).unwrap_or(false);
    let enabled = fields.bool("enabled", problems).unwrap_or(true);
    fields.finish(problems);
    Some(Periodic {
        crons,
        prohibit_overlap,
        enabled,
    })
}

fn parameterized(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<Parameterized> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.parameterized"),
        block.at,
        &["payload", "meta_required", "meta_optional"],
    );
    let payload_text = fields.string("payload", problems);
    let payload = fields
        .choose(
            payload_text,
            "payload",
            &[
                ("optional", PayloadRule::Optional),
                ("required", PayloadRule::Required),
                ("forbidden", PayloadRule::Forbidden),
            ],
            problems,
            |other| {
                format!(
                    "unknown payload rule {other:?} (use \"optional\", \"required\" or \
                     \"forbidden\")"
                )
            },
        )
        .unwrap_or(PayloadRule::Optional);
    let meta_required = fields.string_list("meta_required", problems);
    let meta_optional = fields.string_list("meta_optional", problems);
    fields.finish(problems);
    Some(Parameterized {
        payload,
        meta_required,
        meta_optional,
    })
}

/// A task's `logs` block, in Nomad's units: `max_file_size` in MB.
fn logs(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> berth_model::driver::LogRotation {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.logs"),
        block.at,
        &["max_files", "max_file_size", "disabled", "enabled"],
    );
    let defaults = berth_model::driver::LogRotation::default();
    let max_files = fields
        .number("max_files", 1_000, problems)
        .map_or(defaults.max_files, |n| n.max(1) as u32);
    let max_file_size = fields
        .number("max_file_size", 100_000, problems)
        .map_or(defaults.max_file_size, |mb| mb.max(1) << 20);
    // `enabled = false` is the older spelling of `disabled = true`.
    let enabled = fields.bool("enabled", problems);
    if fields.bool("disabled", problems) == Some(true) || enabled == Some(false) {
        problems.warnings.push(Problem {
            path: format!("{parent}.logs"),
            at: Some(block.at),
            message: "logs are collected all the same: berth keeps every task's output, rotated"
                .into(),
        });
    }
    fields.finish(problems);
    berth_model::driver::LogRotation {
        max_files,
        max_file_size,
    }
}

fn dispatch_payload(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<String> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.dispatch_payload"),
        block.at,
        &["file"],
    );
    let file = fields.required_string("file", problems)?;
    let safe = !file.is_empty()
        && !file.starts_with('/')
        && file
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !safe {
        fields.problem_with(
            problems,
            "file",
            format!(
                "{file:?} must be a relative path below the task's local/ directory, without \
                 \"..\""
            ),
        );
    }
    fields.finish(problems);
    safe.then(|| format!("local/{file}"))
}

/// A group of a job of `job_type` (`single`: a system or sysbatch job), under the job's
/// `reschedule` block.
type GroupKind<'a> = (JobType, &'a reschedule::Written);

fn group(
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
            "count",
            "volume",
            "service",
            "restart",
            "meta",
            "task",
            "network",
            "constraint",
            "affinity",
            "spread",
            "update",
            "migrate",
            "reschedule",
            "scaling",
            "ephemeral_disk",
            "shutdown_delay",
            "stop_after_client_disconnect",
            "max_client_disconnect",
            "prevent_reschedule_on_lost",
            "disconnect",
            "consul",
            "vault",
        ],
    );
    let count = fields.number("count", 10_000, problems).unwrap_or(1) as u32;
    // Nomad refuses a count above 1 on a system job; 0 places nothing (the group is
    // off). Its sysbatch scheduler, too, runs one alloc of a group per node, so a
    // larger count is refused there as well rather than silently ignored.
    if job_type.per_node() && count > 1 {
        fields.problem_with(
            problems,
            "count",
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
        .labeled_blocks("volume", problems)
        .into_iter()
        .filter_map(|(name, block)| volume(&path, &name, block, problems))
        .collect();
    let ports = network(&mut fields, problems);
    let service_blocks = fields.blocks("service");
    let services: Vec<Service> = service_blocks
        .iter()
        .map(|b| service(&path, b, &ports, problems))
        .collect();
    let restart = match fields.single_block("restart", problems) {
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
        .duration("shutdown_delay", problems)
        .unwrap_or_default();
    let ephemeral_disk_mb = match fields.single_block("ephemeral_disk", problems) {
        Some(disk) => ephemeral_disk(&path, disk, problems),
        None => DEFAULT_EPHEMERAL_DISK_MB,
    };
    let meta = fields.string_map("meta", problems);
    let mut tasks: Vec<Task> = fields
        .labeled_blocks("task", problems)
        .into_iter()
        .map(|(name, block)| task(&path, &name, block, &restart, &ports, problems))
        .collect();
    tasks.extend(proxies);
    if tasks.is_empty() && !block.body.writes_block("task") {
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
                "ephemeral_disk",
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
fn ephemeral_disk(parent: &str, block: &BlockNode, problems: &mut Vec<Problem>) -> u64 {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.ephemeral_disk"),
        block.at,
        &["size", "sticky", "migrate"],
    );
    let size = fields
        .number("size", 1 << 30, problems)
        .unwrap_or(DEFAULT_EPHEMERAL_DISK_MB);
    if size < 10 {
        fields.problem_with(
            problems,
            "size",
            format!("{size} MB is too little for an alloc (at least 10 MB)"),
        );
    }
    let _ = fields.bool("sticky", problems);
    let _ = fields.bool("migrate", problems);
    fields.finish(problems);
    size
}

fn volume(
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
            .find(|a| a.name == "source")
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
            "type",
            "source",
            "read_only",
            "access_mode",
            "attachment_mode",
            "per_alloc",
            "mount_options",
        ],
    );
    let volume_type_text = fields.required_string("type", problems);
    let volume_type = fields.choose(
        volume_type_text,
        "type",
        &[("host", VolumeType::Host), ("csi", VolumeType::Csi)],
        problems,
        |other| format!("unknown volume type {other:?} (use \"host\" or \"csi\")"),
    );
    let source = fields.required_string("source", problems);
    let read_only = fields.bool("read_only", problems).unwrap_or(false);
    let access_mode = fields.string("access_mode", problems);
    let attachment_mode = fields.string("attachment_mode", problems);
    let per_alloc = fields.bool("per_alloc", problems).unwrap_or(false);
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

/// A `restart` block; what it leaves out comes from `defaults` (Nomad's for the job type
/// in a group, the group's policy in a task).
fn restart(
    parent: &str,
    block: &BlockNode,
    defaults: RestartPolicy,
    problems: &mut Findings,
) -> RestartPolicy {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.restart"),
        block.at,
        &["attempts", "interval", "delay", "mode"],
    );
    let mode_text = fields.string("mode", problems);
    let mode = fields
        .choose(
            mode_text,
            "mode",
            &[("fail", RestartMode::Fail), ("delay", RestartMode::Delay)],
            problems,
            |other| format!("unknown restart mode {other:?} (use \"fail\" or \"delay\")"),
        )
        .unwrap_or(defaults.mode);
    let policy = RestartPolicy {
        attempts: fields
            .number("attempts", 1000, problems)
            .map(|n| n as u32)
            .unwrap_or(defaults.attempts),
        interval: fields
            .duration("interval", problems)
            .unwrap_or(defaults.interval),
        delay: fields.duration("delay", problems).unwrap_or(defaults.delay),
        mode,
    };
    fields.finish(problems);
    policy
}

fn task(
    parent: &str,
    name: &str,
    block: &BlockNode,
    group_restart: &RestartPolicy,
    ports: &[PortLabel],
    problems: &mut Findings,
) -> Task {
    let path = format!("{parent}.task.{name}");
    check_label(NameKind::Task, name, &path, block.at, problems);
    let mut fields = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            "driver",
            "config",
            "env",
            "meta",
            "resources",
            "kill_timeout",
            "kill_signal",
            "volume_mount",
            "csi_plugin",
            "service",
            "lifecycle",
            "hooks",
            "user",
            "template",
            "artifact",
            "logs",
            "constraint",
            "affinity",
            "leader",
            "shutdown_delay",
            "max_run_duration",
            "vault",
            "identity",
            "secret",
            "dispatch_payload",
            "scaling",
            "kind",
            "consul",
            "restart",
            "action",
        ],
    );
    scheduler_level(&mut fields, &block.body, TASK_SCHEDULER_LEVEL, problems);
    let restart = fields
        .single_block("restart", problems)
        .map(|b| restart(&path, b, group_restart.clone(), problems));
    unsupported(&mut fields, &block.body, TASK_UNSUPPORTED, problems);
    let constraints = constraints(&mut fields, problems);
    let dispatch_payload = fields
        .single_block("dispatch_payload", problems)
        .and_then(|b| dispatch_payload(&path, b, problems));
    let logs = fields
        .single_block("logs", problems)
        .map(|b| logs(&path, b, problems))
        .unwrap_or_default();
    let templates = fields
        .blocks("template")
        .into_iter()
        .filter_map(|b| template(&path, b, problems))
        .collect();
    fields.string("kind", problems);
    let driver_at = fields.attr("driver").map(|v| v.at).unwrap_or(block.at);
    let driver = fields
        .required_string("driver", problems)
        .unwrap_or_default();
    let config_block = fields.single_block("config", problems);
    let config = match config_block {
        Some(config) => block_json(&config.body),
        None => serde_json::json!({}),
    };
    let config_at = config_block.map(|config| {
        let keys = config.body.attrs.iter().map(|a| (a.name.clone(), a.at));
        let blocks = config.body.blocks.iter().map(|b| (b.kind.clone(), b.at));
        (config.at, keys.chain(blocks).collect())
    });
    let env = fields.string_map("env", problems);
    let meta = fields.string_map("meta", problems);
    let hooks_at = fields.attr("hooks").map(|v| v.at).unwrap_or(block.at);
    let hooks = fields.string_list("hooks", problems);
    let resources = match fields.single_block("resources", problems) {
        Some(block) => {
            let mut r = Fields::new(
                &block.body,
                format!("{path}.resources"),
                block.at,
                &[
                    "cpu",
                    "memory",
                    "memory_max",
                    "cores",
                    "disk",
                    "iops",
                    "network",
                    "device",
                    "numa",
                ],
            );
            scheduler_level(&mut r, &block.body, RESOURCES_SCHEDULER_LEVEL, problems);
            unsupported(&mut r, &block.body, RESOURCES_UNSUPPORTED, problems);
            let cpu = r.number("cpu", 1_000_000, problems).unwrap_or(100);
            let memory = r.number("memory", 1_000_000, problems).unwrap_or(300);
            let memory_max = r.number("memory_max", 1_000_000, problems);
            if cpu < MIN_CPU_MHZ {
                r.problem_with(
                    problems,
                    "cpu",
                    format!("minimum CPU value is {MIN_CPU_MHZ} (MHz); got {cpu}"),
                );
            }
            if memory < MIN_MEMORY_MB {
                r.problem_with(
                    problems,
                    "memory",
                    format!("minimum memory value is {MIN_MEMORY_MB} (MiB); got {memory}"),
                );
            }
            if let Some(max) = memory_max.filter(|max| *max < memory) {
                r.problem_with(
                    problems,
                    "memory_max",
                    format!("memory_max ({max}) may not be below memory ({memory})"),
                );
            }
            let resources = Resources {
                cpu: cpu as u32,
                memory_mb: memory as u32,
                memory_max_mb: memory_max.map(|m| m as u32),
            };
            r.number("cores", 1024, problems);
            r.finish(problems);
            resources
        }
        None => Resources {
            cpu: 100,
            memory_mb: 300,
            memory_max_mb: None,
        },
    };
    let kill_timeout = fields
        .duration("kill_timeout", problems)
        .unwrap_or(Duration::from_secs(5));
    let shutdown_delay = fields
        .duration("shutdown_delay", problems)
        .unwrap_or_default();
    let kill_signal = fields
        .string("kill_signal", problems)
        .unwrap_or_else(|| "SIGTERM".into());
    let volume_mounts = fields
        .blocks("volume_mount")
        .into_iter()
        .filter_map(|b| volume_mount(&path, b, problems))
        .collect();
    let csi_plugin = fields
        .single_block("csi_plugin", problems)
        .and_then(|b| csi_plugin(&path, b, problems));
    let services = fields
        .blocks("service")
        .into_iter()
        .map(|b| service(&path, b, ports, problems))
        .collect();
    let lifecycle = fields
        .single_block("lifecycle", problems)
        .and_then(|block| {
            let mut l = Fields::new(
                &block.body,
                format!("{path}.lifecycle"),
                block.at,
                &["hook", "sidecar"],
            );
            let hook_text = l.required_string("hook", problems);
            let hook = l.choose(
                hook_text,
                "hook",
                &[
                    ("prestart", LifecycleHook::Prestart),
                    ("poststart", LifecycleHook::Poststart),
                    ("poststop", LifecycleHook::Poststop),
                ],
                problems,
                |other| {
                    format!(
                        "unknown lifecycle hook {other:?} (use prestart, poststart or poststop)"
                    )
                },
            );
            let sidecar = l.bool("sidecar", problems).unwrap_or(false);
            l.finish(problems);
            hook.map(|hook| Lifecycle { hook, sidecar })
        });
    let user = fields.string("user", problems);
    fields.finish(problems);
    Task {
        name: name.to_string(),
        driver,
        config,
        env,
        meta,
        resources,
        kill_timeout,
        shutdown_delay,
        kill_signal,
        user,
        volume_mounts,
        csi_plugin,
        services,
        lifecycle,
        hooks,
        constraints,
        templates,
        restart,
        dispatch_payload,
        logs,
        connect_proxy_for: None,
        at: block.at,
        driver_at,
        hooks_at,
        config_at: config_at.unwrap_or_default(),
    }
}

fn volume_mount(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<VolumeMount> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.volume_mount"),
        block.at,
        &[
            "volume",
            "destination",
            "read_only",
            "propagation_mode",
            "selinux_label",
        ],
    );
    let volume = fields.required_string("volume", problems);
    // `${NOMAD_ALLOC_DIR}/data` is interpolated when the task starts, and checked then
    // (the `volumes` hook); what is written around the names is checked now.
    let destination = fields
        .required_string("destination", problems)
        .and_then(|d| {
            let literal = super::interpolate::interpolate(&d, &|_| Some("/x".into()));
            task_path(&mut fields, "destination", &literal, block.at, problems)
                .map(|_| if d.contains("${") { d } else { literal })
        });
    let read_only = fields.bool("read_only", problems).unwrap_or(false);
    let propagation_text = fields
        .string("propagation_mode", problems)
        .unwrap_or_else(|| "private".into());
    let propagation = fields.choose(
        Some(propagation_text),
        "propagation_mode",
        &[
            ("private", Propagation::Private),
            ("host-to-task", Propagation::HostToTask),
            ("bidirectional", Propagation::Bidirectional),
        ],
        problems,
        |other| {
            format!(
                "volume mount has an invalid propagation mode: {other:?} (use private, host-to-task or bidirectional)"
            )
        },
    );
    fields.string("selinux_label", problems);
    fields.finish(problems);
    Some(VolumeMount {
        volume: volume?,
        destination: destination?,
        read_only,
        propagation: propagation?,
        at: block.at,
    })
}

fn csi_plugin(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<CsiPlugin> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.csi_plugin"),
        block.at,
        &[
            "id",
            "type",
            "mount_dir",
            "stage_publish_base_dir",
            "health_timeout",
        ],
    );
    let id = fields.required_string("id", problems);
    let plugin_type_text = fields.required_string("type", problems);
    let plugin_type = fields.choose(
        plugin_type_text,
        "type",
        &[
            ("node", CsiPluginType::Node),
            ("controller", CsiPluginType::Controller),
            ("monolith", CsiPluginType::Monolith),
        ],
        problems,
        |other| format!("unknown CSI plugin type {other:?} (use node, controller or monolith)"),
    );
    let mount_dir = fields
        .string("mount_dir", problems)
        .unwrap_or_else(|| "/csi".into());
    let mount_dir = task_path(&mut fields, "mount_dir", &mount_dir, block.at, problems);
    let stage_publish_base_dir = fields
        .string("stage_publish_base_dir", problems)
        .unwrap_or_else(|| "/local/csi".into());
    let stage_publish_base_dir = task_path(
        &mut fields,
        "stage_publish_base_dir",
        &stage_publish_base_dir,
        block.at,
        problems,
    );
    let health_timeout = fields
        .duration("health_timeout", problems)
        .unwrap_or(Duration::from_secs(30));
    fields.finish(problems);
    Some(CsiPlugin {
        id: id?,
        plugin_type: plugin_type?,
        mount_dir: mount_dir?,
        stage_publish_base_dir: stage_publish_base_dir?,
        health_timeout,
    })
}

/// A problem at the block for a job, group, task or volume label that is not a safe name.
fn check_label(kind: NameKind, name: &str, path: &str, at: Location, problems: &mut Findings) {
    if let Err(error) = check_name(kind, name) {
        problems.push(Problem {
            path: path.to_string(),
            at: Some(at),
            message: error.to_string(),
        });
    }
}

/// `value` of field `name` as a normalised path inside the task, or a problem at it.
fn task_path(
    fields: &mut Fields,
    name: &'static str,
    value: &str,
    block_at: Location,
    problems: &mut Findings,
) -> Option<String> {
    match normalise_task_path(value) {
        Ok(path) => Some(path),
        Err(error) => {
            let at = fields.attr(name).map(|a| a.at).unwrap_or(block_at);
            fields.problem(problems, name, at, format!("{name} {error}"));
            None
        }
    }
}

fn service(
    parent: &str,
    block: &BlockNode,
    ports: &[PortLabel],
    problems: &mut Findings,
) -> Service {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.service"),
        block.at,
        &[
            "name",
            "port",
            "tags",
            "enable_tag_override",
            "connect",
            "provider",
            "check",
            "address",
            "meta",
            "canary_tags",
            "canary_meta",
        ],
    );
    let name = fields.string("name", problems).unwrap_or_default();
    let port = port_value(&mut fields, problems);
    let tags = fields.string_list("tags", problems);
    let enable_tag_override = fields
        .bool("enable_tag_override", problems)
        .unwrap_or(false);
    let connect = fields.single_block("connect", problems).map(|block| {
        let path = format!("{}.connect", fields.path);
        let mut c = Fields::new(
            &block.body,
            path.clone(),
            block.at,
            &["sidecar_service", "sidecar_task", "native"],
        );
        let sidecar_service = c.single_block("sidecar_service", problems).map(|block| {
            let mut s = Fields::new(
                &block.body,
                format!("{path}.sidecar_service"),
                block.at,
                &["port", "proxy", "tags"],
            );
            let port = port_value(&mut s, problems);
            s.string_list("tags", problems);
            let mut upstreams = Vec::new();
            if let Some(proxy) = s.single_block("proxy", problems) {
                let mut p = Fields::new(
                    &proxy.body,
                    format!("{path}.sidecar_service.proxy"),
                    proxy.at,
                    &["upstreams", "config", "local_service_port"],
                );
                for up in p.blocks("upstreams") {
                    let mut u = Fields::new(
                        &up.body,
                        format!("{path}.sidecar_service.proxy.upstreams"),
                        up.at,
                        &["destination_name", "local_bind_port", "datacenter"],
                    );
                    let destination_name = u.required_string("destination_name", problems);
                    let local_bind_port = u.number("local_bind_port", u16::MAX as u64, problems);
                    if local_bind_port.is_none() && u.attr("local_bind_port").is_none() {
                        u.problem(problems, "local_bind_port", up.at, "is required".into());
                    }
                    u.string("datacenter", problems);
                    u.finish(problems);
                    if let (Some(destination_name), Some(port)) =
                        (destination_name, local_bind_port)
                    {
                        upstreams.push(Upstream {
                            destination_name,
                            local_bind_port: port as u16,
                        });
                    }
                }
                p.blocks("config");
                p.number("local_service_port", u16::MAX as u64, problems);
                p.finish(problems);
            }
            s.finish(problems);
            SidecarService { port, upstreams }
        });
        let sidecar_task = c
            .single_block("sidecar_task", problems)
            .map(|b| block_json(&b.body));
        c.bool("native", problems);
        c.finish(problems);
        Connect {
            sidecar_service,
            sidecar_task,
        }
    });
    let provider = match fields.string("provider", problems).as_deref() {
        None | Some("consul") => ServiceProvider::Consul,
        Some("nomad") => ServiceProvider::Nomad,
        Some(other) => {
            fields.problem_with(
                problems,
                "provider",
                format!("unknown service provider {other:?} (use \"consul\" or \"nomad\")"),
            );
            ServiceProvider::Consul
        }
    };
    let address = fields.string("address", problems);
    let meta = fields.string_map("meta", problems);
    let path = fields.path.clone();
    let checks: Vec<ServiceCheck> = fields
        .blocks("check")
        .into_iter()
        .filter_map(|b| check(&path, b, problems))
        .collect();
    scheduler_level(
        &mut fields,
        &block.body,
        &[
            ("canary_tags", "canaries are deployments across nodes"),
            ("canary_meta", "canaries are deployments across nodes"),
        ],
        problems,
    );
    if !name.contains("${") && !name.is_empty() && !super::names::is_dns_label(&name) {
        fields.problem_with(
            problems,
            "name",
            format!(
                "service name {name:?} is not valid: Consul and Nomad take letters, digits \
                 and dashes, at most 63, not starting or ending with a dash"
            ),
        );
    }
    let port_at = fields.attr("port").map_or(block.at, |a| a.at);
    for (wanted, at) in port
        .iter()
        .map(|p| (p, port_at))
        .chain(checks_ports(&checks, block.at))
    {
        // A warning, not an error: most Nomad jobspecs use dynamic ports, and the task
        // runs all the same; only the service is not registered (an event says so).
        if let Some(why) = unusable_port(wanted, ports) {
            problems.warnings.push(Problem {
                path: format!("{}.port", fields.path),
                at: Some(at),
                message: format!("{why}; the service will not be registered"),
            });
        }
    }
    fields.finish(problems);
    Service {
        name,
        port,
        tags,
        enable_tag_override,
        connect,
        provider,
        address,
        meta,
        checks,
        at: block.at,
    }
}

/// A service's `check` block; `None` when it cannot be run (a problem says why).
fn check(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<ServiceCheck> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.check"),
        block.at,
        &[
            "type",
            "name",
            "path",
            "protocol",
            "method",
            "interval",
            "timeout",
            "port",
            "command",
            "args",
            "header",
            "check_restart",
            "initial_status",
            "tls_skip_verify",
            "address_mode",
            "task",
            "on_update",
            "success_before_passing",
            "failures_before_critical",
            "expose",
        ],
    );
    let kind_name = fields.required_string("type", problems);
    let name = fields.string("name", problems);
    let path = fields.string("path", problems);
    let protocol = fields.string("protocol", problems);
    let method = fields.string("method", problems);
    let interval = fields.duration("interval", problems);
    let timeout = fields.duration("timeout", problems);
    let port = port_value(&mut fields, problems);
    fields.string("command", problems);
    fields.string_list("args", problems);
    for (required, value) in [("interval", interval), ("timeout", timeout)] {
        if value.is_none() && fields.attr(required).is_none() {
            fields.problem(problems, required, block.at, "is required".into());
        }
    }
    scheduler_level(
        &mut fields,
        &block.body,
        &[
            (
                "check_restart",
                "berth does not restart tasks on failing checks yet",
            ),
            ("header", "berth does not pass check headers to Consul yet"),
            ("tls_skip_verify", "berth does not pass it to Consul yet"),
            ("initial_status", "berth does not pass it to Consul yet"),
            (
                "success_before_passing",
                "berth does not pass it to Consul yet",
            ),
            (
                "failures_before_critical",
                "berth does not pass it to Consul yet",
            ),
            ("on_update", "it concerns Nomad's deployments"),
            ("expose", "berth gives tasks the host's network"),
            ("address_mode", "berth gives tasks the host's network"),
            (
                "task",
                "a group service's checks run in Consul, not in a task",
            ),
        ],
        problems,
    );
    let kind = match kind_name.as_deref() {
        Some("http") => {
            let Some(path) = path else {
                fields.problem(
                    problems,
                    "path",
                    block.at,
                    "is required for an http check".into(),
                );
                fields.finish(problems);
                return None;
            };
            CheckKind::Http {
                path,
                protocol: protocol.unwrap_or_else(|| "http".into()),
                method,
            }
        }
        Some("tcp") => CheckKind::Tcp,
        Some(other) => {
            fields.problem_with(
                problems,
                "type",
                format!(
                    "check type {other:?} is not supported: berth has Consul run its checks, \
                     of type \"http\" or \"tcp\""
                ),
            );
            fields.finish(problems);
            return None;
        }
        None => {
            fields.finish(problems);
            return None;
        }
    };
    fields.finish(problems);
    Some(ServiceCheck {
        name: name.unwrap_or_default(),
        kind,
        interval: interval?,
        timeout: timeout?,
        port,
    })
}

/// A group's `network` block: its ports. Tasks get the host's network, so a static port
/// is used as written and nothing is mapped; what that leaves without effect is said.
fn network(fields: &mut Fields<'_>, problems: &mut Findings) -> Vec<PortLabel> {
    let Some(block) = fields.single_block("network", problems) else {
        return Vec::new();
    };
    let path = format!("{}.network", fields.path);
    let mut network = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            "mode",
            "port",
            "dns",
            "hostname",
            "mbits",
            "reserved_ports",
            "cni",
        ],
    );
    if let Some(mode) = network.string("mode", problems)
        && mode != "host"
    {
        let at = network.attr("mode").map(|a| a.at).unwrap_or(block.at);
        problems.warnings.push(Problem {
            path: format!("{path}.mode"),
            at: Some(at),
            message: format!("mode {mode:?} has no effect on berth: tasks get the host's network"),
        });
    }
    let mut ports = Vec::new();
    for (label, port) in network.labeled_blocks("port", problems) {
        let mut p = Fields::new(
            &port.body,
            format!("{path}.port.{label}"),
            port.at,
            &["static", "to", "host_network"],
        );
        let number = p
            .number("static", u16::MAX as u64, problems)
            .map(|n| n as u16);
        p.number("to", u16::MAX as u64, problems);
        scheduler_level(
            &mut p,
            &port.body,
            &[
                (
                    "to",
                    "berth gives tasks the host's network and maps no port",
                ),
                ("host_network", "berth gives tasks the host's network"),
            ],
            problems,
        );
        p.finish(problems);
        ports.push(PortLabel { label, number });
    }
    scheduler_level(
        &mut network,
        &block.body,
        &[
            ("dns", "berth gives tasks the host's network and resolver"),
            ("hostname", "berth gives tasks the host's network"),
            ("mbits", "berth reserves no bandwidth"),
            ("reserved_ports", "berth reserves no ports"),
            ("cni", "berth gives tasks the host's network"),
        ],
        problems,
    );
    network.finish(problems);
    ports
}

/// The ports the checks name, with where (the service block's line: a check's own
/// port attribute is not kept).
fn checks_ports(
    checks: &[ServiceCheck],
    at: Location,
) -> impl Iterator<Item = (&String, Location)> {
    checks
        .iter()
        .filter_map(move |c| Some((c.port.as_ref()?, at)))
}

/// Why a service cannot register on `port`: it must be a number, or a label of the
/// group's network (static, or dynamic: numbered when the alloc is placed).
fn unusable_port(port: &str, ports: &[PortLabel]) -> Option<String> {
    if port.parse::<u16>().is_ok() {
        return None;
    }
    match ports.iter().find(|p| p.label == port) {
        Some(_) => None,
        None => Some(format!(
            "port {port:?} is not a port of the group's network block (its ports: {})",
            if ports.is_empty() {
                "none".to_string()
            } else {
                ports
                    .iter()
                    .map(|p| p.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
    }
}

/// The sidecar proxy task of a group service with `connect { sidecar_service {} }`, as
/// Nomad injects it: `connect-proxy-<service>`, a prestart sidecar, from the service's
/// `sidecar_task` block. Nomad's default runs Envoy's image in Docker, which berth does
/// not have, so here the block must say how to run Envoy.
fn connect_proxy(
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

/// Ports are a label (`"http"`) or a number (`8080`).
fn port_value(fields: &mut Fields<'_>, problems: &mut Findings) -> Option<String> {
    let value = fields.attr("port")?;
    match &value.value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Failed => None,
        other => {
            fields.problem(
                problems,
                "port",
                value.at,
                format!("expected a port label or number, found {}", other.kind()),
            );
            None
        }
    }
}

/// A construct for Nomad's scheduler, and why it has no effect on one node.
type Ignored = (&'static str, &'static str);

/// Where allocs go among nodes: jobs and groups both have these.
const PLACEMENT: &[Ignored] = &[
    ("affinity", "it is a placement preference among nodes"),
    ("spread", "it spreads allocs across nodes"),
    (
        "update",
        "rolling updates and canaries are deployments across nodes",
    ),
    ("migrate", "it moves allocs off draining nodes"),
];

const JOB_SCHEDULER_LEVEL: &[Ignored] = &[
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

const GROUP_SCHEDULER_LEVEL: &[Ignored] = &[
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

const TASK_SCHEDULER_LEVEL: &[Ignored] = &[
    ("affinity", "it is a placement preference among nodes"),
    (
        "leader",
        "berth does not stop a group's other tasks when this one ends",
    ),
    (
        "max_run_duration",
        "berth does not stop a task after a run time yet",
    ),
    ("scaling", "it is read by Nomad's autoscaler"),
    (
        "consul",
        "berth registers services with the Consul agent of its own config",
    ),
    ("action", "berth has no API to run a task's actions yet"),
];

const RESOURCES_SCHEDULER_LEVEL: &[Ignored] = &[
    ("disk", "berth reserves no disk for a task"),
    ("iops", "berth reserves no IOPS for a task"),
    ("network", "berth gives tasks the host's network"),
    ("numa", "berth does not pin tasks to NUMA nodes"),
];

/// Constructs that change what the task gets, which berth cannot give: refused, so that
/// no task starts without what its author counted on.
const JOB_UNSUPPORTED: &[Ignored] = &[(
    "vault",
    "berth cannot fetch Vault tokens or secrets, and the tasks would start without them",
)];

const GROUP_UNSUPPORTED: &[Ignored] = &[(
    "vault",
    "berth cannot fetch Vault tokens or secrets, and the tasks would start without them",
)];

const TASK_UNSUPPORTED: &[Ignored] = &[
    (
        "vault",
        "berth cannot fetch Vault tokens or secrets, and the task would start without them",
    ),
    (
        "identity",
        "berth issues no workload identity tokens, and the task would start without one",
    ),
    (
        "secret",
        "berth cannot fetch secrets from a secrets provider",
    ),
    (
        "artifact",
        "berth does not download artifacts, and the task would start without them: put the files on a host volume",
    ),
];

const RESOURCES_UNSUPPORTED: &[Ignored] =
    &[("device", "berth cannot give a task devices such as GPUs")];

/// Where `name` (an attribute or a block) is written in `body`, if it is.
fn written(body: &BodyNode, name: &str) -> Option<Location> {
    body.attrs
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.at)
        .or_else(|| body.blocks.iter().find(|b| b.kind == name).map(|b| b.at))
}

/// One warning for each of `constructs` the block has: it is accepted and has no effect.
fn scheduler_level(
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
fn unsupported(
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
fn present(
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

/// The operators of Nomad's constraints.
pub const CONSTRAINT_OPERATORS: &[&str] = &[
    "=",
    "==",
    "is",
    "!=",
    "not",
    ">",
    ">=",
    "<",
    "<=",
    "regexp",
    "version",
    "semver",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
    "distinct_hosts",
    "distinct_property",
    "is_set",
    "is_not_set",
];

fn constraints(fields: &mut Fields, problems: &mut Findings) -> Vec<Constraint> {
    let path = format!("{}.constraint", fields.path);
    fields
        .blocks("constraint")
        .into_iter()
        .map(|block| {
            let mut c = Fields::new(
                &block.body,
                path.clone(),
                block.at,
                &[
                    "attribute",
                    "operator",
                    "value",
                    "distinct_hosts",
                    "distinct_property",
                ],
            );
            let attribute = c.string("attribute", problems).unwrap_or_default();
            let mut operator = c.string("operator", problems).unwrap_or_else(|| "=".into());
            let mut value = c.string("value", problems).unwrap_or_default();
            if c.bool("distinct_hosts", problems).unwrap_or(false) {
                operator = "distinct_hosts".into();
            }
            if let Some(property) = c.string("distinct_property", problems) {
                operator = "distinct_property".into();
                value = property;
            }
            if !CONSTRAINT_OPERATORS.contains(&operator.as_str()) {
                c.problem_with(
                    problems,
                    "operator",
                    format!(
                        "unknown constraint operator {operator:?} (Nomad's are: {})",
                        CONSTRAINT_OPERATORS.join(", ")
                    ),
                );
            }
            let needs_attribute =
                !matches!(operator.as_str(), "distinct_hosts" | "distinct_property");
            if needs_attribute && attribute.is_empty() && !c.failed("attribute") {
                c.problem_with(
                    problems,
                    "attribute",
                    "a constraint needs an attribute, as attribute = \"${attr.kernel.name}\""
                        .into(),
                );
            }
            if operator == "regexp"
                && let Err(error) = regex::Regex::new(&value)
            {
                c.problem_with(
                    problems,
                    "value",
                    format!("{value:?} is not a regular expression: {error}"),
                );
            }
            c.finish(problems);
            Constraint {
                attribute,
                operator,
                value,
                at: block.at,
                path: path.clone(),
            }
        })
        .collect()
}

fn template(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<Template> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.template"),
        block.at,
        &[
            "data",
            "destination",
            "env",
            "perms",
            "source",
            "change_mode",
            "change_signal",
            "change_script",
            "splay",
            "wait",
            "once",
            "uid",
            "gid",
            "left_delimiter",
            "right_delimiter",
            "error_on_missing_key",
        ],
    );
    if let Some(at) = written(&block.body, "source") {
        fields.attr("source");
        fields.problem(
            problems,
            "source",
            at,
            "template files are not supported (berth downloads no artifacts): inline it with data = file(\"…\")".into(),
        );
    }
    for delimiter in ["left_delimiter", "right_delimiter"] {
        if written(&block.body, delimiter).is_some() {
            fields.problem_with(
                problems,
                delimiter,
                format!("{delimiter} is not supported: berth renders {{{{ }}}} templates"),
            );
        }
    }
    // Re-rendering on change: the only data berth renders (the task's env) does not
    // change while the task runs.
    for accepted in ["change_mode", "change_signal", "splay", "uid", "gid"] {
        fields.attr(accepted);
    }
    fields.blocks("wait");
    fields.blocks("change_script");
    fields.bool("once", problems);
    fields.bool("error_on_missing_key", problems);
    let data = fields.string("data", problems).unwrap_or_default();
    if let Err(message) = super::template::check(&data) {
        fields.problem_with(problems, "data", message.to_string());
    }
    let destination = fields
        .required_string("destination", problems)
        .and_then(|d| match super::template::destination(&d) {
            Ok(d) => Some(d),
            Err(message) => {
                fields.problem_with(problems, "destination", message.to_string());
                None
            }
        });
    let env = fields.bool("env", problems).unwrap_or(false);
    let perms_text = fields
        .string("perms", problems)
        .unwrap_or_else(|| "0644".into());
    let perms = match u32::from_str_radix(&perms_text, 8) {
        Ok(perms) if perms <= 0o777 => Some(perms),
        _ => {
            fields.problem_with(
                problems,
                "perms",
                format!("{perms_text:?} is not an octal file mode such as \"0644\""),
            );
            None
        }
    };
    fields.finish(problems);
    Some(Template {
        data,
        destination: destination?,
        env,
        perms: perms?,
        at: block.at,
    })
}
