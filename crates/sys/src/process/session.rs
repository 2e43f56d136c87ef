//! An interactive command inside a running task (`alloc exec`): the same entry as
//! [`super::enter`] (the task's namespaces, root, cgroup, user, capabilities and
//! seccomp filter), but its standard streams stay open to the caller for as long as
//! the command runs, instead of being collected up to a limit.
//!
//! Without a terminal, stdin, stdout and stderr are three pipes. With one (`-t`), they
//! are the one pseudo-terminal, and the command takes it as its controlling terminal,
//! so ^C, job control and window sizes work as in a login shell. A confined task's
//! terminal comes from the task's own devpts, so its name (`/dev/pts/N`) is one the
//! command finds in its root: the agent opens the task's `/dev/pts/ptmx` with no link
//! followed and checks it is a devpts multiplexer, whatever the task put there, then
//! takes the peer through `TIOCGPTPEER`, never by a path the task could race. The
//! agent keeps the terminal's other end: no descriptor of the host's reaches the task.
//!
//! The command has no timeout; it ends when it exits, when its task ends (it was born
//! in the task's pid namespace), or when its [`SessionEnd`] is ended or dropped: the
//! shim then kills its whole process group, as at a script's timeout. What the command
//! moves out of its group (`setsid`, a shell's background jobs) is the task's from then
//! on: it is in the task's cgroup and pid namespace, and ends with the task, as in
//! Nomad.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;

use rustix::process::PidfdFlags;
use tokio::io::unix::AsyncFd;

use super::enter::{EnterSpec, Entering, Shim};
use super::spawn_plan::{failure_of, read_report_async};
use super::{ExitStatus, ProcessError, ProcessRef, ProcessTable, pid_of, wait_exit};

/// A terminal's size in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSize {
    pub rows: u16,
    pub cols: u16,
}

/// A running interactive command's streams and its end, each usable on its own task.
pub struct Session {
    /// What the caller types: the stdin pipe, or the terminal.
    pub input: SessionInput,
    /// stdout, or the terminal's output (stdout and stderr as the command wrote them).
    pub output: SessionOutput,
    /// stderr; `None` on a terminal.
    pub errors: Option<SessionOutput>,
    pub end: SessionEnd,
}

/// A descriptor the reactor watches, without blocking a thread.
type Watched = Arc<AsyncFd<OwnedFd>>;

fn watched(fd: OwnedFd) -> std::io::Result<Watched> {
    rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::NONBLOCK)?;
    // SAFETY: the AsyncFd owns the descriptor, which stays open and the same until it
    // is dropped.
    let registered = unsafe { AsyncFd::register(fd) };
    Ok(Arc::new(registered.map_err(std::io::Error::from)?))
}

/// The command's input.
pub struct SessionInput {
    fd: Option<Watched>,
    terminal: bool,
}

impl SessionInput {
    /// Writes all of `bytes`, waiting while the command does not read.
    pub async fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        let Some(fd) = &self.fd else {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        };
        while !bytes.is_empty() {
            let mut ready = fd.writable().await?;
            match ready.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), bytes)?)) {
                Ok(Ok(written)) => bytes = &bytes[written..],
                Ok(Err(error)) => return Err(error),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Ends the input: the pipe is closed; a terminal gets its end-of-file character
    /// (^D), which a command reading lines sees as the end, as when a user types it.
    pub async fn close(&mut self) -> std::io::Result<()> {
        if self.terminal {
            let result = self.write(&[0x04]).await;
            self.fd = None;
            return result;
        }
        self.fd = None;
        Ok(())
    }

    /// Sets the terminal's size (the command gets SIGWINCH); nothing without one.
    pub fn resize(&self, size: WindowSize) -> std::io::Result<()> {
        match &self.fd {
            Some(fd) if self.terminal => Ok(set_size(fd.get_ref(), size)?),
            _ => Ok(()),
        }
    }
}

fn set_size(fd: &OwnedFd, size: WindowSize) -> rustix::io::Result<()> {
    let winsize = rustix::termios::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(fd, winsize)
}

/// One of the command's outputs.
pub struct SessionOutput {
    fd: Option<Watched>,
}

impl SessionOutput {
    /// Reads what is there, waiting for some; `None` at its end.
    pub async fn read(&mut self, buffer: &mut [u8]) -> Option<usize> {
        let fd = self.fd.as_ref()?;
        loop {
            let mut ready = fd.readable().await.ok()?;
            match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut *buffer)?)) {
                // A terminal whose every other holder is gone reads EIO: its end.
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.fd = None;
                    return None;
                }
                Ok(Ok(read)) => return Some(read),
                Err(_would_block) => continue,
            }
        }
    }
}

/// How the command ends: waited for, or ended by the caller.
pub struct SessionEnd {
    shim: Shim,
    exited: Option<Pin<Box<dyn Future<Output = ExitStatus> + Send>>>,
}

impl SessionEnd {
    /// Waits for the command to exit.
    pub async fn wait(&mut self) -> ExitStatus {
        match self.exited.as_mut() {
            Some(exited) => {
                let status = exited.await;
                self.exited = None;
                status
            }
            None => ExitStatus {
                code: None,
                signal: None,
            },
        }
    }

