//! The catalog: registered CSI volumes, their claims, and the plugins with the allocs
//! that provide them. Behind the [`Catalog`] trait so that a cluster store (etcd) can
//! take the embedded one's place; [`embedded::EmbeddedCatalog`] keeps it in the agent's
//! redb file.
//!
//! Claims enforce the volume's access mode: a claim the mode forbids is refused with a
//! message that names the volume, the mode and who holds it.

pub mod embedded;
pub mod volume_spec;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use berth_model::csi::{AccessMode, AttachmentMode, PluginKind};

/// A CSI volume known to the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub plugin_id: String,
    /// The plugin's own id for the volume.
    pub external_id: String,
    /// The ways it may be used; a job must ask for one of them.
    pub capabilities: Vec<Capability>,
    pub capacity_bytes: i64,
    pub parameters: HashMap<String, String>,
    pub context: HashMap<String, String>,
    /// Passed to the plugin; never shown.
    #[serde(default)]
    pub secrets: HashMap<String, String>,
    /// `registered` or `created`.
    pub origin: String,
    /// Where the volume can be used, as CreateVolume said (`zone = "a"`, …; any one
    /// of them); empty: anywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accessible_topology: Vec<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub access_mode: AccessMode,
    pub attachment_mode: AttachmentMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimMode {
    Read,
    Write,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub alloc_id: String,
    pub alloc_name: String,
    pub mode: ClaimMode,
    pub access_mode: AccessMode,
    pub node: String,
    /// When the claim was made (seconds since the epoch; 0 for claims recorded before
    /// berth kept it).
    #[serde(default)]
    pub since: u64,
    /// The claiming node's id for the volume's plugin (its node part's NodeGetInfo):
    /// what the controller published the volume to, and what a ControllerUnpublish
    /// names when that node is lost. `None` for claims recorded before berth kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_node_id: Option<String>,
}

impl Claim {
    /// The same alloc claiming the same way: claiming again (after an agent restart) is
    /// the claim it already has, made when it was first made.
    pub fn same_use(&self, other: &Claim) -> bool {
        self.alloc_id == other.alloc_id
            && self.mode == other.mode
            && self.access_mode == other.access_mode
            && self.node == other.node
    }
}

/// A volume with its claims, as `berth volume status` shows it (without secrets).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeStatus {
    pub volume: Volume,
    pub claims: Vec<Claim>,
    /// How this node stages and publishes the volume, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_node: Option<VolumeOnNode>,
    /// In a cluster: how each node that uses the volume stages and publishes it, by node
    /// name (this node's too).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nodes: BTreeMap<String, VolumeOnNode>,
    /// Claims of allocs that have finished and are still giving the volume back, by
    /// alloc id: what they wait for.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub releasing: BTreeMap<String, String>,
    /// In the answer to a `volume create` that expanded an existing volume: its capacity
    /// before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expanded_from: Option<i64>,
}

/// A volume's stage and publications on this node, as the CSI manager records them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeOnNode {
    /// `attachment/access` of its one stage, when staged.
    pub staged: Option<String>,
    /// Attached to this node by the plugin's controller (ControllerPublishVolume).
    pub controller_published: bool,
    /// One per alloc the volume is published to.
    pub publications: Vec<Publication>,
    /// The CSI call under way, or cut short and still to be resolved.
    pub pending: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub alloc_id: String,
    /// The usage key: access mode, attachment mode, `ro` or `rw`.
    pub usage: String,
}

/// One alloc providing one kind of a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginProvider {
    pub plugin_id: String,
    pub kind: PluginKind,
    pub alloc_id: String,
    pub node: String,
    pub healthy: bool,
    pub health: String,
    /// What fingerprinting found (name, version, capabilities), once it ran.
    #[serde(default)]
    pub fingerprint: Option<berth_model::csi::Fingerprint>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginStatus {
    pub id: String,
    pub providers: Vec<PluginProvider>,
    pub nodes_healthy: usize,
    pub nodes_expected: usize,
    pub controllers_healthy: usize,
    pub controllers_expected: usize,
    /// Volumes registered for this plugin.
    pub volumes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("no CSI volume {0:?} is registered (see `berth volume status`)")]
    NoSuchVolume(String),
    #[error("{0}")]
    Refused(String),
    #[error("the catalog could not be read or written: {0}")]
    Store(String),
}

