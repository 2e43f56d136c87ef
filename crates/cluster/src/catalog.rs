//! The catalog on etcd: one key per volume holds the volume with its claims, and every
//! change to it is a transaction on the revision it was read at, so two agents claiming
//! a single-writer volume at once cannot both win (the loser reads again and is refused
//! with the holder named). Plugin providers live under their node's lease: a node that
//! dies takes its providers with it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Cluster;
use super::etcd::{Condition, Write};
use berth_model::csi::PluginKind;
use berth_state::catalog::{
    Catalog, CatalogError, Claim, PluginProvider, PluginStatus, Volume, VolumeStatus,
    claim_refusal, plugin_statuses,
};

/// How often a transaction that lost a race is tried again before giving up.
const MAX_ATTEMPTS: usize = 64;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct VolumeRecord {
    volume: Volume,
    #[serde(default)]
    claims: Vec<Claim>,
}

pub struct EtcdCatalog {
    cluster: Arc<Cluster>,
}

impl EtcdCatalog {
    pub fn new(cluster: Arc<Cluster>) -> EtcdCatalog {
        EtcdCatalog { cluster }
    }

    fn volume_key(&self, id: &str) -> String {
        self.cluster.key(&["volumes", id])
    }

    /// The volume's record and the revision it was read at (0: no such key).
    fn read(&self, id: &str) -> Result<(Option<VolumeRecord>, i64), CatalogError> {
        let key = self.volume_key(id);
        let store = self.cluster.store().clone();
        let entry = self
            .cluster
            .store()
            .block(async move { store.get(&key).await })
            .map_err(store_error)?;
        match entry {
            None => Ok((None, 0)),
            Some(entry) => {
                let record = serde_json::from_slice(&entry.value).map_err(|e| {
                    CatalogError::Store(format!(
                        "volume {id:?} in the cluster store cannot be read: {e}"
                    ))
                })?;
                Ok((Some(record), entry.mod_revision))
            }
        }
    }

    /// Writes `record` if the key is still at `revision`; `false` when it moved.
    fn write_if(
        &self,
        id: &str,
        revision: i64,
        record: Option<&VolumeRecord>,
    ) -> Result<bool, CatalogError> {
        let key = self.volume_key(id);
        let write = match record {
            Some(record) => Write::Put {
                key: key.clone(),
                value: serde_json::to_vec(record)
                    .map_err(|e| CatalogError::Store(e.to_string()))?,
                lease: 0,
            },
            None => Write::Delete(key.clone()),
        };
        let store = self.cluster.store().clone();
        self.cluster
            .store()
            .block(async move {
                store
                    .transaction(vec![Condition::ModRevision(key, revision)], vec![write])
                    .await
            })
            .map_err(store_error)
    }

    /// Reads, changes and writes the volume's record until the write wins the race.
    /// `change` sees the current record and says what to write (`Ok(None)`: nothing).
    fn update<T>(
        &self,
        id: &str,
        mut change: impl FnMut(Option<VolumeRecord>) -> Result<(Option<Next>, T), CatalogError>,
    ) -> Result<T, CatalogError> {
        for _ in 0..MAX_ATTEMPTS {
            let (record, revision) = self.read(id)?;
            let (next, answer) = change(record)?;
            let written = match next {
                None => true,
                Some(Next::Put(record)) => self.write_if(id, revision, Some(&record))?,
                Some(Next::Delete) => self.write_if(id, revision, None)?,
            };
            if written {
                return Ok(answer);
            }
        }
        Err(CatalogError::Store(format!(
            "volume {id:?} changed under every one of {MAX_ATTEMPTS} attempts to update it; \
             try again"
        )))
    }

    fn provider_key(&self, plugin_id: &str, kind: PluginKind, alloc_id: &str) -> String {
        self.cluster
            .key(&["plugins", plugin_id, kind.as_str(), alloc_id])
    }
}

