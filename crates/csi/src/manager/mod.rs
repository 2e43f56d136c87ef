//! The CSI manager: follows the plugin registry (subscribed, so it hears of a plugin
//! the moment it registers), fingerprints each plugin, keeps the catalog's plugin view
//! current, and mounts volumes for allocs.
//!
//! Mounting a volume for an alloc, with the volume's operations serialised:
//!
//! ```text
//!   ControllerPublishVolume  once per volume on this node (controller has PUBLISH_UNPUBLISH)
//!   NodeStageVolume          once per volume and usage (node has STAGE_UNSTAGE)
//!   NodePublishVolume        once per alloc
//! ```
//!
//! Unmounting walks back: NodeUnpublish, then NodeUnstage when no alloc uses the stage
//! any more, then ControllerUnpublish when no stage is left. Which allocs use which
//! stage is persisted ([`RecordTable::CsiUsage`]) before and after each step, so after an
//! agent restart an unstage never pulls a volume from under a live alloc.
//!
//! Every one of those RPCs is preceded by a durable [`Intent`] in the same record and
//! followed by its outcome. A crash between the two leaves the intent: before anything
//! else is done with the volume (a mount, an unmount, the reconcile when its plugin turns
//! healthy), the intent is resolved with the idempotent call that undoes a half-done
//! mount step or finishes a half-done release step, so no crash point leaves a mount
//! berth does not know of, or an unstage under a publication it did not record.

mod controller;
mod fingerprint;
mod route;
#[cfg(test)]
mod tests;
mod topology;
mod volumes;

pub use route::{ControllerAnswer, ControllerRequest, RemoteCall, RemoteControllers};
pub use volumes::UsageListener;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::broadcast;

use crate::client::CsiError;
use crate::host_mounts::{HostMounts, RealMounts};
use crate::plugin::{CsiPlugin, GrpcConnector, PluginConnector};
use crate::registry::{PluginRegistration, PluginRegistry, PluginUnavailable, RegistryEvent};
use berth_model::csi::{CsiSettings, Fingerprint, PluginKind};
use berth_state::catalog::{Catalog, PluginProvider};
use berth_state::{StateError, StateStore};

/// Why mounting, unmounting or creating a volume failed, in words a person can act on.
#[derive(Debug, thiserror::Error)]
pub enum CsiVolumeError {
    #[error(transparent)]
    Rpc(#[from] CsiError),
    #[error(transparent)]
    PluginUnavailable(#[from] PluginUnavailable),
    #[error("fingerprinting CSI plugin {plugin:?}: {reason}")]
    Fingerprint { plugin: String, reason: String },
    #[error("{action} the usage of volume {volume:?}: {source}")]
    Usage {
        action: &'static str,
        volume: String,
        source: StateError,
    },
    #[error("creating {}: {source}", path.display())]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "CSI plugin {plugin:?} said it published volume {volume:?} at {}, but nothing is mounted at {} \
         on the host: does the plugin task mount its stage_publish_base_dir with \
         bidirectional propagation?",
        plugin_path.display(),
        host_path.display()
    )]
    NotPropagated {
        plugin: String,
        volume: String,
        plugin_path: PathBuf,
        host_path: PathBuf,
    },
    #[error("{source}; volume {volume:?} stays mounted for alloc {alloc} until the plugin is back")]
    StaysMounted {
        volume: String,
        alloc: String,
        source: Box<CsiVolumeError>,
    },
    /// A controller on another node failed the operation, or could not be reached.
    #[error("{message}{}", if node.is_empty() { String::new() } else { format!(" (the plugin's controller runs on node {node:?})") })]
    Remote { node: String, message: String },
    #[error("{0} (creating a volume needs the plugin's controller)")]
    NeedsController(Box<CsiVolumeError>),
    #[error(
        "no controller of CSI plugin {plugin:?} runs in the cluster to unpublish volume \
         {volume:?} from lost node {node_id:?}: its claim is kept until one runs"
    )]
    NoControllerToUnpublish {
        plugin: String,
        volume: String,
        node_id: String,
    },
    #[error(
        "CSI plugin {plugin:?} cannot create volumes (its controller lacks CREATE_DELETE_VOLUME); \
         register an existing one with `berth volume register`"
    )]
    CannotCreate { plugin: String },
    #[error(
        "CSI plugin {plugin:?} cannot delete volumes (its controller lacks \
         CREATE_DELETE_VOLUME); deregister it with `berth volume deregister` and remove it \
         where the storage lives"
    )]
    CannotDelete { plugin: String },
    #[error(
        "volume {volume:?} is still staged or published on this node (an alloc is giving \
         it back); delete it once it is released"
    )]
    StillInUse { volume: String },
    #[error(
        "CSI plugin {plugin:?} cannot {what} (its controller lacks {capability}); volume \
         {volume:?} is unchanged"
    )]
    Lacks {
        plugin: String,
        volume: String,
        what: &'static str,
        capability: &'static str,
    },
    #[error(
        "volume {volume:?} is accessible from {accessible} only, and CSI plugin {plugin:?} \
         puts this node at {node}"
    )]
    NotAccessible {
        volume: String,
        plugin: String,
        accessible: String,
        node: String,
    },
    #[error("unmounting {} for volume {volume:?}: {source}", path.display())]
    Unmount {
        volume: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "volume {volume:?} has {current} bytes and asks for {wanted}: CSI volumes are \
         expanded, never shrunk"
    )]
    Shrink {
        volume: String,
        current: i64,
        wanted: i64,
    },
    #[error(
        "volume {volume:?} is staged on this node as {staged} for other allocs, and \
         {wanted} needs another stage; a volume has one staging path per node, so it can be \
         used {wanted} only once those allocs have stopped"
    )]
    StagedOtherwise {
        volume: String,
        staged: String,
        wanted: String,
    },
}

