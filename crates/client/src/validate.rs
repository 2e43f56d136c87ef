//! Checks a job before it runs, against the drivers this agent has and its config.
//! The same checks back `berth job validate` (no agent needed) and every job run, and
//! they report every problem found, not only the first.
//!
//! MountConfig is checked here, at submit, against the driver's declared capabilities
//! (Nomad's server could not: it did not know them), and again by the `volumes` task
//! hook, so a job that skipped this still fails cleanly.

use std::collections::BTreeMap;

use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::hook_set::HookSet;
use berth_hcl::Problem;
use berth_jobspec::{Job, ServiceProvider, Task, VolumeMount, VolumeRequest, VolumeType};
use berth_model::driver::{FsIsolation, MountConfigs, TaskUser};
use berth_model::mount::Propagation;
use berth_runtime::driver::Driver;
use berth_state::catalog::Catalog;

/// Why a volume mount cannot be given to a task. Shared with the `volumes` hook so
/// both say the same thing.
pub fn mount_config_refusal(task: &str, driver: &Driver, mount: &VolumeMount) -> Option<String> {
    (driver.capabilities().mount_configs == MountConfigs::None).then(|| {
        format!(
            "task {task:?}: driver {:?} cannot mount volumes, but volume_mount {:?} asks for one",
            driver.name(),
            mount.volume
        )
    })
}

/// Why a task may not use its driver on this agent: `raw_exec` runs tasks unconfined,
/// as the agent's user, and `mock` is a development driver, so each is refused unless the
/// operator enabled it (as Nomad does raw_exec). Shared with the task runner, which
/// checks again before it starts a task (a job accepted earlier may be restored under a
/// config that no longer allows it).
pub fn disabled_driver_refusal(task: &str, driver: &str, config: &AgentConfig) -> Option<String> {
    if config.driver_enabled(driver) {
        return None;
    }
    let why = match driver {
        "raw_exec" => "it runs tasks unconfined, as the agent's user",
        _ => "it is a development driver, whose tasks only pretend to run",
    };
    Some(format!(
        "task {task:?}: driver {driver:?} is disabled on this agent: {why}; an operator \
         enables it with plugin {driver:?} {{ config {{ enabled = true }} }} in the agent config"
    ))
}

/// Whether the operator lets `driver`, from the file it was loaded from, spawn unconfined.
pub fn driver_allows_unconfined(driver: &Driver, config: &AgentConfig) -> bool {
    let file = match driver.origin() {
        berth_runtime::driver::DriverOrigin::Builtin => None,
        berth_runtime::driver::DriverOrigin::File(path) => Some(path.as_path()),
    };
    config.allows_unconfined(driver.name(), file)
}

/// Whether `driver`'s tasks may run on this agent as far as its isolation goes: it did
/// not say it spawns unconfined, or the operator allows it to.
pub fn may_run_tasks_here(driver: &Driver, config: &AgentConfig) -> bool {
    !driver.capabilities().declares_unconfined() || driver_allows_unconfined(driver, config)
}

/// Why a task may not use a driver that said it spawns tasks unconfined (`spawn-isolation`
/// lists `none`) here: the operator has not allowed that driver to. Known at `job
/// validate`, so the job is refused there rather than failing at its start. Shared with
/// the task runner, which checks again before it starts a task (the config may have
/// changed since the job was accepted).
pub fn unconfined_refusal(task: &str, driver: &Driver, config: &AgentConfig) -> Option<String> {
    if may_run_tasks_here(driver, config) {
        return None;
    }
    let name = driver.name();
    let grant = match driver.origin() {
        berth_runtime::driver::DriverOrigin::File(path) => format!(
            "plugin {name:?} {{ path = {:?}, allow_unconfined = true }}",
            path.display().to_string()
        ),
        // Only raw_exec among the built-in drivers spawns unconfined.
        berth_runtime::driver::DriverOrigin::Builtin => {
            format!("plugin {name:?} {{ config {{ enabled = true }} }}")
        }
    };
    Some(format!(
        "task {task:?}: driver {name:?} runs its tasks unconfined (as the agent's user, in the \
         host's namespaces: its spawn-isolation lists \"none\"), which the operator has not \
         allowed for this driver: {grant} in the agent config allows it"
    ))
}

