//! What the CSI manager asks of the host's mount table: whether a plugin's stage or
//! publication really appeared on the host, and unmounting one a plugin left behind.
//! The agent uses [`RealMounts`] (the kernel's table, `berth_sys::mount::shared`); the
//! manager's unit tests use a table the fake plugin writes, since reading and changing
//! the real one needs real mounts and root.

use std::io;
use std::path::Path;

pub trait HostMounts: Send + Sync {
    /// Whether `path` is itself a mount point on the host (not through a link).
    fn is_mount_point(&self, path: &Path) -> bool;
    /// Unmounts whatever is mounted at `path` below `base`, through no link; how many.
    fn unmount_all_below(&self, base: &Path, path: &Path) -> io::Result<usize>;
}

/// The host's own mount table.
pub struct RealMounts;

impl HostMounts for RealMounts {
    fn is_mount_point(&self, path: &Path) -> bool {
        berth_sys::mount::shared::is_mount_point(path)
    }

    fn unmount_all_below(&self, base: &Path, path: &Path) -> io::Result<usize> {
        berth_sys::mount::shared::unmount_all_below(base, path)
    }
}
