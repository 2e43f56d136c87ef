//! The seam between the CSI manager and a plugin: [`CsiPlugin`] is every call the
//! manager makes of a plugin, and [`PluginConnector`] is the one place a plugin's
//! registration becomes something to call. The agent connects with [`GrpcConnector`]
//! (a [`CsiClient`] over the plugin's Unix socket); unit tests connect to a scripted,
//! recording fake instead, so the manager's crash points can be tested without root or
//! a plugin process.
//!
//! Futures are boxed (as the task hooks' are) so the manager can hold `dyn CsiPlugin`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use super::client::{CreatedVolume, CsiClient, CsiError, NodeVolume};
use super::registry::PluginRegistration;
use berth_model::csi::{Capabilities, SnapshotInfo, Timeouts, Usage};

/// A plugin call's answer, once it comes.
pub type PluginCall<'a, T> = Pin<Box<dyn Future<Output = Result<T, CsiError>> + Send + 'a>>;

/// The CSI RPCs berth makes of a plugin, in berth's terms. Paths are the plugin's (what
/// it sees inside its own mount namespace). An unpublish, unstage or delete of what the
/// plugin does not have answers success, as the spec makes them idempotent.
pub trait CsiPlugin: Send + Sync {
    /// Whether the plugin is ready.
    fn probe(&self) -> PluginCall<'_, bool>;
    /// The plugin's name and version.
    fn plugin_info(&self) -> PluginCall<'_, (String, String)>;
    /// Whether the plugin offers a controller service.
    fn plugin_capabilities(&self) -> PluginCall<'_, bool>;
    /// NodeGetInfo: the node id and the node's accessible topology.
    fn node_info(&self) -> PluginCall<'_, (String, BTreeMap<String, String>)>;
    /// Whether the node service stages (STAGE_UNSTAGE_VOLUME) and expands.
    fn node_capabilities(&self) -> PluginCall<'_, (bool, bool)>;
    /// What the controller service can do, into `capabilities`.
    fn controller_capabilities<'a>(
        &'a self,
        capabilities: &'a mut Capabilities,
    ) -> PluginCall<'a, ()>;

    fn node_stage<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        staging_path: &'a Path,
    ) -> PluginCall<'a, ()>;
    fn node_unstage<'a>(
        &'a self,
        external_id: &'a str,
        staging_path: &'a Path,
    ) -> PluginCall<'a, ()>;
    /// `staging_path` is `None` when the plugin does not stage.
    fn node_publish<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        staging_path: Option<&'a Path>,
        target_path: &'a Path,
    ) -> PluginCall<'a, ()>;
    fn node_unpublish<'a>(
        &'a self,
        external_id: &'a str,
        target_path: &'a Path,
    ) -> PluginCall<'a, ()>;
    /// NodeExpandVolume of the volume published at `volume_path`: its new capacity.
    fn node_expand<'a>(
        &'a self,
        external_id: &'a str,
        volume_path: &'a Path,
        staging_path: Option<&'a Path>,
        required: i64,
        usage: Usage,
    ) -> PluginCall<'a, i64>;

    /// ControllerPublishVolume to `node_id`: the publish context.
    fn controller_publish<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        node_id: &'a str,
    ) -> PluginCall<'a, HashMap<String, String>>;
    fn controller_unpublish<'a>(
        &'a self,
        external_id: &'a str,
        node_id: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()>;
    fn create_volume<'a>(
        &'a self,
        name: &'a str,
        capacity: (i64, i64),
        usages: &'a [Usage],
        parameters: &'a HashMap<String, String>,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, CreatedVolume>;
    fn delete_volume<'a>(
        &'a self,
        external_id: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()>;
    /// ControllerExpandVolume: the capacity and whether the nodes must expand too.
    fn controller_expand<'a>(
        &'a self,
        external_id: &'a str,
        required: i64,
        usage: Usage,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, (i64, bool)>;
    fn create_snapshot<'a>(
        &'a self,
        source: &'a str,
        name: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, SnapshotInfo>;
    fn delete_snapshot<'a>(
        &'a self,
        snapshot_id: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()>;
    fn list_snapshots(&self) -> PluginCall<'_, Vec<SnapshotInfo>>;
}

