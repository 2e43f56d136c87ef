//! The mounts a CSI node plugin the operator granted mounting asks for, made **for it**
//! by its mount warden ([`crate::process::mount_warden`]) after checking where they go.
//!
//! Real plugins publish with mount(8): `mount -o bind SRC TARGET`, then
//! `mount -o bind,remount[,ro] SRC TARGET`. A seccomp filter sees only a call's flags,
//! never its paths, so the plugin's `mount(2)` calls with `MS_BIND` are handed to the
//! warden (a seccomp user notification), which reads the paths once and acts on its own
//! copy: nothing the plugin changes afterwards redirects the mount. The rules:
//!
//! - **Targets only under the plugin's dirs** (the read-write, bidirectional mounts the
//!   host handed it: its `stage_publish_base_dir` and `mount_dir`), resolved below each
//!   dir's descriptor, opened before the plugin ran, through no link and never out
//!   ([`super::beneath`]). A dir itself is not a target.
//! - **`nosuid,nodev` always.** Every bind and every remount keeps them, whatever the
//!   request says (mount(8)'s remount with a source argument passes neither, and the
//!   kernel would clear them).
//! - **Read-only stays read-only.** A remount may make a mount writable only when this
//!   warden bound it from a writable source (recorded by the kernel's unique mount id,
//!   which is never reused). A read-only bind (the host's `/usr`, a read-only volume)
//!   bound into a publish dir stays read-only, so remounting it `rw` cannot open the
//!   host's filesystem for writing.
//!
//! Sources may be anything the plugin sees: it is the operator's, and what it binds
//! lands only under its own dirs, without setuid files or devices.

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, Mode, OFlags, StatVfsMountFlags, StatxFlags};
use rustix::io::Errno;
use rustix::mount::{MoveMountFlags, OpenTreeFlags};

use super::set_attributes;

/// `STATX_MNT_ID_UNIQUE` (Linux 6.8): a mount id the kernel never hands out again.
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// `mount_setattr(2)`'s attribute bits.
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// A `mount(2)` call a plugin made with `MS_BIND`, as the warden read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `MS_BIND` (with `MS_REC`: `recursive`).
    Bind {
        source: CString,
        target: CString,
        recursive: bool,
    },
    /// `MS_REMOUNT | MS_BIND`: the bind's flags changed.
    Remount {
        target: CString,
        read_only: bool,
        noexec: bool,
    },
}

impl Request {
    /// The request `mount(2)` with these flags makes, or `None` when it is not a bind
    /// (the seccomp filter hands over only calls with `MS_BIND`).
    pub fn from_call(source: CString, target: CString, flags: u64) -> Option<Request> {
        if flags & libc::MS_BIND == 0 {
            return None;
        }
        Some(if flags & libc::MS_REMOUNT != 0 {
            Request::Remount {
                target,
                read_only: flags & libc::MS_RDONLY != 0,
                noexec: flags & libc::MS_NOEXEC != 0,
            }
        } else {
            Request::Bind {
                source,
                target,
                recursive: flags & libc::MS_REC != 0,
            }
        })
    }

    pub fn target(&self) -> &CStr {
        match self {
            Request::Bind { target, .. } | Request::Remount { target, .. } => target,
        }
    }
}

/// Why a request was not carried out: the error number the plugin's call returns, and
/// the reason for the plugin's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Refused {
    pub errno: Errno,
    pub reason: String,
}

fn refused(errno: Errno, reason: impl Into<String>) -> Refused {
    Refused {
        errno,
        reason: reason.into(),
    }
}

/// The plugin's dirs and the mounts made for it.
#[derive(Debug)]
pub struct PluginMounts {
    /// Each dir as the plugin names it, and its descriptor, opened before the plugin ran.
    dirs: Vec<(CString, OwnedFd)>,
    /// Unique ids of the mounts bound here from writable sources.
    writable: HashSet<u64>,
}

