//! Running a command inside a running task, as Nomad's `exec` driver does for a
//! template's change script, a script check or `alloc exec`: in the task's namespaces,
//! root, cgroup and network, as the task's user, with the task's capabilities and
//! seccomp filter, never with more.
//!
//! The task is found through the process the host spawned for it (its shim, see
//! [`super::shim`]). Its namespaces are opened from `/proc/<shim>/ns`, and the shim's
//! pidfd is checked after that, so they are that very process's and not a recycled
//! pid's. Those that differ from the agent's are joined by a `berth-keeper` started on
//! a spawn plan ([`super::spawn_plan`]) like the task's own:
//!
//! ```text
//! agent ─posix_spawn─► keeper: join the task's cgroup ─► join its network, mount, ipc,
//!   uts namespaces and the pid namespace of its children ─► fork ─┐ (stays: the shim)
//!   command: chdir / ─► drop capabilities ─► user ─► seccomp ─► exec
//! ```
//!
//! Joining the mount namespace puts the keeper at the root of that namespace, the
//! task's (its `pivot_root` left nothing of the host's tree there). The command is born
//! in the task's pid namespace, under its init: it dies with the task, and what it
//! leaves behind is the task's init's to reap. A task in the host's mount namespace
//! (`raw_exec`) gets its command in its task directory, as its user, unconfined, as
//! the task itself runs.
//!
//! The command leads a session and process group of its own, and its output (stdout
//! and stderr together) is read up to a limit. Its timeout runs from before the keeper
//! starts (the task's processes can stop the command before its `exec`, which nothing
//! then waits for); at it, the shim kills the command's whole group (SIGTERM to the
//! shim, [`super::shim::Role::Shim`]), and a shim that does not end is killed, the
//! command with it. A task in the host's namespaces is entered only when the caller
//! says its tasks run any command anyway ([`EnterSpec::unconfined_allowed`]).

use std::fs::File;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{PidfdFlags, Signal};
use tokio::io::AsyncReadExt as _;

use super::spawn_plan::{
    Handed, JoinedNamespace, SpawnPlan, c_strings, failure_of, read_report_async,
};
use super::{
    ExitStatus, ProcessError, ProcessRef, ProcessTable, confine, open_files, pid_of, wait_exit,
};
use crate::mount::{MountStep, c_path};
use berth_model::driver::TaskUser;

/// What to run inside a task.
#[derive(Debug, Clone)]
pub struct EnterSpec {
    /// The program is looked up in `PATH` of `env` inside the task's root when it has
    /// no `/`.
    pub argv: Vec<String>,
    /// The whole environment: nothing is inherited.
    pub env: Vec<(String, String)>,
    /// The task's user (the host's choice, as at the task's start).
    pub user: Option<TaskUser>,
    /// The `cgroup.procs` files of the task's cgroup: the command is limited and counted
    /// with the task.
    pub cgroup_procs: Vec<PathBuf>,
    /// Where the command starts when the task runs in the host's mount namespace (its
    /// task directory); a confined task's command starts at `/` of its root.
    pub host_cwd: PathBuf,
    /// The most bytes of output kept; the rest is read and dropped.
    pub output_limit: usize,
    /// The command is killed after this long.
    pub timeout: Duration,
    /// A task in the host's namespaces may be entered: only where the task itself runs
    /// any command its job names (`raw_exec`), or a command would get what its driver
    /// never gave the job.
    pub unconfined_allowed: bool,
}

/// How a command inside a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub status: ExitStatus,
    /// Its stdout and stderr, interleaved as written, at most the spec's limit.
    pub output: Vec<u8>,
    /// More was written than `output` holds.
    pub output_cut: bool,
    /// It was killed at its timeout.
    pub timed_out: bool,
}

/// How long a shim told to end its command (SIGTERM) has before it is killed.
const SHIM_GRACE: Duration = Duration::from_secs(1);

/// After the command exits, how long its output is still read: what it left running
/// may hold the pipe open.
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

/// The namespaces a process may have of its own, by their `/proc/<pid>/ns` names.
const NAMESPACES: &[(&str, Option<JoinedNamespace>)] = &[
    ("net", None),
    ("mnt", Some(JoinedNamespace::Mount)),
    ("ipc", Some(JoinedNamespace::Ipc)),
    ("uts", Some(JoinedNamespace::Uts)),
    ("pid_for_children", Some(JoinedNamespace::Pid)),
];

/// The namespaces of a task's process that are not the agent's own.
struct TaskNamespaces {
    network: Option<File>,
    joined: Vec<(File, JoinedNamespace)>,
    /// The task's user inside its own user namespace (the last of `joined`), if it has
    /// one.
    inside: Option<super::user_namespace::Identity>,
}

