//! The host's own driver types: what the rest of the agent (and its persisted state)
//! uses, independent of the WIT version a driver was built against. The conversions from
//! and to the generated types live in `runtime/driver/types.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::mount::HandedMount;

/// The WIT world a driver component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WorldVersion {
    #[serde(rename = "0.1.0")]
    V0_1,
    #[serde(rename = "0.2.0")]
    V0_2,
    #[serde(rename = "0.2.1")]
    V0_2_1,
}

impl WorldVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => "0.1.0",
            WorldVersion::V0_2 => "0.2.0",
            WorldVersion::V0_2_1 => "0.2.1",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriverInfo {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MountConfigs {
    All,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsIsolation {
    None,
    Chroot,
    Image,
}

impl FsIsolation {
    /// Its name as the WIT and the agent's messages write it.
    pub fn as_str(self) -> &'static str {
        match self {
            FsIsolation::None => "none",
            FsIsolation::Chroot => "chroot",
            FsIsolation::Image => "image",
        }
    }

    /// Whether the driver's tasks see a root of their own (the task dir, or an image)
    /// rather than the host's: their dirs are at `/local`, `/alloc`, … and they run as
    /// a user of their own.
    pub fn confines(self) -> bool {
        matches!(self, FsIsolation::Chroot | FsIsolation::Image)
    }
}

/// How a driver's spawns are confined: in the host's namespaces (`none`), or in a mount
/// namespace of their own, chrooted into the task's root (`chroot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpawnIsolation {
    None,
    Chroot,
}

impl SpawnIsolation {
    pub fn as_str(self) -> &'static str {
        match self {
            SpawnIsolation::None => "none",
            SpawnIsolation::Chroot => "chroot",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    pub send_signals: bool,
    pub exec: bool,
    pub fs_isolation: FsIsolation,
    pub mount_configs: MountConfigs,
    /// Every isolation the driver's spawns use, sorted, without repeats (world 0.2.1's
    /// `spawn-isolation`); `None` for a driver built before it could say, whose spawns
    /// are held to `fs_isolation` alone.
    pub spawn_isolation: Option<Vec<SpawnIsolation>>,
    /// False when the driver predates `capabilities` (world 0.1.0) and these are the
    /// host's defaults.
    pub declared: bool,
}

impl Capabilities {
    /// Whether the driver said it spawns tasks unconfined, which takes the operator's
    /// leave (`allow_unconfined`, or `raw_exec` enabled). A driver that did not say is
    /// not known to, and is held at its spawn.
    pub fn declares_unconfined(&self) -> bool {
        (self.spawn_isolation.as_deref())
            .is_some_and(|spawns| spawns.contains(&SpawnIsolation::None))
    }
}

impl Capabilities {
    /// What the host assumes for a driver that declares nothing: "supports all", so
    /// community drivers built before capabilities keep working.
    pub fn assumed_for_legacy() -> Self {
        Capabilities {
            send_signals: true,
            exec: false,
            fs_isolation: FsIsolation::None,
            mount_configs: MountConfigs::All,
            spawn_isolation: None,
            declared: false,
        }
    }
}

/// One field of a driver's `config` block, as the driver describes it (world 0.2.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigField {
    pub name: String,
    /// An HCL type constraint: `string`, `list(string)`, `object({ … })`, `any`.
    pub hcl_type: String,
    pub required: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Undetected,
    Unhealthy,
    Healthy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fingerprint {
    pub health: Health,
    pub description: String,
    pub attributes: Vec<(String, String)>,
}

/// The user a task runs as, resolved on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUser {
    pub uid: u32,
    pub gid: u32,
}

/// Everything the host hands a driver to start a task.
#[derive(Debug, Clone)]
pub struct TaskRequest {
    pub id: String,
    pub name: String,
    pub alloc_id: String,
    pub job_name: String,
    pub group_name: String,
    /// The task's `config` block as JSON.
    pub config: String,
    pub env: Vec<(String, String)>,
    pub task_dir: PathBuf,
    pub mounts: Vec<HandedMount>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// How `stdout` and `stderr` rotate.
    pub logs: LogRotation,
    /// Keeps root's capabilities in its chroot: only a CSI plugin task the operator
    /// named in `csi { privileged_plugins }`.
    pub privileged: bool,
    /// Every process the driver spawns for the task runs as this user.
    pub user: Option<TaskUser>,
    /// The operator lets this driver spawn unconfined (`raw_exec` enabled, or
    /// `allow_unconfined` in its plugin block); otherwise every spawn is confined.
    pub allow_unconfined: bool,
    /// The `cgroup.procs` files of the task's cgroup, which every spawn joins.
    pub cgroup_procs: Vec<PathBuf>,
    /// The `cgroup.procs` files of the alloc's log collectors' cgroup, which the
    /// collector of every spawn joins.
    pub collector_cgroup_procs: Vec<PathBuf>,
    /// The group's network namespace (bridge mode), which every spawn joins; `None`:
    /// the host's network.
    pub network_namespace: Option<PathBuf>,
    /// Files the host wrote for the group (`resolv.conf`, `hosts`), which a confined
    /// spawn sees over the host's in its `/etc`. Not the driver's to choose.
    pub etc_files: Vec<PathBuf>,
    /// A task on an image runs in a user namespace of its own (the agent's `image {
    /// userns = "private" }`): `user` is then its ids on the host, and this the rest.
    pub image_user_namespace: Option<ImageUserNamespace>,
    /// Where what the host does for the driver while it starts the task (an image's
    /// pull) goes: the task's events.
    pub progress: Option<TaskProgress>,
    /// Gives an image task a network namespace of its own (Docker's default bridge
    /// network), in a host-mode group; `None` in a bridge-mode group.
    pub own_network: Option<TaskNetworkMaker>,
}

