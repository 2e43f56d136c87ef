//! What the node has in all (CPU, memory, the data dir's disk) and what its operator
//! keeps for it (`reserved`): the totals a node record carries, checked at start.

/// The size of the data dir's filesystem in MB, where allocs' disks live (0 when it
/// cannot be read: then disk is not counted).
fn data_dir_disk_mb(data_dir: &std::path::Path) -> u64 {
    rustix::fs::statvfs(data_dir).map_or(0, |stat| {
        stat.f_blocks.saturating_mul(stat.f_frsize) / berth_model::limits::MIB
    })
}

/// What the node has in all: CPU (MHz), memory and disk (MB), as a node record counts
/// them.
pub fn node_totals(data_dir: &std::path::Path) -> berth_model::limits::NodeResources {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    berth_model::limits::NodeResources {
        cpu_mhz: cores * crate::node::cpu_mhz_per_core(),
        memory_mb: berth_sys::cgroup::node_memory()
            .map(|bytes| bytes / berth_model::limits::MIB)
            .unwrap_or(0),
        disk_mb: data_dir_disk_mb(data_dir),
    }
}

/// A `reserved` block that keeps as much as the node has, or more, of something: no
/// alloc could ever be placed against what is left.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "reserved {{ {field} = {reserved} }} keeps all this node has: it has {total} {unit} of \
     {what} in all. Lower it in the agent config"
)]
pub struct ReservedTooLarge {
    pub field: &'static str,
    pub what: &'static str,
    pub unit: &'static str,
    pub reserved: u64,
    pub total: u64,
}

/// Refuses a `reserved` block that keeps all of the node's CPU, memory or disk (where
/// the node's total is known).
pub fn check_reserved(
    reserved: berth_model::limits::NodeResources,
    totals: berth_model::limits::NodeResources,
) -> Result<(), ReservedTooLarge> {
    let dimensions = [
        ("cpu", "CPU", "MHz", reserved.cpu_mhz, totals.cpu_mhz),
        (
            "memory",
            "memory",
            "MB",
            reserved.memory_mb,
            totals.memory_mb,
        ),
        (
            "disk",
            "disk in its data dir's filesystem",
            "MB",
            reserved.disk_mb,
            totals.disk_mb,
        ),
    ];
    for (field, what, unit, reserved, total) in dimensions {
        if total > 0 && reserved >= total {
            return Err(ReservedTooLarge {
                field,
                what,
                unit,
                reserved,
                total,
            });
        }
    }
    Ok(())
}

/// A core's speed as `/proc/cpuinfo` gives it (Nomad's fingerprint reads the same),
/// 1000 MHz when it does not say.
#[cfg(test)]
mod tests {
    use super::*;
    use berth_model::limits::NodeResources;

    #[test]
    fn a_reserved_block_that_keeps_all_the_node_has_is_refused_naming_it() {
        let totals = NodeResources {
            cpu_mhz: 4000,
            memory_mb: 24_000,
            disk_mb: 250_000,
        };
        let fits = NodeResources {
            cpu_mhz: 500,
            memory_mb: 1024,
            disk_mb: 10_000,
        };
        assert_eq!(check_reserved(fits, totals), Ok(()));
        let error = check_reserved(
            NodeResources {
                memory_mb: 30_000,
                ..fits
            },
            totals,
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "reserved { memory = 30000 } keeps all this node has: it has 24000 MB of memory in \
             all. Lower it in the agent config"
        );
        assert!(
            check_reserved(
                NodeResources {
                    disk_mb: 250_000,
                    ..fits
                },
                totals
            )
            .is_err()
        );
        // A total the node could not read is not checked.
        assert_eq!(
            check_reserved(
                NodeResources {
                    disk_mb: 1 << 30,
                    ..fits
                },
                NodeResources {
                    disk_mb: 0,
                    ..totals
                }
            ),
            Ok(())
        );
    }
}
