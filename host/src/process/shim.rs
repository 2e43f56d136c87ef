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
//! The shim also writes the task's exit status and time to an **exit record** (a file
//! the agent opened for it): a shim outlives an agent killed with `kill -9`, and the
//! next agent, no longer its parent, reads there how the task ended. For that, an
//! unconfined task (no pid namespace) gets a shim too, without the init.
//!
//! Forked from the agent, the shim and the init would share every page of its memory,
//! and pin an old copy of each page the agent writes afterwards, for as long as the
//! task runs. So, once it has forked its child, each **re-executes the `berth`
//! binary** (`berth __task-shim` / `berth __task-init`, through a descriptor opened
//! before the chroot) and carries on as a small process of its own. Without a binary to
//! run (a table built without one), they stay forked copies, made non-dumpable so that
//! the task, which can see the init, can neither read its memory nor attach to it.
//! Everything before the re-exec runs between `fork` and `exec` in a copy of a
//! threaded process: raw system calls only, no allocation.
//!
//! A re-executed image is dumpable until its `main` says otherwise, and the task can see
//! the init (pid 1 of its namespace, with the task's own credentials): in that moment
//! `/proc/1/mem` would open for it. So the task waits, before its `exec`, until the init
//! says it is non-dumpable again (a byte on a pipe: the *ready* pipe).

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
    /// The agent's child: after `unshare(CLONE_NEWPID)` its child is pid 1 (the init),
    /// otherwise the task itself. Writes the exit record to `record` (-1: none).
    Shim { record: RawFd },
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

/// Forks. Returns `Ok` in the child; the caller becomes `role` and never returns: it
/// re-executes `program` (an open `berth` binary; -1: none) as a supervisor, or
/// supervises in place when it cannot.
///
/// # Safety
/// Only between `fork` and `exec`, in a process with one thread; `Role::Shim` after
/// `unshare(CLONE_NEWPID)`, `Role::Init` in the child that returned from the shim's.
pub unsafe fn fork(role: Role, program: RawFd) -> io::Result<()> {
    // SAFETY (whole function): plain system calls on valid pointers to local data.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut status_pipe: [libc::c_int; 2] = [-1, -1];
        if matches!(role, Role::Shim { .. })
            && libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut ready_pipe: [libc::c_int; 2] = [-1, -1];
        if role == Role::Init && libc::pipe2(ready_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
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
            if let Role::Shim { record } = role {
                libc::close(status_pipe[0]);
                if record >= 0 {
                    libc::close(record);
                }
                REPORT_STATUS_TO.store(status_pipe[1], Ordering::Relaxed);
            }
            die_with_parent()?;
            libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            if role == Role::Init {
                // The task: not one instruction of its own until the init is closed.
                libc::close(ready_pipe[1]);
                let mut byte = [0u8; 1];
                let read = loop {
                    let n = libc::read(ready_pipe[0], byte.as_mut_ptr().cast(), 1);
                    if n >= 0 || *libc::__errno_location() != libc::EINTR {
                        break n;
                    }
                };
                libc::close(ready_pipe[0]);
                if read != 1 {
                    return Err(io::Error::other(
                        "the task's init ended before it was ready",
                    ));
                }
            }
            return Ok(());
        }
        if role == Role::Init {
            libc::close(ready_pipe[0]);
        }
        let ready_to = ready_pipe[1];
        let (name, status_from, status_to, record) = match role {
            Role::Shim { record } => {
                libc::close(status_pipe[1]);
                (SHIM_COMMAND, status_pipe[0], -1, record)
            }
            Role::Init => (
                INIT_COMMAND,
                -1,
                REPORT_STATUS_TO.load(Ordering::Relaxed),
                -1,
            ),
        };
        if program >= 0 {
            // First let go of what belongs to the task, above all the pipe on which the
            // agent waits for the task's `exec`: the agent need not wait for this one.
            close_all_but([status_from, status_to, record, program, ready_to]);
            reexec(
                program,
                name,
                [child, status_from, status_to, record, ready_to],
            );
        }
        // A forked copy stays non-dumpable (set above, before the fork).
        signal_ready(ready_to);
        supervise(child, status_from, status_to, record)
    }
}

/// The hidden commands of the `berth` binary that run a supervisor.
const SHIM_COMMAND: &std::ffi::CStr = c"__task-shim";
const INIT_COMMAND: &std::ffi::CStr = c"__task-init";

