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
//!   checked_drivers = ["exec", "java", "qemu"]   # checked drivers may not run as
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
//!     scope  = "read"                  # or "submit", or "plugin" (submit, and jobs
//!                                      # that run CSI plugins)
//!   }
//! }
//! ```

use std::path::{Path, PathBuf};

use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_hcl::{FileError, Location, Problem};
use berth_model::cluster::{ClientCert, ClusterSettings, EtcdAuth, EtcdTls, StoreKind};
use berth_model::csi::{CsiSettings, Timeouts};
use berth_model::hook::{HookSpec, OnFailure, WriteQuota};
use berth_model::limits::{CgroupSettings, ConnectionLimits};
use berth_model::pins::{DriverPins, parse_sha256};

use crate::jobspec::names::{NameKind, check_name};

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
    /// Inodes (files, directories, links) an alloc may hold per MB of its
    /// `ephemeral_disk` size; `None`: [`crate::disk::DEFAULT_INODES_PER_MB`].
    pub ephemeral_disk_inodes_per_mb: Option<u64>,
    /// The longest a task's `kill_timeout` may be (Nomad's `max_kill_timeout`); `None`:
    /// [`DEFAULT_MAX_KILL_TIMEOUT`].
    pub max_kill_timeout: Option<std::time::Duration>,
    pub gc: GcSettings,
    /// `reserved { cpu, memory, disk }`: what the node keeps for itself, out of what
    /// allocs are placed against (Nomad's client `reserved`).
    pub reserved: NodeResources,
    /// The local Consul agent services are registered with; `None`: no `consul` block.
    pub consul: Option<ConsulSettings>,
    /// `user { denylist, checked_drivers }`: which users tasks may not run as.
    pub users: UserPolicy,
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

/// Nomad's `user.denylist` and `user.checked_drivers` (client config): a task of a
/// checked driver may not run as a denied user. The defaults are Nomad's, so `exec`
/// tasks are refused `root` unless the operator says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserPolicy {
    pub denylist: Vec<String>,
    pub checked_drivers: Vec<String>,
    /// `dynamic_range`: the uids and gids of `exec` tasks whose job names no user (one
    /// per task, one per alloc for `/alloc`); no host user or group may hold one.
    pub dynamic_range: std::ops::RangeInclusive<u32>,
}

/// `user { dynamic_range }` when the operator sets none (Nomad's default).
pub const DEFAULT_DYNAMIC_RANGE: std::ops::RangeInclusive<u32> = 80_000..=89_999;

/// Parses `"80000-89999"`; refuses 0 (root), reversed and half ranges.
fn dynamic_range(text: &str) -> Option<std::ops::RangeInclusive<u32>> {
    let (first, last) = text.split_once('-')?;
    let first: u32 = first.trim().parse().ok()?;
    let last: u32 = last.trim().parse().ok()?;
    (first != 0 && first <= last && last <= MAX_DYNAMIC_ID).then_some(first..=last)
}

/// The highest id a dynamic range may hold: uid_t is 32 bits, but `-1` (4294967295)
/// means "unchanged" to setuid(2) and chown(2), and many programs treat ids past
/// 2^31 - 1 as negative.
pub const MAX_DYNAMIC_ID: u32 = i32::MAX as u32;

