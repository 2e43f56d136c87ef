//! What a task's keeper does between its start and the task's `exec`: the **spawn
//! plan**. The agent builds it (the task's mounts planned, its seccomp filter compiled,
//! its cgroup and exit record opened) and hands it to `berth-keeper __task-spawn`
//! ([`super::keeper`]), which runs it step by step, becomes the task's shim and init on
//! the way ([`super::shim`]), and executes the task:
//!
//! ```text
//! agent ─posix_spawn─► keeper: read the plan ─► join the task's cgroup ─► join the
//!   group's network namespace, if it has one ─► unshare mount/ipc/uts/pid ─► binds,
//!   /dev, volumes ─► fork ─┐ (stays: the shim)
//!   init, pid 1: /proc ─► chroot ─► drop capabilities ─► user ─► seccomp ─► fork ─┐
//!                                      (stays: reaps, forwards, reports the status)
//!   task, pid 2: open-files limit ─► descriptors close-on-exec ─► exec
//! ```
//!
//! Descriptors the keeper starts with: 0 `/dev/null`, 1 and 2 the task's output, 3 the
//! plan (a memfd), 4 the report pipe, and from 5 on the ones the plan names (the exit
//! record, the cgroup's `cgroup.procs` files).
//!
//! The **report pipe** tells the agent how far the keeper got: first [`ACCEPTED`], once
//! the keeper has read a plan from its own build; then, if a step fails, the step's index
//! and the error number. The keeper's copy is close-on-exec and the shim and init close
//! theirs, so an end of file after [`ACCEPTED`] alone means the task's `exec` succeeded.

use std::convert::Infallible;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

use super::user_namespace::{self, UserNamespace};
use super::{confine, keeper, mount_warden, seccomp, shim};
use crate::mount::MountStep;
use berth_model::driver::TaskUser;

/// The hidden command of `berth-keeper` (and of `berth`) that runs a plan.
pub const COMMAND: &CStr = c"__task-spawn";

/// Where the keeper finds the plan and the report pipe.
const PLAN_FD: RawFd = keeper::FIRST_HANDED_FD;
const REPORT_FD: RawFd = keeper::FIRST_HANDED_FD + 1;
/// The number the first descriptor the plan names gets ([`Handed`]).
const FIRST_NAMED_FD: RawFd = keeper::FIRST_HANDED_FD + 2;

/// What the keeper writes first on the report pipe, once it has read the plan.
pub const ACCEPTED: [u8; 4] = *b"plan";

/// The largest plan a keeper reads: far above any (argv and env are bounded at the host
/// API), far below what would hurt.
const MAX_PLAN_BYTES: u64 = 64 << 20;

/// The step index reported when the keeper cannot read the plan.
const STEP_READ_PLAN: u32 = u32::MAX - 1;
/// The step index reported when the task's `exec` fails.
const STEP_EXEC: u32 = u32::MAX;

/// Which build wrote a plan: a keeper left from another build (an upgrade that replaced
/// `berth` but not `berth-keeper`) refuses it instead of misreading it.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Build {
    format: u32,
    version: String,
}

