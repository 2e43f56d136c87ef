//! Nomad's resource usage endpoints on berth: what an alloc's tasks use, read from
//! their cgroups, and what the node uses, read from `/proc` and the data dir's
//! filesystem. Both need a token of scope `read`.
//!
//! | method | path | answer |
//! |---|---|---|
//! | GET | `/v1/client/allocation/:alloc_id/stats` | Nomad's `AllocResourceUsage`: `ResourceUsage` (the tasks' sum), `Tasks` (per running task), `Timestamp` |
//! | GET | `/v1/client/stats` | Nomad's `HostStats`: `Memory`, `CPU` (per core), `CPUTicksConsumed`, `DiskStats` and `AllocDirStats` (the data dir's filesystem), `Uptime`, `Timestamp` |
//!
//! CPU shares need two readings: each answer takes them [`SAMPLE_WINDOW`] apart, so a
//! percentage is of that window (Nomad's client keeps a reading per second instead).
//!
//! `Measured` lists what was really read. What stays 0, and why:
//! - memory `KernelUsage` and `KernelMaxUsage`: berth does not read the kernel memory
//!   counters; `MaxUsage` is 0 (and not listed) on a v2 kernel without `memory.peak`;
//! - CPU `ThrottledPeriods` and `ThrottledTime`: berth sets CPU shares, not quotas, so
//!   a task is never throttled;
//! - CPU `TotalTicks` and the host's `CPUTicksConsumed` where `/proc/cpuinfo` gives no
//!   `cpu MHz` (some virtual machines, arm64);
//! - a task's `Pids`: null, as Nomad's is for every driver that does not report it;
//! - a task that is not running has no entry in `Tasks`; its cgroup is gone.

use std::collections::BTreeMap;
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use berth_nomad_api::stats::{
    AllocResourceUsage, CpuStats, HostCpuStats, HostDiskStats, HostMemoryStats, HostStats,
    MemoryStats, ResourceUsage, TaskResourceUsage,
};

use super::NomadError;
use berth_client::agent::Agent;
use berth_model::usage::{CgroupUsage, CpuTime};

/// The time between the two readings of a CPU share.
pub const SAMPLE_WINDOW: Duration = Duration::from_millis(100);

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// `GET /v1/client/allocation/:alloc_id/stats`.
pub async fn alloc_stats(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<axum::Json<AllocResourceUsage>, NomadError> {
    let alloc = agent.alloc(&id)?;
    let runner = agent
        .alloc_runner(&alloc.id)
        .ok_or_else(|| NomadError(StatusCode::NOT_FOUND, "alloc not found".into()))?;
    let reader = runner.clone();
    let first = read_usage(move || reader.task_usage()).await?;
    let started = Instant::now();
    tokio::time::sleep(SAMPLE_WINDOW).await;
    let second = read_usage(move || runner.task_usage()).await?;
    let window = started.elapsed();
    let mhz = cpu_mhz();
    let timestamp = now_nanos();
    let mut tasks = BTreeMap::new();
    let mut sum = TaskFigures::default();
    for (task, now) in &second {
        let before = first.get(task).copied().unwrap_or_default();
        let figures = TaskFigures::of(before, *now, window, mhz);
        sum.add(&figures);
        tasks.insert(
            task.clone(),
            TaskResourceUsage {
                pids: None,
                resource_usage: figures.resource_usage(),
                timestamp,
            },
        );
    }
    Ok(axum::Json(AllocResourceUsage {
        resource_usage: sum.resource_usage(),
        tasks,
        timestamp,
    }))
}

async fn read_usage(
    read: impl FnOnce() -> BTreeMap<String, CgroupUsage> + Send + 'static,
) -> Result<BTreeMap<String, CgroupUsage>, NomadError> {
    tokio::task::spawn_blocking(read).await.map_err(|error| {
        NomadError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the tasks' cgroups: {error}"),
        )
    })
}