impl Default for UserPolicy {
    fn default() -> Self {
        UserPolicy {
            denylist: vec!["root".into(), "Administrator".into()],
            checked_drivers: vec!["exec".into(), "java".into(), "qemu".into()],
            dynamic_range: DEFAULT_DYNAMIC_RANGE,
        }
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

/// What a token allows: `read` (GET only), `submit` (everything but plugin jobs) or
/// `plugin` (everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenScope {
    Read,
    Submit,
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

    pub fn csi_privileged(&self, id: &str, job: &crate::jobspec::Job) -> bool {
        job.submitted_by_operator
            && self
                .csi
                .privileged_plugins
                .iter()
                .any(|grant| grant.id == id && grant.jobs.contains(&job.name))
    }

    /// Whether `job` may provide plugin `id` here: any job when the operator granted
    /// the id to none; else only a job it names, submitted by the operator.
    pub fn csi_plugin_allowed(&self, id: &str, job: &crate::jobspec::Job) -> bool {
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
                "ephemeral_disk_inodes_per_mb",
                "max_kill_timeout",
                "gc",
                "reserved",
                "consul",
                "user",
                "name",
                "datacenter",
                "cluster",
            ],
        );
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
        let reserved = match fields.single_block("reserved", &mut problems) {
            Some(block) => {
                let mut settings = Fields::new(
                    &block.body,
                    "config.reserved".into(),
                    block.at,
                    &["cpu", "memory", "disk"],
                );
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
        let users = match fields.single_block("user", &mut problems) {
            Some(block) => {
                let mut settings = Fields::new(
                    &block.body,
                    "config.user".into(),
                    block.at,
                    &["denylist", "checked_drivers", "dynamic_range"],
                );
                let defaults = UserPolicy::default();
                let mut list = |name: &'static str, default: Vec<String>| {
                    if settings.attr(name).is_some() {
                        settings.string_list(name, &mut problems)
                    } else {
                        default
                    }
                };
                let denylist = list("denylist", defaults.denylist);
                let checked_drivers = list("checked_drivers", defaults.checked_drivers);
                let range = settings.string("dynamic_range", &mut problems);
                let dynamic_range = match range.as_deref().map(|r| (r, dynamic_range(r))) {
                    None => defaults.dynamic_range,
                    Some((_, Some(range))) => range,
                    Some((text, None)) => {
                        let at = settings.attr("dynamic_range").map_or(block.at, |v| v.at);
                        settings.problem(
                            &mut problems,
                            "dynamic_range",
                            at,
                            format!(
                                "{text:?} is not a range of uids: expected \"<first>-<last>\" \
                                 with 0 < first <= last <= {MAX_DYNAMIC_ID}, as \"80000-89999\""
                            ),
                        );
                        defaults.dynamic_range
                    }
                };
                let policy = UserPolicy {
                    denylist,
                    checked_drivers,
                    dynamic_range,
                };
                settings.finish(&mut problems);
                policy
            }
            None => UserPolicy::default(),
        };
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
            ephemeral_disk_inodes_per_mb,
            max_kill_timeout,
            gc,
            reserved,
            consul,
            users,
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

fn consul_settings(block: &BlockNode, problems: &mut Vec<Problem>) -> ConsulSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.consul".into(),
        block.at,
        &[
            "address",
            "token",
            "token_file",
            "sync_interval",
            "service_address",
            "ssl",
            "scheme",
            "service_identity_timeout",
            "grpc_address",
            "binary",
        ],
    );
    let address = fields
        .string("address", problems)
        .unwrap_or_else(|| "127.0.0.1:8500".into());
    let address = address
        .strip_prefix("http://")
        .unwrap_or(&address)
        .trim_end_matches('/')
        .to_string();
    if address.starts_with("https://")
        || fields.bool("ssl", problems) == Some(true)
        || fields.string("scheme", problems).as_deref() == Some("https")
    {
        fields.problem(
            problems,
            "ssl",
            block.at,
            "berth talks plain HTTP to the local Consul agent; TLS to Consul is not built yet"
                .into(),
        );
    }
    let token = fields.string("token", problems);
    let token_file = fields.string("token_file", problems).map(PathBuf::from);
    let sync_interval = fields
        .duration("sync_interval", problems)
        .unwrap_or(std::time::Duration::from_secs(30))
        .max(std::time::Duration::from_secs(1));
    let service_address = fields.string("service_address", problems);
    let service_identity_timeout = fields
        .duration("service_identity_timeout", problems)
        .unwrap_or(std::time::Duration::from_secs(300));
    let grpc_address = fields
        .string("grpc_address", problems)
        .unwrap_or_else(|| "127.0.0.1:8502".into());
    let binary = fields
        .string("binary", problems)
        .unwrap_or_else(|| "consul".into());
    fields.finish(problems);
    ConsulSettings {
        address,
        token,
        token_file,
        sync_interval,
        service_address,
        service_identity_timeout,
        grpc_address,
        binary,
    }
}

fn cluster_settings(block: &BlockNode, problems: &mut Vec<Problem>) -> ClusterSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.cluster".into(),
        block.at,
        &[
            "store",
            "endpoints",
            "prefix",
            "dial_timeout",
            "heartbeat_ttl",
            "lost_claim_grace",
            "ca_file",
            "cert_file",
            "key_file",
            "username",
            "password_file",
            "password",
        ],
    );
    let defaults = ClusterSettings::default();
    let store_text = fields.string("store", problems);
    let store = match store_text {
        None => StoreKind::Embedded,
        Some(text) => fields
            .choose(
                Some(text),
                "store",
                &[("embedded", StoreKind::Embedded), ("etcd", StoreKind::Etcd)],
                problems,
                |other| format!("unknown store {other:?} (use \"embedded\" or \"etcd\")"),
            )
            .unwrap_or_default(),
    };
    let endpoints = if fields.attr("endpoints").is_some() {
        fields.string_list("endpoints", problems)
    } else {
        defaults.endpoints.clone()
    };
    let tls = etcd_tls(&mut fields, problems);
    let auth = etcd_auth(&mut fields, problems);
    check_endpoints(&mut fields, &endpoints, tls.is_some(), problems);
    if endpoints.is_empty() {
        fields.problem_with(
            problems,
            "endpoints",
            "name at least one etcd endpoint".into(),
        );
    }
    let prefix = fields.string("prefix", problems).unwrap_or(defaults.prefix);
    let prefix_ok = prefix.starts_with('/')
        && prefix.len() > 1
        && !prefix.ends_with('/')
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'));
    if !prefix_ok {
        fields.problem_with(
            problems,
            "prefix",
            format!(
                "{prefix:?} must start with / and not end with one, in letters, digits, \
                 '-', '_', '.' and '/' (e.g. \"/berth\")"
            ),
        );
    }
    let dial_timeout = fields
        .duration("dial_timeout", problems)
        .unwrap_or(defaults.dial_timeout);
    let heartbeat_ttl = fields
        .duration("heartbeat_ttl", problems)
        .unwrap_or(defaults.heartbeat_ttl);
    if heartbeat_ttl < std::time::Duration::from_secs(1) {
        fields.problem_with(
            problems,
            "heartbeat_ttl",
            "must be at least 1s (etcd's leases count whole seconds)".into(),
        );
    }
    let lost_claim_grace = fields
        .duration("lost_claim_grace", problems)
        .unwrap_or(defaults.lost_claim_grace);
    fields.finish(problems);
    ClusterSettings {
        store,
        endpoints,
        prefix,
        dial_timeout,
        heartbeat_ttl,
        lost_claim_grace,
        tls,
        auth,
    }
}

