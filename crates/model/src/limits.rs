//! What a task may use of the node: the limits its cgroup enforces, and the operator's
//! settings for task cgroups. Plain data: the cgroupfs files live in `cgroup/`.

/// A task's limits, from its `resources` block and the agent config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// The hard memory limit in bytes (`memory_max` when set, else `memory`); the
    /// kernel OOM-kills the task past it.
    pub memory_bytes: u64,
    /// With `memory_max` set, `memory` becomes the soft limit (reclaimed first).
    pub memory_soft_bytes: Option<u64>,
    /// CPU shares, from `cpu` in MHz as Nomad maps them (at least 2).
    pub cpu_shares: u64,
    /// The most processes and threads the task may have at once.
    pub pids_max: u64,
    /// Only the harmless character devices (the task's `/dev`), for confined tasks.
    pub restrict_devices: bool,
}

/// A node's resources: CPU in MHz, memory and disk in MB. What it has in all, what its
/// operator keeps for it (Nomad's client `reserved` block, the agent config's
/// `reserved`), and what allocs are placed against (the one less the other).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeResources {
    #[serde(default)]
    pub cpu_mhz: u64,
    #[serde(default)]
    pub memory_mb: u64,
    #[serde(default)]
    pub disk_mb: u64,
}

/// Nomad's resources count memory in MB meaning MiB (`memory = 256` is 256 × 2^20 bytes).
pub const MIB: u64 = 1 << 20;

/// The least memory a task may ask for, in MiB (Nomad's minimum).
pub const MIN_MEMORY_MB: u64 = 10;

/// The least CPU a task may ask for, in MHz (Nomad's minimum).
pub const MIN_CPU_MHZ: u64 = 1;

/// The operator's settings for task cgroups (`cgroups { ... }` in the agent config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSettings {
    /// The cgroup, under each hierarchy's root, that holds every task's cgroup.
    pub parent: String,
    /// `pids.max` of every task.
    pub pids_max: u64,
    /// `pids.max` of the parent: the processes of all tasks together. `None`: the host's
    /// `pid_max` less a reserve (`berth_sys::cgroup::layout::default_all_tasks_pids`).
    pub all_tasks_pids_max: Option<u64>,
    /// `pids.max` of each job's cgroup (`<parent>/job-<name>`): the processes of all of
    /// one job's tasks and log collectors together, so one job cannot take the node's
    /// ceiling from the others. `None`: half of the node-wide ceiling.
    pub job_pids_max: Option<u64>,
    /// Start tasks even when the node lacks a controller berth needs (memory, cpu,
    /// pids): the task then runs without that limit, and an event says so.
    pub allow_missing_controllers: bool,
    /// Turn on the kernel's node-wide `favordynmods` at agent start, so that putting a
    /// task in its cgroup does not wait for an RCU grace period
    /// (`berth_sys::cgroup::favor`).
    pub favor_dynmods: bool,
}

impl Default for CgroupSettings {
    fn default() -> Self {
        CgroupSettings {
            parent: "berth".into(),
            pids_max: 4096,
            all_tasks_pids_max: None,
            job_pids_max: None,
            allow_missing_controllers: false,
            favor_dynmods: false,
        }
    }
}

/// What one listener allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// Connections at once from one address (Nomad's `http_max_conns_per_client`), so
    /// one client cannot take them all.
    pub max_connections_per_client: usize,
    /// Of `max_connections`, how many are kept for connections whose first request
    /// carries a valid token (at most half of them): whoever holds the rest, a token
    /// holder is answered. The Unix socket keeps none (it asks for no token).
    pub reserved_for_tokens: usize,
    pub header_timeout: std::time::Duration,
    pub idle_timeout: std::time::Duration,
}

impl ConnectionLimits {
    /// The TCP listener's defaults.
    pub const TCP: ConnectionLimits = ConnectionLimits {
        max_connections: 1024,
        max_connections_per_client: 100,
        reserved_for_tokens: 64,
        header_timeout: std::time::Duration::from_secs(10),
        idle_timeout: std::time::Duration::from_secs(60),
    };
    /// The Unix socket's own: only its owner (and its group) can connect.
    pub const SOCKET: ConnectionLimits = ConnectionLimits {
        max_connections: 256,
        // A Unix socket's peers have no address: the socket's limit is theirs.
        max_connections_per_client: 256,
        reserved_for_tokens: 0,
        header_timeout: std::time::Duration::from_secs(10),
        idle_timeout: std::time::Duration::from_secs(60),
    };
}

/// `cpu.shares` for `cpu` MHz, as Nomad sets it (the kernel's minimum is 2).
pub fn cpu_shares(cpu_mhz: u64) -> u64 {
    cpu_mhz.clamp(2, 262_144)
}

/// cgroup v2's `cpu.weight` for v1 shares, by the kernel's documented mapping (the one
/// runc and Nomad use): 2 → 1, 1024 → 39, 262144 → 10000.
pub fn cpu_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_follow_the_kernel_mapping() {
        assert_eq!(cpu_weight(2), 1);
        assert_eq!(cpu_weight(1024), 39);
        assert_eq!(cpu_weight(262_144), 10_000);
        assert_eq!(cpu_weight(0), 1);
        assert_eq!(cpu_weight(u64::MAX), 10_000);
    }

    #[test]
    fn shares_never_fall_below_the_kernel_minimum() {
        assert_eq!(cpu_shares(0), 2);
        assert_eq!(cpu_shares(500), 500);
    }
}
