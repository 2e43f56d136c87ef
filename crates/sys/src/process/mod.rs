//! Processes the host runs for drivers: spawn (optionally confined: namespaces, a
//! chroot, a cgroup, dropped capabilities, a seccomp filter), supervise, signal, and
//! adopt again after an agent restart.
//!
//! The agent never forks: a task is started by `berth-keeper` ([`keeper`]), which runs
//! the task's spawn plan ([`spawn_plan`], where the steps are drawn) and becomes its shim
//! ([`shim`], for why a task is three processes). Every step that fails is named in the
//! error.
//!
//! Reaping blocks no thread per task: every child and adopted process is watched
//! through a pidfd registered with the reactor. Every process is addressed by a
//! [`ProcessRef`] (pid + start time), and signals go through a pidfd, so a recycled pid
//! is never signalled by mistake.

pub mod confine;
pub mod dynamic_users;
pub mod enter;
mod host_ids;
pub mod image_user;
pub mod isolation;
pub mod keeper;
pub mod logmon;
pub mod mount_warden;
mod open_files;
pub mod seccomp;
pub mod session;
pub mod shim;
pub mod spawn_plan;
pub mod user_namespace;
pub mod users;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::sync::watch;

use crate::mount::MountStep;
use berth_model::mount::Propagation;
use isolation::ChrootSpec;
use spawn_plan::SpawnPlan;

pub use berth_model::driver::ProcessRef;
pub use open_files::raise_open_files_limit;

/// How a process ended. Both fields are `None` for an adopted process, whose status
/// only its real parent could collect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// What to run and where.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    /// The whole environment; nothing is inherited.
    pub env: Vec<(String, String)>,
    pub isolation: Isolation,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// The output goes through pipes to a log collector (`berth-keeper
    /// __task-logmon`) that rotates the files.
    pub logs: berth_model::driver::LogRotation,
    /// Runs as this user, from before the seccomp filter on (the kernel then clears its
    /// capabilities).
    pub user: Option<users::TaskUser>,
    /// The task's own user namespace (a task on an image): it runs as its user inside,
    /// and `user` is then its ids on the host.
    pub user_namespace: Option<user_namespace::UserNamespace>,
    /// The capabilities a confined task keeps, in place of its confinement's
    /// (`CapabilitySet` bits): a task on an image whose job changed them, within
    /// [`confine::IMAGE_TASK_CAPABILITIES`].
    pub capabilities: Option<u64>,
    /// The `cgroup.procs` files of the task's cgroup: the process joins them first, so
    /// everything it does and forks is limited and accounted.
    pub cgroup_procs: Vec<PathBuf>,
    /// The `cgroup.procs` files of the alloc's log collectors' cgroup: the task's log
    /// collector is moved there as soon as it is spawned, so that it is counted in the
    /// job's pids share and removed with the alloc, never left in the agent's cgroup.
    pub collector_cgroup_procs: Vec<PathBuf>,
    /// The group's network namespace (`/run/netns/<alloc>`), which the task joins before
    /// anything else of its confinement: `None` keeps it in the agent's (the host's).
    pub network_namespace: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub enum Isolation {
    /// The host's namespace, in `cwd`.
    None { cwd: PathBuf },
    /// A new mount namespace, chrooted.
    Chroot(ChrootSpec),
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("preparing the task's filesystem: {0}")]
    Prepare(io::Error),
    #[error("opening {} to join the task's cgroup: {source}", path.display())]
    Cgroup { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Seccomp(#[from] seccomp::FilterError),
    #[error("opening the group's network namespace {}: {source}", path.display())]
    NetworkNamespace { path: PathBuf, source: io::Error },
    #[error("creating the task's exit record: {0}")]
    ExitRecord(io::Error),
    #[error("no berth-keeper to start the task with (this process table was built without one)")]
    NoKeeper,
    #[error("starting the task's keeper {}: {source}", path.display())]
    Keeper { path: PathBuf, source: io::Error },
    #[error("opening the task's log file {path}: {source}")]
    LogFile { path: PathBuf, source: io::Error },
    #[error("setting up the task failed at step \"{step}\": {source}")]
    Setup { step: String, source: io::Error },
    #[error("starting {program:?}: {source}")]
    Exec { program: String, source: io::Error },
    #[error("process {0} is not known to this agent")]
    Unknown(u32),
    #[error("process {pid} belongs to driver {owner:?}")]
    NotOwner { pid: u32, owner: String },
    #[error("process {0} is gone or its pid was reused")]
    Gone(u32),
    #[error("unknown signal {0:?}")]
    UnknownSignal(String),
    #[error("signalling process {pid}: {source}")]
    Signal { pid: u32, source: io::Error },
    #[error("opening the task's namespace {}: {source}", path.display())]
    TaskNamespace { path: PathBuf, source: io::Error },
    #[error("reading the command's output: {source}")]
    Output { source: io::Error },
    #[error("the task's terminal multiplexer {}: {source}", path.display())]
    TaskTerminal { path: PathBuf, source: io::Error },
    #[error("{program:?} did not start inside the task within {after:?}")]
    StartTimedOut { program: String, after: Duration },
    #[error(
        "the task runs in the host's namespaces, unconfined, and berth runs commands only \
         inside confined tasks (or raw_exec's, which run any command their job names)"
    )]
    UnconfinedTask,
}

