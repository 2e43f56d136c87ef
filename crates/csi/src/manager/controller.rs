//! The controller side: creating, deleting, snapshotting and expanding volumes through
//! the plugin that controls them, wherever its controller runs ([`super::route`]). Each
//! public operation sends a request to the controller; the `_here` functions are what a
//! controller on this node does with it.

use std::collections::HashMap;

use super::route::{ControllerAnswer, ControllerRequest, unexpected};
use super::{CsiManager, CsiVolumeError};
use crate::plugin::CsiPlugin;
use berth_model::csi::{Capabilities, PluginKind, SnapshotInfo, Usage};
use berth_state::catalog::Volume;
use std::sync::Arc;

impl CsiManager {
    /// CreateVolume through the plugin's controller; the volume as the catalog keeps it.
    pub async fn create_volume(
        &self,
        volume: Volume,
        capacity: (i64, i64),
    ) -> Result<Volume, CsiVolumeError> {
        match self
            .controller(ControllerRequest::Create { volume, capacity })
            .await?
        {
            ControllerAnswer::Created(volume) => Ok(*volume),
            other => Err(unexpected("CreateVolume", &other)),
        }
    }

    pub(super) async fn create_here(
        &self,
        mut volume: Volume,
        capacity: (i64, i64),
    ) -> Result<Volume, CsiVolumeError> {
        let (_, client, fingerprint) = self
            .ready(PluginKind::Controller, &volume.plugin_id)
            .await
            .map_err(|e| CsiVolumeError::NeedsController(Box::new(e)))?;
        if !fingerprint.capabilities.create_delete {
            return Err(CsiVolumeError::CannotCreate {
                plugin: volume.plugin_id.clone(),
            });
        }
        let usages: Vec<Usage> = volume
            .capabilities
            .iter()
            .map(|c| Usage {
                access_mode: c.access_mode,
                attachment_mode: c.attachment_mode,
                read_only: c.access_mode.read_only(),
            })
            .collect();
        let created = client
            .create_volume(
                &volume.name,
                capacity,
                &usages,
                &volume.parameters,
                &volume.secrets,
            )
            .await?;
        volume.external_id = created.external_id;
        volume.capacity_bytes = created.capacity_bytes;
        volume.context = created.context;
        volume.accessible_topology = created.accessible_topology;
        Ok(volume)
    }

    /// DeleteVolume through the plugin's controller. The caller has checked that
    /// nothing claims the volume; a volume this node still stages or publishes (its
    /// usage record says so) is refused here too.
    pub async fn delete_volume(&self, volume: &Volume) -> Result<(), CsiVolumeError> {
        let lock = self.volume_lock(&volume.id);
        let _serialised = lock.lock().await;
        if self.usage_record(&volume.id)?.is_some() {
            return Err(CsiVolumeError::StillInUse {
                volume: volume.id.clone(),
            });
        }
        match self
            .controller(ControllerRequest::Delete {
                volume: volume.clone(),
            })
            .await?
        {
            ControllerAnswer::Done => Ok(()),
            other => Err(unexpected("DeleteVolume", &other)),
        }
    }

    pub(super) async fn delete_here(&self, volume: &Volume) -> Result<(), CsiVolumeError> {
        let (_, client, fingerprint) = self
            .ready(PluginKind::Controller, &volume.plugin_id)
            .await
            .map_err(|e| CsiVolumeError::NeedsController(Box::new(e)))?;
        if !fingerprint.capabilities.create_delete {
            return Err(CsiVolumeError::CannotDelete {
                plugin: volume.plugin_id.clone(),
            });
        }
        client
            .delete_volume(&volume.external_id, &volume.secrets)
            .await?;
        Ok(())
    }

    /// The plugin's controller, which must have `capability` (`has`) to `what`.
    pub(super) async fn controller_for(
        &self,
        plugin_id: &str,
        volume: &str,
        what: &'static str,
        capability: &'static str,
        has: fn(&Capabilities) -> bool,
    ) -> Result<Arc<dyn CsiPlugin>, CsiVolumeError> {
        let (_, client, fingerprint) = self
            .ready(PluginKind::Controller, plugin_id)
            .await
            .map_err(|e| CsiVolumeError::NeedsController(Box::new(e)))?;
        if !has(&fingerprint.capabilities) {
            return Err(CsiVolumeError::Lacks {
                plugin: plugin_id.to_string(),
                volume: volume.to_string(),
                what,
                capability,
            });
        }
        Ok(client)
    }

    /// CreateSnapshot of `volume`, named `name` (the spec's idempotency key: the same
    /// name again is the same snapshot).
    pub async fn create_snapshot(
        &self,
        volume: &Volume,
        name: &str,
    ) -> Result<SnapshotInfo, CsiVolumeError> {
        match self
            .controller(ControllerRequest::CreateSnapshot {
                volume: volume.clone(),
                name: name.to_string(),
            })
            .await?
        {
            ControllerAnswer::Snapshot(snapshot) => Ok(snapshot),
            other => Err(unexpected("CreateSnapshot", &other)),
        }
    }

