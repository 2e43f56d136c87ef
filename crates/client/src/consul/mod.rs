//! Service registration in Consul, as Nomad's client does it: the services of running
//! tasks (and of their groups) are registered with the local Consul agent and kept
//! there by a sync loop with anti-entropy.
//!
//! ```text
//!  task hook / alloc runner ──set/remove──► ServiceClient (desired registrations)
//!                                              │ wake (a change) or every sync_interval
//!                                              ▼
//!                          GET services + checks ─► compare ─► register / deregister
//! ```
//!
//! - **IDs** are berth's and deterministic: `_berth-task-<alloc>-<task>-<service>-<port>`
//!   (group services: `_berth-task-<alloc>-group-<group>-<service>-<port>`), so an agent
//!   restarted after `kill -9` registers the same IDs again, never duplicates; a service
//!   with berth's prefix that no running task wants (an orphan) is deregistered.
//! - **Anti-entropy**: each sync compares what berth wants with what Consul has (name,
//!   port, address, tags as a set, meta, `EnableTagOverride`, the checks) and fixes the
//!   difference. With `enable_tag_override`, a *periodic* sync first copies Consul's
//!   current tags into berth's registration, so tags edited in Consul by others are
//!   kept; a sync triggered by a change of berth's own (a task started again, a job
//!   updated) pushes berth's tags.
//! - **Failures** are retried with backoff (1 s × failures in a row, at most 30 s); tasks
//!   keep running, and `berth service list` shows the last error.
//!
//! The Consul agent's address and token come from the agent config's `consul` block.
//! The tests run against a double of Consul's HTTP API (`crates/testkit/src/consul.rs`):
//! Consul itself is not installed where berth is built.

pub mod api;
pub mod build;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use self::api::{AgentCheck, AgentService, ConsulApi, ConsulError, ServiceRegistration};
use crate::config::ConsulSettings;
use berth_cluster::services::ServiceRecord;
use berth_jobspec::ServiceProvider;

/// The template functions that read Consul (answered by the task runner's template
/// hook through [`api::ConsulApi`]).
pub const TEMPLATE_READS: &[&str] = &[
    "key",
    "keyExists",
    "keyOrDefault",
    "ls",
    "safeLs",
    "tree",
    "safeTree",
    "service",
    "services",
];

/// The prefix of every service ID berth registers: what it may deregister as an orphan.
pub const ID_PREFIX: &str = "_berth-";

/// The longest backoff between failed syncs.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The address services are registered with when they name none: the config's
/// `service_address`, or the node's address on its default route (found by a UDP
/// `connect`, which sends nothing), or loopback on a node without one.
pub fn service_address(settings: Option<&ConsulSettings>) -> String {
    if let Some(address) = settings.and_then(|s| s.service_address.clone()) {
        return address;
    }
    crate::node::default_route_address()
}

/// Who wants a registration: an alloc's task, or its group (`task: None`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Owner {
    pub alloc: String,
    pub task: Option<String>,
    /// The alloc's job, which Nomad's service catalog names with each instance.
    #[serde(default)]
    pub job: String,
}

impl Owner {
    /// The start of the IDs of its services (see [`build`]).
    fn id_prefix(&self) -> String {
        match &self.task {
            Some(task) => format!("{ID_PREFIX}task-{}-{task}-", self.alloc),
            None => format!("{ID_PREFIX}task-{}-group-", self.alloc),
        }
    }
}

/// Whether `id` may belong to a restored alloc's owner not heard from yet.
fn still_expected(id: &str, expected: &BTreeMap<String, BTreeSet<String>>) -> bool {
    expected.iter().any(|(alloc, heard)| {
        id.starts_with(&format!("{ID_PREFIX}task-{alloc}-"))
            && !heard.iter().any(|prefix| id.starts_with(prefix.as_str()))
    })
}

#[derive(Debug, Clone)]
struct Desired {
    owner: Owner,
    /// Consul's, or only in berth's list (provider "nomad").
    provider: ServiceProvider,
    registration: ServiceRegistration,
    /// Consul holds it as berth wants it, as of the last sync.
    in_sync: bool,
}