struct Tracked {
    owner: Arc<str>,
    /// `None` for a process that had already exited when it was adopted.
    pidfd: Option<Arc<OwnedFd>>,
    exit: watch::Receiver<Option<ExitStatus>>,
}

/// The processes this agent runs, by reference, with the driver that owns each.
#[derive(Default)]
pub struct ProcessTable {
    processes: Mutex<HashMap<ProcessRef, Tracked>>,
    /// Compiled at the first confined spawn.
    filter: OnceLock<seccomp::TaskFilter>,
    /// Compiled at the first spawn of a CSI plugin granted mounting.
    plugin_filter: OnceLock<seccomp::TaskFilter>,
    /// Where shims leave their task's exit record (`<pid>.<start time>`), for an agent
    /// that adopts the process after a restart. `None`: no records (tests, benches).
    exit_records: Option<PathBuf>,
    /// The binary that starts tasks and collects their logs ([`keeper`]). `None`: this
    /// table cannot spawn.
    keeper: Option<PathBuf>,
}

impl ProcessTable {
    /// A table whose processes leave exit records in `dir` (created 0700 when missing).
    pub fn with_exit_records(dir: PathBuf) -> ProcessTable {
        ProcessTable {
            exit_records: Some(dir),
            ..ProcessTable::default()
        }
    }

    /// The binary that starts tasks, becomes their shims and inits, and collects their
    /// logs: `berth-keeper`, or the agent's own binary, which answers the same hidden
    /// commands.
    pub fn supervised_by(self, keeper: PathBuf) -> ProcessTable {
        ProcessTable {
            keeper: Some(keeper),
            ..self
        }
    }

