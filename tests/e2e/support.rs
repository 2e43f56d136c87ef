//! Shared fixtures: a runtime with a shared component cache, task directories, mounts
//! that clean up after themselves, and the Python driver built with componentize-py.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use berth_model::driver::TaskRequest;
use berth_model::mount::{HandedMount, Propagation};
use berth_runtime::driver::{Driver, DriverOrigin};
use berth_runtime::{Runtime, RuntimeConfig, SandboxLimits};

pub use berth_harness::binaries::component_cache as cache_dir;
pub use berth_harness::{processes, runtime};

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

/// A task directory with log files, removed on drop with the file a confined spawn
/// writes beside it (its mount refusals, outside the task's root).
pub struct TaskDir {
    pub dir: tempfile::TempDir,
}

impl Drop for TaskDir {
    fn drop(&mut self) {
        if let Some(beside) = berth_sys::alloc_dir::mount_refusals_beside(self.dir.path()) {
            let _ = std::fs::remove_file(beside);
        }
    }
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
            network_namespace: None,
            etc_files: Vec::new(),
            image_user_namespace: None,
            progress: None,
            own_network: None,
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

pub use berth_harness::cleanup::{
    host_mounts_under, host_mounts_under_besides_alloc_disks, host_pid_of, processes_rooted_under,
    remove_task_cgroups, unmount_everything_under,
};

/// The Python driver (`tests/fixtures/py-driver`), built once per test run with
/// componentize-py, against `berth:driver@0.2.0`: the suite's driver built before
/// `spawn-isolation`, as drivers people built then are. Fails with a clear message when
/// componentize-py is missing: CI installs it (`.ci/run`), so its absence is a broken
/// setup, not a skip.
pub fn python_driver() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    componentize_py(
        &BUILT,
        "wit/driver-0.2.0",
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

/// The JavaScript driver (`tests/fixtures/js-driver`), built once per test run with
/// componentize-js (`npm ci` in that directory; `.ci/test` does it), as its guide says.
pub fn js_driver() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap();
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let fixture = repo.join("tests/fixtures/js-driver");
    assert!(
        fixture
            .join("node_modules/@bytecodealliance/componentize-js")
            .is_dir(),
        "componentize-js is needed to build the JavaScript driver: npm ci --prefix {}",
        fixture.display()
    );
    let output = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("jsecho.wasm");
    let built_it = std::process::Command::new("node")
        .current_dir(&fixture)
        .arg("build.mjs")
        .arg(repo.join("wit"))
        .arg(&output)
        .output()
        .expect("node (Node.js 20) is needed to build the JavaScript driver");
    assert!(
        built_it.status.success(),
        "building the JavaScript driver failed:\n{}",
        String::from_utf8_lossy(&built_it.stderr)
    );
    *built = Some(output.clone());
    output
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
