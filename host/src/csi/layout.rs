//! Where CSI things live on the host, and where the plugin sees them.
//!
//! ```text
//!   <data_dir>/csi/                       shared mount (bound onto itself, MS_SHARED)
//!     plugins/<plugin_alloc>/csi.sock     bound into the plugin at `mount_dir`
//!     node/<plugin_id>/                   bound into the plugin at `stage_publish_base_dir`
//!       staging/<volume>/<usage>/         NodeStageVolume's staging_target_path
//!       per-alloc/<alloc>/<volume>/<usage>  NodePublishVolume's target_path
//! ```
//!
//! The `csi` directory is a shared mount so that what the plugin mounts inside its own
//! mount namespace (bidirectional propagation) appears on the host, where the agent
//! binds it into the consuming tasks.

use std::io;
use std::path::{Path, PathBuf};

use rustix::mount::MountPropagationFlags;

use crate::mount::mountinfo;

/// The socket directory of the plugin task of `alloc_id`.
pub fn socket_dir(root: &Path, alloc_id: &str) -> PathBuf {
    root.join("plugins").join(alloc_id)
}

pub const SOCKET_NAME: &str = "csi.sock";

/// The root a plugin stages and publishes under, seen from the host and from the plugin.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginDirs {
    pub host: PathBuf,
    pub plugin: PathBuf,
}

/// A path the host and the plugin both use, each by its own name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPath {
    pub host: PathBuf,
    pub plugin: PathBuf,
}

impl PluginDirs {
    /// The dirs of plugin `plugin_id` whose task sees its root at `base_dir`.
    pub fn new(root: &Path, plugin_id: &str, base_dir: &str) -> PluginDirs {
        PluginDirs {
            host: root.join("node").join(plugin_id),
            plugin: PathBuf::from(base_dir),
        }
    }

    fn both(&self, relative: PathBuf) -> SharedPath {
        SharedPath {
            host: self.host.join(&relative),
            plugin: self.plugin.join(relative),
        }
    }

    pub fn staging(&self, volume: &str, usage: &str) -> SharedPath {
        self.both(Path::new("staging").join(volume).join(usage))
    }

    pub fn publish(&self, alloc_id: &str, volume: &str, usage: &str) -> SharedPath {
        self.both(
            Path::new("per-alloc")
                .join(alloc_id)
                .join(volume)
                .join(usage),
        )
    }

    pub fn per_alloc(&self, alloc_id: &str) -> PathBuf {
        self.host.join("per-alloc").join(alloc_id)
    }
}

/// Makes `root` a shared mount (bound onto itself first if it is not a mount point), so
/// mounts made below it in a plugin's namespace propagate to the host.
pub fn ensure_shared(root: &Path) -> io::Result<()> {
    std::fs::create_dir_all(root)?;
    let root = root.canonicalize()?;
    let mounts = mountinfo::read_self()?;
    let here = mounts.iter().rev().find(|m| m.mount_point == root);
    match here {
        Some(entry) if entry.shared_group().is_some() => return Ok(()),
        Some(_) => {}
        None => rustix::mount::mount_bind(&root, &root)?,
    }
    rustix::mount::mount_change(&root, MountPropagationFlags::SHARED)?;
    Ok(())
}

/// Whether anything is mounted at or below `path` (other than `path` itself).
pub fn mounted_below(path: &Path) -> io::Result<bool> {
    let path = match path.canonicalize() {
        Ok(path) => path,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(mountinfo::read_self()?
        .iter()
        .any(|m| m.mount_point != path && m.mount_point.starts_with(&path)))
}

/// Whether `path` is itself a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(path) = path.canonicalize() else {
        return false;
    };
    mountinfo::read_self()
        .map(|mounts| mounts.iter().any(|m| m.mount_point == path))
        .unwrap_or(false)
}

/// Undoes [`ensure_shared`] once nothing is mounted below `root` any more: the last
/// plugin is gone and no volume is staged.
pub fn release_shared_if_unused(root: &Path) -> io::Result<()> {
    if !is_mount_point(root) || mounted_below(root)? {
        return Ok(());
    }
    rustix::mount::unmount(root, rustix::mount::UnmountFlags::DETACH)?;
    Ok(())
}
