//! The **mount warden** of a CSI node plugin the operator granted mounting: a process
//! beside the plugin's shim that makes the plugin's bind mounts for it, where they are
//! allowed to go ([`crate::mount::plugin_mounts`]), and refuses the rest.
//!
//! A seccomp filter sees a call's flags, never its paths, so it cannot tell a publish
//! (`mount -o bind,remount,ro … <publish dir>/…`) from a remount of the host's `/usr`.
//! The plugin's filter therefore hands every `mount(2)` with `MS_BIND` to the warden as a
//! seccomp user notification ([`super::seccomp`]); the plugin's thread waits in the
//! kernel until the warden answers. The warden reads the call's paths from the plugin's
//! memory once, checks that the notification is still live (the pid was not reused),
//! performs the mount itself in the plugin's mount namespace, and answers with its result
//! or the refusal's error number. A refusal is also written, naming the path, to the
//! plugin's stderr (its task log) and to a file beside its task dir, which the agent
//! turns into task events (`task_runner/csi_plugin_supervisor_hook.rs`). Since the
//! warden acts on its own copy of the paths and resolves them below descriptors opened
//! before the plugin ran, nothing the plugin
//! changes meanwhile redirects a mount.
//!
//! ```text
//! keeper ─fork─► warden (agent's mount and pid namespaces, full privileges, in the
//!   │              task's cgroup; dies with the shim)
//!   └─ becomes the shim ─fork─► init: pivot_root … seccomp ─► listener ─SCM_RIGHTS─► warden
//!                                 warden: setns into the task's mount namespace, open the
//!                                 plugin's dirs, "ready" ─► init forks the plugin
//! ```
//!
//! The warden is forked before the keeper unshares anything, so it stays outside the
//! plugin's pid namespace: the plugin cannot see, signal or trace it. It ends when the
//! plugin's last filtered process is gone (the listener hangs up) or with the shim
//! (parent-death signal).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

use crate::mount::plugin_mounts::{PluginMounts, Refused, Request};

/// What the warden of a task is told: the dirs, as the plugin names them, its mounts may
/// go below.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WardenPlan {
    pub dirs: Vec<CString>,
    /// The keeper's descriptor of the file the warden appends its refusals to (outside
    /// the plugin's root; the agent turns each line into a task event).
    pub refusals: Option<RawFd>,
}

/// The most the warden writes to its refusals file: a plugin that asks for refused mounts
/// in a loop fills its own log (rotated), not the agent's disk.
const MAX_REFUSALS_FILE: libc::off_t = 64 << 10;

/// The longest path the warden reads from the plugin (the kernel's `PATH_MAX`).
const MAX_PATH: usize = 4096;

/// Forks the warden of `plan`. Returns the init's end of the socket the listener is
/// handed over on ([`hand_over`]). Only in the single-threaded keeper, before it
/// unshares its namespaces.
pub fn start(plan: &WardenPlan) -> io::Result<OwnedFd> {
    let mut pair: [libc::c_int; 2] = [-1, -1];
    // SAFETY: socketpair(2) into a local array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and belong to no one else.
    let (warden_end, init_end) =
        unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    let keeper = std::process::id() as libc::pid_t;
    // SAFETY: the keeper has one thread.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        drop(init_end);
        serve(warden_end, keeper, plan);
    }
    Ok(init_end)
}

/// In the init, once its filter is installed: hands `listener` to the warden and waits
/// until the warden is ready to answer (it has entered the task's mount namespace and
/// opened the plugin's dirs), or says why it is not.
pub fn hand_over(init_end: OwnedFd, listener: OwnedFd) -> io::Result<()> {
    send_fd(&init_end, &listener)?;
    drop(listener);
    let mut answer = [0u8; 4];
    // SAFETY: read(2) into a local buffer.
    let read = unsafe { libc::read(init_end.as_raw_fd(), answer.as_mut_ptr().cast(), 4) };
    match read {
        4 => match i32::from_le_bytes(answer) {
            0 => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        },
        _ => Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the mount warden ended before it was ready",
        )),
    }
}

/// The warden: never returns.
fn serve(socket: OwnedFd, keeper: libc::pid_t, plan: &WardenPlan) -> ! {
    // SAFETY (whole function): plain system calls on local data; this process has one
    // thread and exits through _exit.
    unsafe {
        // What the keeper was handed (the report pipe above all, whose end of file tells
        // the agent the task executed) is not the warden's.
        super::shim::close_all_but([socket.as_raw_fd(), plan.refusals.unwrap_or(-1)]);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        if super::shim::die_with_parent().is_err() || libc::getppid() != keeper {
            libc::_exit(0);
        }
        let Ok(listener) = receive_fd(&socket) else {
            // The init ended first: nothing to watch.
            libc::_exit(0);
        };
        let mut mounts = match enter(keeper, plan) {
            Ok(mounts) => mounts,
            Err(error) => {
                let errno = error.raw_os_error().unwrap_or(libc::EIO);
                libc::write(socket.as_raw_fd(), errno.to_le_bytes().as_ptr().cast(), 4);
                libc::_exit(1);
            }
        };
        libc::write(socket.as_raw_fd(), 0i32.to_le_bytes().as_ptr().cast(), 4);
        drop(socket);
        loop {
            let mut watch = libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut watch, 1, -1) < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                libc::_exit(1);
            }
            if watch.revents & libc::POLLIN == 0 {
                // Hung up: every process of the plugin is gone.
                libc::_exit(0);
            }
            answer_one(&listener, &mut mounts, plan.refusals);
        }
    }
}