impl TaskNamespaces {
    fn open(process: ProcessRef, pidfd: &OwnedFd) -> Result<TaskNamespaces, ProcessError> {
        let mut namespaces = TaskNamespaces {
            network: None,
            joined: Vec::new(),
            inside: None,
        };
        for (name, kind) in NAMESPACES {
            let path = PathBuf::from(format!("/proc/{}/ns/{name}", process.pid));
            let failed = |source| ProcessError::TaskNamespace {
                path: path.clone(),
                source,
            };
            let theirs = File::open(&path).map_err(failed)?;
            let ours = std::fs::metadata(format!("/proc/self/ns/{name}")).map_err(failed)?;
            let their_meta = theirs.metadata().map_err(failed)?;
            if (their_meta.dev(), their_meta.ino()) == (ours.dev(), ours.ino()) {
                continue;
            }
            match kind {
                None => namespaces.network = Some(theirs),
                Some(kind) => namespaces.joined.push((theirs, *kind)),
            }
        }
        // A task on an image entered its user namespace after its shim forked it: the
        // namespace is its init's, the shim's child. Joined last, and the command is
        // the task's user in it.
        // Only a confined task's: an unconfined one's first child is the task itself,
        // whose namespace would be its own choice (attack review).
        let confined = namespaces
            .joined
            .iter()
            .any(|(_, kind)| *kind == JoinedNamespace::Mount);
        if let Some(init) = shim_child(process.pid).filter(|_| confined) {
            let path = PathBuf::from(format!("/proc/{init}/ns/user"));
            let failed = |source| ProcessError::TaskNamespace {
                path: path.clone(),
                source,
            };
            let theirs = File::open(&path).map_err(failed)?;
            let ours = std::fs::metadata("/proc/self/ns/user").map_err(failed)?;
            let their_meta = theirs.metadata().map_err(failed)?;
            if (their_meta.dev(), their_meta.ino()) != (ours.dev(), ours.ino()) {
                let inside = super::user_namespace::identity_inside(init).map_err(failed)?;
                // Still the shim's child once read: the namespace and the ids are the
                // task's, not a recycled pid's.
                if shim_child(process.pid) != Some(init) {
                    return Err(ProcessError::Gone(process.pid));
                }
                namespaces.joined.push((theirs, JoinedNamespace::User));
                namespaces.inside = Some(inside);
            }
        }
        // Opened by pid: they are the task's only if the process was still alive after
        // (a pid is not reused while its process lives).
        if exited(pidfd) {
            return Err(ProcessError::Gone(process.pid));
        }
        Ok(namespaces)
    }

    /// The task has a root of its own.
    fn confined(&self) -> bool {
        self.joined
            .iter()
            .any(|(_, kind)| *kind == JoinedNamespace::Mount)
    }
}

/// The first child of `shim` (a task's init), from `/proc/<shim>/task/<shim>/children`.
fn shim_child(shim: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{shim}/task/{shim}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A pidfd reads as readable once its process has exited.
fn exited(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one valid pollfd, without waiting.
    unsafe { libc::poll(&mut poll, 1, 0) > 0 }
}

/// A keeper's plan to enter a task, ready to start.
pub(super) struct Entering {
    pub(super) keeper: PathBuf,
    pub(super) plan: SpawnPlan,
    pub(super) handed: Handed,
    /// The program, for errors.
    pub(super) program: String,
    /// The multiplexer of the task's own devpts, for a terminal (a confined task's).
    pub(super) task_ptmx: Option<OwnedFd>,
}

/// The devpts instance's magic number (`statfs(2)`).
const DEVPTS_SUPER_MAGIC: i64 = 0x1cd1;

/// Opens `/dev/pts/ptmx` in the root of the task of `target`: no link followed on the
/// way (the task's files are the task's), and it must be a devpts multiplexer (5:2 on
/// a devpts), whatever the task put there.
fn open_task_ptmx(target: ProcessRef) -> Result<OwnedFd, ProcessError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let path = PathBuf::from(format!("/proc/{}/root/dev/pts/ptmx", target.pid));
    let failed = |source: std::io::Error| ProcessError::TaskTerminal {
        path: path.clone(),
        source,
    };
    let root = rustix::fs::open(
        format!("/proc/{}/root", target.pid),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| failed(e.into()))?;
    let ptmx = rustix::fs::openat2(
        &root,
        "dev/pts/ptmx",
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| failed(e.into()))?;
    let stat = rustix::fs::fstat(&ptmx).map_err(|e| failed(e.into()))?;
    let on = rustix::fs::fstatfs(&ptmx).map_err(|e| failed(e.into()))?;
    let is_char =
        rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::CharacterDevice;
    let rdev = stat.st_rdev;
    if !is_char
        || (rustix::fs::major(rdev), rustix::fs::minor(rdev)) != (5, 2)
        || on.f_type as i64 != DEVPTS_SUPER_MAGIC
    {
        return Err(failed(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a devpts multiplexer",
        )));
    }
    Ok(ptmx)
}

