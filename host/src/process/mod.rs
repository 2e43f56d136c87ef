//! Processes the host runs for drivers: spawn (optionally confined: namespaces, a
//! chroot, a cgroup, dropped capabilities, a seccomp filter), supervise, signal, and
//! adopt again after an agent restart.
//!
//! A confined spawn, in the order the child runs it (each step named in the error
//! when it fails):
//!
//! ```text
//! agent ─fork─► shim: join the task's cgroup ─► unshare mount/ipc/uts/pid ─► binds,
//!                      /dev, volumes ─► fork ─┐ (stays: forwards signals, mirrors exit)
//!   init, pid 1: /proc ─► chroot ─► drop capabilities ─► user ─► seccomp ─► fork ─┐
//!                                       (stays: reaps, forwards, reports the status)
//!   task, pid 2: exec
//! ```
//!
//! See [`shim`] for why a task is three processes.
//!
//! Reaping blocks no thread per task: own children are reaped by tokio's SIGCHLD-driven
//! reaper, adopted processes are watched through a pidfd registered with the reactor.
//! Every process is addressed by a [`ProcessRef`] (pid + start time), and signals go
//! through a pidfd, so a recycled pid is never signalled by mistake.

pub mod confine;
pub mod isolation;
pub mod logmon;
pub mod seccomp;
pub mod shim;
pub mod users;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::sync::watch;

use crate::mount::MountStep;
use isolation::ChrootSpec;

pub use crate::model::driver::ProcessRef;

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
    /// With a supervisor binary, the output goes through a pipe to a log collector
    /// (`berth __task-logmon`) that rotates the files; without one, to the files as
    /// they are.
    pub logs: crate::model::driver::LogRotation,
    /// Runs as this user: the last step before `exec` (the kernel then clears its
    /// capabilities).
    pub user: Option<users::TaskUser>,
    /// The `cgroup.procs` files of the task's cgroup: the process joins them first, so
    /// everything it does and forks is limited and accounted.
    pub cgroup_procs: Vec<PathBuf>,
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
    #[error("creating the task's exit record: {0}")]
    ExitRecord(io::Error),
    #[error("opening {} to supervise the task: {source}", path.display())]
    Supervisor { path: PathBuf, source: io::Error },
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
    /// Where shims leave their task's exit record (`<pid>.<start time>`), for an agent
    /// that adopts the process after a restart. `None`: no records (tests, benches).
    exit_records: Option<PathBuf>,
    /// The `berth` binary a task's shim and init re-execute (see [`shim`]). `None`: they
    /// stay forked copies of the agent.
    supervisor: Option<PathBuf>,
}

impl ProcessTable {
    /// A table whose processes leave exit records in `dir` (created 0700 when missing).
    pub fn with_exit_records(dir: PathBuf) -> ProcessTable {
        ProcessTable {
            exit_records: Some(dir),
            ..ProcessTable::default()
        }
    }

    /// The binary tasks' shims and inits re-execute once forked, and their log
    /// collectors run: `berth-keeper`, or the agent's own binary, which answers the same
    /// hidden commands.
    pub fn supervised_by(self, berth: PathBuf) -> ProcessTable {
        ProcessTable {
            supervisor: Some(berth),
            ..self
        }
    }