    pub(super) async fn create_snapshot_here(
        &self,
        volume: &Volume,
        name: &str,
    ) -> Result<SnapshotInfo, CsiVolumeError> {
        let client = self
            .controller_for(
                &volume.plugin_id,
                &volume.id,
                "take snapshots",
                "CREATE_DELETE_SNAPSHOT",
                |c| c.snapshots,
            )
            .await?;
        Ok(client
            .create_snapshot(&volume.external_id, name, &volume.secrets)
            .await?)
    }

    /// DeleteSnapshot through `plugin_id`'s controller.
    pub async fn delete_snapshot(
        &self,
        plugin_id: &str,
        snapshot_id: &str,
    ) -> Result<(), CsiVolumeError> {
        match self
            .controller(ControllerRequest::DeleteSnapshot {
                plugin_id: plugin_id.to_string(),
                snapshot_id: snapshot_id.to_string(),
            })
            .await?
        {
            ControllerAnswer::Done => Ok(()),
            other => Err(unexpected("DeleteSnapshot", &other)),
        }
    }

    pub(super) async fn delete_snapshot_here(
        &self,
        plugin_id: &str,
        snapshot_id: &str,
    ) -> Result<(), CsiVolumeError> {
        let client = self
            .controller_for(
                plugin_id,
                snapshot_id,
                "delete snapshots",
                "CREATE_DELETE_SNAPSHOT",
                |c| c.snapshots,
            )
            .await?;
        Ok(client.delete_snapshot(snapshot_id, &HashMap::new()).await?)
    }

    /// ListSnapshots of `plugin_id`'s controller.
    pub async fn list_snapshots(
        &self,
        plugin_id: &str,
    ) -> Result<Vec<SnapshotInfo>, CsiVolumeError> {
        match self
            .controller(ControllerRequest::ListSnapshots {
                plugin_id: plugin_id.to_string(),
            })
            .await?
        {
            ControllerAnswer::Snapshots(snapshots) => Ok(snapshots),
            other => Err(unexpected("ListSnapshots", &other)),
        }
    }

    pub(super) async fn list_snapshots_here(
        &self,
        plugin_id: &str,
    ) -> Result<Vec<SnapshotInfo>, CsiVolumeError> {
        let client = self
            .controller_for(plugin_id, "", "list snapshots", "LIST_SNAPSHOTS", |c| {
                c.list_snapshots
            })
            .await?;
        Ok(client.list_snapshots().await?)
    }

    /// Expands `volume` to at least `required` bytes: ControllerExpandVolume, then, when
    /// the plugin says the nodes must follow and this node publishes it,
    /// NodeExpandVolume at each publication. The new capacity.
    pub async fn expand_volume(
        &self,
        volume: &Volume,
        required: i64,
    ) -> Result<i64, CsiVolumeError> {
        if required < volume.capacity_bytes {
            return Err(CsiVolumeError::Shrink {
                volume: volume.id.clone(),
                current: volume.capacity_bytes,
                wanted: required,
            });
        }
        let lock = self.volume_lock(&volume.id);
        let _serialised = lock.lock().await;
        let usage = volume
            .capabilities
            .first()
            .map(|c| Usage {
                access_mode: c.access_mode,
                attachment_mode: c.attachment_mode,
                read_only: false,
            })
            .unwrap_or(Usage {
                access_mode: berth_model::csi::AccessMode::SingleNodeWriter,
                attachment_mode: berth_model::csi::AttachmentMode::FileSystem,
                read_only: false,
            });
        let (capacity, node_required) = match self
            .controller(ControllerRequest::Expand {
                volume: volume.clone(),
                required,
                usage,
            })
            .await?
        {
            ControllerAnswer::Expanded {
                capacity,
                node_required,
            } => (capacity, node_required),
            other => return Err(unexpected("ControllerExpandVolume", &other)),
        };
        let record = self.usage_record(&volume.id)?;
        if let Some(record) = record.filter(|_| node_required) {
            let (node, node_client, fingerprint) =
                self.ready(PluginKind::Node, &volume.plugin_id).await?;
            if fingerprint.capabilities.node_expand {
                let staging = node.dirs.staging_volume(&volume.id);
                let staged = record.staged.is_some().then_some(staging.plugin.as_path());
                for (key, stage) in &record.stages {
                    for alloc in &stage.allocs {
                        let target = node.dirs.publish(alloc, &volume.id, key);
                        node_client
                            .node_expand(
                                &volume.external_id,
                                &target.plugin,
                                staged,
                                required,
                                usage,
                            )
                            .await?;
                    }
                }
            }
        }
        Ok(if capacity > 0 { capacity } else { required })
    }

    /// ControllerExpandVolume with this node's controller: the capacity, and whether the
    /// nodes must follow (NodeExpandVolume).
    pub(super) async fn controller_expand_here(
        &self,
        volume: &Volume,
        required: i64,
        usage: Usage,
    ) -> Result<(i64, bool), CsiVolumeError> {
        let client = self
            .controller_for(
                &volume.plugin_id,
                &volume.id,
                "expand volumes",
                "EXPAND_VOLUME",
                |c| c.controller_expand,
            )
            .await?;
        Ok(client
            .controller_expand(&volume.external_id, required, usage, &volume.secrets)
            .await?)
    }
}
