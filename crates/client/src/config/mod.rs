//! The agent's configuration file (HCL), in Nomad's shape:
//!
//! ```hcl
//! data_dir   = "/var/lib/berth"
//! plugin_dir = "/etc/berth/plugins"
//!
//! host_volume "shared-data" {
//!   path      = "/srv/data"
//!   read_only = false
//!   allow_setuid = false    # true: tasks see it without nosuid,nodev (berth's own key)
//! }
//!
//! hook "policy" {
//!   path       = "/etc/berth/hooks/policy.wasm"
//!   config     = { deny_drivers = "raw_exec" }
//!   timeout    = "2s"
//!   memory_max = "32MiB"
//!   on_failure = "fail"     # or "ignore"
//!   all_tasks  = true       # otherwise tasks opt in with `hooks = ["policy"]`
//!   quota_bytes  = "4MiB"   # what one call may write into local/ (files it returns)
//!   quota_inodes = 64       # files plus the directories their paths create
//! }
//!
//! csi {
//!   rpc_timeout       = "10s"  # one CSI call
//!   operation_timeout = "30s"  # one operation with its retries
//!   plugin_wait       = "30s"  # how long an alloc waits for its volume's plugin
//!   privileged_plugin "hostpath" {     # plugin tasks that may mount (as root, with
//!     jobs = ["csi-hostpath"]          # CAP_SYS_ADMIN): the plugin id and the jobs
//!   }                                  # that may run it so
//! }
//!
//! max_component_size = "256MiB" # the largest driver or hook file compiled; a larger
//!                              # one is refused with its size before it is read
//! max_plugin_instances = 256   # WebAssembly instances at once: one per call in flight,
//!                              # and one per running task of a driver that waits in its
//!                              # own code (not exec, raw_exec or mock); an eighth are
//!                              # kept for checks (a submission's), never held by tasks
//!
//! max_kill_timeout = "30s"     # the longest a task's kill_timeout may make its stop
//!                              # wait before the task is killed (Nomad's client setting)
//!
//! ephemeral_disk_inodes_per_mb = 256  # files an alloc may hold per MB of its
//!                              # ephemeral_disk size (default: one per 4 KiB)
//!
//! cni_path = "/opt/cni/bin:/usr/lib/cni"  # CNI plugins, for groups in bridge mode
//! bridge_network_name   = "nomad"        # the bridge, as Nomad's client names it
//! bridge_network_subnet = "172.26.64.0/20"
//!
//! gc {
//!   interval   = "1m"   # how often finished allocs are collected (Nomad's gc_interval)
//!   max_allocs = 50     # finished allocs kept, newest first (Nomad's gc_max_allocs)
//! }
//!
//! cgroups {
//!   parent   = "berth"  # every task's cgroup is <parent>/<alloc id>.<task>
//!   pids_max = 4096     # processes and threads one task may have at once
//!   all_tasks_pids_max = 24576  # all tasks together (default: the host's pid_max
//!                               # less max(4096, pid_max / 4))
//!   job_pids_max = 12288  # all tasks and log collectors of one job together
//!                         # (default: half of all_tasks_pids_max)
//!   allow_missing_controllers = false  # true: run tasks unlimited where memory, cpu
//!                                      # or pids is missing (an event says so)
//!   favor_dynmods = false  # true: turn on the kernel's node-wide favordynmods, so a
//!                          # task joins its cgroup in ~0.3 ms instead of 5-17 ms
//! }
//!
//! plugin "mydriver" {
//!   path             = "/etc/berth/plugins/mydriver.wasm"  # the file these settings
//!                              # are for (or a sha256 pin): any file can report a name
//!   allow_unconfined = false   # true lets a driver that declared fs-isolation "none"
//!                              # spawn processes unconfined, as root on the host
//! }
//!
//! plugin "raw_exec" {
//!   config {
//!     enabled = true           # raw_exec is off unless the operator turns it on
//!   }
//! }
//!
//! plugin "mock" {
//!   config {
//!     enabled = true           # so is mock, the development driver
//!   }
//! }
//!
//! user {
//!   denylist        = ["root", "Administrator"]  # Nomad's defaults: users tasks of the
//!   checked_drivers = ["exec", "docker", "java", "qemu"]  # may not run as
//!   dynamic_range   = "80000-89999"  # an exec task naming no user gets a uid of its own
//! }                                  # from here; no host user or group may hold one
//!
//! name       = "web-1"         # the node's name (Nomad's; default: the hostname)
//! datacenter = "dc1"           # the node's datacenter (Nomad's default)
//!
//! cluster {                    # several agents sharing one etcd (default: embedded,
//!   store        = "etcd"      # a one-node cluster of this agent's own)
//!   endpoints    = ["http://127.0.0.1:2379"]
//!   prefix       = "/berth"    # one prefix is one berth cluster
//!   dial_timeout = "5s"        # connecting at start
//!   heartbeat_ttl = "10s"      # a node not heard from this long is down
//!   lost_claim_grace = "1m"    # a down node's CSI claims are released after this
//!   ca_file   = "/etc/berth/etcd-ca.pem"   # TLS: the CA that signed etcd's certificate
//!                              # (needed for, and only with, https:// endpoints)
//!   cert_file = "/etc/berth/etcd-client.pem"  # a client certificate for etcd's
//!   key_file  = "/etc/berth/etcd-client-key.pem"  # --client-cert-auth (both or neither)
//!   username      = "berth"    # etcd's auth: the user, and the file holding its
//!   password_file = "/etc/berth/etcd-password"  # password (owned by the agent's user,
//!                              # mode 0600; never an inline password)
//! }
//!
//! http {
//!   max_connections_per_client = 100   # of them from one address (Nomad's default;
//!                                      # all of loopback is one client)
//!   max_connections = 1024             # TCP connections at once, 64 of them kept for
//!                                      # token holders (the socket has 256 of
//!   header_timeout  = "10s"            # its own); a request's headers within this, and
//!   idle_timeout    = "60s"            # a connection idle between requests this long
//!   socket_group = "berth"             # the API socket becomes 0660 for this group
//!   address      = "127.0.0.1:4646"    # a TCP listener too (opt-in), which needs tokens:
//!   token_file   = "/var/lib/berth/api-token"  # created 0600 at first start (submit scope)
//!   token "ci-reader" {
//!     secret = "at least 16 characters"
//!     scope  = "read"                  # or "submit"; "alloc-exec" (submit, and
//!                                      # alloc exec into its own jobs' allocs); "plugin"
//!                                      # (all that, and jobs that run CSI plugins)
//!   }
//! }
//! ```

