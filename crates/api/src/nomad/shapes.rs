//! berth's own types as Nomad's API shapes (`berth_nomad_api`, Nomad's field names and
//! types). What berth has no value for is sent as Nomad's empty value (`""`, `0`, `{}`,
//! `[]` or `null`), never invented.

use std::collections::BTreeMap;

use berth_client::agent::{JobState, JobStatus};
use berth_client::alloc_runner::AllocStatus;
use berth_jobspec::{Constraint, Group, Job, JobType, Task};
use berth_model::events::{TaskState, TaskStateKind};
use berth_model::status::{ClientStatus, DesiredStatus};
use berth_nomad_api::{allocs, jobs};

pub use berth_nomad_api::{NAMESPACE, REGION};

const NS_PER_MS: u64 = 1_000_000;

fn ns(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Milliseconds since the epoch as nanoseconds, Nomad's unit of time.
pub(super) fn ms_as_ns(ms: u64) -> u64 {
    ms.saturating_mul(NS_PER_MS)
}

/// A count in Nomad's integer type.
pub(super) fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn pairs(pairs: &[(String, String)]) -> BTreeMap<String, String> {
    pairs.iter().cloned().collect()
}

pub(super) fn job_type(job_type: JobType) -> &'static str {
    job_type.as_str()
}

fn job_state(state: JobState) -> &'static str {
    match state {
        JobState::Pending => "pending",
        JobState::Running => "running",
        JobState::Dead => "dead",
    }
}

/// An alloc's client status in Nomad's word.
pub(super) fn client_status(status: ClientStatus) -> &'static str {
    match status {
        ClientStatus::Pending => "pending",
        ClientStatus::Running => "running",
        ClientStatus::Complete => "complete",
        ClientStatus::Failed => "failed",
        ClientStatus::Lost => "lost",
    }
}

fn desired_status(status: DesiredStatus) -> &'static str {
    match status {
        DesiredStatus::Run => "run",
        DesiredStatus::Stop => "stop",
    }
}

fn constraints(constraints: &[Constraint]) -> Vec<jobs::Constraint> {
    constraints
        .iter()
        .map(|c| jobs::Constraint {
            l_target: c.attribute.clone(),
            r_target: c.value.clone(),
            operand: c.operator.clone(),
        })
        .collect()
}

/// A job's indexes: its record's revision in the cluster store, the scale of the index
/// reads are served at.
fn indexes(status: &JobStatus) -> (u64, u64) {
    (status.version, status.version)
}

/// `GET /v1/jobs`: a job's stub.
pub fn job_stub(status: &JobStatus, job: &Job) -> jobs::JobListStub {
    let (create, modify) = indexes(status);
    jobs::JobListStub {
        id: status.id.clone(),
        parent_id: status.parent.clone().unwrap_or_default(),
        name: status.id.clone(),
        namespace: NAMESPACE.into(),
        datacenters: job.datacenters.clone(),
        job_type: job_type(status.job_type).into(),
        priority: 50,
        periodic: job.periodic.is_some(),
        parameterized_job: job.parameterized.is_some(),
        stop: status.stopped,
        status: job_state(status.status).into(),
        status_description: String::new(),
        job_summary: Some(job_summary(status, job, &[])),
        create_index: create,
        modify_index: modify,
        job_modify_index: modify,
        submit_time: ms_as_ns(status.submitted_ms),
    }
}

/// `GET /v1/job/:id/summary`: allocs per group and client status. `allocs` gives the
/// group of each alloc; without them (a stub) the counts come from the status alone.
pub fn job_summary(status: &JobStatus, job: &Job, allocs: &[AllocStatus]) -> jobs::JobSummary {
    let mut summary: BTreeMap<String, jobs::TaskGroupSummary> = job
        .groups
        .iter()
        .map(|g| (g.name.clone(), jobs::TaskGroupSummary::default()))
        .collect();
    for alloc in &status.allocs {
        let group = allocs
            .iter()
            .find(|a| a.id == alloc.id)
            .map(group_of)
            .or_else(|| (job.groups.len() == 1).then(|| job.groups[0].name.clone()));
        let Some(group) = group else { continue };
        let Some(counts) = summary.get_mut(group.as_str()) else {
            continue;
        };
        let count = match alloc.client_status {
            ClientStatus::Pending => &mut counts.starting,
            ClientStatus::Running => &mut counts.running,
            ClientStatus::Complete => &mut counts.complete,
            ClientStatus::Failed => &mut counts.failed,
            ClientStatus::Lost => &mut counts.lost,
        };
        *count += 1;
    }
    let (create, modify) = indexes(status);
    jobs::JobSummary {
        job_id: status.id.clone(),
        namespace: NAMESPACE.into(),
        summary,
        children: jobs::JobChildrenSummary::default(),
        create_index: create,
        modify_index: modify,
    }
}

