//! CSI volumes and plugins: `CSIVolumeListStub`, `CSIVolume`, `CSIPluginListStub`,
//! `CSIPlugin`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Map;
use crate::allocs::AllocationListStub;

/// `GET /v1/volumes?type=csi`: Nomad's `CSIVolListStub`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolumeListStub {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    pub name: String,
    #[serde(rename = "ExternalID")]
    pub external_id: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub topologies: Vec<CsiTopology>,
    pub access_mode: String,
    pub attachment_mode: String,
    pub current_readers: u64,
    pub current_writers: u64,
    pub schedulable: bool,
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    pub provider: String,
    pub controller_required: bool,
    pub controllers_healthy: u64,
    pub controllers_expected: u64,
    pub nodes_healthy: u64,
    pub nodes_expected: u64,
    /// A time in Nomad's code; `null` here, as a one-node agent never sets it.
    pub resource_exhausted: Option<Value>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `GET /v1/volume/csi/:id`: Nomad's `CSIVolume`. Secrets are never shown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolume {
    #[serde(flatten)]
    pub stub: CsiVolumeListStub,
    pub provider_version: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub requested_capabilities: Vec<CsiVolumeCapability>,
    /// Bytes (Go's `int64`, as every capacity in Nomad).
    pub capacity: i64,
    pub requested_capacity_min: i64,
    pub requested_capacity_max: i64,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub parameters: Map<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub context: Map<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub secrets: Map<String>,
    pub mount_options: Option<Value>,
    #[serde(rename = "SnapshotID")]
    pub snapshot_id: String,
    #[serde(rename = "CloneID")]
    pub clone_id: String,
    /// The allocs that claim it to read, by id (the values are `null`, as Nomad sends).
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub read_allocs: Map<Option<Value>>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub write_allocs: Map<Option<Value>>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub allocations: Vec<AllocationListStub>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolumeCapability {
    pub access_mode: String,
    pub attachment_mode: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiTopology {
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub segments: Map<String>,
}

/// `PUT /v1/volume/csi/:id` and `/create`: the volume as now recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiVolumeWriteResponse {
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub volumes: Vec<CsiVolume>,
    pub warnings: String,
    pub index: u64,
}

/// `GET /v1/plugins?type=csi`: Nomad's `CSIPluginListStub`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiPluginListStub {
    #[serde(rename = "ID")]
    pub id: String,
    pub provider: String,
    pub controller_required: bool,
    pub controllers_healthy: u64,
    pub controllers_expected: u64,
    pub nodes_healthy: u64,
    pub nodes_expected: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `GET /v1/plugin/csi/:id`: Nomad's `CSIPlugin`, each provider as a `CSIInfo` keyed
/// by node id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiPlugin {
    #[serde(flatten)]
    pub stub: CsiPluginListStub,
    pub version: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub controllers: Map<CsiInfo>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub nodes: Map<CsiInfo>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub allocations: Vec<AllocationListStub>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiInfo {
    #[serde(rename = "PluginID")]
    pub plugin_id: String,
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    pub healthy: bool,
    pub health_description: String,
    pub requires_controller_plugin: bool,
    pub requires_topologies: bool,
    /// Set for a controller plugin.
    pub controller_info: Option<CsiControllerInfo>,
    /// Set for a node plugin.
    pub node_info: Option<CsiNodeInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiControllerInfo {
    pub supports_create_delete: bool,
    pub supports_attach_detach: bool,
    pub supports_create_delete_snapshot: bool,
    pub supports_list_snapshots: bool,
    pub supports_expand: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CsiNodeInfo {
    #[serde(rename = "ID")]
    pub id: String,
    pub max_volumes: u64,
    pub accessible_topology: Option<CsiTopology>,
    pub requires_node_stage_volume: bool,
}
