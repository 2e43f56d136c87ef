//! Resource usage: an alloc's (`AllocResourceUsage`) and the node's (`HostStats`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Map;

/// `GET /v1/client/allocation/:id/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AllocResourceUsage {
    /// The tasks' sum.
    pub resource_usage: ResourceUsage,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub tasks: Map<TaskResourceUsage>,
    /// Nanoseconds since the epoch.
    pub timestamp: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TaskResourceUsage {
    /// `null`, as Nomad's is for every driver that does not report it.
    pub pids: Option<Map<Value>>,
    pub resource_usage: ResourceUsage,
    pub timestamp: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ResourceUsage {
    pub memory_stats: MemoryStats,
    pub cpu_stats: CpuStats,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub device_stats: Vec<Value>,
}

/// Bytes; `Measured` names the figures really read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MemoryStats {
    #[serde(rename = "RSS")]
    pub rss: u64,
    pub cache: u64,
    pub swap: u64,
    pub usage: u64,
    pub max_usage: u64,
    pub kernel_usage: u64,
    pub kernel_max_usage: u64,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub measured: Vec<String>,
}

/// Percents of one core; `Measured` names the figures really read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CpuStats {
    pub system_mode: f64,
    pub user_mode: f64,
    pub total_ticks: f64,
    pub throttled_periods: u64,
    pub throttled_time: u64,
    pub percent: f64,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub measured: Vec<String>,
}

/// `GET /v1/client/stats`: Nomad's `HostStats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HostStats {
    pub memory: HostMemoryStats,
    #[serde(rename = "CPU")]
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub cpu: Vec<HostCpuStats>,
    #[serde(rename = "CPUTicksConsumed")]
    pub cpu_ticks_consumed: f64,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub disk_stats: Vec<HostDiskStats>,
    pub alloc_dir_stats: HostDiskStats,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub device_stats: Vec<Value>,
    /// Seconds since boot.
    pub uptime: u64,
    /// Nanoseconds since the epoch.
    pub timestamp: u64,
}

/// Bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HostMemoryStats {
    pub total: u64,
    pub available: u64,
    pub free: u64,
    pub used: u64,
}

/// One core, in percent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HostCpuStats {
    #[serde(rename = "CPU")]
    pub cpu: String,
    pub user: f64,
    pub system: f64,
    pub idle: f64,
    pub total: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HostDiskStats {
    pub device: String,
    pub mountpoint: String,
    pub size: u64,
    pub used: u64,
    pub available: u64,
    pub used_percent: f64,
    pub inodes_used_percent: f64,
}
