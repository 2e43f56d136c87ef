//! Mount syscalls: the only module that calls `mount(2)`.
//!
//! Mounts for a task are described up front as a list of [`MountStep`]s (see
//! [`crate::process::isolation`]), handed to the task's keeper in its spawn plan
//! ([`crate::process::spawn_plan`]) and executed there, partly between `fork` and
//! `exec`: every step holds its paths as [`CString`]s already, so executing one
//! allocates nothing.
//!
//! [`mountinfo`] reads `/proc/<pid>/mountinfo`, which tests use to check what a task sees.

pub mod cgroupfs;
pub mod mountinfo;
pub mod shared;

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;

use crate::model::mount::Propagation;
use rustix::mount::{MountFlags, MountPropagationFlags};

impl Propagation {
    /// The recursive propagation flags `mount(2)` takes for this mode.
    pub fn flags(self) -> MountPropagationFlags {
        let mode = match self {
            Propagation::Private => MountPropagationFlags::PRIVATE,
            Propagation::HostToTask => MountPropagationFlags::DOWNSTREAM,
            Propagation::Bidirectional => MountPropagationFlags::SHARED,
        };
        mode | MountPropagationFlags::REC
    }
}

/// Every system call that mounts, unmounts or moves a mount, by number: what a seccomp
/// filter refuses to a confined task (`process/seccomp.rs`).
pub const SYSCALLS: &[i64] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
];

/// One mount operation, with its paths ready for the syscall.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum MountStep {
    /// Leave the host's mount namespace: `unshare(CLONE_NEWNS)`.
    UnshareNamespace,
    /// Change propagation of `target` (and, with `REC`, of everything below it).
    SetPropagation {
        target: CString,
        #[serde(with = "propagation_bits")]
        flags: MountPropagationFlags,
    },
    /// `mount --rbind source target`.
    BindRecursive { source: CString, target: CString },
    /// Make an existing bind mount read-only.
    RemountReadOnly { target: CString },
    /// A fresh procfs at `target`.
    MountProc { target: CString },
    /// `chroot(root)` then `chdir(cwd)`, both as the task will see them.
    Chroot { root: CString, cwd: CString },
    /// `chdir(dir)` without a chroot.
    Chdir { dir: CString },
    /// A tmpfs at `target` (nosuid; `noexec` unless it holds device nodes).
    MountTmpfs {
        target: CString,
        options: CString,
        noexec: bool,
    },
    /// A private devpts instance at `target`.
    MountDevpts { target: CString },
    /// A character device node at `path`.
    MakeDevice {
        path: CString,
        major: u32,
        minor: u32,
    },
    /// A symlink at `link` pointing to `target`.
    Symlink { target: CString, link: CString },
    /// Hides `target` (a file or a directory) behind an empty read-only mount.
    Mask { target: CString, directory: bool },
    /// New IPC, UTS and PID namespaces (System V IPC and the host name stay the task's
    /// own; the PID namespace holds the children forked after this step).
    UnshareIpcUtsPid,
    /// Makes `target` read-only (bound onto itself); nothing when it does not exist.
    ProtectReadOnly { target: CString },
    /// `mkdir(path)`.
    MakeDir { path: CString },
}

/// Propagation flags in a spawn plan: their bits.
mod propagation_bits {
    use rustix::mount::MountPropagationFlags;

