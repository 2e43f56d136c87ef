//! What a killed agent leaves on the machine, found and removed: its tasks' processes,
//! their cgroups, the mounts below its dir, its dynamic user id leases, its bridge-mode
//! allocs' networks. An agent that
//! stops cleanly leaves none of these; a test that kills one (or fails halfway) calls
//! these so the next test starts on a clean machine.

use std::path::Path;

/// Processes whose root directory is `dir` or a directory below it: the tasks of an agent
/// whose data dir is there. A task's root is its own namespace's after `pivot_root`, so
/// the link `/proc/<pid>/root` reads `/`; what it leads to is the task dir itself (the
/// same device and inode), which is what is compared.
pub fn processes_rooted_under(dir: &Path) -> Vec<rustix::process::Pid> {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    // Task dirs sit at <agent>/data/allocs/<alloc>/<task>: five levels are enough.
    let mut roots = std::collections::HashSet::new();
    let mut pending = vec![(dir, 0)];
    while let Some((path, depth)) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        roots.insert((meta.dev(), meta.ino()));
        if depth == 5 {
            continue;
        }
        if let Ok(entries) = std::fs::read_dir(&path) {
            pending.extend(entries.flatten().map(|e| (e.path(), depth + 1)));
        }
    }
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let root = std::fs::metadata(entry.path().join("root"));
        if root.is_ok_and(|root| roots.contains(&(root.dev(), root.ino()))) {
            pids.extend(rustix::process::Pid::from_raw(pid));
        }
    }
    pids
}

/// The host pid of the process rooted under `dir` that is `ns_pid` in its own pid
/// namespace (what a task sees as `$$`).
pub fn host_pid_of(dir: &Path, ns_pid: u32) -> Option<u32> {
    processes_rooted_under(dir).into_iter().find_map(|pid| {
        let pid = pid.as_raw_nonzero().get() as u32;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))?
            .split_whitespace()
            .last()?
            .parse::<u32>()
            .ok()?;
        (inner == ns_pid).then_some(pid)
    })
}

/// Kills and removes the task cgroups of every alloc under `data_dir/allocs`: what an
/// agent killed mid-run (as tests do) leaves for its next start to clean up.
pub fn remove_task_cgroups(data_dir: &Path) {
    let cgroups = berth_sys::cgroup::Cgroups::detect(Default::default());
    let Ok(allocs) = std::fs::read_dir(data_dir.join("allocs")) else {
        return;
    };
    // Task cgroups are in their job's level, `job-<job>`: every job's is looked in.
    let jobs: Vec<String> = ["/sys/fs/cgroup/pids/berth", "/sys/fs/cgroup/berth"]
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            Some(name.strip_prefix("job-")?.to_string())
        })
        .collect();
    for alloc in allocs.flatten() {
        let alloc_id = alloc.file_name().to_string_lossy().into_owned();
        for job in &jobs {
            let name = berth_sys::cgroup::Cgroups::collectors_name(job, &alloc_id);
            let _ = cgroups.existing_collectors(&name).kill_and_remove();
        }
        // Task dirs are in `tasks/`; an alloc of the old layout has them at its root.
        let tasks = [alloc.path().join("tasks"), alloc.path()]
            .into_iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten();
        for (task, job) in tasks
            .flatten()
            .flat_map(|t| jobs.iter().map(move |j| (t.file_name(), j)))
        {
            let name =
                berth_sys::cgroup::Cgroups::task_name(job, &alloc_id, &task.to_string_lossy());
            let limits = berth_model::limits::TaskLimits {
                memory_bytes: 0,
                memory_soft_bytes: None,
                cpu_shares: 0,
                pids_max: 0,
                restrict_devices: true,
            };
            let _ = cgroups.existing(&name, &limits).kill_and_remove();
        }
    }
}

/// Detaches every mount below `dir`, deepest first.
pub fn unmount_everything_under(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    let mut mounts = host_mounts_under(&dir);
    mounts.reverse();
    for mount in mounts {
        let _ = berth_sys::mount::shared::unmount_all_below(&dir, &mount.mount_point);
    }
}