/// Every endpoint is an etcd client URL, all `https://` when `ca_file` is set and all
/// `http://` when not (a mix would send credentials in clear to some of them).
fn check_endpoints(
    fields: &mut Fields<'_>,
    endpoints: &[String],
    tls: bool,
    problems: &mut Vec<Problem>,
) {
    for endpoint in endpoints {
        let problem = if endpoint.starts_with("https://") && !tls {
            Some(format!(
                "{endpoint:?} is a TLS endpoint: set ca_file to the CA that signed etcd's \
                 certificate (berth trusts no system roots for etcd)"
            ))
        } else if endpoint.starts_with("http://") && tls {
            Some(format!(
                "{endpoint:?} is plain HTTP, but ca_file is set: use https:// for every \
                 endpoint (mixing them would send credentials in clear)"
            ))
        } else if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            Some(format!(
                "{endpoint:?} is not an etcd client URL such as \"http://127.0.0.1:2379\""
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            fields.problem_with(problems, "endpoints", problem);
        }
    }
}

/// An absolute path in `field`, or a problem naming it.
fn absolute_path(
    fields: &mut Fields<'_>,
    field: &'static str,
    problems: &mut Vec<Problem>,
) -> Option<PathBuf> {
    let path = fields.string(field, problems).map(PathBuf::from)?;
    if !path.is_absolute() {
        fields.problem_with(
            problems,
            field,
            format!("{:?} must be an absolute path", path.display()),
        );
        return None;
    }
    Some(path)
}

/// `ca_file`, and `cert_file` with `key_file` (both or neither).
fn etcd_tls(fields: &mut Fields<'_>, problems: &mut Vec<Problem>) -> Option<EtcdTls> {
    let ca_file = absolute_path(fields, "ca_file", problems);
    let cert_file = absolute_path(fields, "cert_file", problems);
    let key_file = absolute_path(fields, "key_file", problems);
    let client_cert = match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => Some(ClientCert {
            cert_file,
            key_file,
        }),
        (Some(_), None) => {
            fields.problem_with(
                problems,
                "cert_file",
                "is set without key_file: a client certificate needs its private key".into(),
            );
            None
        }
        (None, Some(_)) => {
            fields.problem_with(
                problems,
                "key_file",
                "is set without cert_file: a private key needs its certificate".into(),
            );
            None
        }
        (None, None) => None,
    };
    match ca_file {
        Some(ca_file) => Some(EtcdTls {
            ca_file,
            client_cert,
        }),
        None => {
            if client_cert.is_some() {
                fields.problem_with(
                    problems,
                    "cert_file",
                    "a client certificate is shown over TLS only: set ca_file and use \
                     https:// endpoints"
                        .into(),
                );
            }
            None
        }
    }
}

/// `username` with `password_file` (both or neither); an inline `password` is refused.
fn etcd_auth(fields: &mut Fields<'_>, problems: &mut Vec<Problem>) -> Option<EtcdAuth> {
    if fields.string("password", problems).is_some() {
        fields.problem_with(
            problems,
            "password",
            "berth takes etcd's password only from a file: put it in a file only the \
             agent's user can read and set password_file to its path"
                .into(),
        );
    }
    let username = fields.string("username", problems);
    let password_file = absolute_path(fields, "password_file", problems);
    match (username, password_file) {
        (Some(username), Some(password_file)) if !username.is_empty() => Some(EtcdAuth {
            username,
            password_file,
        }),
        (Some(_), Some(_)) => {
            fields.problem_with(problems, "username", "must not be empty".into());
            None
        }
        (Some(_), None) => {
            if fields.attr("password_file").is_none() {
                fields.problem_with(
                    problems,
                    "password_file",
                    "is needed with username: the file that holds the user's password".into(),
                );
            }
            None
        }
        (None, Some(_)) => {
            fields.problem_with(
                problems,
                "username",
                "is needed with password_file: the etcd user the password is for".into(),
            );
            None
        }
        (None, None) => None,
    }
}

