//! Where an alloc stands: what the agent wants of it (`DesiredStatus`) and what it has
//! become (`ClientStatus`), by Nomad's names.

use serde::{Deserialize, Serialize};

/// What has become of an alloc on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientStatus {
    Pending,
    Running,
    Complete,
    Failed,
}

/// What the agent wants of an alloc: recorded before the stop signal is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredStatus {
    Run,
    Stop,
}