/// One task's figures in Nomad's units, or the sum of several.
#[derive(Debug, Default, Clone, PartialEq)]
struct TaskFigures {
    rss: u64,
    cache: u64,
    swap: u64,
    usage: u64,
    max_usage: u64,
    memory_measured: Vec<&'static str>,
    /// Percent of one core over the window, as Nomad's `Percent`.
    percent: f64,
    user_percent: f64,
    system_percent: f64,
    total_ticks: f64,
    cpu_measured: Vec<&'static str>,
}

impl TaskFigures {
    fn of(before: CgroupUsage, now: CgroupUsage, window: Duration, mhz: Option<f64>) -> Self {
        let mut figures = TaskFigures::default();
        if let Some(memory) = now.memory {
            figures.rss = memory.rss;
            figures.cache = memory.cache;
            figures.swap = memory.swap;
            figures.usage = memory.usage;
            figures.memory_measured = vec!["RSS", "Cache", "Swap", "Usage"];
            if let Some(max) = memory.max_usage {
                figures.max_usage = max;
                figures.memory_measured.push("Max Usage");
            }
        }
        if let (Some(before), Some(now)) = (before.cpu, now.cpu) {
            let (percent, user, system) = cpu_percents(before, now, window);
            figures.percent = percent;
            figures.user_percent = user;
            figures.system_percent = system;
            figures.cpu_measured = vec!["System Mode", "User Mode", "Percent"];
            if let Some(mhz) = mhz {
                figures.total_ticks = percent / 100.0 * mhz;
                figures.cpu_measured.push("Total Ticks");
            }
        }
        figures
    }

    fn add(&mut self, other: &TaskFigures) {
        self.rss += other.rss;
        self.cache += other.cache;
        self.swap += other.swap;
        self.usage += other.usage;
        self.max_usage += other.max_usage;
        self.percent += other.percent;
        self.user_percent += other.user_percent;
        self.system_percent += other.system_percent;
        self.total_ticks += other.total_ticks;
        for name in &other.memory_measured {
            if !self.memory_measured.contains(name) {
                self.memory_measured.push(name);
            }
        }
        for name in &other.cpu_measured {
            if !self.cpu_measured.contains(name) {
                self.cpu_measured.push(name);
            }
        }
    }

    fn resource_usage(&self) -> ResourceUsage {
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        ResourceUsage {
            memory_stats: MemoryStats {
                rss: self.rss,
                cache: self.cache,
                swap: self.swap,
                usage: self.usage,
                max_usage: self.max_usage,
                kernel_usage: 0,
                kernel_max_usage: 0,
                measured: names(&self.memory_measured),
            },
            cpu_stats: CpuStats {
                system_mode: self.system_percent,
                user_mode: self.user_percent,
                total_ticks: self.total_ticks,
                throttled_periods: 0,
                throttled_time: 0,
                percent: self.percent,
                measured: names(&self.cpu_measured),
            },
            device_stats: Vec::new(),
        }
    }
}

/// Total, user and system CPU as percents of one core over `window`.
fn cpu_percents(before: CpuTime, now: CpuTime, window: Duration) -> (f64, f64, f64) {
    let window_ns = window.as_nanos().max(1) as f64;
    let share = |from: u64, to: u64| to.saturating_sub(from) as f64 / window_ns * 100.0;
    (
        share(before.total_ns, now.total_ns),
        share(before.user_ns, now.user_ns),
        share(before.system_ns, now.system_ns),
    )
}

/// The first core's clock, from `/proc/cpuinfo`; `None` where it does not say.
fn cpu_mhz() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    parse_cpu_mhz(&text)
}

