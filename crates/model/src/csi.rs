//! CSI's vocabulary as berth uses it: plugin kinds, access and attachment modes, a
//! volume's usage on this node, what fingerprinting found, and the deadlines CSI calls
//! get. Plain data: the gRPC mapping lives in `csi/`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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

    pub fn parse(text: &str) -> Result<AccessMode, CsiNameError> {
        AccessMode::ALL
            .into_iter()
            .find(|m| m.as_str() == text)
            .ok_or_else(|| CsiNameError::AccessMode(text.to_string()))
    }

    /// Modes in which nobody may write.
    pub fn read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
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

    pub fn parse(text: &str) -> Result<AttachmentMode, CsiNameError> {
        match text {
            "file-system" => Ok(AttachmentMode::FileSystem),
            "block-device" => Ok(AttachmentMode::BlockDevice),
            other => Err(CsiNameError::AttachmentMode(other.to_string())),
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
}

/// Whether a volume id can be used as a path segment and a key: CSI volume ids in berth
/// are `[A-Za-z0-9._-]`, at most 128 characters, and not `.` or `..`.
pub fn check_volume_id(id: &str) -> Result<(), CsiNameError> {
    if usable_id(id) {
        Ok(())
    } else {
        Err(CsiNameError::VolumeId(id.to_string()))
    }
}

/// Plugin ids follow the rule of volume ids: they name directories and keys too.
pub fn check_plugin_id(id: &str) -> Result<(), CsiNameError> {
    if usable_id(id) {
        Ok(())
    } else {
        Err(CsiNameError::PluginId(id.to_string()))
    }
}

fn usable_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A CSI name or mode berth does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsiNameError {
    #[error("unknown access mode {0:?} (use {known})", known = AccessMode::ALL.map(AccessMode::as_str).join(", "))]
    AccessMode(String),
    #[error("unknown attachment mode {0:?} (use file-system or block-device)")]
    AttachmentMode(String),
    #[error("volume id {0:?} must be 1 to 128 letters, digits, '.', '_' or '-'")]
    VolumeId(String),
    #[error("CSI plugin id {0:?} must be 1 to 128 letters, digits, '.', '_' or '-'")]
    PluginId(String),
}

/// How long calls may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// One attempt.
    pub call: Duration,
    /// All attempts of one operation, with the backoff between them.
    pub total: Duration,
}

impl Timeouts {
    /// For the volume operations of an alloc.
    pub const OPERATIONS: Timeouts = Timeouts {
        call: Duration::from_secs(10),
        total: Duration::from_secs(30),
    };
    /// For a health probe: one short attempt.
    pub const PROBE: Timeouts = Timeouts {
        call: Duration::from_secs(2),
        total: Duration::from_secs(2),
    };
}

/// What NodeGetCapabilities / ControllerGetCapabilities / GetPluginCapabilities say,
/// flattened to what berth uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capabilities {
    pub controller_service: bool,
    pub stage_unstage: bool,
    pub controller_publish: bool,
    pub create_delete: bool,
    /// CREATE_DELETE_SNAPSHOT.
    #[serde(default)]
    pub snapshots: bool,
    /// LIST_SNAPSHOTS.
    #[serde(default)]
    pub list_snapshots: bool,
    /// The controller's EXPAND_VOLUME.
    #[serde(default)]
    pub controller_expand: bool,
    /// The node's EXPAND_VOLUME.
    #[serde(default)]
    pub node_expand: bool,
}

/// A snapshot as a plugin's controller describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub plugin_id: String,
    pub snapshot_id: String,
    /// The plugin's id of the volume it was taken of.
    pub source_volume_id: String,
    pub size_bytes: i64,
    /// Seconds since the epoch; 0 when the plugin did not say.
    pub created_at: i64,
    pub ready_to_use: bool,
}

/// What fingerprinting a plugin found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub name: String,
    pub vendor_version: String,
    /// NodeGetInfo's node id (node plugins).
    pub node_id: Option<String>,
    /// NodeGetInfo's accessible topology: where this node is (`zone = "a"`, …).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub topology: std::collections::BTreeMap<String, String>,
    pub capabilities: Capabilities,
    /// Set when a fingerprint call failed.
    pub error: Option<String>,
}

/// How long the manager waits and how long its calls may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiSettings {
    /// The operator's grants of mounting to CSI plugin tasks (a node plugin mounts
    /// volumes): each names the plugin id and the jobs that may run it so, since a job
    /// author writes the plugin id. Every other plugin task is confined and cannot mount.
    pub privileged_plugins: Vec<PluginGrant>,
    pub timeouts: Timeouts,
    /// How long an alloc waits for its volume's plugin to be registered and healthy.
    pub plugin_wait: Duration,
}

/// `csi { privileged_plugin "ID" { jobs = [...] } }`: plugin `id`, run by one of `jobs`,
/// may mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginGrant {
    pub id: String,
    pub jobs: Vec<String>,
}

impl Default for CsiSettings {
    fn default() -> Self {
        CsiSettings {
            privileged_plugins: Vec::new(),
            timeouts: Timeouts::OPERATIONS,
            plugin_wait: Duration::from_secs(30),
        }
    }
}
