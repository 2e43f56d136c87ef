//! Fingerprinting a plugin: its info, capabilities and readiness, probed until it
//! answers, then kept for the catalog.

use std::collections::BTreeMap;

use super::{CsiManager, CsiVolumeError};
use crate::plugin::CsiPlugin;
use crate::registry::PluginRegistration;
use berth_model::csi::{Capabilities, Fingerprint, PluginKind};
use std::sync::Arc;

/// The longest node id a plugin may give (the CSI spec's bound).
const MAX_NODE_ID: usize = 256;

impl CsiManager {
    pub(super) fn fingerprint_of(&self, plugin: &PluginRegistration) -> Option<Fingerprint> {
        self.fingerprints
            .lock()
            .unwrap()
            .get(&(plugin.kind, plugin.id.clone()))
            .filter(|(alloc, _)| *alloc == plugin.alloc_id)
            .map(|(_, fingerprint)| fingerprint.clone())
    }

    /// Asks the plugin who it is, whether it is ready, and what it can do; cached per
    /// providing alloc.
    pub async fn fingerprint(&self, plugin: &PluginRegistration) -> Fingerprint {
        if let Some(known) = self.fingerprint_of(plugin).filter(|f| f.error.is_none()) {
            return known;
        }
        let client = self.client(plugin);
        let result = async {
            let (name, vendor_version) = client.plugin_info().await?;
            let controller_service = client.plugin_capabilities().await?;
            let ready = client.probe().await?;
            let mut fingerprint = Fingerprint {
                name,
                vendor_version,
                node_id: None,
                topology: BTreeMap::new(),
                capabilities: Capabilities {
                    controller_service,
                    ..Capabilities::default()
                },
                error: (!ready).then(|| "its Probe says it is not ready yet".to_string()),
            };
            match plugin.kind {
                PluginKind::Node => {
                    let (node_id, topology) = client.node_info().await?;
                    // CSI bounds a node id at 256 bytes; it travels in claims and
                    // provider records, so a longer one is an error, not stored.
                    if node_id.len() > MAX_NODE_ID {
                        fingerprint.error = Some(format!(
                            "its NodeGetInfo gave a node id of {} bytes; CSI allows at most \
                             {MAX_NODE_ID}",
                            node_id.len()
                        ));
                    } else {
                        fingerprint.node_id = Some(node_id);
                    }
                    fingerprint.topology = topology;
                    let (stages, expands) = client.node_capabilities().await?;
                    fingerprint.capabilities.stage_unstage = stages;
                    fingerprint.capabilities.node_expand = expands;
                }
                PluginKind::Controller => {
                    client
                        .controller_capabilities(&mut fingerprint.capabilities)
                        .await?;
                }
            }
            Ok::<_, crate::client::CsiError>(fingerprint)
        }
        .await;
        let fingerprint = result.unwrap_or_else(|error| Fingerprint {
            error: Some(error.to_string()),
            ..Fingerprint::default()
        });
        self.fingerprints.lock().unwrap().insert(
            (plugin.kind, plugin.id.clone()),
            (plugin.alloc_id.clone(), fingerprint.clone()),
        );
        fingerprint
    }

    /// What a claim of a volume of plugin `id` records of this node: its id for the
    /// plugin (its node part's NodeGetInfo), which the controller publishes to and a
    /// lost node's volume is unpublished from; `None` when the plugin has no
    /// controller, which publishes nothing. Waits for the node part as a mount would.
    pub async fn claim_node_id(&self, id: &str) -> Result<Option<String>, CsiVolumeError> {
        let (_, _, fingerprint) = self.ready(PluginKind::Node, id).await?;
        Ok(fingerprint.node_id.filter(|_| self.has_controller(id)))
    }

    /// The healthy, fingerprinted plugin, waiting for it up to the plugin wait.
    pub(super) async fn ready(
        &self,
        kind: PluginKind,
        id: &str,
    ) -> Result<(PluginRegistration, Arc<dyn CsiPlugin>, Fingerprint), CsiVolumeError> {
        let plugin = self
            .registry
            .wait_for_healthy(kind, id, self.settings.plugin_wait)
            .await?;
        let fingerprint = self.fingerprint(&plugin).await;
        if let Some(error) = &fingerprint.error {
            return Err(CsiVolumeError::Fingerprint {
                plugin: id.to_string(),
                reason: error.clone(),
            });
        }
        let client = self.client(&plugin);
        Ok((plugin, client, fingerprint))
    }
}
