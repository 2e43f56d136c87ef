//! `berth agent` in its own process on a free port, with a data dir and a host volume,
//! driven through the HTTP API and the CLI. Dropping it kills the agent, every task
//! process chrooted below its dir, and unmounts whatever is left below it, so a failed
//! test leaks nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_api::client::{Client, ClientError};
use berth_api::{AgentSelf, SubmitRequest};
use berth_client::agent::Submitted;
use berth_client::alloc_runner::AllocStatus;
use berth_model::status::ClientStatus;
use berth_state::catalog::{PluginStatus, VolumeStatus};

use crate::{binaries, cleanup};

/// A data dir, a host volume, and (while running) an agent process on a free port.
pub struct AgentProcess {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    runs: u32,
    /// `berth agent -dev` with an open TCP listener (most tests), or a production agent
    /// driven through its Unix socket.
    dev: bool,
    /// A file the agent inherits open, without close-on-exec, as descriptor
    /// [`AgentProcess::INHERITED_FD`] (as a careless parent would leave it).
    inherited: Option<PathBuf>,
    open_files_soft: Option<u64>,
}

impl AgentProcess {
    pub fn new() -> AgentProcess {
        Self::with_config("")
    }

    /// An agent whose config has `extra` after its host volume.
    pub fn with_config(extra: &str) -> AgentProcess {
        Self::build(|_, _| extra.to_string(), true)
    }

    /// A production agent (no `-dev`): its API is the Unix socket in the data dir, plus
    /// whatever the `http` block that `extra(port, dir)` writes asks for.
    pub fn production(extra: impl FnOnce(u16, &Path) -> String) -> AgentProcess {
        Self::build(extra, false)
    }

