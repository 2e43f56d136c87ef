//! How a task gets a pid namespace of its own: a shim and an init around it.
//!
//! `unshare(CLONE_NEWPID)` puts only the caller's *future children* in the new
//! namespace, and the first of them is the namespace's pid 1, which the kernel treats
//! as an init: a signal it has no handler for is dropped. So a confined task is three
//! processes, the first two `berth-keeper` running the task's spawn plan
//! ([`super::spawn_plan`]):
//!
//! ```text
//! agent ─posix_spawn─► shim (keeper, agent's pid namespace) ─fork─► init (pid 1)
//!   ─fork─► task (pid 2, exec)
//! ```
//!
//! - The **shim** is what the agent tracks (pidfd, reaping, exit status, adoption after
//!   a restart), as it would the task itself.
//! - The **init** reaps the namespace's orphans, as an init must.
//! - Each passes the signals it gets on to its child, and when its child exits, it ends
//!   the same way: the init hands the task's raw wait status up a pipe (an init cannot
//!   die of its own signals), and the shim exits with that code or re-raises that
//!   signal, so the driver reads the task's own status.
//! - Each child gets SIGKILL when its parent dies (`PR_SET_PDEATHSIG`), and when the
//!   init dies the kernel kills every process left in the namespace: SIGKILL to the
//!   shim, after a task's kill timeout, takes everything with it. The shim itself does
//!   not die with the agent.
//!
//! The shim also writes the task's exit status and time to an **exit record** (a file
//! the agent opened for it): a shim outlives an agent killed with `kill -9`, and the
//! next agent, no longer its parent, reads there how the task ended. For that, an
//! unconfined task (no pid namespace) gets a shim too, without the init.
//!
//! The task can see the init (pid 1 of its namespace, with the task's own credentials),
//! so the init must never be dumpable, or `/proc/1/mem` would open for the task. Each
//! supervisor makes itself non-dumpable before it forks, never executes anything
//! afterwards (an `exec` would make it dumpable again), and the task is forked only
//! after that.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The signals passed on. SIGKILL and SIGSTOP cannot be caught: SIGKILL reaches the
/// task through the parent-death signals; SIGSTOP stops the shim only.
const FORWARDED: &[libc::c_int] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTERM,
    libc::SIGCONT,
    libc::SIGWINCH,
    libc::SIGALRM,
];

/// The child signals go to, for the handler.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// The write end of the pipe the init reports the task's wait status on (-1: none).
static REPORT_STATUS_TO: AtomicI32 = AtomicI32::new(-1);

/// The child runs a command inside a running task, leading a process group of its own
/// ([`Role::Shim`]'s `entering`).
static ENTERING: AtomicBool = AtomicBool::new(false);

extern "C" fn forward(signal: libc::c_int) {
    let child = CHILD.load(Ordering::Relaxed);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe {
            if ENTERING.load(Ordering::Relaxed) {
                // Only the agent can signal this shim (it is outside the task's pid
                // namespace), and its SIGTERM is the command's timeout: the whole group,
                // and the child itself should it not lead it yet.
                let signal = if signal == libc::SIGTERM {
                    libc::SIGKILL
                } else {
                    signal
                };
                libc::kill(-child, signal);
            }
            libc::kill(child, signal)
        };
    }
}

/// What the caller becomes while the forked child goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The agent's child: after `unshare(CLONE_NEWPID)` its child is pid 1 (the init),
    /// otherwise the task itself. Writes the exit record to `record` (-1: none).
    /// `entering`: the child runs a command inside a running task
    /// ([`super::enter`]); it leads a new session and process group, signals go to the
    /// whole group, and SIGTERM (the agent's timeout) kills it. `terminal`: its stdin
    /// is a terminal, which becomes its session's controlling terminal.
    Shim {
        record: RawFd,
        entering: bool,
        terminal: bool,
    },
    /// pid 1: the child is the task.
    Init,
}

/// The bytes of an exit record: the raw wait status (i32) and the exit time in seconds
/// since the epoch (i64), little-endian.
pub const EXIT_RECORD_LEN: usize = 12;

/// How a task ended, from its exit record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRecord {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub exited_at_unix: i64,
}

impl ExitRecord {
    /// `None` for anything but a whole record (a shim killed while writing it).
    pub fn parse(bytes: &[u8]) -> Option<ExitRecord> {
        let status = i32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
        let exited_at_unix = i64::from_le_bytes(bytes.get(4..12)?.try_into().ok()?);
        let (code, signal) = if libc::WIFEXITED(status) {
            (Some(libc::WEXITSTATUS(status)), None)
        } else if libc::WIFSIGNALED(status) {
            (None, Some(libc::WTERMSIG(status)))
        } else {
            return None;
        };
        Some(ExitRecord {
            code,
            signal,
            exited_at_unix,
        })
    }
}

