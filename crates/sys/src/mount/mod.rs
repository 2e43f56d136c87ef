//! Mount syscalls: the only module that calls `mount(2)`.
//!
//! Mounts for a task are described up front as a list of [`MountStep`]s (see
//! [`crate::process::isolation`]), handed to the task's keeper in its spawn plan
//! ([`crate::process::spawn_plan`]) and executed there, partly between `fork` and
//! `exec`: every step holds its paths as [`CString`]s already, so executing one
//! allocates nothing.
//!
//! [`mountinfo`] reads `/proc/<pid>/mountinfo`, which tests use to check what a task sees.

pub mod beneath;
pub mod cgroupfs;
pub mod loop_fs;
pub mod mountinfo;
pub mod netns;
pub mod plugin_mounts;
pub mod shared;

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use berth_model::mount::Propagation;
use rustix::mount::{MountFlags, MountPropagationFlags};

/// The recursive propagation flags `mount(2)` takes for `propagation`.
pub fn propagation_flags(propagation: Propagation) -> MountPropagationFlags {
    let mode = match propagation {
        Propagation::Private => MountPropagationFlags::PRIVATE,
        Propagation::HostToTask => MountPropagationFlags::DOWNSTREAM,
        Propagation::Bidirectional => MountPropagationFlags::SHARED,
    };
    mode | MountPropagationFlags::REC
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
    OPEN_TREE_ATTR,
];

/// `open_tree_attr(2)` (Linux 6.15): `open_tree` with `mount_setattr`'s attributes, so a
/// clone of a read-only bind can come out writable. Its number is the same on every
/// architecture of the unified table (424 on); libc does not name it yet.
pub const OPEN_TREE_ATTR: i64 = 467;

/// `open_tree(2)`'s number, for the filter's tests.
pub const OPEN_TREE: i64 = libc::SYS_open_tree;

/// The new mount API's calls (Linux 5.2 on), which a mounting plugin is told do not
/// exist (`process/seccomp.rs`), so that mount(8) uses `mount(2)`.
pub const NEW_API_SYSCALLS: &[i64] = &[
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    OPEN_TREE_ATTR,
];

/// `mount(2)`'s and `umount2(2)`'s numbers, for the filter that lets a mounting plugin
/// make some calls (`process/seccomp.rs`).
pub const MOUNT_SYSCALL: i64 = libc::SYS_mount;
pub const UNMOUNT_SYSCALL: i64 = libc::SYS_umount2;