enum Next {
    Put(Box<VolumeRecord>),
    Delete,
}

fn store_error(error: super::etcd::EtcdError) -> CatalogError {
    CatalogError::Store(error.to_string())
}

fn no_such(id: &str) -> CatalogError {
    CatalogError::NoSuchVolume(id.to_string())
}

fn status(record: VolumeRecord) -> VolumeStatus {
    VolumeStatus {
        volume: record.volume,
        claims: record.claims,
        on_node: None,
        nodes: Default::default(),
        releasing: Default::default(),
        expanded_from: None,
    }
}

impl EtcdCatalog {
    /// The claims of allocs the cluster marked `lost` more than `grace` ago (their node
    /// went down and has not come back), each with its volume and the lost node's name.
    pub fn lost_claims_due(
        &self,
        reports: &[super::state::AllocReport],
        now_ms: u64,
        grace: std::time::Duration,
    ) -> Result<Vec<LostClaim>, CatalogError> {
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let lost: std::collections::BTreeMap<&str, &super::state::AllocReport> = reports
            .iter()
            .filter(|r| r.client_status == berth_model::status::ClientStatus::Lost)
            .filter(|r| r.updated_ms.saturating_add(grace_ms) <= now_ms)
            .map(|r| (r.alloc_id.as_str(), r))
            .collect();
        if lost.is_empty() {
            return Ok(Vec::new());
        }
        let mut due = Vec::new();
        for status in self.volumes()? {
            for claim in &status.claims {
                if let Some(report) = lost.get(claim.alloc_id.as_str()) {
                    let node_id_in_use = claim.external_node_id.is_some()
                        && status.claims.iter().any(|other| {
                            other.alloc_id != claim.alloc_id
                                && !lost.contains_key(other.alloc_id.as_str())
                                && other.external_node_id == claim.external_node_id
                        });
                    due.push(LostClaim {
                        volume: status.volume.clone(),
                        claim: claim.clone(),
                        node_name: report.node_name.clone(),
                        node_id_in_use,
                    });
                }
            }
        }
        Ok(due)
    }
}

/// A lost alloc's claim, due for release.
#[derive(Debug, Clone)]
pub struct LostClaim {
    /// The volume, with its secrets (a ControllerUnpublish needs them).
    pub volume: Volume,
    pub claim: Claim,
    pub node_name: String,
    /// Another claim that stays names the same CSI node id (the alloc that replaced
    /// this one, on the node that came back; or a plugin that reports one id on two
    /// nodes): unpublishing from it would pull the volume from under that claim.
    pub node_id_in_use: bool,
}

impl Catalog for EtcdCatalog {
    fn register_volume(&self, volume: Volume) -> Result<(), CatalogError> {
        let id = volume.id.clone();
        self.update(&id, |record| match record {
            Some(existing) if existing.volume != volume && !existing.claims.is_empty() => {
                Err(CatalogError::Refused(format!(
                    "volume {:?} is already registered and claimed by {} alloc(s); it can be \
                     changed once they stop",
                    volume.id,
                    existing.claims.len()
                )))
            }
            Some(existing) => Ok((
                Some(Next::Put(Box::new(VolumeRecord {
                    volume: volume.clone(),
                    claims: existing.claims,
                }))),
                (),
            )),
            None => Ok((
                Some(Next::Put(Box::new(VolumeRecord {
                    volume: volume.clone(),
                    claims: Vec::new(),
                }))),
                (),
            )),
        })
    }

    fn deregister_volume(&self, id: &str) -> Result<Volume, CatalogError> {
        self.update(id, |record| {
            let record = record.ok_or_else(|| no_such(id))?;
            if !record.claims.is_empty() {
                let holders: Vec<&str> = record
                    .claims
                    .iter()
                    .map(|c| c.alloc_name.as_str())
                    .collect();
                return Err(CatalogError::Refused(format!(
                    "volume {id:?} is claimed by {}: stop them first",
                    holders.join(", ")
                )));
            }
            let mut volume = record.volume;
            volume.secrets.clear();
            Ok((Some(Next::Delete), volume))
        })
    }

