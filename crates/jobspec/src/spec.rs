//! The typed jobspec (`Job`, its groups and tasks): what the reader
//! (`berth-jobspec-hcl`'s `decode/`) builds and every user of a job reads. It depends on
//! no other file of the folder but `names` and `artifact`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use berth_hcl::{Location, Problem};
use berth_model::mount::Propagation;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub name: String,
    pub job_type: JobType,
    pub datacenters: Vec<String>,
    pub meta: Vec<(String, String)>,
    pub constraints: Vec<Constraint>,
    pub groups: Vec<Group>,
    /// A `periodic` block: the job places nothing when submitted; the agent launches a
    /// child job (`<job>/periodic-<unix time>`) on its schedule.
    pub periodic: Option<Periodic>,
    /// A `parameterized` block: the job places nothing when submitted; `berth job
    /// dispatch` launches a child job (`<job>/dispatch-<unix time>-<random>`).
    pub parameterized: Option<Parameterized>,
    /// The job this one was launched from (periodic or dispatch), for a child job. Not
    /// stored with the typed job: a child's record sets it (`ClusterJob::spec`), as it
    /// sets `payload` and `submitted_by_operator`.
    #[serde(skip)]
    pub parent: Option<String>,
    /// The payload a dispatched child was given, written to the tasks'
    /// `dispatch_payload` files.
    #[serde(skip)]
    pub payload: Option<Vec<u8>>,
    /// What the jobspec asks for that has no effect on one node (Nomad's scheduler
    /// blocks): the job runs, and the user is told.
    pub warnings: Vec<Problem>,
    /// Submitted by the operator (the Unix socket's owner, `berth run`), not with a
    /// token: only such a job gets what a `csi { privileged_plugin }` grant gives its
    /// name, since a token holder chooses a job's name too.
    #[serde(skip)]
    pub submitted_by_operator: bool,
}

impl Job {
    /// The child job `id` launched from this one (periodic or dispatch): this job under
    /// the child's id, with `meta` (a dispatch's) over the job's own and `payload`.
    pub fn into_child(
        mut self,
        id: &str,
        parent: &str,
        meta: &[(String, String)],
        payload: Option<Vec<u8>>,
    ) -> Job {
        self.name = id.to_string();
        // A child's name is not its parent's: no grant names it.
        self.submitted_by_operator = false;
        self.periodic = None;
        self.parameterized = None;
        self.parent = Some(parent.to_string());
        for (key, value) in meta {
            self.meta.retain(|(k, _)| k != key);
            self.meta.push((key.clone(), value.clone()));
        }
        self.payload = payload;
        self
    }
}

/// Nomad's `periodic` block. Times are UTC (Nomad's default `time_zone`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Periodic {
    /// Cron expressions as Nomad reads them (`jobspec/cron.rs`): 5 fields, 6 with a
    /// year last, 7 with a second first and a year last, or `@hourly`-style.
    pub crons: Vec<String>,
    /// Skip a launch while a child launched before is still running.
    pub prohibit_overlap: bool,
    pub enabled: bool,
}

impl Periodic {
    /// The first launch time after `after` (UTC) of any of the crons.
    pub fn next_after(
        &self,
        after: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        self.crons
            .iter()
            .filter_map(|text| text.parse::<super::cron::CronSpec>().ok())
            .filter_map(|cron| cron.next_after(after))
            .min()
    }
}

/// Nomad's `parameterized` block: what a dispatch must and may bring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parameterized {
    pub payload: PayloadRule,
    pub meta_required: Vec<String>,
    pub meta_optional: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadRule {
    Optional,
    Required,
    Forbidden,
}

/// The largest dispatch payload, as in Nomad (16 KiB).
pub const MAX_DISPATCH_PAYLOAD: usize = 16 * 1024;

/// A `constraint` block: where the job may run, checked against this node's attributes
/// at submit time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Constraint {
    /// `${attr.kernel.name}`, `${meta.rack}`, … (may be empty for `distinct_hosts`).
    pub attribute: String,
    pub operator: String,
    pub value: String,
    pub at: Location,
    /// `job.web.group.g.constraint`.
    pub path: String,
}