impl ProcessTable {
    /// The plan to run `spec` inside the task whose process `target` driver `owner`
    /// spawned; `terminal`: its stdin is a terminal it takes as its controlling one.
    pub(super) fn entering(
        &self,
        owner: &Arc<str>,
        target: ProcessRef,
        spec: &EnterSpec,
        terminal: bool,
    ) -> Result<Entering, ProcessError> {
        let keeper = self.keeper.as_ref().ok_or(ProcessError::NoKeeper)?;
        let (pidfd, exit) = self.lookup(owner, target, |t| (t.pidfd.clone(), t.exit.clone()))?;
        let Some(pidfd) = pidfd.filter(|_| exit.borrow().is_none()) else {
            return Err(ProcessError::Gone(target.pid));
        };
        let mut namespaces = TaskNamespaces::open(target, &pidfd)?;
        let confined = namespaces.confined();
        if !confined && !spec.unconfined_allowed {
            return Err(ProcessError::UnconfinedTask);
        }
        // A confined task's terminal comes from its own devpts, so that its name
        // (`tty`, ttyname(3)) is one the command can find in its root.
        let task_ptmx = match terminal && confined {
            true => {
                let ptmx = open_task_ptmx(target)?;
                if exited(&pidfd) {
                    return Err(ProcessError::Gone(target.pid));
                }
                Some(ptmx)
            }
            false => None,
        };
        let program = spec.argv.first().cloned().unwrap_or_default();
        let (argv, env) = c_strings(&program, &spec.argv, &spec.env)?;
        let mut handed = Handed::default();
        let cgroup_procs = handed.add_cgroup_files(&spec.cgroup_procs)?;
        // The task's user, and the capabilities the task kept (its cap_drop applied).
        let inside = namespaces.inside.take();
        let task_capabilities = inside.as_ref().map(|identity| identity.capabilities);
        let joined_as = inside.map(|identity| (identity.user, identity.groups));
        let network_namespace = namespaces.network.map(|file| handed.add(file.into()));
        let joined = namespaces
            .joined
            .into_iter()
            .map(|(file, kind)| (handed.add(file.into()), kind))
            .collect();
        let prepare = |path: &std::path::Path| c_path(path).map_err(ProcessError::Prepare);
        let (before_fork, after_fork, confine) = if confined {
            let root = vec![MountStep::Chdir {
                dir: prepare("/".as_ref())?,
            }];
            (Vec::new(), root, Some(confine::Confinement::Task))
        } else {
            let cwd = vec![MountStep::Chdir {
                dir: prepare(&spec.host_cwd)?,
            }];
            (cwd, Vec::new(), None)
        };
        let filter = match confine {
            Some(confinement) => Some(self.filter(confinement)?.clone()),
            None => None,
        };
        let plan = SpawnPlan {
            argv,
            env,
            cgroup_procs,
            network_namespace,
            joined,
            entering: true,
            before_fork,
            pid_namespace: false,
            after_fork,
            confine,
            user: spec.user,
            user_namespace: None,
            joined_as,
            capabilities: task_capabilities,
            filter,
            mount_warden: None,
            exit_record: None,
            open_files_limit: open_files::node_limit(),
            controlling_terminal: terminal,
        };
        Ok(Entering {
            keeper: keeper.clone(),
            plan,
            handed,
            program,
            task_ptmx,
        })
    }
}

