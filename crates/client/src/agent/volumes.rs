//! The agent's CSI volume and plugin operations, as the API and CLI use them:
//! register, create, delete, deregister, status.

use berth_jobspec::JobspecError;
use berth_model::csi::{PluginKind, SnapshotInfo};
use berth_state::catalog::volume_spec::{self, SpecPurpose};
use berth_state::catalog::{CatalogError, PluginStatus, VolumeStatus};

use super::Agent;

/// What a forced detach did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Detached {
    pub volume: String,
    /// Allocs whose claims were released.
    pub released: Vec<String>,
    /// Host paths unmounted.
    pub unmounted: Vec<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The spec file does not parse.
    #[error("{0}")]
    Invalid(JobspecError),
    /// Understood, but not possible now (unknown plugin, claimed volume, plugin error).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Store(String),
}

impl From<CatalogError> for VolumeError {
    fn from(error: CatalogError) -> Self {
        match error {
            CatalogError::NoSuchVolume(_) => VolumeError::NotFound(error.to_string()),
            CatalogError::Refused(why) => VolumeError::Refused(why),
            CatalogError::Store(_) => VolumeError::Store(error.to_string()),
        }
    }
}

fn shown(mut status: VolumeStatus) -> VolumeStatus {
    status.volume.secrets.clear();
    status
}

impl Agent {
    /// Registers an existing volume of a plugin this node runs.
    pub fn register_volume(
        &self,
        source_name: &str,
        source: &str,
    ) -> Result<VolumeStatus, VolumeError> {
        let spec = volume_spec::parse(source_name, source, SpecPurpose::Register)
            .map_err(VolumeError::Invalid)?;
        self.check_plugin_known(&spec.volume.plugin_id)?;
        let id = spec.volume.id.clone();
        self.node.csi.catalog.register_volume(spec.volume)?;
        Ok(shown(self.node.csi.catalog.volume(&id)?))
    }

    /// Creates a volume through the plugin's controller (CreateVolume), then registers it.
    pub async fn create_volume(
        &self,
        source_name: &str,
        source: &str,
    ) -> Result<VolumeStatus, VolumeError> {
        let spec = volume_spec::parse(source_name, source, SpecPurpose::Create)
            .map_err(VolumeError::Invalid)?;
        self.check_plugin_known(&spec.volume.plugin_id)?;
        if let Ok(existing) = self.node.csi.catalog.volume(&spec.volume.id) {
            let wanted = spec.capacity.0;
            if wanted > 0 && wanted != existing.volume.capacity_bytes {
                // As `nomad volume create` does: a different capacity_min on an existing
                // volume is a request to expand it (and refused if it would shrink it).
                return self.expand_volume(&existing.volume, wanted).await;
            }
            return Err(VolumeError::Refused(format!(
                "volume {:?} already exists (plugin {:?}, external id {:?}); raise its \
                 capacity_min to expand it",
                existing.volume.id, existing.volume.plugin_id, existing.volume.external_id
            )));
        }
        let id = spec.volume.id.clone();
        let volume = self
            .node
            .csi
            .manager
            .create_volume(spec.volume, spec.capacity)
            .await
            .map_err(|e| VolumeError::Refused(e.to_string()))?;
        self.node.csi.catalog.register_volume(volume)?;
        Ok(shown(self.node.csi.catalog.volume(&id)?))
    }

    /// Expands a volume through its plugin (ControllerExpandVolume, and NodeExpandVolume
    /// where this node publishes it), then records its new capacity.
    async fn expand_volume(
        &self,
        volume: &berth_state::catalog::Volume,
        required: i64,
    ) -> Result<VolumeStatus, VolumeError> {
        let capacity = self
            .node
            .csi
            .manager
            .expand_volume(volume, required)
            .await
            .map_err(|e| VolumeError::Refused(e.to_string()))?;
        self.node.csi.catalog.set_capacity(&volume.id, capacity)?;
        let mut status = self.volume(&volume.id)?;
        status.expanded_from = Some(volume.capacity_bytes);
        Ok(status)
    }