/// `GET /v1/job/:id`, `POST /v1/jobs/parse`: the job in Nomad's job JSON. `status` is
/// `None` for a parsed job that is not registered.
pub fn job(job: &Job, status: Option<&JobStatus>) -> jobs::Job {
    let (create, modify) = status.map_or((0, 0), indexes);
    jobs::Job {
        region: REGION.into(),
        namespace: NAMESPACE.into(),
        id: job.name.clone(),
        parent_id: job.parent.clone().unwrap_or_default(),
        name: job.name.clone(),
        job_type: job_type(job.job_type).into(),
        priority: 50,
        all_at_once: false,
        datacenters: job.datacenters.clone(),
        node_pool: "default".into(),
        constraints: constraints(&job.constraints),
        task_groups: job.groups.iter().map(group).collect(),
        meta: pairs(&job.meta),
        periodic: job.periodic.as_ref().map(|p| jobs::PeriodicConfig {
            enabled: p.enabled,
            spec: p.crons.first().cloned().unwrap_or_default(),
            specs: p.crons.clone(),
            spec_type: "cron".into(),
            prohibit_overlap: p.prohibit_overlap,
            time_zone: "UTC".into(),
        }),
        parameterized_job: job
            .parameterized
            .as_ref()
            .map(|p| jobs::ParameterizedJobConfig {
                payload: payload_rule(p.payload).into(),
                meta_required: p.meta_required.clone(),
                meta_optional: p.meta_optional.clone(),
            }),
        stop: status.is_some_and(|s| s.stopped),
        status: status.map_or("pending", |s| job_state(s.status)).into(),
        status_description: String::new(),
        stable: false,
        version: 0,
        submit_time: status.map_or(0, |s| ms_as_ns(s.submitted_ms)),
        create_index: create,
        modify_index: modify,
        job_modify_index: modify,
    }
}

fn payload_rule(rule: berth_jobspec::PayloadRule) -> &'static str {
    match rule {
        berth_jobspec::PayloadRule::Optional => "optional",
        berth_jobspec::PayloadRule::Required => "required",
        berth_jobspec::PayloadRule::Forbidden => "forbidden",
    }
}

fn group(group: &Group) -> jobs::TaskGroup {
    let volumes = group
        .volumes
        .iter()
        .map(|v| {
            let volume = jobs::VolumeRequest {
                name: v.name.clone(),
                volume_type: match v.volume_type {
                    berth_jobspec::VolumeType::Host => "host",
                    berth_jobspec::VolumeType::Csi => "csi",
                }
                .into(),
                source: v.source.clone(),
                read_only: v.read_only,
                access_mode: v.access_mode.clone().unwrap_or_default(),
                attachment_mode: v.attachment_mode.clone().unwrap_or_default(),
                per_alloc: v.per_alloc,
            };
            (v.name.clone(), volume)
        })
        .collect();
    jobs::TaskGroup {
        name: group.name.clone(),
        count: group.count,
        constraints: constraints(&group.constraints),
        restart_policy: jobs::RestartPolicy {
            attempts: group.restart.attempts,
            interval: ns(group.restart.interval),
            delay: ns(group.restart.delay),
            mode: match group.restart.mode {
                berth_jobspec::RestartMode::Fail => "fail",
                berth_jobspec::RestartMode::Delay => "delay",
            }
            .into(),
        },
        tasks: group.tasks.iter().map(task).collect(),
        ephemeral_disk: jobs::EphemeralDisk {
            size_mb: group.ephemeral_disk_mb,
            sticky: false,
            migrate: false,
        },
        meta: pairs(&group.meta),
        volumes,
        shutdown_delay: ns(group.shutdown_delay),
        networks: network(group).into_iter().collect(),
    }
}

