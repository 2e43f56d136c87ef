//! An alloc's `ephemeral_disk { size }`, enforced by the kernel: its directory is a
//! filesystem tree whose blocks and inodes the kernel counts and refuses past the size,
//! files unlinked but held open, passed to another process or kept only by a memory
//! mapping included (they stay the alloc's until freed).
//!
//! The agent chooses one mechanism at start ([`DiskLimits::detect`]) and shows it in the
//! node's attributes and in `alloc status`:
//! - **project quotas** ([`quota`]) where the data dir's filesystem has them (XFS, or
//!   ext4 mounted `prjquota`): the alloc's directory gets a project id of its own, which
//!   what is made in it inherits, and the project gets the size and the inode limit;
//! - otherwise **an image** ([`image`]): a sparse ext4 file of the alloc's size under
//!   `<data_dir>/alloc-disks/`, made by `mkfs.ext4` and loop-mounted at the alloc's
//!   directory (`nosuid,nodev`) by the host; its blocks are freed at GC.
//!
//! The inode limit is one inode per 4 KiB of the size, unless the operator sets
//! `ephemeral_disk_inodes_per_mb`. What is used is read from the kernel in one call per
//! round (`statvfs` of the image, the project's quota): a report, and the alloc runner
//! stops an alloc whose disk is full ("Disk Resources Exceeded").
//!
//! An alloc whose directory an older build made (it holds files and has no image or
//! project) keeps what it had: [`AllocDiskLimit::Measured`], the runner's walk.

pub mod image;
pub mod quota;

use std::io;
use std::path::{Path, PathBuf};

use berth_model::limits::MIB;

/// Inodes per MB of `ephemeral_disk` when the operator sets none: one per 4 KiB.
pub const DEFAULT_INODES_PER_MB: u64 = 256;

/// The fewest inodes an alloc's filesystem gets, whatever its size: its directories
/// (`alloc/{data,logs,tmp}`, each task's `local`, `secrets`, `tmp`) and a few files.
const MIN_INODES: u64 = 128;

/// How the node limits allocs' disks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mechanism {
    /// Project quotas on the data dir's filesystem.
    ProjectQuota { filesystem: String },
    /// An ext4 image per alloc, loop-mounted.
    Image,
    /// Neither works on this node; allocs are refused with this reason.
    Unavailable { why: String },
}

impl Mechanism {
    /// The node attribute's value (`storage.ephemeral_disk_limit`).
    pub fn name(&self) -> &'static str {
        match self {
            Mechanism::ProjectQuota { .. } => "project-quota",
            Mechanism::Image => "image",
            Mechanism::Unavailable { .. } => "none",
        }
    }
}

/// How one alloc's disk is limited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocDiskLimit {
    /// The kernel counts and refuses (the node's mechanism).
    Kernel,
    /// Measured by walking (an alloc an older build made).
    Measured,
}

/// What an alloc's disk holds, as the kernel counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    pub used_bytes: u64,
    pub used_inodes: u64,
    pub max_inodes: u64,
    /// The kernel refuses more: no block or no inode left to the alloc.
    pub full: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "this node cannot limit the alloc's disk: {why}; mount the data dir's filesystem \
         with project quotas (XFS, or ext4 made with -O project,quota and mounted prjquota), \
         or give the agent loop devices (/dev/loop-control) and mkfs.ext4 (e2fsprogs)"
    )]
    Unavailable { why: String },
    #[error(
        "the data dir's filesystem has {free_mb} MB free ({promised_mb} MB of it promised \
         to other allocs' disks) and this alloc's ephemeral_disk needs {needed_mb} MB: free \
         space under {}, lower ephemeral_disk size, or put the data dir on a filesystem \
         with project quotas (XFS, or ext4 mounted prjquota)",
        data_dir.display()
    )]
    NoRoom {
        data_dir: PathBuf,
        free_mb: u64,
        promised_mb: u64,
        needed_mb: u64,
    },
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("mkfs.ext4 failed on {}: {message}", image.display())]
    Mkfs { image: PathBuf, message: String },
    #[error(
        "the alloc's filesystem at {} is still in use ({why}): it stays, with its size \
         counted, until whatever holds it lets go",
        root.display()
    )]
    Held { root: PathBuf, why: String },
    #[error("every project id berth may use on {filesystem} is taken")]
    NoProjectId { filesystem: String },
}

/// Why a mechanism does not work on this node (for [`Mechanism::Unavailable`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