    /// Detaches a volume from the finished allocs still giving it back. Without `force`
    /// that is what the give-back retries do, so it only says why it waits; with `force`
    /// the operator gives up on the plugin: the volume is unmounted here and the claims
    /// released without it. A volume a running alloc uses is never detached.
    pub async fn detach_volume(&self, id: &str, force: bool) -> Result<Detached, VolumeError> {
        let status = self.volume(id)?;
        let running: Vec<String> = status
            .claims
            .iter()
            .filter(|c| !status.releasing.contains_key(&c.alloc_id))
            .map(|c| {
                let elsewhere = if c.node == self.node.csi.node_name {
                    String::new()
                } else {
                    format!(" on node {:?}", c.node)
                };
                format!(
                    "{} ({}){elsewhere}",
                    berth_state::catalog::short_id(&c.alloc_id),
                    c.alloc_name
                )
            })
            .collect();
        if !running.is_empty() {
            return Err(VolumeError::Refused(format!(
                "volume {id:?} is in use by running alloc(s) {}: stop them first; a detach \
                 never takes a volume from a running alloc",
                running.join(", ")
            )));
        }
        let releasing: Vec<String> = status.releasing.keys().cloned().collect();
        if releasing.is_empty() && status.on_node.is_none() {
            return Ok(Detached {
                volume: id.to_string(),
                released: Vec::new(),
                unmounted: Vec::new(),
            });
        }
        if !force {
            let why = status
                .releasing
                .values()
                .next()
                .cloned()
                .unwrap_or_else(|| "releasing".into());
            let allocs: Vec<&str> = releasing
                .iter()
                .map(|a| berth_state::catalog::short_id(a))
                .collect();
            return Err(VolumeError::Refused(format!(
                "volume {id:?} is still held by finished alloc(s) {}, {why}, and berth retries \
                 until its plugin answers; `berth volume detach -force {id}` gives up on the \
                 plugin: it unmounts the volume here and releases the claims without telling \
                 the plugin, which may still hold it attached",
                allocs.join(", ")
            )));
        }
        let unmounted = self
            .node
            .csi
            .manager
            .force_detach(id, &releasing, &self.node.csi.root)
            .await
            .map_err(|e| VolumeError::Refused(e.to_string()))?;
        for alloc in &releasing {
            self.node.csi.catalog.release(id, alloc)?;
            if let Some(runner) = self.alloc_runner(alloc) {
                runner.forget_csi_volume(id);
            }
        }
        Ok(Detached {
            volume: id.to_string(),
            released: releasing,
            unmounted,
        })
    }

    /// CreateSnapshot of a registered volume through its plugin's controller.
    pub async fn create_snapshot(
        &self,
        volume_id: &str,
        name: Option<&str>,
    ) -> Result<SnapshotInfo, VolumeError> {
        let volume = self.node.csi.catalog.volume(volume_id)?.volume;
        let name = match name {
            Some(name) => name.to_string(),
            None => format!("{volume_id}-{}", super::now_ms() / 1000),
        };
        self.node
            .csi
            .manager
            .create_snapshot(&volume, &name)
            .await
            .map_err(|e| VolumeError::Refused(e.to_string()))
    }

    /// DeleteSnapshot through a plugin's controller.
    pub async fn delete_snapshot(
        &self,
        plugin_id: &str,
        snapshot_id: &str,
    ) -> Result<(), VolumeError> {
        self.check_plugin_known(plugin_id)?;
        self.node
            .csi
            .manager
            .delete_snapshot(plugin_id, snapshot_id)
            .await
            .map_err(|e| VolumeError::Refused(e.to_string()))
    }

    /// The snapshots of one plugin, or of every plugin with a controller that lists them.
    pub async fn snapshots(
        &self,
        plugin_id: Option<&str>,
    ) -> Result<Vec<SnapshotInfo>, VolumeError> {
        let manager = &self.node.csi.manager;
        if let Some(plugin_id) = plugin_id {
            self.check_plugin_known(plugin_id)?;
            return manager
                .list_snapshots(plugin_id)
                .await
                .map_err(|e| VolumeError::Refused(e.to_string()));
        }
        let mut all = Vec::new();
        let controllers: Vec<String> = self
            .node
            .csi
            .registry
            .list()
            .into_iter()
            .filter(|p| p.kind == PluginKind::Controller)
            .map(|p| p.id)
            .collect();
        for plugin in controllers {
            match manager.list_snapshots(&plugin).await {
                Ok(listed) => all.extend(listed),
                Err(error) => tracing::debug!(%plugin, %error, "not listing snapshots"),
            }
        }
        Ok(all)
    }