    /// Spawns `spec` for driver `owner`: starts `berth-keeper` on the task's spawn plan
    /// and returns once the task executes, or with the step that failed. Must be called
    /// within a tokio runtime.
    pub fn spawn(&self, owner: &Arc<str>, spec: &SpawnSpec) -> Result<ProcessRef, ProcessError> {
        let keeper = self.keeper.as_ref().ok_or(ProcessError::NoKeeper)?;
        let program = spec.argv.first().cloned().unwrap_or_default();
        let (before_fork, after_fork, pid_namespace) = match &spec.isolation {
            Isolation::None { cwd } => (
                vec![MountStep::Chdir {
                    dir: crate::mount::c_path(cwd).map_err(ProcessError::Prepare)?,
                }],
                Vec::new(),
                false,
            ),
            Isolation::Chroot(chroot) => {
                let plan = isolation::prepare(chroot).map_err(ProcessError::Prepare)?;
                (plan.before_fork, plan.after_fork, true)
            }
        };
        // Every isolated task is confined; a CSI plugin the operator granted mounting
        // keeps CAP_SYS_ADMIN, narrowed by its filter to bind mounts.
        let confine = match &spec.isolation {
            Isolation::None { .. } => None,
            Isolation::Chroot(chroot) if chroot.privileged => {
                Some(confine::Confinement::MountingPlugin)
            }
            Isolation::Chroot(_) => Some(confine::Confinement::Task),
        };
        let filter = match confine {
            Some(confinement) => Some(self.filter(confinement)?.clone()),
            None => None,
        };
        let mut handed = spawn_plan::Handed::default();
        // A mounting plugin's binds are made by its warden, below the read-write,
        // bidirectional mounts it was handed (its staging and publish dirs and its socket
        // dir): the only mounts of its namespace that reach the host.
        let mount_warden = match &spec.isolation {
            Isolation::Chroot(chroot) if chroot.privileged => {
                let dirs = chroot
                    .mounts
                    .iter()
                    .filter(|m| m.propagation == Propagation::Bidirectional && !m.read_only)
                    .map(|m| crate::mount::c_path(&m.task_path))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(ProcessError::Prepare)?;
                let refusals = match &chroot.mount_refusals {
                    Some(path) => Some(handed.add(open_refusals(path)?)),
                    None => None,
                };
                Some(mount_warden::WardenPlan { dirs, refusals })
            }
            _ => None,
        };
        let (argv, env) = spawn_plan::c_strings(&program, &spec.argv, &spec.env)?;
        let cgroup_procs = handed.add_cgroup_files(&spec.cgroup_procs)?;
        // The shim writes through the open file; the path is renamed once the shim's pid
        // is known, or removed if the start fails.
        let (pending_record, exit_record) = match &self.exit_records {
            Some(dir) => {
                let (path, file) = new_exit_record(dir).map_err(ProcessError::ExitRecord)?;
                (Some(path), Some(handed.add(file.into())))
            }
            None => (None, None),
        };
        let network_namespace = match &spec.network_namespace {
            Some(path) => {
                let file = File::open(path).map_err(|source| ProcessError::NetworkNamespace {
                    path: path.clone(),
                    source,
                })?;
                Some(handed.add(file.into()))
            }
            None => None,
        };
        let plan = SpawnPlan {
            argv,
            env,
            cgroup_procs,
            network_namespace,
            joined: Vec::new(),
            entering: false,
            before_fork,
            pid_namespace,
            after_fork,
            confine,
            user: spec.user,
            user_namespace: spec.user_namespace.clone(),
            joined_as: None,
            capabilities: spec.capabilities,
            filter,
            mount_warden,
            exit_record,
            open_files_limit: open_files::node_limit(),
            controlling_terminal: false,
        };
        let forget_record = || {
            if let Some(path) = &pending_record {
                let _ = std::fs::remove_file(path);
            }
        };
        let (stdout, stderr, collected) = start_log_collector(keeper, spec)?;
        let keeper_error = |source| ProcessError::Keeper {
            path: keeper.clone(),
            source,
        };
        let (pid, report) = plan
            .launch(keeper, stdout, stderr, handed)
            .inspect_err(|_| forget_record())
            .map_err(keeper_error)?;
        // The keeper is this agent's child and not collected yet: its pid is still its
        // own, for its pidfd and its start time.
        let raw_pid = pid_of(pid as u32)?;
        let watched = rustix::process::pidfd_open(raw_pid, PidfdFlags::NONBLOCK)
            .map_err(io::Error::from)
            .and_then(|pidfd| Ok((Arc::new(pidfd), start_time(pid as u32)?)));
        let (pidfd, start_time) = match watched {
            Ok(watched) => watched,
            Err(source) => {
                // Not trackable (out of descriptors, say): it must not run untracked.
                forget_record();
                let _ = rustix::process::kill_process(raw_pid, Signal::KILL);
                tokio::spawn(wait_exit(raw_pid, None));
                let why = format!("tracking it (pid {pid}): {source}");
                return Err(keeper_error(io::Error::new(source.kind(), why)));
            }
        };
        let failure = spawn_plan::failure_of(&plan, report, program, keeper);
        if let Some(failure) = failure {
            forget_record();
            // The keeper (and whatever it forked) ends by itself once a step failed.
            tokio::spawn(wait_exit(raw_pid, Some(pidfd)));
            return Err(failure);
        }
        let process = ProcessRef {
            pid: pid as u32,
            start_time,
        };
        // Named after the process now that it has a pid and start time: where the next
        // agent looks for it. The shim writes through its descriptor, renamed or not.
        let record = pending_record.and_then(|pending| {
            let named = self.exit_record_path(process)?;
            std::fs::rename(&pending, &named).ok()?;
            Some(named)
        });
        let (sender, exit) = watch::channel(None);
        let watched = pidfd.clone();
        tokio::spawn(async move {
            let status = wait_exit(raw_pid, Some(watched)).await;
            // The task's last words reach its log before its end is told: whoever reads
            // the log once the task is over gets all of it. Bounded, because a process the
            // task left behind can keep the pipe open until its cgroup is emptied, which
            // comes after this.
            let _ = tokio::time::timeout(COLLECTOR_GRACE, collected).await;
            // This agent read the status itself: the record is for an agent that cannot.
            if let Some(record) = record {
                let _ = std::fs::remove_file(record);
            }
            let _ = sender.send(Some(status));
        });
        self.processes.lock().unwrap().insert(
            process,
            Tracked {
                owner: owner.clone(),
                pidfd: Some(pidfd),
                exit,
            },
        );
        Ok(process)
    }

