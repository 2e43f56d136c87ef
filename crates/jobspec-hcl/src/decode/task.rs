//! A `task` block, with its `logs`, `dispatch_payload`, `volume_mount`, `csi_plugin` and
//! `template` blocks.

use berth_jobspec::fields as schema;
use std::time::Duration;

use berth_hcl::Problem;
use berth_hcl::fields::{Fields, block_json};
use berth_hcl::tree::BlockNode;
use berth_model::limits::{MIN_CPU_MHZ, MIN_MEMORY_MB};
use berth_model::mount::Propagation;

use super::artifact::artifact;
use super::constraints::constraints;
use super::identity::identities;
use super::ignored::{
    RESOURCES_SCHEDULER_LEVEL, RESOURCES_UNSUPPORTED, TASK_SCHEDULER_LEVEL, TASK_UNSUPPORTED,
    scheduler_level, unsupported, written,
};
use super::restart::restart;
use super::service::service;
use super::{check_label, task_path};
use crate::Findings;
use berth_jobspec::names::NameKind;
use berth_jobspec::*;

pub(super) fn task(
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
            schema::task::DRIVER.hcl,
            schema::task::CONFIG.hcl,
            schema::task::ENV.hcl,
            schema::task::META.hcl,
            schema::task::RESOURCES.hcl,
            schema::task::KILL_TIMEOUT.hcl,
            schema::task::KILL_SIGNAL.hcl,
            schema::task::VOLUME_MOUNT.hcl,
            "csi_plugin",
            "service",
            schema::task::LIFECYCLE.hcl,
            "hooks",
            schema::task::USER.hcl,
            schema::task::TEMPLATE.hcl,
            schema::task::ARTIFACT.hcl,
            schema::task::LOGS.hcl,
            schema::task::CONSTRAINT.hcl,
            "affinity",
            "leader",
            schema::task::SHUTDOWN_DELAY.hcl,
            schema::task::MAX_RUN_DURATION.hcl,
            "vault",
            "identity",
            "secret",
            schema::task::DISPATCH_PAYLOAD.hcl,
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
        .single_block(schema::task::DISPATCH_PAYLOAD.hcl, problems)
        .and_then(|b| dispatch_payload(&path, b, problems));
    let logs = fields
        .single_block(schema::task::LOGS.hcl, problems)
        .map(|b| logs(&path, b, problems))
        .unwrap_or_default();
    let template_blocks = fields.blocks(schema::task::TEMPLATE.hcl);
    if let Some(extra) = template_blocks.get(berth_jobspec::template::MAX_TEMPLATES) {
        fields.problem(
            problems,
            schema::task::TEMPLATE.hcl,
            extra.at,
            format!(
                "a task has at most {} templates (each is rendered again on every change \
                 it reads)",
                berth_jobspec::template::MAX_TEMPLATES
            ),
        );
    }
    let templates = template_blocks
        .into_iter()
        .filter_map(|b| template(&path, b, problems))
        .collect();
    let artifact_blocks = fields.blocks(schema::task::ARTIFACT.hcl);
    if let Some(extra) = artifact_blocks.get(berth_jobspec::artifact::MAX_ARTIFACTS) {
        fields.problem(
            problems,
            schema::task::ARTIFACT.hcl,
            extra.at,
            format!(
                "a task has at most {} artifacts",
                berth_jobspec::artifact::MAX_ARTIFACTS
            ),
        );
    }
    let artifacts = artifact_blocks
        .into_iter()
        .filter_map(|b| artifact(&path, b, problems))
        .collect();
    let identities = identities(&path, fields.blocks("identity"), problems);
    // 0 is Nomad's JSON for "no limit".
    let max_run_duration = fields
        .duration(schema::task::MAX_RUN_DURATION.hcl, problems)
        .filter(|d| !d.is_zero());
    fields.string("kind", problems);
    let driver_at = fields
        .attr(schema::task::DRIVER.hcl)
        .map(|v| v.at)
        .unwrap_or(block.at);
    let driver = fields
        .required_string(schema::task::DRIVER.hcl, problems)
        .unwrap_or_default();
    let config_block = fields.single_block(schema::task::CONFIG.hcl, problems);
    let config = match config_block {
        Some(config) => block_json(&config.body),
        None => serde_json::json!({}),
    };
    let config_at = config_block.map(|config| {
        let keys = config.body.attrs.iter().map(|a| (a.name.clone(), a.at));
        let blocks = config.body.blocks.iter().map(|b| (b.kind.clone(), b.at));
        (config.at, keys.chain(blocks).collect())
    });
    let env = fields.string_map(schema::task::ENV.hcl, problems);
    let meta = fields.string_map(schema::task::META.hcl, problems);
    let hooks_at = fields.attr("hooks").map(|v| v.at).unwrap_or(block.at);
    let hooks = fields.string_list("hooks", problems);
    let resources = match fields.single_block(schema::task::RESOURCES.hcl, problems) {
        Some(block) => {
            let mut r = Fields::new(
                &block.body,
                format!("{path}.resources"),
                block.at,
                &[
                    schema::resources::CPU.hcl,
                    schema::resources::MEMORY.hcl,
                    schema::resources::MEMORY_MAX.hcl,
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
            let cpu = r
                .number(schema::resources::CPU.hcl, 1_000_000, problems)
                .unwrap_or(100);
            let memory = r
                .number(schema::resources::MEMORY.hcl, 1_000_000, problems)
                .unwrap_or(300);
            let memory_max = r.number(schema::resources::MEMORY_MAX.hcl, 1_000_000, problems);
            if cpu < MIN_CPU_MHZ {
                r.problem_with(
                    problems,
                    schema::resources::CPU.hcl,
                    format!("minimum CPU value is {MIN_CPU_MHZ} (MHz); got {cpu}"),
                );
            }
            if memory < MIN_MEMORY_MB {
                r.problem_with(
                    problems,
                    schema::resources::MEMORY.hcl,
                    format!("minimum memory value is {MIN_MEMORY_MB} (MiB); got {memory}"),
                );
            }
            if let Some(max) = memory_max.filter(|max| *max < memory) {
                r.problem_with(
                    problems,
                    schema::resources::MEMORY_MAX.hcl,
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
        .duration(schema::task::KILL_TIMEOUT.hcl, problems)
        .unwrap_or(Duration::from_secs(5));
    let shutdown_delay = fields
        .duration(schema::task::SHUTDOWN_DELAY.hcl, problems)
        .unwrap_or_default();
    let kill_signal = fields
        .string(schema::task::KILL_SIGNAL.hcl, problems)
        .unwrap_or_else(|| "SIGTERM".into());
    let volume_mounts = fields
        .blocks(schema::task::VOLUME_MOUNT.hcl)
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
        .single_block(schema::task::LIFECYCLE.hcl, problems)
        .and_then(|block| {
            let mut l = Fields::new(
                &block.body,
                format!("{path}.lifecycle"),
                block.at,
                &[schema::lifecycle::HOOK.hcl, schema::lifecycle::SIDECAR.hcl],
            );
            let hook_text = l.required_string(schema::lifecycle::HOOK.hcl, problems);
            let hook = l.choose(
                hook_text,
                schema::lifecycle::HOOK.hcl,
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
            let sidecar = l
                .bool(schema::lifecycle::SIDECAR.hcl, problems)
                .unwrap_or(false);
            l.finish(problems);
            hook.map(|hook| Lifecycle { hook, sidecar })
        });
    let user = fields.string(schema::task::USER.hcl, problems);
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
        artifacts,
        identities,
        max_run_duration,
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

/// A task's `logs` block, in Nomad's units: `max_file_size` in MB.
pub(super) fn logs(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> berth_model::driver::LogRotation {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.logs"),
        block.at,
        &[
            schema::logs::MAX_FILES.hcl,
            schema::logs::MAX_FILE_SIZE.hcl,
            "disabled",
            "enabled",
        ],
    );
    let defaults = berth_model::driver::LogRotation::default();
    let max_files = fields
        .number(schema::logs::MAX_FILES.hcl, 1_000, problems)
        .map_or(defaults.max_files, |n| n.max(1) as u32);
    let max_file_size = fields
        .number(schema::logs::MAX_FILE_SIZE.hcl, 100_000, problems)
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

pub(super) fn dispatch_payload(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<String> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.dispatch_payload"),
        block.at,
        &[schema::dispatch_payload::FILE.hcl],
    );
    let file = fields.required_string(schema::dispatch_payload::FILE.hcl, problems)?;
    let safe = !file.is_empty()
        && !file.starts_with('/')
        && file
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !safe {
        fields.problem_with(
            problems,
            schema::dispatch_payload::FILE.hcl,
            format!(
                "{file:?} must be a relative path below the task's local/ directory, without \
                 \"..\""
            ),
        );
    }
    fields.finish(problems);
    safe.then(|| format!("local/{file}"))
}

pub(super) fn volume_mount(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<VolumeMount> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.volume_mount"),
        block.at,
        &[
            schema::volume_mount::VOLUME.hcl,
            schema::volume_mount::DESTINATION.hcl,
            schema::volume_mount::READ_ONLY.hcl,
            schema::volume_mount::PROPAGATION_MODE.hcl,
            "selinux_label",
        ],
    );
    let volume = fields.required_string(schema::volume_mount::VOLUME.hcl, problems);
    // `${NOMAD_ALLOC_DIR}/data` is interpolated when the task starts, and checked then
    // (the `volumes` hook); what is written around the names is checked now.
    let destination = fields
        .required_string(schema::volume_mount::DESTINATION.hcl, problems)
        .and_then(|d| {
            let literal = berth_jobspec::interpolate::interpolate(&d, &|_| Some("/x".into()));
            task_path(
                &mut fields,
                schema::volume_mount::DESTINATION.hcl,
                &literal,
                block.at,
                problems,
            )
            .map(|_| if d.contains("${") { d } else { literal })
        });
    let read_only = fields
        .bool(schema::volume_mount::READ_ONLY.hcl, problems)
        .unwrap_or(false);
    let propagation_text = fields
        .string(schema::volume_mount::PROPAGATION_MODE.hcl, problems)
        .unwrap_or_else(|| "private".into());
    let propagation = fields.choose(
        Some(propagation_text),
        schema::volume_mount::PROPAGATION_MODE.hcl,
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

pub(super) fn csi_plugin(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<CsiPlugin> {
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

pub(super) fn template(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<Template> {
    let path = format!("{parent}.template");
    let mut fields = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            schema::template::DATA.hcl,
            schema::template::DESTINATION.hcl,
            schema::template::ENV.hcl,
            schema::template::PERMS.hcl,
            schema::template::CHANGE_MODE.hcl,
            schema::template::CHANGE_SIGNAL.hcl,
            schema::template::CHANGE_SCRIPT.hcl,
            schema::template::SPLAY.hcl,
            schema::template::WAIT.hcl,
            schema::template::ONCE.hcl,
            schema::template::UID.hcl,
            schema::template::GID.hcl,
            schema::template::LEFT_DELIMITER.hcl,
            schema::template::RIGHT_DELIMITER.hcl,
            schema::template::ERROR_ON_MISSING_KEY.hcl,
            "source",
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
    // A delimiter as written; the default's when unset or refused.
    let mut delimiter = |name: &'static str, fields: &mut Fields| {
        let written = fields.string(name, problems)?;
        if written.is_empty() || written.chars().any(char::is_whitespace) {
            fields.problem_with(
                problems,
                name,
                format!("{written:?} cannot delimit actions: it must be one or more characters without white space"),
            );
            return None;
        }
        Some(written)
    };
    let left = delimiter(schema::template::LEFT_DELIMITER.hcl, &mut fields);
    let right = delimiter(schema::template::RIGHT_DELIMITER.hcl, &mut fields);
    let delimiters = berth_template::Delimiters {
        left: left.unwrap_or_else(|| "{{".into()),
        right: right.unwrap_or_else(|| "}}".into()),
    };
    let once = fields
        .bool(schema::template::ONCE.hcl, problems)
        .unwrap_or(false);
    let error_on_missing_key = fields
        .bool(schema::template::ERROR_ON_MISSING_KEY.hcl, problems)
        .unwrap_or(false);
    let data = fields
        .string(schema::template::DATA.hcl, problems)
        .unwrap_or_default();
    if let Err(message) = berth_jobspec::template::check(&data, &delimiters) {
        fields.problem_with(problems, schema::template::DATA.hcl, message.to_string());
    }
    let destination = fields
        .required_string(schema::template::DESTINATION.hcl, problems)
        .and_then(|d| match berth_jobspec::template::destination(&d) {
            Ok(d) => Some(d),
            Err(message) => {
                fields.problem_with(
                    problems,
                    schema::template::DESTINATION.hcl,
                    message.to_string(),
                );
                None
            }
        });
    let env = fields
        .bool(schema::template::ENV.hcl, problems)
        .unwrap_or(false);
    let perms_text = fields
        .string(schema::template::PERMS.hcl, problems)
        .unwrap_or_else(|| "0644".into());
    let perms = match u32::from_str_radix(&perms_text, 8) {
        Ok(perms) if perms <= 0o777 => Some(perms),
        _ => {
            fields.problem_with(
                problems,
                schema::template::PERMS.hcl,
                format!("{perms_text:?} is not an octal file mode such as \"0644\""),
            );
            None
        }
    };
    let splay = fields
        .duration(schema::template::SPLAY.hcl, problems)
        .unwrap_or(Duration::from_secs(5));
    let wait = fields
        .single_block(schema::template::WAIT.hcl, problems)
        .map_or(Some(TemplateWait::default()), |b| {
            template_wait(&path, b, problems)
        });
    let uid = template_owner(&mut fields, schema::template::UID.hcl, problems);
    let gid = template_owner(&mut fields, schema::template::GID.hcl, problems);
    let change_mode = change_mode(&path, &mut fields, problems);
    fields.finish(problems);
    Some(Template {
        data,
        destination: destination?,
        env,
        perms: perms?,
        left_delimiter: delimiters.left,
        right_delimiter: delimiters.right,
        change_mode: change_mode?,
        splay,
        wait: wait?,
        uid: uid.ok()?,
        gid: gid.ok()?,
        error_on_missing_key,
        once,
        at: block.at,
    })
}

/// `uid`/`gid`: an id, or -1 (Nomad's "the task's user", as unset).
fn template_owner(
    fields: &mut Fields,
    name: &'static str,
    problems: &mut Findings,
) -> Result<Option<u32>, ()> {
    let Some(value) = fields.attr(name) else {
        return Ok(None);
    };
    let at = value.at;
    let id = match &value.value {
        berth_hcl::tree::Value::Number(n) => n.as_i64(),
        _ => None,
    };
    match id {
        Some(-1) => Ok(None),
        Some(id) if (0..i64::from(u32::MAX)).contains(&id) => Ok(Some(id as u32)),
        _ => {
            fields.problem(
                problems,
                name,
                at,
                format!("{name} must be a user or group id (0 or more), or -1 for the task's own"),
            );
            Err(())
        }
    }
}

/// `change_mode` with `change_signal` or `change_script`, as Nomad pairs them.
fn change_mode(path: &str, fields: &mut Fields, problems: &mut Findings) -> Option<ChangeMode> {
    let written = fields.string(schema::template::CHANGE_MODE.hcl, problems);
    let signal = fields.string(schema::template::CHANGE_SIGNAL.hcl, problems);
    let script = fields.single_block(schema::template::CHANGE_SCRIPT.hcl, problems);
    let mode = written.clone().unwrap_or_else(|| "restart".into());
    let mode = match mode.as_str() {
        "restart" => ChangeMode::Restart,
        "noop" => ChangeMode::Noop,
        "signal" => {
            let Some(signal) = signal.clone() else {
                fields.problem_with(
                    problems,
                    schema::template::CHANGE_MODE.hcl,
                    "change_mode = \"signal\" needs change_signal (as change_signal = \"SIGHUP\")"
                        .into(),
                );
                return None;
            };
            if !berth_jobspec::template::is_signal(&signal) {
                fields.problem_with(
                    problems,
                    schema::template::CHANGE_SIGNAL.hcl,
                    format!(
                        "{signal:?} is not a signal berth sends (one of {})",
                        berth_jobspec::template::SIGNALS.join(", ")
                    ),
                );
                return None;
            }
            ChangeMode::Signal(signal)
        }
        "script" => {
            let Some(block) = script else {
                fields.problem_with(
                    problems,
                    schema::template::CHANGE_MODE.hcl,
                    "change_mode = \"script\" needs a change_script block with its command".into(),
                );
                return None;
            };
            ChangeMode::Script(change_script(path, block, problems)?)
        }
        other => {
            fields.problem_with(
                problems,
                schema::template::CHANGE_MODE.hcl,
                format!("{other:?} is not a change mode (restart, signal, script or noop)"),
            );
            return None;
        }
    };
    if signal.is_some() && !matches!(mode, ChangeMode::Signal(_)) {
        fields.problem_with(
            problems,
            schema::template::CHANGE_SIGNAL.hcl,
            format!("change_signal is used only with change_mode = \"signal\" (this template's is {:?})", mode.as_str()),
        );
    }
    if script.is_some() && !matches!(mode, ChangeMode::Script(_)) {
        fields.problem_with(
            problems,
            schema::template::CHANGE_SCRIPT.hcl,
            format!("change_script is used only with change_mode = \"script\" (this template's is {:?})", mode.as_str()),
        );
    }
    Some(mode)
}

fn change_script(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<ChangeScript> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.change_script"),
        block.at,
        &[
            schema::change_script::COMMAND.hcl,
            schema::change_script::ARGS.hcl,
            schema::change_script::TIMEOUT.hcl,
            schema::change_script::FAIL_ON_ERROR.hcl,
        ],
    );
    let command = fields.required_string(schema::change_script::COMMAND.hcl, problems);
    let args = fields.string_list(schema::change_script::ARGS.hcl, problems);
    let timeout = fields
        .duration(schema::change_script::TIMEOUT.hcl, problems)
        .unwrap_or(Duration::from_secs(5));
    let fail_on_error = fields
        .bool(schema::change_script::FAIL_ON_ERROR.hcl, problems)
        .unwrap_or(false);
    fields.finish(problems);
    Some(ChangeScript {
        command: command?,
        args,
        timeout,
        fail_on_error,
    })
}

fn template_wait(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<TemplateWait> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.wait"),
        block.at,
        &[
            schema::template_wait::MIN.hcl,
            schema::template_wait::MAX.hcl,
        ],
    );
    let default = TemplateWait::default();
    let min = fields.duration(schema::template_wait::MIN.hcl, problems);
    let max = fields.duration(schema::template_wait::MAX.hcl, problems);
    let wait = TemplateWait {
        min: min.unwrap_or(default.min),
        max: max.unwrap_or(default.max.max(min.unwrap_or_default())),
    };
    if wait.min > wait.max {
        fields.problem_with(
            problems,
            schema::template_wait::MIN.hcl,
            format!("min ({:?}) is longer than max ({:?})", wait.min, wait.max),
        );
        fields.finish(problems);
        return None;
    }
    fields.finish(problems);
    Some(wait)
}