impl ProcessTable {
    /// Runs `spec` inside the task whose process `target` driver `owner` spawned, and
    /// waits for it (at most its timeout). Must be called within a tokio runtime.
    pub async fn run_inside(
        &self,
        owner: &Arc<str>,
        target: ProcessRef,
        spec: &EnterSpec,
    ) -> Result<Ran, ProcessError> {
        let Entering {
            keeper,
            plan,
            handed,
            program,
            ..
        } = self.entering(owner, target, spec, false)?;
        let keeper = &keeper;
        let output_failed = |source| ProcessError::Output { source };
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| output_failed(e.into()))?;
        let stderr = write.try_clone().map_err(output_failed)?;
        let keeper_error = |source| ProcessError::Keeper {
            path: keeper.clone(),
            source,
        };
        // From before the keeper starts: the task's processes can stop the command
        // (`kill -STOP -1`) before its `exec`, which the report waits for.
        let deadline_at = tokio::time::Instant::now() + spec.timeout;
        let deadline = tokio::time::sleep_until(deadline_at);
        tokio::pin!(deadline);
        let (pid, report) = plan
            .start(keeper, None, write, stderr, handed)
            .map_err(keeper_error)?;
        let raw_pid = pid_of(pid as u32)?;
        let keeper_pidfd = rustix::process::pidfd_open(raw_pid, PidfdFlags::NONBLOCK)
            .ok()
            .map(Arc::new);
        let shim = Shim {
            pid: raw_pid,
            pidfd: keeper_pidfd.clone(),
        };
        let mut exited = Box::pin(wait_exit(raw_pid, keeper_pidfd));
        let mut output = Output::new(read, spec.output_limit);
        let report = tokio::select! {
            report = read_report_async(report) => report,
            () = &mut deadline => {
                let status = shim.end(exited.as_mut()).await;
                return Ok(Ran {
                    status,
                    output: Vec::new(),
                    output_cut: false,
                    timed_out: true,
                });
            }
        };
        if let Some(failure) = failure_of(&plan, report, program, keeper) {
            // The keeper ends by itself once a step failed, unless the task stops it on
            // the way out: it is ended at the deadline all the same.
            tokio::spawn(async move {
                tokio::select! {
                    _ = &mut exited => {}
                    () = tokio::time::sleep_until(deadline_at) => {
                        shim.end(exited.as_mut()).await;
                    }
                }
            });
            return Err(failure);
        }
        let mut timed_out = false;
        let status = loop {
            tokio::select! {
                status = &mut exited => break status,
                () = output.read_some(), if !output.ended => {}
                () = &mut deadline => {
                    timed_out = true;
                    break shim.end(exited.as_mut()).await;
                }
            }
        };
        let grace = tokio::time::sleep(OUTPUT_GRACE);
        tokio::pin!(grace);
        while !output.ended {
            tokio::select! {
                () = output.read_some() => {}
                () = &mut grace => break,
            }
        }
        Ok(Ran {
            status,
            output: output.kept,
            output_cut: output.cut,
            timed_out,
        })
    }
}

/// The keeper that became the command's shim.
pub(super) struct Shim {
    pub(super) pid: rustix::process::Pid,
    pub(super) pidfd: Option<Arc<OwnedFd>>,
}

impl Shim {
    pub(super) fn signal(&self, signal: Signal) {
        match &self.pidfd {
            Some(pidfd) => {
                let _ = rustix::process::pidfd_send_signal(pidfd.as_fd(), signal);
            }
            None => {
                let _ = rustix::process::kill_process(self.pid, signal);
            }
        }
    }

    /// Ends the command at its timeout: SIGTERM asks the shim to kill the command's
    /// whole process group ([`super::shim::Role::Shim`]); a shim that does not end
    /// within [`SHIM_GRACE`] (stopped, say) is killed, and the command with it (its
    /// parent-death signal).
    pub(super) async fn end(
        &self,
        mut exited: std::pin::Pin<&mut (impl std::future::Future<Output = ExitStatus> + ?Sized)>,
    ) -> ExitStatus {
        self.signal(Signal::TERM);
        tokio::select! {
            status = &mut exited => return status,
            () = tokio::time::sleep(SHIM_GRACE) => {}
        }
        self.signal(Signal::KILL);
        exited.await
    }
}

/// A command's output, read as it comes, up to a limit.
struct Output {
    pipe: Option<tokio::net::unix::pipe::Receiver>,
    limit: usize,
    kept: Vec<u8>,
    cut: bool,
    ended: bool,
}

impl Output {
    fn new(read: OwnedFd, limit: usize) -> Output {
        let pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(read).ok();
        Output {
            ended: pipe.is_none(),
            pipe,
            limit,
            kept: Vec::new(),
            cut: false,
        }
    }

    /// Reads what is there (waiting for some); past the limit it is dropped.
    async fn read_some(&mut self) {
        let Some(pipe) = &mut self.pipe else {
            self.ended = true;
            return;
        };
        let mut buffer = [0u8; 4096];
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                self.ended = true;
                self.pipe = None;
            }
            Ok(n) => {
                let room = self.limit.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&buffer[..n.min(room)]);
                self.cut |= n > room;
            }
        }
    }
}