mod artifact;
mod cgroups;
mod cluster;
mod consul;
mod http;
mod image;
pub mod keyring;
mod network;
mod plugins;
mod template;
#[cfg(test)]
mod tests;
mod users;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use berth_hcl::fields::Fields;
use berth_hcl::{FileError, Location, Problem};
use berth_model::cluster::ClusterSettings;
use berth_model::csi::{CsiSettings, Timeouts};
use berth_model::hook::HookSpec;
use berth_model::limits::{CgroupSettings, ConnectionLimits};
use berth_model::pins::DriverPins;

use cgroups::cgroup_settings;
use cluster::cluster_settings;
use consul::consul_settings;
use http::http_config;
pub use image::ImageSettings;
use plugins::{hook_spec, plugin_config};
pub use template::TemplateSettings;
use template::template_settings;
pub use users::{DEFAULT_DYNAMIC_RANGE, MAX_DYNAMIC_ID, UserPolicy};

/// Nomad's default `max_kill_timeout`.
pub const DEFAULT_MAX_KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentConfig {
    pub data_dir: Option<PathBuf>,
    pub plugin_dir: Option<PathBuf>,
    pub host_volumes: Vec<HostVolume>,
    pub hooks: Vec<HookSpec>,
    pub csi: CsiSettings,
    pub cgroups: CgroupSettings,
    /// `plugin "NAME" { ... }` blocks, by driver name.
    pub plugins: Vec<PluginConfig>,
    pub http: HttpConfig,
    /// Refuse every driver or hook component that no `sha256` pins.
    pub require_pinned: bool,
    /// WebAssembly instances that may exist at once (`max_plugin_instances`): one per
    /// call in flight, and one per running task whose driver waits in its own code.
    /// `None`: the default.
    pub max_plugin_instances: Option<u32>,
    /// The largest driver or hook component read and compiled (`max_component_size`);
    /// `None`: [`berth_runtime::DEFAULT_MAX_COMPONENT_BYTES`].
    pub max_component_size: Option<u64>,
    /// Inodes (files, directories, links) an alloc may hold per MB of its
    /// `ephemeral_disk` size; `None`: [`berth_sys::disk::DEFAULT_INODES_PER_MB`].
    pub ephemeral_disk_inodes_per_mb: Option<u64>,
    /// The longest a task's `kill_timeout` may be (Nomad's `max_kill_timeout`); `None`:
    /// [`DEFAULT_MAX_KILL_TIMEOUT`].
    pub max_kill_timeout: Option<std::time::Duration>,
    pub gc: GcSettings,
    /// `reserved { cpu, memory, disk }`: what the node keeps for itself, out of what
    /// allocs are placed against (Nomad's client `reserved`).
    pub reserved: NodeResources,
    /// `reserved { reserved_ports = "22,80,8500-8600" }`: host ports no alloc gets, as a
    /// static port or a dynamic one, and none is forwarded from (the node's own
    /// services').
    pub reserved_ports: BTreeSet<u16>,
    /// The local Consul agent services are registered with; `None`: no `consul` block.
    pub consul: Option<ConsulSettings>,
    /// `template { function_denylist }`: what job authors' templates may not call.
    pub template: TemplateSettings,
    /// `artifact { ... }`: the limits on what a job's `artifact` may fetch.
    pub artifact: berth_artifact::Limits,
    /// `keyring { root_key_rotation_threshold }`: how long a signing key is the one used.
    pub keyring_rotation: std::time::Duration,
    /// `image { ... }`: where images may be pulled from, and the limits on their layers.
    pub image: ImageSettings,
    /// `user { denylist, checked_drivers }`: which users tasks may not run as.
    pub users: UserPolicy,
    /// The bridge network of groups in `network { mode = "bridge" }`.
    pub bridge: BridgeSettings,
    /// The node's `name`; `None`: the hostname.
    pub name: Option<String>,
    /// The node's `datacenter`; `None`: `dc1`.
    pub datacenter: Option<String>,
    /// `cluster { ... }`: the cluster store (embedded unless configured).
    pub cluster: ClusterSettings,
}

