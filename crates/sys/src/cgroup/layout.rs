//! Where a node's cgroup controllers are, and which files a task's cgroup needs, for
//! both hierarchies. Pure: it reads nothing itself, so the v1 and v2 logic is tested on
//! any machine.
//!
//! - **cgroup v2** (one tree): controllers are enabled for children through
//!   `cgroup.subtree_control` of each ancestor; a task's cgroup has `memory.max`,
//!   `cpu.weight`, `pids.max`, its OOM kills in `memory.events`, and `cgroup.kill`.
//! - **cgroup v1** (a mount per controller): the task has one directory per controller,
//!   `memory.limit_in_bytes`, `cpu.shares`, `pids.max`, a `devices` whitelist, and its
//!   OOM kills in `memory.oom_control`.
//!
//! A node that mounts both (the hybrid layout of systemd's default) is used as v1 unless
//! its v2 tree holds the memory controller.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::mount::mountinfo::MountEntry;
use berth_model::limits::{TaskLimits, cpu_weight};

/// The controllers berth limits tasks with.
pub const NEEDED: &[&str] = &["memory", "cpu", "pids"];

/// The v1 controllers the kernel knows; other words in a cgroup mount's super options
/// (`rw`, `name=systemd`, `nsroot=…`) are not controllers.
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// The device numbers a confined task may use: its `/dev` (null, zero, full, random,
/// urandom, tty), `/dev/ptmx` and its pseudo-terminals.
pub const ALLOWED_DEVICES: &[&str] = &[
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v2: one tree at `root`, with the controllers its `cgroup.controllers` lists.
    Unified {
        root: PathBuf,
        controllers: Vec<String>,
    },
    /// cgroup v1: each controller at its mount point (co-mounted ones share a path).
    Legacy {
        controllers: BTreeMap<String, PathBuf>,
    },
}

impl Layout {
    /// The layout from the mount table. `read_controllers` reads a v2 tree's
    /// `cgroup.controllers`. `None`: no cgroup filesystem is mounted at all.
    pub fn detect(
        mounts: &[MountEntry],
        read_controllers: impl Fn(&Path) -> Option<String>,
    ) -> Option<Layout> {
        let unified = mounts.iter().find(|m| m.fs_type == "cgroup2").map(|m| {
            let controllers: Vec<String> = read_controllers(&m.mount_point)
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect();
            Layout::Unified {
                root: m.mount_point.clone(),
                controllers,
            }
        });
        if let Some(Layout::Unified { controllers, .. }) = &unified
            && controllers.iter().any(|c| c == "memory")
        {
            return unified;
        }
        let mut legacy = BTreeMap::new();
        for mount in mounts.iter().filter(|m| m.fs_type == "cgroup") {
            for option in mount.super_options.split(',') {
                if V1_CONTROLLERS.contains(&option) {
                    legacy
                        .entry(option.to_string())
                        .or_insert_with(|| mount.mount_point.clone());
                }
            }
        }
        if legacy.is_empty() {
            unified
        } else {
            Some(Layout::Legacy {
                controllers: legacy,
            })
        }
    }

    /// Whether `controller` is available to berth.
    pub fn has(&self, controller: &str) -> bool {
        match self {
            Layout::Unified { controllers, .. } => controllers.iter().any(|c| c == controller),
            Layout::Legacy { controllers } => controllers.contains_key(controller),
        }
    }

