//! Reading what a task's cgroup used, for Nomad's alloc stats: memory from the memory
//! controller, CPU time from `cpuacct` (v1) or `cpu.stat` (v2). The parsing is pure and
//! tested on both formats; [`read`] does the file reads.
//!
//! | | cgroup v1 | cgroup v2 |
//! |---|---|---|
//! | RSS, cache, swap | `memory.stat`: `rss`, `cache`, `swap` | `memory.stat`: `anon`, `file`; `memory.swap.current` |
//! | usage, max usage | `memory.usage_in_bytes`, `memory.max_usage_in_bytes` | `memory.current`, `memory.peak` (5.19+) |
//! | CPU | `cpuacct.usage`, `cpuacct.usage_user`, `cpuacct.usage_sys` (or `cpuacct.stat`) | `cpu.stat`: `usage_usec`, `user_usec`, `system_usec` |

use std::path::{Path, PathBuf};

use super::layout::UsageFiles;
use berth_model::usage::{CgroupUsage, CpuTime, MemoryUsage};

/// The kernel's `USER_HZ`, the unit of v1 `cpuacct.stat`: 100 on every Linux ABI.
const USER_HZ_NS: u64 = 10_000_000;

/// Reads the task's usage now. A file that is missing or unreadable (the task's run
/// ended, an older kernel) leaves its part `None` (or its field 0).
pub fn read(files: &UsageFiles) -> CgroupUsage {
    let text = |path: PathBuf| std::fs::read_to_string(path).ok();
    let number = |path: PathBuf| text(path).and_then(|t| t.trim().parse::<u64>().ok());
    match files {
        UsageFiles::None => CgroupUsage::default(),
        UsageFiles::Legacy { memory, cpuacct } => CgroupUsage {
            memory: memory.as_deref().and_then(|dir| {
                let usage = number(dir.join("memory.usage_in_bytes"))?;
                let stat = text(dir.join("memory.stat"))?;
                Some(legacy_memory(
                    &stat,
                    usage,
                    number(dir.join("memory.max_usage_in_bytes")),
                ))
            }),
            cpu: cpuacct.as_deref().and_then(|dir: &Path| {
                let total_ns = number(dir.join("cpuacct.usage"))?;
                let split = match (
                    number(dir.join("cpuacct.usage_user")),
                    number(dir.join("cpuacct.usage_sys")),
                ) {
                    (Some(user), Some(system)) => (user, system),
                    _ => legacy_cpu_ticks(&text(dir.join("cpuacct.stat")).unwrap_or_default()),
                };
                Some(CpuTime {
                    total_ns,
                    user_ns: split.0,
                    system_ns: split.1,
                })
            }),
        },
        UsageFiles::Unified { dir, memory } => CgroupUsage {
            memory: memory
                .then(|| {
                    let usage = number(dir.join("memory.current"))?;
                    let stat = text(dir.join("memory.stat"))?;
                    Some(unified_memory(
                        &stat,
                        usage,
                        number(dir.join("memory.peak")),
                        number(dir.join("memory.swap.current")).unwrap_or(0),
                    ))
                })
                .flatten(),
            cpu: text(dir.join("cpu.stat")).and_then(|stat| unified_cpu(&stat)),
        },
    }
}

/// v1 `memory.stat` with the usage files beside it.
pub fn legacy_memory(stat: &str, usage: u64, max_usage: Option<u64>) -> MemoryUsage {
    let key = |name| super::layout::keyed_value(stat, name).unwrap_or(0);
    MemoryUsage {
        rss: key("rss"),
        cache: key("cache"),
        swap: key("swap"),
        usage,
        max_usage,
    }
}

/// v1 `cpuacct.stat` (user and system in `USER_HZ` ticks) as nanoseconds.
pub fn legacy_cpu_ticks(stat: &str) -> (u64, u64) {
    let key = |name| super::layout::keyed_value(stat, name).unwrap_or(0);
    (
        key("user").saturating_mul(USER_HZ_NS),
        key("system").saturating_mul(USER_HZ_NS),
    )
}

/// v2 `memory.stat` with the usage files beside it.
pub fn unified_memory(stat: &str, usage: u64, peak: Option<u64>, swap: u64) -> MemoryUsage {
    let key = |name| super::layout::keyed_value(stat, name).unwrap_or(0);
    MemoryUsage {
        rss: key("anon"),
        cache: key("file"),
        swap,
        usage,
        max_usage: peak,
    }
}

/// v2 `cpu.stat` (microseconds); `None` without `usage_usec`.
pub fn unified_cpu(stat: &str) -> Option<CpuTime> {
    let key = |name| super::layout::keyed_value(stat, name);
    let micros = |value: u64| value.saturating_mul(1_000);
    Some(CpuTime {
        total_ns: micros(key("usage_usec")?),
        user_ns: micros(key("user_usec").unwrap_or(0)),
        system_ns: micros(key("system_usec").unwrap_or(0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_v1_memory_and_cpu() {
        let stat = "cache 15101952\nrss 6221824\nrss_huge 0\nswap 4096\ntotal_rss 99\n";
        assert_eq!(
            legacy_memory(stat, 21_000_000, Some(30_000_000)),
            MemoryUsage {
                rss: 6_221_824,
                cache: 15_101_952,
                swap: 4096,
                usage: 21_000_000,
                max_usage: Some(30_000_000),
            }
        );
        assert_eq!(
            legacy_cpu_ticks("user 250\nsystem 4\n"),
            (2_500_000_000, 40_000_000)
        );
    }

    #[test]
    fn reads_v2_memory_and_cpu() {
        let stat = "anon 1486848\nfile 1744896\nkernel 0\n";
        let memory = unified_memory(stat, 4_000_000, None, 0);
        assert_eq!(
            (memory.rss, memory.cache, memory.max_usage),
            (1_486_848, 1_744_896, None)
        );
        let cpu = unified_cpu("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n").unwrap();
        assert_eq!(
            (cpu.total_ns, cpu.user_ns, cpu.system_ns),
            (1_500_000, 1_000_000, 500_000)
        );
        assert_eq!(unified_cpu("nr_periods 0\n"), None);
    }
}