impl AgentConfig {
    /// How long a task's stop waits before it is killed: its `kill_timeout`, at most
    /// `max_kill_timeout`, so a job author cannot hold a stopping task (and what it
    /// holds of the node) for as long as they like.
    pub fn kill_timeout_of(&self, asked: std::time::Duration) -> std::time::Duration {
        asked.min(self.max_kill_timeout.unwrap_or(DEFAULT_MAX_KILL_TIMEOUT))
    }
}

/// The `consul` block, in Nomad's terms.
#[derive(Clone, PartialEq)]
pub struct ConsulSettings {
    /// `host:port` of the local Consul agent's HTTP API.
    pub address: String,
    pub token: Option<String>,
    /// A file holding the token, read when the agent starts.
    pub token_file: Option<PathBuf>,
    /// How often anti-entropy compares berth's registrations with Consul's.
    pub sync_interval: std::time::Duration,
    /// The address services are registered with when they name none.
    pub service_address: Option<String>,
    /// How long deriving a Connect sidecar's service identity token may take, retries
    /// included, before its task fails.
    pub service_identity_timeout: std::time::Duration,
    /// The Consul agent's gRPC address, for Envoy (`consul connect envoy -grpc-addr`).
    pub grpc_address: String,
    /// The `consul` program that writes Envoy's bootstrap (looked up in `PATH`).
    pub binary: String,
}