/// A `template` block: a file rendered into the task's directory before it starts, and
/// again when what it reads changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Template {
    /// The template text, in consul-template's language (`berth-template`).
    pub data: String,
    /// Relative to the task's directory (`local/app.conf`).
    pub destination: String,
    /// Read the rendered file as `KEY=value` lines into the task's env.
    pub env: bool,
    pub perms: u32,
    /// The action delimiters, `{{` and `}}` unless set.
    #[serde(default = "left_delimiter")]
    pub left_delimiter: String,
    #[serde(default = "right_delimiter")]
    pub right_delimiter: String,
    /// What happens to the running task when a re-render changes the file.
    #[serde(default)]
    pub change_mode: ChangeMode,
    /// A random wait of up to this before the change mode acts, so that the tasks that
    /// read one service do not all restart at once.
    #[serde(default = "default_splay")]
    pub splay: Duration,
    /// How long a change must stay before it is rendered (`min`), and how long changes
    /// may keep it waiting (`max`).
    #[serde(default)]
    pub wait: TemplateWait,
    /// The file's owner; `None`: the task's user.
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    /// A missing map key fails the render, naming the key (Go's `missingkey=error`).
    #[serde(default)]
    pub error_on_missing_key: bool,
    /// Rendered once, never again while the task runs.
    #[serde(default)]
    pub once: bool,
    pub at: Location,
}

fn left_delimiter() -> String {
    "{{".into()
}

fn right_delimiter() -> String {
    "}}".into()
}

fn default_splay() -> Duration {
    Duration::from_secs(5)
}

/// A template's `change_mode`, with what it needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeMode {
    /// The task is restarted (Nomad's default).
    #[default]
    Restart,
    /// The file changes; the task is told nothing.
    Noop,
    /// The task is sent this signal (`SIGHUP`).
    Signal(String),
    /// A command runs inside the task's confinement.
    Script(ChangeScript),
}

impl ChangeMode {
    /// The jobspec's word for it.
    pub fn as_str(&self) -> &'static str {
        match self {
            ChangeMode::Restart => "restart",
            ChangeMode::Noop => "noop",
            ChangeMode::Signal(_) => "signal",
            ChangeMode::Script(_) => "script",
        }
    }
}

/// A template's `change_script` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeScript {
    pub command: String,
    pub args: Vec<String>,
    pub timeout: Duration,
    /// A failing script fails the task (restarts it by its policy); otherwise it is
    /// an event.
    pub fail_on_error: bool,
}

/// A template's `wait` block: consul-template's quiescence timers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateWait {
    pub min: Duration,
    pub max: Duration,
}

impl Default for TemplateWait {
    fn default() -> Self {
        TemplateWait {
            min: Duration::from_secs(5),
            max: Duration::from_secs(240),
        }
    }
}

/// Nomad's scheduler types. `system` and `sysbatch` jobs run one alloc of each group
/// on every eligible node where it fits, instead of `count` allocs wherever they fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    Service,
    Batch,
    System,
    SysBatch,
}

impl Job {
    /// What the job launches instead of placing allocs itself: `periodic` or
    /// `parameterized` children (as `job status` says), or nothing.
    pub fn launches(&self) -> Option<&'static str> {
        if self.periodic.is_some() {
            Some("periodic")
        } else if self.parameterized.is_some() {
            Some("parameterized")
        } else {
            None
        }
    }
}

impl JobType {
    /// The jobspec's and Nomad API's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Service => "service",
            JobType::Batch => "batch",
            JobType::System => "system",
            JobType::SysBatch => "sysbatch",
        }
    }

    /// One alloc per group on each node (system, sysbatch), not `count` allocs placed
    /// where they fit best.
    pub fn per_node(self) -> bool {
        matches!(self, JobType::System | JobType::SysBatch)
    }

    /// A task that exits successfully is done and not restarted (batch, sysbatch);
    /// the other types run until stopped.
    pub fn runs_to_completion(self) -> bool {
        matches!(self, JobType::Batch | JobType::SysBatch)
    }
}

