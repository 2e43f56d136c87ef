//! What a task's cgroup says it used: memory now and at its peak, and CPU time so far.
//! Read by `cgroup`, turned into Nomad's `ResourceUsage` by the API. A part the node
//! cannot measure (no such controller, or a file the kernel lacks) is `None`, so the
//! answer can say what was really measured.

/// One reading of a task run's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub memory: Option<MemoryUsage>,
    pub cpu: Option<CpuTime>,
}

/// Bytes, as the memory controller counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Anonymous memory (v1 `rss`, v2 `anon`).
    pub rss: u64,
    /// Page cache (v1 `cache`, v2 `file`).
    pub cache: u64,
    /// Swapped out (v1 `swap` of `memory.stat`; v2 `memory.swap.current`).
    pub swap: u64,
    /// Everything charged now (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub usage: u64,
    /// The most ever charged (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`);
    /// `None` where the kernel keeps no peak.
    pub max_usage: Option<u64>,
}

/// CPU time consumed since the cgroup was made, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub total_ns: u64,
    pub user_ns: u64,
    pub system_ns: u64,
}