impl std::fmt::Debug for ConsulSettings {
    /// Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulSettings")
            .field("address", &self.address)
            .field("token_file", &self.token_file)
            .field("sync_interval", &self.sync_interval)
            .finish_non_exhaustive()
    }
}

impl ConsulSettings {
    /// The token: `token`, or the first line of `token_file`.
    pub fn token(&self) -> Result<Option<String>, ConsulTokenError> {
        if let Some(token) = &self.token {
            return Ok(Some(token.clone()));
        }
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConsulTokenError {
            path: path.clone(),
            source,
        })?;
        Ok(Some(
            text.lines().next().unwrap_or_default().trim().to_string(),
        ))
    }
}

/// `consul { token_file }` could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading consul.token_file {}: {source}", path.display())]
pub struct ConsulTokenError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

pub use berth_model::limits::NodeResources;
pub use network::BridgeSettings;

/// Garbage collection of finished allocs, in Nomad's client's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcSettings {
    pub interval: std::time::Duration,
    /// Finished allocs kept (their directories and records), newest first.
    pub max_allocs: usize,
    /// Above this share of the data dir's disk in use (percent), finished allocs are
    /// collected, oldest first, however few, until it is below.
    pub disk_usage_threshold: u8,
    /// The same for inodes.
    pub inode_usage_threshold: u8,
}

impl Default for GcSettings {
    /// Nomad's client defaults.
    fn default() -> Self {
        GcSettings {
            interval: std::time::Duration::from_secs(60),
            max_allocs: 50,
            disk_usage_threshold: 80,
            inode_usage_threshold: 70,
        }
    }
}

/// Who may reach the HTTP API, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// A TCP listener besides the Unix socket; it requires a token.
    pub address: Option<std::net::SocketAddr>,
    /// The group that may use the Unix socket (0660); by default only its owner (0600).
    pub socket_group: Option<String>,
    /// A file holding a submit-scope token; the agent creates it (0600) if missing.
    pub token_file: Option<PathBuf>,
    pub tokens: Vec<ApiToken>,
    /// The TCP listener's connection limits (`max_connections`, `header_timeout`,
    /// `idle_timeout`).
    pub tcp_limits: ConnectionLimits,
    /// The Unix socket's own, so its owner is answered whatever holds the TCP listener.
    pub socket_limits: ConnectionLimits,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            address: None,
            socket_group: None,
            token_file: None,
            tokens: Vec::new(),
            tcp_limits: ConnectionLimits::TCP,
            socket_limits: ConnectionLimits::SOCKET,
        }
    }
}

/// A bearer token the TCP listener accepts.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    pub name: String,
    pub secret: String,
    pub scope: TokenScope,
}

impl std::fmt::Debug for ApiToken {
    /// Never the secret, even in a debug dump.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiToken")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// What a token allows: `read` (the routes that only read, GET; `berth-api`'s route
/// table gives each route's scope), `submit` (everything but `alloc exec` and plugin
/// jobs), `alloc-exec` (submit, and commands run inside the allocs of the jobs it owns)
/// or `plugin` (everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenScope {
    Read,
    Submit,
    /// Submit, and `alloc exec` into the allocs of its own jobs (Nomad's `alloc-exec`
    /// capability).
    AllocExec,
    /// Submit, and jobs that run CSI plugins (Nomad's `csi-register-plugin`
    /// capability): a plugin task sees every volume it serves, and one the operator grants
    /// mounting mounts on the node.
    Plugin,
}

/// The shortest token secret accepted: guessing one must be hopeless.
pub const MIN_TOKEN_SECRET: usize = 16;

/// The built-in drivers that are off unless the operator enables them: `raw_exec` runs
/// tasks unconfined, as the agent's user; `mock` is for development (its tasks only
/// pretend to run, for as long as a job author asks).
pub const OFF_BY_DEFAULT: &[&str] = &["raw_exec", "mock"];