fn parse_cpu_mhz(cpuinfo: &str) -> Option<f64> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "cpu MHz")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// `GET /v1/client/stats`.
pub async fn host_stats(
    State(agent): State<Arc<Agent>>,
) -> Result<axum::Json<HostStats>, NomadError> {
    let first = read_proc_stat().await?;
    tokio::time::sleep(SAMPLE_WINDOW).await;
    let second = read_proc_stat().await?;
    let data_dir = agent.data_dir().to_path_buf();
    let alloc_dir = data_dir.join("allocs");
    let (memory, uptime, disk, alloc_disk) = tokio::task::spawn_blocking(move || {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
        let alloc_disk = if alloc_dir.is_dir() {
            disk_stats(&alloc_dir)
        } else {
            disk_stats(&data_dir)
        };
        (
            memory_stats(&meminfo),
            parse_uptime(&uptime),
            disk_stats(&data_dir),
            alloc_disk,
        )
    })
    .await
    .map_err(|error| {
        NomadError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the node's figures: {error}"),
        )
    })?;
    let cores = core_percents(&first, &second);
    let mhz = cpu_mhz();
    let ticks: f64 = mhz.map_or(0.0, |mhz| {
        cores.iter().map(|core| core.total / 100.0 * mhz).sum()
    });
    let cpu = cores
        .iter()
        .map(|core| HostCpuStats {
            cpu: core.name.clone(),
            user: core.user,
            system: core.system,
            idle: core.idle,
            total: core.total,
        })
        .collect();
    Ok(axum::Json(HostStats {
        memory,
        cpu,
        cpu_ticks_consumed: ticks,
        disk_stats: vec![disk],
        alloc_dir_stats: alloc_disk,
        device_stats: Vec::new(),
        uptime,
        timestamp: now_nanos(),
    }))
}

async fn read_proc_stat() -> Result<String, NomadError> {
    tokio::fs::read_to_string("/proc/stat")
        .await
        .map_err(|error| {
            NomadError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading /proc/stat: {error}"),
            )
        })
}

/// `Total`, `Available`, `Free` and `Used` bytes from `/proc/meminfo`.
fn memory_stats(meminfo: &str) -> HostMemoryStats {
    let kib = |key: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
            * 1024
    };
    let total = kib("MemTotal");
    let available = kib("MemAvailable");
    HostMemoryStats {
        total,
        available,
        free: kib("MemFree"),
        used: total.saturating_sub(available),
    }
}

/// Whole seconds since boot, from `/proc/uptime`.
fn parse_uptime(text: &str) -> u64 {
    text.split_whitespace()
        .next()
        .and_then(|seconds| seconds.parse::<f64>().ok())
        .map_or(0, |seconds| seconds as u64)
}

/// One core's time split over the window, in percent.
#[derive(Debug, Clone, PartialEq)]
struct CorePercents {
    name: String,
    user: f64,
    system: f64,
    idle: f64,
    total: f64,
}

/// The `cpuN` lines of `/proc/stat`: name, user (with nice), system (with irq and
/// softirq), idle (with iowait), and all their ticks.
fn core_ticks(stat: &str) -> Vec<(String, u64, u64, u64, u64)> {
    stat.lines()
        .filter(|line| line.starts_with("cpu") && !line.starts_with("cpu "))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?.to_string();
            let ticks: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
            let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
            let user = at(0) + at(1);
            let system = at(2) + at(5) + at(6);
            let idle = at(3) + at(4);
            let all = ticks.iter().take(8).sum();
            Some((name, user, system, idle, all))
        })
        .collect()
}

fn core_percents(before: &str, now: &str) -> Vec<CorePercents> {
    let before = core_ticks(before);
    core_ticks(now)
        .into_iter()
        .map(|(name, user, system, idle, all)| {
            let earlier = before.iter().find(|core| core.0 == name);
            let (u0, s0, i0, a0) = earlier.map_or((0, 0, 0, 0), |c| (c.1, c.2, c.3, c.4));
            let span = all.saturating_sub(a0).max(1) as f64;
            let share = |to: u64, from: u64| to.saturating_sub(from) as f64 / span * 100.0;
            let idle = share(idle, i0);
            CorePercents {
                name,
                user: share(user, u0),
                system: share(system, s0),
                idle,
                total: (100.0 - idle).max(0.0),
            }
        })
        .collect()
}