impl fmt::Display for JobType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub name: String,
    pub count: u32,
    pub volumes: Vec<VolumeRequest>,
    pub services: Vec<Service>,
    pub restart: RestartPolicy,
    pub meta: Vec<(String, String)>,
    pub constraints: Vec<Constraint>,
    pub tasks: Vec<Task>,
    /// The ports of its `network` block.
    pub ports: Vec<PortLabel>,
    /// Its `network` block's `mode`: the host's network, or a namespace of its own on
    /// the node's bridge.
    #[serde(default)]
    pub network_mode: NetworkMode,
    /// Its `network` block's `dns`: the group's own `/etc/resolv.conf` (`None`: the
    /// host's).
    #[serde(default)]
    pub dns: Option<DnsConfig>,
    /// Its `network` block's `hostname` (bridge mode): the name the group's `/etc/hosts`
    /// gives the alloc's address (`None`: the alloc id's first 8 characters).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Between deregistering the group's services and stopping its tasks.
    #[serde(with = "duration_ns")]
    pub shutdown_delay: Duration,
    /// `ephemeral_disk { size }` in MB (MiB): what the alloc's directory may hold, logs
    /// included (300 when the block is absent, as Nomad).
    pub ephemeral_disk_mb: u64,
    /// When a cluster places a failed alloc again: the job's and the group's `reschedule`
    /// blocks merged over Nomad's defaults for the job type.
    pub reschedule: ReschedulePolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeType {
    Host,
    Csi,
}

/// A group's `volume "alias" { ... }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeRequest {
    pub name: String,
    pub volume_type: VolumeType,
    pub source: String,
    pub read_only: bool,
    pub access_mode: Option<String>,
    pub attachment_mode: Option<String>,
    pub per_alloc: bool,
    pub at: Location,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub name: String,
    pub driver: String,
    /// The `config` block, as JSON for the driver.
    pub config: serde_json::Value,
    pub env: Vec<(String, String)>,
    pub meta: Vec<(String, String)>,
    pub resources: Resources,
    /// Between deregistering its services and its kill signal (`shutdown_delay`), so
    /// that clients stop sending it work first.
    #[serde(with = "duration_ns")]
    pub shutdown_delay: Duration,
    #[serde(with = "duration_ns")]
    pub kill_timeout: Duration,
    pub kill_signal: String,
    /// Run the task as this user (looked up on the host), as Nomad's `user`.
    pub user: Option<String>,
    pub volume_mounts: Vec<VolumeMount>,
    pub csi_plugin: Option<CsiPlugin>,
    pub services: Vec<Service>,
    pub lifecycle: Option<Lifecycle>,
    /// Operator-loaded WASM hooks this task opts into, by name, in order.
    pub hooks: Vec<String>,
    pub constraints: Vec<Constraint>,
    pub templates: Vec<Template>,
    /// Files fetched into the task's directory before it first starts (`artifact`).
    #[serde(default)]
    pub artifacts: Vec<crate::artifact::Artifact>,
    /// Signed JWTs for the task (`identity`), given in its env or its `secrets/`.
    #[serde(default)]
    pub identities: Vec<Identity>,
    /// The task is killed, and fails, once a run of it has lasted this long.
    #[serde(default)]
    pub max_run_duration: Option<Duration>,
    /// The task's own `restart` block, over the group's policy; `None`: the group's.
    pub restart: Option<RestartPolicy>,
    /// Where a dispatched job's payload is written, relative to the task's directory
    /// (`local/<dispatch_payload.file>`).
    pub dispatch_payload: Option<String>,
    /// How its stdout and stderr files rotate (`logs`).
    pub logs: berth_model::driver::LogRotation,
    /// Set on the sidecar proxy task berth adds for a Connect service: the service's
    /// name. It gets a service identity token and an Envoy bootstrap before it starts.
    pub connect_proxy_for: Option<String>,
    pub at: Location,
    pub driver_at: Location,
    pub hooks_at: Location,
    /// Where the `config` block and each of its keys are written, to place a driver's
    /// complaint about one of them.
    pub config_at: (Location, Vec<(String, Location)>),
}

