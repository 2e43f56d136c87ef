//! The cluster store: berth agents sharing one etcd prefix are one cluster. Each agent
//! registers its node under a lease it keeps alive (a node whose lease expired is down),
//! and the catalog (volumes, claims, plugin providers) lives in etcd, claims as
//! compare-and-swap transactions ([`catalog::EtcdCatalog`]).
//!
//! Keys under the prefix `P` (one berth cluster per prefix):
//!
//! | key | value | lease |
//! |---|---|---|
//! | `P/meta/cluster-id` | the cluster's id, written by the first agent | none |
//! | `P/meta/schema` | the layout version of these keys ([`SCHEMA`]) | none |
//! | `P/nodes/<node id>` | [`NodeRecord`] JSON | the node's |
//! | `P/names/<node name>` | the id of the live node with that name | the node's |
//! | `P/volumes/<volume id>` | the volume and its claims, JSON | none |
//! | `P/plugins/<plugin id>/<kind>/<alloc id>` | a plugin provider, JSON | its node's |
//! | `P/jobs/<job id>` | [`state::ClusterJob`] JSON | none |
//! | `P/allocs/<node id>/<alloc id>` | a [`state::Placement`] | none |
//! | `P/status/<alloc id>` | its node's [`state::AllocReport`] | none |
//! | `P/blocked/<job id>` | what could not be placed ([`state::Blocked`]) | none |
//! | `P/evals/<eval id>` | an [`evals::Evaluation`], written with its job's change | none |
//!
//! An agent remembers the cluster it joined (`<data_dir>/cluster-id`): a prefix that
//! holds another cluster's id is refused, as is a layout written by a newer berth.

pub mod calls;
pub mod catalog;
pub mod embedded;
pub mod etcd;
pub mod etcd_access;
pub mod evals;
pub mod job_view;
pub mod keyring;
pub mod lost_claims;
pub mod pace;
mod parsed;
mod records;
pub mod relay;
pub mod scheduler;
pub mod services;
pub mod state;
pub mod store;
pub mod typed;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use berth_model::cluster::ClusterSettings;
use etcd::{Condition, Etcd, EtcdError, Write};
use etcd_access::{AccessFileError, EtcdAccess};
use store::{KeptLease, Store};

/// The layout of berth's keys in etcd this build writes and reads.
pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Store(#[from] EtcdError),
    #[error(
        "the prefix {prefix:?} in etcd holds cluster {found}, but this agent belongs to \
         cluster {ours} (recorded in {file}): two clusters cannot share a prefix; set \
         another `prefix` in the cluster block, or remove {file} to join cluster {found}"
    )]
    OtherCluster {
        prefix: String,
        found: String,
        ours: String,
        file: String,
    },
    #[error(
        "the prefix {prefix:?} in etcd was written by a newer berth (layout version \
         {found}; this berth reads version {ours}): upgrade this agent"
    )]
    NewerSchema {
        prefix: String,
        found: String,
        ours: u32,
    },
    #[error(transparent)]
    AccessFile(#[from] AccessFileError),
    #[error(
        "another live node of this cluster is named {name:?} (node id {other}): node names \
         must be unique in a cluster, since CSI claims and calls between nodes go by name; \
         set another `name` in this agent's config (if that node is this machine with a \
         new data dir, it is gone once its lease expires)"
    )]
    NameTaken { name: String, other: String },
    #[error("{0}")]
    Local(String),
}

