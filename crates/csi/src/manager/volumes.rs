//! The node side of a volume: the intent-recorded stage, publish, unpublish and
//! unstage steps (see the module above for their order), their recovery after a crash,
//! and a forced detach.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::route::{ControllerAnswer, ControllerRequest, unexpected};
use super::topology::{accessible_from, segments};
use super::{CsiManager, CsiVolumeError};
use crate::client::NodeVolume;
use crate::host_mounts::HostMounts;
use crate::layout::{PluginDirs, SharedPath};
use crate::plugin::CsiPlugin;
use crate::registry::PluginRegistration;
use berth_model::csi::{Fingerprint, PluginKind, Usage};
use berth_state::RecordTable;
use berth_state::catalog::{Publication, Volume, VolumeOnNode};

/// One volume's use on this node, persisted.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct VolumeUsage {
    pub(super) plugin_id: String,
    pub(super) external_id: String,
    #[serde(default)]
    pub(super) secrets: HashMap<String, String>,
    /// The node id the controller published to, and the publish context it returned.
    pub(super) controller_published: Option<(String, HashMap<String, String>)>,
    /// How the volume is staged on this node, at its one staging path
    /// (`staging/<volume>`), when it is.
    #[serde(default)]
    pub(super) staged: Option<StagedAs>,
    /// Publications, by usage key.
    pub(super) stages: BTreeMap<String, StageUsage>,
    /// The RPC under way (or cut short by a crash) whose outcome is not recorded yet.
    #[serde(default)]
    pub(super) pending: Option<Intent>,
}

/// An RPC about to be made for a volume on this node, recorded durably before it is
/// made and cleared when its outcome is recorded. Operations on one volume are
/// serialised, so there is at most one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rpc", rename_all = "snake_case")]
pub(super) enum Intent {
    ControllerPublish { node_id: String },
    Stage { staged_as: StagedAs },
    Publish { alloc_id: String, key: String },
    Unpublish { alloc_id: String, key: String },
    Unstage,
    ControllerUnpublish,
}

impl Intent {
    /// What is under way, as `berth volume status` says it.
    pub(super) fn describe(&self) -> String {
        match self {
            Intent::ControllerPublish { node_id } => {
                format!("ControllerPublishVolume to node {node_id:?}")
            }
            Intent::Stage { staged_as } => format!(
                "NodeStageVolume as {}/{}",
                staged_as.attachment_mode, staged_as.access_mode
            ),
            Intent::Publish { alloc_id, key } => {
                format!("NodePublishVolume for alloc {alloc_id} ({key})")
            }
            Intent::Unpublish { alloc_id, key } => {
                format!("NodeUnpublishVolume for alloc {alloc_id} ({key})")
            }
            Intent::Unstage => "NodeUnstageVolume".into(),
            Intent::ControllerUnpublish => "ControllerUnpublishVolume".into(),
        }
    }
}

/// The capability a volume was staged with: every publication shares the stage, so
/// they must agree on it (their readonly flags may differ).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StagedAs {
    attachment_mode: String,
    access_mode: String,
}

