//! The first start of a lone agent as a one-node cluster, on a data dir an older berth
//! ran alone: what its state file records (jobs, their allocs, volumes and their
//! claims) is written into the new embedded cluster store before the scheduler or the
//! node reads it, so every job goes on running as it was, nothing is placed twice, and
//! nothing is stopped as unknown.
//!
//! Done once, when the cluster store is made (and only into one that holds no job). Each record is
//! written as it is read; one that cannot be is logged and left out (its allocs are
//! then stopped by the node, as any alloc the cluster does not place).

use std::sync::Arc;

use berth_cluster::state::{AllocReport, ClusterJob, Placement};
use berth_cluster::{Cluster, ClusterError};
use berth_state::StateStore;
use berth_state::catalog::Catalog as _;

/// What was imported.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub jobs: usize,
    pub allocs: usize,
    pub volumes: usize,
}

/// Imports `state` into `cluster` when the cluster holds no job yet.
pub fn import(
    cluster: &Arc<Cluster>,
    state: &Arc<StateStore>,
    config: &crate::config::AgentConfig,
) -> Result<Imported, ClusterError> {
    let local = |e: berth_state::StateError| ClusterError::Local(e.to_string());
    let (jobs, _) = state.jobs().map_err(local)?;
    let (allocs, _) = state.allocs().map_err(local)?;
    let volumes = berth_state::catalog::embedded::EmbeddedCatalog::new(state.clone())
        .volumes()
        .unwrap_or_default();
    let mut imported = Imported::default();
    if jobs.is_empty() && volumes.is_empty() {
        return Ok(imported);
    }
    let (existing, _) = {
        let store = cluster.store().clone();
        let prefix = format!("{}/", cluster.key(&["jobs"]));
        cluster
            .store()
            .block(async move { Ok::<_, ClusterError>(store.list(&prefix).await?) })?
    };
    if !existing.is_empty() {
        return Ok(imported);
    }
    let catalog = berth_cluster::catalog::EtcdCatalog::new(cluster.clone());
    for status in volumes {
        let id = status.volume.id.clone();
        let written = catalog.register_volume(status.volume).and_then(|()| {
            status
                .claims
                .into_iter()
                .try_for_each(|claim| catalog.claim(&id, claim))
        });
        match written {
            Ok(()) => imported.volumes += 1,
            Err(error) => tracing::error!(volume = %id, %error,
                "importing a volume into this agent's cluster store"),
        }
    }
    for record in jobs {
        let job = ClusterJob {
            id: record.id.clone(),
            source_name: record.source_name.clone(),
            source: record.source.clone(),
            variables: record.variables.clone(),
            submitted_ms: record.submitted_ms,
            stopped: record.stopped,
            // What its first submitter may do now: the operator, or a token the
            // operator still grants plugins (attack review: all were allowed before).
            may_run_plugins: record.owner.as_ref().map_or(record.by_operator, |owner| {
                config.http.tokens.iter().any(|token| {
                    token.name == *owner && token.scope == crate::config::TokenScope::Plugin
                })
            }),
            child_of: record.child_of.clone(),
            by_operator: record.by_operator,
            owner: record.owner.clone(),
            // Read by evaluating its source, as any record written before typed jobs.
            typed: None,
        };
        let spec = match job.spec() {
            Ok(spec) => spec,
            Err(error) => {
                tracing::error!(job = %job.id, %error,
                    "a job of this agent's state cannot be read; it is not imported");
                continue;
            }
        };
        let version = cluster.put_job(&job)?;
        imported.jobs += 1;
        for alloc in allocs.iter().filter(|a| a.job_id == record.id) {
            let Some(group) = spec.groups.get(alloc.group_index) else {
                continue;
            };
            let needs = berth_cluster::scheduler::needs(group);
            let report = AllocReport {
                alloc_id: alloc.id.clone(),
                job_id: alloc.job_id.clone(),
                name: alloc.name.clone(),
                node_id: cluster.node_id().to_string(),
                node_name: cluster.node_name().to_string(),
                client_status: alloc.client_status,
                description: String::new(),
                updated_ms: super::now_ms(),
                tasks: Default::default(),
            };
            cluster.report(&report)?;
            // Ended allocs stay placed too, as the cluster keeps its own: a finished batch
            // alloc is not run again, a failed one is rescheduled by its policy.
            if record.stopped {
                continue;
            }
            let placement = Placement {
                alloc_id: alloc.id.clone(),
                job_id: alloc.job_id.clone(),
                job_version: version,
                group: group.name.clone(),
                group_index: alloc.group_index,
                alloc_index: alloc.alloc_index,
                name: alloc.name.clone(),
                node_id: cluster.node_id().to_string(),
                cpu_mhz: needs.cpu_mhz,
                memory_mb: needs.memory_mb,
                disk_mb: needs.disk_mb,
                static_ports: needs.static_ports,
                replaces: None,
                placed_ms: super::now_ms(),
                reschedule_events: Vec::new(),
                stop_requested: false,
            };
            cluster.put_placement(&placement)?;
            imported.allocs += 1;
        }
    }
    Ok(imported)
}