/// Forks. Returns `Ok` in the child; the caller becomes `role`, supervises its child and
/// never returns.
///
/// # Safety
/// Only in a process with one thread; `Role::Shim` after `unshare(CLONE_NEWPID)` when the
/// child is to be the namespace's init, `Role::Init` in the child that returned from the
/// shim's.
pub unsafe fn fork(role: Role) -> io::Result<()> {
    // SAFETY (whole function): plain system calls on valid pointers to local data.
    unsafe {
        // Before the fork, so the child (and the task, forked from the init) is never
        // in a moment where the supervisor above it is dumpable.
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut status_pipe: [libc::c_int; 2] = [-1, -1];
        if matches!(role, Role::Shim { .. })
            && libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // Every signal blocked across the fork: none reaches the parent before its
        // handlers are in place, or the child before it is set up.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, &mut before);
        let child = libc::fork();
        if child < 0 {
            let error = io::Error::last_os_error();
            libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            return Err(error);
        }
        if child == 0 {
            if let Role::Shim {
                record,
                entering,
                terminal,
            } = role
            {
                libc::close(status_pipe[0]);
                if record >= 0 {
                    libc::close(record);
                }
                REPORT_STATUS_TO.store(status_pipe[1], Ordering::Relaxed);
                // What the command starts stays in its group, for its timeout to end.
                if entering && libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                // Job control and ^C reach the command through the terminal it leads.
                if terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            die_with_parent()?;
            libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            return Ok(());
        }
        let (status_from, status_to, record) = match role {
            Role::Shim {
                record, entering, ..
            } => {
                libc::close(status_pipe[1]);
                ENTERING.store(entering, Ordering::Relaxed);
                (status_pipe[0], -1, record)
            }
            Role::Init => (-1, REPORT_STATUS_TO.load(Ordering::Relaxed), -1),
        };
        supervise(child, status_from, status_to, record)
    }
}

/// Makes the kernel SIGKILL the caller when its parent dies. Must be repeated after a
/// change of user: the kernel clears it on every credential change.
pub fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes every descriptor from 3 up except those in `keep` (-1: none).
pub(super) unsafe fn close_all_but<const N: usize>(mut keep: [RawFd; N]) {
    keep.sort_unstable();
    let mut from: u32 = 3;
    // SAFETY: close_range on integer arguments.
    unsafe {
        for fd in keep.into_iter().filter(|fd| *fd >= 3) {
            let fd = fd as u32;
            if fd > from {
                libc::syscall(libc::SYS_close_range, from, fd - 1, 0u32);
            }
            from = fd + 1;
        }
        libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32);
    }
}

/// Forwards signals to `child`, reaps every child until `child` exits, then ends the
/// way it did: with the status read from `status_from` (the init's report) when there
/// is one, after writing it to `status_to` and the exit record `record` when there are.
unsafe fn supervise(child: libc::pid_t, status_from: RawFd, status_to: RawFd, record: RawFd) -> ! {
    // SAFETY (whole function): plain system calls on valid pointers to local data.
    unsafe {
        CHILD.store(child, Ordering::Relaxed);
        // What the keeper was handed (among it the pipe that tells the agent whether the
        // task's `exec` succeeded, and the task's cgroup files) is not the supervisor's.
        close_all_but([status_from, status_to, record]);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        for &signal in FORWARDED {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = forward as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigfillset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        let mut status = loop {
            // Seen exited before it is reaped (a zombie keeps its pid): the forwarder
            // forgets it first, so no signal goes to a pid the host may hand out again.
            let mut info: libc::siginfo_t = std::mem::zeroed();
            if libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) < 0 {
                if *libc::__errno_location() != libc::EINTR {
                    libc::_exit(127);
                }
                continue;
            }
            let pid = info.si_pid();
            if pid == child {
                CHILD.store(0, Ordering::Relaxed);
            }
            let mut reaped: libc::c_int = 0;
            if libc::waitpid(pid, &mut reaped, 0) == child {
                break reaped;
            }
        };
        if status_from >= 0 {
            let mut reported = [0u8; 4];
            if libc::read(status_from, reported.as_mut_ptr().cast(), 4) == 4 {
                status = libc::c_int::from_ne_bytes(reported);
            }
        }
        if status_to >= 0 {
            libc::write(status_to, status.to_ne_bytes().as_ptr().cast(), 4);
        }
        if record >= 0 {
            let mut now: libc::timespec = std::mem::zeroed();
            libc::clock_gettime(libc::CLOCK_REALTIME, &mut now);
            let mut bytes = [0u8; EXIT_RECORD_LEN];
            bytes[..4].copy_from_slice(&status.to_le_bytes());
            bytes[4..].copy_from_slice(&(now.tv_sec as i64).to_le_bytes());
            libc::pwrite(record, bytes.as_ptr().cast(), EXIT_RECORD_LEN, 0);
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let signal = libc::WTERMSIG(status);
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &action, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_records_read_back_codes_and_signals() {
        let mut bytes = Vec::from(0x0300i32.to_le_bytes());
        bytes.extend(1_700_000_000i64.to_le_bytes());
        assert_eq!(
            ExitRecord::parse(&bytes),
            Some(ExitRecord {
                code: Some(3),
                signal: None,
                exited_at_unix: 1_700_000_000
            })
        );
        let mut killed = Vec::from(9i32.to_le_bytes());
        killed.extend(5i64.to_le_bytes());
        assert_eq!(
            ExitRecord::parse(&killed).map(|r| (r.code, r.signal)),
            Some((None, Some(9)))
        );
        assert_eq!(ExitRecord::parse(&[]), None);
        assert_eq!(
            ExitRecord::parse(&bytes[..11]),
            None,
            "a torn record is no record"
        );
    }
}