    /// Where the exit record of `process` is, when this table keeps records.
    fn exit_record_path(&self, process: ProcessRef) -> Option<PathBuf> {
        let dir = self.exit_records.as_ref()?;
        Some(dir.join(format!("{}.{}", process.pid, process.start_time)))
    }

    /// Reads and removes the exit record of `process`, if its shim left one.
    fn take_exit_record(&self, process: ProcessRef) -> Option<ExitStatus> {
        let path = self.exit_record_path(process)?;
        let bytes = std::fs::read(&path).ok()?;
        let record = shim::ExitRecord::parse(&bytes)?;
        let _ = std::fs::remove_file(&path);
        Some(ExitStatus {
            code: record.code,
            signal: record.signal,
        })
    }

    fn filter(
        &self,
        confinement: confine::Confinement,
    ) -> Result<&seccomp::TaskFilter, ProcessError> {
        let cell = match confinement {
            confine::Confinement::Task => &self.filter,
            confine::Confinement::MountingPlugin => &self.plugin_filter,
        };
        if let Some(filter) = cell.get() {
            return Ok(filter);
        }
        let compiled = seccomp::TaskFilter::compile(confinement)?;
        Ok(cell.get_or_init(|| compiled))
    }

    /// Takes back a process started before an agent restart. Its start time must match,
    /// so a recycled pid is refused. A process that already ended is taken back as ended
    /// when its shim left an exit record, with the status and time the record holds.
    pub fn adopt(
        self: &Arc<Self>,
        owner: &Arc<str>,
        process: ProcessRef,
    ) -> Result<(), ProcessError> {
        if let Some(tracked) = self.processes.lock().unwrap().get(&process) {
            return check_owner(owner, tracked, process);
        }
        let alive = rustix::process::pidfd_open(pid_of(process.pid)?, PidfdFlags::NONBLOCK)
            .ok()
            .filter(|_| start_time(process.pid).ok() == Some(process.start_time));
        let Some(pidfd) = alive else {
            let status = self
                .take_exit_record(process)
                .ok_or(ProcessError::Gone(process.pid))?;
            let (_, exit) = watch::channel(Some(status));
            self.processes.lock().unwrap().insert(
                process,
                Tracked {
                    owner: owner.clone(),
                    pidfd: None,
                    exit,
                },
            );
            return Ok(());
        };
        let pidfd = Arc::new(pidfd);
        let (sender, exit) = watch::channel(None);
        let watched = pidfd.clone();
        let table = Arc::downgrade(self);
        tokio::spawn(async move {
            // SAFETY: `DupFd` holds the Arc'd pidfd, so the descriptor stays open and
            // the same for the AsyncFd's whole life.
            let registered = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    DupFd(watched),
                    tokio::io::Interest::READABLE,
                )
            };
            if let Ok(readable) = registered {
                let _ = readable.readable().await;
            }
            let recorded = table.upgrade().and_then(|t| t.take_exit_record(process));
            let _ = sender.send(Some(recorded.unwrap_or(ExitStatus {
                code: None,
                signal: None,
            })));
        });
        self.processes.lock().unwrap().insert(
            process,
            Tracked {
                owner: owner.clone(),
                pidfd: Some(pidfd),
                exit,
            },
        );
        Ok(())
    }

    /// Waits for the process to exit, at most `timeout` when given (`Ok(None)`: still
    /// running).
    pub async fn wait(
        &self,
        owner: &Arc<str>,
        process: ProcessRef,
        timeout: Option<Duration>,
    ) -> Result<Option<ExitStatus>, ProcessError> {
        let mut exit = self.lookup(owner, process, |t| t.exit.clone())?;
        let exited = async {
            let status = exit.wait_for(Option::is_some).await;
            status.ok().and_then(|s| *s)
        };
        match timeout {
            None => Ok(exited.await),
            Some(limit) => Ok(tokio::time::timeout(limit, exited).await.ok().flatten()),
        }
    }

    /// Sends a signal by name. Signalling a process that already exited succeeds.
    pub fn signal(
        &self,
        owner: &Arc<str>,
        process: ProcessRef,
        signal: &str,
    ) -> Result<(), ProcessError> {
        let signal = parse_signal(signal)?;
        let (pidfd, exit) = self.lookup(owner, process, |t| (t.pidfd.clone(), t.exit.clone()))?;
        let Some(pidfd) = pidfd.filter(|_| exit.borrow().is_none()) else {
            return Ok(());
        };
        match rustix::process::pidfd_send_signal(pidfd.as_fd(), signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(e) => Err(ProcessError::Signal {
                pid: process.pid,
                source: e.into(),
            }),
        }
    }

    /// How many processes driver `owner` has running or not yet released.
    pub fn owned_by(&self, owner: &str) -> usize {
        let processes = self.processes.lock().unwrap();
        processes.values().filter(|t| &*t.owner == owner).count()
    }

    /// Stops tracking a process (after its task is destroyed): its pidfd is closed.
    pub fn forget(&self, process: ProcessRef) {
        self.processes.lock().unwrap().remove(&process);
    }

    /// How many processes the table tracks.
    pub fn len(&self) -> usize {
        self.processes.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lookup<R>(
        &self,
        owner: &Arc<str>,
        process: ProcessRef,
        read: impl FnOnce(&Tracked) -> R,
    ) -> Result<R, ProcessError> {
        let processes = self.processes.lock().unwrap();
        let tracked = processes
            .get(&process)
            .ok_or(ProcessError::Unknown(process.pid))?;
        check_owner(owner, tracked, process)?;
        Ok(read(tracked))
    }
}

