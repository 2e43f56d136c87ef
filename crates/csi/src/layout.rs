//! Where CSI things live on the host, and where the plugin sees them.
//!
//! ```text
//!   <data_dir>/csi/                       shared mount (bound onto itself, MS_SHARED)
//!     plugins/<plugin_alloc>/csi.sock     bound into the plugin at `mount_dir`
//!     node/<plugin_id>/                   bound into the plugin at `stage_publish_base_dir`
//!       staging/<volume>/                 NodeStageVolume's staging_target_path (one per
//!                                         volume, as the CSI spec has it; older berths
//!                                         staged at staging/<volume>/<usage>/)
//!       per-alloc/<alloc>/<volume>/<usage>  NodePublishVolume's target_path
//! ```
//!
//! The `csi` directory is a shared mount so that what the plugin mounts inside its own
//! mount namespace (bidirectional propagation) appears on the host, where the agent
//! binds it into the consuming tasks. Making it shared is a mount syscall, so it lives in
//! `berth_sys::mount::shared`.

use std::path::{Path, PathBuf};

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

    /// The one staging path of a volume on this node.
    pub fn staging_volume(&self, volume: &str) -> SharedPath {
        self.both(Path::new("staging").join(volume))
    }

    /// Where berth staged a volume per usage before it staged once per volume.
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
