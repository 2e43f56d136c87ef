//! From the located HCL tree to typed jobspec structures, collecting every problem.

use std::time::Duration;

use super::fields::{Fields, block_json};
use super::hcl::{BlockNode, BodyNode, Location, Value};
use super::names::{NameKind, check_name, normalise_task_path};
use super::*;
use crate::model::limits::{MIN_CPU_MHZ, MIN_MEMORY_MB};

pub(super) fn job(tree: &BodyNode, problems: &mut Vec<Problem>) -> Option<Job> {
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
        ],
    );
    let job_type_text = fields.string("type", problems);
    let job_type = fields
        .choose(
            job_type_text,
            "type",
            &[("service", JobType::Service), ("batch", JobType::Batch)],
            problems,
            |other| format!("unknown job type {other:?} (use \"service\" or \"batch\")"),
        )
        .unwrap_or(JobType::Service);
    let datacenters = fields.string_list("datacenters", problems);
    let meta = fields.string_map("meta", problems);
    for ignored in ["region", "namespace"] {
        fields.string(ignored, problems);
    }
    fields.number("priority", 100, problems);
    let groups: Vec<Group> = fields
        .labeled_blocks("group", problems)
        .into_iter()
        .map(|(name, block)| group(&path, &name, block, job_type, problems))
        .collect();
    if groups.is_empty() && !block.body.blocks.iter().any(|b| b.kind == "group") {
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
        groups,
    })
}

fn group(
    parent: &str,
    name: &str,
    block: &BlockNode,
    job_type: JobType,
    problems: &mut Vec<Problem>,
) -> Group {
    let path = format!("{parent}.group.{name}");
    check_label(NameKind::Group, name, &path, block.at, problems);
    let mut fields = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            "count", "volume", "service", "restart", "meta", "task", "network",
        ],
    );
    let count = fields.number("count", 10_000, problems).unwrap_or(1) as u32;
    let volumes = fields
        .labeled_blocks("volume", problems)
        .into_iter()
        .filter_map(|(name, block)| volume(&path, &name, block, problems))
        .collect();
    let services = fields
        .blocks("service")
        .into_iter()
        .map(|b| service(&path, b, problems))
        .collect();
    let restart = match fields.single_block("restart", problems) {
        Some(block) => restart(&path, block, job_type, problems),
        None => RestartPolicy::default_for(job_type),
    };
    let meta = fields.string_map("meta", problems);
    // Ports are declared here in Nomad; accepted and kept for the service blocks.
    fields.blocks("network");
    let tasks: Vec<Task> = fields
        .labeled_blocks("task", problems)
        .into_iter()
        .map(|(name, block)| task(&path, &name, block, problems))
        .collect();
    if tasks.is_empty() && !block.body.blocks.iter().any(|b| b.kind == "task") {
        fields.problem(
            problems,
            "",
            block.at,
            "a group needs at least one task".into(),
        );
    }
    fields.finish(problems);
    Group {
        name: name.to_string(),
        count,
        volumes,
        services,
        restart,
        meta,
        tasks,
    }
}

fn volume(
    parent: &str,
    name: &str,
    block: &BlockNode,
    problems: &mut Vec<Problem>,
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

fn restart(
    parent: &str,
    block: &BlockNode,
    job_type: JobType,
    problems: &mut Vec<Problem>,
) -> RestartPolicy {
    let defaults = RestartPolicy::default_for(job_type);
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

fn task(parent: &str, name: &str, block: &BlockNode, problems: &mut Vec<Problem>) -> Task {
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
        ],
    );
    let driver_at = fields.attr("driver").map(|v| v.at).unwrap_or(block.at);
    let driver = fields
        .required_string("driver", problems)
        .unwrap_or_default();
    let config = match fields.single_block("config", problems) {
        Some(config) => block_json(&config.body),
        None => serde_json::json!({}),
    };
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
                &["cpu", "memory", "memory_max", "cores"],
            );
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
        .map(|b| service(&path, b, problems))
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
    for accepted in ["template", "artifact", "logs"] {
        fields.blocks(accepted);
    }
    fields.finish(problems);
    Task {
        name: name.to_string(),
        driver,
        config,
        env,
        meta,
        resources,
        kill_timeout,
        kill_signal,
        user,
        volume_mounts,
        csi_plugin,
        services,
        lifecycle,
        hooks,
        at: block.at,
        driver_at,
        hooks_at,
    }
}

fn volume_mount(
    parent: &str,
    block: &BlockNode,
    problems: &mut Vec<Problem>,
) -> Option<VolumeMount> {
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
    let destination = fields
        .required_string("destination", problems)
        .and_then(|d| task_path(&mut fields, "destination", &d, block.at, problems));
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

fn csi_plugin(parent: &str, block: &BlockNode, problems: &mut Vec<Problem>) -> Option<CsiPlugin> {
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
fn check_label(kind: NameKind, name: &str, path: &str, at: Location, problems: &mut Vec<Problem>) {
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
    problems: &mut Vec<Problem>,
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

fn service(parent: &str, block: &BlockNode, problems: &mut Vec<Problem>) -> Service {
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
    fields.string("provider", problems);
    fields.blocks("check");
    fields.finish(problems);
    Service {
        name,
        port,
        tags,
        enable_tag_override,
        connect,
    }
}

/// Ports are a label (`"http"`) or a number (`8080`).
fn port_value(fields: &mut Fields<'_>, problems: &mut Vec<Problem>) -> Option<String> {
    let value = fields.attr("port")?;
    match &value.value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
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