impl PluginMounts {
    /// Opens `dirs` (absolute paths in the calling process's root, which is the
    /// plugin's) through no link.
    pub fn open(dirs: &[CString]) -> std::io::Result<PluginMounts> {
        let root = super::beneath::open_root(c"/")?;
        let mut opened = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let relative = dir.to_bytes().strip_prefix(b"/").unwrap_or(dir.to_bytes());
            let relative = CString::new(relative).map_err(std::io::Error::other)?;
            let fd = if relative.is_empty() {
                super::beneath::open_root(c"/")?
            } else {
                super::beneath::open(&root, &relative)?
            };
            opened.push((dir.clone(), fd));
        }
        Ok(PluginMounts {
            dirs: opened,
            writable: HashSet::new(),
        })
    }

    /// The dirs, for messages.
    pub fn dir_names(&self) -> String {
        let names: Vec<String> = self
            .dirs
            .iter()
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        names.join(", ")
    }

    /// Carries out `request`, or says why not.
    pub fn perform(&mut self, request: &Request) -> Result<(), Refused> {
        match request {
            Request::Bind {
                source,
                target,
                recursive,
            } => self.bind(source, target, *recursive),
            Request::Remount {
                target,
                read_only,
                noexec,
            } => self.remount(target, *read_only, *noexec),
        }
    }

    fn bind(&mut self, source: &CStr, target: &CStr, recursive: bool) -> Result<(), Refused> {
        if recursive {
            // A recursive bind copies every mount below its source, the plugin's own
            // shared dirs among them, and each copy propagates to the host: a few calls
            // made tens of thousands of the host's mounts. mount(8)'s `bind` is not
            // recursive.
            return Err(refused(
                Errno::PERM,
                format!("a recursive bind of {source:?} (rbind): a plugin's binds copy one mount"),
            ));
        }
        let target_fd = self.resolve(target)?;
        // Links are followed, as mount(8) follows them, but not /proc's magic links: those
        // would be followed with the warden's privileges, not the plugin's.
        let source_fd = rustix::fs::openat2(
            rustix::fs::CWD,
            source,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            rustix::fs::ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| refused(e, format!("source {source:?}: {e}")))?;
        let source_read_only = rustix::fs::fstatvfs(&source_fd)
            .map_err(|e| refused(e, format!("source {source:?}: {e}")))?
            .f_flag
            .contains(StatVfsMountFlags::RDONLY);
        let mut flags = OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH;
        if recursive {
            flags |= OpenTreeFlags::AT_RECURSIVE;
        }
        let tree = rustix::mount::open_tree(&source_fd, c"", flags)
            .map_err(|e| refused(e, format!("binding {source:?}: {e}")))?;
        // Private before it is attached: a clone of a shared mount (the plugin's own dirs
        // are shared with the host) joins its source's peer group, so each later bind of
        // that source would be copied onto every earlier one too, doubling the mounts at
        // each call, on the host's side as well. Attached under a shared parent, the
        // clone still propagates to the host, as a group of its own.
        set_attributes(
            &tree,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            0,
            libc::MS_PRIVATE,
            recursive,
        )
        .map_err(|e| {
            refused(
                e,
                format!("making the bind of {source:?} nosuid,nodev: {e}"),
            )
        })?;
        let id = unique_mount_id(&tree);
        rustix::mount::move_mount(
            &tree,
            c"",
            &target_fd,
            c"",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )
        .map_err(|e| refused(e, format!("binding {source:?} at {target:?}: {e}")))?;
        if let (Some(id), false) = (id, source_read_only) {
            self.writable.insert(id);
        }
        Ok(())
    }

    fn remount(&mut self, target: &CStr, read_only: bool, noexec: bool) -> Result<(), Refused> {
        let target_fd = self.resolve(target)?;
        let stat = rustix::fs::statx(
            &target_fd,
            c"",
            AtFlags::EMPTY_PATH,
            StatxFlags::MNT_ID | StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE),
        )
        .map_err(|e| refused(e, format!("{target:?}: {e}")))?;
        let mount_root = rustix::fs::StatxAttributes::MOUNT_ROOT;
        let known = stat.stx_attributes_mask;
        let attributes = stat.stx_attributes;
        if known.contains(mount_root) && !attributes.contains(mount_root) {
            return Err(refused(
                Errno::INVAL,
                format!("{target:?} is not a mount point: only a bind is remounted"),
            ));
        }
        let currently_read_only = rustix::fs::fstatvfs(&target_fd)
            .map_err(|e| refused(e, format!("{target:?}: {e}")))?
            .f_flag
            .contains(StatVfsMountFlags::RDONLY);
        let id = (stat.stx_mask & STATX_MNT_ID_UNIQUE != 0).then_some(stat.stx_mnt_id);
        if currently_read_only && !read_only && !id.is_some_and(|id| self.writable.contains(&id)) {
            return Err(refused(
                Errno::PERM,
                format!(
                    "{target:?} is read-only and was not bound here from a writable source: \
                     it stays read-only"
                ),
            ));
        }
        let mut set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        let mut clear = 0;
        if read_only {
            set |= MOUNT_ATTR_RDONLY;
        } else {
            clear |= MOUNT_ATTR_RDONLY;
        }
        if noexec {
            set |= MOUNT_ATTR_NOEXEC;
        }
        set_attributes(&target_fd, set, clear, 0, false)
            .map_err(|e| refused(e, format!("remounting {target:?}: {e}")))
    }

    /// `target` below one of the dirs, through no link: absolute, no `.` or `..`, and
    /// strictly below a dir.
    fn resolve(&self, target: &CStr) -> Result<OwnedFd, Refused> {
        let outside = || {
            refused(
                Errno::PERM,
                format!(
                    "{target:?} is not below the plugin's staging and publish dirs ({})",
                    self.dir_names()
                ),
            )
        };
        let path = Path::new(OsStr::from_bytes(target.to_bytes()));
        if !path.is_absolute()
            || path
                .components()
                .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
        {
            return Err(refused(
                Errno::PERM,
                format!("{target:?}: a plugin's mount target is an absolute path without . or .."),
            ));
        }
        for (dir, fd) in &self.dirs {
            let dir = Path::new(OsStr::from_bytes(dir.to_bytes()));
            let Ok(below) = path.strip_prefix(dir) else {
                continue;
            };
            if below.as_os_str().is_empty() {
                return Err(outside());
            }
            let below = super::c_path(below).map_err(|_| outside())?;
            return super::beneath::open(fd, &below).map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::EXDEV) => refused(
                    Errno::PERM,
                    format!("{target:?} resolves through a link: a plugin's mount target may not"),
                ),
                _ => {
                    let errno = Errno::from_io_error(&e).unwrap_or(Errno::INVAL);
                    refused(errno, format!("{target:?}: {e}"))
                }
            });
        }
        Err(outside())
    }
}

