//! How a task gets a pid namespace of its own: a shim and an init around it.
//!
//! `unshare(CLONE_NEWPID)` puts only the caller's *future children* in the new
//! namespace, and the first of them is the namespace's pid 1, which the kernel treats
//! as an init: a signal it has no handler for is dropped. So a confined task is three
//! processes, all forked from the agent's child before `exec`:
//!
//! ```text
//! agent ─► shim (agent's pid namespace) ─► init (pid 1) ─► task (pid 2, exec)
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
//!   shim, after a task's kill timeout, takes everything with it.
//!
//! The shim and the init are copies of the agent that never `exec`: they are made
//! non-dumpable before the task forks, so the task, although it can see the init, can
//! neither read its memory nor attach to it. Everything here runs between `fork` and
//! `exec` in a copy of a threaded process: raw system calls only, no allocation.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};

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

extern "C" fn forward(signal: libc::c_int) {
    let child = CHILD.load(Ordering::Relaxed);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(child, signal) };
    }
}

/// What the caller becomes while the forked child goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// In the agent's namespace, after `unshare(CLONE_NEWPID)`: the child is pid 1.
    Shim,
    /// pid 1: the child is the task.
    Init,
}

/// Forks. Returns `Ok` in the child; the caller becomes `role` and never returns.
///
/// # Safety
/// Only between `fork` and `exec`, in a process with one thread; `Role::Shim` after
/// `unshare(CLONE_NEWPID)`, `Role::Init` in the child that returned from the shim's.
pub unsafe fn fork(role: Role) -> io::Result<()> {
    // SAFETY (whole function): plain system calls on valid pointers to local data.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut status_pipe: [libc::c_int; 2] = [-1, -1];
        if role == Role::Shim && libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
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
            if role == Role::Shim {
                libc::close(status_pipe[0]);
                REPORT_STATUS_TO.store(status_pipe[1], Ordering::Relaxed);
            }
            die_with_parent()?;
            libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            return Ok(());
        }
        match role {
            Role::Shim => {
                libc::close(status_pipe[1]);
                supervise(child, status_pipe[0], -1)
            }
            Role::Init => supervise(child, -1, REPORT_STATUS_TO.load(Ordering::Relaxed)),
        }
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

/// Closes every descriptor from 3 up except `keep` (-1: none).
unsafe fn close_all_but(keep: RawFd) {
    // SAFETY: close_range on integer arguments.
    unsafe {
        if keep >= 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (keep - 1) as u32, 0u32);
            libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32);
        } else {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        }
    }
}

/// Forwards signals to `child`, reaps every child until `child` exits, then ends the
/// way it did: with the status read from `status_from` (the init's report) when there
/// is one, after writing it to `status_to` when there is one.
unsafe fn supervise(child: libc::pid_t, status_from: RawFd, status_to: RawFd) -> ! {
    // SAFETY (whole function): plain system calls on valid pointers to local data.
    unsafe {
        CHILD.store(child, Ordering::Relaxed);
        // What the agent's copy left open (among it the pipe that tells the agent whether
        // `exec` succeeded) belongs to the task now.
        close_all_but(status_from.max(status_to));
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
            let mut reaped: libc::c_int = 0;
            let pid = libc::waitpid(-1, &mut reaped, 0);
            if pid == child {
                break reaped;
            }
            if pid < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
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
