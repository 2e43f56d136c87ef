//! CSI across the cluster's nodes: a controller operation asked on this node goes to a
//! node whose controller of the plugin is healthy (through the store, as a call), and
//! this node serves the calls sent to its own controllers. Node operations never leave
//! the node that uses the volume; how it uses each volume is published under its lease,
//! for every node's `volume status`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use berth_cluster::Cluster;
use berth_cluster::calls::CallHandler;
use berth_csi::CsiNode;
use berth_csi::manager::{
    ControllerAnswer, ControllerRequest, CsiManager, CsiVolumeError, RemoteCall, RemoteControllers,
};
use berth_model::csi::PluginKind;
use berth_state::catalog::{Catalog, VolumeOnNode};

/// A served call's outcome, as it travels back.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answered {
    Ok(ControllerAnswer),
    Failed(String),
}

/// The cluster's controllers, as this node's CSI manager reaches them.
struct ClusterControllers {
    cluster: Arc<Cluster>,
    catalog: Arc<dyn Catalog>,
    node_name: String,
    /// How long a caller waits for another node's answer: the serving node may wait for
    /// its controller to turn healthy, then retries the call within the operation's
    /// deadline.
    within: Duration,
}

impl RemoteControllers for ClusterControllers {
    fn controller_node(&self, plugin_id: &str) -> Option<(String, bool)> {
        let plugins = self.catalog.plugins().ok()?;
        plugins
            .into_iter()
            .filter(|plugin| plugin.id == plugin_id)
            .flat_map(|plugin| plugin.providers)
            .filter(|p| p.kind == PluginKind::Controller && p.node != self.node_name)
            // Healthy first, then by name (every node picks the same one).
            .min_by(|a, b| (!a.healthy, &a.node).cmp(&(!b.healthy, &b.node)))
            .map(|p| (p.node, p.healthy))
    }

    fn call<'a>(&'a self, node: &'a str, request: ControllerRequest) -> RemoteCall<'a> {
        Box::pin(async move {
            let action = request.action();
            let failed = |message: String| CsiVolumeError::Remote {
                node: node.to_string(),
                message,
            };
            let bytes = serde_json::to_vec(&request)
                .map_err(|e| failed(format!("{action} cannot be written: {e}")))?;
            let answer = self
                .cluster
                .call(node, bytes, self.within)
                .await
                .map_err(|e| failed(format!("{action}: {e}")))?;
            match serde_json::from_slice::<Answered>(&answer) {
                Ok(Answered::Ok(answer)) => Ok(answer),
                Ok(Answered::Failed(message)) => Err(failed(message)),
                Err(e) => Err(failed(format!("{action}: its answer cannot be read: {e}"))),
            }
        })
    }
}

/// Routes this node's controller operations through the cluster and serves the
/// operations other nodes send to this node's controllers.
pub(super) fn connect(cluster: &Arc<Cluster>, csi: &CsiNode) {
    let settings = csi.manager.settings();
    let within = settings.plugin_wait + settings.timeouts.total + Duration::from_secs(5);
    csi.manager
        .route_controllers_through(Arc::new(ClusterControllers {
            cluster: cluster.clone(),
            catalog: csi.catalog.clone(),
            node_name: cluster.node_name().to_string(),
            within,
        }));
    cluster.serve_calls(handler(csi.manager.clone()));
    publish_usage(cluster, &csi.manager);
}

/// Unpublishes a lost node's volumes for the cluster's scheduler, through this node's
/// CSI manager (which reaches the plugin's controller wherever it runs).
struct LostNodeUnpublisher(Arc<CsiManager>);

impl berth_cluster::lost_claims::Unpublisher for LostNodeUnpublisher {
    fn unpublish<'a>(
        &'a self,
        volume: &'a berth_state::catalog::Volume,
        node_id: &'a str,
    ) -> berth_cluster::lost_claims::Unpublishing<'a> {
        Box::pin(async move {
            self.0
                .unpublish_from_lost_node(volume, node_id)
                .await
                .map_err(|e| berth_cluster::lost_claims::UnpublishFailed(e.to_string()))
        })
    }
}

/// What this node's scheduler does with lost allocs' claims (when it is the cluster's).
pub(super) fn lost_claims(
    cluster: &Arc<Cluster>,
    csi: &CsiNode,
) -> Arc<berth_cluster::lost_claims::LostClaims> {
    berth_cluster::lost_claims::LostClaims::new(
        cluster.clone(),
        Arc::new(LostNodeUnpublisher(csi.manager.clone())),
    )
}