/// The user a confining driver runs a task as when its job names none, as Nomad's
/// `exec` driver does.
pub const DEFAULT_TASK_USER: &str = "nobody";

/// Whether `task` runs as ids of its own from `user { dynamic_range }`: its job names no
/// user, its driver confines it (`exec`), and it is no CSI plugin the operator lets mount
/// (that one keeps root).
pub fn wants_dynamic_user(
    job: &Job,
    task: &Task,
    isolation: FsIsolation,
    config: &AgentConfig,
) -> bool {
    let privileged = task
        .csi_plugin
        .as_ref()
        .is_some_and(|p| config.csi_privileged(&p.id, job));
    // A task on an image with a namespace of its own runs as its ids whatever its job's
    // `user`, which names a user of the image.
    (task.user.is_none() || has_own_user_namespace(isolation, config))
        && !privileged
        && isolation.confines()
}

/// Whether a task of a driver with `isolation` runs in a user namespace of its own: a
/// task on an image, unless the operator set `image { userns = "host" }` (a CSI plugin
/// the operator lets keep root aside).
pub fn has_own_user_namespace(isolation: FsIsolation, config: &AgentConfig) -> bool {
    isolation == FsIsolation::Image && config.image.private_user_namespaces
}

/// The user `task` runs as (name and ids), or `None` for the agent's own user (root):
/// its `user`; else [`DEFAULT_TASK_USER`] when its driver confines tasks (fs-isolation
/// `chroot`: `exec`); a CSI plugin the operator granted mounting (`csi {
/// privileged_plugin }`, for this job) keeps root. Refused when the user does not exist, or when the
/// operator's `user { denylist }` names it for a driver of `checked_drivers` (by name or
/// by uid, so `user = "0"` is `root`). Shared with the task runner, which checks again
/// before every start (a job accepted earlier may be restored under a stricter config).
/// Users are found with `lookup` (the runners pass their `Sys`'s). `dynamic`: the
/// ids the alloc took for this task from `user { dynamic_range }`, which it runs as in
/// place of [`DEFAULT_TASK_USER`] ([`DynamicIds::NotYet`] at submit).
pub fn task_user(
    job: &Job,
    task: &Task,
    isolation: FsIsolation,
    config: &AgentConfig,
    lookup: &dyn Fn(&str) -> Result<TaskUser, berth_sys::process::users::UserError>,
    dynamic: DynamicIds,
) -> Result<Option<(String, TaskUser)>, UserRefusal> {
    let taken = match dynamic {
        DynamicIds::NotYet => None,
        DynamicIds::Taken(taken) => taken,
    };
    if let Some(user) = taken.filter(|_| wants_dynamic_user(job, task, isolation, config)) {
        // Its own ids, which no host user holds (checked at agent start): nothing to
        // look up, and never a denied user.
        return Ok(Some((format!("dynamic uid {}", user.uid), user)));
    }
    let privileged = task
        .csi_plugin
        .as_ref()
        .is_some_and(|p| config.csi_privileged(&p.id, job));
    if has_own_user_namespace(isolation, config) && !privileged {
        // Its `user` is one of the image's, found in the image when the task starts; on
        // the host it runs as the ids its alloc takes. Never as the agent's (root) for
        // want of them (attack review: an alloc recorded before namespaces were on).
        return match dynamic {
            DynamicIds::NotYet => Ok(None),
            DynamicIds::Taken(_) => Err(UserRefusal::NoIdsForImage {
                task: task.name.clone(),
            }),
        };
    }
    let name = match &task.user {
        Some(user) => Some(user.clone()),
        None if privileged => None,
        None if isolation.confines() => Some(DEFAULT_TASK_USER.to_string()),
        None => None,
    };
    let user = match &name {
        Some(name) => Some(lookup(name).map_err(|source| UserRefusal::Unknown {
            task: task.name.clone(),
            source,
        })?),
        None => None,
    };
    let policy = &config.users;
    if privileged || !policy.checked_drivers.contains(&task.driver) {
        return Ok(name.zip(user));
    }
    // Without a user the task runs as the agent's. A denied user is matched by name, by
    // uid, and for root also by primary group 0 (root's files' group).
    let (uid, gid) = user.map_or_else(
        || {
            (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            )
        },
        |u| (u.uid, u.gid),
    );
    let denied = policy.denylist.iter().find(|denied| {
        name.as_deref() == Some(denied.as_str())
            || lookup(denied).is_ok_and(|d| d.uid == uid || (d.uid == 0 && gid == 0))
    });
    if let Some(denied) = denied {
        return Err(UserRefusal::Denied {
            task: task.name.clone(),
            user: name.unwrap_or_else(|| "the agent's user".into()),
            driver: task.driver.clone(),
            denied: denied.clone(),
        });
    }
    Ok(name.zip(user))
}