/// A node as the cluster sees it: what it is, what it runs with, what it has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: String,
    pub name: String,
    pub datacenter: String,
    #[serde(default)]
    pub node_pool: String,
    #[serde(default)]
    pub node_class: String,
    /// The agent's HTTP API, when it listens on TCP.
    #[serde(default)]
    pub http_addr: Option<String>,
    /// Nomad's attributes from fingerprinting (`attr.kernel.name`, …).
    #[serde(default)]
    pub attributes: std::collections::BTreeMap<String, String>,
    /// Loaded drivers by name, with whether they are healthy.
    #[serde(default)]
    pub drivers: std::collections::BTreeMap<String, bool>,
    #[serde(default)]
    pub host_volumes: Vec<String>,
    /// Where each host volume is on the node, and whether it is read-only (Nomad's
    /// `ClientHostVolumeConfig`). Records of an older berth have names only.
    #[serde(default)]
    pub host_volume_paths: std::collections::BTreeMap<String, HostVolumePath>,
    /// `eligible` or `ineligible` (for new placements).
    #[serde(default = "eligible")]
    pub eligibility: String,
    /// Draining: allocs are moved off, new ones refused.
    #[serde(default)]
    pub drain: bool,
    /// Total CPU (MHz), memory (MiB) and disk (MB, its data dir's filesystem; 0 in
    /// records of an older berth: not counted) of the node; allocs are placed against
    /// these less `reserved` ([`NodeRecord::available`]).
    #[serde(default)]
    pub cpu_mhz: u64,
    #[serde(default)]
    pub memory_mb: u64,
    #[serde(default)]
    pub disk_mb: u64,
    /// What the operator keeps for the node itself (`reserved` in its config).
    #[serde(default)]
    pub reserved: berth_model::limits::NodeResources,
    /// The host ports no alloc gets here (`reserved { reserved_ports }`), as inclusive
    /// ranges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_ports: Vec<(u16, u16)>,
    /// When the agent registered (ms since the epoch).
    #[serde(default)]
    pub registered_ms: u64,
}

/// A host volume's place on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostVolumePath {
    pub path: String,
    pub read_only: bool,
}

impl NodeRecord {
    /// What the node has in all.
    pub fn totals(&self) -> berth_model::limits::NodeResources {
        berth_model::limits::NodeResources {
            cpu_mhz: self.cpu_mhz,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
        }
    }

    /// Whether the operator keeps `port` from allocs on this node.
    pub fn reserves_port(&self, port: u16) -> bool {
        self.reserved_ports
            .iter()
            .any(|(first, last)| (*first..=*last).contains(&port))
    }

    /// What allocs may be placed against: the node's totals less what it reserves.
    pub fn available(&self) -> berth_model::limits::NodeResources {
        berth_model::limits::NodeResources {
            cpu_mhz: self.cpu_mhz.saturating_sub(self.reserved.cpu_mhz),
            memory_mb: self.memory_mb.saturating_sub(self.reserved.memory_mb),
            disk_mb: self.disk_mb.saturating_sub(self.reserved.disk_mb),
        }
    }
}

fn eligible() -> String {
    "eligible".into()
}

/// A node with whether its lease is alive.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    pub record: NodeRecord,
    /// `ready` while its lease lives, `down` after (its key is then gone, and the node
    /// is known only from the allocs and claims that name it).
    pub status: &'static str,
}

/// This agent's membership of a cluster.
pub struct Cluster {
    store: Store,
    settings: ClusterSettings,
    node_id: String,
    node_name: String,
    lease: KeptLease,
    cluster_id: String,
    /// The keys this node writes under its lease (its node record, its plugin
    /// providers), with their values: written again under a new lease when etcd lost
    /// the old one.
    owned: Arc<std::sync::Mutex<BTreeMap<String, Vec<u8>>>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("prefix", &self.settings.prefix)
            .field("cluster_id", &self.cluster_id)
            .finish()
    }
}

impl Cluster {
    /// Connects, checks that the prefix is this agent's cluster (or makes it so), and
    /// registers `node` under a lease kept alive from now on.
    pub fn join(
        settings: &ClusterSettings,
        data_dir: &Path,
        node: NodeRecord,
    ) -> Result<Arc<Cluster>, ClusterError> {
        let access = EtcdAccess::from_settings(settings)?;
        let store = Store::from(Etcd::connect(&access)?);
        Cluster::join_store(store, settings, data_dir, node)
    }

