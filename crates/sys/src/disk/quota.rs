//! Project quotas: where the data dir's filesystem has them (XFS, or ext4 made with
//! `-O project,quota` and mounted `prjquota`), an alloc's directory gets a project id of
//! its own with `FS_XFLAG_PROJINHERIT`, so everything made in it is the project's, and
//! the project gets the alloc's size and inode limit (`quotactl_fd(2)`). The kernel
//! charges a file to its project until its last block is freed: unlinked, held, passed
//! or mapped, it still counts.
//!
//! The id is read back from the directory itself, so an agent restarted finds it.
//! Ids come from [`FIRST_ID`] on; one is taken only if the kernel shows the project
//! empty and unlimited (no other user of the filesystem has it).

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use super::{AllocDiskLimit, DiskError, DiskUsage, Unsupported};

/// The first project id berth gives an alloc, and how many it may use.
pub const FIRST_ID: u32 = 2_000_000_000;
const IDS: u32 = 1_000_000;

/// `<linux/quota.h>`: project quotas, and the unit of block limits.
const PRJQUOTA: libc::c_int = 2;
const QIF_BLOCK_BYTES: u64 = 1024;

/// `<linux/fs.h>`: `FS_IOC_FSGETXATTR`, `FS_IOC_FSSETXATTR` and the inherit flag.
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801C_581F;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401C_5820;
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;

#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

fn qcmd(command: libc::c_int) -> libc::c_int {
    (command << 8) | (PRJQUOTA & 0xff)
}

/// `quotactl_fd(2)` on the filesystem of `fd`, for project `id`.
fn quotactl(
    fd: &OwnedFd,
    command: libc::c_int,
    id: u32,
    quota: &mut libc::dqblk,
) -> io::Result<()> {
    // SAFETY: `quota` is a `struct if_dqblk` that outlives the call.
    let answer = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            fd.as_raw_fd(),
            qcmd(command) as libc::c_uint,
            id as libc::c_int,
            quota as *mut libc::dqblk,
        )
    };
    if answer < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn empty_quota() -> libc::dqblk {
    // SAFETY: all-zero is a valid `if_dqblk` (integers only).
    unsafe { std::mem::zeroed() }
}

fn get_quota(fd: &OwnedFd, id: u32) -> io::Result<libc::dqblk> {
    let mut quota = empty_quota();
    quotactl(fd, libc::Q_GETQUOTA, id, &mut quota)?;
    Ok(quota)
}

fn set_limits(fd: &OwnedFd, id: u32, bytes: u64, inodes: u64) -> io::Result<()> {
    let mut quota = empty_quota();
    quota.dqb_bhardlimit = bytes.div_ceil(QIF_BLOCK_BYTES);
    quota.dqb_ihardlimit = inodes;
    quota.dqb_valid = libc::QIF_BLIMITS | libc::QIF_ILIMITS;
    quotactl(fd, libc::Q_SETQUOTA, id, &mut quota)
}

fn get_xattr(dir: &OwnedFd) -> io::Result<FsXattr> {
    let mut attr = FsXattr::default();
    // SAFETY: `attr` is a `struct fsxattr` that outlives the call.
    let answer = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            FS_IOC_FSGETXATTR,
            &mut attr as *mut FsXattr,
        )
    };
    if answer < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

fn set_project(dir: &OwnedFd, id: u32) -> io::Result<()> {
    let mut attr = get_xattr(dir)?;
    attr.projid = id;
    attr.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: `attr` is a `struct fsxattr` that outlives the call.
    let answer =
        unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_FSSETXATTR, &attr as *const FsXattr) };
    if answer < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens a directory without following a link: a task may swap one of its own