/// The ids an alloc took for a task, as [`task_user`] is told them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamicIds {
    /// At submit: the alloc has taken none yet.
    NotYet,
    /// When the task runs: what its alloc took for it, if anything.
    Taken(Option<TaskUser>),
}

/// Why a task may not run as its user.
#[derive(Debug, thiserror::Error)]
pub enum UserRefusal {
    #[error(
        "task {task:?} runs on an image in a user namespace of its own, and its alloc holds \
         no user id for it (the alloc was placed before the agent's image {{ userns }} was \
         \"private\"): stop the alloc and run the job again"
    )]
    NoIdsForImage { task: String },
    #[error("task {task:?}: {source}")]
    Unknown {
        task: String,
        source: berth_sys::process::users::UserError,
    },
    #[error(
        "task {task:?}: user {user:?} is denied for driver {driver:?} on this agent (the agent \
         config's user {{ denylist }} names {denied:?}); run the task as another user, or an \
         operator changes the list (user {{ denylist = [...] }})"
    )]
    Denied {
        task: String,
        user: String,
        driver: String,
        denied: String,
    },
}

/// Why a bidirectional mount is not allowed, if it is not: it needs a read-write volume,
/// and neither the volume, the mount nor the agent's host volume may be read-only.
pub fn bidirectional_refusal(
    task: &str,
    mount: &VolumeMount,
    volume: &VolumeRequest,
    host_read_only: bool,
) -> Option<String> {
    if mount.propagation != Propagation::Bidirectional {
        return None;
    }
    let read_only = if volume.read_only {
        Some(format!("volume {:?} is read-only", volume.name))
    } else if mount.read_only {
        Some("the volume_mount is read-only".to_string())
    } else if host_read_only {
        Some(format!(
            "the agent's host_volume {:?} is read-only",
            volume.source
        ))
    } else {
        None
    };
    read_only.map(|why| {
        format!(
            "task {task:?}: volume_mount {:?} uses bidirectional propagation, which needs a read-write volume, but {why}",
            mount.volume
        )
    })
}

