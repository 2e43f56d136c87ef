//! Nomad's service catalog (`provider = "nomad"` services): `GET /v1/services` and
//! `GET /v1/service/:name`.

use serde::{Deserialize, Serialize};

/// One instance of a service: Nomad's `ServiceRegistration`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRegistration {
    #[serde(rename = "ID")]
    pub id: String,
    pub service_name: String,
    pub namespace: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub datacenter: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    pub tags: Vec<String>,
    pub address: String,
    pub port: u16,
    pub create_index: u64,
    pub modify_index: u64,
}

/// `GET /v1/services`: the services of each namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRegistrationListStub {
    pub namespace: String,
    pub services: Vec<ServiceRegistrationStub>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServiceRegistrationStub {
    pub service_name: String,
    pub tags: Vec<String>,
}

/// `GET /v1/client/allocation/:id/checks`: the latest result of each check Nomad's
/// client runs (a provider "nomad" service's), by check ID.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CheckQueryResult {
    #[serde(rename = "ID")]
    pub id: String,
    pub check: String,
    pub group: String,
    /// `healthiness` (berth's checks all are: they do not gate deployments).
    pub mode: String,
    pub output: String,
    pub service: String,
    /// `success`, `failure` or `pending`.
    pub status: String,
    pub status_code: u16,
    pub task: String,
    /// Seconds since the Unix epoch.
    pub timestamp: u64,
}