impl Build {
    fn this() -> Build {
        // 6: a controlling terminal for a command entering a task; 8: a user namespace;
        // 9: joining one; 10: a task's own capabilities.
        Build {
            format: 10,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Everything the keeper does, in order, as data. Descriptors are numbers in the
/// keeper, where [`Handed`] puts them.
#[derive(Debug, Serialize, Deserialize)]
pub struct SpawnPlan {
    /// The task's command line; the program is searched in the task's `PATH` (inside its
    /// root) when it has no `/`.
    pub argv: Vec<CString>,
    /// The task's whole environment, `NAME=value`.
    pub env: Vec<CString>,
    /// `cgroup.procs` files of the task's cgroup (one per v1 hierarchy).
    pub cgroup_procs: Vec<RawFd>,
    /// The group's network namespace (its `/run/netns` file, open), which the keeper
    /// joins before it unshares anything: every task of a group in bridge mode shares it.
    pub network_namespace: Option<RawFd>,
    /// The namespaces of a running task (its `/proc/<pid>/ns` files, open) the keeper
    /// joins next, to run a process inside that task ([`super::enter`]): its mount, ipc
    /// and uts namespaces, and the pid namespace its children are born in. The keeper
    /// then forks, so the child is born inside; no init is forked (the task has one).
    pub joined: Vec<(RawFd, JoinedNamespace)>,
    /// The plan runs a command inside a running task (confined or not): the shim is
    /// forked, the command leads a process group of its own, and the shim's SIGTERM
    /// kills that group ([`shim::Role::Shim`]).
    pub entering: bool,
    pub before_fork: Vec<MountStep>,
    /// Fork into the pid namespace `before_fork` made ([`shim`]).
    pub pid_namespace: bool,
    pub after_fork: Vec<MountStep>,
    /// Drop capabilities (to what the confinement keeps) and set `no_new_privs`
    /// ([`confine`]); `None` for an unconfined task.
    pub confine: Option<confine::Confinement>,
    pub user: Option<TaskUser>,
    /// The task's own user namespace (an image task's): made before anything else,
    /// its layers mounted idmapped through it, entered before the capability drop; the
    /// task then becomes its user inside, not [`SpawnPlan::user`].
    pub user_namespace: Option<UserNamespace>,
    /// Who a command entering a task that has its own user namespace
    /// ([`JoinedNamespace::User`]) becomes inside it, with its groups: the task's user.
    pub joined_as: Option<(TaskUser, Vec<u32>)>,
    /// The capabilities the task keeps in place of its confinement's (a task on an
    /// image whose job dropped or added some), as `CapabilitySet` bits.
    pub capabilities: Option<u64>,
    pub filter: Option<seccomp::TaskFilter>,
    /// The mount warden that makes a mounting plugin's binds ([`mount_warden`]); its
    /// filter hands them over.
    pub mount_warden: Option<mount_warden::WardenPlan>,
    /// The exit record the shim writes; a shim is forked for it even without a pid
    /// namespace.
    pub exit_record: Option<RawFd>,
    /// The open-files limit (soft, hard) the task gets: the node's, which the agent
    /// raised for itself.
    pub open_files_limit: Option<(u64, u64)>,
    /// The command entering a task (`entering`) takes its stdin, a terminal, as its
    /// controlling terminal (`alloc exec -t`).
    pub controlling_terminal: bool,
}

/// Which namespace of a running task a descriptor of [`SpawnPlan::joined`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JoinedNamespace {
    Mount,
    Ipc,
    Uts,
    /// The task's own (`/proc/<pid>/ns/pid_for_children` of its shim): only the
    /// keeper's children are born in it.
    Pid,
    /// The task's own user namespace (a task on an image), joined last: the others
    /// need root of the host's.
    User,
}

impl JoinedNamespace {
    fn kind(self) -> rustix::thread::LinkNameSpaceType {
        use rustix::thread::LinkNameSpaceType as Kind;
        match self {
            JoinedNamespace::Mount => Kind::Mount,
            JoinedNamespace::Ipc => Kind::InterProcessCommunication,
            JoinedNamespace::Uts => Kind::HostNameAndNISDomainName,
            JoinedNamespace::Pid => Kind::ProcessID,
            JoinedNamespace::User => Kind::User,
        }
    }
}

/// The descriptors an agent hands the keeper beyond the plan and the report pipe.
#[derive(Debug, Default)]
pub struct Handed(Vec<OwnedFd>);

impl Handed {
    /// Hands `fd` over; returns its number in the keeper, for the plan.
    pub fn add(&mut self, fd: OwnedFd) -> RawFd {
        self.0.push(fd);
        FIRST_NAMED_FD + self.0.len() as RawFd - 1
    }

    /// Opens the `cgroup.procs` files of a task's cgroup for writing and hands them
    /// over; returns their numbers in the keeper, for the plan.
    pub fn add_cgroup_files(
        &mut self,
        paths: &[std::path::PathBuf],
    ) -> Result<Vec<RawFd>, super::ProcessError> {
        let mut numbers = Vec::with_capacity(paths.len());
        for path in paths {
            let file = File::options().write(true).open(path);
            let file = file.map_err(|source| super::ProcessError::Cgroup {
                path: path.clone(),
                source,
            })?;
            numbers.push(self.add(file.into()));
        }
        Ok(numbers)
    }
}

/// How far a keeper got, from its report pipe.
#[derive(Debug)]
pub enum Report {
    /// The task executes.
    Started,
    /// The keeper ended before it accepted the plan: another program, or it died.
    NotAccepted,
    /// The keeper could not read the plan: another build's keeper.
    UnreadablePlan,
    /// Step `step` of [`SpawnPlan::step_names`] failed.
    StepFailed { step: usize, error: io::Error },
    /// Every step ran, and the task's `exec` failed.
    ExecFailed(io::Error),
}

impl SpawnPlan {
    /// A shim is forked for a pid namespace, for a command entering a task, and for an
    /// exit record.
    fn forks_shim(&self) -> bool {
        self.pid_namespace || self.exit_record.is_some() || self.entering
    }

    /// The names of the steps [`SpawnPlan::run`] counts, for errors.
    pub fn step_names(&self) -> Vec<String> {
        let mut names = vec![
            "join the task's cgroup".to_string(),
            "start the mount warden".to_string(),
            "join the group's network namespace".to_string(),
            "join the task's namespaces".to_string(),
            "make the task's user namespace".to_string(),
        ];
        names.extend(self.before_fork.iter().map(ToString::to_string));
        names.push(if self.pid_namespace {
            "fork into the pid namespace".into()
        } else {
            "fork the task's shim".into()
        });
        names.extend(self.after_fork.iter().map(ToString::to_string));
        names.push("enter the task's user namespace as its user".into());
        names.push("drop capabilities and set no_new_privs".into());
        names.push("switch to the task's user".into());
        names.push("install the seccomp filter".into());
        names.push("hand the plugin's mounts to its mount warden".into());
        names.push("fork the task from its namespace's init".into());
        names.push("give the task the node's open-files limit".into());
        names.push("mark descriptors above stderr close-on-exec".into());
        names
    }

    /// Starts `keeper` on this plan with the task's `stdout` and `stderr`, and waits
    /// until the task executes or a step fails. The keeper's pid is the task's shim (or,
    /// without one, the task); the caller reaps it either way.
    pub fn launch(
        &self,
        keeper: &std::path::Path,
        stdout: OwnedFd,
        stderr: OwnedFd,
        handed: Handed,
    ) -> io::Result<(i32, Report)> {
        let (pid, report) = self.start(keeper, None, stdout, stderr, handed)?;
        Ok((pid, read_report(report)))
    }

    /// Starts `keeper` on this plan (stdin `/dev/null` unless given); returns its pid
    /// and the report pipe to read ([`read_report_async`]).
    pub fn start(
        &self,
        keeper: &std::path::Path,
        stdin: Option<OwnedFd>,
        stdout: OwnedFd,
        stderr: OwnedFd,
        handed: Handed,
    ) -> io::Result<(i32, OwnedFd)> {
        let bytes = self.encode(&Build::this())?;
        let plan = rustix::fs::memfd_create(c"berth-spawn-plan", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::io::write(&plan, &bytes).and_then(|written| match written == bytes.len() {
            true => Ok(()),
            false => Err(rustix::io::Errno::IO),
        })?;
        rustix::fs::seek(&plan, rustix::fs::SeekFrom::Start(0))?;
        let (report_read, report_write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let mut fds = vec![plan.as_fd(), report_write.as_fd()];
        fds.extend(handed.0.iter().map(|fd| fd.as_fd()));
        let pid = keeper::launch(
            keeper,
            COMMAND,
            &[],
            [
                stdin.as_ref().map(|fd| fd.as_fd()),
                Some(stdout.as_fd()),
                Some(stderr.as_fd()),
            ],
            &fds,
        )?;
        // Only the keeper's copies may hold the pipe open now: its end of file is the
        // task's exec.
        drop(fds);
        drop(report_write);
        Ok((pid, report_read))
    }

    fn encode(&self, build: &Build) -> io::Result<Vec<u8>> {
        let mut bytes = postcard::to_allocvec(build).map_err(io::Error::other)?;
        bytes.extend(postcard::to_allocvec(self).map_err(io::Error::other)?);
        Ok(bytes)
    }

    /// Runs the plan, up to the task's `exec`. On failure, the index of the failed step
    /// in [`SpawnPlan::step_names`]. Forks on the way: the shim and the init never
    /// return from here. Async-signal-safe after the first fork: raw system calls on
    /// data prepared before it.
    fn run(&self) -> Result<(), (usize, io::Error)> {
        for &fd in &self.cgroup_procs {
            // "0" is the writing process.
            // SAFETY: a descriptor the agent handed over at this number.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            rustix::io::write(fd, b"0").map_err(|e| (0, e.into()))?;
        }
        // Forked before any namespace is unshared: the warden stays in the agent's.
        let warden = match &self.mount_warden {
            Some(plan) => Some(mount_warden::start(plan).map_err(|e| (1, e))?),
            None => None,
        };
        if let Some(fd) = self.network_namespace {
            // SAFETY: a descriptor the agent handed over at this number.
            let namespace = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            rustix::thread::move_into_link_name_space(
                namespace,
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .map_err(|e| (2, e.into()))?;
        }
        for &(fd, namespace) in &self.joined {
            // SAFETY: a descriptor the agent handed over at this number.
            let file = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            rustix::thread::move_into_link_name_space(file, Some(namespace.kind()))
                .map_err(|e| (3, e.into()))?;
        }
        let user_namespace = match &self.user_namespace {
            Some(namespace) => Some(namespace.create().map_err(|e| (4, e))?),
            None => None,
        };
        let mut index = 5;
        for step in &self.before_fork {
            step.execute_in(user_namespace.as_ref().map(|fd| fd.as_fd()))
                .map_err(|e| (index, e))?;
            index += 1;
        }
        if self.forks_shim() {
            let record = self.exit_record.unwrap_or(-1);
            // SAFETY: the keeper has one thread; with a pid namespace, after unsharing it
            // (the first steps of `before_fork`).
            let role = shim::Role::Shim {
                record,
                entering: self.entering,
                terminal: self.entering && self.controlling_terminal,
            };
            unsafe { shim::fork(role) }.map_err(|e| (index, e))?;
        }
        index += 1;
        for step in &self.after_fork {
            step.execute().map_err(|e| (index, e))?;
            index += 1;
        }
        if let Some(namespace) = &user_namespace {
            // Last: the mounts above needed root of the host's namespace.
            user_namespace::enter(namespace.as_fd()).map_err(|e| (index, e))?;
        }
        drop(user_namespace);
        // In a user namespace (made or joined), the task's user is taken while every
        // capability in it is still there (setgroups needs CAP_SETGID, which a task's
        // `cap_drop` may remove); the kernel then clears nothing, so a user other than
        // root loses its capabilities below, after the bounding set is cut.
        let inside = match (&self.user_namespace, &self.joined_as) {
            (Some(namespace), _) => Some((namespace.user, namespace.groups.as_slice())),
            (None, Some((user, groups))) => Some((*user, groups.as_slice())),
            (None, None) => None,
        };
        if let Some((user, groups)) = inside {
            user_namespace::become_inside(user, groups).map_err(|e| (index, e))?;
        }
        index += 1;
        if let Some(confinement) = self.confine {
            let kept = match self.capabilities {
                // More than the confinement's only in a user namespace of the task's own,
                // whatever the agent asked (attack review).
                Some(bits) => {
                    let kept = rustix::thread::CapabilitySet::from_bits_retain(bits);
                    let ceiling = match inside {
                        Some(_) => confine::IMAGE_TASK_CAPABILITIES,
                        None => confinement.capabilities(),
                    };
                    if !ceiling.contains(kept) {
                        let wider = io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "capabilities past what the task may have",
                        );
                        return Err((index, wider));
                    }
                    kept
                }
                None => confinement.capabilities(),
            };
            confine::drop_privileges_to(kept).map_err(|e| (index, e))?;
        }
        index += 1;
        let became = match (inside, self.user) {
            (Some((user, _)), _) => {
                user_namespace::keep_capabilities_only_as_root(user).map(|()| true)
            }
            (None, Some(user)) => confine::become_user(user).map(|()| true),
            (None, None) => Ok(false),
        };
        if became.map_err(|e| (index, e))? && self.forks_shim() {
            // Changing user cleared the parent-death signal: set it again.
            shim::die_with_parent().map_err(|e| (index, e))?;
        }
        index += 1;
        let listener = match &self.filter {
            Some(filter) => filter.install().map_err(|e| (index, e))?,
            None => None,
        };
        index += 1;
        match (warden, listener) {
            (Some(warden), Some(listener)) => {
                mount_warden::hand_over(warden, listener).map_err(|e| (index, e))?
            }
            (None, None) => {}
            _ => {
                let mismatch = io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a mount warden and a filter that hands it nothing (or the reverse)",
                );
                return Err((index, mismatch));
            }
        }
        index += 1;
        if self.pid_namespace {
            // SAFETY: one thread, pid 1 of the namespace.
            unsafe { shim::fork(shim::Role::Init) }.map_err(|e| (index, e))?;
        }
        index += 1;
        if let Some((soft, hard)) = self.open_files_limit {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: setrlimit on a valid struct.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
                return Err((index, io::Error::last_os_error()));
            }
        }
        index += 1;
        super::cloexec_from(3).map_err(|e| (index, e))
    }

    /// The highest descriptor number the plan names.
    fn highest_fd(&self) -> RawFd {
        self.cgroup_procs
            .iter()
            .chain(&self.exit_record)
            .chain(&self.network_namespace)
            .chain(self.joined.iter().map(|(fd, _)| fd))
            .copied()
            .fold(REPORT_FD, RawFd::max)
    }
}

/// The argv and environment as C strings (`NAME=value`); a NUL byte in either is refused.
pub(super) fn c_strings(
    program: &str,
    argv: &[String],
    env: &[(String, String)],
) -> Result<(Vec<CString>, Vec<CString>), super::ProcessError> {
    let nul = || super::ProcessError::Exec {
        program: program.to_string(),
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NUL byte in an argument or variable",
        ),
    };
    let argv = argv
        .iter()
        .map(|arg| CString::new(arg.as_str()).map_err(|_| nul()))
        .collect::<Result<_, _>>()?;
    let env = env
        .iter()
        .map(|(name, value)| CString::new(format!("{name}={value}")).map_err(|_| nul()))
        .collect::<Result<_, _>>()?;
    Ok((argv, env))
}

/// What went wrong, from a keeper's report on its plan (`None`: the program executes).
pub(super) fn failure_of(
    plan: &SpawnPlan,
    report: Report,
    program: String,
    keeper: &std::path::Path,
) -> Option<super::ProcessError> {
    let keeper_error = |source| super::ProcessError::Keeper {
        path: keeper.to_path_buf(),
        source,
    };
    match report {
        Report::Started => None,
        Report::StepFailed { step, error } => Some(super::ProcessError::Setup {
            step: plan.step_names().get(step).cloned().unwrap_or_default(),
            source: error,
        }),
        Report::ExecFailed(source) if source.kind() == io::ErrorKind::NotFound => {
            let source = io::Error::new(
                io::ErrorKind::NotFound,
                "no such program (paths are resolved inside the task's root)",
            );
            Some(super::ProcessError::Exec { program, source })
        }
        Report::ExecFailed(source) => Some(super::ProcessError::Exec { program, source }),
        Report::NotAccepted => Some(keeper_error(io::Error::other(
            "it ended before it took the task: is it berth-keeper, from this agent's build?",
        ))),
        Report::UnreadablePlan => Some(keeper_error(io::Error::other(
            "it could not read the task's spawn plan: it is from another build of berth \
             (its own words are in the task's stderr)",
        ))),
    }
}

/// [`read_report`] without holding a thread: for a command entering a running task,
/// whose processes can stop it before its `exec` (`kill -STOP -1`).
pub async fn read_report_async(report: OwnedFd) -> Report {
    use tokio::io::AsyncReadExt as _;
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(report) else {
        return Report::NotAccepted;
    };
    let mut bytes = Vec::with_capacity(ACCEPTED.len() + 8);
    let mut buffer = [0u8; 16];
    while bytes.len() < ACCEPTED.len() + 8 {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => bytes.extend_from_slice(&buffer[..n]),
        }
    }
    parse_report(&bytes)
}