    /// Joins the cluster kept in `store` (store's, or a lone agent's embedded one).
    pub fn join_store(
        store: Store,
        settings: &ClusterSettings,
        data_dir: &Path,
        node: NodeRecord,
    ) -> Result<Arc<Cluster>, ClusterError> {
        let cluster_id = store.block({
            let store = store.clone();
            let prefix = settings.prefix.clone();
            async move { claim_prefix(&store, &prefix).await }
        })?;
        // A lone agent's own store is no cluster it could be mistaken for: the file is
        // what keeps a member off another cluster's prefix in etcd.
        if !store.is_embedded() {
            check_cluster_file(&data_dir.join("cluster-id"), &settings.prefix, &cluster_id)?;
        }
        let owned: Arc<std::sync::Mutex<BTreeMap<String, Vec<u8>>>> = Arc::default();
        let lease = store.block({
            let store = store.clone();
            let ttl = settings.heartbeat_ttl;
            let owned = owned.clone();
            async move {
                let again = store.clone();
                let lease = KeptLease::start(&store, ttl, move |lease| {
                    let store = again.clone();
                    let keys = owned.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    Box::pin(async move {
                        for (key, value) in keys {
                            let _ = store.put(&key, value, lease).await;
                        }
                    })
                })
                .await?;
                Ok::<_, EtcdError>(lease)
            }
        })?;
        let cluster = Cluster {
            store,
            settings: settings.clone(),
            node_id: node.id.clone(),
            node_name: node.name.clone(),
            lease,
            cluster_id,
            owned,
        };
        cluster.claim_name()?;
        cluster.put_node(&node)?;
        Ok(Arc::new(cluster))
    }