/// Makes the thing to call for a registered plugin provider. The manager keeps what it
/// makes per provider (one connection, reused) and asks again when the provider or its
/// socket changes.
pub trait PluginConnector: Send + Sync {
    fn connect(&self, plugin: &PluginRegistration) -> Arc<dyn CsiPlugin>;
}

/// The agent's connector: a gRPC [`CsiClient`] on the plugin's socket, recording each
/// RPC in the agent's metrics.
pub struct GrpcConnector {
    pub timeouts: Timeouts,
    pub metrics: berth_telemetry::Metrics,
}

impl PluginConnector for GrpcConnector {
    fn connect(&self, plugin: &PluginRegistration) -> Arc<dyn CsiPlugin> {
        Arc::new(
            CsiClient::new(&plugin.id, &plugin.socket, self.timeouts)
                .measured(self.metrics.clone()),
        )
    }
}

impl CsiPlugin for CsiClient {
    fn probe(&self) -> PluginCall<'_, bool> {
        Box::pin(CsiClient::probe(self))
    }
    fn plugin_info(&self) -> PluginCall<'_, (String, String)> {
        Box::pin(CsiClient::plugin_info(self))
    }
    fn plugin_capabilities(&self) -> PluginCall<'_, bool> {
        Box::pin(CsiClient::plugin_capabilities(self))
    }
    fn node_info(&self) -> PluginCall<'_, (String, BTreeMap<String, String>)> {
        Box::pin(CsiClient::node_info(self))
    }
    fn node_capabilities(&self) -> PluginCall<'_, (bool, bool)> {
        Box::pin(CsiClient::node_capabilities(self))
    }
    fn controller_capabilities<'a>(
        &'a self,
        capabilities: &'a mut Capabilities,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::controller_capabilities(self, capabilities))
    }
    fn node_stage<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        staging_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::node_stage(self, volume, staging_path))
    }
    fn node_unstage<'a>(
        &'a self,
        external_id: &'a str,
        staging_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::node_unstage(self, external_id, staging_path))
    }
    fn node_publish<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        staging_path: Option<&'a Path>,
        target_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::node_publish(
            self,
            volume,
            staging_path,
            target_path,
        ))
    }
    fn node_unpublish<'a>(
        &'a self,
        external_id: &'a str,
        target_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::node_unpublish(self, external_id, target_path))
    }
    fn node_expand<'a>(
        &'a self,
        external_id: &'a str,
        volume_path: &'a Path,
        staging_path: Option<&'a Path>,
        required: i64,
        usage: Usage,
    ) -> PluginCall<'a, i64> {
        Box::pin(CsiClient::node_expand(
            self,
            external_id,
            volume_path,
            staging_path,
            required,
            usage,
        ))
    }
    fn controller_publish<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        node_id: &'a str,
    ) -> PluginCall<'a, HashMap<String, String>> {
        Box::pin(CsiClient::controller_publish(self, volume, node_id))
    }
    fn controller_unpublish<'a>(
        &'a self,
        external_id: &'a str,
        node_id: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::controller_unpublish(
            self,
            external_id,
            node_id,
            secrets,
        ))
    }
    fn create_volume<'a>(
        &'a self,
        name: &'a str,
        capacity: (i64, i64),
        usages: &'a [Usage],
        parameters: &'a HashMap<String, String>,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, CreatedVolume> {
        Box::pin(CsiClient::create_volume(
            self, name, capacity, usages, parameters, secrets,
        ))
    }
    fn delete_volume<'a>(
        &'a self,
        external_id: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::delete_volume(self, external_id, secrets))
    }
    fn controller_expand<'a>(
        &'a self,
        external_id: &'a str,
        required: i64,
        usage: Usage,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, (i64, bool)> {
        Box::pin(CsiClient::controller_expand(
            self,
            external_id,
            required,
            usage,
            secrets,
        ))
    }
    fn create_snapshot<'a>(
        &'a self,
        source: &'a str,
        name: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, SnapshotInfo> {
        Box::pin(CsiClient::create_snapshot(self, source, name, secrets))
    }
    fn delete_snapshot<'a>(
        &'a self,
        snapshot_id: &'a str,
        secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()> {
        Box::pin(CsiClient::delete_snapshot(self, snapshot_id, secrets))
    }
    fn list_snapshots(&self) -> PluginCall<'_, Vec<SnapshotInfo>> {
        Box::pin(CsiClient::list_snapshots(self))
    }
}