/// The mounts under `prefix` other than allocs' own filesystems (their `ephemeral_disk`
/// images at `<data>/allocs/<id>`, which stay until the alloc is collected).
pub fn host_mounts_under_besides_alloc_disks(
    prefix: &Path,
) -> Vec<berth_sys::mount::mountinfo::MountEntry> {
    host_mounts_under(prefix)
        .into_iter()
        .filter(|m| {
            !(m.fs_type == "ext4"
                && m.source.starts_with("/dev/loop")
                && m.mount_point
                    .parent()
                    .is_some_and(|p| p.ends_with("allocs")))
        })
        .collect()
}

/// Host mounts whose mount point starts with `prefix`.
pub fn host_mounts_under(prefix: &Path) -> Vec<berth_sys::mount::mountinfo::MountEntry> {
    berth_sys::mount::mountinfo::read_self()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(prefix))
        .collect()
}

/// Removes the dynamic user id leases (`/run/berth/dynamic-users/<id>`) the agent of
/// `data_dir` held: its tasks are gone, and another agent would take them over anyway
/// once the data dir is.
pub fn remove_user_id_leases(data_dir: &Path) {
    let data_dir = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let Ok(entries) = std::fs::read_dir("/run/berth/dynamic-users") else {
        return;
    };
    for entry in entries.flatten() {
        if std::fs::read_to_string(entry.path()).ok().as_deref() == data_dir.to_str() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The bridge networks of the allocs under `data_dir/allocs`, and their docker tasks'
/// own (`<alloc id>.<n>`): a killed agent leaves its running allocs' namespaces, as it
/// leaves their tasks. See [`remove_networks_of`].
pub fn remove_alloc_networks(data_dir: &Path) {
    let Ok(allocs) = std::fs::read_dir(data_dir.join("allocs")) else {
        return;
    };
    let allocs: Vec<String> = allocs
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    // A task's namespace or lease, by its name or holder.
    let settings = berth_client::config::BridgeSettings::default();
    let leases = Path::new("/var/lib/cni/networks").join(&settings.name);
    let names: Vec<String> = std::fs::read_dir(berth_sys::network::netns::NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .chain(
            std::fs::read_dir(&leases)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|lease| {
                    let holder = std::fs::read_to_string(lease.path()).ok()?;
                    Some(holder.lines().next()?.trim().to_string())
                }),
        )
        .collect();
    let mut ids = allocs.clone();
    for alloc in &allocs {
        let task = format!("{alloc}.");
        ids.extend(names.iter().filter(|n| n.starts_with(&task)).cloned());
    }
    ids.sort();
    ids.dedup();
    remove_networks_of(&ids);
}

/// Detaches the allocs `ids` from the default bridge (CNI DEL, given the address
/// host-local leased each, which the firewall plugin's DEL needs) and removes their
/// namespaces, as the agent's own release does.
pub fn remove_networks_of(ids: &[String]) {
    use berth_sys::network::cni::{Attachment, Cni, bridge_network, leased_result};
    use berth_sys::network::netns::{NETNS_DIR, NetNs};
    let settings = berth_client::config::BridgeSettings::default();
    let cni = Cni::new(&settings.cni_path);
    let list = bridge_network(
        &settings.name,
        &settings.name,
        &settings.subnet,
        "NOMAD-ADMIN",
    );
    // portmap's DEL does nothing without a mapping; with any, it removes the alloc's
    // chains by their names (its id's).
    let any_mapping = [berth_sys::network::cni::PortMapping {
        host_port: 1,
        container_port: 1,
        protocol: "tcp".into(),
        host_ip: None,
    }];
    for id in ids {
        let namespace = NetNs::existing(id);
        let path = Path::new(NETNS_DIR).join(id);
        let attachment = Attachment {
            container_id: id,
            netns: &path,
            ifname: "eth0",
            port_mappings: &any_mapping,
        };
        if namespace.is_none() && leased_result(&list, &attachment).is_none() {
            continue;
        }
        // Without the ADD's result, DEL takes the one the lease says.
        let _ = cni.del(&list, &attachment, None);
        if let Some(namespace) = namespace {
            let _ = namespace.remove();
        }
    }
}