/// What is wrong with a CSI volume request, checked against the catalog when there is
/// one (`berth job validate` runs without an agent, so without the catalog).
fn csi_volume_problems(volume: &VolumeRequest, catalog: Option<&dyn Catalog>) -> Vec<String> {
    use berth_model::csi::{AccessMode, AttachmentMode};
    let mut problems = Vec::new();
    let access_mode = match volume.access_mode.as_deref() {
        None => {
            problems.push(format!(
                "CSI volume {:?} needs an access_mode (e.g. \"single-node-writer\")",
                volume.name
            ));
            None
        }
        Some(text) => AccessMode::parse(text)
            .map_err(|why| problems.push(why.to_string()))
            .ok(),
    };
    let attachment_mode =
        AttachmentMode::parse(volume.attachment_mode.as_deref().unwrap_or("file-system"))
            .map_err(|why| problems.push(why.to_string()))
            .ok();
    if attachment_mode == Some(AttachmentMode::BlockDevice) {
        problems.push(
            "attachment_mode \"block-device\" is not supported: berth mounts CSI volumes as file systems"
                .into(),
        );
    }
    if let Some(mode) = access_mode.filter(|m| m.read_only() && !volume.read_only) {
        problems.push(format!(
            "access_mode {mode} cannot be written to: set read_only = true on volume {:?}",
            volume.name
        ));
    }
    let Some(catalog) = catalog else {
        return problems;
    };
    match catalog.volume(&volume.source) {
        Err(error) => problems.push(format!(
            "{error}; register it with `berth volume register FILE` or create it with `berth volume create FILE`"
        )),
        Ok(status) => {
            if let (Some(access_mode), Some(attachment_mode)) = (access_mode, attachment_mode) {
                let offered = &status.volume.capabilities;
                let fits = offered.iter().any(|c| {
                    c.access_mode == access_mode && c.attachment_mode == attachment_mode
                });
                if !offered.is_empty() && !fits {
                    let list: Vec<String> = offered
                        .iter()
                        .map(|c| format!("{} / {}", c.access_mode, c.attachment_mode))
                        .collect();
                    problems.push(format!(
                        "CSI volume {:?} does not offer {access_mode} / {attachment_mode} (it offers: {})",
                        volume.source,
                        list.join(", ")
                    ));
                }
            }
        }
    }
    problems
}

/// Every problem with `job` on this agent.
/// The job's, groups' and tasks' constraints that this node does not meet, each with
/// the attribute's actual value (`jobspec::constraint::unmet`, as the cluster's
/// scheduler asks it), seeing every driver this agent has (`attr.driver.<name>`).
fn constraint_problems(
    job: &Job,
    drivers: &DriverSet,
    facts: &BTreeMap<String, String>,
) -> Vec<Problem> {
    use berth_jobspec::constraint;
    let attributes = constraint::with_drivers(facts, drivers.iter().map(|d| d.name()));
    std::iter::once(None)
        .chain(job.groups.iter().map(Some))
        .flat_map(|group| constraint::unmet(job, group, &attributes))
        .map(|unmet| Problem {
            path: unmet.constraint.path.clone(),
            at: Some(unmet.constraint.at),
            message: unmet.why.to_string(),
        })
        .collect()
}

pub async fn validate(
    job: &Job,
    drivers: &DriverSet,
    hooks: &HookSet,
    config: &AgentConfig,
    catalog: Option<&dyn Catalog>,
    facts: &BTreeMap<String, String>,
) -> Vec<Problem> {
    validate_for(
        job,
        drivers,
        hooks,
        config,
        catalog,
        facts,
        Placing::ThisNode,
    )
    .await
}

/// Where a job is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placing {
    /// It runs here: this node's constraints and host volumes count.
    ThisNode,
    /// A cluster's scheduler picks the node: what this node has or lacks (its
    /// attributes, its host volumes) is the scheduler's to weigh, not a refusal.
    AnyNode,
}