impl StagedAs {
    pub(super) fn of(usage: &Usage) -> StagedAs {
        StagedAs {
            attachment_mode: usage.attachment_mode.to_string(),
            access_mode: usage.access_mode.to_string(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StageUsage {
    /// Staged at this usage's own path (`staging/<volume>/<usage>`), as berth did before
    /// it staged once per volume: such a stage is unstaged there.
    #[serde(default)]
    pub(super) staged: bool,
    /// Allocs the volume is published to with this usage.
    pub(super) allocs: BTreeSet<String>,
}

impl VolumeUsage {
    /// Publications from the stage, a publication under way included: the stage is not
    /// idle while its outcome is unknown.
    pub(super) fn publications(&self) -> usize {
        let pending = matches!(self.pending, Some(Intent::Publish { .. }));
        self.stages.values().map(|s| s.allocs.len()).sum::<usize>() + usize::from(pending)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.stages.is_empty()
            && self.staged.is_none()
            && self.controller_published.is_none()
            && self.pending.is_none()
    }
}

/// A step done while mounting, undone if a later one fails.
pub(super) enum Done {
    ControllerPublished,
    Staged,
}

impl CsiManager {
    pub(super) fn usage_record(
        &self,
        volume_id: &str,
    ) -> Result<Option<VolumeUsage>, CsiVolumeError> {
        self.store
            .record(RecordTable::CsiUsage, volume_id)
            .map_err(|source| CsiVolumeError::Usage {
                action: "reading",
                volume: volume_id.to_string(),
                source,
            })
    }

    pub(super) fn save_usage(
        &self,
        volume_id: &str,
        usage: &VolumeUsage,
    ) -> Result<(), CsiVolumeError> {
        let result = if usage.is_empty() {
            self.store.remove_record(RecordTable::CsiUsage, volume_id)
        } else {
            self.store
                .put_record(RecordTable::CsiUsage, volume_id, usage)
        };
        result.map_err(|source| CsiVolumeError::Usage {
            action: "recording",
            volume: volume_id.to_string(),
            source,
        })?;
        if let Some(listener) = self.usage_listener.get() {
            listener(volume_id, (!usage.is_empty()).then(|| view_of(usage)));
        }
        Ok(())
    }

    /// Records, durably, the RPC about to be made for the volume.
    pub(super) fn begin(
        &self,
        volume_id: &str,
        record: &mut VolumeUsage,
        intent: Intent,
    ) -> Result<(), CsiVolumeError> {
        record.pending = Some(intent);
        self.save_usage(volume_id, record)
    }

    /// Resolves an RPC whose outcome was never recorded (the agent died, or the call
    /// failed or timed out after the plugin may have acted): a mount step is undone, a
    /// release step finished, each with the call the CSI spec makes idempotent
    /// (unpublishing or unstaging what is not there is success). Until it is resolved the
    /// volume is treated as possibly published, so its stage is not pulled.
    pub(super) async fn resolve_pending(
        &self,
        client: &dyn CsiPlugin,
        node: &PluginRegistration,
        volume_id: &str,
        record: &mut VolumeUsage,
    ) -> Result<(), CsiVolumeError> {
        let Some(intent) = record.pending.clone() else {
            return Ok(());
        };
        tracing::info!(volume = %volume_id, intent = %intent.describe(),
            "resolving a CSI call whose outcome was not recorded");
        match &intent {
            Intent::Publish { alloc_id, key } | Intent::Unpublish { alloc_id, key } => {
                let target = node.dirs.publish(alloc_id, volume_id, key);
                client
                    .node_unpublish(&record.external_id, &target.plugin)
                    .await?;
                self.unmount_left_target(node, volume_id, &target.host);
                if let Some(stage) = record.stages.get_mut(key) {
                    stage.allocs.remove(alloc_id);
                }
                remove_empty_dirs(&target.host, &node.dirs.host);
            }
            // Nothing is published from a stage whose outcome is unknown: a stage is made
            // only when the volume has none, and a release only when nothing uses it.
            Intent::Stage { .. } | Intent::Unstage => {
                let staging = node.dirs.staging_volume(volume_id);
                client
                    .node_unstage(&record.external_id, &staging.plugin)
                    .await?;
                record.staged = None;
                remove_empty_dirs(&staging.host, &node.dirs.host);
            }
            // The publish context went with the crash, and a mount asks for it again.
            Intent::ControllerPublish { node_id } => {
                if record.staged.is_none() && record.stages.is_empty() {
                    self.unpublish_at_controller(
                        &record.plugin_id,
                        &record.external_id,
                        node_id,
                        &record.secrets,
                    )
                    .await?;
                }
            }
            Intent::ControllerUnpublish => {
                if let Some((node_id, _)) = record.controller_published.clone() {
                    self.unpublish_at_controller(
                        &record.plugin_id,
                        &record.external_id,
                        &node_id,
                        &record.secrets,
                    )
                    .await?;
                }
                record.controller_published = None;
            }
        }
        record.pending = None;
        self.save_usage(volume_id, record)
    }

    /// Finishes undoing what could not be undone while the plugin was away (it died
    /// mid-operation, say): stages no alloc uses any more are unstaged, and a volume with
    /// no stage left is controller-unpublished. Runs whenever a node plugin turns
    /// healthy; the persisted usage says what is left.
    pub(super) async fn reconcile(self: Arc<Self>, plugin: PluginRegistration) {
        let volume_ids: Vec<String> =
            match self.store.records::<VolumeUsage>(RecordTable::CsiUsage, "") {
                Ok((records, _)) => records
                    .into_iter()
                    .filter(|(_, usage)| usage.plugin_id == plugin.id)
                    .map(|(id, _)| id)
                    .collect(),
                Err(error) => {
                    tracing::error!(%error, "reading CSI volume usage");
                    return;
                }
            };
        let client = self.client(&plugin);
        for volume_id in volume_ids {
            let lock = self.volume_lock(&volume_id);
            let _serialised = lock.lock().await;
            let Ok(Some(mut record)) = self.usage_record(&volume_id) else {
                continue;
            };
            if let Err(error) = self
                .resolve_pending(&*client, &plugin, &volume_id, &mut record)
                .await
            {
                tracing::warn!(volume = %volume_id, %error,
                    "could not resolve an interrupted CSI call yet");
                continue;
            }
            let idle: Vec<String> = record
                .stages
                .iter()
                .filter(|(_, stage)| stage.allocs.is_empty())
                .map(|(key, _)| key.clone())
                .collect();
            for key in idle {
                if let Err(error) = self
                    .unstage_legacy(&*client, &plugin, &volume_id, &key, &mut record)
                    .await
                {
                    tracing::warn!(volume = %volume_id, %error,
                        "could not unstage an unused volume yet");
                }
            }
            if record.publications() == 0 && record.staged.is_some() {
                match self
                    .unstage(&*client, &plugin, &volume_id, &mut record)
                    .await
                {
                    Ok(()) => tracing::info!(volume = %volume_id,
                        "unstaged a volume that no alloc uses any more"),
                    Err(error) => tracing::warn!(volume = %volume_id, %error,
                        "could not unstage an unused volume yet"),
                }
            }
            if record.stages.is_empty()
                && record.staged.is_none()
                && let Err(error) = self.controller_unpublish(&volume_id, &mut record).await
            {
                tracing::warn!(volume = %volume_id, %error,
                        "could not controller-unpublish an unused volume yet");
            }
            if let Err(error) = self.save_usage(&volume_id, &record) {
                tracing::error!(volume = %volume_id, %error);
            }
        }
    }

    /// Stages (once per volume) and publishes `volume` for `alloc_id`; returns the host
    /// path to bind into the alloc's tasks. On failure, what this call did is undone.
    pub async fn mount_volume(
        &self,
        alloc_id: &str,
        volume: &Volume,
        usage: Usage,
    ) -> Result<PathBuf, CsiVolumeError> {
        let lock = self.volume_lock(&volume.id);
        let _serialised = lock.lock().await;
        let (node, client, fingerprint) = self.ready(PluginKind::Node, &volume.plugin_id).await?;
        if !accessible_from(&volume.accessible_topology, &fingerprint.topology) {
            return Err(CsiVolumeError::NotAccessible {
                volume: volume.id.clone(),
                plugin: volume.plugin_id.clone(),
                accessible: volume
                    .accessible_topology
                    .iter()
                    .map(segments)
                    .collect::<Vec<_>>()
                    .join(" or "),
                node: segments(&fingerprint.topology),
            });
        }
        let mut record = self
            .usage_record(&volume.id)?
            .unwrap_or_else(|| VolumeUsage {
                plugin_id: volume.plugin_id.clone(),
                external_id: volume.external_id.clone(),
                secrets: volume.secrets.clone(),
                ..VolumeUsage::default()
            });
        self.resolve_pending(&*client, &node, &volume.id, &mut record)
            .await?;
        let mut done = Vec::new();
        let result = self
            .mount_steps(
                alloc_id,
                volume,
                usage,
                &node,
                &*client,
                &fingerprint,
                &mut record,
                &mut done,
            )
            .await;
        match result {
            Ok(path) => Ok(path),
            Err(error) => {
                // A call that failed may still have acted (a deadline passed after the
                // plugin mounted, say): undone first, so the stage is not pulled from under
                // a publication. If the plugin is gone, the intent stays for the reconcile.
                // A plain refusal did nothing, so there is nothing to undo, unless it left
                // a mount at its path: a plugin that bound, then failed to remount, and
                // kept the bind (real ones do), is undone as an unknown outcome.
                if matches!(&error, CsiVolumeError::Rpc(e) if !e.outcome_unknown())
                    && !left_a_mount(
                        self.mounts.as_ref(),
                        &node,
                        &volume.id,
                        record.pending.as_ref(),
                    )
                {
                    record.pending = None;
                } else if let Err(undo_error) = self
                    .resolve_pending(&*client, &node, &volume.id, &mut record)
                    .await
                {
                    tracing::error!(volume = %volume.id, %undo_error, "undoing a failed mount");
                }
                for step in done.into_iter().rev() {
                    let undone = match step {
                        // Only when no other alloc is published from the stage.
                        Done::Staged if record.publications() == 0 => {
                            self.unstage(&*client, &node, volume.id.as_str(), &mut record)
                                .await
                        }
                        Done::Staged => Ok(()),
                        Done::ControllerPublished => {
                            self.controller_unpublish(&volume.id, &mut record).await
                        }
                    };
                    if let Err(undo_error) = undone {
                        tracing::error!(volume = %volume.id, %undo_error, "undoing a failed mount");
                    }
                }
                let _ = self.save_usage(&volume.id, &record);
                Err(error)
            }
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one step list, split out for its undo"
    )]
    pub(super) async fn mount_steps(
        &self,
        alloc_id: &str,
        volume: &Volume,
        usage: Usage,
        node: &PluginRegistration,
        client: &dyn CsiPlugin,
        fingerprint: &Fingerprint,
        record: &mut VolumeUsage,
        done: &mut Vec<Done>,
    ) -> Result<PathBuf, CsiVolumeError> {
        let key = usage.key();
        let no_context = HashMap::new();
        if record.controller_published.is_none()
            && let Some(context) = self
                .controller_publish(volume, usage, fingerprint, record)
                .await?
        {
            record.controller_published = Some(context);
            record.pending = None;
            self.save_usage(&volume.id, record)?;
            done.push(Done::ControllerPublished);
        }
        let publish_context = record
            .controller_published
            .as_ref()
            .map(|(_, c)| c.clone())
            .unwrap_or(no_context);
        let request = NodeVolume {
            external_id: &volume.external_id,
            usage,
            publish_context: &publish_context,
            volume_context: &volume.context,
            secrets: &volume.secrets,
        };
        // One staging path per volume per node (the CSI spec): every usage publishes
        // from the same stage, each with its own readonly flag and target.
        let staging = node.dirs.staging_volume(&volume.id);
        let stages = fingerprint.capabilities.stage_unstage;
        let wanted = StagedAs::of(&usage);
        if let Some(staged) = record.staged.clone()
            && staged != wanted
        {
            if record.publications() > 0 {
                return Err(CsiVolumeError::StagedOtherwise {
                    volume: volume.id.clone(),
                    staged: format!("{}/{}", staged.attachment_mode, staged.access_mode),
                    wanted: format!("{}/{}", wanted.attachment_mode, wanted.access_mode),
                });
            }
            // Nobody is published from it: a stage left by a crash, undone first.
            self.unstage(client, node, &volume.id, record).await?;
        }
        // Recorded as staged but not mounted (the host rebooted, say): staging again is
        // safe, NodeStageVolume is idempotent.
        if record.staged.is_some() && !self.mounts.is_mount_point(&staging.host) {
            record.staged = None;
        }
        if stages && record.staged.is_none() {
            create_dir(&node.dirs.host, &staging.host)?;
            self.begin(
                &volume.id,
                record,
                Intent::Stage {
                    staged_as: wanted.clone(),
                },
            )?;
            client.node_stage(&request, &staging.plugin).await?;
            record.staged = Some(wanted);
            record.pending = None;
            self.save_usage(&volume.id, record)?;
            done.push(Done::Staged);
        }
        let target = node.dirs.publish(alloc_id, &volume.id, &key);
        if let Some(parent) = target.host.parent() {
            create_dir(&node.dirs.host, parent)?;
        }
        self.begin(
            &volume.id,
            record,
            Intent::Publish {
                alloc_id: alloc_id.to_string(),
                key: key.clone(),
            },
        )?;
        client
            .node_publish(
                &request,
                stages.then_some(staging.plugin.as_path()),
                &target.plugin,
            )
            .await?;
        if !self.mounts.is_mount_point(&target.host) {
            // The pending publication is undone by the caller.
            return Err(CsiVolumeError::NotPropagated {
                plugin: volume.plugin_id.clone(),
                volume: volume.id.clone(),
                plugin_path: target.plugin.clone(),
                host_path: target.host.clone(),
            });
        }
        record
            .stages
            .entry(key)
            .or_insert(StageUsage {
                staged: false,
                allocs: BTreeSet::new(),
            })
            .allocs
            .insert(alloc_id.to_string());
        record.pending = None;
        self.save_usage(&volume.id, record)?;
        Ok(target.host)
    }

    /// Unmounts a publish target the plugin said it unpublished but left mounted on the
    /// host. A plugin that unpublishes only what it recorded (a publish that failed after
    /// its bind is not) answers success and leaves the bind; the target is the agent's,
    /// and an unstage under it would pull the volume from under the bind.
    fn unmount_left_target(&self, node: &PluginRegistration, volume_id: &str, target: &Path) {
        if self.mounts.is_mount_point(target) {
            let unmounted = self.mounts.unmount_all_below(&node.dirs.host, target);
            tracing::warn!(volume = %volume_id, path = %target.display(), ?unmounted,
                "the plugin unpublished but left the target mounted; unmounted by the agent");
        }
    }

    /// Unstages the volume from its one staging path; the caller has checked that no
    /// publication is left.
    pub(super) async fn unstage(
        &self,
        client: &dyn CsiPlugin,
        node: &PluginRegistration,
        volume_id: &str,
        record: &mut VolumeUsage,
    ) -> Result<(), CsiVolumeError> {
        let staging = node.dirs.staging_volume(volume_id);
        if record.staged.is_some() {
            self.begin(volume_id, record, Intent::Unstage)?;
            client
                .node_unstage(&record.external_id, &staging.plugin)
                .await?;
        }
        record.staged = None;
        record.pending = None;
        self.save_usage(volume_id, record)?;
        remove_empty_dirs(&staging.host, &node.dirs.host);
        Ok(())
    }

    /// Forgets usage `key`, which no alloc is published with any more; a stage at its
    /// own path (recorded by an older berth) is unstaged there.
    pub(super) async fn unstage_legacy(
        &self,
        client: &dyn CsiPlugin,
        node: &PluginRegistration,
        volume_id: &str,
        key: &str,
        record: &mut VolumeUsage,
    ) -> Result<(), CsiVolumeError> {
        let staging = node.dirs.staging(volume_id, key);
        if record.stages.get(key).is_some_and(|s| s.staged) {
            client
                .node_unstage(&record.external_id, &staging.plugin)
                .await?;
        }
        record.stages.remove(key);
        self.save_usage(volume_id, record)?;
        remove_empty_dirs(&staging.host, &node.dirs.host);
        Ok(())
    }

    /// Unpublishes `volume_id` from `alloc_id`; unstages when no other alloc uses the
    /// stage; controller-unpublishes when no stage is left. A volume this node does not
    /// record as published to the alloc is already done.
    pub async fn unmount_volume(
        &self,
        alloc_id: &str,
        volume_id: &str,
        usage: Usage,
    ) -> Result<(), CsiVolumeError> {
        let lock = self.volume_lock(volume_id);
        let _serialised = lock.lock().await;
        let Some(mut record) = self.usage_record(volume_id)? else {
            return Ok(());
        };
        let key = usage.key();
        let pending_here = matches!(&record.pending,
            Some(Intent::Publish { alloc_id: a, key: k } | Intent::Unpublish { alloc_id: a, key: k })
                if a == alloc_id && *k == key);
        if !record.stages.contains_key(&key) && !pending_here {
            return Ok(());
        }
        let (node, client, _) = self
            .ready(PluginKind::Node, &record.plugin_id)
            .await
            .map_err(|e| CsiVolumeError::StaysMounted {
                volume: volume_id.to_string(),
                alloc: alloc_id.to_string(),
                source: Box::new(e),
            })?;
        self.resolve_pending(&*client, &node, volume_id, &mut record)
            .await?;
        let publishes = record
            .stages
            .get(&key)
            .is_some_and(|stage| stage.allocs.contains(alloc_id));
        if publishes {
            let target: SharedPath = node.dirs.publish(alloc_id, volume_id, &key);
            self.begin(
                volume_id,
                &mut record,
                Intent::Unpublish {
                    alloc_id: alloc_id.to_string(),
                    key: key.clone(),
                },
            )?;
            client
                .node_unpublish(&record.external_id, &target.plugin)
                .await?;
            self.unmount_left_target(&node, volume_id, &target.host);
            if let Some(stage) = record.stages.get_mut(&key) {
                stage.allocs.remove(alloc_id);
            }
            record.pending = None;
            self.save_usage(volume_id, &record)?;
            remove_empty_dirs(&target.host, &node.dirs.host);
        }
        if record.stages.get(&key).is_some_and(|s| s.allocs.is_empty()) {
            self.unstage_legacy(&*client, &node, volume_id, &key, &mut record)
                .await?;
        }
        if record.publications() == 0 && record.staged.is_some() {
            self.unstage(&*client, &node, volume_id, &mut record)
                .await?;
        }
        if record.stages.is_empty() && record.staged.is_none() {
            self.controller_unpublish(volume_id, &mut record).await?;
        }
        self.save_usage(volume_id, &record)
    }

    /// How this node stages and publishes the volume, from its usage record; `None` when
    /// it does not use it.
    pub fn on_node(&self, volume_id: &str) -> Option<VolumeOnNode> {
        let record = self.usage_record(volume_id).ok().flatten()?;
        Some(view_of(&record))
    }

    /// Every volume this node stages or publishes, as [`CsiManager::on_node`] shows it.
    pub fn used_here(&self) -> Vec<(String, VolumeOnNode)> {
        self.store
            .records::<VolumeUsage>(RecordTable::CsiUsage, "")
            .map(|(records, _)| {
                records
                    .into_iter()
                    .map(|(id, record)| (id, view_of(&record)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Tells `listener` of every change of a volume's use on this node (`None`: no longer
    /// used here), once the change is recorded. Set once (a cluster member publishes
    /// them for the other nodes' `volume status`).
    pub fn on_usage_change(&self, listener: UsageListener) {
        let _ = self.usage_listener.set(listener);
    }

    /// Gives up on the plugin for `volume_id` on this node, as an operator forcing a
    /// detach asks: unmounts its publications of `allocs` (finished allocs; the caller
    /// checked) and, once none is left, its stage, on the host, and forgets them; the
    /// plugin is not called and is not told. `csi_root` is `<data_dir>/csi`. What was
    /// unmounted, host paths.
    pub async fn force_detach(
        &self,
        volume_id: &str,
        allocs: &[String],
        csi_root: &Path,
    ) -> Result<Vec<PathBuf>, CsiVolumeError> {
        let lock = self.volume_lock(volume_id);
        let _serialised = lock.lock().await;
        let Some(mut record) = self.usage_record(volume_id)? else {
            return Ok(Vec::new());
        };
        let dirs = PluginDirs::new(csi_root, &record.plugin_id, "/");
        let mut unmounted = Vec::new();
        let mut unmount = |path: PathBuf| -> Result<(), CsiVolumeError> {
            // Below the plugin's dir, through no link: the plugin writes in that dir, and
            // a link it planted there must not steer the agent's unmount elsewhere.
            match self.mounts.unmount_all_below(&dirs.host, &path) {
                Ok(0) => {}
                Ok(_) => unmounted.push(path.clone()),
                Err(source) => {
                    return Err(CsiVolumeError::Unmount {
                        volume: volume_id.to_string(),
                        path,
                        source,
                    });
                }
            }
            remove_empty_dirs(&path, &dirs.host);
            Ok(())
        };
        if let Some(Intent::Publish { alloc_id, key } | Intent::Unpublish { alloc_id, key }) =
            &record.pending
            && allocs.contains(alloc_id)
        {
            unmount(dirs.publish(alloc_id, volume_id, key).host)?;
            record.pending = None;
        }
        for (key, stage) in record.stages.iter_mut() {
            for alloc in allocs {
                if stage.allocs.remove(alloc) {
                    unmount(dirs.publish(alloc, volume_id, key).host)?;
                }
            }
        }
        let idle: Vec<String> = record
            .stages
            .iter()
            .filter(|(_, stage)| stage.allocs.is_empty())
            .map(|(key, _)| key.clone())
            .collect();
        for key in idle {
            unmount(dirs.staging(volume_id, &key).host)?;
            record.stages.remove(&key);
        }
        if record.publications() == 0 {
            unmount(dirs.staging_volume(volume_id).host)?;
            record.staged = None;
            record.pending = None;
            // Left attached in the plugin's controller, which is not there to ask.
            record.controller_published = None;
        }
        self.save_usage(volume_id, &record)?;
        tracing::warn!(volume = %volume_id, unmounted = unmounted.len(),
            "forced a detach without the plugin");
        Ok(unmounted)
    }
}

/// Makes `path`, below the plugin's tree `base`, through no link: the plugin writes in
/// its tree and could otherwise make the agent create directories anywhere.
pub(super) fn create_dir(base: &Path, path: &Path) -> Result<(), CsiVolumeError> {
    let error = |source| CsiVolumeError::Dir {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(base).map_err(error)?;
    let relative = path.strip_prefix(base).map_err(|_| {
        error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not below {}", base.display()),
        ))
    })?;
    berth_sys::mount::beneath::create(base, relative, false, 0o755).map_err(error)
}

/// Whether the mount step `pending` names left a mount at its path on the host.
fn left_a_mount(
    mounts: &dyn HostMounts,
    node: &PluginRegistration,
    volume_id: &str,
    pending: Option<&Intent>,
) -> bool {
    let path = match pending {
        Some(Intent::Publish { alloc_id, key }) => node.dirs.publish(alloc_id, volume_id, key).host,
        Some(Intent::Stage { .. }) => node.dirs.staging_volume(volume_id).host,
        _ => return false,
    };
    mounts.is_mount_point(&path)
}

/// `path` and the parents it leaves empty, below the plugin's tree `stop`: through no
/// link the plugin may have planted there.
pub(super) fn remove_empty_dirs(path: &Path, stop: &Path) {
    berth_sys::mount::beneath::remove_empty_dirs(stop, path);
}

/// What `berth volume status` shows of a volume's use on one node.
fn view_of(record: &VolumeUsage) -> VolumeOnNode {
    let publications = record
        .stages
        .iter()
        .flat_map(|(key, stage)| {
            stage.allocs.iter().map(|alloc| Publication {
                alloc_id: alloc.clone(),
                usage: key.clone(),
            })
        })
        .collect();
    VolumeOnNode {
        staged: record
            .staged
            .as_ref()
            .map(|s| format!("{}/{}", s.attachment_mode, s.access_mode)),
        controller_published: record.controller_published.is_some(),
        publications,
        pending: record.pending.as_ref().map(Intent::describe),
    }
}

/// Hears of each change of a volume's use on this node.
pub type UsageListener = Arc<dyn Fn(&str, Option<VolumeOnNode>) + Send + Sync>;

impl CsiManager {
    /// ControllerPublishVolume to this node when the plugin has a controller (here or on
    /// another node) that publishes; the node id and publish context, or `None` when
    /// there is nothing to do.
    pub(super) async fn controller_publish(
        &self,
        volume: &Volume,
        usage: Usage,
        node: &Fingerprint,
        record: &mut VolumeUsage,
    ) -> Result<Option<(String, HashMap<String, String>)>, CsiVolumeError> {
        if !self.has_controller(&volume.plugin_id) {
            return Ok(None);
        }
        let node_id = node.node_id.clone().unwrap_or_default();
        // The intent comes first: should the controller publish and the answer be lost,
        // the next look at the volume unpublishes it.
        self.begin(
            &volume.id,
            record,
            Intent::ControllerPublish {
                node_id: node_id.clone(),
            },
        )?;
        let answer = self
            .controller(ControllerRequest::Publish {
                volume: volume.clone(),
                usage,
                node_id: node_id.clone(),
            })
            .await;
        match answer {
            Ok(ControllerAnswer::Published(Some(context))) => Ok(Some((node_id, context))),
            Ok(ControllerAnswer::Published(None)) => {
                // The controller does not publish: nothing was done, nothing to undo.
                record.pending = None;
                self.save_usage(&volume.id, record)?;
                Ok(None)
            }
            Ok(other) => Err(unexpected("ControllerPublishVolume", &other)),
            Err(error) => Err(error),
        }
    }

    pub(super) async fn controller_unpublish(
        &self,
        volume_id: &str,
        record: &mut VolumeUsage,
    ) -> Result<(), CsiVolumeError> {
        let Some((node_id, _)) = record.controller_published.clone() else {
            return Ok(());
        };
        // Only once nothing is staged or published on this node (the spec's order); what
        // is left is unpublished when the last stage goes.
        if record.staged.is_some() || !record.stages.is_empty() || record.pending.is_some() {
            return Ok(());
        }
        self.begin(volume_id, record, Intent::ControllerUnpublish)?;
        self.unpublish_at_controller(
            &record.plugin_id,
            &record.external_id,
            &node_id,
            &record.secrets,
        )
        .await?;
        record.controller_published = None;
        record.pending = None;
        self.save_usage(volume_id, record)
    }
}
