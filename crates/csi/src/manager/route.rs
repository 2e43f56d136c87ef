//! Where a plugin's controller runs. On one node it runs here or nowhere; in a cluster it
//! may run on another node, and a controller operation asked here (create, delete,
//! snapshot, expand, ControllerPublish for this node's claim) is sent there as a
//! [`ControllerRequest`] and served by that node's manager ([`CsiManager::serve`]).
//! Node operations (stage, publish) never travel: they run where the volume is used.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use super::{CsiManager, CsiVolumeError};
use crate::client::NodeVolume;
use berth_model::csi::{PluginKind, SnapshotInfo, Usage};
use berth_state::catalog::Volume;

/// A controller operation, as one node asks another node's controller to do it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControllerRequest {
    Create {
        volume: Volume,
        capacity: (i64, i64),
    },
    Delete {
        volume: Volume,
    },
    CreateSnapshot {
        volume: Volume,
        name: String,
    },
    DeleteSnapshot {
        plugin_id: String,
        snapshot_id: String,
    },
    ListSnapshots {
        plugin_id: String,
    },
    /// ControllerExpandVolume only: the nodes that publish the volume follow on their own.
    Expand {
        volume: Volume,
        required: i64,
        usage: Usage,
    },
    /// ControllerPublishVolume to `node_id` (the claiming node's CSI node id).
    Publish {
        volume: Volume,
        usage: Usage,
        node_id: String,
    },
    Unpublish {
        plugin_id: String,
        external_id: String,
        node_id: String,
        #[serde(default)]
        secrets: HashMap<String, String>,
    },
}

impl ControllerRequest {
    /// The plugin whose controller serves the request.
    pub fn plugin_id(&self) -> &str {
        match self {
            ControllerRequest::Create { volume, .. }
            | ControllerRequest::Delete { volume }
            | ControllerRequest::CreateSnapshot { volume, .. }
            | ControllerRequest::Expand { volume, .. }
            | ControllerRequest::Publish { volume, .. } => &volume.plugin_id,
            ControllerRequest::DeleteSnapshot { plugin_id, .. }
            | ControllerRequest::ListSnapshots { plugin_id }
            | ControllerRequest::Unpublish { plugin_id, .. } => plugin_id,
        }
    }

    /// What the request does, for errors and traces.
    pub fn action(&self) -> &'static str {
        match self {
            ControllerRequest::Create { .. } => "CreateVolume",
            ControllerRequest::Delete { .. } => "DeleteVolume",
            ControllerRequest::CreateSnapshot { .. } => "CreateSnapshot",
            ControllerRequest::DeleteSnapshot { .. } => "DeleteSnapshot",
            ControllerRequest::ListSnapshots { .. } => "ListSnapshots",
            ControllerRequest::Expand { .. } => "ControllerExpandVolume",
            ControllerRequest::Publish { .. } => "ControllerPublishVolume",
            ControllerRequest::Unpublish { .. } => "ControllerUnpublishVolume",
        }
    }
}

/// A controller's answer to a [`ControllerRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControllerAnswer {
    Created(Box<Volume>),
    Done,
    Snapshot(SnapshotInfo),
    Snapshots(Vec<SnapshotInfo>),
    Expanded {
        capacity: i64,
        node_required: bool,
    },
    /// The publish context, or `None` when the controller does not publish
    /// (no PUBLISH_UNPUBLISH_VOLUME): there is nothing to undo.
    Published(Option<HashMap<String, String>>),
}

pub type RemoteCall<'a> =
    Pin<Box<dyn Future<Output = Result<ControllerAnswer, CsiVolumeError>> + Send + 'a>>;

/// The way to other nodes' controllers (the cluster's).
pub trait RemoteControllers: Send + Sync {
    /// A node (by name) other than this one with a controller of `plugin_id`, and
    /// whether that controller is healthy now (a healthy one when there is one).
    fn controller_node(&self, plugin_id: &str) -> Option<(String, bool)>;

    /// Sends `request` to `node`'s controller and waits for its answer.
    fn call<'a>(&'a self, node: &'a str, request: ControllerRequest) -> RemoteCall<'a>;
}