    fn set_capacity(&self, id: &str, capacity_bytes: i64) -> Result<(), CatalogError> {
        self.update(id, |record| {
            let mut record = record.ok_or_else(|| no_such(id))?;
            record.volume.capacity_bytes = capacity_bytes;
            Ok((Some(Next::Put(Box::new(record))), ()))
        })
    }

    fn volume(&self, id: &str) -> Result<VolumeStatus, CatalogError> {
        let (record, _) = self.read(id)?;
        Ok(status(record.ok_or_else(|| no_such(id))?))
    }

    fn volumes(&self) -> Result<Vec<VolumeStatus>, CatalogError> {
        let prefix = format!("{}/", self.cluster.key(&["volumes"]));
        let store = self.cluster.store().clone();
        let (entries, _) = self
            .cluster
            .store()
            .block(async move { store.list(&prefix).await })
            .map_err(store_error)?;
        let mut volumes = Vec::new();
        for entry in entries {
            match serde_json::from_slice::<VolumeRecord>(&entry.value) {
                Ok(record) => volumes.push(status(record)),
                Err(error) => tracing::error!(key = %entry.key, %error,
                    "a volume in the cluster store cannot be read; it is left out"),
            }
        }
        Ok(volumes)
    }

    fn claim(&self, volume_id: &str, claim: Claim) -> Result<(), CatalogError> {
        self.update(volume_id, |record| {
            let mut record = record.ok_or_else(|| no_such(volume_id))?;
            if record.claims.iter().any(|c| c.same_use(&claim)) {
                return Ok((None, ()));
            }
            if let Some(refusal) = claim_refusal(&record.volume, &record.claims, &claim) {
                return Err(CatalogError::Refused(refusal));
            }
            record.claims.retain(|c| c.alloc_id != claim.alloc_id);
            record.claims.push(claim.clone());
            Ok((Some(Next::Put(Box::new(record))), ()))
        })
    }

    fn release(&self, volume_id: &str, alloc_id: &str) -> Result<(), CatalogError> {
        self.update(volume_id, |record| {
            let Some(mut record) = record else {
                return Ok((None, ()));
            };
            let before = record.claims.len();
            record.claims.retain(|c| c.alloc_id != alloc_id);
            if record.claims.len() == before {
                return Ok((None, ()));
            }
            Ok((Some(Next::Put(Box::new(record))), ()))
        })
    }

    fn put_plugin_provider(&self, provider: PluginProvider) -> Result<(), CatalogError> {
        let key = self.provider_key(&provider.plugin_id, provider.kind, &provider.alloc_id);
        let value =
            serde_json::to_vec(&provider).map_err(|e| CatalogError::Store(e.to_string()))?;
        self.cluster
            .put_owned(key, value)
            .map_err(|e| CatalogError::Store(e.to_string()))
    }

    fn remove_plugin_provider(
        &self,
        plugin_id: &str,
        kind: PluginKind,
        alloc_id: &str,
    ) -> Result<(), CatalogError> {
        self.cluster
            .remove_owned(&self.provider_key(plugin_id, kind, alloc_id))
            .map_err(|e| CatalogError::Store(e.to_string()))
    }

    fn plugins(&self) -> Result<Vec<PluginStatus>, CatalogError> {
        let prefix = format!("{}/", self.cluster.key(&["plugins"]));
        let store = self.cluster.store().clone();
        let (entries, _) = self
            .cluster
            .store()
            .block(async move { store.list(&prefix).await })
            .map_err(store_error)?;
        let providers = entries
            .iter()
            .filter_map(|entry| serde_json::from_slice::<PluginProvider>(&entry.value).ok());
        Ok(plugin_statuses(providers, &self.volumes()?))
    }
}
