//! What the agent does to the machine, as root: mounts (`mount`, the only module that
//! calls mount(2)), processes and their confinement (`process`: the spawn plan a task's
//! keeper follows, users, seccomp, the log collectors), task cgroups (`cgroup`), the
//! alloc's disk limit (`disk`), the alloc directory layout (`alloc_dir`), secrets kept in
//! files (`secret_file`), a group's network namespace and the CNI plugins that attach it
//! (`network`) and blocking work run from async code (`blocking`).
//!
//! The files of this crate import one another in one direction only: `blocking`,
//! `secret_file` and `alloc_dir` at the bottom, then `mount`, then `cgroup`, `disk`,
//! `network` and `process`, then `linux` (`LinuxSys`) and this file.
//!
//! This file is the seam between the runners and the privileged operations they need: a
//! task run's cgroup (create, join through its `cgroup.procs` files, read OOM kills, kill
//! and remove), handing a task's directories and secrets to its user (`fchown`), and
//! looking the user up, and the alloc's disk limit (`disk`). The runners reach these only
//! through [`Sys`], which they get in their context: [`LinuxSys`] does them on the host
//! (as root), and `berth-testkit`'s `FakeSys` records them, so the task and alloc
//! runners' logic is unit-tested without root.
//!
//! What is not here, and why: spawning a task's processes, with their rlimits, user and
//! confinement, is the driver's (a WebAssembly component, itself a seam: the `mock`
//! driver spawns nothing) through the host API in the runtime and `process/`; mounts are
//! `mount/`'s, reached through the CSI node and the task's spawn plan.
//! `host/tests/floors.rs` keeps cgroup and ownership calls out of the runners.

pub mod alloc_dir;
pub mod blocking;
pub mod cgroup;
pub mod disk;
mod linux;
pub mod mount;
pub mod network;
pub mod process;
pub mod secret_file;

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

pub use linux::LinuxSys;

use crate::cgroup::CgroupError;
use crate::disk::{AllocDiskLimit, DiskError, DiskUsage, Mechanism};
use crate::process::users::UserError;
use berth_model::driver::TaskUser;
use berth_model::limits::{CgroupSettings, TaskLimits};

/// The privileged operations of the task and alloc runners.
pub trait Sys: Send + Sync {
    /// Makes the cgroup of one task run, with its limits.
    fn create_cgroup(
        &self,
        name: &str,
        limits: &TaskLimits,
    ) -> Result<Box<dyn RunCgroup>, CgroupError>;

    /// The cgroup a run made before an agent restart (it may be gone).
    fn existing_cgroup(&self, name: &str, limits: &TaskLimits) -> Box<dyn RunCgroup>;

    /// The cgroup of an alloc's log collectors, made when missing (kept, with its
    /// processes, when it exists).
    fn collectors_cgroup(&self, name: &str) -> Result<Box<dyn RunCgroup>, CgroupError>;

    /// The collectors' cgroup of an alloc, to empty and remove (it may be gone).
    fn existing_collectors_cgroup(&self, name: &str) -> Box<dyn RunCgroup>;

    /// What the task cgroup `name` counts as used now (alloc stats). Blocking: small
    /// cgroupfs reads.
    fn cgroup_usage(&self, name: &str) -> berth_model::usage::CgroupUsage;

    /// The cgroup controllers this node lacks (the operator allowed running without).
    fn missing_controllers(&self) -> Vec<&'static str>;

    /// The operator's cgroup settings.
    fn cgroup_settings(&self) -> &CgroupSettings;

    /// Gives each directory (with its mode) to `user`, following no link: a task may
    /// have replaced its own directory with a symlink to a host path.
    fn give_dirs(&self, dirs: &[(PathBuf, u32)], user: TaskUser) -> io::Result<()>;

    /// Gives each directory a default ACL of `user::rwx group::rwx other::---`: what a
    /// task makes there is its group's to write (the umask does not apply under a default
    /// ACL), so tasks of one alloc, each its own user in the alloc's group, share files
    /// and sockets in `alloc/data` as they did as one user. No link is followed.
    fn share_dirs_with_group(&self, _dirs: &[PathBuf]) -> io::Result<()> {
        Ok(())
    }

    /// Gives an open file berth wrote for the task (a secret) to `user`.
    fn give_file(&self, file: BorrowedFd<'_>, user: TaskUser) -> io::Result<()>;

    /// The uid and primary gid of a user name (or number).
    fn lookup_user(&self, name: &str) -> Result<TaskUser, UserError>;

    /// How this node limits allocs' disks (`disk`).
    fn disk_mechanism(&self) -> Mechanism;

    /// Limits alloc `alloc_id`'s directory `root` (made here) to `size_mb` and the inodes
    /// that go with it; idempotent, for a restored alloc. Blocking.
    fn limit_alloc_disk(
        &self,
        alloc_id: &str,
        root: &Path,
        size_mb: u64,
    ) -> Result<AllocDiskLimit, DiskError>;

    /// Whether allocs of these `ephemeral_disk` sizes would not all find room for their
    /// disks now. Blocking.
    fn disk_room_short(&self, _sizes_mb: &[u64]) -> bool {
        false
    }

    /// What the alloc's disk holds as the kernel counts it; `None` when the kernel does
    /// not limit it. Blocking: one call.
    fn alloc_disk_usage(&self, root: &Path) -> Option<DiskUsage>;

    /// Gives back the alloc's disk once nothing uses its directory; `remove_contents`
    /// removes the directory at the right moment. Blocking.
    fn release_alloc_disk(
        &self,
        alloc_id: &str,
        root: &Path,
        remove_contents: &mut dyn FnMut() -> io::Result<()>,
    ) -> Result<(), DiskError>;
}

/// One task run's cgroup.
pub trait RunCgroup: Send + Sync + fmt::Debug {
    /// The `cgroup.procs` files a process writes itself into to join.
    fn procs_files(&self) -> &[PathBuf];

    /// How many times the kernel OOM-killed a process of this cgroup.
    fn oom_kills(&self) -> u64;

    /// The pids in the cgroup now.
    fn pids(&self) -> Vec<u32>;

    /// Kills every process in it and removes it. Blocking (it polls); call from
    /// `blocking::run`. A cgroup that does not exist is fine.
    fn kill_and_remove(&self) -> Result<(), CgroupError>;

    /// `Some(job_pids_max)` when a fork in this cgroup was refused because the job's
    /// pids share was used up.
    fn job_pids_share_used_up(&self) -> Option<u64> {
        None
    }
}