/// What `mount(2)` with `flags` at `target` (or `umount2(2)` with `unmount`) answers: 0 or
/// the error number. For the tests of what a seccomp filter lets through; raw and
/// async-signal-safe, so a forked child can call it.
#[cfg(test)]
pub fn raw_answer(target: &CStr, flags: u64, unmount: bool) -> i32 {
    // SAFETY: system calls on a valid C string; no memory is shared.
    let result = unsafe {
        if unmount {
            libc::umount2(target.as_ptr(), 0)
        } else {
            libc::mount(
                c"none".as_ptr(),
                target.as_ptr(),
                c"proc".as_ptr(),
                flags,
                std::ptr::null(),
            )
        }
    };
    if result == 0 {
        0
    } else {
        io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// What `open_tree(AT_FDCWD, target, 0)` (or `open_tree_attr`, as `call`) answers: 0 or the error number. For the tests
/// of what a seccomp filter lets through, as [`raw_answer`].
#[cfg(test)]
pub fn raw_open_tree_answer(call: i64, target: &CStr) -> i32 {
    // SAFETY: a system call on a valid C string (open_tree_attr's attribute pointer is
    // null with size 0); the descriptor it may return is closed.
    let result = unsafe {
        libc::syscall(
            call,
            libc::AT_FDCWD,
            target.as_ptr(),
            0u32,
            std::ptr::null::<u8>(),
            0usize,
        )
    };
    if result >= 0 {
        // SAFETY: the descriptor the call just returned.
        unsafe { libc::close(result as libc::c_int) };
        0
    } else {
        io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// One mount operation, with its paths ready for the syscall.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum MountStep {
    /// Leave the host's mount namespace: `unshare(CLONE_NEWNS)`.
    UnshareNamespace,
    /// Change propagation of `target` (and, with `REC`, of everything below it).
    SetPropagation {
        target: Target,
        #[serde(with = "propagation_bits")]
        flags: MountPropagationFlags,
    },
    /// `mount --rbind source target`.
    BindRecursive { source: Target, target: Target },
    /// Restricts an existing bind mount: adds `restrict` to the flags it already has
    /// (a bind remount replaces them, so they are read first: a host `noexec` stays).
    Restrict {
        target: Target,
        restrict: Restriction,
    },
    /// A fresh procfs at `target`; with `pids_only`, only the processes' own entries
    /// (`subset=pid`: no `/proc/sys`, no kernel files at all).
    MountProc { target: Target, pids_only: bool },
    /// Makes `root` (a mount point: the task root bound onto itself) the root of the
    /// mount namespace with `pivot_root(2)` and detaches the old root, so no path leads
    /// back to the host, whatever capabilities remain (a `chroot` would leave the old
    /// root one `chroot(".."...)` away); then `chdir(cwd)` as the task sees it.
    PivotRoot { root: CString, cwd: CString },
    /// `chdir(dir)` without a chroot.
    Chdir { dir: CString },
    /// A tmpfs at `target` (nosuid; `noexec` unless it holds device nodes).
    MountTmpfs {
        target: Target,
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
    /// Binds the file `source` over `relative` below `root` (the task's `/etc/hosts`),
    /// read-only: whatever is there is covered, a link included (it is not followed:
    /// the host's `/etc/resolv.conf` may be a link to a resolver's file the task does
    /// not have). Nothing else on the way may be a link. Not over a directory.
    CoverFile {
        source: CString,
        root: CString,
        relative: CString,
    },
    /// An overlayfs at `target` (an image's root): `lower` the image's layers, the top
    /// first, each its own `lowerdir+` (no page-long option string bounds their number);
    /// `upper` and `work` the task's. `nosuid,nodev`: an image's setuid files and device
    /// nodes give no one anything. `idmapped`: each layer is mounted through the task's
    /// user namespace first ([`crate::process::user_namespace`]), so its files are owned
    /// inside as the image says and on the host by the task's ids.
    MountOverlay {
        target: CString,
        lower: Vec<CString>,
        upper: CString,
        work: CString,
        idmapped: bool,
    },
}

/// Where a mount step acts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Target {
    /// A path no untrusted party can change: `/`, the task root itself, host volumes'
    /// sources (the operator's), fresh mounts of the step's own making.
    Path(CString),
    /// `relative` below `root`, a directory a task or plugin writes into: resolved when the
    /// step runs, through no link and never out of `root` ([`beneath`]).
    Beneath { root: CString, relative: CString },
}

impl Target {
    /// A target `path` below `root` (both absolute, `path` inside `root`).
    pub fn beneath(root: &std::path::Path, path: &std::path::Path) -> io::Result<Target> {
        let relative = path.strip_prefix(root).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not below {}", path.display(), root.display()),
            )
        })?;
        Ok(Target::Beneath {
            root: c_path(root)?,
            relative: c_path(if relative.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                relative
            })?,
        })
    }

    pub fn path(path: impl AsRef<std::path::Path>) -> io::Result<Target> {
        Ok(Target::Path(c_path(path)?))
    }

    /// Runs `f` on a path that names the target now. Async-signal-safe: a `Beneath`
    /// target is opened (`O_PATH`) and named `/proc/self/fd/<n>` from a stack buffer.
    fn with<T>(&self, f: impl FnOnce(&CStr) -> io::Result<T>) -> io::Result<T> {
        match self {
            Target::Path(path) => f(path),
            Target::Beneath { root, relative } => {
                let dir = beneath::open_root(root)?;
                let target = beneath::open(&dir, relative)?;
                let mut buffer = [0u8; 32];
                f(beneath::fd_path(&target, &mut buffer))
            }
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Path(path) => f.write_str(&path.to_string_lossy()),
            Target::Beneath { root, relative } => {
                let relative = relative.to_string_lossy();
                match relative.as_ref() {
                    "." => f.write_str(&root.to_string_lossy()),
                    _ => write!(f, "{}/{relative}", root.to_string_lossy()),
                }
            }
        }
    }
}

/// What [`MountStep::Restrict`] adds to a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Restriction {
    pub read_only: bool,
    /// `nosuid` and `nodev`: a setuid file or a device node planted there is inert.
    pub nosuid_nodev: bool,
}

impl Restriction {
    pub const READ_ONLY: Restriction = Restriction {
        read_only: true,
        nosuid_nodev: true,
    };
    pub const WRITABLE: Restriction = Restriction {
        read_only: false,
        nosuid_nodev: true,
    };

    fn flags(self) -> MountFlags {
        let mut flags = MountFlags::empty();
        if self.read_only {
            flags |= MountFlags::RDONLY;
        }
        if self.nosuid_nodev {
            flags |= MountFlags::NOSUID | MountFlags::NODEV;
        }
        flags
    }
}