/// Enters the mount namespace of the keeper (now the task's shim, after its `pivot_root`)
/// and opens the plugin's dirs there.
fn enter(keeper: libc::pid_t, plan: &WardenPlan) -> io::Result<PluginMounts> {
    let namespace = std::fs::File::open(format!("/proc/{keeper}/ns/mnt"))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&namespace),
        Some(rustix::thread::LinkNameSpaceType::Mount),
    )?;
    PluginMounts::open(&plan.dirs)
}

/// Receives one notification and answers it.
fn answer_one(listener: &OwnedFd, mounts: &mut PluginMounts, refusals: Option<RawFd>) {
    // SAFETY: the ioctls fill and read structs of the kernel's layout, zeroed first as
    // SECCOMP_IOCTL_NOTIF_RECV requires.
    unsafe {
        let mut notification: libc::seccomp_notif = std::mem::zeroed();
        if libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut notification,
        ) != 0
        {
            // ENOENT: the caller died (or was signalled) before it was received.
            return;
        }
        let outcome = judge(listener, &notification, mounts);
        if let Err(refused) = &outcome {
            let line = format!("berth: mount refused to this CSI plugin: {refused}\n");
            libc::write(2, line.as_ptr().cast(), line.len());
            if let Some(refusals) = refusals
                && libc::lseek(refusals, 0, libc::SEEK_END) < MAX_REFUSALS_FILE
            {
                libc::write(refusals, line.as_ptr().cast(), line.len());
            }
        }
        let mut response: libc::seccomp_notif_resp = std::mem::zeroed();
        response.id = notification.id;
        response.error = match outcome {
            Ok(()) => 0,
            Err(refused) => -(refused.errno.raw_os_error()),
        };
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut response,
        );
    }
}

/// What to answer `notification`: the request read from the caller, carried out or
/// refused.
fn judge(
    listener: &OwnedFd,
    notification: &libc::seccomp_notif,
    mounts: &mut PluginMounts,
) -> Result<(), Refused> {
    let refuse = |errno: rustix::io::Errno, reason: &str| Refused {
        errno,
        reason: reason.to_string(),
    };
    if i64::from(notification.data.nr) != crate::mount::MOUNT_SYSCALL {
        return Err(refuse(rustix::io::Errno::NOSYS, "not a mount call"));
    }
    let pid = notification.pid as libc::pid_t;
    let [source, target, _, flags, _, _] = notification.data.args;
    let read = |address: u64| {
        read_path(pid, address).map_err(|e| {
            let errno = rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::FAULT);
            refuse(errno, &format!("reading the call's paths: {e}"))
        })
    };
    let target = read(target)?;
    let source = if flags & libc::MS_REMOUNT == 0 {
        read(source)?
    } else {
        CString::default()
    };
    // The paths were read from the caller only if it is still the one that made the
    // call (its pid not reused meanwhile).
    let mut id = notification.id;
    // SAFETY: an ioctl reading a u64.
    if unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &mut id,
        )
    } != 0
    {
        return Err(refuse(rustix::io::Errno::NOENT, "the caller went away"));
    }
    let Some(request) = Request::from_call(source, target, flags) else {
        return Err(refuse(rustix::io::Errno::PERM, "not a bind"));
    };
    mounts.perform(&request)
}

/// A NUL-terminated path at `address` in process `pid`, read a page at most at a time
/// (a read across into an unmapped page fails as a whole).
fn read_path(pid: libc::pid_t, address: u64) -> io::Result<CString> {
    if address == 0 {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    let page = 4096u64;
    let mut bytes = Vec::with_capacity(256);
    let mut at = address;
    while bytes.len() < MAX_PATH {
        let chunk = ((page - at % page) as usize).min(MAX_PATH - bytes.len());
        let mut buffer = vec![0u8; chunk];
        let local = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: chunk,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: chunk,
        };
        // SAFETY: reads into a local buffer of the given length.
        let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if read <= 0 {
            return Err(io::Error::last_os_error());
        }
        let read = &buffer[..read as usize];
        if let Some(end) = read.iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&read[..end]);
            return CString::new(bytes).map_err(io::Error::other);
        }
        bytes.extend_from_slice(read);
        at += read.len() as u64;
    }
    Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG))
}

/// Sends `fd` over `socket` (`SCM_RIGHTS`).
fn send_fd(socket: &OwnedFd, fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: sendmsg(2) with a control buffer sized by CMSG_SPACE for one descriptor,
    // filled through the CMSG macros.
    unsafe {
        let mut byte = [b'f'];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let mut control = vec![0u8; space];
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd.as_raw_fd());
        if libc::sendmsg(socket.as_raw_fd(), &message, 0) != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one descriptor sent by [`send_fd`].
fn receive_fd(socket: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: recvmsg(2) into local buffers; the descriptor is taken from a control
    // message of the kernel's making.
    unsafe {
        let mut byte = [0u8];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let mut control = vec![0u8; space];
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space as _;
        if libc::recvmsg(socket.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) != 1 {
            return Err(io::Error::from_raw_os_error(libc::EPIPE));
        }
        let header = libc::CMSG_FIRSTHDR(&message);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}