impl Task {
    /// Where a driver's config error belongs: at the key it names (serde's
    /// "unknown field `comand`" or "missing field `command`"), else at the config block,
    /// with serde's position in the JSON the driver was given cut off (the user wrote HCL).
    pub fn place_config_error(&self, error: &str) -> (Location, String) {
        let message = match error.rfind(" at line ") {
            Some(at) if error[at..].contains(" column ") => error[..at].to_string(),
            _ => error.to_string(),
        };
        let named = message
            .split('`')
            .nth(1)
            .and_then(|key| self.config_at.1.iter().find(|(k, _)| k == key))
            .map(|(_, at)| *at);
        let block = if self.config_at.0.line > 0 {
            self.config_at.0
        } else {
            self.at
        };
        (named.unwrap_or(block), message)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// MHz; becomes the task's CPU shares.
    pub cpu: u32,
    /// MiB (Nomad's "MB"); the hard memory limit unless `memory_max` is set.
    pub memory_mb: u32,
    /// MiB: the hard limit, with `memory` then the soft one (Nomad's oversubscription).
    pub memory_max_mb: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeMount {
    pub volume: String,
    pub destination: String,
    pub read_only: bool,
    pub propagation: Propagation,
    pub at: Location,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CsiPluginType {
    Node,
    Controller,
    Monolith,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CsiPlugin {
    pub id: String,
    pub plugin_type: CsiPluginType,
    pub mount_dir: String,
    pub stage_publish_base_dir: String,
    #[serde(with = "duration_ns")]
    pub health_timeout: Duration,
}

/// A `service` block: the same parser serves groups and tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    /// A port label of the group's `network` block, or a number.
    pub port: Option<String>,
    pub tags: Vec<String>,
    pub enable_tag_override: bool,
    pub connect: Option<Connect>,
    pub provider: ServiceProvider,
    /// The address to register; by default the node's.
    pub address: Option<String>,
    pub meta: Vec<(String, String)>,
    pub checks: Vec<ServiceCheck>,
    /// Which address and port are registered.
    #[serde(default)]
    pub address_mode: AddressMode,
    pub at: Location,
}

/// Where a service is registered (`provider`): Consul, or Nomad's own catalog, which
/// on one berth node is the list `berth service list` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceProvider {
    Consul,
    Nomad,
}

/// A service's `check` block: an http or tcp one is run by Consul for a Consul service;
/// berth runs every check of a provider "nomad" service, and script checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceCheck {
    pub name: String,
    pub kind: CheckKind,
    #[serde(with = "duration_ns")]
    pub interval: Duration,
    #[serde(with = "duration_ns")]
    pub timeout: Duration,
    /// A port label or number; by default the service's.
    pub port: Option<String>,
    /// Which address and port the check reaches.
    #[serde(default)]
    pub address_mode: AddressMode,
    /// Restart the task after this many failures in a row (`check_restart`, the check's
    /// own or its service's).
    #[serde(default)]
    pub check_restart: Option<CheckRestart>,
    /// A group service's script check: the task it runs in.
    #[serde(default)]
    pub task: Option<String>,
}

/// An `identity` block: a JWT the agent signs for the task (Nomad's workload identity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// `default` (Nomad's `NOMAD_TOKEN`, `secrets/nomad_token`), or a name of its own
    /// (`NOMAD_TOKEN_<name>`, `secrets/nomad_<name>.jwt`).
    pub name: String,
    /// `aud`: `["nomad.io"]` for the default identity.
    pub audience: Vec<String>,
    /// In the task's environment.
    pub env: bool,
    /// In a file of its `secrets/`.
    pub file: bool,
    /// How long a token lasts; the agent signs a new one (and rewrites the file) before.
    pub ttl: Option<Duration>,
    /// What a renewed token does to the running task.
    pub change_mode: IdentityChange,
    pub at: Location,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdentityChange {
    Noop,
    Signal(String),
    Restart,
}

impl Identity {
    pub fn env_name(&self) -> String {
        if self.name == "default" {
            "NOMAD_TOKEN".into()
        } else {
            format!("NOMAD_TOKEN_{}", self.name)
        }
    }