/// directories for a link, never the alloc's root, but nothing here relies on that.
fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The filesystem of `data_dir` ("ext4 on /dev/sdb1") when it enforces project quotas.
pub fn detect(data_dir: &Path) -> Result<String, Unsupported> {
    let data_dir = data_dir
        .canonicalize()
        .map_err(|e| Unsupported(format!("{}: {e}", data_dir.display())))?;
    let mounts = crate::mount::mountinfo::read_self().map_err(|e| Unsupported(e.to_string()))?;
    let Some(mount) = mounts
        .iter()
        .filter(|m| data_dir.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
    else {
        return Err(Unsupported("the data dir is on no mount".into()));
    };
    let filesystem = format!("{} on {}", mount.fs_type, mount.source);
    let quotas = mount
        .super_options
        .split(',')
        .chain(mount.options.split(','))
        .any(|o| matches!(o, "prjquota" | "pquota" | "pqnoenforce"));
    if !matches!(mount.fs_type.as_str(), "ext4" | "xfs") || !quotas {
        return Err(Unsupported(format!(
            "the data dir's filesystem ({filesystem}) has no project quotas"
        )));
    }
    let dir = open_dir(&data_dir).map_err(|e| Unsupported(e.to_string()))?;
    get_quota(&dir, 0)
        .map_err(|e| Unsupported(format!("project quotas on {filesystem} answer: {e}")))?;
    Ok(filesystem)
}

/// The project ids this agent's allocs hold.
#[derive(Debug, Default)]
pub struct Projects {
    taken: Mutex<BTreeSet<u32>>,
}

impl Projects {
    /// See [`super::DiskLimits::limit`].
    pub fn limit(
        &self,
        filesystem: &str,
        root: &Path,
        bytes: u64,
        inodes: u64,
    ) -> Result<AllocDiskLimit, DiskError> {
        let io = |action, e| DiskError::io(action, root, e);
        match std::fs::create_dir(root) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io("creating", e));
            }
            _ => {}
        }
        let dir = open_dir(root).map_err(|e| io("opening", e))?;
        let attr = get_xattr(&dir).map_err(|e| io("reading the project of", e))?;
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        if attr.projid >= FIRST_ID && attr.xflags & FS_XFLAG_PROJINHERIT != 0 {
            // Restored: the directory's project, limited again (the same values).
            taken.insert(attr.projid);
            set_limits(&dir, attr.projid, bytes, inodes)
                .map_err(|e| io("setting the quota of", e))?;
            return Ok(AllocDiskLimit::Kernel);
        }
        let holds_files = std::fs::read_dir(root).is_ok_and(|mut e| e.next().is_some());
        if holds_files {
            return Ok(AllocDiskLimit::Measured);
        }
        let id = (FIRST_ID..FIRST_ID + IDS)
            .filter(|id| !taken.contains(id))
            .find(|id| {
                get_quota(&dir, *id).is_ok_and(|q| {
                    q.dqb_curinodes == 0
                        && q.dqb_curspace == 0
                        && q.dqb_bhardlimit == 0
                        && q.dqb_ihardlimit == 0
                })
            })
            .ok_or_else(|| DiskError::NoProjectId {
                filesystem: filesystem.to_string(),
            })?;
        // The limits first: the directory is never the project's without them.
        set_limits(&dir, id, bytes, inodes).map_err(|e| io("setting the quota of", e))?;
        set_project(&dir, id).map_err(|e| io("setting the project of", e))?;
        taken.insert(id);
        Ok(AllocDiskLimit::Kernel)
    }

    /// See [`super::DiskLimits::release`]: the contents go, then the project's limits.
    pub fn release(
        &self,
        root: &Path,
        remove_contents: impl FnOnce() -> io::Result<()>,
    ) -> Result<(), DiskError> {
        let parent = root.parent().unwrap_or(root);
        let id = open_dir(root)
            .and_then(|dir| get_xattr(&dir))
            .ok()
            .map(|attr| attr.projid)
            .filter(|id| *id >= FIRST_ID);
        remove_contents().map_err(|e| DiskError::io("removing", root, e))?;
        let Some(id) = id else {
            return Ok(());
        };
        let fs = open_dir(parent).map_err(|e| DiskError::io("opening", parent, e))?;
        set_limits(&fs, id, 0, 0).map_err(|e| DiskError::io("clearing the quota of", root, e))?;
        self.taken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        Ok(())
    }
}

/// See [`super::DiskLimits::usage`]: the quota of the directory's project.
pub fn usage(root: &Path) -> Option<DiskUsage> {
    let dir = open_dir(root).ok()?;
    let attr = get_xattr(&dir).ok()?;
    if attr.projid < FIRST_ID {
        return None;
    }
    let quota = get_quota(&dir, attr.projid).ok()?;
    let max_bytes = quota.dqb_bhardlimit.saturating_mul(QIF_BLOCK_BYTES);
    Some(DiskUsage {
        used_bytes: quota.dqb_curspace,
        used_inodes: quota.dqb_curinodes,
        max_inodes: quota.dqb_ihardlimit,
        full: quota.dqb_curspace >= max_bytes || quota.dqb_curinodes >= quota.dqb_ihardlimit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data dir on a filesystem without project quotas (this node's `/tmp`) is not
    /// taken for one, and says why.
    #[test]
    fn a_filesystem_without_project_quotas_is_refused_saying_which() {
        let dir = tempfile::tempdir().unwrap();
        let refused = detect(dir.path()).unwrap_err().to_string();
        assert!(refused.contains("has no project quotas"), "{refused}");
        assert_eq!(qcmd(libc::Q_GETQUOTA), 0x8000_0702_u32 as i32);
    }

    #[test]
    fn the_kernels_structures_have_their_sizes() {
        assert_eq!(std::mem::size_of::<FsXattr>(), 28);
        assert_eq!(std::mem::size_of::<libc::dqblk>(), 72);
    }
}