/// The group's `network` block, when it has one to show: a mode other than the host's,
/// ports, a resolver or a host name.
fn network(group: &Group) -> Option<jobs::NetworkResource> {
    let bridge = group.network_mode == berth_jobspec::NetworkMode::Bridge;
    if !bridge && group.ports.is_empty() && group.dns.is_none() && group.hostname.is_none() {
        return None;
    }
    let port = |p: &berth_jobspec::PortLabel| jobs::Port {
        label: p.label.clone(),
        value: p.number.unwrap_or(0),
        to: p.to.map_or(0, i32::from),
        host_network: String::new(),
    };
    Some(jobs::NetworkResource {
        mode: if bridge { "bridge" } else { "host" }.into(),
        hostname: group.hostname.clone().unwrap_or_default(),
        dns: group.dns.as_ref().map(|dns| jobs::DnsConfig {
            servers: dns.servers.clone(),
            searches: dns.searches.clone(),
            options: dns.options.clone(),
        }),
        reserved_ports: group
            .ports
            .iter()
            .filter(|p| p.number.is_some())
            .map(port)
            .collect(),
        dynamic_ports: group
            .ports
            .iter()
            .filter(|p| p.number.is_none())
            .map(port)
            .collect(),
    })
}

fn task(task: &Task) -> jobs::Task {
    jobs::Task {
        name: task.name.clone(),
        driver: task.driver.clone(),
        user: task.user.clone().unwrap_or_default(),
        config: task
            .config
            .as_object()
            .map(|config| config.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default(),
        env: pairs(&task.env),
        meta: pairs(&task.meta),
        resources: jobs::Resources {
            cpu: task.resources.cpu.into(),
            memory_mb: task.resources.memory_mb.into(),
            memory_max_mb: task.resources.memory_max_mb.unwrap_or(0).into(),
        },
        constraints: constraints(&task.constraints),
        kill_timeout: ns(task.kill_timeout),
        kill_signal: task.kill_signal.clone(),
        shutdown_delay: ns(task.shutdown_delay),
        lifecycle: task.lifecycle.map(|l| jobs::TaskLifecycle {
            hook: match l.hook {
                berth_jobspec::LifecycleHook::Prestart => "prestart",
                berth_jobspec::LifecycleHook::Poststart => "poststart",
                berth_jobspec::LifecycleHook::Poststop => "poststop",
            }
            .into(),
            sidecar: l.sidecar,
        }),
        volume_mounts: task
            .volume_mounts
            .iter()
            .map(|m| jobs::VolumeMount {
                volume: m.volume.clone(),
                destination: m.destination.clone(),
                read_only: m.read_only,
                propagation_mode: match m.propagation {
                    berth_model::mount::Propagation::Private => "private",
                    berth_model::mount::Propagation::HostToTask => "host-to-task",
                    berth_model::mount::Propagation::Bidirectional => "bidirectional",
                }
                .into(),
            })
            .collect(),
        templates: task
            .templates
            .iter()
            .map(|t| jobs::Template {
                embedded_tmpl: t.data.clone(),
                dest_path: t.destination.clone(),
                envvars: t.env,
                perms: format!("{:o}", t.perms),
                change_mode: t.change_mode.as_str().into(),
                change_signal: match &t.change_mode {
                    berth_jobspec::ChangeMode::Signal(signal) => signal.clone(),
                    _ => String::new(),
                },
                change_script: match &t.change_mode {
                    berth_jobspec::ChangeMode::Script(script) => Some(jobs::ChangeScript {
                        command: script.command.clone(),
                        args: script.args.clone(),
                        timeout: ns(script.timeout),
                        fail_on_error: script.fail_on_error,
                    }),
                    _ => None,
                },
                splay: ns(t.splay),
                wait: Some(jobs::WaitConfig {
                    min: ns(t.wait.min),
                    max: ns(t.wait.max),
                }),
                uid: Some(t.uid.map_or(-1, i64::from)),
                gid: Some(t.gid.map_or(-1, i64::from)),
                left_delim: t.left_delimiter.clone(),
                right_delim: t.right_delimiter.clone(),
                err_missing_key: t.error_on_missing_key,
                once: t.once,
            })
            .collect(),
        artifacts: task
            .artifacts
            .iter()
            .map(|a| jobs::TaskArtifact {
                getter_source: a.source.clone(),
                getter_options: a.options.iter().cloned().collect(),
                getter_headers: a.headers.iter().cloned().collect(),
                getter_mode: a.mode.clone(),
                relative_dest: a.destination.clone(),
                chown: a.chown,
            })
            .collect(),
        max_run_duration: task.max_run_duration.map_or(0, ns),
        dispatch_payload: task
            .dispatch_payload
            .as_ref()
            .map(|file| jobs::DispatchPayloadConfig { file: file.clone() }),
        // berth accepts `leader` with a warning and makes no task the leader.
        leader: false,
        log_config: jobs::LogConfig {
            // A task's logs are always collected.
            disabled: false,
            max_files: task.logs.max_files,
            max_file_size_mb: task.logs.max_file_size / berth_model::limits::MIB,
        },
    }
}

/// The group of an alloc, from its name (`<job>.<group>[<index>]`).
pub fn group_of(alloc: &AllocStatus) -> String {
    let rest = alloc
        .name
        .strip_prefix(&alloc.job_id)
        .and_then(|r| r.strip_prefix('.'))
        .unwrap_or(&alloc.name);
    rest.rsplit_once('[')
        .map_or(rest, |(group, _)| group)
        .to_string()
}

/// A task's state in Nomad's shape.
pub(super) fn task_state(state: &TaskState) -> allocs::TaskState {
    use berth_model::events::EventKind;
    let started = state
        .events
        .iter()
        .find(|e| e.kind == EventKind::Started)
        .map(|e| e.time_ms);
    let finished = (state.state == TaskStateKind::Dead)
        .then(|| state.events.last().map(|e| e.time_ms))
        .flatten();
    let last_restart = state
        .events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::Restarting)
        .map(|e| e.time_ms);
    allocs::TaskState {
        state: match state.state {
            TaskStateKind::Pending => "pending",
            TaskStateKind::Running => "running",
            TaskStateKind::Dead => "dead",
        }
        .into(),
        failed: state.failed,
        restarts: state.restarts.into(),
        last_restart: last_restart.map(rfc3339),
        started_at: started.map(rfc3339),
        finished_at: finished.map(rfc3339),
        events: state
            .events
            .iter()
            .map(|e| allocs::TaskEvent {
                kind: e.kind.to_string(),
                time: ms_as_ns(e.time_ms),
                message: String::new(),
                display_message: e.message.clone(),
                details: BTreeMap::new(),
                fails_task: state.failed
                    && matches!(e.kind, EventKind::SetupFailure | EventKind::NotRestarting),
                exit_code: if e.kind == EventKind::Terminated {
                    state.exit_code.unwrap_or(0).into()
                } else {
                    0
                },
            })
            .collect(),
    }
}