/// A plugin handle, and the provider (alloc and socket) it was made for.
struct Connected {
    alloc_id: String,
    socket: PathBuf,
    plugin: Arc<dyn CsiPlugin>,
}

pub struct CsiManager {
    registry: Arc<PluginRegistry>,
    store: Arc<StateStore>,
    catalog: Arc<dyn Catalog>,
    node_name: String,
    settings: CsiSettings,
    /// Makes the plugin handles below: gRPC clients in the agent, a fake in unit tests.
    connector: Box<dyn PluginConnector>,
    /// Where the manager checks that a plugin's mounts reached the host.
    mounts: Arc<dyn HostMounts>,
    fingerprints: Mutex<BTreeMap<(PluginKind, String), (String, Fingerprint)>>,
    /// One connection per plugin provider (its alloc and socket), reused by every
    /// operation: a new HTTP/2 connection per call would cost more than the call.
    clients: Mutex<BTreeMap<(PluginKind, String), Connected>>,
    volume_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Controllers on other nodes, in a cluster.
    remote: OnceLock<Arc<dyn RemoteControllers>>,
    usage_listener: OnceLock<volumes::UsageListener>,
}

impl CsiManager {
    pub fn new(
        registry: Arc<PluginRegistry>,
        store: Arc<StateStore>,
        catalog: Arc<dyn Catalog>,
        node_name: String,
        settings: CsiSettings,
        metrics: berth_telemetry::Metrics,
    ) -> Arc<CsiManager> {
        let connector = Box::new(GrpcConnector {
            timeouts: settings.timeouts,
            metrics,
        });
        CsiManager::with_seams(
            registry,
            store,
            catalog,
            node_name,
            settings,
            connector,
            Arc::new(RealMounts),
        )
    }

    /// A manager that reaches its plugins through `connector` and checks their mounts in
    /// `mounts` ([`CsiManager::new`] gives the agent's: gRPC and the host's table).
    pub fn with_seams(
        registry: Arc<PluginRegistry>,
        store: Arc<StateStore>,
        catalog: Arc<dyn Catalog>,
        node_name: String,
        settings: CsiSettings,
        connector: Box<dyn PluginConnector>,
        mounts: Arc<dyn HostMounts>,
    ) -> Arc<CsiManager> {
        Arc::new(CsiManager {
            registry,
            store,
            catalog,
            node_name,
            settings,
            connector,
            mounts,
            fingerprints: Mutex::default(),
            clients: Mutex::default(),
            volume_locks: Mutex::default(),
            remote: OnceLock::new(),
            usage_listener: OnceLock::new(),
        })
    }