    /// Kills the command's whole process group and waits for it.
    pub async fn kill(&mut self) -> ExitStatus {
        match self.exited.take() {
            Some(mut exited) => self.shim.end(exited.as_mut()).await,
            None => ExitStatus {
                code: None,
                signal: None,
            },
        }
    }
}

impl Drop for SessionEnd {
    /// A caller that went away (a closed websocket) takes its command with it.
    fn drop(&mut self) {
        let Some(mut exited) = self.exited.take() else {
            return;
        };
        let shim = Shim {
            pid: self.shim.pid,
            pidfd: self.shim.pidfd.clone(),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    shim.end(exited.as_mut()).await;
                });
            }
            // No runtime to reap it: killed all the same (its parent-death signal
            // takes the command).
            Err(_) => shim.signal(rustix::process::Signal::KILL),
        }
    }
}

/// The pipes or the terminal a session's command gets, and the caller's ends.
struct Streams {
    /// The command's stdin, stdout and stderr.
    theirs: [OwnedFd; 3],
    input: OwnedFd,
    output: OwnedFd,
    errors: Option<OwnedFd>,
}

fn pipes() -> std::io::Result<Streams> {
    use rustix::pipe::{PipeFlags, pipe_with};
    let (stdin, input) = pipe_with(PipeFlags::CLOEXEC)?;
    let (output, stdout) = pipe_with(PipeFlags::CLOEXEC)?;
    let (errors, stderr) = pipe_with(PipeFlags::CLOEXEC)?;
    Ok(Streams {
        theirs: [stdin, stdout, stderr],
        input,
        output,
        errors: Some(errors),
    })
}

/// A terminal from `ptmx` (the task's devpts), or from the agent's own.
fn terminal(size: WindowSize, ptmx: Option<OwnedFd>) -> std::io::Result<Streams> {
    use rustix::pty::{OpenptFlags, grantpt, ioctl_tiocgptpeer, openpt, unlockpt};
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let main = match ptmx {
        Some(ptmx) => ptmx,
        None => openpt(flags)?,
    };
    grantpt(&main)?;
    unlockpt(&main)?;
    set_size(&main, size)?;
    let peer = ioctl_tiocgptpeer(&main, flags)?;
    let theirs = [peer.try_clone()?, peer.try_clone()?, peer];
    let output = main.try_clone()?;
    Ok(Streams {
        theirs,
        input: main,
        output,
        errors: None,
    })
}

impl ProcessTable {
    /// Starts `spec` inside the task whose process `target` driver `owner` spawned,
    /// with a terminal of `terminal`'s size or pipes, and returns once it executes. The
    /// spec's `timeout` bounds that start (the task's processes can stop the keeper
    /// before it); the command itself runs until it exits or is ended. Must be called
    /// within a tokio runtime.
    pub async fn start_session(
        &self,
        owner: &Arc<str>,
        target: ProcessRef,
        spec: &EnterSpec,
        terminal_size: Option<WindowSize>,
    ) -> Result<Session, ProcessError> {
        let Entering {
            keeper,
            plan,
            handed,
            program,
            task_ptmx,
        } = self.entering(owner, target, spec, terminal_size.is_some())?;
        let streams = match terminal_size {
            Some(size) => terminal(size, task_ptmx),
            None => pipes(),
        };
        let streams = streams.map_err(|source| ProcessError::Output { source })?;
        let [stdin, stdout, stderr] = streams.theirs;
        let keeper_error = |source| ProcessError::Keeper {
            path: keeper.clone(),
            source,
        };
        let deadline = tokio::time::sleep(spec.timeout);
        tokio::pin!(deadline);
        let (pid, report) = plan
            .start(&keeper, Some(stdin), stdout, stderr, handed)
            .map_err(keeper_error)?;
        let raw_pid = pid_of(pid as u32)?;
        let pidfd = rustix::process::pidfd_open(raw_pid, PidfdFlags::NONBLOCK)
            .ok()
            .map(Arc::new);
        let shim = Shim {
            pid: raw_pid,
            pidfd: pidfd.clone(),
        };
        let mut end = SessionEnd {
            shim,
            exited: Some(Box::pin(wait_exit(raw_pid, pidfd))),
        };
        let report = tokio::select! {
            report = read_report_async(report) => report,
            () = &mut deadline => {
                end.kill().await;
                return Err(ProcessError::StartTimedOut { program, after: spec.timeout });
            }
        };
        if let Some(failure) = failure_of(&plan, report, program, &keeper) {
            // Dropping `end` ends the keeper, should the task have stopped it.
            return Err(failure);
        }
        let output_failed = |source| ProcessError::Output { source };
        let terminal = terminal_size.is_some();
        let output = watched(streams.output).map_err(output_failed)?;
        let input = match terminal {
            // One terminal, written and read: the same registration.
            true => output.clone(),
            false => watched(streams.input).map_err(output_failed)?,
        };
        let errors = match streams.errors {
            Some(fd) => Some(SessionOutput {
                fd: Some(watched(fd).map_err(output_failed)?),
            }),
            None => None,
        };
        Ok(Session {
            input: SessionInput {
                fd: Some(input),
                terminal,
            },
            output: SessionOutput { fd: Some(output) },
            errors,
            end,
        })
    }
}
