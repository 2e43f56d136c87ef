//! The agent's own endpoints (`/v1/agent/self`, `/health`, `/members`) and the event
//! stream's frames.

use serde::{Deserialize, Serialize};

use crate::Map;
use crate::allocs::Allocation;
use crate::jobs::Job;
use crate::nodes::NodeListStub;

/// `GET /v1/agent/self` (Nomad writes its top-level keys in lower case).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentSelf {
    pub config: AgentConfig,
    pub member: AgentMember,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub stats: Map<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AgentConfig {
    pub region: String,
    pub datacenter: String,
    pub node_name: String,
    pub data_dir: String,
    pub version: AgentVersion,
    pub client: Enabled,
    pub server: Enabled,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AgentVersion {
    pub version: String,
    pub version_prerelease: String,
    pub version_metadata: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Enabled {
    pub enabled: bool,
}

/// A member of the gossip pool (berth has none: the agent itself).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct AgentMember {
    pub name: String,
    pub addr: String,
    pub port: u16,
    pub status: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub tags: Map<String>,
}

/// `GET /v1/agent/health` (lower-case keys, as Nomad writes them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentHealthResponse {
    pub client: AgentHealth,
    pub server: AgentHealth,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentHealth {
    pub ok: bool,
    pub message: String,
}

/// `GET /v1/agent/members`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ServerMembers {
    pub server_name: String,
    pub server_region: String,
    #[serde(rename = "ServerDC")]
    pub server_dc: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub members: Vec<AgentMember>,
}

/// One line of `GET /v1/event/stream`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Events {
    pub index: u64,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub events: Vec<Event>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Event {
    pub topic: String,
    #[serde(rename = "Type")]
    pub kind: String,
    pub key: String,
    pub namespace: String,
    #[serde(deserialize_with = "crate::null_as_empty")]
    pub filter_keys: Vec<String>,
    pub index: u64,
    pub payload: Option<EventPayload>,
}

/// The object an event is about, under its kind's name (`{"Job": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EventPayload {
    Job(Box<Job>),
    Allocation(Box<Allocation>),
    Node(Box<NodeListStub>),
}

/// The last line of an event stream the agent closes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct EventStreamClosed {
    pub error: String,
}

/// `GET /.well-known/jwks.json`: the keys that verify workload identities (RFC 7517's
/// JWK Set; Ed25519 keys as RFC 8037's `OKP`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonWebKeySet {
    pub keys: Vec<JsonWebKey>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonWebKey {
    pub kty: String,
    pub crv: String,
    pub x: String,
    pub kid: String,
    pub alg: String,
    #[serde(rename = "use")]
    pub use_: String,
}