impl From<crate::StateError> for CatalogError {
    fn from(error: crate::StateError) -> Self {
        CatalogError::Store(error.to_string())
    }
}

pub trait Catalog: Send + Sync {
    /// Adds a volume, or replaces one nobody claims.
    fn register_volume(&self, volume: Volume) -> Result<(), CatalogError>;
    /// Removes a volume nobody claims.
    fn deregister_volume(&self, id: &str) -> Result<Volume, CatalogError>;
    /// Records a volume's new capacity after its plugin expanded it (claimed or not).
    fn set_capacity(&self, id: &str, capacity_bytes: i64) -> Result<(), CatalogError>;
    fn volume(&self, id: &str) -> Result<VolumeStatus, CatalogError>;
    fn volumes(&self) -> Result<Vec<VolumeStatus>, CatalogError>;
    /// Claims `volume_id` for an alloc, or refuses what its access mode forbids.
    /// Claiming again for the same alloc is a no-op.
    fn claim(&self, volume_id: &str, claim: Claim) -> Result<(), CatalogError>;
    /// Releases an alloc's claim; releasing twice is fine.
    fn release(&self, volume_id: &str, alloc_id: &str) -> Result<(), CatalogError>;
    fn put_plugin_provider(&self, provider: PluginProvider) -> Result<(), CatalogError>;
    /// Removes a provider; a plugin with no providers left is gone from [`Catalog::plugins`].
    fn remove_plugin_provider(
        &self,
        plugin_id: &str,
        kind: PluginKind,
        alloc_id: &str,
    ) -> Result<(), CatalogError>;
    fn plugins(&self) -> Result<Vec<PluginStatus>, CatalogError>;
}

/// Why `claim` may not join `existing` on a volume with `mode`, if it may not.
pub fn claim_refusal(volume: &Volume, existing: &[Claim], claim: &Claim) -> Option<String> {
    if claim.mode == ClaimMode::Write && claim.access_mode.read_only() {
        return Some(format!(
            "volume {:?} is claimed {} by alloc {}, which cannot write: mount it with read_only = true",
            volume.id, claim.access_mode, claim.alloc_name
        ));
    }
    let others: Vec<&Claim> = existing
        .iter()
        .filter(|c| c.alloc_id != claim.alloc_id)
        .collect();
    let single_writer = matches!(
        claim.access_mode,
        AccessMode::SingleNodeWriter | AccessMode::MultiNodeSingleWriter
    );
    if claim.mode == ClaimMode::Write
        && single_writer
        && let Some(writer) = others.iter().find(|c| c.mode == ClaimMode::Write)
    {
        return Some(format!(
            "volume {:?} is {} and alloc {} ({}) already writes to it: a second writer is refused \
                 until that alloc stops",
            volume.id,
            claim.access_mode,
            short_id(&writer.alloc_id),
            writer.alloc_name
        ));
    }
    let single_node = matches!(
        claim.access_mode,
        AccessMode::SingleNodeWriter | AccessMode::SingleNodeReaderOnly
    );
    if single_node && let Some(elsewhere) = others.iter().find(|c| c.node != claim.node) {
        return Some(format!(
            "volume {:?} is {} and is in use on node {:?} by alloc {}",
            volume.id,
            claim.access_mode,
            elsewhere.node,
            short_id(&elsewhere.alloc_id)
        ));
    }
    None
}