    /// Takes this node's name for as long as its lease lives, or refuses when another
    /// live node has it: a CSI claim's holder and a call's addressee are named by it,
    /// so two nodes of one name would judge (and detach) each other's claims.
    fn claim_name(&self) -> Result<(), ClusterError> {
        let key = self.key(&["names", &self.node_name]);
        let id = self.node_id.clone().into_bytes();
        let lease = self.lease();
        let store = self.store.clone();
        let (name_key, ours) = (key.clone(), id.clone());
        // Free, or already this node's (this agent restarted before its old lease ran
        // out). Tried again when the holder went between the two looks.
        let taken = self.store.block(async move {
            let put = || {
                vec![Write::Put {
                    key: name_key.clone(),
                    value: ours.clone(),
                    lease,
                }]
            };
            for _ in 0..3 {
                let free = vec![Condition::ModRevision(name_key.clone(), 0)];
                let mine = vec![Condition::ValueIs(name_key.clone(), ours.clone())];
                if store.transaction(free, put()).await? || store.transaction(mine, put()).await? {
                    return Ok::<_, EtcdError>(None);
                }
                if let Some(holder) = store.get(&name_key).await? {
                    return Ok(Some(String::from_utf8_lossy(&holder.value).into_owned()));
                }
            }
            Ok(Some("unknown".to_string()))
        })?;
        if let Some(other) = taken {
            return Err(ClusterError::NameTaken {
                name: self.node_name.clone(),
                other,
            });
        }
        // Kept with the node's other keys: written again under a renewed lease.
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, id);
        Ok(())
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether this is a lone agent's one-node cluster (the embedded store).
    pub fn is_lone(&self) -> bool {
        self.store.is_embedded()
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// This node's name: how claims and plugin providers name it.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The lease this node's keys are written under (it changes when etcd lost the old
    /// one and the node registered again).
    pub fn lease(&self) -> i64 {
        self.lease.id()
    }

    pub fn key(&self, parts: &[&str]) -> String {
        key(&self.settings.prefix, parts)
    }

    /// Writes this node's record (what it is and has).
    pub fn put_node(&self, node: &NodeRecord) -> Result<(), ClusterError> {
        let value = serde_json::to_vec(node).map_err(|e| ClusterError::Local(e.to_string()))?;
        self.put_owned(self.key(&["nodes", &node.id]), value)
    }

    /// Writes a key that lives as long as this node's lease.
    pub fn put_owned(&self, key: String, value: Vec<u8>) -> Result<(), ClusterError> {
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), value.clone());
        let lease = self.lease();
        let store = self.store.clone();
        self.store
            .block(async move { store.put(&key, value, lease).await })?;
        Ok(())
    }

    pub fn remove_owned(&self, key: &str) -> Result<(), ClusterError> {
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        let store = self.store.clone();
        let key = key.to_string();
        self.store.block(async move { store.delete(&key).await })?;
        Ok(())
    }

    /// Every live node (down nodes' keys are gone with their leases), by name.
    pub fn nodes(&self) -> Result<Vec<NodeView>, ClusterError> {
        let prefix = format!("{}/", self.key(&["nodes"]));
        let store = self.store.clone();
        let (entries, _) = self.store.block(async move { store.list(&prefix).await })?;
        let mut nodes: Vec<NodeView> = entries
            .iter()
            .filter_map(|entry| serde_json::from_slice::<NodeRecord>(&entry.value).ok())
            .map(|record| NodeView {
                record,
                status: "ready",
            })
            .collect();
        nodes.sort_by(|a, b| a.record.name.cmp(&b.record.name));
        Ok(nodes)
    }

    /// The store's revision: the index of Nomad's blocking queries in a cluster.
    pub fn revision(&self) -> Result<i64, ClusterError> {
        let store = self.store.clone();
        let key = self.key(&["meta", "cluster-id"]);
        Ok(self
            .store
            .block(async move { store.revision(&key).await })?)
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `P/a/b` from the prefix and the parts (each part is one key segment).
pub fn key(prefix: &str, parts: &[&str]) -> String {
    let mut key = prefix.to_string();
    for part in parts {
        key.push('/');
        key.push_str(part);
    }
    key
}

/// The cluster id under `prefix`: the one there, or a new one written by this agent (a
/// transaction, so two agents starting at once agree on one). Refuses a layout version
/// newer than this build's.
async fn claim_prefix(store: &Store, prefix: &str) -> Result<String, ClusterError> {
    let id_key = key(prefix, &["meta", "cluster-id"]);
    let schema_key = key(prefix, &["meta", "schema"]);
    let fresh = random_id();
    store
        .transaction(
            vec![Condition::ModRevision(id_key.clone(), 0)],
            vec![
                Write::Put {
                    key: id_key.clone(),
                    value: fresh.clone().into_bytes(),
                    lease: 0,
                },
                Write::Put {
                    key: schema_key.clone(),
                    value: SCHEMA.to_string().into_bytes(),
                    lease: 0,
                },
            ],
        )
        .await?;
    let found = store
        .get(&schema_key)
        .await?
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .unwrap_or_default();
    if found.trim().parse::<u32>().map_or(true, |v| v > SCHEMA) {
        return Err(ClusterError::NewerSchema {
            prefix: prefix.to_string(),
            found,
            ours: SCHEMA,
        });
    }
    let id = store
        .get(&id_key)
        .await?
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .unwrap_or(fresh);
    Ok(id)
}

/// Records the cluster this agent joined, or refuses another one.
fn check_cluster_file(file: &Path, prefix: &str, found: &str) -> Result<(), ClusterError> {
    match std::fs::read_to_string(file) {
        Ok(ours) if ours.trim() == found => Ok(()),
        Ok(ours) => Err(ClusterError::OtherCluster {
            prefix: prefix.to_string(),
            found: found.to_string(),
            ours: ours.trim().to_string(),
            file: file.display().to_string(),
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(file, format!("{found}\n")).map_err(|e| {
                ClusterError::Local(format!(
                    "cannot record the cluster id in {}: {e}",
                    file.display()
                ))
            })
        }
        Err(error) => Err(ClusterError::Local(format!(
            "cannot read {}: {error}",
            file.display()
        ))),
    }
}

/// A random UUID (version 4), as Nomad's ids look.
pub fn random_id() -> String {
    let mut bytes = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// This node's id in the cluster, kept in the data dir (several agents on one machine
/// are several nodes, so the machine id cannot be it).
pub fn node_id(data_dir: &Path) -> Result<String, ClusterError> {
    let file = data_dir.join("node-id");
    match std::fs::read_to_string(&file) {
        Ok(id) if is_uuid(id.trim()) => Ok(id.trim().to_string()),
        Ok(_) => Err(ClusterError::Local(format!(
            "{} does not hold a node id (a UUID); remove it to make a new one",
            file.display()
        ))),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let id = random_id();
            std::fs::write(&file, format!("{id}\n")).map_err(|e| {
                ClusterError::Local(format!(
                    "cannot record the node id in {}: {e}",
                    file.display()
                ))
            })?;
            Ok(id)
        }
        Err(error) => Err(ClusterError::Local(format!(
            "cannot read {}: {error}",
            file.display()
        ))),
    }
}

pub fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_secure;
#[cfg(test)]
mod typed_tests;