    /// Relative to the task's directory.
    pub fn file_name(&self) -> String {
        if self.name == "default" {
            "secrets/nomad_token".into()
        } else {
            format!("secrets/nomad_{}.jwt", self.name)
        }
    }
}

/// `check_restart`: how many unhealthy results in a row restart the task (under its
/// restart policy), after a grace period from each start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckRestart {
    pub limit: u32,
    #[serde(with = "duration_ns")]
    pub grace: Duration,
    /// A warning (exit 1 of a script, 429 of an http check) does not count.
    pub ignore_warnings: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    Http {
        path: String,
        protocol: String,
        method: Option<String>,
    },
    Tcp,
    /// Run inside the task, in its confinement: exit 0 passes, 1 warns, anything else
    /// (or its timeout) fails.
    Script {
        command: String,
        args: Vec<String>,
    },
    /// The gRPC health protocol's Check of `service` ("": the server's own health):
    /// SERVING passes, anything else fails.
    Grpc {
        service: String,
        use_tls: bool,
    },
}

/// A port of the group's `network` block: its label, its number on the host when
/// static, and (bridge mode) the port inside the group's namespace it is forwarded to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortLabel {
    pub label: String,
    pub number: Option<u16>,
    /// `to`: inside the namespace; `None` is the host port's own number.
    #[serde(default)]
    pub to: Option<u16>,
}

impl PortLabel {
    /// The port the tasks listen on: `to` in bridge mode (the host's number without
    /// one), the host's number in host mode.
    pub fn inside(&self, mode: NetworkMode) -> Option<u16> {
        match mode {
            NetworkMode::Bridge => self.to.or(self.number),
            NetworkMode::Host => self.number,
        }
    }
}

/// A group's `network { dns { … } }`: what its tasks' `/etc/resolv.conf` says, each
/// value checked to be one token of its line (no line of its own can be slipped in).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsConfig {
    /// Name server addresses (IPv4 or IPv6).
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// Resolver options (`ndots:2`, `edns0`).
    pub options: Vec<String>,
}

impl DnsConfig {
    /// The `resolv.conf` it describes, as Nomad writes it: each list it leaves empty is
    /// the host's (`host`, the node's own `resolv.conf`). Only values that are one token
    /// of their line are written, whoever made the config (a record read back, say).
    pub fn resolv_conf(&self, host: &str) -> String {
        use crate::names::{is_name_server, is_resolver_option, is_search_domain};
        let from_host = |keys: &[&str]| -> Vec<String> {
            host.lines()
                .filter_map(|line| {
                    let mut words = line.split_whitespace();
                    keys.contains(&words.next()?).then_some(words)
                })
                .flatten()
                .map(str::to_string)
                .collect()
        };
        let pick = |own: &[String], keys: &[&str], valid: fn(&str) -> bool| -> Vec<String> {
            let list = if own.is_empty() {
                from_host(keys)
            } else {
                own.to_vec()
            };
            list.into_iter().filter(|v| valid(v)).collect()
        };
        let mut text = String::from("# written by berth from the group's network { dns } block\n");
        for server in pick(&self.servers, &["nameserver"], is_name_server) {
            text.push_str(&format!("nameserver {server}\n"));
        }
        let searches = pick(&self.searches, &["search", "domain"], is_search_domain);
        if !searches.is_empty() {
            text.push_str(&format!("search {}\n", searches.join(" ")));
        }
        let options = pick(&self.options, &["options"], is_resolver_option);
        if !options.is_empty() {
            text.push_str(&format!("options {}\n", options.join(" ")));
        }
        text
    }
}

/// A service's (or check's) `address_mode`: which address and port are registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressMode {
    /// Nomad's default: the host's, as `host` (berth's drivers have no network of
    /// their own for `auto` to pick).
    #[default]
    Auto,
    /// The node's address and the host port.
    Host,
    /// The alloc's address (its bridge address in bridge mode, the node's in host
    /// mode) and the port inside (`to`).
    Alloc,
}