/// Tells the task its init is non-dumpable (`ready_to` -1: nobody waits).
fn signal_ready(ready_to: RawFd) {
    if ready_to >= 0 {
        // SAFETY: write and close on a descriptor this process owns.
        unsafe {
            libc::write(ready_to, [1u8].as_ptr().cast(), 1);
            libc::close(ready_to);
        }
    }
}

/// Executes `program` as `berth <name> <child> <status-from> <status-to> <record>
/// <ready-to>`, keeping those descriptors open. Returns only if the exec failed.
unsafe fn reexec(program: RawFd, name: &std::ffi::CStr, numbers: [libc::c_int; 5]) {
    // SAFETY (whole function): plain system calls on valid pointers to local data.
    unsafe {
        for fd in &numbers[1..] {
            if *fd >= 0 {
                libc::fcntl(*fd, libc::F_SETFD, 0);
            }
        }
        let mut texts = [[0u8; 16]; 5];
        for (text, number) in texts.iter_mut().zip(numbers) {
            write_decimal(text, number);
        }
        let argv: [*const libc::c_char; 8] = [
            c"berth".as_ptr(),
            name.as_ptr(),
            texts[0].as_ptr().cast(),
            texts[1].as_ptr().cast(),
            texts[2].as_ptr().cast(),
            texts[3].as_ptr().cast(),
            texts[4].as_ptr().cast(),
            std::ptr::null(),
        ];
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        libc::syscall(
            libc::SYS_execveat,
            program,
            c"".as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
}

/// Writes `number` in decimal, NUL-terminated, without allocating.
fn write_decimal(out: &mut [u8; 16], number: libc::c_int) {
    let mut digits = [0u8; 12];
    let mut value = i64::from(number).unsigned_abs();
    let mut count = 0;
    loop {
        digits[count] = b'0' + (value % 10) as u8;
        value /= 10;
        count += 1;
        if value == 0 {
            break;
        }
    }
    let mut at = 0;
    if number < 0 {
        out[0] = b'-';
        at = 1;
    }
    for digit in digits[..count].iter().rev() {
        out[at] = *digit;
        at += 1;
    }
    out[at] = 0;
}

/// The entry point of a re-executed supervisor: `Some` never returns. `None` when the
/// process was not started as one (the normal `berth` command line).
pub fn supervisor_main() -> Option<std::convert::Infallible> {
    use std::os::unix::ffi::OsStrExt;
    // Not `args()`: it panics on a command line that is not UTF-8, which is the CLI's
    // to refuse politely.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let role = args.get(1)?.as_bytes();
    if role != INIT_COMMAND.to_bytes() && role != SHIM_COMMAND.to_bytes() {
        return None;
    }
    let number = |index: usize| -> libc::c_int {
        args.get(index)
            .and_then(|text| text.to_str()?.parse().ok())
            .unwrap_or(-1)
    };
    let (child, status_from, status_to, record) = (number(2), number(3), number(4), number(5));
    let ready_to = number(6);
    if child <= 0 {
        eprintln!(
            "berth {}: internal command, started by the agent only",
            String::from_utf8_lossy(role)
        );
        std::process::exit(2);
    }
    // SAFETY: plain system calls; this process has one thread.
    unsafe {
        // A re-executed image is dumpable again: the task can see the init, and waits
        // for this before it runs.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        signal_ready(ready_to);
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
unsafe fn close_all_but<const N: usize>(mut keep: [RawFd; N]) {
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
        // What the agent's copy left open (among it the pipe that tells the agent whether
        // `exec` succeeded) belongs to the task now.
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
    fn writes_decimals_without_allocating() {
        let mut out = [0xffu8; 16];
        for (number, text) in [(0, "0"), (7, "7"), (-1, "-1"), (2147483647, "2147483647")] {
            write_decimal(&mut out, number);
            let end = out.iter().position(|b| *b == 0).unwrap();
            assert_eq!(std::str::from_utf8(&out[..end]).unwrap(), text);
        }
        write_decimal(&mut out, i32::MIN);
        let end = out.iter().position(|b| *b == 0).unwrap();
        assert_eq!(std::str::from_utf8(&out[..end]).unwrap(), "-2147483648");
    }

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