/// The kernel's unique id of the mount `fd` is on, where the kernel has one.
fn unique_mount_id(fd: &impl AsFd) -> Option<u64> {
    let stat = rustix::fs::statx(
        fd,
        c"",
        AtFlags::EMPTY_PATH,
        StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE),
    )
    .ok()?;
    (stat.stx_mask & STATX_MNT_ID_UNIQUE != 0).then_some(stat.stx_mnt_id)
}

#[cfg(test)]
pub(super) mod tests {
    //! Real mounts, as root, in a mount namespace of the test's own thread: everything
    //! mounted goes with the thread.
    use super::*;

    use std::path::PathBuf;

    /// Runs `test` on a thread in a private mount namespace of its own.
    pub(in crate::mount) fn in_own_mount_namespace(test: impl FnOnce(&Path) + Send + 'static) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        std::thread::spawn(move || {
            // SAFETY: this thread's own mount namespace; it shares no descriptor table or
            // filesystem state the rest of the test process relies on.
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }.unwrap();
            rustix::mount::mount_change(
                c"/",
                rustix::mount::MountPropagationFlags::PRIVATE
                    | rustix::mount::MountPropagationFlags::REC,
            )
            .unwrap();
            test(&root);
        })
        .join()
        .unwrap();
    }

    fn c(path: impl AsRef<Path>) -> CString {
        super::super::c_path(path).unwrap()
    }

    /// The mount options of the mount at `path`, from this thread's mount table.
    fn options_at(path: &Path) -> Option<String> {
        let tid = rustix::thread::gettid().as_raw_nonzero();
        let table = std::fs::read_to_string(format!("/proc/self/task/{tid}/mountinfo")).ok()?;
        table.lines().rev().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields.get(4).map(PathBuf::from).as_deref() == Some(path))
                .then(|| fields[5].to_string())
        })
    }

    fn bind(source: &Path, target: &Path) -> Request {
        Request::Bind {
            source: c(source),
            target: c(target),
            recursive: false,
        }
    }

    fn remount(target: &Path, read_only: bool) -> Request {
        Request::Remount {
            target: c(target),
            read_only,
            noexec: false,
        }
    }

    #[test]
    fn binds_and_remounts_below_the_plugins_dirs_keep_nosuid_and_read_only_sources() {
        in_own_mount_namespace(|root| {
            let dirs = root.join("csi");
            let data = root.join("data");
            let sealed = root.join("sealed");
            for dir in [
                "csi/rw",
                "csi/ro",
                "csi/copy",
                "csi/plain",
                "data",
                "sealed",
                "outside",
            ] {
                std::fs::create_dir_all(root.join(dir)).unwrap();
            }
            // The plugin's dir is a mount, as the host hands it; `sealed` is read-only, as
            // the host's /usr is in a task.
            rustix::mount::mount_bind(&dirs, &dirs).unwrap();
            rustix::mount::mount_bind(&sealed, &sealed).unwrap();
            rustix::mount::mount_remount(
                &sealed,
                rustix::mount::MountFlags::BIND | rustix::mount::MountFlags::RDONLY,
                c"",
            )
            .unwrap();
            std::os::unix::fs::symlink(root.join("outside"), dirs.join("link")).unwrap();
            let mut mounts = PluginMounts::open(&[c(&dirs)]).unwrap();

            // mount(8)'s publish: bind, then bind,remount,rw and bind,remount,ro.
            mounts.perform(&bind(&data, &dirs.join("rw"))).unwrap();
            let options = options_at(&dirs.join("rw")).unwrap();
            assert!(
                options.starts_with("rw,")
                    && options.contains("nosuid")
                    && options.contains("nodev"),
                "{options}"
            );
            mounts.perform(&remount(&dirs.join("rw"), true)).unwrap();
            assert!(options_at(&dirs.join("rw")).unwrap().starts_with("ro,"));
            mounts.perform(&remount(&dirs.join("rw"), false)).unwrap();
            let options = options_at(&dirs.join("rw")).unwrap();
            assert!(
                options.starts_with("rw,") && options.contains("nosuid,nodev"),
                "{options}"
            );
            mounts.perform(&bind(&data, &dirs.join("ro"))).unwrap();
            mounts.perform(&remount(&dirs.join("ro"), true)).unwrap();
            assert!(options_at(&dirs.join("ro")).unwrap().starts_with("ro,"));

            // A read-only source stays read-only.
            mounts.perform(&bind(&sealed, &dirs.join("copy"))).unwrap();
            let refusal = mounts
                .perform(&remount(&dirs.join("copy"), false))
                .unwrap_err();
            assert_eq!(refusal.errno, Errno::PERM, "{refusal}");
            assert!(
                refusal
                    .reason
                    .contains("read-only and was not bound here from a writable source"),
                "{refusal}"
            );
            assert!(options_at(&dirs.join("copy")).unwrap().starts_with("ro,"));
            assert!(std::fs::write(dirs.join("copy/x"), "x").is_err());

            // Nothing outside the dirs, not the dir itself, nothing through a link.
            for target in [
                root.join("outside"),
                sealed.clone(),
                dirs.clone(),
                dirs.join("link/x"),
                dirs.join("../outside"),
            ] {
                let refusal = mounts.perform(&bind(&data, &target)).unwrap_err();
                assert_eq!(
                    refusal.errno,
                    Errno::PERM,
                    "{}: {refusal}",
                    target.display()
                );
                let refusal = mounts.perform(&remount(&target, false)).unwrap_err();
                assert_eq!(
                    refusal.errno,
                    Errno::PERM,
                    "{}: {refusal}",
                    target.display()
                );
            }
            assert!(options_at(&sealed).unwrap().starts_with("ro,"));
            assert!(options_at(&root.join("outside")).is_none());
            // No recursive bind (each copy of the plugin's shared dirs reaches the
            // host), and no source through /proc's magic links.
            let rbind = Request::Bind {
                source: c(&data),
                target: c(dirs.join("plain")),
                recursive: true,
            };
            assert_eq!(mounts.perform(&rbind).unwrap_err().errno, Errno::PERM);
            let magic = bind(Path::new("/proc/self/root"), &dirs.join("plain"));
            assert_eq!(mounts.perform(&magic).unwrap_err().errno, Errno::LOOP);
            assert!(options_at(&dirs.join("plain")).is_none());
            // A remount is of a mount point, as the kernel has it.
            let refusal = mounts
                .perform(&remount(&dirs.join("plain"), true))
                .unwrap_err();
            assert_eq!(refusal.errno, Errno::INVAL, "{refusal}");
        });
    }

    /// A plugin that binds its own shared dir into itself again and again (mount --bind
    /// /csi /csi/dN): each bind adds its one mount and its one propagated copy, never a
    /// copy onto every earlier bind (which doubled the mounts at each call: 8,190 for
    /// 12 binds).
    #[test]
    fn binds_of_a_shared_dir_into_itself_grow_the_mounts_one_by_one() {
        in_own_mount_namespace(|root| {
            let dirs = root.join("csi");
            let peer = root.join("host-side");
            std::fs::create_dir_all(&dirs).unwrap();
            std::fs::create_dir_all(&peer).unwrap();
            // As the host hands it: a shared mount with a peer on the host's side.
            rustix::mount::mount_bind(&dirs, &dirs).unwrap();
            rustix::mount::mount_change(&dirs, rustix::mount::MountPropagationFlags::SHARED)
                .unwrap();
            rustix::mount::mount_bind(&dirs, &peer).unwrap();
            let mut mounts = PluginMounts::open(&[c(&dirs)]).unwrap();
            let below = |root: &Path| {
                let tid = rustix::thread::gettid().as_raw_nonzero();
                let table =
                    std::fs::read_to_string(format!("/proc/self/task/{tid}/mountinfo")).unwrap();
                table
                    .lines()
                    .filter(|line| {
                        line.split(' ')
                            .nth(4)
                            .is_some_and(|point| Path::new(point).starts_with(root))
                    })
                    .count()
            };
            let before = below(root);
            const BINDS: usize = 12;
            for n in 0..BINDS {
                let target = dirs.join(format!("d{n}"));
                std::fs::create_dir_all(&target).unwrap();
                mounts.perform(&bind(&dirs, &target)).unwrap();
            }
            let added = below(root) - before;
            // One mount and its copy on the peer per bind; doubling would be 2^12.
            assert!(added <= 2 * BINDS, "{added} mounts for {BINDS} binds");
        });
    }

    #[test]
    fn requests_read_from_mount_flags() {
        let (source, target) = (c("/s"), c("/t"));
        assert_eq!(
            Request::from_call(source.clone(), target.clone(), libc::MS_REMOUNT),
            None
        );
        assert_eq!(
            Request::from_call(source.clone(), target.clone(), libc::MS_BIND | libc::MS_REC),
            Some(bind_request(&source, &target, true))
        );
        assert_eq!(
            Request::from_call(
                source,
                target.clone(),
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY
            ),
            Some(Request::Remount {
                target,
                read_only: true,
                noexec: false
            })
        );
    }

    fn bind_request(source: &CStr, target: &CStr, recursive: bool) -> Request {
        Request::Bind {
            source: source.to_owned(),
            target: target.to_owned(),
            recursive,
        }
    }
}