    /// Spawns `spec` for driver `owner`. Must be called within a tokio runtime.
    pub fn spawn(&self, owner: &Arc<str>, spec: &SpawnSpec) -> Result<ProcessRef, ProcessError> {
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
        let confine = matches!(&spec.isolation, Isolation::Chroot(chroot) if !chroot.privileged);
        let filter = match confine {
            true => Some(self.filter()?.clone()),
            false => None,
        };
        let plan = SpawnPlan {
            cgroup: spec
                .cgroup_procs
                .iter()
                .map(|path| {
                    let file = File::options().write(true).open(path);
                    file.map(OwnedFd::from)
                        .map_err(|source| ProcessError::Cgroup {
                            path: path.clone(),
                            source,
                        })
                })
                .collect::<Result<_, _>>()?,
            before_fork,
            pid_namespace,
            after_fork,
            confine,
            user: spec.user,
            filter,
            exit_record: None,
            supervisor: match &self.supervisor {
                Some(path) => Some(open_supervisor(path)?),
                None => None,
            },
        };
        let mut plan = plan;
        let pending_record = match &self.exit_records {
            Some(dir) => {
                let (path, file) = new_exit_record(dir).map_err(ProcessError::ExitRecord)?;
                plan.exit_record = Some(OwnedFd::from(file));
                Some(path)
            }
            None => None,
        };
        let step_names = plan.step_names();
        let (stdout, stderr, collected) = match &self.supervisor {
            Some(berth) => {
                let (stdout, stderr, collected) = start_log_collector(berth, spec)?;
                (stdout, stderr, Some(collected))
            }
            None => (open_log(&spec.stdout)?, open_log(&spec.stderr)?, None),
        };

        let (report_read, report_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| ProcessError::Prepare(e.into()))?;
        let mut command = tokio::process::Command::new(&program);
        command
            .args(&spec.argv[1..])
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(false);
        let report_fd = report_write.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec. It only runs the
        // prepared plan (system calls on data built above) and `write(2)`: no
        // allocation, no locks.
        unsafe {
            command.pre_exec(move || {
                plan.run().map_err(|(index, error)| {
                    let bytes = (index as u32).to_le_bytes();
                    let fd = std::os::fd::BorrowedFd::borrow_raw(report_fd);
                    let _ = rustix::io::write(fd, &bytes);
                    error
                })
            });
        }
        let spawned = command.spawn();
        drop(report_write);
        let mut child = match spawned {
            Ok(child) => child,
            Err(source) => {
                if let Some(path) = &pending_record {
                    let _ = std::fs::remove_file(path);
                }
                let mut report = [0u8; 4];
                let mut reader = File::from(report_read);
                if reader.read_exact(&mut report).is_ok() {
                    let index = u32::from_le_bytes(report) as usize;
                    let step = step_names.get(index).cloned().unwrap_or_default();
                    return Err(ProcessError::Setup { step, source });
                }
                if source.kind() == io::ErrorKind::NotFound {
                    let source = io::Error::new(
                        io::ErrorKind::NotFound,
                        "no such program (paths are resolved inside the task's root)",
                    );
                    return Err(ProcessError::Exec { program, source });
                }
                return Err(ProcessError::Exec { program, source });
            }
        };
        let pid = child.id().expect("a just-spawned child has a pid");
        let pidfd =
            rustix::process::pidfd_open(pid_of(pid)?, PidfdFlags::empty()).map_err(|e| {
                ProcessError::Signal {
                    pid,
                    source: e.into(),
                }
            })?;
        let start_time = start_time(pid).map_err(|_| ProcessError::Gone(pid))?;
        let process = ProcessRef { pid, start_time };
        // Named after the process now that it has a pid and start time: where the next
        // agent looks for it. The shim writes through its descriptor, renamed or not.
        let record = pending_record.and_then(|pending| {
            let named = self.exit_record_path(process)?;
            std::fs::rename(&pending, &named).ok()?;
            Some(named)
        });
        let (sender, exit) = watch::channel(None);
        tokio::spawn(async move {
            let waited = child.wait().await;
            // The task's last words reach its log before its end is told: whoever reads
            // the log once the task is over gets all of it. Bounded, because a process the
            // task left behind can keep the pipe open until its cgroup is emptied, which
            // comes after this.
            if let Some(collected) = collected {
                let _ = tokio::time::timeout(COLLECTOR_GRACE, collected).await;
            }
            // This agent read the status itself: the record is for an agent that cannot.
            if let Some(record) = record {
                let _ = std::fs::remove_file(record);
            }
            let status = match waited {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt;
                    ExitStatus {
                        code: status.code(),
                        signal: status.signal(),
                    }
                }
                Err(_) => ExitStatus {
                    code: None,
                    signal: None,
                },
            };
            let _ = sender.send(Some(status));
        });
        self.processes.lock().unwrap().insert(
            process,
            Tracked {
                owner: owner.clone(),
                pidfd: Some(Arc::new(pidfd)),
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

    fn filter(&self) -> Result<&seccomp::TaskFilter, ProcessError> {
        if let Some(filter) = self.filter.get() {
            return Ok(filter);
        }
        let compiled = seccomp::TaskFilter::compile()?;
        Ok(self.filter.get_or_init(|| compiled))
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

/// In a forked child, last before `exec`: every descriptor above stderr becomes
/// close-on-exec, so the task starts with stdin, stdout and stderr only, whatever the
/// agent inherited or opened without `O_CLOEXEC` (a jobserver pipe, a descriptor its
/// parent leaked). Nothing is closed before the `exec`: the spawn's own error pipe stays
/// until then. Async-signal-safe.
fn cloexec_all_but_stdio() -> io::Result<()> {
    cloexec_from(3)
}

/// Marks every descriptor from `first` up close-on-exec. Async-signal-safe.
fn cloexec_from(first: libc::c_int) -> io::Result<()> {
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

/// Everything the child does between `fork` and `exec`, prepared by the agent.
struct SpawnPlan {
    /// Open `cgroup.procs` files of the task's cgroup.
    cgroup: Vec<OwnedFd>,
    before_fork: Vec<MountStep>,
    /// Fork into the pid namespace `before_fork` made ([`shim`]).
    pid_namespace: bool,
    after_fork: Vec<MountStep>,
    confine: bool,
    user: Option<users::TaskUser>,
    filter: Option<seccomp::TaskFilter>,
    /// The open exit record the shim writes (a shim is forked for it even without a pid
    /// namespace).
    exit_record: Option<OwnedFd>,
    /// The `berth` binary the shim and init re-execute, open from before the chroot.
    supervisor: Option<OwnedFd>,
}

impl SpawnPlan {
    /// A shim is forked for a pid namespace, and for an exit record without one.
    fn forks_shim(&self) -> bool {
        self.pid_namespace || self.exit_record.is_some()
    }

    fn supervisor_fd(&self) -> std::os::fd::RawFd {
        self.supervisor.as_ref().map_or(-1, |fd| fd.as_raw_fd())
    }

    /// The names of the steps [`SpawnPlan::run`] counts, for errors.
    fn step_names(&self) -> Vec<String> {
        let mut names = vec!["join the task's cgroup".to_string()];
        names.extend(self.before_fork.iter().map(ToString::to_string));
        names.push(if self.pid_namespace {
            "fork into the pid namespace".into()
        } else {
            "fork the task's shim".into()
        });
        names.extend(self.after_fork.iter().map(ToString::to_string));
        names.push("drop capabilities and set no_new_privs".into());
        names.push("switch to the task's user".into());
        names.push("install the seccomp filter".into());
        names.push("fork the task from its namespace's init".into());
        names.push("give the task the node's open-files limit".into());
        names.push("mark descriptors above stderr close-on-exec".into());
        names
    }

    /// Runs in the child. On failure, the index of the failed step in
    /// [`SpawnPlan::step_names`]. Async-signal-safe.
    fn run(&self) -> Result<(), (usize, io::Error)> {
        crate::private_fds::close_in_child();
        for fd in &self.cgroup {
            // "0" is the writing process.
            rustix::io::write(fd, b"0").map_err(|e| (0, e.into()))?;
        }
        let mut index = 1;
        for step in &self.before_fork {
            step.execute().map_err(|e| (index, e))?;
            index += 1;
        }
        if self.forks_shim() {
            let record = self.exit_record.as_ref().map_or(-1, |fd| fd.as_raw_fd());
            // SAFETY: between fork and exec, one thread; with a pid namespace, after
            // unsharing it (the first steps of `before_fork`).
            unsafe { shim::fork(shim::Role::Shim { record }, self.supervisor_fd()) }
                .map_err(|e| (index, e))?;
        }
        index += 1;
        for step in &self.after_fork {
            step.execute().map_err(|e| (index, e))?;
            index += 1;
        }
        if self.confine {
            confine::drop_privileges().map_err(|e| (index, e))?;
        }
        index += 1;
        if let Some(user) = self.user {
            confine::become_user(user).map_err(|e| (index, e))?;
            if self.forks_shim() {
                // Changing user cleared the parent-death signal: set it again.
                shim::die_with_parent().map_err(|e| (index, e))?;
            }
        }
        index += 1;
        if let Some(filter) = &self.filter {
            filter.install().map_err(|e| (index, e))?;
        }
        index += 1;
        if self.pid_namespace {
            // SAFETY: between fork and exec, one thread, pid 1 of the namespace.
            unsafe { shim::fork(shim::Role::Init, self.supervisor_fd()) }
                .map_err(|e| (index, e))?;
        }
        index += 1;
        restore_open_files_limit().map_err(|e| (index, e))?;
        index += 1;
        cloexec_all_but_stdio().map_err(|e| (index, e))
    }
}

/// The open-files limit the agent started with, when it raised its own.
static NODE_OPEN_FILES_LIMIT: OnceLock<libc::rlimit> = OnceLock::new();

/// Raises the agent's soft open-files limit to the hard one, as Go programs (Nomad's
/// client among them) do at start: every running task costs the agent a few descriptors
/// (pidfds, pipes), and the common soft limit of 1024 would cap a node below a thousand
/// tasks. Tasks get the limit the agent started with back ([`SpawnPlan::run`]), since
/// programs that use `select(2)` break above 1024. Returns the limits before and after.
pub fn raise_open_files_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a valid local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        let before = limit.rlim_cur;
        if limit.rlim_cur >= limit.rlim_max {
            return Ok((before, before));
        }
        let _ = NODE_OPEN_FILES_LIMIT.set(limit);
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((before, raised.rlim_cur))
    }
}

/// In the child: the open-files limit the agent started with, if it raised its own.
fn restore_open_files_limit() -> io::Result<()> {
    let Some(limit) = NODE_OPEN_FILES_LIMIT.get() else {
        return Ok(());
    };
    // SAFETY: setrlimit on a valid struct; async-signal-safe.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, limit) } != 0 {
        return Err(io::Error::last_os_error());
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
/// have put in its place (without a log collector: tests and benches).
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
    berth: &Path,
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
    let berth = berth.to_path_buf();
    // Started beside the task rather than before it, off the task's start: what the task
    // writes meanwhile waits in the pipes (64 KiB each). Reaped when it ends, after the
    // task and everything it started closed the pipes.
    let (ended, collected) = tokio::sync::oneshot::channel();
    let files = (spec.stdout.clone(), spec.stderr.clone());
    tokio::spawn(async move {
        let handed = [stdout_read.as_fd(), stderr_read.as_fd(), dir.as_fd()];
        match logmon::spawn(&berth, &args, handed) {
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

/// Waits for a child this agent started outside tokio's process handling, without a
/// thread: its pidfd turns readable when it exits, then `waitpid` collects it.
async fn reap(pid: i32) {
    let Some(raw) = Pid::from_raw(pid) else {
        return;
    };
    if let Ok(pidfd) = rustix::process::pidfd_open(raw, PidfdFlags::NONBLOCK) {
        // SAFETY: the AsyncFd owns the pidfd, which stays open for its whole life.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
        };
        if let Ok(watched) = registered {
            let _ = watched.readable().await;
        }
    }
    // The child has exited (or could not be watched: then this blocks a blocking-pool
    // thread until it does, which is still correct).
    let _ = tokio::task::spawn_blocking(move || {
        rustix::process::waitpid(Some(raw), rustix::process::WaitOptions::empty())
    })
    .await;
}

/// The `berth` binary, opened for the shim and init to execute from inside the task's
/// root (where its path does not exist).
fn open_supervisor(path: &Path) -> Result<OwnedFd, ProcessError> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| ProcessError::Supervisor {
        path: path.to_path_buf(),
        source: e.into(),
    })
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
