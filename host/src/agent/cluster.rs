//! This agent as a member of a cluster (`cluster { store = "etcd" }`): joining at start
//! with a record of what the node is and has, and the catalog on etcd.

use std::sync::Arc;

use crate::cluster::{Cluster, ClusterError, NodeRecord};
use crate::config::AgentConfig;
use crate::driver_set::DriverSet;

/// Joins the configured cluster, if one is configured. Blocking (it waits for etcd up
/// to the dial timeout): run it off the async workers.
pub(super) fn join(
    data_dir: &std::path::Path,
    config: &AgentConfig,
    drivers: &DriverSet,
) -> Result<Option<Arc<Cluster>>, ClusterError> {
    if !config.cluster.uses_etcd() {
        return Ok(None);
    }
    let record = node_record(crate::cluster::node_id(data_dir)?, config, drivers);
    let cluster = Cluster::join(&config.cluster, data_dir, record)?;
    tracing::info!(
        cluster = %cluster.cluster_id(),
        node = %cluster.node_id(),
        endpoints = %cluster.etcd().endpoints(),
        "joined the cluster"
    );
    Ok(Some(cluster))
}

/// What this node is and has, as the cluster's scheduler and `node status` see it.
pub fn node_record(id: String, config: &AgentConfig, drivers: &DriverSet) -> NodeRecord {
    let facts = crate::node::facts();
    let fact = |key: &str| facts.get(key).cloned().unwrap_or_default();
    let cores: u64 = fact("attr.cpu.numcores").parse().unwrap_or(1);
    let memory_mb = crate::cgroup::node_memory()
        .map(|bytes| bytes / crate::model::limits::MIB)
        .unwrap_or(0);
    let mut attributes = facts.clone();
    let name = config
        .name
        .clone()
        .unwrap_or_else(|| fact("node.unique.name"));
    let datacenter = config.datacenter.clone().unwrap_or_else(|| "dc1".into());
    attributes.insert("node.unique.name".into(), name.clone());
    attributes.insert("node.unique.id".into(), id.clone());
    attributes.insert("node.datacenter".into(), datacenter.clone());
    NodeRecord {
        id,
        name,
        datacenter,
        node_pool: "default".into(),
        node_class: String::new(),
        http_addr: config.http.address.map(|a| a.to_string()),
        attributes,
        drivers: drivers
            .iter()
            .map(|driver| (driver.name().to_string(), true))
            .collect(),
        host_volumes: config.host_volumes.iter().map(|v| v.name.clone()).collect(),
        eligibility: "eligible".into(),
        drain: false,
        cpu_mhz: cores * cpu_mhz_per_core(),
        memory_mb,
        registered_ms: super::now_ms(),
    }
}

/// A core's speed as `/proc/cpuinfo` gives it (Nomad's fingerprint reads the same),
/// 1000 MHz when it does not say.
fn cpu_mhz_per_core() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map_or(1000, |mhz| mhz as u64)
}