/// Nomad's `DiskStats` of the filesystem holding `path`.
fn disk_stats(path: &FsPath) -> HostDiskStats {
    let Ok(stats) = rustix::fs::statvfs(path) else {
        return HostDiskStats::default();
    };
    let size = stats.f_blocks.saturating_mul(stats.f_frsize);
    let free = stats.f_bfree.saturating_mul(stats.f_frsize);
    let available = stats.f_bavail.saturating_mul(stats.f_frsize);
    let used = size.saturating_sub(free);
    let percent = |part: u64, whole: u64| {
        if whole == 0 {
            0.0
        } else {
            part as f64 / whole as f64 * 100.0
        }
    };
    let (device, mountpoint) = mount_of(path);
    HostDiskStats {
        device,
        mountpoint,
        size,
        used,
        available,
        used_percent: percent(used, used + available),
        inodes_used_percent: percent(stats.f_files.saturating_sub(stats.f_ffree), stats.f_files),
    }
}

/// The device and mount point of the mount holding `path` (the longest prefix).
fn mount_of(path: &FsPath) -> (String, String) {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    berth_sys::mount::mountinfo::read_self()
        .unwrap_or_default()
        .into_iter()
        .filter(|mount| path.starts_with(&mount.mount_point))
        .max_by_key(|mount| mount.mount_point.as_os_str().len())
        .map(|mount| (mount.source, mount.mount_point.display().to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_model::usage::MemoryUsage;

    #[test]
    fn a_task_that_used_half_a_core_shows_fifty_percent() {
        let cpu = |total_ns, user_ns, system_ns| CpuTime {
            total_ns,
            user_ns,
            system_ns,
        };
        let before = CgroupUsage {
            memory: None,
            cpu: Some(cpu(1_000_000_000, 800_000_000, 200_000_000)),
        };
        let now = CgroupUsage {
            memory: Some(MemoryUsage {
                rss: 10,
                cache: 20,
                swap: 0,
                usage: 30,
                max_usage: None,
            }),
            cpu: Some(cpu(1_050_000_000, 840_000_000, 210_000_000)),
        };
        let figures = TaskFigures::of(before, now, Duration::from_millis(100), Some(2000.0));
        assert_eq!(figures.percent, 50.0);
        assert_eq!(figures.user_percent, 40.0);
        assert_eq!(figures.system_percent, 10.0);
        assert_eq!(figures.total_ticks, 1000.0);
        assert_eq!(figures.memory_measured, ["RSS", "Cache", "Swap", "Usage"]);
        let usage = figures.resource_usage();
        assert_eq!(usage.memory_stats.max_usage, 0);
        assert_eq!(usage.cpu_stats.measured[3], "Total Ticks");
    }

    #[test]
    fn reads_the_hosts_proc_files() {
        let before = "cpu  1 1 1 1 0 0 0 0\ncpu0 100 0 50 850 0 0 0 0\nintr 5\n";
        let now = "cpu  1 1 1 1 0 0 0 0\ncpu0 130 0 60 910 0 0 0 0\n";
        let cores = core_percents(before, now);
        assert_eq!(
            cores,
            [CorePercents {
                name: "cpu0".into(),
                user: 30.0,
                system: 10.0,
                idle: 60.0,
                total: 40.0,
            }]
        );
        let memory = memory_stats("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n");
        assert_eq!(memory.used, 600 * 1024);
        assert_eq!(parse_uptime("193520.57 380000.00\n"), 193520);
        assert_eq!(
            parse_cpu_mhz("processor : 0\ncpu MHz\t\t: 2596.128\n"),
            Some(2596.128)
        );
        assert_eq!(parse_cpu_mhz("processor : 0\n"), None);
    }
}