/// Reads the report pipe to its end (see the module's documentation).
fn read_report(report: OwnedFd) -> Report {
    let mut bytes = Vec::with_capacity(ACCEPTED.len() + 8);
    let mut reader = File::from(report);
    let mut buffer = [0u8; 16];
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                bytes.extend_from_slice(&buffer[..n]);
                // A failure is the last thing on the pipe; its end of file comes with
                // the failing process's exit.
                if bytes.len() >= ACCEPTED.len() + 8 {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    parse_report(&bytes)
}

fn parse_report(bytes: &[u8]) -> Report {
    let Some(rest) = bytes.strip_prefix(&ACCEPTED) else {
        return match bytes
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
        {
            Some(STEP_READ_PLAN) => Report::UnreadablePlan,
            _ => Report::NotAccepted,
        };
    };
    if rest.is_empty() {
        return Report::Started;
    }
    // Written with one write(2) of 8 bytes, which a pipe never tears.
    let (Some(step), Some(errno)) = (rest.get(..4), rest.get(4..8)) else {
        return Report::ExecFailed(io::Error::other("an incomplete report from the keeper"));
    };
    let step = u32::from_le_bytes(step.try_into().unwrap_or_default());
    let error =
        io::Error::from_raw_os_error(i32::from_le_bytes(errno.try_into().unwrap_or_default()));
    match step {
        STEP_EXEC => Report::ExecFailed(error),
        step => Report::StepFailed {
            step: step as usize,
            error,
        },
    }
}

/// Writes a failed step to the report pipe. Async-signal-safe.
fn report_failure(step: u32, error: &io::Error) {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&step.to_le_bytes());
    bytes[4..].copy_from_slice(&error.raw_os_error().unwrap_or(libc::EIO).to_le_bytes());
    // SAFETY: write(2) on the report pipe's number; a failed write changes nothing.
    unsafe { libc::write(REPORT_FD, bytes.as_ptr().cast(), bytes.len()) };
}

