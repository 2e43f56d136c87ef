//! The seam on the host: cgroupfs through [`Cgroups`], `fchown`, `/etc/passwd`.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use super::{RunCgroup, Sys};
use crate::alloc_dir::open_dir_nofollow;
use crate::cgroup::{CgroupError, Cgroups, TaskCgroup};
use crate::disk::{AllocDiskLimit, DiskError, DiskLimits, DiskUsage, Mechanism};
use crate::process::users::UserError;
use berth_model::driver::TaskUser;
use berth_model::limits::{CgroupSettings, TaskLimits};

/// `user::rwx group::rwx other::---` in the kernel's `posix_acl_xattr` form: a version
/// (2), then entries of tag (`USER_OBJ` 0x01, `GROUP_OBJ` 0x04, `OTHER` 0x20), permissions
/// and an id (none for these), little-endian.
const GROUP_SHARED_DEFAULT_ACL: [u8; 28] = [
    2, 0, 0, 0, // version
    0x01, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, // user::rwx
    0x04, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, // group::rwx
    0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, // other::---
];

/// The privileged operations, done on this host.
pub struct LinuxSys {
    cgroups: Cgroups,
    /// `None`: allocs' disks are not limited by the kernel (measured by the runner).
    disk: Option<DiskLimits>,
}

impl LinuxSys {
    /// Without disk limits: for tools and benches that run tasks of no alloc's size.
    pub fn new(cgroups: Cgroups) -> LinuxSys {
        LinuxSys {
            cgroups,
            disk: None,
        }
    }

    /// With the node's disk limits (the agent's).
    pub fn with_disk(cgroups: Cgroups, disk: DiskLimits) -> LinuxSys {
        LinuxSys {
            cgroups,
            disk: Some(disk),
        }
    }
}

impl Sys for LinuxSys {
    fn create_cgroup(
        &self,
        name: &str,
        limits: &TaskLimits,
    ) -> Result<Box<dyn RunCgroup>, CgroupError> {
        Ok(Box::new(self.cgroups.create(name, limits)?))
    }

    fn existing_cgroup(&self, name: &str, limits: &TaskLimits) -> Box<dyn RunCgroup> {
        Box::new(self.cgroups.existing(name, limits))
    }

    fn collectors_cgroup(&self, name: &str) -> Result<Box<dyn RunCgroup>, CgroupError> {
        Ok(Box::new(self.cgroups.collectors(name)?))
    }

    fn existing_collectors_cgroup(&self, name: &str) -> Box<dyn RunCgroup> {
        Box::new(self.cgroups.existing_collectors(name))
    }

    fn cgroup_usage(&self, name: &str) -> berth_model::usage::CgroupUsage {
        self.cgroups.usage(name)
    }

    fn missing_controllers(&self) -> Vec<&'static str> {
        self.cgroups.missing()
    }

    fn cgroup_settings(&self) -> &CgroupSettings {
        self.cgroups.settings()
    }

    fn give_dirs(&self, dirs: &[(PathBuf, u32)], user: TaskUser) -> io::Result<()> {
        let owner = Some(rustix::fs::Uid::from_raw(user.uid));
        let group = Some(rustix::fs::Gid::from_raw(user.gid));
        crate::blocking::run(|| {
            for (path, mode) in dirs {
                let dir = open_dir_nofollow(path)?;
                rustix::fs::fchown(&dir, owner, group)?;
                rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(*mode))?;
            }
            Ok(())
        })
    }

    fn share_dirs_with_group(&self, dirs: &[PathBuf]) -> io::Result<()> {
        crate::blocking::run(|| {
            for path in dirs {
                let dir = open_dir_nofollow(path)?;
                rustix::fs::fsetxattr(
                    &dir,
                    "system.posix_acl_default",
                    &GROUP_SHARED_DEFAULT_ACL,
                    rustix::fs::XattrFlags::empty(),
                )?;
            }
            Ok(())
        })
    }

    fn give_file(&self, file: BorrowedFd<'_>, user: TaskUser) -> io::Result<()> {
        rustix::fs::fchown(
            file,
            Some(rustix::fs::Uid::from_raw(user.uid)),
            Some(rustix::fs::Gid::from_raw(user.gid)),
        )?;
        Ok(())
    }

    fn lookup_user(&self, name: &str) -> Result<TaskUser, UserError> {
        crate::process::users::lookup(name)
    }

    fn disk_mechanism(&self) -> Mechanism {
        match &self.disk {
            Some(disk) => disk.mechanism().clone(),
            None => Mechanism::Unavailable {
                why: "the agent was built without disk limits".into(),
            },
        }
    }

    fn limit_alloc_disk(
        &self,
        alloc_id: &str,
        root: &Path,
        size_mb: u64,
    ) -> Result<AllocDiskLimit, DiskError> {
        match &self.disk {
            Some(disk) => disk.limit(alloc_id, root, size_mb),
            None => Ok(AllocDiskLimit::Measured),
        }
    }

    fn disk_room_short(&self, sizes_mb: &[u64]) -> bool {
        self.disk
            .as_ref()
            .is_some_and(|disk| disk.room_short(sizes_mb))
    }

    fn alloc_disk_usage(&self, root: &Path) -> Option<DiskUsage> {
        self.disk.as_ref()?.usage(root)
    }

    fn release_alloc_disk(
        &self,
        alloc_id: &str,
        root: &Path,
        remove_contents: &mut dyn FnMut() -> io::Result<()>,
    ) -> Result<(), DiskError> {
        match &self.disk {
            Some(disk) => disk.release(alloc_id, root, remove_contents),
            None => remove_contents().map_err(|source| DiskError::Io {
                action: "removing",
                path: root.to_path_buf(),
                source,
            }),
        }
    }
}

impl RunCgroup for TaskCgroup {
    fn procs_files(&self) -> &[PathBuf] {
        TaskCgroup::procs_files(self)
    }

    fn oom_kills(&self) -> u64 {
        TaskCgroup::oom_kills(self)
    }

    fn pids(&self) -> Vec<u32> {
        TaskCgroup::pids(self)
    }

    fn kill_and_remove(&self) -> Result<(), CgroupError> {
        TaskCgroup::kill_and_remove(self)
    }

    fn job_pids_share_used_up(&self) -> Option<u64> {
        TaskCgroup::job_pids_share_used_up(self)
    }
}
