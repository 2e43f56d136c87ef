//! `cgroups { favor_dynmods = true }`: the kernel's `favordynmods` cgroup option, which
//! makes moving a process into a cgroup cheap, at the cost of slightly dearer forks and
//! exits node-wide.
//!
//! Without it, every write to `cgroup.procs` takes a node-wide lock whose writer waits
//! for an RCU grace period: measured on this project's 6.18 machines, 5 ms median and up to 17 ms per task start,
//! against 0.35 ms with the option (`cargo bench --bench alloc_start` shows the share
//! of a start). A node agent that gives every task a cgroup of its own is the workload
//! the option exists for. It is node-wide, so berth turns it on only when the operator
//! says so:
//!
//! - **cgroup v2**: the one cgroup2 superblock is reconfigured with its current options
//!   plus `favordynmods` (what `mount -o remount,favordynmods` does, without touching
//!   the mount's own flags).
//! - **cgroup v1**: an existing hierarchy cannot change its options, but the option is
//!   node-wide whichever hierarchy carries it, so berth mounts a hierarchy with no
//!   controller (`name=berth_favordynmods`) that carries it, under its data directory,
//!   and leaves it mounted: on kernels before 6.18 the effect lasts as long as such a
//!   hierarchy exists (from 6.18 it lasts until reboot: the kernel says "per
//!   threadgroup rwsem mechanism can't be disabled"). A restarted agent finds it and
//!   does nothing.
//!
//! Pure planning here; the syscalls are in [`crate::mount::cgroupfs`].

use std::path::{Path, PathBuf};

use super::layout::Layout;
use crate::mount::mountinfo::MountEntry;

/// The kernel's name of the option.
pub const OPTION: &str = "favordynmods";

/// The name of the controller-less v1 hierarchy that carries the option.
pub const NAMED_HIERARCHY: &str = "berth_favordynmods";

/// What turning the option on takes on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FavorStep {
    /// A cgroup hierarchy already carries it.
    Already { at: PathBuf },
    /// Reconfigure the cgroup2 superblock at `root`, keeping `options`.
    ReconfigureUnified { root: PathBuf, options: Vec<String> },
    /// Mount a controller-less v1 hierarchy that carries it at `target`.
    MountNamed { target: PathBuf },
}

impl std::fmt::Display for FavorStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FavorStep::Already { at } => {
                write!(f, "already on (the cgroup mount at {})", at.display())
            }
            FavorStep::ReconfigureUnified { root, .. } => {
                write!(
                    f,
                    "remount the cgroup2 tree at {} with {OPTION}",
                    root.display()
                )
            }
            FavorStep::MountNamed { target } => write!(
                f,
                "mount a controller-less cgroup v1 hierarchy \"{NAMED_HIERARCHY}\" with \
                 {OPTION} at {}",
                target.display()
            ),
        }
    }
}

/// The step for a node with `layout` and `mounts`; `keeper` is where the v1 hierarchy
/// goes.
pub fn plan(layout: &Layout, mounts: &[MountEntry], keeper: &Path) -> FavorStep {
    let is_cgroup = |m: &&MountEntry| m.fs_type == "cgroup" || m.fs_type == "cgroup2";
    if let Some(carrier) = mounts
        .iter()
        .filter(is_cgroup)
        .find(|m| m.super_options.split(',').any(|o| o == OPTION))
    {
        return FavorStep::Already {
            at: carrier.mount_point.clone(),
        };
    }
    match layout {
        Layout::Unified { root, .. } => FavorStep::ReconfigureUnified {
            root: root.clone(),
            options: mounts
                .iter()
                .find(|m| m.fs_type == "cgroup2" && &m.mount_point == root)
                .map(|m| {
                    m.super_options
                        .split(',')
                        .filter(|o| !o.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        },
        Layout::Legacy { .. } => FavorStep::MountNamed {
            target: keeper.to_path_buf(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::mountinfo::parse;
    use std::collections::BTreeMap;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate
31 23 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:6 - cgroup cgroup rw,memory
";

    fn legacy() -> Layout {
        Layout::Legacy {
            controllers: BTreeMap::from([("memory".into(), "/sys/fs/cgroup/memory".into())]),
        }
    }

    #[test]
    fn a_v1_node_gets_a_named_hierarchy_at_the_keeper() {
        let step = plan(&legacy(), &parse(HYBRID), Path::new("/data/cgroup-favor"));
        assert_eq!(
            step,
            FavorStep::MountNamed {
                target: "/data/cgroup-favor".into()
            }
        );
    }

    #[test]
    fn a_v2_node_is_reconfigured_keeping_its_options() {
        let mounts = parse(
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 \
             cgroup2 rw,nsdelegate,memory_recursiveprot\n",
        );
        let layout = Layout::Unified {
            root: "/sys/fs/cgroup".into(),
            controllers: vec!["memory".into()],
        };
        assert_eq!(
            plan(&layout, &mounts, Path::new("/unused")),
            FavorStep::ReconfigureUnified {
                root: "/sys/fs/cgroup".into(),
                options: vec![
                    "rw".into(),
                    "nsdelegate".into(),
                    "memory_recursiveprot".into()
                ],
            }
        );
    }

    #[test]
    fn any_hierarchy_carrying_the_option_means_nothing_to_do() {
        let text = format!(
            "{HYBRID}40 23 0:40 / /data/cgroup-favor rw,relatime shared:9 - cgroup cgroup \
             rw,favordynmods,name={NAMED_HIERARCHY}\n"
        );
        assert_eq!(
            plan(&legacy(), &parse(&text), Path::new("/elsewhere")),
            FavorStep::Already {
                at: "/data/cgroup-favor".into()
            }
        );
    }
}