/// The entry point of `berth-keeper __task-spawn`: `Some` never returns; `None` when the
/// process was not started as one.
pub fn keeper_main() -> Option<Infallible> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1)?.as_encoded_bytes() != COMMAND.to_bytes() {
        return None;
    }
    // Rust's runtime ignores SIGPIPE, and an ignored signal stays ignored across exec:
    // the task gets the default back.
    // SAFETY: signal(2) with a valid disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let plan = match read_plan() {
        Ok(plan) => plan,
        Err(error) => {
            report_failure(STEP_READ_PLAN, &error);
            eprintln!("berth-keeper {}: {error}", COMMAND.to_string_lossy());
            std::process::exit(2);
        }
    };
    keeper::close_from(plan.highest_fd() + 1);
    // SAFETY: write and fcntl on the report pipe's number.
    unsafe {
        libc::write(REPORT_FD, ACCEPTED.as_ptr().cast(), ACCEPTED.len());
        libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    let Some(program) = plan.argv.first() else {
        report_failure(STEP_EXEC, &io::Error::from_raw_os_error(libc::ENOENT));
        std::process::exit(127);
    };
    let argv: Vec<*const libc::c_char> = plan
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp: Vec<*const libc::c_char> = plan
        .env
        .iter()
        .map(|e| e.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    // `execvpe` searches the caller's PATH: make it the task's (the keeper has no
    // environment of its own). Without one, the C library's default path is searched.
    if let Some(path) = plan
        .env
        .iter()
        .find_map(|e| e.to_bytes().strip_prefix(b"PATH="))
    {
        use std::os::unix::ffi::OsStrExt as _;
        // SAFETY: the keeper has one thread.
        unsafe { std::env::set_var("PATH", std::ffi::OsStr::from_bytes(path)) };
    }
    if let Err((step, error)) = plan.run() {
        report_failure(step as u32, &error);
        // SAFETY: _exit(2) ends this process only.
        unsafe { libc::_exit(127) };
    }
    // SAFETY: NUL-terminated arrays of pointers into `plan`, which outlives the call.
    unsafe { libc::execvpe(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    report_failure(STEP_EXEC, &io::Error::last_os_error());
    // SAFETY: as above.
    unsafe { libc::_exit(127) }
}

/// The plan on descriptor 3.
fn read_plan() -> io::Result<SpawnPlan> {
    // SAFETY: the agent hands the plan over at this number; nothing else owns it.
    let file = unsafe { File::from_raw_fd(PLAN_FD) };
    let mut bytes = Vec::new();
    file.take(MAX_PLAN_BYTES).read_to_end(&mut bytes)?;
    decode_plan(&bytes)
}

/// A plan as [`SpawnPlan::launch`] writes it, from this build only.
fn decode_plan(bytes: &[u8]) -> io::Result<SpawnPlan> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let (build, rest) = postcard::take_from_bytes::<Build>(bytes).map_err(|_| {
        invalid("not a spawn plan (internal command, started by the agent only)".into())
    })?;
    if build != Build::this() {
        return Err(invalid(format!(
            "a plan from berth {} (plan format {}), and this keeper is from berth {} (plan \
             format {})",
            build.version,
            build.format,
            Build::this().version,
            Build::this().format
        )));
    }
    postcard::from_bytes(rest).map_err(|e| invalid(format!("unreadable spawn plan: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(parts: &[&[u8]]) -> Report {
        parse_report(&parts.concat())
    }

    #[test]
    fn a_report_tells_started_failed_and_never_accepted_apart() {
        assert!(matches!(report(&[&ACCEPTED]), Report::Started));
        assert!(matches!(report(&[]), Report::NotAccepted));
        assert!(matches!(report(&[b"pl"]), Report::NotAccepted));
        assert!(matches!(
            report(&[&STEP_READ_PLAN.to_le_bytes(), &22i32.to_le_bytes()]),
            Report::UnreadablePlan
        ));
        match report(&[&ACCEPTED, &3u32.to_le_bytes(), &1i32.to_le_bytes()]) {
            Report::StepFailed { step: 3, error } => assert_eq!(error.raw_os_error(), Some(1)),
            other => panic!("{other:?}"),
        }
        match report(&[&ACCEPTED, &STEP_EXEC.to_le_bytes(), &2i32.to_le_bytes()]) {
            Report::ExecFailed(error) => assert_eq!(error.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            report(&[&ACCEPTED, &[1, 0]]),
            Report::ExecFailed(_)
        ));
    }

    fn plan() -> SpawnPlan {
        SpawnPlan {
            argv: vec![c"/bin/true".into()],
            env: vec![c"PATH=/bin".into()],
            cgroup_procs: vec![5, 6],
            network_namespace: Some(8),
            joined: vec![(9, JoinedNamespace::Mount), (10, JoinedNamespace::Pid)],
            entering: true,
            before_fork: vec![MountStep::UnshareNamespace],
            pid_namespace: true,
            after_fork: vec![MountStep::Chdir { dir: c"/".into() }],
            confine: Some(confine::Confinement::Task),
            user: Some(TaskUser {
                uid: 65534,
                gid: 65534,
            }),
            user_namespace: None,
            joined_as: None,
            capabilities: None,
            filter: None,
            mount_warden: None,
            exit_record: Some(7),
            open_files_limit: Some((1024, 4096)),
            controlling_terminal: false,
        }
    }

    #[test]
    fn a_keeper_reads_its_own_builds_plans_and_refuses_others() {
        let bytes = plan().encode(&Build::this()).unwrap();
        let read = decode_plan(&bytes).unwrap();
        assert_eq!(format!("{read:?}"), format!("{:?}", plan()));
        assert_eq!(read.highest_fd(), 10);
        let older = Build {
            format: 0,
            version: "0.0.9".into(),
        };
        let error = decode_plan(&plan().encode(&older).unwrap()).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("a plan from berth 0.0.9 (plan format 0), and this keeper"),
            "{error}"
        );
        let error = decode_plan(b"garbage").unwrap_err();
        assert!(error.to_string().contains("not a spawn plan"), "{error}");
        assert!(decode_plan(&bytes[..bytes.len() - 3]).is_err());
    }

    #[test]
    fn handed_descriptors_are_numbered_after_the_plan_and_the_report() {
        let mut handed = Handed::default();
        let first = handed.add(File::open("/dev/null").unwrap().into());
        let second = handed.add(File::open("/dev/null").unwrap().into());
        assert_eq!((first, second), (5, 6));
    }
}