/// A group's `network { mode }`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// The host's network: ports are the host's.
    #[default]
    Host,
    /// A namespace of the group's own on the node's bridge (Nomad's `bridge` network,
    /// through the CNI plugins), host ports forwarded to `to`.
    Bridge,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Connect {
    pub sidecar_service: Option<SidecarService>,
    /// The `sidecar_task` block, kept as given.
    pub sidecar_task: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SidecarService {
    pub port: Option<String>,
    pub upstreams: Vec<Upstream>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Upstream {
    pub destination_name: String,
    pub local_bind_port: u16,
}

/// When a task runs relative to the group's main tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    pub hook: LifecycleHook,
    /// Keeps running beside the main tasks instead of running to completion.
    pub sidecar: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleHook {
    Prestart,
    Poststart,
    Poststop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    Fail,
    Delay,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestartPolicy {
    pub attempts: u32,
    #[serde(with = "duration_ns")]
    pub interval: Duration,
    #[serde(with = "duration_ns")]
    pub delay: Duration,
    pub mode: RestartMode,
}

impl RestartPolicy {
    /// Nomad's defaults differ by job type: batch and sysbatch jobs retry more slowly.
    pub fn default_for(job_type: JobType) -> Self {
        match job_type {
            JobType::Service | JobType::System => RestartPolicy {
                attempts: 2,
                interval: Duration::from_secs(30 * 60),
                delay: Duration::from_secs(15),
                mode: RestartMode::Fail,
            },
            JobType::Batch | JobType::SysBatch => RestartPolicy {
                attempts: 3,
                interval: Duration::from_secs(24 * 3600),
                delay: Duration::from_secs(15),
                mode: RestartMode::Fail,
            },
        }
    }
}

/// Nomad's `reschedule` block, merged: how often and how soon a cluster places a failed
/// alloc again (a new alloc, on another node if one fits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReschedulePolicy {
    /// Attempts allowed within `interval` (unless `unlimited`).
    pub attempts: u32,
    #[serde(with = "duration_ns")]
    pub interval: Duration,
    /// The first attempt's delay after the failure.
    #[serde(with = "duration_ns")]
    pub delay: Duration,
    pub delay_function: DelayFunction,
    /// The ceiling of a growing delay (0: none).
    #[serde(with = "duration_ns")]
    pub max_delay: Duration,
    pub unlimited: bool,
}

/// How the delay grows from one reschedule attempt to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DelayFunction {
    Constant,
    Exponential,
    Fibonacci,
}

impl ReschedulePolicy {
    /// Nomad's defaults: a service is placed again without limit, after a delay that
    /// doubles from 30s up to an hour; a batch job once a day, after 5s.
    pub fn default_for(job_type: JobType) -> Self {
        match job_type {
            JobType::Service => ReschedulePolicy {
                attempts: 0,
                interval: Duration::ZERO,
                delay: Duration::from_secs(30),
                delay_function: DelayFunction::Exponential,
                max_delay: Duration::from_secs(3600),
                unlimited: true,
            },
            // System and sysbatch jobs run on every node and are not placed again
            // elsewhere (see `disabled`); their defaults are a batch job's, unused.
            JobType::Batch | JobType::System | JobType::SysBatch => ReschedulePolicy {
                attempts: 1,
                interval: Duration::from_secs(24 * 3600),
                delay: Duration::from_secs(5),
                delay_function: DelayFunction::Constant,
                max_delay: Duration::ZERO,
                unlimited: false,
            },
        }
    }

    /// No rescheduling (`attempts = 0`, `unlimited = false`; system and sysbatch jobs,
    /// which run on every node, have none either).
    pub fn disabled() -> Self {
        ReschedulePolicy {
            attempts: 0,
            unlimited: false,
            ..Self::default_for(JobType::Batch)
        }
    }

    pub fn enabled(&self) -> bool {
        self.unlimited || self.attempts > 0
    }
}

/// Every problem found in one jobspec file: the HCL layer's error, as every HCL file
/// berth reads has it.
pub type JobspecError = berth_hcl::FileError;

/// A duration in a stored job: nanoseconds (a jobspec's `"1.5ms"` comes back as it was).
mod duration_ns {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<std::time::Duration, D::Error> {
        let nanos = <u64 as serde::Deserialize>::deserialize(d)?;
        Ok(std::time::Duration::from_nanos(nanos))
    }
}
