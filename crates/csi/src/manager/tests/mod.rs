//! The manager's durable intents and crash recovery, against the scripted, recording
//! fake plugin ([`crate::fake`]) and its mount table, so they run without root or
//! a plugin process. A crash is the manager's future dropped while a scripted call hangs
//! (before or after the plugin acted); the recovery is a fresh manager over the same
//! state file, as after an agent restart. What the real mount table and gRPC do is the
//! end-to-end tests' (`tests/e2e/csi.rs`).

mod between_steps;
mod controller_steps;
mod mount_steps;
mod release_steps;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::CsiManager;
use super::volumes::VolumeUsage;
use crate::fake::{Call, FakeConnector, FakeCsiPlugin, FakeIdentity, FakeMounts};
use crate::layout::PluginDirs;
use crate::registry::{PluginRegistration, PluginRegistry};
use berth_model::csi::{AccessMode, AttachmentMode, CsiSettings, PluginKind, Usage};
use berth_state::catalog::{Capability, Volume};
use berth_state::{RecordTable, StateStore};

const PLUGIN: &str = "fake";
const VOLUME: &str = "vol";
const EXTERNAL: &str = "ext-vol";
/// Where the plugin task sees its tree (its `stage_publish_base_dir`).
const PLUGIN_BASE: &str = "/csi";

/// One node's data dir, the fake plugin serving it, and the host mount table the plugin
/// writes; each [`TestNode::manager`] is a fresh agent's manager over that state.
struct TestNode {
    data: tempfile::TempDir,
    identity: FakeIdentity,
    plugin: Arc<FakeCsiPlugin>,
    mounts: Arc<FakeMounts>,
}

impl TestNode {
    fn new(identity: FakeIdentity) -> TestNode {
        let data = tempfile::tempdir().unwrap();
        let mounts = Arc::new(FakeMounts::default());
        let dirs = PluginDirs::new(&data.path().join("csi"), PLUGIN, PLUGIN_BASE);
        let plugin = Arc::new(FakeCsiPlugin::new(identity.clone(), dirs, mounts.clone()));
        TestNode {
            data,
            identity,
            plugin,
            mounts,
        }
    }

    fn dirs(&self) -> PluginDirs {
        PluginDirs::new(&self.data.path().join("csi"), PLUGIN, PLUGIN_BASE)
    }

    /// A manager as an agent starting over this node's state makes it, with the plugin
    /// registered and healthy (its controller too, when it has one).
    fn manager(&self) -> Arc<CsiManager> {
        let store = Arc::new(
            StateStore::open(&self.data.path().join("state.db"))
                .unwrap()
                .0,
        );
        let registry = Arc::new(PluginRegistry::restore(store.clone()));
        let mut kinds = vec![PluginKind::Node];
        if self.identity.capabilities.controller_service {
            kinds.push(PluginKind::Controller);
        }
        for kind in kinds {
            registry.register(self.registration(kind));
        }
        let catalog = Arc::new(berth_state::catalog::embedded::EmbeddedCatalog::new(
            store.clone(),
        ));
        CsiManager::with_seams(
            registry,
            store,
            catalog,
            "node-1".into(),
            CsiSettings {
                plugin_wait: Duration::from_millis(200),
                ..CsiSettings::default()
            },
            Box::new(FakeConnector(self.plugin.clone())),
            self.mounts.clone(),
        )
    }

    fn registration(&self, kind: PluginKind) -> PluginRegistration {
        PluginRegistration {
            id: PLUGIN.into(),
            kind,
            alloc_id: "plugin-alloc".into(),
            task: "plugin".into(),
            socket: self.data.path().join("csi/plugins/plugin-alloc/csi.sock"),
            dirs: self.dirs(),
            healthy: true,
            health: "probe succeeded".into(),
        }
    }

    /// What the node's state file records of the volume, read by a fresh store.
    fn record(&self, manager: Arc<CsiManager>) -> Option<VolumeUsage> {
        drop(manager);
        let store = StateStore::open(&self.data.path().join("state.db"))
            .unwrap()
            .0;
        store.record(RecordTable::CsiUsage, VOLUME).unwrap()
    }

    /// Rewrites the usage record in the node's state file (no manager is running).
    fn rewrite_record(&self, change: impl FnOnce(&mut VolumeUsage)) {
        let store = StateStore::open(&self.data.path().join("state.db"))
            .unwrap()
            .0;
        let mut record: VolumeUsage = store
            .record(RecordTable::CsiUsage, VOLUME)
            .unwrap()
            .unwrap();
        change(&mut record);
        store
            .put_record(RecordTable::CsiUsage, VOLUME, &record)
            .unwrap();
    }

    /// The plugin's path of the volume's one stage.
    fn staging(&self) -> PathBuf {
        self.dirs().staging_volume(VOLUME).plugin
    }

    /// The plugin's path of `alloc`'s publication.
    fn target(&self, alloc: &str) -> PathBuf {
        self.dirs().publish(alloc, VOLUME, &usage().key()).plugin
    }

    fn host_staging(&self) -> PathBuf {
        self.dirs().staging_volume(VOLUME).host
    }

    fn host_target(&self, alloc: &str) -> PathBuf {
        self.dirs().publish(alloc, VOLUME, &usage().key()).host
    }

    /// The host's mounts when the volume is staged and published to `alloc` alone, as
    /// [`FakeMounts::mounted`] lists them (sorted).
    fn staged_and_published(&self, alloc: &str) -> Vec<PathBuf> {
        let mut mounts = vec![self.host_staging(), self.host_target(alloc)];
        mounts.sort();
        mounts
    }

    fn stage_call(&self) -> Call {
        Call::NodeStage {
            volume: EXTERNAL.into(),
            staging: self.staging(),
        }
    }

    fn unstage_call(&self) -> Call {
        Call::NodeUnstage {
            volume: EXTERNAL.into(),
            staging: self.staging(),
        }
    }

    fn publish_call(&self, alloc: &str) -> Call {
        Call::NodePublish {
            volume: EXTERNAL.into(),
            staging: Some(self.staging()),
            target: self.target(alloc),
        }
    }

    fn unpublish_call(&self, alloc: &str) -> Call {
        Call::NodeUnpublish {
            volume: EXTERNAL.into(),
            target: self.target(alloc),
        }
    }
}

fn volume() -> Volume {
    Volume {
        id: VOLUME.into(),
        name: VOLUME.into(),
        plugin_id: PLUGIN.into(),
        external_id: EXTERNAL.into(),
        capabilities: vec![Capability {
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
        }],
        capacity_bytes: 0,
        parameters: Default::default(),
        context: Default::default(),
        secrets: Default::default(),
        origin: "registered".into(),
        accessible_topology: Vec::new(),
    }
}

fn usage() -> Usage {
    Usage {
        access_mode: AccessMode::SingleNodeWriter,
        attachment_mode: AttachmentMode::FileSystem,
        read_only: false,
    }
}

/// Runs `operation` until a scripted call hangs, then drops it: the agent died there.
async fn dies_during<T: std::fmt::Debug>(operation: impl std::future::Future<Output = T>) {
    let outcome = tokio::time::timeout(Duration::from_millis(300), operation).await;
    assert!(
        outcome.is_err(),
        "the operation finished ({outcome:?}) instead of hanging"
    );
}

/// A fresh manager's reconcile, as when the node plugin turns healthy after a restart.
async fn reconcile(node: &TestNode) -> Arc<CsiManager> {
    let manager = node.manager();
    manager
        .clone()
        .reconcile(node.registration(PluginKind::Node))
        .await;
    manager
}
