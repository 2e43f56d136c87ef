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
    /// Its node went down (a cluster's scheduler says so; a node never says it of
    /// itself): replaced elsewhere.
    Lost,
}

impl ClientStatus {
    /// Done: it will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost
        )
    }
}

/// What the agent wants of an alloc: recorded before the stop signal is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredStatus {
    Run,
    Stop,
}
