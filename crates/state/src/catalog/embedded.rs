//! The catalog in the agent's own redb file (tables `volumes`, `claims`,
//! `plugin_providers`). A claim is checked and written under one lock, so two allocs
//! racing for a single-writer volume cannot both win.

use std::sync::{Arc, Mutex};

use super::{
    Catalog, CatalogError, Claim, PluginProvider, PluginStatus, Volume, VolumeStatus, claim_refusal,
};
use crate::{RecordTable, StateStore};
use berth_model::csi::PluginKind;

pub struct EmbeddedCatalog {
    store: Arc<StateStore>,
    /// Serialises read-check-write sequences.
    writing: Mutex<()>,
}

impl EmbeddedCatalog {
    pub fn new(store: Arc<StateStore>) -> EmbeddedCatalog {
        EmbeddedCatalog {
            store,
            writing: Mutex::new(()),
        }
    }

    fn claims_of(&self, volume_id: &str) -> Result<Vec<Claim>, CatalogError> {
        let (claims, unreadable) = self
            .store
            .records::<Claim>(RecordTable::Claims, &format!("{volume_id}/"))?;
        for problem in unreadable {
            tracing::error!("{problem}");
        }
        Ok(claims.into_iter().map(|(_, c)| c).collect())
    }

    fn get_volume(&self, id: &str) -> Result<Volume, CatalogError> {
        self.store
            .record::<Volume>(RecordTable::Volumes, id)?
            .ok_or_else(|| CatalogError::NoSuchVolume(id.to_string()))
    }
}

fn without_secrets(mut volume: Volume) -> Volume {
    volume.secrets.clear();
    volume
}

impl Catalog for EmbeddedCatalog {
    fn register_volume(&self, volume: Volume) -> Result<(), CatalogError> {
        let _lock = self.writing.lock().unwrap();
        if let Some(existing) = self
            .store
            .record::<Volume>(RecordTable::Volumes, &volume.id)?
        {
            let claims = self.claims_of(&volume.id)?;
            if existing != volume && !claims.is_empty() {
                return Err(CatalogError::Refused(format!(
                    "volume {:?} is already registered and claimed by {} alloc(s); it can be \
                     changed once they stop",
                    volume.id,
                    claims.len()
                )));
            }
        }
        self.store
            .put_record(RecordTable::Volumes, &volume.id, &volume)?;
        Ok(())
    }

    fn set_capacity(&self, id: &str, capacity_bytes: i64) -> Result<(), CatalogError> {
        let _lock = self.writing.lock().unwrap();
        let mut volume = self.get_volume(id)?;
        volume.capacity_bytes = capacity_bytes;
        self.store.put_record(RecordTable::Volumes, id, &volume)?;
        Ok(())
    }

    fn deregister_volume(&self, id: &str) -> Result<Volume, CatalogError> {
        let _lock = self.writing.lock().unwrap();
        let volume = self.get_volume(id)?;
        let claims = self.claims_of(id)?;
        if !claims.is_empty() {
            let holders: Vec<&str> = claims.iter().map(|c| c.alloc_name.as_str()).collect();
            return Err(CatalogError::Refused(format!(
                "volume {id:?} is claimed by {}: stop them first",
                holders.join(", ")
            )));
        }
        self.store.remove_record(RecordTable::Volumes, id)?;
        Ok(without_secrets(volume))
    }

    fn volume(&self, id: &str) -> Result<VolumeStatus, CatalogError> {
        Ok(VolumeStatus {
            volume: self.get_volume(id)?,
            claims: self.claims_of(id)?,
            on_node: None,
            nodes: Default::default(),
            releasing: Default::default(),
            expanded_from: None,
        })
    }

    fn volumes(&self) -> Result<Vec<VolumeStatus>, CatalogError> {
        let (volumes, unreadable) = self.store.records::<Volume>(RecordTable::Volumes, "")?;
        for problem in unreadable {
            tracing::error!("{problem}");
        }
        volumes
            .into_iter()
            .map(|(_, volume)| {
                Ok(VolumeStatus {
                    claims: self.claims_of(&volume.id)?,
                    volume,
                    on_node: None,
                    nodes: Default::default(),
                    releasing: Default::default(),
                    expanded_from: None,
                })
            })
            .collect()
    }

    fn claim(&self, volume_id: &str, claim: Claim) -> Result<(), CatalogError> {
        let _lock = self.writing.lock().unwrap();
        let volume = self.get_volume(volume_id)?;
        let existing = self.claims_of(volume_id)?;
        if existing.iter().any(|c| c.same_use(&claim)) {
            return Ok(());
        }
        if let Some(refusal) = claim_refusal(&volume, &existing, &claim) {
            return Err(CatalogError::Refused(refusal));
        }
        self.store.put_record(
            RecordTable::Claims,
            &format!("{volume_id}/{}", claim.alloc_id),
            &claim,
        )?;
        Ok(())
    }

    fn release(&self, volume_id: &str, alloc_id: &str) -> Result<(), CatalogError> {
        let _lock = self.writing.lock().unwrap();
        self.store
            .remove_record(RecordTable::Claims, &format!("{volume_id}/{alloc_id}"))?;
        Ok(())
    }

    fn put_plugin_provider(&self, provider: PluginProvider) -> Result<(), CatalogError> {
        let key = format!(
            "{}/{}/{}",
            provider.plugin_id, provider.kind, provider.alloc_id
        );
        self.store
            .put_record(RecordTable::PluginProviders, &key, &provider)?;
        Ok(())
    }

    fn remove_plugin_provider(
        &self,
        plugin_id: &str,
        kind: PluginKind,
        alloc_id: &str,
    ) -> Result<(), CatalogError> {
        self.store.remove_record(
            RecordTable::PluginProviders,
            &format!("{plugin_id}/{kind}/{alloc_id}"),
        )?;
        Ok(())
    }

    fn plugins(&self) -> Result<Vec<PluginStatus>, CatalogError> {
        let (providers, unreadable) = self
            .store
            .records::<PluginProvider>(RecordTable::PluginProviders, "")?;
        for problem in unreadable {
            tracing::error!("{problem}");
        }
        let volumes = self.volumes()?;
        Ok(super::plugin_statuses(
            providers.into_iter().map(|(_, p)| p),
            &volumes,
        ))
    }
}