impl DiskError {
    fn io(action: &'static str, path: &Path, source: io::Error) -> DiskError {
        DiskError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The node's disk limits: the mechanism chosen at start, and what it needs.
#[derive(Debug)]
pub struct DiskLimits {
    mechanism: Mechanism,
    data_dir: PathBuf,
    inodes_per_mb: u64,
    projects: quota::Projects,
}

impl DiskLimits {
    /// Chooses the mechanism for allocs under `data_dir`: project quotas where its
    /// filesystem enforces them, else images where loop devices and `mkfs.ext4` exist.
    pub fn detect(data_dir: &Path, inodes_per_mb: Option<u64>) -> DiskLimits {
        let mechanism = match quota::detect(data_dir) {
            Ok(filesystem) => Mechanism::ProjectQuota { filesystem },
            Err(no_quota) => match image::available() {
                Ok(()) => Mechanism::Image,
                Err(no_image) => Mechanism::Unavailable {
                    why: format!("{no_quota}, and {no_image}"),
                },
            },
        };
        DiskLimits::with_mechanism(mechanism, data_dir, inodes_per_mb)
    }

    pub fn with_mechanism(
        mechanism: Mechanism,
        data_dir: &Path,
        inodes_per_mb: Option<u64>,
    ) -> DiskLimits {
        DiskLimits {
            mechanism,
            data_dir: data_dir.to_path_buf(),
            inodes_per_mb: inodes_per_mb.unwrap_or(DEFAULT_INODES_PER_MB).max(1),
            projects: quota::Projects::default(),
        }
    }

    pub fn mechanism(&self) -> &Mechanism {
        &self.mechanism
    }

    /// The inodes an alloc of `size_mb` may hold.
    pub fn inodes_for(&self, size_mb: u64) -> u64 {
        size_mb.saturating_mul(self.inodes_per_mb).max(MIN_INODES)
    }

    /// Where the image of alloc `alloc_id` is kept.
    pub fn image_path(&self, alloc_id: &str) -> PathBuf {
        self.data_dir
            .join("alloc-disks")
            .join(format!("{alloc_id}.ext4"))
    }

    /// Limits the directory `root` of alloc `alloc_id` to `size_mb` (idempotent: an
    /// alloc restored after an agent restart finds its limit in place, or put back).
    /// The directory is made; it is empty unless it was limited before. Blocking.
    pub fn limit(
        &self,
        alloc_id: &str,
        root: &Path,
        size_mb: u64,
    ) -> Result<AllocDiskLimit, DiskError> {
        let inodes = self.inodes_for(size_mb);
        match &self.mechanism {
            Mechanism::Unavailable { why } => Err(DiskError::Unavailable { why: why.clone() }),
            Mechanism::ProjectQuota { filesystem } => {
                self.projects
                    .limit(filesystem, root, size_mb.saturating_mul(MIB), inodes)
            }
            Mechanism::Image => image::limit(
                &self.data_dir,
                &self.image_path(alloc_id),
                root,
                size_mb.saturating_mul(MIB),
                inodes,
            ),
        }
    }

    /// Whether allocs of `sizes_mb` would not all find room for their images now (free
    /// space less what other images may still take): the agent then collects finished
    /// allocs first. Always false for project quotas, which promise nothing. Blocking.
    pub fn room_short(&self, sizes_mb: &[u64]) -> bool {
        if self.mechanism != Mechanism::Image {
            return false;
        }
        let needed = sizes_mb
            .iter()
            .map(|mb| image::image_bytes(mb.saturating_mul(MIB), self.inodes_for(*mb)))
            .fold(0u64, u64::saturating_add);
        !image::has_room(&self.data_dir, &self.data_dir.join("alloc-disks"), needed)
    }

    /// What the alloc's disk holds; `None` when the kernel does not limit it (an alloc
    /// an older build made, or one whose limit is gone). Blocking: one call.
    pub fn usage(&self, root: &Path) -> Option<DiskUsage> {
        match &self.mechanism {
            Mechanism::ProjectQuota { .. } => quota::usage(root),
            Mechanism::Image => image::usage(root),
            Mechanism::Unavailable { .. } => None,
        }
    }

    /// Gives back what limited alloc `alloc_id` once its directory is no longer used:
    /// the image is unmounted (nothing may be mounted below it) and removed, the
    /// project's limits cleared after `remove_contents` ran. Blocking.
    pub fn release(
        &self,
        alloc_id: &str,
        root: &Path,
        remove_contents: impl FnOnce() -> io::Result<()>,
    ) -> Result<(), DiskError> {
        match &self.mechanism {
            Mechanism::ProjectQuota { .. } => self.projects.release(root, remove_contents),
            Mechanism::Image => {
                image::release(&self.data_dir, &self.image_path(alloc_id), root)?;
                remove_contents().map_err(|e| DiskError::io("removing", root, e))
            }
            Mechanism::Unavailable { .. } => {
                remove_contents().map_err(|e| DiskError::io("removing", root, e))
            }
        }
    }
}