fn http_config(block: &BlockNode, problems: &mut Vec<Problem>) -> HttpConfig {
    let mut fields = Fields::new(
        &block.body,
        "config.http".into(),
        block.at,
        &[
            "address",
            "socket_group",
            "token_file",
            "token",
            "max_connections",
            "max_connections_per_client",
            "header_timeout",
            "idle_timeout",
        ],
    );
    let address = fields.string("address", problems).and_then(|text| {
        let parsed = text.parse::<std::net::SocketAddr>().ok();
        if parsed.is_none() {
            let at = fields.attr("address").map(|a| a.at).unwrap_or(block.at);
            fields.problem(
                problems,
                "address",
                at,
                format!("{text:?} is not an address such as \"127.0.0.1:4646\""),
            );
        }
        parsed
    });
    let socket_group = fields.string("socket_group", problems);
    let token_file = fields.string("token_file", problems).map(PathBuf::from);
    if let Some(file) = token_file.as_ref().filter(|f| !f.is_absolute()) {
        let at = fields.attr("token_file").map(|a| a.at).unwrap_or(block.at);
        fields.problem(
            problems,
            "token_file",
            at,
            format!("{:?} must be an absolute path", file.display()),
        );
    }
    let mut tokens = Vec::new();
    for (name, token) in fields.labeled_blocks("token", problems) {
        let path = format!("config.http.token.{name}");
        let mut token_fields = Fields::new(&token.body, path, token.at, &["secret", "scope"]);
        let secret = token_fields.required_string("secret", problems);
        let long_enough = secret
            .as_ref()
            .is_some_and(|s| s.chars().count() >= MIN_TOKEN_SECRET);
        if let Some(short) = secret.as_ref().filter(|_| !long_enough) {
            let at = token_fields
                .attr("secret")
                .map(|a| a.at)
                .unwrap_or(token.at);
            token_fields.problem(
                problems,
                "secret",
                at,
                format!(
                    "is {} characters; a token secret needs at least {MIN_TOKEN_SECRET}",
                    short.chars().count()
                ),
            );
        }
        let scope_text = token_fields.required_string("scope", problems);
        let scope = token_fields.choose(
            scope_text,
            "scope",
            &[
                ("read", TokenScope::Read),
                ("submit", TokenScope::Submit),
                ("plugin", TokenScope::Plugin),
            ],
            problems,
            |other| format!("unknown scope {other:?} (use \"read\", \"submit\" or \"plugin\")"),
        );
        token_fields.finish(problems);
        if let (Some(secret), Some(scope), true) = (secret, scope, long_enough) {
            tokens.push(ApiToken {
                name,
                secret,
                scope,
            });
        }
    }
    let defaults = ConnectionLimits::TCP;
    let tcp_limits = ConnectionLimits {
        max_connections: fields
            .number("max_connections", 1_000_000, problems)
            .map_or(defaults.max_connections, |n| n.max(1) as usize),
        max_connections_per_client: fields
            .number("max_connections_per_client", 1_000_000, problems)
            .map_or(defaults.max_connections_per_client, |n| n.max(1) as usize),
        reserved_for_tokens: defaults.reserved_for_tokens,
        header_timeout: fields
            .duration("header_timeout", problems)
            .unwrap_or(defaults.header_timeout)
            .max(std::time::Duration::from_millis(100)),
        idle_timeout: fields
            .duration("idle_timeout", problems)
            .unwrap_or(defaults.idle_timeout)
            .max(std::time::Duration::from_millis(100)),
    };
    fields.finish(problems);
    HttpConfig {
        address,
        socket_group,
        token_file,
        tokens,
        tcp_limits,
        socket_limits: ConnectionLimits::SOCKET,
    }
}

fn plugin_config(name: String, block: &BlockNode, problems: &mut Vec<Problem>) -> PluginConfig {
    let path = format!("config.plugin.{name}");
    let mut plugin = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &["config", "sha256", "allow_unconfined", "path"],
    );
    let sha256 = pin(&mut plugin, block.at, problems);
    let allow_unconfined = plugin.bool("allow_unconfined", problems).unwrap_or(false);
    let file = plugin.string("path", problems).map(PathBuf::from);
    if allow_unconfined && file.is_none() && sha256.is_none() {
        plugin.problem_with(
            problems,
            "allow_unconfined",
            format!(
                "allow_unconfined names no file: any driver file can report the name {name:?}, \
                 so the grant must name the file it is for: add path = \"/path/to/{name}.wasm\" \
                 or sha256 = \"...\" to this block"
            ),
        );
    }
    let mut enabled = None;
    if let Some(config) = plugin.single_block("config", problems) {
        let mut settings = Fields::new(
            &config.body,
            format!("{path}.config"),
            config.at,
            &["enabled"],
        );
        enabled = settings.bool("enabled", problems);
        settings.finish(problems);
    }
    plugin.finish(problems);
    PluginConfig {
        name,
        enabled,
        sha256,
        allow_unconfined,
        path: file,
    }
}

