//! Nomad's own service catalog (services with `provider = "nomad"`), one for the whole
//! cluster: each node writes the services of its allocs under its lease (a node that
//! dies takes its services with it), and any node reads them, as Nomad's
//! `nomadService` templates and `/v1/service/:name` do. One key per service:
//! `services/<name>/<id>`, so that the instances of one name are one prefix to read and
//! to watch.

use super::{Cluster, ClusterError};

/// One instance of a service, stored as Nomad's API shows it (`ServiceRegistration`;
/// its indexes are the store's revision, set when it is read through the API).
pub type ServiceRecord = berth_nomad_api::services::ServiceRegistration;

/// A service name with every tag its instances carry (Nomad's `/v1/services`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceName {
    pub name: String,
    pub tags: Vec<String>,
}

impl Cluster {
    fn services_prefix(&self) -> String {
        format!("{}/", self.key(&["services"]))
    }

    /// The key of one instance: its name, then its ID.
    pub fn service_key(&self, record: &ServiceRecord) -> String {
        self.key(&["services", &record.service_name, &record.id])
    }

    /// Writes an instance of this node's, under this node's lease.
    pub fn put_service(&self, record: &ServiceRecord) -> Result<(), ClusterError> {
        let value = serde_json::to_vec(record).map_err(|e| ClusterError::Local(e.to_string()))?;
        self.put_owned(self.service_key(record), value)
    }

    pub fn remove_service(&self, key: &str) -> Result<(), ClusterError> {
        self.remove_owned(key)
    }

    /// Every instance of every service, by name then ID, with the revision read at.
    pub fn all_services(&self) -> Result<(Vec<ServiceRecord>, i64), ClusterError> {
        let prefix = self.services_prefix();
        let store = self.store().clone();
        let (entries, revision) = self
            .store()
            .block(async move { store.list(&prefix).await })?;
        let mut records: Vec<ServiceRecord> = entries
            .iter()
            .filter_map(|entry| match serde_json::from_slice(&entry.value) {
                Ok(record) => Some(record),
                Err(error) => {
                    tracing::warn!(key = %entry.key, %error,
                        "a service in the cluster store cannot be read; it is left out");
                    None
                }
            })
            .collect();
        records.sort_by(|a: &ServiceRecord, b| {
            (&a.service_name, &a.id).cmp(&(&b.service_name, &b.id))
        });
        Ok((records, revision))
    }

    /// The instances of the service `name`.
    pub fn services_named(&self, name: &str) -> Result<Vec<ServiceRecord>, ClusterError> {
        let prefix = format!("{}/", self.key(&["services", name]));
        let store = self.store().clone();
        let (entries, _) = self
            .store()
            .block(async move { store.list(&prefix).await })?;
        let mut records: Vec<ServiceRecord> = entries
            .iter()
            .filter_map(|entry| serde_json::from_slice(&entry.value).ok())
            .filter(|record: &ServiceRecord| record.service_name == name)
            .collect();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(records)
    }

    /// Every service name, each with the tags of all its instances.
    pub fn service_names(&self) -> Result<Vec<ServiceName>, ClusterError> {
        let (records, _) = self.all_services()?;
        let mut names: Vec<ServiceName> = Vec::new();
        for record in records {
            match names.last_mut() {
                Some(last) if last.name == record.service_name => {
                    for tag in record.tags {
                        if !last.tags.contains(&tag) {
                            last.tags.push(tag);
                        }
                    }
                }
                _ => names.push(ServiceName {
                    name: record.service_name,
                    tags: record.tags,
                }),
            }
        }
        for name in &mut names {
            name.tags.sort();
        }
        Ok(names)
    }

    /// Changes to any service from `revision` on (`Reset`: read everything again).
    pub fn watch_services(
        &self,
        revision: i64,
    ) -> tokio::sync::mpsc::Receiver<super::etcd::Change> {
        self.store().watch(&self.services_prefix(), revision)
    }
}