fn check_owner(
    owner: &Arc<str>,
    tracked: &Tracked,
    process: ProcessRef,
) -> Result<(), ProcessError> {
    if *tracked.owner != **owner {
        return Err(ProcessError::NotOwner {
            pid: process.pid,
            owner: tracked.owner.to_string(),
        });
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec: the last step before a task's
/// `exec`, so the task starts with stdin, stdout and stderr only, whatever the agent
/// inherited or opened without `O_CLOEXEC` (a jobserver pipe, a descriptor its parent
/// leaked). Nothing is closed before the `exec`: the report pipe stays until then.
/// Async-signal-safe.
pub(crate) fn cloexec_from(first: libc::c_int) -> io::Result<()> {
    // SAFETY: close_range(2) on integer arguments.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if done == 0 {
        return Ok(());
    }
    // Kernels before 5.11 lack the flag: set it one descriptor at a time.
    // SAFETY: getrlimit and fcntl on integer arguments.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        let end = limit.rlim_cur.min(1 << 20) as libc::c_int;
        for fd in first..end {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// The directory of a task's log file, opened without following a symlink at its last
/// component: the task can write into the shared alloc dir that holds it.
fn open_log_dir(log_file: &Path) -> io::Result<OwnedFd> {
    let missing = || io::Error::other("a log file path without its directories");
    let logs = log_file.parent().ok_or_else(missing)?;
    let shared = logs.parent().ok_or_else(missing)?;
    let name = logs.file_name().ok_or_else(missing)?;
    let shared = rustix::fs::open(
        shared,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    Ok(rustix::fs::openat(
        &shared,
        name,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// A task's log file, opened for appending without following a symlink the task may
/// have put in its place (when its log collector could not be started).
fn open_log(path: &Path) -> Result<OwnedFd, ProcessError> {
    let fail = |source| ProcessError::LogFile {
        path: path.to_path_buf(),
        source,
    };
    let dir = open_log_dir(path).map_err(fail)?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    logmon::open_regular(
        dir.as_fd(),
        name,
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CREATE | rustix::fs::OFlags::APPEND,
    )
    .map(OwnedFd::from)
    .map_err(fail)
}

/// How long a task's end waits for its log collector to write what the task wrote last.
const COLLECTOR_GRACE: Duration = Duration::from_secs(2);

/// With the pipes' write ends: when the collector has ended.
type Collected = tokio::sync::oneshot::Receiver<()>;

/// Starts the task's log collector (`berth __task-logmon`, see [`logmon`]): the write
/// ends of its stdout and stderr pipes are what the task gets.
fn start_log_collector(
    keeper: &Path,
    spec: &SpawnSpec,
) -> Result<(OwnedFd, OwnedFd, Collected), ProcessError> {
    let fail = |source| ProcessError::LogFile {
        path: spec.stdout.clone(),
        source,
    };
    let base = |path: &Path| {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        match name.strip_suffix(".0") {
            Some(base) => Ok(base.to_string()),
            None => Err(fail(io::Error::other(format!(
                "unexpected log file name {}",
                path.display()
            )))),
        }
    };
    let (stdout_base, stderr_base) = (base(&spec.stdout)?, base(&spec.stderr)?);
    let dir = open_log_dir(&spec.stdout).map_err(fail)?;
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| fail(e.into()));
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let args = [
        stdout_base,
        stderr_base,
        spec.logs.max_files.to_string(),
        spec.logs.max_file_size.to_string(),
    ];
    let keeper = keeper.to_path_buf();
    // Started beside the task rather than before it, off the task's start: what the task
    // writes meanwhile waits in the pipes (64 KiB each). Reaped when it ends, after the
    // task and everything it started closed the pipes.
    let (ended, collected) = tokio::sync::oneshot::channel();
    let files = (spec.stdout.clone(), spec.stderr.clone());
    let cgroup_procs = spec.collector_cgroup_procs.clone();
    tokio::spawn(async move {
        let handed = [stdout_read.as_fd(), stderr_read.as_fd(), dir.as_fd()];
        let spawned = logmon::spawn(&keeper, &args, handed)
            .and_then(|pid| logmon::move_collector(pid, &cgroup_procs).map(|()| pid));
        match spawned {
            Ok(pid) => {
                // The collector has its copies now: the agent's go.
                drop((stdout_read, stderr_read, dir));
                reap(pid).await;
            }
            Err(error) => {
                // Never leave the task writing into a pipe nobody reads: the agent copies
                // (unrotated) for as long as it lives.
                tracing::error!(
                    %error,
                    "starting a task's log collector; the agent copies the task's output itself"
                );
                drop(dir);
                let copy = |from: OwnedFd, to: PathBuf| {
                    std::thread::spawn(move || {
                        if let Ok(to) = open_log(&to) {
                            let _ = io::copy(&mut File::from(from), &mut File::from(to));
                        }
                    })
                };
                let threads = [copy(stdout_read, files.0), copy(stderr_read, files.1)];
                let _ = tokio::task::spawn_blocking(move || threads.map(|t| t.join())).await;
            }
        }
        let _ = ended.send(());
    });
    Ok((stdout_write, stderr_write, collected))
}

/// Waits for child `pid` of this agent (the keeper of a task or of its log collector) to
/// exit and collects it, without a thread while it runs: its pidfd turns readable when
/// it exits.
async fn wait_exit(pid: Pid, pidfd: Option<Arc<OwnedFd>>) -> ExitStatus {
    use rustix::process::{WaitId, WaitIdOptions};
    if let Some(pidfd) = pidfd {
        // SAFETY: `DupFd` holds the Arc'd pidfd, so the descriptor stays open and the
        // same for the AsyncFd's whole life.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                DupFd(pidfd.clone()),
                tokio::io::Interest::READABLE,
            )
        };
        if let Ok(watched) = registered {
            let _ = watched.readable().await;
            drop(watched);
            let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG;
            let collected = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), options);
            if let Ok(Some(status)) = collected {
                return ExitStatus {
                    code: status.exit_status(),
                    signal: status.terminating_signal(),
                };
            }
        }
    }
    // Not watchable: a blocking-pool thread waits, by pid (the pidfd does not block). A
    // child's pid stays its own until it is collected.
    let waited = tokio::task::spawn_blocking(move || {
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
    })
    .await;
    match waited {
        Ok(Ok(Some((_, status)))) => ExitStatus {
            code: status.exit_status(),
            signal: status.terminating_signal(),
        },
        _ => ExitStatus {
            code: None,
            signal: None,
        },
    }
}

/// Collects a child of this agent once it exits (see [`wait_exit`]).
async fn reap(pid: i32) {
    let Some(pid) = Pid::from_raw(pid) else {
        return;
    };
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::NONBLOCK).ok();
    wait_exit(pid, pidfd.map(Arc::new)).await;
}

/// A new, empty exit record in `dir` (made 0700 when missing), open for the shim.
fn new_exit_record(dir: &Path) -> io::Result<(PathBuf, File)> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut suffix = [0u8; 8];
    rustix::rand::getrandom(&mut suffix, rustix::rand::GetRandomFlags::empty())?;
    let path = dir.join(format!(".spawning-{:016x}", u64::from_le_bytes(suffix)));
    let file = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    Ok((path, file))
}