/// Plugins with their providers, as [`Catalog::plugins`] shows them: counts of healthy
/// and expected controllers and nodes, and the volumes registered for each.
pub fn plugin_statuses(
    providers: impl IntoIterator<Item = PluginProvider>,
    volumes: &[VolumeStatus],
) -> Vec<PluginStatus> {
    let mut by_plugin: BTreeMap<String, Vec<PluginProvider>> = BTreeMap::new();
    for provider in providers {
        by_plugin
            .entry(provider.plugin_id.clone())
            .or_default()
            .push(provider);
    }
    by_plugin
        .into_iter()
        .map(|(id, providers)| {
            let count = |kind: PluginKind, healthy_only: bool| {
                providers
                    .iter()
                    .filter(|p| p.kind == kind && (p.healthy || !healthy_only))
                    .count()
            };
            PluginStatus {
                nodes_healthy: count(PluginKind::Node, true),
                nodes_expected: count(PluginKind::Node, false),
                controllers_healthy: count(PluginKind::Controller, true),
                controllers_expected: count(PluginKind::Controller, false),
                volumes: volumes
                    .iter()
                    .filter(|v| v.volume.plugin_id == id)
                    .map(|v| v.volume.id.clone())
                    .collect(),
                id,
                providers,
            }
        })
        .collect()
}

pub fn short_id(id: &str) -> &str {
    &id[..id.len().min(8)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume() -> Volume {
        Volume {
            id: "data".into(),
            name: "data".into(),
            plugin_id: "hostpath".into(),
            external_id: "data".into(),
            capabilities: vec![],
            capacity_bytes: 0,
            parameters: HashMap::new(),
            context: HashMap::new(),
            secrets: HashMap::new(),
            origin: "registered".into(),
            accessible_topology: Vec::new(),
        }
    }

    fn claim(alloc: &str, mode: ClaimMode, access_mode: AccessMode) -> Claim {
        Claim {
            alloc_id: alloc.into(),
            alloc_name: format!("job.g[{alloc}]"),
            mode,
            access_mode,
            node: "n1".into(),
            since: 0,
            external_node_id: None,
        }
    }

    #[test]
    fn access_modes_refuse_what_they_forbid() {
        use AccessMode::*;
        use ClaimMode::*;
        let v = volume();
        let writer = claim("a", Write, SingleNodeWriter);
        // A second writer of a single-writer volume is refused, a reader is not.
        let refusal = claim_refusal(
            &v,
            std::slice::from_ref(&writer),
            &claim("b", Write, SingleNodeWriter),
        )
        .expect("second writer refused");
        assert!(refusal.contains("a second writer is refused"), "{refusal}");
        assert!(
            claim_refusal(
                &v,
                std::slice::from_ref(&writer),
                &claim("b", Read, SingleNodeWriter)
            )
            .is_none()
        );
        // The same alloc claiming again is fine.
        assert!(claim_refusal(&v, std::slice::from_ref(&writer), &writer).is_none());
        // Reader-only modes refuse any writer.
        assert!(
            claim_refusal(&v, &[], &claim("c", Write, MultiNodeReaderOnly))
                .unwrap()
                .contains("read_only = true")
        );
        assert!(claim_refusal(&v, &[], &claim("c", Write, SingleNodeReaderOnly)).is_some());
        // Multi-writer takes everyone.
        let many = vec![
            claim("a", Write, MultiNodeMultiWriter),
            claim("b", Write, MultiNodeMultiWriter),
        ];
        assert!(claim_refusal(&v, &many, &claim("c", Write, MultiNodeMultiWriter)).is_none());
        // Single-node modes stay on one node.
        let mut elsewhere = claim("a", Read, SingleNodeReaderOnly);
        elsewhere.node = "n2".into();
        assert!(
            claim_refusal(&v, &[elsewhere], &claim("b", Read, SingleNodeReaderOnly))
                .unwrap()
                .contains("in use on node \"n2\"")
        );
        // Multi-node single writer: one writer, readers anywhere.
        let mut remote_writer = claim("a", Write, MultiNodeSingleWriter);
        remote_writer.node = "n2".into();
        assert!(
            claim_refusal(
                &v,
                &[remote_writer.clone()],
                &claim("b", Read, MultiNodeSingleWriter)
            )
            .is_none()
        );
        assert!(
            claim_refusal(
                &v,
                &[remote_writer],
                &claim("b", Write, MultiNodeSingleWriter)
            )
            .is_some()
        );
    }
}