/// Makes (or finds, on a restart) a task's own network namespace on the node's bridge,
/// with the group ports named (by label) forwarded to it.
#[derive(Clone)]
pub struct TaskNetworkMaker(pub std::sync::Arc<MakeTaskNetwork>);

/// What a [`TaskNetworkMaker`] calls: the group ports to forward, by label.
pub type MakeTaskNetwork =
    dyn Fn(&[String]) -> Result<TaskNetwork, TaskNetworkRefusal> + Send + Sync;

impl std::fmt::Debug for TaskNetworkMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskNetworkMaker")
    }
}

/// Releases a task's own network once the task is over for good (no restart to come).
pub type ReleaseTaskNetwork = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A task's own network namespace, attached to the node's bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNetwork {
    /// The namespace's file (`/run/netns/<name>`), which every spawn of the task joins.
    pub path: PathBuf,
    /// The ports forwarded to it: by label, the port the task listens on inside.
    pub ports: Vec<(String, u16)>,
    /// Its own `hosts` and `resolv.conf`, over the image's in the task's `/etc`.
    pub etc_files: Vec<PathBuf>,
}

/// Why a task's own network could not be made, in words for the job's author.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TaskNetworkRefusal(pub String);

/// A task's "Driver" events, as the host reports them while a driver starts it.
#[derive(Clone)]
pub struct TaskProgress(pub std::sync::Arc<dyn Fn(String) + Send + Sync>);

impl std::fmt::Debug for TaskProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskProgress")
    }
}

/// What the host decided for an image task's user namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUserNamespace {
    /// The first of the task's 65536 subordinate ids.
    pub subordinate: u32,
    /// The job's `user`: a user of the image (`name`, `uid`, `user:group`), in place of
    /// the image's own `User`.
    pub user: Option<String>,
}

/// What a driver returns for a started task; persisted by the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskHandle {
    pub id: String,
    pub driver_state: Vec<u8>,
    /// The processes the host spawned for the driver while it started the task: the only
    /// ones it may adopt when it recovers the task after an agent restart. Recorded by
    /// the host, never taken from the driver.
    #[serde(default)]
    pub spawned: Vec<ProcessRef>,
    /// The one of `spawned` the driver said the task ends with: the host waits for it
    /// itself before it asks the driver to `wait-task`, so a running task holds no
    /// instance of its driver. `None` for drivers that did not say.
    #[serde(default)]
    pub ends_with: Option<ProcessRef>,
    /// When the driver said the task ends (`timer.task-ends-after`), in Unix
    /// milliseconds: the host sleeps until then itself before it asks the driver to
    /// `wait-task`, for a task that ends at a time rather than with a process (`mock`).
    #[serde(default)]
    pub ends_at_ms: Option<u64>,
}

/// Now as Unix milliseconds (0 before 1970: a clock that far off ends every wait).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a task's `stdout` and `stderr` files rotate (the jobspec's `logs` block): at most
/// `max_files` files of `max_file_size` bytes each, per stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRotation {
    pub max_files: u32,
    pub max_file_size: u64,
}

impl Default for LogRotation {
    /// Nomad's: 10 files of 10 MB.
    fn default() -> Self {
        LogRotation {
            max_files: 10,
            max_file_size: 10 << 20,
        }
    }
}

/// Names a process across agent restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessRef {
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitResult {
    pub exit_code: i32,
    pub signal: i32,
    pub oom_killed: bool,
}

impl ExitResult {
    pub fn successful(&self) -> bool {
        self.exit_code == 0 && self.signal == 0 && !self.oom_killed
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Unknown,
    Running,
    Exited,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskStatus {
    pub id: String,
    pub state: TaskState,
    pub exit: Option<ExitResult>,
}