/// Keeps `P/volume-usage/<volume>/<this node>` in line with this node's use of each
/// volume. Writes happen in order on one task, latest view per volume, so a slow or
/// absent etcd never holds a mount up and what waits is one entry per volume.
fn publish_usage(cluster: &Arc<Cluster>, manager: &Arc<CsiManager>) {
    type Pending = BTreeMap<String, Option<VolumeOnNode>>;
    let pending: Arc<Mutex<Pending>> = Arc::new(Mutex::new(
        manager
            .used_here()
            .into_iter()
            .map(|(id, view)| (id, Some(view)))
            .collect(),
    ));
    let wake = Arc::new(tokio::sync::Notify::new());
    manager.on_usage_change({
        let (pending, wake) = (pending.clone(), wake.clone());
        Arc::new(move |volume: &str, view: Option<VolumeOnNode>| {
            pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(volume.to_string(), view);
            wake.notify_one();
        })
    });
    let cluster = cluster.clone();
    tokio::spawn(async move {
        loop {
            let batch = {
                let mut waiting = pending.lock().unwrap_or_else(|p| p.into_inner());
                std::mem::take(&mut *waiting)
            };
            if batch.is_empty() {
                wake.notified().await;
                continue;
            }
            let writer = cluster.clone();
            let failed = tokio::task::spawn_blocking(move || {
                let mut failed = Pending::new();
                for (volume, view) in batch {
                    let key = writer.key(&["volume-usage", &volume, writer.node_name()]);
                    let written = match &view {
                        Some(view) => match serde_json::to_vec(view) {
                            Ok(value) => writer.put_owned(key, value),
                            Err(_) => Ok(()),
                        },
                        None => writer.remove_owned(&key),
                    };
                    if written.is_err() {
                        failed.insert(volume, view);
                    }
                }
                failed
            })
            .await
            .unwrap_or_default();
            if !failed.is_empty() {
                // Again once etcd answers, unless a newer view came meanwhile.
                {
                    let mut waiting = pending.lock().unwrap_or_else(|p| p.into_inner());
                    for (volume, view) in failed {
                        waiting.entry(volume).or_insert(view);
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
}

/// Each node's use of `volume`, by node name, as the nodes published it (a down node's
/// went with its lease).
pub(super) fn volume_views(cluster: &Cluster, volume: &str) -> BTreeMap<String, VolumeOnNode> {
    let prefix = format!("{}/", cluster.key(&["volume-usage", volume]));
    let store = cluster.store().clone();
    let Ok((entries, _)) = cluster
        .store()
        .block(async move { store.list(&prefix).await })
    else {
        return BTreeMap::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let node = entry.key.rsplit('/').next()?.to_string();
            let view = serde_json::from_slice(&entry.value).ok()?;
            Some((node, view))
        })
        .collect()
}

fn handler(manager: Arc<CsiManager>) -> CallHandler {
    let runtime = tokio::runtime::Handle::current();
    Arc::new(move |request: Vec<u8>| {
        let manager = manager.clone();
        let runtime = runtime.clone();
        Box::pin(async move {
            // The manager's work runs on the agent's runtime, where its plugin clients live.
            let served = runtime.spawn(async move { serve(&manager, &request).await });
            let answered = served
                .await
                .unwrap_or_else(|_| Answered::Failed("the agent is shutting down".into()));
            answer_bytes(&answered)
        })
    })
}

/// The answer as it travels; one too large for a call (a long snapshot list) becomes a
/// refusal that says so, instead of an answer the caller waits for in vain.
fn answer_bytes(answered: &Answered) -> Vec<u8> {
    let bytes = serde_json::to_vec(answered).unwrap_or_default();
    if bytes.len() <= berth_cluster::calls::MAX_CALL_BYTES {
        return bytes;
    }
    let refusal = Answered::Failed(format!(
        "the answer is {} bytes, more than the {} a call between nodes carries",
        bytes.len(),
        berth_cluster::calls::MAX_CALL_BYTES
    ));
    serde_json::to_vec(&refusal).unwrap_or_default()
}

async fn serve(manager: &CsiManager, request: &[u8]) -> Answered {
    let request: ControllerRequest = match serde_json::from_slice(request) {
        Ok(request) => request,
        Err(e) => return Answered::Failed(format!("the request cannot be read: {e}")),
    };
    let plugin = request.plugin_id().to_string();
    // A node serves only the controllers it runs: it does not wait for one to appear.
    if !manager.runs_controller(&plugin) {
        return Answered::Failed(format!(
            "this node runs no controller of CSI plugin {plugin:?} any more"
        ));
    }
    let span = tracing::info_span!("csi_call", plugin = %plugin, action = request.action());
    match tracing::Instrument::instrument(manager.serve(request), span).await {
        Ok(answer) => Answered::Ok(answer),
        Err(error) => Answered::Failed(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_model::csi::SnapshotInfo;

    #[test]
    fn an_answer_too_large_for_a_call_becomes_a_refusal_that_says_so() {
        let snapshot = SnapshotInfo {
            plugin_id: "hostpath".into(),
            snapshot_id: "s".repeat(200),
            source_volume_id: "v".into(),
            size_bytes: 1,
            created_at: 0,
            ready_to_use: true,
        };
        let small = Answered::Ok(ControllerAnswer::Snapshots(vec![snapshot.clone(); 10]));
        assert!(matches!(
            serde_json::from_slice(&answer_bytes(&small)),
            Ok(Answered::Ok(ControllerAnswer::Snapshots(list))) if list.len() == 10
        ));
        let large = Answered::Ok(ControllerAnswer::Snapshots(vec![snapshot; 10_000]));
        let bytes = answer_bytes(&large);
        assert!(bytes.len() <= berth_cluster::calls::MAX_CALL_BYTES);
        match serde_json::from_slice(&bytes) {
            Ok(Answered::Failed(why)) => {
                assert!(
                    why.contains("more than the 1048576 a call between nodes carries"),
                    "{why}"
                )
            }
            _ => panic!("not a refusal"),
        }
    }
}