/// Where a controller operation runs.
enum Location {
    Here,
    On(String),
    /// On that node, once its controller is healthy again (it is registered there).
    AwaitedOn(String),
}

/// How often a controller operation waiting for another node's controller looks again.
const REMOTE_HEALTH_POLL: std::time::Duration = std::time::Duration::from_millis(500);

impl CsiManager {
    /// Lets controller operations reach controllers on other nodes (set once, when the
    /// agent joins a cluster).
    pub fn route_controllers_through(&self, remote: std::sync::Arc<dyn RemoteControllers>) {
        let _ = self.remote.set(remote);
    }

    /// A controller running here wins (it is waited for while it starts); otherwise one
    /// on another node, healthy or to be waited for; otherwise here again, so the caller
    /// waits for one to register and gets today's clear error when none does.
    fn controller_location(&self, plugin_id: &str) -> Location {
        if self
            .registry
            .get(PluginKind::Controller, plugin_id)
            .is_some()
        {
            return Location::Here;
        }
        match self
            .remote
            .get()
            .and_then(|remote| remote.controller_node(plugin_id))
        {
            Some((node, true)) if node != self.node_name => Location::On(node),
            Some((node, false)) if node != self.node_name => Location::AwaitedOn(node),
            _ => Location::Here,
        }
    }

    /// Whether this node runs a controller of `plugin_id` (healthy or not yet).
    pub fn runs_controller(&self, plugin_id: &str) -> bool {
        self.registry
            .get(PluginKind::Controller, plugin_id)
            .is_some()
    }

    /// Whether any controller of `plugin_id` is known, here or on another node, healthy
    /// or not: one that is unhealthy for a moment is still the plugin's controller, and
    /// a claim that skipped its ControllerPublish would be staged unpublished.
    pub(super) fn has_controller(&self, plugin_id: &str) -> bool {
        matches!(
            self.controller_location(plugin_id),
            Location::On(_) | Location::AwaitedOn(_)
        ) || self
            .registry
            .get(PluginKind::Controller, plugin_id)
            .is_some()
    }

    /// ControllerUnpublishVolume of `volume` from `node_id`, a node that is gone (its
    /// claim was lost), by the plugin's controller wherever it runs. A claim names the
    /// node id only when the plugin had a controller (see
    /// [`CsiManager::claim_node_id`]), so no controller now (it ran on the lost node)
    /// is an error: the claim is kept until one runs.
    pub async fn unpublish_from_lost_node(
        &self,
        volume: &Volume,
        node_id: &str,
    ) -> Result<bool, CsiVolumeError> {
        if !self.has_controller(&volume.plugin_id) {
            return Err(CsiVolumeError::NoControllerToUnpublish {
                plugin: volume.plugin_id.clone(),
                volume: volume.id.clone(),
                node_id: node_id.to_string(),
            });
        }
        self.unpublish_at_controller(
            &volume.plugin_id,
            &volume.external_id,
            node_id,
            &volume.secrets,
        )
        .await?;
        Ok(true)
    }