    /// Deletes a volume nobody claims through its plugin's controller (DeleteVolume:
    /// the data is gone), then forgets it. Refused, saying who, while it is claimed.
    pub async fn delete_volume(&self, id: &str) -> Result<VolumeStatus, VolumeError> {
        let status = self.node.csi.catalog.volume(id)?;
        if !status.claims.is_empty() {
            let allocs: Vec<&str> = status.claims.iter().map(|c| c.alloc_id.as_str()).collect();
            return Err(VolumeError::Refused(format!(
                "volume {id:?} is claimed by alloc(s) {}: stop them before deleting it",
                allocs.join(", ")
            )));
        }
        self.node
            .csi
            .manager
            .delete_volume(&status.volume)
            .await
            .map_err(|e| VolumeError::Refused(e.to_string()))?;
        self.deregister_volume(id)
    }

    /// Forgets a volume nobody claims (the data stays where the plugin keeps it).
    pub fn deregister_volume(&self, id: &str) -> Result<VolumeStatus, VolumeError> {
        let volume = self.node.csi.catalog.deregister_volume(id)?;
        Ok(shown(VolumeStatus {
            volume,
            claims: Vec::new(),
            on_node: None,
            nodes: Default::default(),
            releasing: Default::default(),
            expanded_from: None,
        }))
    }

    pub fn volumes(&self) -> Result<Vec<VolumeStatus>, VolumeError> {
        Ok(self
            .node
            .csi
            .catalog
            .volumes()?
            .into_iter()
            .map(|status| self.detailed(status))
            .collect())
    }

    pub fn volume(&self, id: &str) -> Result<VolumeStatus, VolumeError> {
        Ok(self.detailed(self.node.csi.catalog.volume(id)?))
    }

    /// The catalog's view of a volume with this node's: its stage and publications,
    /// and which claims belong to finished allocs still giving it back (and why).
    fn detailed(&self, mut status: VolumeStatus) -> VolumeStatus {
        status.on_node = self.node.csi.manager.on_node(&status.volume.id);
        status.nodes = super::csi_calls::volume_views(&self.cluster, &status.volume.id);
        let plugin = &status.volume.plugin_id;
        let plugin_healthy = self
            .node
            .csi
            .registry
            .get(PluginKind::Node, plugin)
            .is_some_and(|p| p.healthy);
        let allocs = self.allocs.lock().unwrap();
        // Only this node's claims are judged by its allocs: another node's claim is that
        // node's to give back (or the cluster's, once that node is lost), never this
        // node's to detach.
        for claim in status
            .claims
            .iter()
            .filter(|c| c.node == self.node.csi.node_name)
        {
            let finished = allocs
                .get(&claim.alloc_id)
                .is_none_or(|entry| *entry.finished.borrow());
            if finished {
                let why = if plugin_healthy {
                    "releasing".to_string()
                } else {
                    format!("releasing (waiting for plugin {plugin:?})")
                };
                status.releasing.insert(claim.alloc_id.clone(), why);
            }
        }
        drop(allocs);
        shown(status)
    }

    pub fn plugins(&self) -> Result<Vec<PluginStatus>, VolumeError> {
        Ok(self.node.csi.catalog.plugins()?)
    }

    pub fn plugin(&self, id: &str) -> Result<PluginStatus, VolumeError> {
        self.plugins()?
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| {
                VolumeError::NotFound(format!("no CSI plugin {id:?} is running on this agent"))
            })
    }

    fn check_plugin_known(&self, plugin_id: &str) -> Result<(), VolumeError> {
        let registered = self.node.csi.registry.list();
        if registered.iter().any(|p| p.id == plugin_id) {
            return Ok(());
        }
        let mut known: Vec<String> = registered.into_iter().map(|p| p.id).collect();
        known.sort();
        known.dedup();
        Err(VolumeError::Refused(format!(
            "no CSI plugin {plugin_id:?} is registered on this agent ({}); run the plugin's job first",
            if known.is_empty() {
                "it runs none".to_string()
            } else {
                format!("registered: {}", known.join(", "))
            }
        )))
    }
}