#[derive(Debug, Default)]
struct Registry {
    desired: BTreeMap<String, Desired>,
    /// IDs to deregister: services of stopped tasks.
    leaving: BTreeSet<String>,
    /// Allocs restored after an agent restart, with the ID prefixes of the owners
    /// (tasks, group) that have set or removed their services since: what Consul holds
    /// under the alloc's other prefixes is not an orphan yet.
    expected: BTreeMap<String, BTreeSet<String>>,
    failures: u32,
    last_error: Option<String>,
    last_sync: Option<SystemTime>,
}

/// One service as `berth service list` and `GET /v1/services` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    pub id: String,
    pub name: String,
    pub alloc: String,
    pub task: Option<String>,
    pub address: String,
    pub port: u16,
    pub tags: Vec<String>,
    /// "consul" or "nomad" (berth's own list).
    pub provider: String,
    /// "registered"; "pending" while Consul does not hold it as berth wants; "local"
    /// for berth's own list.
    pub state: String,
    /// The checks berth runs for it (a provider "nomad" service's): "passing", or the
    /// first failing one, "critical: ready"; `None` when berth runs none.
    #[serde(default)]
    pub checks: Option<String>,
}

/// What `GET /v1/services` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicesStatus {
    /// The Consul agent's address; `None` without a `consul` block.
    pub consul: Option<String>,
    pub services: Vec<ServiceView>,
    /// Failed syncs in a row, and the last failure.
    pub failures: u32,
    pub last_error: Option<String>,
    pub last_sync: Option<SystemTime>,
}

/// The desired registrations and the loop that keeps Consul in line with them.
pub struct ServiceClient {
    api: Option<ConsulApi>,
    interval: Duration,
    registry: Mutex<Registry>,
    wake: Notify,
    /// The cluster's catalog of provider "nomad" services, once the agent attaches it;
    /// without it (runners tested alone) the node's own list answers.
    catalog: std::sync::OnceLock<Catalog>,
    catalog_wake: Notify,
    /// Bumped on every change of the services a template may read (this node's, or
    /// the cluster's): what template watchers wait on.
    changes: tokio::sync::watch::Sender<u64>,
    /// The latest results of the checks berth runs itself (`checks`).
    checks: crate::checks::CheckResults,
    /// Bumped each time Consul is found to hold a registration as berth wants it: what
    /// a script check waits on before its first update.
    registered: tokio::sync::watch::Sender<u64>,
}

