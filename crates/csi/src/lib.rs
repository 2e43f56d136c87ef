//! CSI on the node: the gRPC client ([`client`]) behind the manager's seam
//! ([`plugin::CsiPlugin`], [`host_mounts::HostMounts`]), the dynamic plugin registry
//! ([`registry`]), and the manager that fingerprints plugins and stages and publishes
//! volumes for allocs ([`manager`]). The plugin tasks themselves are supervised by the
//! `csi_plugin_supervisor` task hook; allocs get their volumes from the `csi_hook` alloc
//! hook.
//!
//! ```text
//!   plugin task ─(supervisor: probe, register)─► registry ─(subscribe)─► manager
//!   alloc ─(csi_hook: claim in catalog, wait for plugin)─► manager.mount_volume
//!         ─► ControllerPublish? ─► NodeStage (once per volume+usage) ─► NodePublish
//! ```
//!
//! Beside it, the gRPC health protocol's client for `grpc` checks ([`grpc_health`]):
//! this crate is where berth speaks gRPC.
//!
//! Host paths (what the agent mounts and binds) and plugin paths (what the plugin sees
//! inside its own mount namespace) are kept apart by [`layout::PluginDirs`].

pub mod client;
#[cfg(test)]
pub mod fake;
pub mod grpc_health;
pub mod host_mounts;
pub mod layout;
pub mod manager;
pub mod plugin;
pub mod registry;

use std::path::PathBuf;
use std::sync::Arc;

use berth_model::csi::{AccessMode, AttachmentMode, CsiSettings, Usage};
use berth_proto::csi as pb;
use berth_state::catalog::Catalog;

// The wire forms of the model's CSI types: only this module speaks protobuf.
fn access_mode_to_proto(mode: AccessMode) -> pb::volume_capability::access_mode::Mode {
    use pb::volume_capability::access_mode::Mode;
    match mode {
        AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
        AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
        AccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
        AccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
        AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
    }
}

/// The protobuf form of a usage, for the RPCs that carry a volume capability.
pub(crate) fn volume_capability(usage: &Usage) -> pb::VolumeCapability {
    use pb::volume_capability::{AccessMode as PbAccess, AccessType, BlockVolume, MountVolume};
    pb::VolumeCapability {
        access_type: Some(match usage.attachment_mode {
            AttachmentMode::FileSystem => AccessType::Mount(MountVolume::default()),
            AttachmentMode::BlockDevice => AccessType::Block(BlockVolume {}),
        }),
        access_mode: Some(PbAccess {
            mode: access_mode_to_proto(usage.access_mode) as i32,
        }),
    }
}

/// The CSI parts of one agent, shared by the alloc and task runners.
pub struct CsiNode {
    /// `<data_dir>/csi`: plugin sockets and staging roots live below.
    pub root: PathBuf,
    /// This node's name in claims and plugin providers (the host name).
    pub node_name: String,
    pub registry: Arc<registry::PluginRegistry>,
    pub manager: Arc<manager::CsiManager>,
    pub catalog: Arc<dyn Catalog>,
    /// The agent's registry, where every CSI RPC is recorded.
    pub metrics: berth_telemetry::Metrics,
}

impl CsiNode {
    /// The CSI parts of an agent whose state is `store`: the registry as recorded, the
    /// embedded catalog, and a started manager (needs a tokio runtime).
    pub fn start(
        data_dir: &std::path::Path,
        store: Arc<berth_state::StateStore>,
        settings: CsiSettings,
    ) -> Arc<CsiNode> {
        Self::start_measured(
            data_dir,
            store,
            settings,
            berth_telemetry::Metrics::default(),
        )
    }

    /// [`CsiNode::start`], recording every CSI RPC in `metrics` (the agent's registry).
    pub fn start_measured(
        data_dir: &std::path::Path,
        store: Arc<berth_state::StateStore>,
        settings: CsiSettings,
        metrics: berth_telemetry::Metrics,
    ) -> Arc<CsiNode> {
        let node_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let catalog: Arc<dyn Catalog> = Arc::new(
            berth_state::catalog::embedded::EmbeddedCatalog::new(store.clone()),
        );
        CsiNode::start_with(data_dir, store, settings, metrics, node_name, catalog)
    }

    /// [`CsiNode::start_measured`] with another catalog (the cluster's) and the node's
    /// name in it.
    pub fn start_with(
        data_dir: &std::path::Path,
        store: Arc<berth_state::StateStore>,
        settings: CsiSettings,
        metrics: berth_telemetry::Metrics,
        node_name: String,
        catalog: Arc<dyn Catalog>,
    ) -> Arc<CsiNode> {
        let registry = Arc::new(registry::PluginRegistry::restore(store.clone()));
        let manager = manager::CsiManager::new(
            registry.clone(),
            store,
            catalog.clone(),
            node_name.clone(),
            settings,
            metrics.clone(),
        );
        manager.start();
        Arc::new(CsiNode {
            root: data_dir.join("csi"),
            node_name,
            registry,
            manager,
            catalog,
            metrics,
        })
    }
}