    /// The needed controllers this layout lacks.
    pub fn missing(&self) -> Vec<&'static str> {
        NEEDED.iter().copied().filter(|c| !self.has(c)).collect()
    }

    /// For messages: `cgroup v1 (cpu, memory, pids at /sys/fs/cgroup/<controller>)`.
    pub fn describe(&self) -> String {
        match self {
            Layout::Unified { root, controllers } => format!(
                "cgroup v2 at {} (controllers: {})",
                root.display(),
                if controllers.is_empty() {
                    "none".to_string()
                } else {
                    controllers.join(", ")
                }
            ),
            Layout::Legacy { controllers } => format!(
                "cgroup v1 ({})",
                controllers
                    .iter()
                    .map(|(name, at)| format!("{name} at {}", at.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// Where one task's usage is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageFiles {
    /// No cgroup (a node without cgroups where the operator allowed it).
    None,
    /// v1: the task's directory under the memory and the cpuacct mounts, where present.
    Legacy {
        memory: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    /// v2: the task's one directory; `memory` when the tree has that controller.
    Unified { dir: PathBuf, memory: bool },
}

/// One file write of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub file: PathBuf,
    pub value: String,
    /// A write that may fail without failing the task (swap limits where the kernel
    /// does not account swap).
    pub best_effort: bool,
}

/// Everything a task's cgroup is: what to create, write, join, read and remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Shared parents, created when missing and never removed.
    pub parents: Vec<PathBuf>,
    /// The task's own directories (one per v1 mount, or one v2 directory), removed last.
    pub dirs: Vec<PathBuf>,
    /// In order; v2's `subtree_control` of the parents first.
    pub writes: Vec<Write>,
    /// The `cgroup.procs` files a process writes itself into.
    pub procs: Vec<PathBuf>,
    /// The file and key counting the task's OOM kills.
    pub oom_kills: Option<(PathBuf, &'static str)>,
    /// v2's `cgroup.kill`: kills everything in the cgroup at once.
    pub kill: Option<PathBuf>,
    /// Where what the task used is read (alloc stats).
    pub usage: UsageFiles,
}

impl Plan {
    /// No cgroup at all: nothing to create, join, read or remove.
    pub fn empty() -> Plan {
        Plan {
            parents: Vec::new(),
            dirs: Vec::new(),
            writes: Vec::new(),
            procs: Vec::new(),
            oom_kills: None,
            kill: None,
            usage: UsageFiles::None,
        }
    }
}

fn write(file: PathBuf, value: impl ToString) -> Write {
    Write {
        file,
        value: value.to_string(),
        best_effort: false,
    }
}

/// The plan for the task cgroup `name` under `parent`.
pub fn plan(layout: &Layout, parent: &str, name: &str, limits: &TaskLimits) -> Plan {
    match layout {
        Layout::Unified { root, controllers } => {
            unified_plan(root, controllers, parent, name, limits)
        }
        Layout::Legacy { controllers } => legacy_plan(controllers, parent, name, limits),
    }
}

fn unified_plan(
    root: &Path,
    controllers: &[String],
    parent: &str,
    name: &str,
    limits: &TaskLimits,
) -> Plan {
    let dir = root.join(parent).join(name);
    let parent_dir = dir.parent().unwrap_or(root).to_path_buf();
    let has = |c: &str| controllers.iter().any(|have| have == c);
    let mut writes = Vec::new();
    // Every level from the root down to the task's parent (the job's cgroup among them)
    // hands the controllers down.
    let mut ancestors = vec![root.to_path_buf()];
    if let Ok(below_root) = parent_dir.strip_prefix(root) {
        let mut at = root.to_path_buf();
        for part in below_root.components() {
            at.push(part);
            ancestors.push(at.clone());
        }
    }
    for ancestor in &ancestors {
        for controller in NEEDED.iter().filter(|c| has(c)) {
            writes.push(write(
                ancestor.join("cgroup.subtree_control"),
                format!("+{controller}"),
            ));
        }
    }
    if has("memory") {
        writes.push(write(dir.join("memory.max"), limits.memory_bytes));
        if let Some(soft) = limits.memory_soft_bytes {
            writes.push(write(dir.join("memory.low"), soft));
        }
        writes.push(Write {
            best_effort: true,
            ..write(dir.join("memory.swap.max"), 0)
        });
    }
    if has("cpu") {
        writes.push(write(dir.join("cpu.weight"), cpu_weight(limits.cpu_shares)));
    }
    if has("pids") {
        writes.push(write(dir.join("pids.max"), limits.pids_max));
    }
    Plan {
        parents: vec![parent_dir],
        procs: vec![dir.join("cgroup.procs")],
        oom_kills: has("memory").then(|| (dir.join("memory.events"), "oom_kill")),
        kill: Some(dir.join("cgroup.kill")),
        usage: UsageFiles::Unified {
            dir: dir.clone(),
            memory: has("memory"),
        },
        dirs: vec![dir],
        writes,
    }
}

fn legacy_plan(
    controllers: &BTreeMap<String, PathBuf>,
    parent: &str,
    name: &str,
    limits: &TaskLimits,
) -> Plan {
    let mut plan = Plan::empty();
    // `cpuacct` limits nothing: it counts the task's CPU time for its stats.
    let mut used = vec!["memory", "cpu", "cpuacct", "pids"];
    if limits.restrict_devices {
        used.push("devices");
    }
    for controller in used {
        let Some(mount) = controllers.get(controller) else {
            continue;
        };
        let dir = mount.join(parent).join(name);
        if !plan.dirs.contains(&dir) {
            plan.parents
                .push(dir.parent().unwrap_or(mount).to_path_buf());
            plan.procs.push(dir.join("cgroup.procs"));
            plan.dirs.push(dir.clone());
        }
        match controller {
            "memory" => {
                plan.writes.push(write(
                    dir.join("memory.limit_in_bytes"),
                    limits.memory_bytes,
                ));
                if let Some(soft) = limits.memory_soft_bytes {
                    plan.writes
                        .push(write(dir.join("memory.soft_limit_in_bytes"), soft));
                }
                // After the memory limit: memory+swap may never be below it.
                plan.writes.push(Write {
                    best_effort: true,
                    ..write(dir.join("memory.memsw.limit_in_bytes"), limits.memory_bytes)
                });
                plan.oom_kills = Some((dir.join("memory.oom_control"), "oom_kill"));
            }
            "cpu" => plan
                .writes
                .push(write(dir.join("cpu.shares"), limits.cpu_shares)),
            "pids" => plan
                .writes
                .push(write(dir.join("pids.max"), limits.pids_max)),
            "devices" => {
                plan.writes.push(write(dir.join("devices.deny"), "a"));
                for device in ALLOWED_DEVICES {
                    plan.writes.push(write(dir.join("devices.allow"), device));
                }
            }
            _ => {}
        }
    }
    let dir_under = |controller: &str| {
        let mount = controllers.get(controller)?;
        Some(mount.join(parent).join(name))
    };
    plan.usage = UsageFiles::Legacy {
        memory: dir_under("memory"),
        cpuacct: dir_under("cpuacct"),
    };
    plan
}

/// A cgroup like a task's, with no limit of its own (the log collectors of an alloc):
/// what its ancestors limit, it is counted in.
pub fn unlimited_plan(layout: &Layout, parent: &str, name: &str) -> Plan {
    let nothing = TaskLimits {
        memory_bytes: 0,
        memory_soft_bytes: None,
        cpu_shares: 0,
        pids_max: 0,
        restrict_devices: false,
    };
    let mut plan = plan(layout, parent, name, &nothing);
    let dirs = plan.dirs.clone();
    plan.writes
        .retain(|write| !dirs.iter().any(|dir| write.file.starts_with(dir)));
    plan
}

/// The directory of cgroup `name` under `parent` in the pids hierarchy, if any.
pub fn pids_dir(layout: &Layout, parent: &str, name: &str) -> Option<PathBuf> {
    match layout {
        Layout::Unified { root, controllers } => controllers
            .iter()
            .any(|c| c == "pids")
            .then(|| root.join(parent).join(name)),
        Layout::Legacy { controllers } => Some(controllers.get("pids")?.join(parent).join(name)),
    }
}

/// The `pids.max` of `parent`, the cgroup holding every task's, for the node-wide
/// ceiling on tasks' processes: the directory to create and the writes (v2 enables the
/// pids controller for the root's children first). `None` without a pids controller.
pub fn all_tasks_pids_plan(
    layout: &Layout,
    parent: &str,
    pids_max: u64,
) -> Option<(PathBuf, Vec<Write>)> {
    match layout {
        Layout::Unified { root, controllers } => {
            if !controllers.iter().any(|c| c == "pids") {
                return None;
            }
            let dir = root.join(parent);
            let mut writes = vec![write(root.join("cgroup.subtree_control"), "+pids")];
            writes.push(write(dir.join("pids.max"), pids_max));
            Some((dir, writes))
        }
        Layout::Legacy { controllers } => {
            let dir = controllers.get("pids")?.join(parent);
            let writes = vec![write(dir.join("pids.max"), pids_max)];
            Some((dir, writes))
        }
    }
}

/// The default node-wide ceiling on tasks' processes: the host's `pid_max` less a reserve
/// for everything else on the host (at least 4,096, or a quarter of `pid_max`, whichever
/// is larger), so tasks together cannot take the last pids the host needs.
pub fn default_all_tasks_pids(pid_max: u64) -> u64 {
    let reserve = (pid_max / 4).max(4096);
    pid_max.saturating_sub(reserve).max(8)
}

/// The value of `key` in a flat keyed file (`memory.events`, `memory.oom_control`).
pub fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::mountinfo;

    #[test]
    fn the_node_wide_ceiling_leaves_the_host_a_reserve() {
        assert_eq!(default_all_tasks_pids(32_768), 24_576);
        assert_eq!(default_all_tasks_pids(4_194_304), 3_145_728);
        // A small pid_max keeps its 4,096 reserve.
        assert_eq!(default_all_tasks_pids(12_000), 7_904);
        assert_eq!(default_all_tasks_pids(100), 8);
        let legacy = Layout::Legacy {
            controllers: [("pids".to_string(), PathBuf::from("/sys/fs/cgroup/pids"))].into(),
        };
        let (dir, writes) = all_tasks_pids_plan(&legacy, "berth", 100).unwrap();
        assert_eq!(dir, Path::new("/sys/fs/cgroup/pids/berth"));
        assert_eq!(writes, vec![write(dir.join("pids.max"), 100)]);
        let unified = Layout::Unified {
            root: "/sys/fs/cgroup".into(),
            controllers: vec!["pids".into()],
        };
        let (dir, writes) = all_tasks_pids_plan(&unified, "a/b", 7).unwrap();
        assert_eq!(dir, Path::new("/sys/fs/cgroup/a/b"));
        assert_eq!(writes.last().unwrap(), &write(dir.join("pids.max"), 7));
        let no_pids = Layout::Unified {
            root: "/sys/fs/cgroup".into(),
            controllers: vec![],
        };
        assert!(all_tasks_pids_plan(&no_pids, "berth", 7).is_none());
    }

    const HYBRID: &str = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices
";

    const PURE_V2: &str = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";

    fn limits(restrict_devices: bool) -> TaskLimits {
        TaskLimits {
            memory_bytes: 64 << 20,
            memory_soft_bytes: None,
            cpu_shares: 500,
            pids_max: 128,
            restrict_devices,
        }
    }

    fn files(plan: &Plan) -> Vec<String> {
        plan.writes
            .iter()
            .map(|w| format!("{} = {}", w.file.display(), w.value))
            .collect()
    }

    #[test]
    fn a_hybrid_node_is_used_as_v1_with_its_co_mounted_controllers() {
        let layout =
            Layout::detect(&mountinfo::parse(HYBRID), |_| Some("hugetlb\n".into())).unwrap();
        let Layout::Legacy { controllers } = &layout else {
            panic!("{layout:?}");
        };
        assert_eq!(controllers["cpu"], Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(
            controllers["cpuacct"],
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert!(!controllers.contains_key("name=systemd"));
        assert!(layout.missing().is_empty());
    }

    #[test]
    fn a_v2_tree_with_the_memory_controller_wins() {
        let layout = Layout::detect(&mountinfo::parse(PURE_V2), |root| {
            assert_eq!(root, Path::new("/sys/fs/cgroup"));
            Some("cpuset cpu io memory pids\n".into())
        })
        .unwrap();
        assert_eq!(
            layout,
            Layout::Unified {
                root: "/sys/fs/cgroup".into(),
                controllers: ["cpuset", "cpu", "io", "memory", "pids"]
                    .map(String::from)
                    .to_vec(),
            }
        );
    }

    #[test]
    fn a_v2_tree_without_pids_says_what_is_missing() {
        let layout =
            Layout::detect(&mountinfo::parse(PURE_V2), |_| Some("cpu memory".into())).unwrap();
        assert_eq!(layout.missing(), vec!["pids"]);
        assert!(Layout::detect(&[], |_| None).is_none());
    }

    #[test]
    fn v1_plan_writes_each_controller_in_its_own_mount() {
        let layout = Layout::detect(&mountinfo::parse(HYBRID), |_| None).unwrap();
        let plan = plan(&layout, "berth", "a1.web", &limits(true));
        assert_eq!(
            plan.dirs,
            [
                "/sys/fs/cgroup/memory/berth/a1.web",
                "/sys/fs/cgroup/cpu,cpuacct/berth/a1.web",
                "/sys/fs/cgroup/pids/berth/a1.web",
                "/sys/fs/cgroup/devices/berth/a1.web",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(plan.procs.len(), 4);
        let files = files(&plan);
        assert_eq!(
            files[..4],
            [
                "/sys/fs/cgroup/memory/berth/a1.web/memory.limit_in_bytes = 67108864",
                "/sys/fs/cgroup/memory/berth/a1.web/memory.memsw.limit_in_bytes = 67108864",
                "/sys/fs/cgroup/cpu,cpuacct/berth/a1.web/cpu.shares = 500",
                "/sys/fs/cgroup/pids/berth/a1.web/pids.max = 128",
            ]
        );
        assert_eq!(
            files[4],
            "/sys/fs/cgroup/devices/berth/a1.web/devices.deny = a"
        );
        assert!(
            files.contains(&"/sys/fs/cgroup/devices/berth/a1.web/devices.allow = c 1:3 rwm".into())
        );
        assert!(
            !files.iter().any(|f| f.contains("c 8:")),
            "no block device is allowed"
        );
        assert_eq!(
            plan.oom_kills,
            Some((
                "/sys/fs/cgroup/memory/berth/a1.web/memory.oom_control".into(),
                "oom_kill"
            ))
        );
        assert_eq!(plan.kill, None);
    }

    #[test]
    fn v1_plan_leaves_devices_alone_for_privileged_tasks() {
        let layout = Layout::detect(&mountinfo::parse(HYBRID), |_| None).unwrap();
        let plan = plan(&layout, "berth", "a1.csi", &limits(false));
        assert!(
            !plan
                .dirs
                .iter()
                .any(|d| d.starts_with("/sys/fs/cgroup/devices"))
        );
    }

    #[test]
    fn v2_plan_enables_controllers_down_the_tree_then_limits() {
        let layout = Layout::Unified {
            root: "/sys/fs/cgroup".into(),
            controllers: ["memory", "cpu", "pids"].map(String::from).to_vec(),
        };
        let soft = TaskLimits {
            memory_soft_bytes: Some(32 << 20),
            ..limits(true)
        };
        let plan = plan(&layout, "berth", "a1.web", &soft);
        assert_eq!(plan.dirs, [PathBuf::from("/sys/fs/cgroup/berth/a1.web")]);
        assert_eq!(
            files(&plan),
            [
                "/sys/fs/cgroup/cgroup.subtree_control = +memory",
                "/sys/fs/cgroup/cgroup.subtree_control = +cpu",
                "/sys/fs/cgroup/cgroup.subtree_control = +pids",
                "/sys/fs/cgroup/berth/cgroup.subtree_control = +memory",
                "/sys/fs/cgroup/berth/cgroup.subtree_control = +cpu",
                "/sys/fs/cgroup/berth/cgroup.subtree_control = +pids",
                "/sys/fs/cgroup/berth/a1.web/memory.max = 67108864",
                "/sys/fs/cgroup/berth/a1.web/memory.low = 33554432",
                "/sys/fs/cgroup/berth/a1.web/memory.swap.max = 0",
                "/sys/fs/cgroup/berth/a1.web/cpu.weight = 19",
                "/sys/fs/cgroup/berth/a1.web/pids.max = 128",
            ]
        );
        assert!(plan.writes.iter().filter(|w| w.best_effort).count() == 1);
        assert_eq!(
            plan.oom_kills,
            Some((
                "/sys/fs/cgroup/berth/a1.web/memory.events".into(),
                "oom_kill"
            ))
        );
        assert_eq!(
            plan.kill,
            Some("/sys/fs/cgroup/berth/a1.web/cgroup.kill".into())
        );
    }

    #[test]
    fn a_task_in_its_jobs_level_hands_the_controllers_down_through_it() {
        let layout = Layout::Unified {
            root: "/sys/fs/cgroup".into(),
            controllers: ["pids"].map(String::from).to_vec(),
        };
        let plan = plan(&layout, "berth", "job-web/a1.t", &limits(true));
        assert_eq!(
            plan.parents,
            [PathBuf::from("/sys/fs/cgroup/berth/job-web")]
        );
        assert_eq!(
            files(&plan),
            [
                "/sys/fs/cgroup/cgroup.subtree_control = +pids",
                "/sys/fs/cgroup/berth/cgroup.subtree_control = +pids",
                "/sys/fs/cgroup/berth/job-web/cgroup.subtree_control = +pids",
                "/sys/fs/cgroup/berth/job-web/a1.t/pids.max = 128",
            ]
        );
        let legacy = Layout::detect(&mountinfo::parse(HYBRID), |_| None).unwrap();
        let legacy_plan = super::plan(&legacy, "berth", "job-web/a1.t", &limits(false));
        assert!(
            legacy_plan
                .parents
                .iter()
                .all(|p| p.ends_with("berth/job-web") && p.starts_with("/sys/fs/cgroup")),
            "{:?}",
            legacy_plan.parents
        );
        assert_eq!(
            pids_dir(&legacy, "berth", "job-web"),
            Some(PathBuf::from("/sys/fs/cgroup/pids/berth/job-web"))
        );
    }

    #[test]
    fn the_collectors_cgroup_has_no_limit_of_its_own() {
        for layout in [
            Layout::detect(&mountinfo::parse(HYBRID), |_| None).unwrap(),
            Layout::Unified {
                root: "/sys/fs/cgroup".into(),
                controllers: ["memory", "cpu", "pids"].map(String::from).to_vec(),
            },
        ] {
            let plan = unlimited_plan(&layout, "berth", "job-web/a1-logs");
            assert!(!plan.dirs.is_empty());
            assert!(
                plan.writes
                    .iter()
                    .all(|w| w.file.ends_with("cgroup.subtree_control")),
                "{:?}",
                files(&plan)
            );
            assert!(
                !plan
                    .dirs
                    .iter()
                    .any(|d| d.starts_with("/sys/fs/cgroup/devices"))
            );
        }
    }

    #[test]
    fn reads_oom_kill_counts_in_both_formats() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
        let v2 = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed_value(v1, "oom_kill"), Some(1));
        assert_eq!(keyed_value(v2, "oom_kill"), Some(2));
        assert_eq!(keyed_value("oom_kill x\n", "oom_kill"), None);
        assert_eq!(keyed_value("", "oom_kill"), None);
    }
}