fn cgroup_settings(block: &BlockNode, problems: &mut Vec<Problem>) -> CgroupSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.cgroups".into(),
        block.at,
        &[
            "parent",
            "pids_max",
            "all_tasks_pids_max",
            "job_pids_max",
            "allow_missing_controllers",
            "favor_dynmods",
        ],
    );
    let defaults = CgroupSettings::default();
    let parent = fields.string("parent", problems).unwrap_or(defaults.parent);
    let parent_ok = !parent.is_empty()
        && parent
            .split('/')
            .all(|part| check_name(NameKind::Job, part).is_ok());
    if !parent_ok {
        fields.problem_with(
            problems,
            "parent",
            format!(
                "{parent:?} is not a cgroup path berth can use: names of letters, digits, \
                 '.', '_' and '-', separated by '/'"
            ),
        );
    }
    let pids_max = fields
        .number("pids_max", 4_194_304, problems)
        .unwrap_or(defaults.pids_max);
    if pids_max < 8 {
        fields.problem_with(
            problems,
            "pids_max",
            format!("{pids_max} is too few processes for any task (at least 8)"),
        );
    }
    let all_tasks_pids_max = fields.number("all_tasks_pids_max", 4_194_304, problems);
    if let Some(max) = all_tasks_pids_max.filter(|max| *max < pids_max) {
        fields.problem_with(
            problems,
            "all_tasks_pids_max",
            format!("{max} is fewer processes than one task may have (pids_max = {pids_max})"),
        );
    }
    let job_pids_max = fields.number("job_pids_max", 4_194_304, problems);
    if let Some(max) = job_pids_max.filter(|max| *max < pids_max) {
        fields.problem_with(
            problems,
            "job_pids_max",
            format!("{max} is fewer processes than one task may have (pids_max = {pids_max})"),
        );
    }
    if let (Some(job), Some(all)) = (job_pids_max, all_tasks_pids_max)
        && job > all
    {
        fields.problem_with(
            problems,
            "job_pids_max",
            format!("{job} is more processes than all tasks together may have (all_tasks_pids_max = {all})"),
        );
    }
    let allow_missing_controllers = fields
        .bool("allow_missing_controllers", problems)
        .unwrap_or(false);
    let favor_dynmods = fields.bool("favor_dynmods", problems).unwrap_or(false);
    fields.finish(problems);
    CgroupSettings {
        parent,
        pids_max,
        all_tasks_pids_max,
        job_pids_max,
        allow_missing_controllers,
        favor_dynmods,
    }
}

/// The `sha256` field of a plugin or hook block, checked.
fn pin(fields: &mut Fields, block_at: Location, problems: &mut Vec<Problem>) -> Option<String> {
    let text = fields.string("sha256", problems)?;
    match parse_sha256(&text) {
        Ok(digest) => Some(digest),
        Err(error) => {
            let at = fields.attr("sha256").map(|a| a.at).unwrap_or(block_at);
            fields.problem(problems, "sha256", at, error.to_string());
            None
        }
    }
}