    pub fn settings(&self) -> CsiSettings {
        self.settings.clone()
    }

    /// Brings the catalog's plugin view in line with the registry, then follows the
    /// registry's updates for as long as the agent runs.
    pub fn start(self: &Arc<Self>) {
        let events = self.registry.subscribe();
        if let Ok(plugins) = self.catalog.plugins() {
            for plugin in plugins {
                // Other nodes' providers (in a cluster's catalog) are theirs to keep.
                for provider in plugin
                    .providers
                    .into_iter()
                    .filter(|p| p.node == self.node_name)
                {
                    let current = self
                        .registry
                        .get(provider.kind, &provider.plugin_id)
                        .is_some_and(|r| r.alloc_id == provider.alloc_id);
                    if !current {
                        let _ = self.catalog.remove_plugin_provider(
                            &provider.plugin_id,
                            provider.kind,
                            &provider.alloc_id,
                        );
                    }
                }
            }
        }
        for plugin in self.registry.list() {
            self.publish_provider(&plugin);
        }
        tokio::spawn(self.clone().follow(events));
    }

    async fn follow(self: Arc<Self>, mut events: broadcast::Receiver<RegistryEvent>) {
        loop {
            match events.recv().await {
                Ok(RegistryEvent::Updated(plugin)) => {
                    if plugin.healthy {
                        self.fingerprint(&plugin).await;
                        if plugin.kind == PluginKind::Node {
                            tokio::spawn(self.clone().reconcile(plugin.clone()));
                        }
                    }
                    self.publish_provider(&plugin);
                }
                Ok(RegistryEvent::Removed { kind, id, alloc_id }) => {
                    self.fingerprints
                        .lock()
                        .unwrap()
                        .remove(&(kind, id.clone()));
                    self.clients.lock().unwrap().remove(&(kind, id.clone()));
                    if let Err(error) = self.catalog.remove_plugin_provider(&id, kind, &alloc_id) {
                        tracing::error!(plugin = %id, %error, "removing the plugin from the catalog");
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "the CSI manager fell behind the plugin registry; resyncing"
                    );
                    for plugin in self.registry.list() {
                        self.publish_provider(&plugin);
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn publish_provider(&self, plugin: &PluginRegistration) {
        let provider = PluginProvider {
            plugin_id: plugin.id.clone(),
            kind: plugin.kind,
            alloc_id: plugin.alloc_id.clone(),
            node: self.node_name.clone(),
            healthy: plugin.healthy,
            health: plugin.health.clone(),
            fingerprint: self.fingerprint_of(plugin),
        };
        if let Err(error) = self.catalog.put_plugin_provider(provider) {
            tracing::error!(plugin = %plugin.id, %error, "recording the plugin in the catalog");
        }
    }

    /// The handle of the plugin's current provider (a new one when the provider or its
    /// socket changed).
    pub fn client(&self, plugin: &PluginRegistration) -> Arc<dyn CsiPlugin> {
        let mut clients = self.clients.lock().unwrap();
        let key = (plugin.kind, plugin.id.clone());
        if let Some(known) = clients.get(&key)
            && known.alloc_id == plugin.alloc_id
            && known.socket == plugin.socket
        {
            return known.plugin.clone();
        }
        let client = self.connector.connect(plugin);
        clients.insert(
            key,
            Connected {
                alloc_id: plugin.alloc_id.clone(),
                socket: plugin.socket.clone(),
                plugin: client.clone(),
            },
        );
        client
    }

    fn volume_lock(&self, volume_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.volume_locks
            .lock()
            .unwrap()
            .entry(volume_id.to_string())
            .or_default()
            .clone()
    }
}
