//! CSI on the node: the gRPC client ([`client`]), the dynamic plugin registry
//! ([`registry`]), and the manager that fingerprints plugins and stages and publishes
//! volumes for allocs ([`manager`]). The plugin tasks themselves are supervised by the
//! `csi_plugin_supervisor` task hook; allocs get their volumes from the `csi_hook` alloc
//! hook.
//!
//! ```text
//!   plugin task ─(supervisor: probe, register)─► registry ─(subscribe)─► manager
//!   alloc ─(csi_hook: claim in catalog, wait for plugin)─► manager.mount_volume
//!         ─► ControllerPublish? ─► NodeStage (once per volume+usage) ─► NodePublish
//! ```
//!
//! Host paths (what the agent mounts and binds) and plugin paths (what the plugin sees
//! inside its own mount namespace) are kept apart by [`layout::PluginDirs`].

pub mod client;
pub mod layout;
pub mod manager;
pub mod registry;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use berth_proto::csi as pb;

/// What a plugin task provides: the node service, the controller service, or both
/// (a `monolith` registers one of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    Node,
    Controller,
}

impl PluginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Node => "node",
            PluginKind::Controller => "controller",
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// CSI access modes, by Nomad's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessMode {
    SingleNodeReaderOnly,
    SingleNodeWriter,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
}

impl AccessMode {
    pub const ALL: [AccessMode; 5] = [
        AccessMode::SingleNodeReaderOnly,
        AccessMode::SingleNodeWriter,
        AccessMode::MultiNodeReaderOnly,
        AccessMode::MultiNodeSingleWriter,
        AccessMode::MultiNodeMultiWriter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::SingleNodeReaderOnly => "single-node-reader-only",
            AccessMode::SingleNodeWriter => "single-node-writer",
            AccessMode::MultiNodeReaderOnly => "multi-node-reader-only",
            AccessMode::MultiNodeSingleWriter => "multi-node-single-writer",
            AccessMode::MultiNodeMultiWriter => "multi-node-multi-writer",
        }
    }

    pub fn parse(text: &str) -> Result<AccessMode, String> {
        AccessMode::ALL
            .into_iter()
            .find(|m| m.as_str() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = AccessMode::ALL.iter().map(|m| m.as_str()).collect();
                format!("unknown access mode {text:?} (use {})", known.join(", "))
            })
    }

    /// Modes in which nobody may write.
    pub fn read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
    }

    fn to_proto(self) -> pb::volume_capability::access_mode::Mode {
        use pb::volume_capability::access_mode::Mode;
        match self {
            AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
            AccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            AccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
            AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
        }
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the volume reaches the task. berth mounts file systems; block devices are named
/// so that a spec asking for one gets a clear refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachmentMode {
    FileSystem,
    BlockDevice,
}

impl AttachmentMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachmentMode::FileSystem => "file-system",
            AttachmentMode::BlockDevice => "block-device",
        }
    }

    pub fn parse(text: &str) -> Result<AttachmentMode, String> {
        match text {
            "file-system" => Ok(AttachmentMode::FileSystem),
            "block-device" => Ok(AttachmentMode::BlockDevice),
            other => Err(format!(
                "unknown attachment mode {other:?} (use file-system or block-device)"
            )),
        }
    }
}

impl fmt::Display for AttachmentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One way a volume is used on this node: staged once per usage, published per alloc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
    pub read_only: bool,
}

impl Usage {
    /// Nomad's usage key, e.g. `rw-file-system-single-node-writer`; also a path segment.
    pub fn key(&self) -> String {
        format!(
            "{}-{}-{}",
            if self.read_only { "ro" } else { "rw" },
            self.attachment_mode,
            self.access_mode
        )
    }

    pub fn capability(&self) -> pb::VolumeCapability {
        use pb::volume_capability::{AccessMode as PbAccess, AccessType, BlockVolume, MountVolume};
        pb::VolumeCapability {
            access_type: Some(match self.attachment_mode {
                AttachmentMode::FileSystem => AccessType::Mount(MountVolume::default()),
                AttachmentMode::BlockDevice => AccessType::Block(BlockVolume {}),
            }),
            access_mode: Some(PbAccess {
                mode: self.access_mode.to_proto() as i32,
            }),
        }
    }
}

/// Whether a volume id can be used as a path segment and a key: CSI volume ids in berth
/// are `[A-Za-z0-9._-]`, at most 128 characters, and not `.` or `..`.
pub fn check_volume_id(id: &str) -> Result<(), String> {
    let fine = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "volume id {id:?} must be 1 to 128 letters, digits, '.', '_' or '-'"
        ))
    }
}

/// The CSI parts of one agent, shared by the alloc and task runners.
pub struct CsiNode {
    /// `<data_dir>/csi`: plugin sockets and staging roots live below.
    pub root: PathBuf,
    /// This node's name in claims and plugin providers (the host name).
    pub node_name: String,
    pub registry: Arc<registry::PluginRegistry>,
    pub manager: Arc<manager::CsiManager>,
    pub catalog: Arc<dyn Catalog>,
}

impl CsiNode {
    /// The CSI parts of an agent whose state is `store`: the registry as recorded, the
    /// embedded catalog, and a started manager (needs a tokio runtime).
    pub fn start(
        data_dir: &std::path::Path,
        store: Arc<crate::state::StateStore>,
        settings: manager::CsiSettings,
    ) -> Arc<CsiNode> {
        let node_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let registry = Arc::new(registry::PluginRegistry::restore(store.clone()));
        let catalog: Arc<dyn Catalog> = Arc::new(crate::catalog::embedded::EmbeddedCatalog::new(
            store.clone(),
        ));
        let manager = manager::CsiManager::new(
            registry.clone(),
            store,
            catalog.clone(),
            node_name.clone(),
            settings,
        );
        manager.start();
        Arc::new(CsiNode {
            root: data_dir.join("csi"),
            node_name,
            registry,
            manager,
            catalog,
        })
    }
}
