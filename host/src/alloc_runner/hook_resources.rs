//! Data alloc hooks produce for task hooks (CSI mounts today; tokens later): one object
//! per alloc, shared by every task runner, read and written only through methods that
//! hold its lock and return copies.
//!
//! It is created with the alloc runner, before any hook runs (also when an alloc is
//! restored), so a task hook never finds it missing (Nomad's #16623).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// A volume an alloc hook mounted on the host, ready to be bound into tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    pub host_path: PathBuf,
    pub read_only: bool,
}

#[derive(Debug, Default)]
pub struct HookResources {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default, Clone)]
struct Inner {
    csi_mounts: BTreeMap<String, MountedVolume>,
}

impl HookResources {
    /// Replaces the CSI mounts (by group volume name) in one step, so readers see either
    /// the old set or the new one, never a mix.
    pub fn set_csi_mounts(&self, mounts: BTreeMap<String, MountedVolume>) {
        self.inner.lock().unwrap().csi_mounts = mounts;
    }

    pub fn csi_mounts(&self) -> BTreeMap<String, MountedVolume> {
        self.inner.lock().unwrap().csi_mounts.clone()
    }

    pub fn csi_mount(&self, volume: &str) -> Option<MountedVolume> {
        self.inner.lock().unwrap().csi_mounts.get(volume).cloned()
    }
}
