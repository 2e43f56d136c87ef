//! The dynamic plugin registry: which CSI plugins this node has, keyed by kind (node,
//! controller) and plugin id, with the alloc that provides each, where its socket is,
//! and whether it is healthy. Registration comes from the `csi_plugin_supervisor` task
//! hook; the CSI manager and the catalog follow changes by subscribing.
//!
//! Entries are persisted, so a restarted agent knows its plugins before their tasks are
//! recovered; a restored entry is unhealthy until its supervisor probes it again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use super::layout::PluginDirs;
use berth_model::csi::PluginKind;
use berth_state::{RecordTable, StateStore};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginRegistration {
    pub id: String,
    pub kind: PluginKind,
    pub alloc_id: String,
    pub task: String,
    /// Host path of the plugin's socket.
    pub socket: PathBuf,
    pub dirs: PluginDirs,
    pub healthy: bool,
    /// Why it is (un)healthy, in words.
    pub health: String,
}

impl PluginRegistration {
    fn key(&self) -> String {
        key(self.kind, &self.id)
    }
}

fn key(kind: PluginKind, id: &str) -> String {
    format!("{kind}/{id}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryEvent {
    /// Registered, or changed (health, provider).
    Updated(PluginRegistration),
    Removed {
        kind: PluginKind,
        id: String,
        alloc_id: String,
    },
}

pub struct PluginRegistry {
    store: Arc<StateStore>,
    plugins: Mutex<BTreeMap<(PluginKind, String), PluginRegistration>>,
    events: broadcast::Sender<RegistryEvent>,
    /// Bumped on every change, for `wait_for`.
    version: watch::Sender<u64>,
}

impl PluginRegistry {
    /// The registry with what `store` recorded; restored plugins start unhealthy.
    pub fn restore(store: Arc<StateStore>) -> PluginRegistry {
        let mut plugins = BTreeMap::new();
        match store.records::<PluginRegistration>(RecordTable::CsiPlugins, "") {
            Ok((records, unreadable)) => {
                for problem in unreadable {
                    tracing::error!("{problem}");
                }
                for (_, mut plugin) in records {
                    plugin.healthy = false;
                    plugin.health = "not probed since the agent started".into();
                    plugins.insert((plugin.kind, plugin.id.clone()), plugin);
                }
            }
            Err(error) => tracing::error!(%error, "reading the CSI plugin registry"),
        }
        PluginRegistry {
            store,
            plugins: Mutex::new(plugins),
            events: broadcast::channel(256).0,
            version: watch::channel(0).0,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.events.subscribe()
    }

    pub fn list(&self) -> Vec<PluginRegistration> {
        self.plugins.lock().unwrap().values().cloned().collect()
    }

    pub fn get(&self, kind: PluginKind, id: &str) -> Option<PluginRegistration> {
        self.plugins
            .lock()
            .unwrap()
            .get(&(kind, id.to_string()))
            .cloned()
    }

    /// Registers (or replaces) a plugin; written before anyone is told.
    pub fn register(&self, plugin: PluginRegistration) {
        if let Err(error) = self
            .store
            .put_record(RecordTable::CsiPlugins, &plugin.key(), &plugin)
        {
            tracing::error!(plugin = %plugin.id, %error, "recording the CSI plugin");
        }
        self.plugins
            .lock()
            .unwrap()
            .insert((plugin.kind, plugin.id.clone()), plugin.clone());
        self.changed(RegistryEvent::Updated(plugin));
    }

    /// Records a health change of the plugin that `alloc_id` provides. Returns whether
    /// anything changed.
    pub fn set_health(
        &self,
        kind: PluginKind,
        id: &str,
        alloc_id: &str,
        healthy: bool,
        why: &str,
    ) -> bool {
        let updated = {
            let mut plugins = self.plugins.lock().unwrap();
            match plugins.get_mut(&(kind, id.to_string())) {
                Some(plugin) if plugin.alloc_id == alloc_id => {
                    if plugin.healthy == healthy && plugin.health == why {
                        return false;
                    }
                    plugin.healthy = healthy;
                    plugin.health = why.to_string();
                    plugin.clone()
                }
                _ => return false,
            }
        };
        if let Err(error) = self
            .store
            .put_record(RecordTable::CsiPlugins, &updated.key(), &updated)
        {
            tracing::error!(plugin = %id, %error, "recording the CSI plugin's health");
        }
        self.changed(RegistryEvent::Updated(updated));
        true
    }

    /// Removes the plugin if `alloc_id` still provides it (a newer provider may have
    /// replaced it). Returns whether it was removed.
    pub fn deregister(&self, kind: PluginKind, id: &str, alloc_id: &str) -> bool {
        {
            let mut plugins = self.plugins.lock().unwrap();
            match plugins.get(&(kind, id.to_string())) {
                Some(plugin) if plugin.alloc_id == alloc_id => {
                    plugins.remove(&(kind, id.to_string()));
                }
                _ => return false,
            }
        }
        if let Err(error) = self
            .store
            .remove_record(RecordTable::CsiPlugins, &key(kind, id))
        {
            tracing::error!(plugin = %id, %error, "forgetting the CSI plugin");
        }
        self.changed(RegistryEvent::Removed {
            kind,
            id: id.to_string(),
            alloc_id: alloc_id.to_string(),
        });
        true
    }

    fn changed(&self, event: RegistryEvent) {
        let _ = self.events.send(event);
        self.version.send_modify(|v| *v += 1);
    }

    /// Waits until the plugin is registered and healthy, for at most `timeout`.
    pub async fn wait_for_healthy(
        &self,
        kind: PluginKind,
        id: &str,
        timeout: Duration,
    ) -> Result<PluginRegistration, PluginUnavailable> {
        let mut version = self.version.subscribe();
        let wait = async {
            loop {
                if let Some(plugin) = self.get(kind, id).filter(|p| p.healthy) {
                    return plugin;
                }
                if version.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(plugin) => Ok(plugin),
            Err(_) => Err(match self.get(kind, id) {
                Some(plugin) => PluginUnavailable::NotHealthy {
                    id: id.to_string(),
                    kind,
                    waited: timeout,
                    health: plugin.health,
                },
                None => PluginUnavailable::NotRegistered {
                    id: id.to_string(),
                    kind,
                    waited: timeout,
                    registered: self
                        .list()
                        .into_iter()
                        .map(|p| format!("{} ({})", p.id, p.kind))
                        .collect(),
                },
            }),
        }
    }
}

/// Why [`PluginRegistry::wait_for_healthy`] gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginUnavailable {
    #[error("CSI plugin {id:?} ({kind}) is registered but not healthy after {waited:?}: {health}")]
    NotHealthy {
        id: String,
        kind: PluginKind,
        waited: Duration,
        health: String,
    },
    #[error(
        "no {kind} plugin {id:?} registered on this node within {waited:?} ({})",
        if registered.is_empty() {
            "no CSI plugins are running: start the plugin's job".to_string()
        } else {
            format!("registered: {}", registered.join(", "))
        }
    )]
    NotRegistered {
        id: String,
        kind: PluginKind,
        waited: Duration,
        registered: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(alloc: &str) -> PluginRegistration {
        PluginRegistration {
            id: "hostpath".into(),
            kind: PluginKind::Node,
            alloc_id: alloc.into(),
            task: "plugin".into(),
            socket: "/csi/csi.sock".into(),
            dirs: PluginDirs {
                host: "/data/csi/node/hostpath".into(),
                plugin: "/local/csi".into(),
            },
            healthy: true,
            health: "probe succeeded".into(),
        }
    }

    #[tokio::test]
    async fn registrations_survive_a_restart_unhealthy_and_only_their_provider_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let store = Arc::new(StateStore::open(&path).unwrap().0);
            let registry = PluginRegistry::restore(store);
            let mut events = registry.subscribe();
            registry.register(registration("a1"));
            assert!(
                matches!(events.recv().await.unwrap(), RegistryEvent::Updated(p) if p.alloc_id == "a1")
            );
            // Another alloc cannot change or remove what a1 provides.
            assert!(!registry.set_health(PluginKind::Node, "hostpath", "a2", false, "x"));
            assert!(!registry.deregister(PluginKind::Node, "hostpath", "a2"));
            let found = registry
                .wait_for_healthy(PluginKind::Node, "hostpath", Duration::from_millis(10))
                .await
                .unwrap();
            assert_eq!(found.alloc_id, "a1");
        }
        let store = Arc::new(StateStore::open(&path).unwrap().0);
        let registry = Arc::new(PluginRegistry::restore(store));
        let restored = registry.get(PluginKind::Node, "hostpath").unwrap();
        assert!(!restored.healthy, "unhealthy until probed again");
        assert_eq!(restored.health, "not probed since the agent started");
        let error = registry
            .wait_for_healthy(PluginKind::Node, "hostpath", Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            PluginUnavailable::NotHealthy {
                id: "hostpath".into(),
                kind: PluginKind::Node,
                waited: Duration::from_millis(20),
                health: "not probed since the agent started".into(),
            }
        );
        // A waiter is woken by the health change, not by polling.
        let waiter = {
            let registry = registry.clone();
            tokio::spawn(async move {
                registry
                    .wait_for_healthy(PluginKind::Node, "hostpath", Duration::from_secs(5))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(registry.set_health(PluginKind::Node, "hostpath", "a1", true, "probe succeeded"));
        assert!(waiter.await.unwrap().unwrap().healthy);
        assert!(registry.deregister(PluginKind::Node, "hostpath", "a1"));
        let error = registry
            .wait_for_healthy(PluginKind::Controller, "other", Duration::from_millis(10))
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "no controller plugin \"other\" registered on this node within 10ms \
             (no CSI plugins are running: start the plugin's job)"
        );
    }
}
