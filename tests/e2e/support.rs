//! Shared fixtures: a runtime with a shared component cache, task directories, mounts
//! that clean up after themselves, and the Python driver built with componentize-py.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use berth_model::driver::TaskRequest;
use berth_model::mount::{HandedMount, Propagation};
use berth_runtime::driver::{Driver, DriverOrigin};
use berth_runtime::{Runtime, RuntimeConfig, SandboxLimits};

/// The component cache the tests share. It exists when this returns, so a symlink to it
/// (agents in their own data dirs) never dangles.
pub fn cache_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn runtime() -> Runtime {
    Runtime::with_processes(RuntimeConfig::new(Some(cache_dir())), processes()).unwrap()
}

/// A process table whose tasks are started by `berth-keeper`, as the agent's are.
pub fn processes() -> std::sync::Arc<berth_sys::process::ProcessTable> {
    std::sync::Arc::new(
        berth_sys::process::ProcessTable::default()
            .supervised_by(PathBuf::from(env!("CARGO_BIN_EXE_berth-keeper"))),
    )
}

/// A runtime with a short call deadline and a small memory cap, for hostile guests.
pub fn strict_runtime(deadline: Duration, memory_max: usize) -> Runtime {
    let mut config = RuntimeConfig::new(Some(cache_dir()));
    config.limits = SandboxLimits {
        call_deadline: deadline,
        memory_max,
    };
    Runtime::with_processes(config, processes()).unwrap()
}

pub async fn builtin(runtime: &Runtime, name: &str) -> Driver {
    let bytes = berth_builtin::DRIVERS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1;
    Driver::load(runtime, DriverOrigin::Builtin, bytes)
        .await
        .unwrap()
}

pub async fn from_file(runtime: &Runtime, path: &str) -> Driver {
    Driver::load_file(runtime, Path::new(path)).await.unwrap()
}

/// A task directory with log files, removed on drop.
pub struct TaskDir {
    pub dir: tempfile::TempDir,
}

impl TaskDir {
    pub fn new() -> TaskDir {
        TaskDir {
            dir: tempfile::Builder::new()
                .prefix("berth-e2e-")
                .tempdir_in("/tmp")
                .unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Named as the agent names them (`<task>.<stream>.0`): the log collector rotates
    /// from there.
    pub fn stdout(&self) -> PathBuf {
        self.path().join("t.stdout.0")
    }

    pub fn stderr(&self) -> PathBuf {
        self.path().join("t.stderr.0")
    }

    pub fn read_stdout(&self) -> String {
        std::fs::read_to_string(self.stdout()).unwrap_or_default()
    }

    pub fn read_stderr(&self) -> String {
        std::fs::read_to_string(self.stderr()).unwrap_or_default()
    }

    pub fn request(
        &self,
        name: &str,
        config: serde_json::Value,
        mounts: Vec<HandedMount>,
    ) -> TaskRequest {
        TaskRequest {
            logs: Default::default(),
            id: format!("alloc-1/{name}"),
            name: name.into(),
            alloc_id: "alloc-1".into(),
            job_name: "e2e".into(),
            group_name: "g".into(),
            config: config.to_string(),
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("GREETING".into(), "hello".into()),
            ],
            task_dir: self.path().to_path_buf(),
            mounts,
            stdout: self.stdout(),
            stderr: self.stderr(),
            privileged: false,
            user: None,
            allow_unconfined: false,
            cgroup_procs: Vec::new(),
            collector_cgroup_procs: Vec::new(),
        }
    }

    /// A request for a driver the operator allowed to run tasks unconfined (raw_exec
    /// enabled, or `allow_unconfined` in its plugin block).
    pub fn unconfined_request(&self, name: &str, config: serde_json::Value) -> TaskRequest {
        TaskRequest {
            allow_unconfined: true,
            ..self.request(name, config, Vec::new())
        }
    }
}

pub fn mount(host: &Path, task: &str, read_only: bool, propagation: Propagation) -> HandedMount {
    HandedMount {
        host_path: host.to_path_buf(),
        task_path: task.into(),
        read_only,
        propagation,
        allow_setuid: false,
        source_below: None,
    }
}

/// Mounts the test made on the host, unmounted (detached) in reverse order on drop, so
/// a failing assertion leaves nothing behind.
#[derive(Default)]
pub struct HostMounts {
    mounted: Vec<PathBuf>,
}

impl HostMounts {
    /// Makes `dir` a mount point of its own in a new shared peer group, as a volume
    /// source for host-to-task and bidirectional propagation must be.
    pub fn make_shared(&mut self, dir: &Path) {
        rustix::mount::mount_bind(dir, dir).unwrap();
        self.mounted.push(dir.to_path_buf());
        rustix::mount::mount_change(dir, rustix::mount::MountPropagationFlags::SHARED).unwrap();
    }

    pub fn tmpfs(&mut self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        rustix::mount::mount(
            "tmpfs",
            dir,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .unwrap();
        self.mounted.push(dir.to_path_buf());
    }

    /// An empty tmpfs nobody can write, not even root.
    pub fn read_only_tmpfs(&mut self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        rustix::mount::mount(
            "tmpfs",
            dir,
            "tmpfs",
            rustix::mount::MountFlags::RDONLY,
            None,
        )
        .unwrap();
        self.mounted.push(dir.to_path_buf());
    }

    /// Records a mount that appeared on the host by propagation, so it is cleaned up too.
    pub fn adopt(&mut self, dir: &Path) {
        self.mounted.push(dir.to_path_buf());
    }
}

impl Drop for HostMounts {
    fn drop(&mut self) {
        for dir in self.mounted.iter().rev() {
            let _ = rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

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
        let _ = rustix::mount::unmount(&mount.mount_point, rustix::mount::UnmountFlags::DETACH);
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

/// The Python driver (`tests/fixtures/py-driver`), built once per test run with
/// componentize-py. Fails with a clear message when componentize-py is missing: CI
/// installs it (`.ci/run`), so its absence is a broken setup, not a skip.
pub fn python_driver() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    componentize_py(
        &BUILT,
        "wit/driver",
        "berth:driver/plugin@0.2.0",
        "tests/fixtures/py-driver",
        "pyexec.wasm",
    )
}

/// The Python policy hook (`examples/hooks/py-deny-list`), built like the driver.
pub fn python_hook() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    componentize_py(
        &BUILT,
        "wit/hook",
        "berth:hook/hook@0.1.0",
        "examples/hooks/py-deny-list",
        "deny_list.wasm",
    )
}

fn componentize_py(
    built: &Mutex<Option<PathBuf>>,
    wit: &str,
    world: &str,
    source: &str,
    name: &str,
) -> PathBuf {
    let mut built = built.lock().unwrap();
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let output = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = std::process::Command::new("componentize-py")
        .arg("-d")
        .arg(repo.join("wit/host"))
        .arg("-d")
        .arg(repo.join(wit))
        .args(["-w", world, "componentize", "--python-path"])
        .arg(repo.join(source))
        .arg("app")
        .arg("-o")
        .arg(&output)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("componentize-py is needed to build the Python components: pip install componentize-py==0.25.1");
    assert!(status.success(), "componentize-py failed to build {source}");
    *built = Some(output.clone());
    output
}

/// Removes the dynamic user id leases (`/run/berth/dynamic-users/<id>`) the agent of
/// `data_dir` held: its tasks are gone, and another agent would take them over anyway
/// once the data dir is.
pub fn remove_user_id_leases(data_dir: &std::path::Path) {
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