    fn build(extra: impl FnOnce(u16, &Path) -> String, dev: bool) -> AgentProcess {
        let dir = tempfile::Builder::new()
            .prefix("berth-e2e-agentproc")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::create_dir_all(dir.path().join("scratch")).unwrap();
        // Writable by the tasks that mount it: exec tasks run as nobody by default.
        std::fs::set_permissions(
            dir.path().join("scratch"),
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::os::unix::fs::symlink(
            binaries::component_cache(),
            dir.path().join("data/component-cache"),
        )
        .unwrap();
        // Below the ephemeral range: restarted on this port, the agent never finds it
        // taken by another test's outgoing connection.
        let port = berth_testkit::etcd::free_port();
        // The mock driver, which many tests run, is off unless the operator enables it.
        let config = format!(
            "host_volume \"scratch\" {{\n  path = \"{}/scratch\"\n}}\n\
             plugin \"mock\" {{\n  config {{\n    enabled = true\n  }}\n}}\n{}",
            dir.path().display(),
            extra(port, dir.path())
        );
        std::fs::write(dir.path().join("agent.hcl"), config).unwrap();
        AgentProcess {
            dir,
            port,
            child: None,
            runs: 0,
            dev,
            inherited: None,
            open_files_soft: None,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn socket(&self) -> PathBuf {
        self.path().join("data/api.sock")
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The operator's client: the Unix socket, as the CLI uses by default (a dev agent's
    /// open TCP listener is anyone's on the machine, and may not run plugin jobs).
    pub fn client(&self) -> Client {
        Client::unix(&self.socket())
    }

    pub fn log(&self, run: u32) -> PathBuf {
        self.path().join(format!("agent-{run}.log"))
    }

    /// The descriptor number of the file [`AgentProcess::inherit`] leaves open.
    pub const INHERITED_FD: i32 = 77;

    /// From the next start on, the agent inherits `path` open (read-write) as
    /// descriptor [`AgentProcess::INHERITED_FD`], without close-on-exec.
    pub fn inherit(&mut self, path: &Path) {
        self.inherited = Some(path.to_path_buf());
    }

    /// The running agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the agent is running").id()
    }

    /// From the next start on, the agent starts with this soft open-files limit (the hard
    /// one stays).
    pub fn open_files_limit(&mut self, soft: u64) {
        self.open_files_soft = Some(soft);
    }

    /// Starts the agent and waits until its API answers.
    pub async fn start(&mut self) -> AgentSelf {
        self.runs += 1;
        let log = std::fs::File::create(self.log(self.runs)).unwrap();
        let mut command = Command::new(binaries::berth());
        command
            .arg("--config")
            .arg(self.path().join("agent.hcl"))
            .arg("--data-dir")
            .arg(self.path().join("data"))
            .arg("agent");
        if self.dev {
            command
                .args(["-dev", "--http-addr"])
                .arg(format!("127.0.0.1:{}", self.port));
        }
        // Open until the spawn below has run the `pre_exec`.
        let mut _inherited = None;
        if let Some(path) = &self.inherited {
            use std::os::fd::AsRawFd as _;
            use std::os::unix::process::CommandExt as _;
            let file = std::fs::File::options()
                .read(true)
                .write(true)
                .open(path)
                .unwrap();
            // SAFETY: dup2(2) in the forked child; the file outlives the spawn below.
            unsafe {
                let fd = file.as_raw_fd();
                command.pre_exec(move || {
                    // dup2 leaves the new descriptor without close-on-exec.
                    if libc::dup2(fd, Self::INHERITED_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            _inherited = Some(file);
        }
        if let Some(soft) = self.open_files_soft {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: getrlimit(2) and setrlimit(2) on a local struct, in the forked child.
            unsafe {
                command.pre_exec(move || {
                    let mut limit: libc::rlimit = std::mem::zeroed();
                    if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    limit.rlim_cur = soft.min(limit.rlim_max);
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match self.client().get::<AgentSelf>("/v1/berth/agent/self").await {
                Ok(me) => return me,
                // Polled often: the restore bench times the start with this.
                Err(ClientError::Unreachable { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(error) => panic!("agent did not come up: {error}\n{}", self.output()),
            }
        }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(self.log(self.runs)).unwrap_or_default()
    }

    /// Asks the agent to stop (SIGTERM) and waits for its exit: how long it took, or
    /// `None` if it was still running after `within` (it is then killed).
    pub fn terminate(&mut self, within: Duration) -> Option<Duration> {
        let mut child = self.child.take().expect("the agent is running");
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        let asked = Instant::now();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        while asked.elapsed() < within {
            if child.try_wait().unwrap().is_some() {
                return Some(asked.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("the agent is running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let address = if self.dev {
            self.address()
        } else {
            format!("unix://{}", self.socket().display())
        };
        let output = Command::new(binaries::berth())
            .args(["--address", &address])
            .arg("--config")
            .arg(self.path().join("agent.hcl"))
            .arg("--data-dir")
            .arg(self.path().join("data"))
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8(output.stdout).unwrap(),
            String::from_utf8(output.stderr).unwrap(),
        )
    }

    pub async fn submit(&self, name: &str, source: &str) -> Result<Submitted, ClientError> {
        let request = SubmitRequest {
            source_name: name.to_string(),
            source: source.to_string(),
            variables: Default::default(),
        };
        self.client().post("/v1/berth/jobs", &request).await
    }

    pub async fn alloc(&self, id: &str) -> AllocStatus {
        self.client()
            .get(&format!("/v1/berth/allocation/{id}"))
            .await
            .unwrap()
    }

    /// Waits until the alloc has finished (complete or failed), and returns its status.
    pub async fn finished(&self, id: &str) -> AllocStatus {
        self.wait_alloc(id, "finished", |s| {
            matches!(
                s.client_status,
                ClientStatus::Complete | ClientStatus::Failed
            )
        })
        .await;
        self.alloc(id).await
    }

    /// Submits a job that must be accepted, and returns its first alloc's id.
    pub async fn run_job(&self, name: &str, source: &str) -> String {
        let submitted = self
            .submit(name, source)
            .await
            .unwrap_or_else(|e| panic!("submitting {name}: {e:?}\n{}", self.output()));
        submitted.alloc_ids[0].clone()
    }

    /// Writes `text` to the file `name` in the agent's dir, and returns its path.
    pub fn write_file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// What the task wrote to its first stdout log (empty before it wrote anything).
    pub fn task_stdout(&self, alloc: &str, task: &str) -> String {
        let path = self
            .path()
            .join("data/allocs")
            .join(alloc)
            .join(format!("alloc/logs/{task}.stdout.0"));
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// The CSI plugin `id`, if the agent knows it.
    pub async fn plugin(&self, id: &str) -> Option<PluginStatus> {
        let plugins: Vec<PluginStatus> = self.client().get("/v1/berth/plugins").await.unwrap();
        plugins.into_iter().find(|p| p.id == id)
    }

    /// Polls the CSI plugin `id` until `done` holds for it.
    pub async fn wait_plugin(
        &self,
        id: &str,
        what: &str,
        done: impl Fn(Option<&PluginStatus>) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let plugin = self.plugin(id).await;
            if done(plugin.as_ref()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "plugin {id} never got {what}: {plugin:#?}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The CSI volume `id` as the agent shows it.
    pub async fn volume(&self, id: &str) -> VolumeStatus {
        self.client()
            .get(&format!("/v1/berth/volume/{id}"))
            .await
            .unwrap()
    }

    /// Polls an alloc until `done` holds for it.
    pub async fn wait_alloc(&self, id: &str, what: &str, done: impl Fn(&AllocStatus) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.alloc(id).await;
            if done(&status) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "alloc never got to {what}: {status:#?}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Default for AgentProcess {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in cleanup::processes_rooted_under(self.path()) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(100));
        cleanup::remove_alloc_networks(&self.path().join("data"));
        // Cgroups first: they are found from the task dirs, which an alloc's disk image
        // holds until it is unmounted.
        cleanup::remove_task_cgroups(&self.path().join("data"));
        cleanup::unmount_everything_under(self.path());
        cleanup::remove_user_id_leases(&self.path().join("data"));
    }
}