impl fmt::Display for Restriction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.read_only, self.nosuid_nodev) {
            (true, true) => write!(f, "read-only, nosuid, nodev"),
            (true, false) => write!(f, "read-only"),
            (false, true) => write!(f, "nosuid, nodev"),
            (false, false) => write!(f, "unchanged"),
        }
    }
}

/// Adds `restrict` to every mount below `target` too (`mount_setattr(AT_RECURSIVE)`):
/// a remount restricts only the top mount of a recursive bind, and what the host has
/// mounted inside a system dir or a volume (a container's bind-mounted `/etc/hosts`, a
/// disk mounted in a volume) would stay writable, setuid files working. Attributes are
/// only added: a submount's own `noexec` stays. A kernel before 5.12 (`ENOSYS`) has no
/// such call: its submounts keep their flags, as before. Async-signal-safe.
fn restrict_submounts(target: &CStr, restrict: Restriction) -> io::Result<()> {
    let mut set = 0;
    if restrict.read_only {
        set |= MOUNT_ATTR_RDONLY;
    }
    if restrict.nosuid_nodev {
        set |= MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    }
    if set == 0 {
        return Ok(());
    }
    use rustix::fs::{Mode, OFlags};
    let mount = rustix::fs::open(target, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    match set_attributes(&mount, set, 0, 0, true) {
        Err(rustix::io::Errno::NOSYS) => Ok(()),
        other => Ok(other?),
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH [| AT_RECURSIVE], {set, clear})`.
/// Async-signal-safe.
pub(crate) fn set_attributes(
    fd: &impl std::os::fd::AsFd,
    set: u64,
    clear: u64,
    propagation: u64,
    recursive: bool,
) -> Result<(), rustix::io::Errno> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation,
        userns_fd: 0,
    };
    mount_setattr(fd, &attr, recursive)
}

fn mount_setattr(
    fd: &impl std::os::fd::AsFd,
    attr: &MountAttr,
    recursive: bool,
) -> Result<(), rustix::io::Errno> {
    use std::os::fd::AsRawFd as _;
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: a raw system call on a live descriptor, a C string and a struct that
    // outlive it, with the struct's size.
    let result = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if result < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    Ok(())
}

/// The per-mount flags `target` has now, as `mount(2)` flags, so a bind remount keeps
/// them. Async-signal-safe (`statvfs(2)`).
fn current_mount_flags(target: &CStr) -> io::Result<MountFlags> {
    use rustix::fs::StatVfsMountFlags as Has;
    let has = rustix::fs::statvfs(target)?.f_flag;
    let mut flags = MountFlags::empty();
    for (have, flag) in [
        (Has::RDONLY, MountFlags::RDONLY),
        (Has::NOSUID, MountFlags::NOSUID),
        (Has::NODEV, MountFlags::NODEV),
        (Has::NOEXEC, MountFlags::NOEXEC),
        (Has::NOATIME, MountFlags::NOATIME),
        (Has::NODIRATIME, MountFlags::NODIRATIME),
        (Has::RELATIME, MountFlags::RELATIME),
    ] {
        if has.contains(have) {
            flags |= flag;
        }
    }
    Ok(flags)
}

/// `pivot_root(2)` into `root` as runc does it: `pivot_root(".", ".")` stacks the old
/// root on the new one; the old root's tree is made a slave first, so detaching it
/// unmounts nothing of the host's (an unmount under a shared mount propagates).
/// Async-signal-safe: raw system calls.
fn pivot_into(root: &CStr) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let old_root = rustix::fs::open(
        c"/",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let new_root = rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::process::fchdir(&new_root)?;
    rustix::process::pivot_root(c".", c".")?;
    // The kernel leaves the working directory where it was; go to the old root,
    // stacked on "/", by its descriptor rather than by trusting that.
    rustix::process::fchdir(&old_root)?;
    rustix::mount::mount_change(
        c".",
        MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
    )?;
    rustix::mount::unmount(c".", rustix::mount::UnmountFlags::DETACH)?;
    rustix::process::chdir(c"/")?;
    Ok(())
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
        self.execute_in(None)
    }

    /// Runs the step; an idmapped overlay maps its layers through `user_namespace`.
    pub fn execute_in(&self, user_namespace: Option<BorrowedFd<'_>>) -> io::Result<()> {
        use rustix::mount;
        match self {
            MountStep::UnshareNamespace => {
                // SAFETY: unsharing the mount namespace only affects this (single-threaded,
                // about-to-exec) child; it cannot break invariants of other threads.
                unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
            }
            MountStep::SetPropagation { target, flags } => {
                target.with(|target| Ok(mount::mount_change(target, *flags)?))?;
            }
            MountStep::BindRecursive { source, target } => {
                source.with(|source| {
                    target.with(|target| Ok(mount::mount_bind_recursive(source, target)?))
                })?;
            }
            MountStep::Restrict { target, restrict } => {
                target.with(|target| {
                    let flags = current_mount_flags(target)? | restrict.flags();
                    mount::mount_remount(target, MountFlags::BIND | flags, c"")?;
                    restrict_submounts(target, *restrict)
                })?;
            }
            MountStep::MountProc { target, pids_only } => {
                target.with(|target| {
                    Ok(mount::mount(
                        c"proc",
                        target,
                        c"proc",
                        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                        pids_only.then_some(c"subset=pid"),
                    )?)
                })?;
            }
            MountStep::PivotRoot { root, cwd } => {
                pivot_into(root)?;
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
                target.with(|target| {
                    Ok(mount::mount(
                        c"tmpfs",
                        target,
                        c"tmpfs",
                        flags,
                        Some(options.as_c_str()),
                    )?)
                })?;
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
                // mknod(2) applies the umask: set the mode runc gives these nodes.
                rustix::fs::chmod(path.as_c_str(), rustix::fs::Mode::from_raw_mode(0o666))?;
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
                let flags = current_mount_flags(target)? | MountFlags::RDONLY;
                mount::mount_remount(target.as_c_str(), MountFlags::BIND | flags, c"")?;
            }
            MountStep::MakeDir { path } => {
                rustix::fs::mkdir(path.as_c_str(), rustix::fs::Mode::from_raw_mode(0o755))?;
            }
            MountStep::CoverFile {
                source,
                root,
                relative,
            } => {
                let dir = beneath::open_root(root)?;
                let covered = beneath::open_unfollowed(&dir, relative)?;
                let kind =
                    rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&covered)?.st_mode);
                if kind == rustix::fs::FileType::Directory {
                    return Err(rustix::io::Errno::ISDIR.into());
                }
                let mut buffer = [0u8; 32];
                mount::mount_bind(source.as_c_str(), beneath::fd_path(&covered, &mut buffer))?;
                // Found again: the path now ends in the file just mounted.
                let mounted = beneath::open(&dir, relative)?;
                let target = beneath::fd_path(&mounted, &mut buffer);
                let flags = current_mount_flags(target)? | Restriction::READ_ONLY.flags();
                mount::mount_remount(target, MountFlags::BIND | flags, c"")?;
            }
            MountStep::MountOverlay {
                target,
                lower,
                upper,
                work,
                idmapped,
            } => {
                let fs = mount::fsopen(c"overlay", mount::FsOpenFlags::FSOPEN_CLOEXEC)?;
                // Each clone lives until the overlay is made: closing its descriptor
                // dissolves it, and overlayfs could then not take it as a layer. (The
                // keeper has one thread: allocating here is safe.)
                let mut clones = Vec::new();
                for dir in lower {
                    if *idmapped {
                        let namespace = user_namespace.ok_or_else(|| {
                            io::Error::new(
                                io::ErrorKind::InvalidInput,
                                "idmapped layers without a user namespace",
                            )
                        })?;
                        let layer = idmapped_clone(dir, namespace)?;
                        mount::fsconfig_set_fd(&fs, c"lowerdir+", &layer)?;
                        clones.push(layer);
                    } else {
                        mount::fsconfig_set_string(&fs, c"lowerdir+", dir.as_c_str())?;
                    }
                }
                mount::fsconfig_set_string(&fs, c"upperdir", upper.as_c_str())?;
                mount::fsconfig_set_string(&fs, c"workdir", work.as_c_str())?;
                mount::fsconfig_create(&fs)?;
                drop(clones);
                let mounted = mount::fsmount(
                    &fs,
                    mount::FsMountFlags::FSMOUNT_CLOEXEC,
                    mount::MountAttrFlags::MOUNT_ATTR_NOSUID
                        | mount::MountAttrFlags::MOUNT_ATTR_NODEV,
                )?;
                mount::move_mount(
                    &mounted,
                    c"",
                    rustix::fs::CWD,
                    target.as_c_str(),
                    mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
                )?;
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

/// A detached clone of the mount at `dir`, idmapped through `user_namespace`
/// (`open_tree(OPEN_TREE_CLONE)`, then `mount_setattr(MOUNT_ATTR_IDMAP)`), read-only.
/// Async-signal-safe: raw system calls.
fn idmapped_clone(dir: &CStr, user_namespace: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd as _;
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        dir,
        rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
            | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )?;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: user_namespace.as_raw_fd() as u64,
    };
    mount_setattr(&tree, &attr, false)?;
    Ok(tree)
}

impl fmt::Display for MountStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |c: &CString| c.to_string_lossy().into_owned();
        match self {
            MountStep::UnshareNamespace => write!(f, "create a mount namespace"),
            MountStep::SetPropagation { target, flags } => {
                write!(f, "set propagation {flags:?} on {target}")
            }
            MountStep::BindRecursive { source, target } => {
                write!(f, "bind {source} to {target}")
            }
            MountStep::Restrict { target, restrict } => {
                write!(f, "make {target} {restrict}")
            }
            MountStep::MountProc { target, pids_only } => {
                let subset = if *pids_only { " (processes only)" } else { "" };
                write!(f, "mount proc at {target}{subset}")
            }
            MountStep::PivotRoot { root, cwd } => {
                write!(
                    f,
                    "pivot_root into {} (working dir {})",
                    show(root),
                    show(cwd)
                )
            }
            MountStep::Chdir { dir } => write!(f, "change directory to {}", show(dir)),
            MountStep::MountTmpfs { target, .. } => write!(f, "mount a tmpfs at {target}"),
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
            MountStep::MountOverlay { target, lower, .. } => write!(
                f,
                "mount an image of {} layers at {}",
                lower.len(),
                show(target)
            ),
            MountStep::CoverFile {
                source,
                root,
                relative,
            } => write!(
                f,
                "cover {}/{} with {} (read-only)",
                show(root),
                show(relative),
                show(source)
            ),
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

#[cfg(test)]
mod cover_file_tests {
    //! `CoverFile` on real mounts, in a mount namespace of the test's own thread.
    use super::*;
    use std::path::Path;

    /// The host's `/etc/resolv.conf` may be a link (systemd-resolved's, to `/run/...`,
    /// which a task root does not have): the group's file covers the link itself,
    /// read-only, and the link's target is untouched.
    #[test]
    fn a_link_at_the_end_is_covered_not_followed_and_the_cover_is_read_only() {
        super::plugin_mounts::tests::in_own_mount_namespace(|dir: &Path| {
            let root = dir.join("root");
            std::fs::create_dir_all(root.join("etc")).unwrap();
            let target = dir.join("stub-resolv.conf");
            std::fs::write(&target, "nameserver 127.0.0.53\n").unwrap();
            std::os::unix::fs::symlink(&target, root.join("etc/resolv.conf")).unwrap();
            // A dangling link, as the host's is inside a task root.
            std::os::unix::fs::symlink("/nonexistent/hosts", root.join("etc/hosts")).unwrap();
            let group = dir.join("group");
            std::fs::create_dir_all(&group).unwrap();
            for (name, text) in [
                ("resolv.conf", "nameserver 10.0.0.2\n"),
                ("hosts", "10.1.1.1 web\n"),
            ] {
                std::fs::write(group.join(name), text).unwrap();
                MountStep::CoverFile {
                    source: c_path(group.join(name)).unwrap(),
                    root: c_path(&root).unwrap(),
                    relative: c_path(Path::new("etc").join(name)).unwrap(),
                }
                .execute()
                .unwrap();
                assert_eq!(
                    std::fs::read_to_string(root.join("etc").join(name)).unwrap(),
                    text
                );
                let written = std::fs::OpenOptions::new()
                    .append(true)
                    .open(root.join("etc").join(name));
                assert_eq!(
                    written.err().and_then(|e| e.raw_os_error()),
                    Some(libc::EROFS),
                    "{name}"
                );
            }
            assert_eq!(
                std::fs::read_to_string(&target).unwrap(),
                "nameserver 127.0.0.53\n"
            );
            // A link on the way is refused, never followed.
            std::fs::create_dir_all(dir.join("elsewhere")).unwrap();
            std::fs::write(dir.join("elsewhere/passwd"), "x").unwrap();
            std::os::unix::fs::symlink(dir.join("elsewhere"), root.join("linked")).unwrap();
            let error = MountStep::CoverFile {
                source: c_path(group.join("hosts")).unwrap(),
                root: c_path(&root).unwrap(),
                relative: c_path("linked/passwd").unwrap(),
            }
            .execute()
            .unwrap_err();
            assert_eq!(error.raw_os_error(), Some(libc::ELOOP), "{error}");
            assert_eq!(
                std::fs::read_to_string(dir.join("elsewhere/passwd")).unwrap(),
                "x"
            );
        });
    }
}
