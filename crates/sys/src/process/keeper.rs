//! Starting `berth-keeper`, the small binary that runs beside every task: its shim and
//! init ([`super::spawn_plan`]) and its log collector ([`super::logmon`]).
//!
//! The agent never forks. A fork copies the agent's page tables (a cost that grows with
//! the agent, and a thousand tasks make it bigger) and leaves every page copy-on-write
//! behind it; with a thousand tasks starting at once, half the node's CPU went there
//! (`copy_page_range`, `dup_mmap`, `anon_vma`, then `exit_mmap` at each exec). Instead
//! the keeper is started with `posix_spawn(3)`, a `vfork`-style clone that shares the
//! agent's memory until its `exec`, and whatever a task needs forking is forked from
//! the keeper, a process of about a megabyte.
//!
//! The keeper starts in a process group of its own (signals meant for the agent's group
//! do not reach it), with no environment, an empty signal mask and every signal at its
//! default, and with exactly the descriptors it is handed.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// The first descriptor number a keeper is handed descriptors at (3, 4, … in order).
pub const FIRST_HANDED_FD: i32 = 3;

/// Starts `keeper <command> <args…>` with `stdio` at 0, 1 and 2 (`None`: `/dev/null`)
/// and `handed` at 3, 4, … in order. Returns its pid; the caller reaps it.
pub fn launch(
    keeper: &Path,
    command: &CStr,
    args: &[String],
    stdio: [Option<BorrowedFd<'_>>; 3],
    handed: &[BorrowedFd<'_>],
) -> io::Result<i32> {
    let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "NUL in an argument");
    let program = CString::new(keeper.as_os_str().as_bytes()).map_err(|_| invalid())?;
    let mut owned = vec![c"berth-keeper".to_owned(), command.to_owned()];
    for arg in args {
        owned.push(CString::new(arg.as_str()).map_err(|_| invalid())?);
    }
    let mut argv: Vec<*mut libc::c_char> = owned.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let envp: [*mut libc::c_char; 1] = [std::ptr::null_mut()];
    // Copies above every target number first, close-on-exec in this process, so that no
    // source sits on a target (a dup2 onto itself would keep close-on-exec) and the
    // copies are gone in the child once it executes.
    let above = FIRST_HANDED_FD + handed.len() as i32;
    let mut sources = Vec::with_capacity(3 + handed.len());
    for fd in stdio.iter().flatten().chain(handed) {
        sources.push(rustix::io::fcntl_dupfd_cloexec(fd, above)?);
    }
    let mut targets = Vec::with_capacity(sources.len());
    targets.extend((0..3).filter(|number| stdio[*number as usize].is_some()));
    targets.extend((0..handed.len() as i32).map(|index| FIRST_HANDED_FD + index));
    let null = c"/dev/null";
    // SAFETY: the attribute and file-action objects are initialised before use and
    // destroyed on every path; every pointer handed to posix_spawn (program, argv, envp,
    // the path) outlives the call.
    unsafe {
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attributes: libc::posix_spawnattr_t = std::mem::zeroed();
        check(libc::posix_spawn_file_actions_init(&mut actions))?;
        if let Err(error) = check(libc::posix_spawnattr_init(&mut attributes)) {
            libc::posix_spawn_file_actions_destroy(&mut actions);
            return Err(error);
        }
        let spawned = (|| {
            for (number, fd) in stdio.iter().enumerate() {
                if fd.is_some() {
                    continue;
                }
                let flags = if number == 0 {
                    libc::O_RDONLY
                } else {
                    libc::O_WRONLY
                };
                check(libc::posix_spawn_file_actions_addopen(
                    &mut actions,
                    number as libc::c_int,
                    null.as_ptr(),
                    flags,
                    0,
                ))?;
            }
            for (fd, target) in sources.iter().zip(&targets) {
                check(libc::posix_spawn_file_actions_adddup2(
                    &mut actions,
                    fd.as_raw_fd(),
                    *target,
                ))?;
            }
            let mut no_signals: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut no_signals);
            let mut all_signals: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all_signals);
            check(libc::posix_spawnattr_setsigmask(
                &mut attributes,
                &no_signals,
            ))?;
            // The agent ignores SIGPIPE; an ignored signal stays ignored across exec.
            check(libc::posix_spawnattr_setsigdefault(
                &mut attributes,
                &all_signals,
            ))?;
            check(libc::posix_spawnattr_setpgroup(&mut attributes, 0))?;
            let flags = libc::POSIX_SPAWN_SETPGROUP
                | libc::POSIX_SPAWN_SETSIGMASK
                | libc::POSIX_SPAWN_SETSIGDEF;
            check(libc::posix_spawnattr_setflags(
                &mut attributes,
                flags as libc::c_short,
            ))?;
            let mut pid: libc::pid_t = 0;
            check(libc::posix_spawn(
                &mut pid,
                program.as_ptr(),
                &actions,
                &attributes,
                argv.as_ptr(),
                envp.as_ptr(),
            ))?;
            Ok(pid)
        })();
        libc::posix_spawn_file_actions_destroy(&mut actions);
        libc::posix_spawnattr_destroy(&mut attributes);
        spawned
    }
}

/// In the keeper, first thing: closes every descriptor from `first` up, which the agent
/// inherited without close-on-exec (a careless parent's file, a jobserver pipe) and so
/// passed on. Nothing in the keeper owns them.
pub fn close_from(first: i32) {
    // SAFETY: close_range(2) on integer arguments.
    unsafe {
        libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32);
    }
}

/// posix_spawn's functions return the error number instead of setting errno.
fn check(code: libc::c_int) -> io::Result<()> {
    match code {
        0 => Ok(()),
        code => Err(io::Error::from_raw_os_error(code)),
    }
}