/// What the operator says about one driver plugin, as Nomad's `plugin` block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginConfig {
    pub name: String,
    /// `config { enabled = ... }`: drivers that are off by default (raw_exec, mock) need it.
    pub enabled: Option<bool>,
    /// The driver component's SHA-256, as approved by the operator.
    pub sha256: Option<String>,
    /// The operator lets this driver spawn processes without isolation (as root, in the
    /// host's namespaces) when it declared fs-isolation `none`. Bound to the file: the
    /// block must name it (`path`, or `sha256`), since any file can report any name.
    pub allow_unconfined: bool,
    /// The driver file these settings are for (a plugin dir file's path).
    pub path: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostVolume {
    pub name: String,
    pub path: PathBuf,
    pub read_only: bool,
    /// Tasks see the volume without `nosuid,nodev` (berth's own key: Nomad has no such
    /// setting). Off by default: a setuid file a task plants there would otherwise run as
    /// its owner for the next task that mounts the volume.
    pub allow_setuid: bool,
}

impl AgentConfig {
    pub fn host_volume(&self, name: &str) -> Option<&HostVolume> {
        self.host_volumes.iter().find(|v| v.name == name)
    }

    pub fn plugin(&self, name: &str) -> Option<&PluginConfig> {
        self.plugins.iter().find(|p| p.name == name)
    }

    /// The digests drivers are pinned to, by name.
    pub fn driver_pins(&self) -> DriverPins {
        DriverPins {
            require_pinned: self.require_pinned,
            by_name: self
                .plugins
                .iter()
                .filter_map(|p| Some((p.name.clone(), p.sha256.clone()?)))
                .collect(),
        }
    }

    /// Whether the operator lets the tasks of CSI plugin `id` in job `job` mount
    /// (`csi { privileged_plugin "id" { jobs = ["job"] } }`).
    /// The jobs the operator granted plugin `id` to, when it did: only they may provide
    /// that id on this agent (node part or controller), since a part of another job
    /// would be sent the id's calls, volume secrets included.
    pub fn csi_plugin_reserved_for(&self, id: &str) -> Option<Vec<&str>> {
        let jobs: Vec<&str> = self
            .csi
            .privileged_plugins
            .iter()
            .filter(|grant| grant.id == id)
            .flat_map(|grant| grant.jobs.iter().map(String::as_str))
            .collect();
        (!jobs.is_empty()).then_some(jobs)
    }

    pub fn csi_privileged(&self, id: &str, job: &berth_jobspec::Job) -> bool {
        job.submitted_by_operator
            && self
                .csi
                .privileged_plugins
                .iter()
                .any(|grant| grant.id == id && grant.jobs.contains(&job.name))
    }

    /// Whether `job` may provide plugin `id` here: any job when the operator granted
    /// the id to none; else only a job it names, submitted by the operator.
    pub fn csi_plugin_allowed(&self, id: &str, job: &berth_jobspec::Job) -> bool {
        self.csi_plugin_reserved_for(id).is_none() || self.csi_privileged(id, job)
    }

    /// Whether the operator turned `raw_exec` on. It runs tasks unconfined, as the agent's
    /// user (root), so it is off unless the agent config says `enabled = true` (as Nomad).
    pub fn raw_exec_enabled(&self) -> bool {
        self.driver_enabled("raw_exec")
    }

    /// Whether tasks may use driver `name` here: the drivers of [`OFF_BY_DEFAULT`] only
    /// once the operator enabled them (`plugin "NAME" { config { enabled = true } }`),
    /// every other driver always.
    pub fn driver_enabled(&self, name: &str) -> bool {
        !OFF_BY_DEFAULT.contains(&name) || self.plugin(name).and_then(|p| p.enabled) == Some(true)
    }

    /// Whether driver `name`, loaded from `file` (`None`: built in), may spawn processes
    /// unconfined: `raw_exec` once enabled, any other driver only with `allow_unconfined
    /// = true` in a plugin block that names that file (its `path`; a `sha256` pin is held
    /// at load, where a file of another digest reporting the name is refused).
    pub fn allows_unconfined(&self, name: &str, file: Option<&Path>) -> bool {
        if name == "raw_exec" && file.is_none() {
            return self.raw_exec_enabled();
        }
        self.plugin(name).is_some_and(|p| {
            p.allow_unconfined
                && match (&p.path, file) {
                    (Some(path), Some(file)) => path == file,
                    (Some(_), None) => false,
                    (None, _) => p.sha256.is_some(),
                }
        })
    }