/// A pidfd shared with the table, registered with the reactor while it is watched.
struct DupFd(Arc<OwnedFd>);

impl AsRawFd for DupFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

fn pid_of(pid: u32) -> Result<Pid, ProcessError> {
    Pid::from_raw(pid as i32).ok_or(ProcessError::Unknown(pid))
}

/// Field 22 of `/proc/<pid>/stat`: start time in clock ticks after boot.
pub fn start_time(pid: u32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: skip past the last ')'.
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    after_name
        .split_whitespace()
        .nth(19)
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc stat"))
}

/// Signal names drivers may use, with or without the `SIG` prefix.
pub fn parse_signal(name: &str) -> Result<Signal, ProcessError> {
    let bare = name.trim().trim_start_matches("SIG");
    Ok(match bare {
        "TERM" => Signal::TERM,
        "KILL" => Signal::KILL,
        "INT" => Signal::INT,
        "HUP" => Signal::HUP,
        "QUIT" => Signal::QUIT,
        "USR1" => Signal::USR1,
        "USR2" => Signal::USR2,
        "CONT" => Signal::CONT,
        "STOP" => Signal::STOP,
        _ => return Err(ProcessError::UnknownSignal(name.to_string())),
    })
}

/// Opens (creating) the file a mount warden appends its refusals to, through no link.
fn open_refusals(path: &Path) -> Result<OwnedFd, ProcessError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    File::options()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| {
            ProcessError::Prepare(io::Error::new(
                e.kind(),
                format!("opening {} for the mount warden: {e}", path.display()),
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_start_time() {
        let me = std::process::id();
        let first = start_time(me).unwrap();
        assert!(first > 0);
        assert_eq!(first, start_time(me).unwrap());
    }

    #[test]
    fn parses_signal_names_with_and_without_prefix() {
        assert_eq!(parse_signal("SIGTERM").unwrap(), Signal::TERM);
        assert_eq!(parse_signal("KILL").unwrap(), Signal::KILL);
        assert!(matches!(
            parse_signal("SIGBOGUS"),
            Err(ProcessError::UnknownSignal(_))
        ));
    }
}