/// Why the cluster's service catalog could not be read.
#[derive(Debug, thiserror::Error)]
#[error("the cluster's service catalog cannot be read: {0}")]
pub struct CatalogReadError(#[from] berth_cluster::ClusterError);

/// The cluster's service catalog, and what this node's instances say of the node.
struct Catalog {
    cluster: Arc<berth_cluster::Cluster>,
    datacenter: String,
}

impl std::fmt::Debug for ServiceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceClient")
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl ServiceClient {
    /// A client of the Consul agent the settings name; `None`: no `consul` block, and
    /// no service is ever registered (submit refuses jobs that have consul services).
    pub fn new(
        settings: Option<&ConsulSettings>,
    ) -> Result<ServiceClient, crate::config::ConsulTokenError> {
        let Some(settings) = settings else {
            return Ok(ServiceClient::disabled());
        };
        let api = ConsulApi::new(settings.address.clone(), settings.token()?);
        Ok(ServiceClient {
            api: Some(api),
            interval: settings.sync_interval,
            ..ServiceClient::disabled()
        })
    }

    /// No Consul: services of provider "nomad" are listed, nothing is registered.
    pub fn disabled() -> ServiceClient {
        ServiceClient {
            api: None,
            interval: Duration::from_secs(30),
            registry: Mutex::default(),
            wake: Notify::new(),
            catalog: std::sync::OnceLock::new(),
            catalog_wake: Notify::new(),
            changes: tokio::sync::watch::Sender::new(0),
            checks: Default::default(),
            registered: tokio::sync::watch::Sender::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        self.api.is_some()
    }

    /// The ID of the group service `name` of `alloc`, once set.
    pub fn group_service_id(&self, alloc: &str, name: &str) -> Option<String> {
        self.registry
            .lock()
            .unwrap()
            .desired
            .iter()
            .find(|(_, d)| {
                d.owner.alloc == alloc && d.owner.task.is_none() && d.registration.name == name
            })
            .map(|(id, _)| id.clone())
    }

    /// The Consul agent's API, for the Connect hooks (tokens); `None` without Consul.
    pub fn api(&self) -> Option<&ConsulApi> {
        self.api.as_ref()
    }

    /// Restored allocs whose services are theirs until their runners set or remove them.
    pub fn expect_allocs(&self, allocs: impl IntoIterator<Item = String>) {
        let mut registry = self.registry.lock().unwrap();
        for alloc in allocs {
            registry.expected.entry(alloc).or_default();
        }
    }

    /// The registrations `owner` wants, replacing what it wanted before; a sync follows.
    pub fn set(&self, owner: Owner, registrations: Vec<(ServiceProvider, ServiceRegistration)>) {
        let mut registry = self.registry.lock().unwrap();
        if let Some(heard) = registry.expected.get_mut(&owner.alloc) {
            heard.insert(owner.id_prefix());
        }
        let wanted: BTreeSet<&str> = registrations.iter().map(|(_, r)| r.id.as_str()).collect();
        let gone: Vec<String> = registry
            .desired
            .iter()
            .filter(|(id, d)| d.owner == owner && !wanted.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(Desired {
                provider: ServiceProvider::Consul,
                ..
            }) = registry.desired.remove(&id)
            {
                registry.leaving.insert(id);
            }
        }
        for (provider, registration) in registrations {
            registry.leaving.remove(&registration.id);
            registry.desired.insert(
                registration.id.clone(),
                Desired {
                    owner: owner.clone(),
                    provider,
                    registration,
                    in_sync: false,
                },
            );
        }
        drop(registry);
        self.wake.notify_one();
        self.catalog_wake.notify_one();
        // With the cluster's catalog, watchers wake when the write lands there (its
        // watch), not before, when a render would read the old instances.
        if self.catalog.get().is_none() {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Everything `owner` registered goes; a sync follows.
    pub fn remove(&self, owner: &Owner) {
        self.set(owner.clone(), Vec::new());
    }

    /// The latest results of the checks berth runs itself.
    pub fn checks(&self) -> &crate::checks::CheckResults {
        &self.checks
    }

    /// Waits, at most `within`, until Consul holds the service whose check is
    /// `check_id` as berth wants it. A TTL check can only be updated once it is
    /// registered: Consul answers an earlier update with 404. `false`: not yet.
    pub async fn check_registered(&self, check_id: &str, within: Duration) -> bool {
        let mut changes = self.registered.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            changes.borrow_and_update();
            if self.holds_check(check_id) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .map_or(true, |changed| changed.is_err())
            {
                return self.holds_check(check_id);
            }
        }
    }

    /// Consul no longer has the service whose check is `check_id` (an update found no
    /// such check: Consul restarted, or someone deregistered it): it is registered
    /// again at once.
    pub fn check_missing(&self, check_id: &str) {
        let mut registry = self.registry.lock().unwrap();
        for wanted in registry.desired.values_mut() {
            if wanted
                .registration
                .checks
                .iter()
                .any(|c| c.check_id == check_id)
            {
                wanted.in_sync = false;
            }
        }
        drop(registry);
        self.wake.notify_one();
    }

    fn holds_check(&self, check_id: &str) -> bool {
        self.registry.lock().unwrap().desired.values().any(|d| {
            d.provider == ServiceProvider::Consul
                && d.in_sync
                && d.registration.checks.iter().any(|c| c.check_id == check_id)
        })
    }

    /// Everything an alloc registered (its tasks' and its group's) goes.
    pub fn remove_alloc(&self, alloc: &str) {
        self.checks.forget_alloc(alloc);
        self.registry.lock().unwrap().expected.remove(alloc);
        let owners: BTreeSet<Owner> = self
            .registry
            .lock()
            .unwrap()
            .desired
            .values()
            .filter(|d| d.owner.alloc == alloc)
            .map(|d| d.owner.clone())
            .collect();
        for owner in owners {
            self.remove(&owner);
        }
    }

    /// Mirrors this node's provider "nomad" services into the cluster's catalog, and
    /// reads that catalog for templates (start [`ServiceClient::run_catalog`] once
    /// restore is done).
    pub fn attach_catalog(&self, cluster: Arc<berth_cluster::Cluster>, datacenter: String) {
        let _ = self.catalog.set(Catalog {
            cluster,
            datacenter,
        });
    }

    /// A receiver that sees a change each time a service a template may read changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// This node's provider "nomad" instances, as the catalog holds them.
    fn nomad_records(&self, node_id: &str, datacenter: &str) -> BTreeMap<String, ServiceRecord> {
        let registry = self.registry.lock().unwrap();
        registry
            .desired
            .iter()
            .filter(|(_, d)| d.provider == ServiceProvider::Nomad)
            .map(|(id, d)| {
                let record = ServiceRecord {
                    id: id.clone(),
                    service_name: d.registration.name.clone(),
                    namespace: "default".into(),
                    node_id: node_id.to_string(),
                    datacenter: datacenter.to_string(),
                    job_id: d.owner.job.clone(),
                    alloc_id: d.owner.alloc.clone(),
                    tags: d.registration.tags.clone(),
                    address: d.registration.address.clone(),
                    port: d.registration.port,
                    ..ServiceRecord::default()
                };
                (id.clone(), record)
            })
            .collect()
    }

    /// The instances of service `name` of provider "nomad": the cluster's catalog, or,
    /// with none attached, this node's.
    pub fn nomad_service(&self, name: &str) -> Result<Vec<ServiceRecord>, CatalogReadError> {
        match self.catalog.get() {
            Some(catalog) => Ok(catalog.cluster.services_named(name)?),
            None => Ok(self
                .nomad_records("local", "dc1")
                .into_values()
                .filter(|r| r.service_name == name)
                .collect()),
        }
    }

    /// Every provider "nomad" service name with the tags of its instances.
    pub fn nomad_service_names(
        &self,
    ) -> Result<Vec<berth_cluster::services::ServiceName>, CatalogReadError> {
        match self.catalog.get() {
            Some(catalog) => Ok(catalog.cluster.service_names()?),
            None => {
                let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                for record in self.nomad_records("local", "dc1").into_values() {
                    names
                        .entry(record.service_name)
                        .or_default()
                        .extend(record.tags);
                }
                Ok(names
                    .into_iter()
                    .map(|(name, tags)| berth_cluster::services::ServiceName {
                        name,
                        tags: tags.into_iter().collect(),
                    })
                    .collect())
            }
        }
    }

    /// Keeps the cluster's catalog holding this node's provider "nomad" services: on
    /// every change, the difference is written (under the node's lease); the first
    /// pass also removes what a previous run of this node left there. Changes anyone
    /// makes to the catalog wake the template watchers.
    pub async fn run_catalog(self: Arc<Self>) {
        let Some(catalog) = self.catalog.get() else {
            return;
        };
        let cluster = catalog.cluster.clone();
        let datacenter = catalog.datacenter.clone();
        let node_id = cluster.node_id().to_string();
        // Others' changes: any write under the catalog's prefix.
        let mut watched = cluster.watch_services(0);
        let changes = self.changes.clone();
        tokio::spawn(async move {
            while watched.recv().await.is_some() {
                changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        let mut written: Option<Written> = None;
        loop {
            let desired = self.nomad_records(&node_id, &datacenter);
            let previous = written.take();
            let cluster = cluster.clone();
            let node = node_id.clone();
            let synced = tokio::task::spawn_blocking(move || {
                sync_catalog(&cluster, &node, previous, desired)
            })
            .await;
            match synced {
                Ok((now, Ok(()))) => written = now,
                Ok((now, Err(error))) => {
                    tracing::warn!(%error, "the cluster's service catalog could not be written; trying again");
                    written = now;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "the service catalog sync ended");
                    return;
                }
            }
            self.catalog_wake.notified().await;
        }
    }

    pub fn status(&self) -> ServicesStatus {
        let registry = self.registry.lock().unwrap();
        ServicesStatus {
            consul: self.api.as_ref().map(|api| api.address().to_string()),
            services: registry
                .desired
                .iter()
                .map(|(id, d)| ServiceView {
                    id: id.clone(),
                    name: d.registration.name.clone(),
                    alloc: d.owner.alloc.clone(),
                    task: d.owner.task.clone(),
                    address: d.registration.address.clone(),
                    port: d.registration.port,
                    tags: d.registration.tags.clone(),
                    provider: match d.provider {
                        ServiceProvider::Consul => "consul",
                        ServiceProvider::Nomad => "nomad",
                    }
                    .into(),
                    state: match (d.provider, d.in_sync) {
                        (ServiceProvider::Nomad, _) => "local",
                        (_, true) => "registered",
                        (_, false) => "pending",
                    }
                    .into(),
                    checks: self.checks.summary(
                        &d.owner.alloc,
                        &d.registration.name,
                        d.owner.task.as_deref(),
                    ),
                })
                .collect(),
            failures: registry.failures,
            last_error: registry.last_error.clone(),
            last_sync: registry.last_sync,
        }
    }

    /// Syncs at once, on every change, and every `sync_interval`; after a failure, again
    /// after a backoff. Runs for as long as the agent (start it once restore is done, so
    /// that the first sync does not take the restored tasks' services for orphans).
    pub async fn run(self: Arc<Self>) {
        if self.api.is_none() {
            return;
        }
        let mut next_periodic = tokio::time::Instant::now() + self.interval;
        let mut periodic = false;
        loop {
            let result = self.sync(periodic).await;
            let backoff = {
                let mut registry = self.registry.lock().unwrap();
                match result {
                    Ok(()) => {
                        registry.failures = 0;
                        registry.last_error = None;
                        registry.last_sync = Some(SystemTime::now());
                        None
                    }
                    Err(error) => {
                        registry.failures = registry.failures.saturating_add(1);
                        let backoff = (Duration::from_secs(1) * registry.failures).min(MAX_BACKOFF);
                        tracing::warn!(
                            %error,
                            failures = registry.failures,
                            retry_in = ?backoff,
                            "syncing services with Consul failed"
                        );
                        registry.last_error = Some(error.to_string());
                        Some(backoff)
                    }
                }
            };
            periodic = match backoff {
                Some(backoff) => {
                    tokio::time::sleep(backoff).await;
                    false
                }
                None => tokio::select! {
                    _ = self.wake.notified() => false,
                    _ = tokio::time::sleep_until(next_periodic) => true,
                },
            };
            if periodic {
                next_periodic = tokio::time::Instant::now() + self.interval;
            }
        }
    }

    /// One pass of anti-entropy. `periodic`: a timed sync, which keeps tags edited in
    /// Consul for services with `enable_tag_override`.
    async fn sync(&self, periodic: bool) -> Result<(), ConsulError> {
        let Some(api) = &self.api else {
            return Ok(());
        };
        let services = api.services().await?;
        let checks = api.checks().await?;
        let (desired, leaving, expected) = {
            let mut registry = self.registry.lock().unwrap();
            if periodic {
                for (id, wanted) in registry.desired.iter_mut() {
                    let registration = &mut wanted.registration;
                    if let Some(theirs) = services.get(id)
                        && registration.enable_tag_override
                    {
                        registration.tags = theirs.tags.clone().unwrap_or_default();
                    }
                }
            }
            let desired: Vec<ServiceRegistration> = registry
                .desired
                .values()
                .filter(|d| d.provider == ServiceProvider::Consul)
                .map(|d| d.registration.clone())
                .collect();
            (desired, registry.leaving.clone(), registry.expected.clone())
        };
        // A Connect service's sidecar is Consul's doing, and wanted with it.
        let sidecars: Vec<String> = desired
            .iter()
            .filter(|r| r.connect.is_some())
            .map(|r| sidecar_id(&r.id))
            .collect();
        let wanted: BTreeSet<&str> = desired
            .iter()
            .map(|r| r.id.as_str())
            .chain(sidecars.iter().map(String::as_str))
            .collect();
        // Stopped tasks' services, and orphans of berth's an earlier agent left.
        let mut first_error = None;
        let mut failed = BTreeSet::new();
        for id in services.keys() {
            let orphan = id.starts_with(ID_PREFIX)
                && !wanted.contains(id.as_str())
                && !still_expected(id, &expected);
            if (orphan || leaving.contains(id))
                && let Err(error) = api.deregister(id).await
            {
                failed.insert(id.clone());
                first_error.get_or_insert(error);
            }
        }
        {
            // Gone from Consul now (or never there): no longer leaving. Those set to
            // leave during this sync stay for the next.
            let mut registry = self.registry.lock().unwrap();
            registry
                .leaving
                .retain(|id| !leaving.contains(id) || failed.contains(id));
        }
        for registration in &desired {
            let sidecar_missing = registration.connect.is_some()
                && !services.contains_key(&sidecar_id(&registration.id));
            if !sidecar_missing && !differs(services.get(&registration.id), registration, &checks) {
                self.mark_in_sync(registration);
                continue;
            }
            match api.register(registration).await {
                Ok(()) => self.mark_in_sync(registration),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Marks `registration` as held by Consul, unless it changed since the sync read it.
    fn mark_in_sync(&self, registration: &ServiceRegistration) {
        let mut registry = self.registry.lock().unwrap();
        if let Some(wanted) = registry.desired.get_mut(&registration.id)
            && wanted.registration == *registration
            && !wanted.in_sync
        {
            wanted.in_sync = true;
            self.registered.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// The ID Consul gives a Connect service's sidecar proxy service, which the Envoy
/// bootstrap names with `-proxy-id`.
pub fn sidecar_id(service_id: &str) -> String {
    format!("{service_id}-sidecar-proxy")
}

/// Whether Consul's copy (`theirs`, with the agent's checks) differs from berth's.
fn differs(
    theirs: Option<&AgentService>,
    ours: &ServiceRegistration,
    checks: &BTreeMap<String, AgentCheck>,
) -> bool {
    let Some(theirs) = theirs else {
        return true;
    };
    let set = |tags: &[String]| tags.iter().cloned().collect::<BTreeSet<String>>();
    let their_tags = theirs.tags.clone().unwrap_or_default();
    let their_meta = theirs.meta.clone().unwrap_or_default();
    theirs.service != ours.name
        || theirs.port != ours.port
        || theirs.address != ours.address
        || set(&their_tags) != set(&ours.tags)
        || their_meta != ours.meta
        || theirs.enable_tag_override != ours.enable_tag_override
        || ours.checks.iter().any(|check| {
            checks
                .get(&check.check_id)
                .is_none_or(|c| c.service_id != ours.id)
        })
}

/// What this node has written to the cluster's catalog: by service ID, its key and
/// record.
type Written = BTreeMap<String, (String, ServiceRecord)>;

/// Writes `desired` over what was `written` (all of this node's records in the store
/// when `None`: the first pass). Answers what is known to be written now (`None`: not
/// known), and whether every write went through.
fn sync_catalog(
    cluster: &berth_cluster::Cluster,
    node_id: &str,
    written: Option<Written>,
    desired: BTreeMap<String, ServiceRecord>,
) -> (Option<Written>, Result<(), berth_cluster::ClusterError>) {
    let mut written = match written {
        Some(written) => written,
        None => match cluster.all_services() {
            Ok((records, _)) => records
                .into_iter()
                .filter(|r| r.node_id == node_id)
                .map(|r| (r.id.clone(), (cluster.service_key(&r), r)))
                .collect(),
            Err(error) => return (None, Err(error)),
        },
    };
    let gone: Vec<(String, String)> = written
        .iter()
        .filter(|(id, (_, record))| desired.get(*id) != Some(record))
        .map(|(id, (key, _))| (id.clone(), key.clone()))
        .collect();
    for (id, key) in gone {
        if let Err(error) = cluster.remove_service(&key) {
            return (Some(written), Err(error));
        }
        written.remove(&id);
    }
    for (id, record) in desired {
        if written.contains_key(&id) {
            continue;
        }
        if let Err(error) = cluster.put_service(&record) {
            return (Some(written), Err(error));
        }
        written.insert(id, (cluster.service_key(&record), record));
    }
    (Some(written), Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_allocs_services_are_no_orphans_until_their_owner_is_heard_from() {
        let client = ServiceClient::disabled();
        client.expect_allocs(["a1".to_string()]);
        let expected = || client.registry.lock().unwrap().expected.clone();
        let web = "_berth-task-a1-web-shop-http";
        let api = "_berth-task-a1-api-api-9001";
        let group = "_berth-task-a1-group-g-count-api-9001-sidecar-proxy";
        for id in [web, api, group] {
            assert!(still_expected(id, &expected()), "{id}");
        }
        // Another alloc's services are not protected.
        assert!(!still_expected("_berth-task-a2-web-shop-http", &expected()));
        // Once task "web" has said what it wants, what else Consul holds under its
        // prefix is an orphan; the others are still expected.
        client.set(
            Owner {
                alloc: "a1".into(),
                task: Some("web".into()),
                job: "shop".into(),
            },
            Vec::new(),
        );
        assert!(!still_expected(web, &expected()));
        assert!(still_expected(api, &expected()));
        assert!(still_expected(group, &expected()));
        // The alloc's end ends every expectation.
        client.remove_alloc("a1");
        assert!(!still_expected(api, &expected()));
    }
}