    /// Parses an agent config; its errors are an HCL file's (`FileError`), as a jobspec's are.
    pub fn parse(file: &str, source: &str) -> Result<AgentConfig, FileError> {
        let fail = |problems| FileError {
            file: file.to_string(),
            problems,
        };
        let tree = berth_hcl::parse_tree(file, source, "config")?;
        let mut problems = Vec::new();
        let mut fields = Fields::new(
            &tree,
            "config".into(),
            Location::default(),
            &[
                "data_dir",
                "plugin_dir",
                "host_volume",
                "hook",
                "csi",
                "cgroups",
                "plugin",
                "http",
                "require_pinned",
                "max_plugin_instances",
                "max_component_size",
                "ephemeral_disk_inodes_per_mb",
                "max_kill_timeout",
                "gc",
                "reserved",
                "consul",
                "template",
                "artifact",
                "keyring",
                "image",
                "user",
                "name",
                "datacenter",
                "cluster",
                "cni_path",
                "cni_config_dir",
                "bridge_network_name",
                "bridge_network_subnet",
            ],
        );
        let bridge = network::bridge_settings(&mut fields, &mut problems);
        let data_dir = fields.string("data_dir", &mut problems).map(PathBuf::from);
        let plugin_dir = fields
            .string("plugin_dir", &mut problems)
            .map(PathBuf::from);
        let mut host_volumes = Vec::new();
        for (name, block) in fields.labeled_blocks("host_volume", &mut problems) {
            let mut volume = Fields::new(
                &block.body,
                format!("config.host_volume.{name}"),
                block.at,
                &["path", "read_only", "allow_setuid"],
            );
            let path = volume.required_string("path", &mut problems);
            let read_only = volume.bool("read_only", &mut problems).unwrap_or(false);
            let allow_setuid = volume.bool("allow_setuid", &mut problems).unwrap_or(false);
            if let Some(path) = path.as_ref().filter(|p| !Path::new(p).is_absolute()) {
                let at = volume.attr("path").map(|v| v.at).unwrap_or(block.at);
                volume.problem(
                    &mut problems,
                    "path",
                    at,
                    format!("{path:?} must be an absolute path"),
                );
            }
            volume.finish(&mut problems);
            if let Some(path) = path {
                host_volumes.push(HostVolume {
                    name,
                    path: PathBuf::from(path),
                    read_only,
                    allow_setuid,
                });
            }
        }
        let mut hooks = Vec::new();
        for (name, block) in fields.labeled_blocks("hook", &mut problems) {
            if let Some(hook) = hook_spec(name, block, &mut problems) {
                hooks.push(hook);
            }
        }
        let mut csi = CsiSettings::default();
        if let Some(block) = fields.single_block("csi", &mut problems) {
            let mut settings = Fields::new(
                &block.body,
                "config.csi".into(),
                block.at,
                &[
                    "rpc_timeout",
                    "operation_timeout",
                    "plugin_wait",
                    "privileged_plugins",
                    "privileged_plugin",
                ],
            );
            let Timeouts { call, total } = csi.timeouts;
            csi.timeouts = Timeouts {
                call: settings
                    .duration("rpc_timeout", &mut problems)
                    .unwrap_or(call),
                total: settings
                    .duration("operation_timeout", &mut problems)
                    .unwrap_or(total),
            };
            if let Some(wait) = settings.duration("plugin_wait", &mut problems) {
                csi.plugin_wait = wait;
            }
            if settings.attr("privileged_plugins").is_some() {
                let ids = settings.string_list("privileged_plugins", &mut problems);
                let example = ids.first().map_or("hostpath", String::as_str);
                settings.problem_with(
                    &mut problems,
                    "privileged_plugins",
                    format!(
                        "a grant by plugin id alone is refused: any job author can write a \
                         plugin id. Name the jobs that may run it too: privileged_plugin \
                         {example:?} {{ jobs = [\"<the plugin's job>\"] }}"
                    ),
                );
            }
            for (id, block) in settings.labeled_blocks("privileged_plugin", &mut problems) {
                let mut grant = Fields::new(
                    &block.body,
                    format!("config.csi.privileged_plugin.{id}"),
                    block.at,
                    &["jobs"],
                );
                let jobs = grant.string_list("jobs", &mut problems);
                if jobs.is_empty() {
                    grant.problem(
                        &mut problems,
                        "jobs",
                        block.at,
                        "name the jobs that may run this plugin with mounts (jobs = [\"...\"])"
                            .into(),
                    );
                }
                grant.finish(&mut problems);
                csi.privileged_plugins
                    .push(berth_model::csi::PluginGrant { id, jobs });
            }
            settings.finish(&mut problems);
        }
        let cgroups = match fields.single_block("cgroups", &mut problems) {
            Some(block) => cgroup_settings(block, &mut problems),
            None => CgroupSettings::default(),
        };
        let mut plugins = Vec::new();
        for (name, block) in fields.labeled_blocks("plugin", &mut problems) {
            plugins.push(plugin_config(name, block, &mut problems));
        }
        let require_pinned = fields
            .bool("require_pinned", &mut problems)
            .unwrap_or(false);
        let gc = match fields.single_block("gc", &mut problems) {
            Some(block) => {
                let mut settings = Fields::new(
                    &block.body,
                    "config.gc".into(),
                    block.at,
                    &[
                        "interval",
                        "max_allocs",
                        "disk_usage_threshold",
                        "inode_usage_threshold",
                    ],
                );
                let defaults = GcSettings::default();
                let gc = GcSettings {
                    interval: settings
                        .duration("interval", &mut problems)
                        .unwrap_or(defaults.interval)
                        .max(std::time::Duration::from_secs(1)),
                    max_allocs: settings
                        .number("max_allocs", 1_000_000, &mut problems)
                        .map_or(defaults.max_allocs, |n| n as usize),
                    disk_usage_threshold: settings
                        .number("disk_usage_threshold", 100, &mut problems)
                        .map_or(defaults.disk_usage_threshold, |n| n as u8),
                    inode_usage_threshold: settings
                        .number("inode_usage_threshold", 100, &mut problems)
                        .map_or(defaults.inode_usage_threshold, |n| n as u8),
                };
                settings.finish(&mut problems);
                gc
            }
            None => GcSettings::default(),
        };
        let mut reserved_ports = BTreeSet::new();
        let reserved = match fields.single_block("reserved", &mut problems) {
            Some(block) => {
                let mut settings = Fields::new(
                    &block.body,
                    "config.reserved".into(),
                    block.at,
                    &["cpu", "memory", "disk", "reserved_ports"],
                );
                if let Some(text) = settings.string("reserved_ports", &mut problems) {
                    match port_list(&text) {
                        Some(ports) => reserved_ports = ports,
                        None => settings.problem_with(
                            &mut problems,
                            "reserved_ports",
                            format!(
                                "reserved_ports {text:?} is not a list of ports and ranges \
                                 (\"22,80,8500-8600\")"
                            ),
                        ),
                    }
                }
                // Bounds far past any node: the start checks them against this one.
                let reserved = NodeResources {
                    cpu_mhz: settings.number("cpu", 1 << 40, &mut problems).unwrap_or(0),
                    memory_mb: settings
                        .number("memory", 1 << 40, &mut problems)
                        .unwrap_or(0),
                    disk_mb: settings.number("disk", 1 << 40, &mut problems).unwrap_or(0),
                };
                settings.finish(&mut problems);
                reserved
            }
            None => NodeResources::default(),
        };
        let max_plugin_instances = fields
            .number("max_plugin_instances", 65_536, &mut problems)
            .map(|n| n.max(16) as u32);
        let max_component_size = fields.size("max_component_size", &mut problems);
        let ephemeral_disk_inodes_per_mb = fields
            .number("ephemeral_disk_inodes_per_mb", 65_536, &mut problems)
            .map(|n| n.max(1));
        let max_kill_timeout = fields.duration("max_kill_timeout", &mut problems);
        let http = match fields.single_block("http", &mut problems) {
            Some(block) => http_config(block, &mut problems),
            None => HttpConfig::default(),
        };
        let consul = fields
            .single_block("consul", &mut problems)
            .map(|block| consul_settings(block, &mut problems));
        let template = fields
            .single_block("template", &mut problems)
            .map(|block| template_settings(block, &mut problems))
            .unwrap_or_default();
        let artifact = fields
            .single_block("artifact", &mut problems)
            .map(|block| artifact::artifact_limits(block, &mut problems))
            .unwrap_or_default();
        let keyring_rotation = fields
            .single_block("keyring", &mut problems)
            .map_or(keyring::DEFAULT_ROTATION, |b| {
                keyring::rotation(b, &mut problems)
            });
        let image = fields
            .single_block("image", &mut problems)
            .map_or_else(ImageSettings::default, |b| {
                image::settings(b, &mut problems)
            });
        let users = fields
            .single_block("user", &mut problems)
            .map_or_else(UserPolicy::default, |b| {
                users::user_policy(b, image.private_user_namespaces, &mut problems)
            });
        let name = fields.string("name", &mut problems);
        let datacenter = fields.string("datacenter", &mut problems);
        let cluster = match fields.single_block("cluster", &mut problems) {
            Some(block) => cluster_settings(block, &mut problems),
            None => ClusterSettings::default(),
        };
        fields.finish(&mut problems);
        if !problems.is_empty() {
            return Err(fail(problems));
        }
        Ok(AgentConfig {
            name,
            datacenter,
            cluster,
            data_dir,
            plugin_dir,
            host_volumes,
            hooks,
            csi,
            cgroups,
            plugins,
            http,
            require_pinned,
            max_plugin_instances,
            max_component_size,
            ephemeral_disk_inodes_per_mb,
            max_kill_timeout,
            gc,
            reserved,
            reserved_ports,
            consul,
            template,
            artifact,
            keyring_rotation,
            image,
            users,
            bridge,
        })
    }