    /// ControllerUnpublishVolume of a volume from `node_id`, by the plugin's controller
    /// wherever it runs.
    pub(super) async fn unpublish_at_controller(
        &self,
        plugin_id: &str,
        external_id: &str,
        node_id: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<(), CsiVolumeError> {
        match self
            .controller(ControllerRequest::Unpublish {
                plugin_id: plugin_id.to_string(),
                external_id: external_id.to_string(),
                node_id: node_id.to_string(),
                secrets: secrets.clone(),
            })
            .await?
        {
            ControllerAnswer::Done => Ok(()),
            other => Err(unexpected("ControllerUnpublishVolume", &other)),
        }
    }

    /// Runs `request` on the controller wherever it is.
    pub(super) async fn controller(
        &self,
        request: ControllerRequest,
    ) -> Result<ControllerAnswer, CsiVolumeError> {
        // A controller on another node that is not healthy now is waited for as long as
        // one here would be (`plugin_wait`).
        let deadline = tokio::time::Instant::now() + self.settings.plugin_wait;
        loop {
            match self.controller_location(request.plugin_id()) {
                Location::Here => return self.serve(request).await,
                Location::On(node) => {
                    let Some(remote) = self.remote.get() else {
                        return self.serve(request).await;
                    };
                    tracing::debug!(%node, action = request.action(), plugin = request.plugin_id(),
                        "sending the controller operation to the node that runs the controller");
                    return remote.call(&node, request).await;
                }
                Location::AwaitedOn(node) if tokio::time::Instant::now() >= deadline => {
                    return Err(CsiVolumeError::Remote {
                        node,
                        message: format!(
                            "{}: the controller of CSI plugin {:?} is not healthy after {:?}",
                            request.action(),
                            request.plugin_id(),
                            self.settings.plugin_wait
                        ),
                    });
                }
                Location::AwaitedOn(_) => tokio::time::sleep(REMOTE_HEALTH_POLL).await,
            }
        }
    }

    /// Serves `request` with this node's controller (never sent on: a request another
    /// node sent here is answered here or refused).
    pub async fn serve(
        &self,
        request: ControllerRequest,
    ) -> Result<ControllerAnswer, CsiVolumeError> {
        Ok(match request {
            ControllerRequest::Create { volume, capacity } => {
                ControllerAnswer::Created(Box::new(self.create_here(volume, capacity).await?))
            }
            ControllerRequest::Delete { volume } => {
                self.delete_here(&volume).await?;
                ControllerAnswer::Done
            }
            ControllerRequest::CreateSnapshot { volume, name } => {
                ControllerAnswer::Snapshot(self.create_snapshot_here(&volume, &name).await?)
            }
            ControllerRequest::DeleteSnapshot {
                plugin_id,
                snapshot_id,
            } => {
                self.delete_snapshot_here(&plugin_id, &snapshot_id).await?;
                ControllerAnswer::Done
            }
            ControllerRequest::ListSnapshots { plugin_id } => {
                ControllerAnswer::Snapshots(self.list_snapshots_here(&plugin_id).await?)
            }
            ControllerRequest::Expand {
                volume,
                required,
                usage,
            } => {
                let (capacity, node_required) = self
                    .controller_expand_here(&volume, required, usage)
                    .await?;
                ControllerAnswer::Expanded {
                    capacity,
                    node_required,
                }
            }
            ControllerRequest::Publish {
                volume,
                usage,
                node_id,
            } => {
                let (_, client, fingerprint) = self
                    .ready(PluginKind::Controller, &volume.plugin_id)
                    .await?;
                if !fingerprint.capabilities.controller_publish {
                    return Ok(ControllerAnswer::Published(None));
                }
                let no_context = HashMap::new();
                let request = NodeVolume {
                    external_id: &volume.external_id,
                    usage,
                    publish_context: &no_context,
                    volume_context: &volume.context,
                    secrets: &volume.secrets,
                };
                ControllerAnswer::Published(Some(
                    client.controller_publish(&request, &node_id).await?,
                ))
            }
            ControllerRequest::Unpublish {
                plugin_id,
                external_id,
                node_id,
                secrets,
            } => {
                let (_, client, fingerprint) =
                    self.ready(PluginKind::Controller, &plugin_id).await?;
                // A controller that does not publish published nothing to undo.
                if fingerprint.capabilities.controller_publish {
                    client
                        .controller_unpublish(&external_id, &node_id, &secrets)
                        .await?;
                }
                ControllerAnswer::Done
            }
        })
    }
}

impl ControllerAnswer {
    fn kind(&self) -> &'static str {
        match self {
            ControllerAnswer::Created(_) => "a created volume",
            ControllerAnswer::Done => "done",
            ControllerAnswer::Snapshot(_) => "a snapshot",
            ControllerAnswer::Snapshots(_) => "a list of snapshots",
            ControllerAnswer::Expanded { .. } => "a new capacity",
            ControllerAnswer::Published(_) => "a publish context",
        }
    }
}

/// An answer of another kind than the request asks for (a node of another berth
/// version). Says only the kind: a volume in the answer carries its secrets.
pub(super) fn unexpected(request: &'static str, answer: &ControllerAnswer) -> CsiVolumeError {
    CsiVolumeError::Remote {
        node: String::new(),
        message: format!("{request} was answered with {}", answer.kind()),
    }
}