    pub fn serialize<S: serde::Serializer>(
        flags: &MountPropagationFlags,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(flags.bits())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<MountPropagationFlags, D::Error> {
        let bits = <u32 as serde::Deserialize>::deserialize(deserializer)?;
        Ok(MountPropagationFlags::from_bits_retain(bits))
    }
}

impl MountStep {
    /// Runs the step. Async-signal-safe: no allocation, no locks.
    pub fn execute(&self) -> io::Result<()> {
        use rustix::mount;
        match self {
            MountStep::UnshareNamespace => {
                // SAFETY: unsharing the mount namespace only affects this (single-threaded,
                // about-to-exec) child; it cannot break invariants of other threads.
                unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
            }
            MountStep::SetPropagation { target, flags } => {
                mount::mount_change(target.as_c_str(), *flags)?;
            }
            MountStep::BindRecursive { source, target } => {
                mount::mount_bind_recursive(source.as_c_str(), target.as_c_str())?;
            }
            MountStep::RemountReadOnly { target } => {
                mount::mount_remount(
                    target.as_c_str(),
                    MountFlags::BIND | MountFlags::RDONLY,
                    c"",
                )?;
            }
            MountStep::MountProc { target } => {
                mount::mount(
                    c"proc",
                    target.as_c_str(),
                    c"proc",
                    MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                    None::<&CStr>,
                )?;
            }
            MountStep::Chroot { root, cwd } => {
                rustix::process::chroot(root.as_c_str())?;
                rustix::process::chdir(cwd.as_c_str())?;
            }
            MountStep::Chdir { dir } => {
                rustix::process::chdir(dir.as_c_str())?;
            }
            MountStep::MountTmpfs {
                target,
                options,
                noexec,
            } => {
                let mut flags = MountFlags::NOSUID;
                if *noexec {
                    flags |= MountFlags::NOEXEC | MountFlags::NODEV;
                }
                mount::mount(
                    c"tmpfs",
                    target.as_c_str(),
                    c"tmpfs",
                    flags,
                    Some(options.as_c_str()),
                )?;
            }
            MountStep::MountDevpts { target } => {
                mount::mount(
                    c"devpts",
                    target.as_c_str(),
                    c"devpts",
                    MountFlags::NOSUID | MountFlags::NOEXEC,
                    Some(c"newinstance,ptmxmode=0666,mode=0620"),
                )?;
            }
            MountStep::MakeDevice { path, major, minor } => {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    path.as_c_str(),
                    rustix::fs::FileType::CharacterDevice,
                    rustix::fs::Mode::from_raw_mode(0o666),
                    rustix::fs::makedev(*major, *minor),
                )?;
            }
            MountStep::Symlink { target, link } => {
                rustix::fs::symlink(target.as_c_str(), link.as_c_str())?;
            }
            MountStep::Mask { target, directory } => {
                // A read-only empty tmpfs over a directory; /dev/null over a file. A
                // path the kernel does not have is nothing to hide.
                let result = if *directory {
                    mount::mount(
                        c"tmpfs",
                        target.as_c_str(),
                        c"tmpfs",
                        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                        Some(c"size=0"),
                    )
                } else {
                    mount::mount_bind(c"/dev/null", target.as_c_str())
                };
                match result {
                    Err(rustix::io::Errno::NOENT) => {}
                    other => other?,
                }
            }
            MountStep::ProtectReadOnly { target } => {
                match mount::mount_bind_recursive(target.as_c_str(), target.as_c_str()) {
                    Err(rustix::io::Errno::NOENT) => return Ok(()),
                    other => other?,
                }
                mount::mount_remount(
                    target.as_c_str(),
                    MountFlags::BIND | MountFlags::RDONLY,
                    c"",
                )?;
            }
            MountStep::MakeDir { path } => {
                rustix::fs::mkdir(path.as_c_str(), rustix::fs::Mode::from_raw_mode(0o755))?;
            }
            MountStep::UnshareIpcUtsPid => {
                use rustix::thread::UnshareFlags;
                // SAFETY: as for the mount namespace: only this about-to-exec child.
                unsafe {
                    rustix::thread::unshare_unsafe(
                        UnshareFlags::NEWIPC | UnshareFlags::NEWUTS | UnshareFlags::NEWPID,
                    )
                }?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for MountStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |c: &CString| c.to_string_lossy().into_owned();
        match self {
            MountStep::UnshareNamespace => write!(f, "create a mount namespace"),
            MountStep::SetPropagation { target, flags } => {
                write!(f, "set propagation {flags:?} on {}", show(target))
            }
            MountStep::BindRecursive { source, target } => {
                write!(f, "bind {} to {}", show(source), show(target))
            }
            MountStep::RemountReadOnly { target } => {
                write!(f, "make {} read-only", show(target))
            }
            MountStep::MountProc { target } => write!(f, "mount proc at {}", show(target)),
            MountStep::Chroot { root, cwd } => {
                write!(f, "chroot into {} (working dir {})", show(root), show(cwd))
            }
            MountStep::Chdir { dir } => write!(f, "change directory to {}", show(dir)),
            MountStep::MountTmpfs { target, .. } => write!(f, "mount a tmpfs at {}", show(target)),
            MountStep::MountDevpts { target } => write!(f, "mount devpts at {}", show(target)),
            MountStep::MakeDevice { path, major, minor } => {
                write!(f, "create device {major}:{minor} at {}", show(path))
            }
            MountStep::Symlink { target, link } => {
                write!(f, "link {} to {}", show(link), show(target))
            }
            MountStep::Mask { target, .. } => write!(f, "mask {}", show(target)),
            MountStep::UnshareIpcUtsPid => write!(f, "create IPC, UTS and PID namespaces"),
            MountStep::ProtectReadOnly { target } => write!(f, "make {} read-only", show(target)),
            MountStep::MakeDir { path } => write!(f, "create directory {}", show(path)),
        }
    }
}

/// Converts a path to a C string, naming the path when it holds a NUL byte.
pub fn c_path(path: impl AsRef<std::path::Path>) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    let path = path.as_ref();
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {path:?} contains a NUL byte"),
        )
    })
}
