//! Nodes: `NodeListStub`, `Node`, and the answer of a node update.

use serde::{Deserialize, Serialize};

use crate::Map;

/// `GET /v1/nodes`: Nomad's `NodeListStub`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeListStub {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub datacenter: String,
    pub node_class: String,
    pub node_pool: String,
    pub version: String,
    pub drain: bool,
    pub scheduling_eligibility: String,
    pub status: String,
    pub status_description: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub drivers: Map<DriverInfo>,
    pub address: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `GET /v1/node/:id`: Nomad's `Node`, the stub's fields and the node's fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Node {
    #[serde(flatten)]
    pub stub: NodeListStub,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub attributes: Map<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub meta: Map<String>,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub host_volumes: Map<HostVolumeInfo>,
    pub node_resources: NodeResources,
    pub reserved_resources: NodeResources,
    #[serde(rename = "CSINodePlugins")]
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub csi_node_plugins: Map<serde_json::Value>,
    #[serde(rename = "CSIControllerPlugins")]
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub csi_controller_plugins: Map<serde_json::Value>,
    #[serde(rename = "TLSEnabled")]
    pub tls_enabled: bool,
    #[serde(rename = "HTTPAddr")]
    pub http_addr: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DriverInfo {
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub attributes: Map<String>,
    pub detected: bool,
    pub healthy: bool,
    pub health_description: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct HostVolumeInfo {
    pub name: String,
    pub path: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeResources {
    pub cpu: NodeCpuResources,
    pub memory: NodeMemoryResources,
    pub disk: NodeDiskResources,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeCpuResources {
    pub cpu_shares: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeMemoryResources {
    #[serde(rename = "MemoryMB")]
    pub memory_mb: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeDiskResources {
    #[serde(rename = "DiskMB")]
    pub disk_mb: u64,
}

/// `POST /v1/node/:id/eligibility`, `/drain`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeUpdateResponse {
    #[serde(rename = "EvalIDs")]
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub eval_ids: Vec<String>,
    pub eval_create_index: u64,
    pub node_modify_index: u64,
    pub index: u64,
}

/// `POST /v1/node/:id/eligibility`'s body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeEligibilityRequest {
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// `eligible` or `ineligible`.
    pub eligibility: String,
}

/// `POST /v1/node/:id/drain`'s body: a `DrainSpec` starts a drain, `null` ends it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NodeDrainRequest {
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub drain_spec: Option<DrainSpec>,
    pub mark_eligible: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DrainSpec {
    /// Nanoseconds (Go's `time.Duration`); 0: no deadline, -1: force at once.
    pub deadline: i64,
    pub ignore_system_jobs: bool,
}