/// Milliseconds since the epoch as RFC 3339 (what Go's `time.Time` marshals to).
fn rfc3339(ms: u64) -> String {
    let time = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(
        i64::try_from(ms).unwrap_or(i64::MAX),
    )
    .unwrap_or_default();
    time.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// The node this agent is, as `GET /v1/nodes` and allocs name it.
#[derive(Debug, Clone)]
pub struct ThisNode {
    pub id: String,
    pub name: String,
    pub datacenter: String,
}

impl ThisNode {
    /// The node `agent` is.
    pub fn of(agent: &berth_client::agent::Agent) -> ThisNode {
        let facts = agent.facts();
        let fact = |key: &str| facts.get(key).cloned().unwrap_or_default();
        ThisNode {
            id: agent.cluster().node_id().to_string(),
            name: agent.cluster().node_name().to_string(),
            datacenter: fact("node.datacenter"),
        }
    }
}

/// `GET /v1/allocations`, `GET /v1/job/:id/allocations`: an alloc's stub, from this
/// node's runner.
pub fn alloc_stub(
    alloc: &AllocStatus,
    job_type_of: JobType,
    node: &ThisNode,
) -> allocs::AllocationListStub {
    let times: Vec<u64> = alloc
        .tasks
        .values()
        .flat_map(|t| t.events.iter().map(|e| e.time_ms))
        .collect();
    let created = times.iter().min().copied().unwrap_or(0);
    let modified = times.iter().max().copied().unwrap_or(0);
    allocs::AllocationListStub {
        id: alloc.id.clone(),
        name: alloc.name.clone(),
        namespace: NAMESPACE.into(),
        node_id: node.id.clone(),
        node_name: node.name.clone(),
        job_id: alloc.job_id.clone(),
        job_type: job_type(job_type_of).into(),
        task_group: group_of(alloc),
        desired_status: desired_status(alloc.desired_status).into(),
        client_status: client_status(alloc.client_status).into(),
        task_states: alloc
            .tasks
            .iter()
            .map(|(name, state)| (name.clone(), task_state(state)))
            .collect(),
        create_index: created,
        modify_index: modified,
        alloc_modify_index: modified,
        create_time: ms_as_ns(created),
        modify_time: ms_as_ns(modified),
        ..Default::default()
    }
}

/// `GET /v1/allocation/:id`: the stub's fields and the job.
pub fn allocation(
    alloc: &AllocStatus,
    job_spec: &Job,
    status: &JobStatus,
    node: &ThisNode,
) -> allocs::Allocation {
    allocs::Allocation {
        stub: alloc_stub(alloc, job_spec.job_type, node),
        job: Some(job(job_spec, Some(status))),
    }
}