/// [`validate`] for a job placed as `placing` says.
pub async fn validate_for(
    job: &Job,
    drivers: &DriverSet,
    hooks: &HookSet,
    config: &AgentConfig,
    catalog: Option<&dyn Catalog>,
    facts: &BTreeMap<String, String>,
    placing: Placing,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let job_path = format!("job.{}", job.name);
    let this_node = placing == Placing::ThisNode;
    if this_node {
        problems.extend(constraint_problems(job, drivers, facts));
    }
    for group in &job.groups {
        let group_path = format!("{job_path}.group.{}", group.name);
        for volume in &group.volumes {
            let path = format!("{group_path}.volume.{}", volume.name);
            match volume.volume_type {
                VolumeType::Host if this_node && config.host_volume(&volume.source).is_none() => {
                    let configured: Vec<&str> = config
                        .host_volumes
                        .iter()
                        .map(|v| v.name.as_str())
                        .collect();
                    problems.push(Problem {
                        path,
                        at: Some(volume.at),
                        message: format!(
                            "host volume {:?} is not configured on this agent ({})",
                            volume.source,
                            if configured.is_empty() {
                                "it has no host_volume blocks".to_string()
                            } else {
                                format!("configured: {}", configured.join(", "))
                            }
                        ),
                    });
                }
                VolumeType::Host => {}
                VolumeType::Csi => {
                    for message in csi_volume_problems(volume, catalog) {
                        problems.push(Problem {
                            path: path.clone(),
                            at: Some(volume.at),
                            message,
                        });
                    }
                }
            }
        }
        for task in &group.tasks {
            for template in &task.templates {
                let path = format!("{group_path}.task.{}.template", task.name);
                for message in template_problems(template, config) {
                    problems.push(Problem {
                        path: path.clone(),
                        at: Some(template.at),
                        message: format!("{}: {message}", template.destination),
                    });
                }
            }
        }
        if config.consul.is_none() {
            let consul_services = group
                .services
                .iter()
                .map(|s| (None, s))
                .chain(
                    group
                        .tasks
                        .iter()
                        .flat_map(|t| t.services.iter().map(move |s| (Some(&t.name), s))),
                )
                .filter(|(_, s)| s.provider == ServiceProvider::Consul);
            for (task, service) in consul_services {
                let (path, whose) = match task {
                    Some(task) => (
                        format!("{group_path}.task.{task}.service"),
                        format!("task {task:?}"),
                    ),
                    None => (
                        format!("{group_path}.service"),
                        format!("group {:?}", group.name),
                    ),
                };
                problems.push(Problem {
                    path,
                    at: Some(service.at),
                    message: format!(
                        "{whose}: service {:?} is registered in Consul, and this agent has no \
                         consul block: add consul {{ address = \"127.0.0.1:8500\" }} to the \
                         agent config, or set provider = \"nomad\" to keep the service in \
                         berth's own list",
                        service.name
                    ),
                });
            }
        }
        for task in &group.tasks {
            let task_path = format!("{group_path}.task.{}", task.name);
            if let Some(plugin) = &task.csi_plugin
                && let Some(jobs) = config.csi_plugin_reserved_for(&plugin.id)
                && !config.csi_plugin_allowed(&plugin.id, job)
            {
                problems.push(Problem {
                    path: format!("{task_path}.csi_plugin"),
                    at: Some(task.at),
                    message: format!(
                        "task {:?} provides CSI plugin {:?}, which this agent's operator \
                         reserved for job(s) {} submitted by the operator (csi {{ \
                         privileged_plugin {:?} }}): job {:?} may not provide it; use another \
                         plugin id",
                        task.name,
                        plugin.id,
                        jobs.iter()
                            .map(|j| format!("{j:?}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        plugin.id,
                        job.name
                    ),
                });
            }
            for name in &task.hooks {
                if let Some(message) = hooks.problem_with(name) {
                    problems.push(Problem {
                        path: format!("{task_path}.hooks"),
                        at: Some(task.hooks_at),
                        message: format!("task {:?}: {message}", task.name),
                    });
                }
            }
            check_task(job, task, &task_path, group, drivers, config, &mut problems).await;
            // Placed by a cluster's scheduler, a task too big for every node is accepted
            // and stays pending, its evaluation saying what was exhausted (as in Nomad).
            if this_node {
                problems.extend(more_memory_than_the_node(task, &task_path));
            }
        }
    }
    problems
}

/// A task that asks for more memory than this node has.
fn more_memory_than_the_node(task: &Task, task_path: &str) -> Option<Problem> {
    let asked = task
        .resources
        .memory_max_mb
        .unwrap_or(task.resources.memory_mb);
    let node = berth_sys::cgroup::node_memory()?;
    (u64::from(asked) * berth_model::limits::MIB > node).then(|| Problem {
        path: format!("{task_path}.resources.memory"),
        at: Some(task.at),
        message: format!(
            "task {:?} asks for {asked} MiB of memory; this node has {} MiB",
            task.name,
            node / berth_model::limits::MIB
        ),
    })
}

/// What this agent refuses of a template: a function its `template { function_denylist }`
/// denies, or one that reads Consul when it has no `consul` block.
fn template_problems(template: &berth_jobspec::Template, config: &AgentConfig) -> Vec<String> {
    let delimiters = berth_template::Delimiters {
        left: template.left_delimiter.clone(),
        right: template.right_delimiter.clone(),
    };
    // A template that does not parse is the jobspec's problem, said there.
    let Ok(parsed) = berth_template::Template::parse(&template.data, &delimiters) else {
        return Vec::new();
    };
    let mut problems: Vec<String> = config
        .template
        .refusal(parsed.functions())
        .into_iter()
        .collect();
    let reads = parsed
        .functions()
        .iter()
        .find(|f| crate::consul::TEMPLATE_READS.contains(f));
    if let (Some(function), None) = (reads, &config.consul) {
        problems.push(format!(
            "{function} reads Consul, and this agent has no consul block (nomadService reads \
             the services berth runs)"
        ));
    }
    problems
}

async fn check_task(
    job: &Job,
    task: &Task,
    task_path: &str,
    group: &berth_jobspec::Group,
    drivers: &DriverSet,
    config: &AgentConfig,
    problems: &mut Vec<Problem>,
) {
    let driver = drivers.get(&task.driver);
    match driver {
        None => {
            let known: Vec<&str> = drivers.iter().map(|d| d.name()).collect();
            problems.push(Problem {
                path: format!("{task_path}.driver"),
                at: Some(task.driver_at),
                message: format!(
                    "unknown driver {:?} (this agent has: {})",
                    task.driver,
                    known.join(", ")
                ),
            });
        }
        Some(_)
            if let Some(refusal) = disabled_driver_refusal(&task.name, &task.driver, config) =>
        {
            problems.push(Problem {
                path: format!("{task_path}.driver"),
                at: Some(task.driver_at),
                message: refusal,
            });
        }
        Some(driver) => {
            if let Some(refusal) = unconfined_refusal(&task.name, driver, config) {
                problems.push(Problem {
                    path: format!("{task_path}.driver"),
                    at: Some(task.driver_at),
                    message: refusal,
                });
            }
            if let Err(error) = driver.validate_task_config(&task.config.to_string()).await {
                // The driver's own refusal reads as the driver's sentence, without the
                // call's name (the problem's path already says `config`); a fault (a
                // crash, a deadline) keeps it, since it says where the driver failed.
                let error = match error {
                    berth_runtime::driver::DriverError::Refused {
                        driver, message, ..
                    } => format!("{driver}: {message}"),
                    fault => fault.to_string(),
                };
                // The driver wrote it: one line, or a line break forges the next problem.
                let error = berth_model::text::one_line(&error).into_owned();
                let (at, message) = task.place_config_error(&error);
                problems.push(Problem {
                    path: format!("{task_path}.config"),
                    at: Some(at),
                    message,
                });
            }
        }
    }
    // A change script runs inside the task, which the driver must allow.
    if let Some(driver) = driver.filter(|d| !d.capabilities().exec) {
        for template in &task.templates {
            if let berth_jobspec::ChangeMode::Script(script) = &template.change_mode {
                problems.push(Problem {
                    path: format!("{task_path}.template"),
                    at: Some(template.at),
                    message: format!(
                        "change_mode = \"script\" runs {:?} inside the running task, and task \
                         driver {:?} cannot run commands inside its tasks: use \"signal\", \
                         \"restart\" or \"noop\"",
                        script.command,
                        driver.name()
                    ),
                });
            }
        }
        // So does a script check, of the task's services or of a group service that
        // names the task.
        let group_checks = (group.services.iter())
            .flat_map(|s| s.checks.iter().map(move |c| (s, c)))
            .filter(|(_, c)| c.task.as_deref() == Some(task.name.as_str()));
        let task_checks = (task.services.iter()).flat_map(|s| s.checks.iter().map(move |c| (s, c)));
        for (service, check) in task_checks.chain(group_checks) {
            if let berth_jobspec::CheckKind::Script { command, .. } = &check.kind {
                problems.push(Problem {
                    path: format!("{task_path}.service.check"),
                    at: Some(service.at),
                    message: format!(
                        "script check {command:?} of service {:?} runs inside the task, and \
                         task driver {:?} cannot run commands inside its tasks",
                        service.name,
                        driver.name()
                    ),
                });
            }
        }
    }
    // Which user a task runs as depends on its driver (its isolation): for a driver this
    // agent does not have, "unknown driver" is the problem, and a refusal of its user
    // (placed at the task, so sorted before it) would only hide it.
    if let Some(driver) = driver
        && let Err(refusal) = task_user(
            job,
            task,
            driver.capabilities().fs_isolation,
            config,
            &berth_sys::process::users::lookup,
            DynamicIds::NotYet,
        )
    {
        problems.push(Problem {
            path: format!("{task_path}.user"),
            at: Some(task.at),
            message: refusal.to_string(),
        });
    }
    for mount in &task.volume_mounts {
        let path = format!("{task_path}.volume_mount");
        let Some(volume) = group.volumes.iter().find(|v| v.name == mount.volume) else {
            let declared: Vec<&str> = group.volumes.iter().map(|v| v.name.as_str()).collect();
            problems.push(Problem {
                path,
                at: Some(mount.at),
                message: format!(
                    "volume_mount refers to volume {:?}, which the group does not declare{}",
                    mount.volume,
                    if declared.is_empty() {
                        String::new()
                    } else {
                        format!(" (declared: {})", declared.join(", "))
                    }
                ),
            });
            continue;
        };
        if let Some(refusal) = driver.and_then(|d| mount_config_refusal(&task.name, d, mount)) {
            problems.push(Problem {
                path: path.clone(),
                at: Some(mount.at),
                message: refusal,
            });
        }
        let host_read_only = config
            .host_volume(&volume.source)
            .is_some_and(|v| v.read_only);
        if let Some(refusal) = bidirectional_refusal(&task.name, mount, volume, host_read_only) {
            problems.push(Problem {
                path: path.clone(),
                at: Some(mount.at),
                message: refusal,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task on an image runs as ids of its own or not at all: never as the agent's
    /// root for want of them (attack review: an alloc whose users were recorded before
    /// namespaces were on held none for it).
    #[test]
    fn an_image_task_runs_as_its_own_ids_or_is_refused() {
        let job = berth_jobspec_hcl::parse(
            "j.hcl",
            "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"docker\"\n      user = \"root\"\n      config {\n        image = \"busybox\"\n      }\n    }\n  }\n}\n",
        )
        .unwrap();
        let task = &job.groups[0].tasks[0];
        let config = AgentConfig::default();
        let lookup = berth_sys::process::users::lookup;
        let user = |ids| task_user(&job, task, FsIsolation::Image, &config, &lookup, ids);
        assert!(
            matches!(user(DynamicIds::NotYet), Ok(None)),
            "at submit: root is the image's, not refused"
        );
        let own = TaskUser {
            uid: 80_001,
            gid: 80_000,
        };
        assert_eq!(
            user(DynamicIds::Taken(Some(own))).unwrap().map(|(_, u)| u),
            Some(own)
        );
        let refused = user(DynamicIds::Taken(None)).unwrap_err().to_string();
        assert!(refused.contains("holds no user id for it"), "{refused}");
        // With the host's namespace, the job's user is the host's, and root is denied.
        let mut host = AgentConfig::default();
        host.image.private_user_namespaces = false;
        let denied = task_user(
            &job,
            task,
            FsIsolation::Image,
            &host,
            &lookup,
            DynamicIds::NotYet,
        );
        assert!(
            matches!(denied, Err(UserRefusal::Denied { .. })),
            "{denied:?}"
        );
    }
}