fn hook_spec(name: String, block: &BlockNode, problems: &mut Vec<Problem>) -> Option<HookSpec> {
    let mut hook = Fields::new(
        &block.body,
        format!("config.hook.{name}"),
        block.at,
        &[
            "path",
            "config",
            "timeout",
            "memory_max",
            "on_failure",
            "all_tasks",
            "sha256",
            "quota_bytes",
            "quota_inodes",
        ],
    );
    let defaults = WriteQuota::default();
    let quota = WriteQuota {
        bytes: hook.size("quota_bytes", problems).unwrap_or(defaults.bytes),
        inodes: hook
            .number("quota_inodes", 1_000_000, problems)
            .unwrap_or(defaults.inodes),
    };
    let sha256 = pin(&mut hook, block.at, problems);
    let path = hook.required_string("path", problems);
    if let Some(path) = path.as_ref().filter(|p| !Path::new(p).is_absolute()) {
        let at = hook.attr("path").map(|v| v.at).unwrap_or(block.at);
        hook.problem(
            problems,
            "path",
            at,
            format!("{path:?} must be an absolute path"),
        );
    }
    let config = hook.string_map("config", problems);
    let timeout = hook
        .duration("timeout", problems)
        .unwrap_or(HookSpec::DEFAULT_TIMEOUT);
    let memory_max = match hook.size("memory_max", problems) {
        None => HookSpec::DEFAULT_MEMORY_MAX,
        Some(bytes) if (HookSpec::MEMORY_MAX_RANGE).contains(&bytes) => bytes as usize,
        Some(_) => {
            let at = hook.attr("memory_max").map(|a| a.at).unwrap_or_default();
            hook.problem(
                problems,
                "memory_max",
                at,
                "must be at least 1MiB and at most 4GiB".into(),
            );
            HookSpec::DEFAULT_MEMORY_MAX
        }
    };
    let on_failure_text = hook.string("on_failure", problems);
    let on_failure = match on_failure_text {
        None => Some(OnFailure::Fail),
        text => hook.choose(
            text,
            "on_failure",
            &[("fail", OnFailure::Fail), ("ignore", OnFailure::Ignore)],
            problems,
            |other| format!("unknown on_failure {other:?} (use \"fail\" or \"ignore\")"),
        ),
    };
    let all_tasks = hook.bool("all_tasks", problems).unwrap_or(false);
    hook.finish(problems);
    Some(HookSpec {
        name,
        path: PathBuf::from(path?),
        config,
        timeout,
        memory_max,
        on_failure: on_failure?,
        all_tasks,
        sha256,
        quota,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_tls_and_auth_parse_and_their_mistakes_name_the_field() {
        let cluster = |body: &str| {
            AgentConfig::parse(
                "agent.hcl",
                &format!("cluster {{\n  store = \"etcd\"\n{body}}}\n"),
            )
        };
        let config = cluster(
            "  endpoints = [\"https://10.0.0.5:2379\"]\n  ca_file = \"/e/ca.pem\"\n  \
             cert_file = \"/e/c.pem\"\n  key_file = \"/e/k.pem\"\n  username = \"berth\"\n  \
             password_file = \"/e/pw\"\n",
        )
        .unwrap();
        let settings = config.cluster;
        assert_eq!(
            settings.tls,
            Some(EtcdTls {
                ca_file: "/e/ca.pem".into(),
                client_cert: Some(ClientCert {
                    cert_file: "/e/c.pem".into(),
                    key_file: "/e/k.pem".into(),
                }),
            })
        );
        assert_eq!(
            settings.auth,
            Some(EtcdAuth {
                username: "berth".into(),
                password_file: "/e/pw".into(),
            })
        );
        assert!(settings.presents_credentials());
        assert!(!ClusterSettings::default().presents_credentials());
        for (body, expected) in [
            (
                "  endpoints = [\"https://e:2379\"]\n",
                "config.cluster.endpoints: \"https://e:2379\" is a TLS endpoint: set ca_file",
            ),
            (
                "  endpoints = [\"https://e:2379\", \"http://f:2379\"]\n  ca_file = \"/ca\"\n",
                "config.cluster.endpoints: \"http://f:2379\" is plain HTTP, but ca_file is set",
            ),
            (
                "  endpoints = [\"https://e:2379\"]\n  ca_file = \"/ca\"\n  cert_file = \"/c\"\n",
                "config.cluster.cert_file: is set without key_file",
            ),
            (
                "  username = \"berth\"\n  password = \"hunter2\"\n",
                "config.cluster.password: berth takes etcd's password only from a file",
            ),
            (
                "  username = \"berth\"\n",
                "config.cluster.password_file: is needed with username",
            ),
            (
                "  username = \"berth\"\n  password_file = \"pw\"\n",
                "config.cluster.password_file: \"pw\" must be an absolute path",
            ),
        ] {
            let error = cluster(body).unwrap_err().to_string();
            assert!(error.contains(expected), "{body}: {error}");
        }
    }

    #[test]
    fn parses_host_volumes() {
        let config = AgentConfig::parse(
            "agent.hcl",
            "plugin_dir = \"/p\"\nhost_volume \"data\" {\n  path = \"/srv/data\"\n  read_only = true\n}\n",
        )
        .unwrap();
        assert_eq!(config.plugin_dir, Some(PathBuf::from("/p")));
        assert_eq!(
            config.host_volume("data"),
            Some(&HostVolume {
                name: "data".into(),
                path: "/srv/data".into(),
                read_only: true,
                allow_setuid: false,
            })
        );
    }

    #[test]
    fn parses_what_the_node_reserves() {
        let config = AgentConfig::parse(
            "agent.hcl",
            "reserved {\n  cpu = 500\n  memory = 512\n  disk = 1024\n}\n",
        )
        .unwrap();
        assert_eq!(
            config.reserved,
            NodeResources {
                cpu_mhz: 500,
                memory_mb: 512,
                disk_mb: 1024,
            }
        );
        assert_eq!(AgentConfig::default().reserved, NodeResources::default());
        let error = AgentConfig::parse("agent.hcl", "reserved {\n  cores = 2\n}\n").unwrap_err();
        assert!(error.to_string().contains("cores"), "{error}");
    }

    #[test]
    fn parses_hooks_with_their_limits() {
        let config = AgentConfig::parse(
            "agent.hcl",
            "hook \"policy\" {\n  path = \"/h/policy.wasm\"\n  config = { deny = \"raw_exec\" }\n  timeout = \"250ms\"\n  memory_max = \"16MiB\"\n  on_failure = \"ignore\"\n  all_tasks = true\n}\nhook \"env\" {\n  path = \"/h/env.wasm\"\n}\n",
        )
        .unwrap();
        let policy = &config.hooks[0];
        assert_eq!(policy.name, "policy");
        assert_eq!(policy.config, vec![("deny".into(), "raw_exec".into())]);
        assert_eq!(policy.timeout, std::time::Duration::from_millis(250));
        assert_eq!(policy.memory_max, 16 << 20);
        assert_eq!(policy.on_failure, OnFailure::Ignore);
        assert!(policy.all_tasks);
        let env = &config.hooks[1];
        assert_eq!(env.timeout, HookSpec::DEFAULT_TIMEOUT);
        assert_eq!(env.on_failure, OnFailure::Fail);
        assert!(!env.all_tasks);
    }

    #[test]
    fn bad_hook_settings_are_named() {
        let error = AgentConfig::parse(
            "agent.hcl",
            "hook \"h\" {\n  path = \"h.wasm\"\n  memory_max = \"lots\"\n  on_failure = \"retry\"\n}\n",
        )
        .unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("config.hook.h.path: \"h.wasm\" must be an absolute path"),
            "{text}"
        );
        assert!(
            text.contains(
                "config.hook.h.memory_max: \"lots\" is not a size: unknown unit \"lots\""
            ),
            "{text}"
        );
        assert!(text.contains("unknown on_failure \"retry\""), "{text}");
    }

    #[test]
    fn absurd_sizes_and_durations_are_errors_not_panics() {
        let error = AgentConfig::parse(
            "agent.hcl",
            "hook \"h\" {\n  path = \"/h.wasm\"\n  memory_max = \"99999999999999GiB\"\n  timeout = \"9999999999999999h\"\n}\nhook \"small\" {\n  path = \"/s.wasm\"\n  memory_max = \"512KiB\"\n}\n",
        )
        .unwrap_err()
        .to_string();
        for expected in [
            "agent.hcl:3:",
            "config.hook.h.memory_max: \"99999999999999GiB\" is not a size: is too large (at most 8EiB)",
            "agent.hcl:4:",
            "config.hook.h.timeout: \"9999999999999999h\" is not a duration: is too large (at most 876000h)",
            "config.hook.small.memory_max: must be at least 1MiB and at most 4GiB",
        ] {
            assert!(
                error.contains(expected),
                "missing {expected:?} in:\n{error}"
            );
        }
    }

    #[test]
    fn inline_secrets_in_a_readable_config_are_warned_about() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.hcl");
        let text = "http {\n  address = \"127.0.0.1:4646\"\n  token \"ci\" {\n    secret = \"ci-secret-0123456789\"\n    scope = \"submit\"\n  }\n}\n";
        std::fs::write(&path, text).unwrap();
        let config = AgentConfig::parse_file(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let warning = config.exposed_secrets_warning(&path).unwrap();
        assert!(
            warning.contains("holds http token secrets and other users can read it (mode 644)"),
            "{warning}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(config.exposed_secrets_warning(&path), None);
        // No inline secret, nothing to say.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(AgentConfig::default().exposed_secrets_warning(&path), None);
    }

    #[test]
    fn only_the_operator_lets_a_driver_run_unconfined() {
        let config = AgentConfig::parse(
            "agent.hcl",
            "plugin \"exec\" {\n  allow_unconfined = false\n}\nplugin \"vendor\" {\n  path = \"/p/vendor.wasm\"\n  allow_unconfined = true\n}\n",
        )
        .unwrap();
        let vendor = Path::new("/p/vendor.wasm");
        assert!(!config.allows_unconfined("exec", None));
        assert!(config.allows_unconfined("vendor", Some(vendor)));
        // Another file that reports the name gets nothing of the grant.
        assert!(!config.allows_unconfined("vendor", Some(Path::new("/p/squatter.wasm"))));
        assert!(!config.allows_unconfined("unlisted", Some(vendor)));
        assert!(
            !config.allows_unconfined("raw_exec", None),
            "raw_exec needs enabled = true"
        );
        // A file reporting raw_exec is not the built-in raw_exec.
        let enabled = AgentConfig::parse(
            "agent.hcl",
            "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
        )
        .unwrap();
        assert!(enabled.allows_unconfined("raw_exec", None));
        assert!(!enabled.allows_unconfined("raw_exec", Some(vendor)));
        let unnamed = AgentConfig::parse(
            "agent.hcl",
            "plugin \"vendor\" {\n  allow_unconfined = true\n}\n",
        )
        .unwrap_err();
        assert!(
            unnamed
                .to_string()
                .contains("allow_unconfined names no file"),
            "{unnamed}"
        );
    }

    /// A job's `kill_timeout` is capped at `max_kill_timeout` (Nomad's 30 s unless set),
    /// and the disk's inodes per MB are the operator's to set.
    #[test]
    fn kill_timeouts_are_capped_and_inodes_per_mb_read() {
        use std::time::Duration;
        let unset = AgentConfig::parse("agent.hcl", "").unwrap();
        assert_eq!(
            unset.kill_timeout_of(Duration::from_secs(3600)),
            Duration::from_secs(30)
        );
        assert_eq!(
            unset.kill_timeout_of(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        let set = AgentConfig::parse(
            "agent.hcl",
            "max_kill_timeout = \"2m\"\nephemeral_disk_inodes_per_mb = 64\n",
        )
        .unwrap();
        assert_eq!(
            set.kill_timeout_of(Duration::from_secs(3600)),
            Duration::from_secs(120)
        );
        assert_eq!(set.ephemeral_disk_inodes_per_mb, Some(64));
        let bad = AgentConfig::parse("agent.hcl", "max_kill_timeout = \"soon\"\n").unwrap_err();
        assert!(bad.to_string().contains("max_kill_timeout"), "{bad}");
    }

    /// A dynamic range holds only ids setuid(2) and chown(2) take as ids: never -1
    /// (attack review: "1-4294967295" hung the alloc on a panic in the task runner).
    #[test]
    fn a_dynamic_range_past_2_pow_31_is_refused() {
        let parse = |range: &str| {
            AgentConfig::parse(
                "agent.hcl",
                &format!("user {{\n  dynamic_range = \"{range}\"\n}}\n"),
            )
        };
        assert_eq!(
            parse("80000-89999").unwrap().users.dynamic_range,
            80_000..=89_999
        );
        for bad in ["4294967290-4294967295", "1-2147483648", "0-10", "20-10"] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains("is not a range of uids"), "{bad}: {error}");
        }
        assert!(parse("1-2147483647").is_ok());
    }

    #[test]
    fn the_instance_pool_is_sized_by_the_operator() {
        let unset = AgentConfig::parse("agent.hcl", "").unwrap();
        assert_eq!(unset.max_plugin_instances, None);
        let set = AgentConfig::parse("agent.hcl", "max_plugin_instances = 2048\n").unwrap();
        assert_eq!(set.max_plugin_instances, Some(2048));
        let tiny = AgentConfig::parse("agent.hcl", "max_plugin_instances = 1\n").unwrap();
        assert_eq!(
            tiny.max_plugin_instances,
            Some(16),
            "a floor that loading needs"
        );
        let error = AgentConfig::parse("agent.hcl", "max_plugin_instances = 9999999\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("agent.hcl:1:"), "{error}");
    }

    #[test]
    fn cgroup_settings_have_defaults_and_checked_values() {
        let defaults = AgentConfig::parse("agent.hcl", "").unwrap().cgroups;
        assert_eq!(defaults, CgroupSettings::default());
        let set = AgentConfig::parse(
            "agent.hcl",
            "cgroups {\n  parent = \"ops/berth\"\n  pids_max = 512\n  allow_missing_controllers = true\n  \
             favor_dynmods = true\n}\n",
        )
        .unwrap()
        .cgroups;
        assert_eq!(
            set,
            CgroupSettings {
                parent: "ops/berth".into(),
                pids_max: 512,
                all_tasks_pids_max: None,
                job_pids_max: None,
                allow_missing_controllers: true,
                favor_dynmods: true,
            }
        );
        let error = AgentConfig::parse(
            "agent.hcl",
            "cgroups {\n  parent = \"../escape\"\n  pids_max = 2\n}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("agent.hcl:2:"), "{error}");
        assert!(
            error.contains(
                "\"../escape\" is not a cgroup path berth can use: names of letters, digits, \
                 '.', '_' and '-', separated by '/'"
            ),
            "{error}"
        );
        assert!(error.contains("agent.hcl:3:"), "{error}");
        assert!(
            error.contains("2 is too few processes for any task (at least 8)"),
            "{error}"
        );
        let share = AgentConfig::parse(
            "agent.hcl",
            "cgroups {\n  all_tasks_pids_max = 9000\n  job_pids_max = 5000\n}\n",
        )
        .unwrap()
        .cgroups;
        assert_eq!(share.job_pids_max, Some(5000));
        let error = AgentConfig::parse(
            "agent.hcl",
            "cgroups {\n  pids_max = 100\n  all_tasks_pids_max = 200\n  job_pids_max = 300\n}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains(
                "300 is more processes than all tasks together may have \
                 (all_tasks_pids_max = 200)"
            ),
            "{error}"
        );
        let error = AgentConfig::parse(
            "agent.hcl",
            "cgroups {\n  pids_max = 100\n  job_pids_max = 50\n}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("50 is fewer processes than one task may have (pids_max = 100)"),
            "{error}"
        );
    }

    #[test]
    fn mock_is_off_unless_the_operator_turns_it_on_and_other_drivers_are_on() {
        let off = AgentConfig::parse("agent.hcl", "").unwrap();
        assert!(!off.driver_enabled("mock"));
        assert!(off.driver_enabled("exec"));
        assert!(off.driver_enabled("vendor"));
        let on = AgentConfig::parse(
            "agent.hcl",
            "plugin \"mock\" {\n  config {\n    enabled = true\n  }\n}\n",
        )
        .unwrap();
        assert!(on.driver_enabled("mock"));
        assert!(!on.raw_exec_enabled(), "enabling mock enabled raw_exec");
        // Enabling mock lets it run; it never lets anything spawn unconfined.
        assert!(!on.allows_unconfined("mock", None));
    }

    #[test]
    fn raw_exec_is_off_unless_the_operator_turns_it_on() {
        let off = AgentConfig::parse("agent.hcl", "").unwrap();
        assert!(!off.raw_exec_enabled());
        let on = AgentConfig::parse(
            "agent.hcl",
            "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
        )
        .unwrap();
        assert!(on.raw_exec_enabled());
        let explicit_off = AgentConfig::parse(
            "agent.hcl",
            "plugin \"raw_exec\" {\n  config {\n    enabled = false\n  }\n}\n",
        )
        .unwrap();
        assert!(!explicit_off.raw_exec_enabled());
        let error = AgentConfig::parse(
            "agent.hcl",
            "plugin \"raw_exec\" {\n  config {\n    enabled = \"yes\"\n    volumes = true\n  }\n}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("agent.hcl:3:"), "{error}");
        assert!(
            error.contains(
                "config.plugin.raw_exec.config.enabled: expected true or false, found a string"
            ),
            "{error}"
        );
        assert!(error.contains("unknown field \"volumes\""), "{error}");
    }

    #[test]
    fn relative_host_volume_paths_are_refused() {
        let error = AgentConfig::parse("agent.hcl", "host_volume \"d\" {\n  path = \"srv\"\n}\n")
            .unwrap_err();
        assert_eq!(
            error.problems[0].to_string(),
            "2:10: config.host_volume.d.path: \"srv\" must be an absolute path"
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        const REAL: &str = include_str!("../../examples/csi/agent.hcl");

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            /// Arbitrary text, and a real config with a stretch replaced, either parse or
            /// fail with problems: never a panic.
            #[test]
            fn any_text_or_edit(
                source in "\\PC{0,300}",
                at in any::<usize>(),
                patch in "[{}\"=a-z0-9 \n._-]{0,8}",
            ) {
                let _ = AgentConfig::parse("fuzz.hcl", &source);
                let mut at = at % (REAL.len() + 1);
                while !REAL.is_char_boundary(at) {
                    at -= 1;
                }
                let edited = format!("{}{patch}{}", &REAL[..at], &REAL[at..]);
                if let Err(error) = AgentConfig::parse("fuzz.hcl", &edited) {
                    prop_assert!(!error.problems.is_empty());
                }
            }
        }
    }
}