    /// A warning when the file at `path` holds secrets inline (API tokens, the Consul
    /// token) and users other than its owner can read it.
    pub fn exposed_secrets_warning(&self, path: &Path) -> Option<String> {
        use std::os::unix::fs::PermissionsExt as _;
        let inline: Vec<&str> = [
            (!self.http.tokens.is_empty()).then_some("http token secrets"),
            self.consul
                .as_ref()
                .and_then(|c| c.token.as_ref())
                .map(|_| "the consul token"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (!inline.is_empty() && mode & 0o044 != 0).then(|| {
            format!(
                "{} holds {} and other users can read it (mode {mode:03o}): run `chmod 600 {}`, \
                 or keep secrets in a token_file",
                path.display(),
                inline.join(" and "),
                path.display()
            )
        })
    }

    pub fn parse_file(path: &Path) -> Result<AgentConfig, FileError> {
        let file = path.display().to_string();
        let source = std::fs::read_to_string(path).map_err(|e| FileError {
            file: file.clone(),
            problems: vec![Problem {
                path: "config".into(),
                at: None,
                message: format!("cannot read the file: {e}"),
            }],
        })?;
        Self::parse(&file, &source)
    }
}

/// Nomad's port list (`"22,80,8500-8600"`): ports and inclusive ranges, comma-separated.
fn port_list(text: &str) -> Option<BTreeSet<u16>> {
    let mut ports = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last): (u16, u16) = match part.split_once('-') {
            Some((first, last)) => (first.trim().parse().ok()?, last.trim().parse().ok()?),
            None => {
                let port = part.parse().ok()?;
                (port, port)
            }
        };
        if first == 0 || first > last {
            return None;
        }
        ports.extend(first..=last);
    }
    Some(ports)
}
