//! The cluster's records as read from the store: each entry under the prefix decoded
//! into what its key says it is (a job, a node, a placement, a report …), checked
//! against that key, and gathered into a [`Snapshot`] (`Cluster::snapshot`, a job's
//! `Cluster::job_snapshot`, a node's `Cluster::own_placements`). The scheduler's mirror
//! (`scheduler::mirror`) decodes the changes of its watch with the same [`decode`], so
//! a record means one thing whichever way it is read.

use serde::Deserialize;

use super::etcd::Entry;
use super::state::{
    AllocReport, Blocked, ClusterJob, Evaluation, NodeSettings, Placement, Snapshot, check_job_id,
};
use super::{Cluster, ClusterError, NodeRecord, NodeView};

/// One record of the cluster, decoded and checked.
#[derive(Debug, Clone)]
pub(crate) enum Stored {
    /// A job, with the revision of its key (its version).
    Job(ClusterJob, i64),
    Node(NodeRecord),
    Placement(Placement),
    Report(AllocReport),
    NodeSettings(String, NodeSettings),
    /// A CSI volume: its plugin and the allocs its claims name.
    Volume {
        id: String,
        plugin_id: String,
        claimed: Vec<String>,
    },
    /// The node part of a CSI plugin on one node.
    NodePlugin {
        plugin_id: String,
        node: String,
        healthy: bool,
    },
    /// A periodic job's last launch (ms since the epoch).
    Launch(String, u64),
    Eval(Evaluation),
    /// What could not be placed of a job.
    Blocked(String, Vec<Blocked>),
}

/// `entry`'s value as JSON of a `T`; one that does not read is logged and left out.
fn read<T: serde::de::DeserializeOwned>(entry: &Entry) -> Option<T> {
    serde_json::from_slice(&entry.value)
        .map_err(|error| {
            tracing::warn!(key = %entry.key, %error,
                "a record in the cluster store cannot be read; it is left out");
        })
        .ok()
}

/// The record `entry` holds, if it is one the scheduler reads and it reads well (a
/// record that does not is logged and left out).
pub(crate) fn decode(prefix: &str, entry: &Entry) -> Option<Stored> {
    let rest = entry.key.strip_prefix(prefix)?;
    let kind = rest.split('/').next().unwrap_or("");
    // Whether a decoded record is what its key says (a refusal is logged).
    let fits = |check: Checked<'_>| {
        well_formed(rest, &check)
            .map_err(|why| {
                tracing::warn!(key = %entry.key, %why,
                    "a record in the cluster store is refused; it is left out");
            })
            .is_ok()
    };
    match kind {
        "jobs" => {
            let job: ClusterJob = read(entry)?;
            fits(Checked::Job(&job)).then_some(Stored::Job(job, entry.mod_revision))
        }
        "nodes" => {
            let record: NodeRecord = read(entry)?;
            fits(Checked::Node(&record)).then_some(Stored::Node(record))
        }
        "allocs" => {
            let placement: Placement = read(entry)?;
            fits(Checked::Placement(&placement)).then_some(Stored::Placement(placement))
        }
        "status" => {
            let report: AllocReport = read(entry)?;
            fits(Checked::Report(&report)).then_some(Stored::Report(report))
        }
        "node-settings" => Some(Stored::NodeSettings(
            rest.trim_start_matches("node-settings/").to_string(),
            read(entry)?,
        )),
        "volumes" => {
            let record: VolumeOfRecord = read(entry)?;
            Some(Stored::Volume {
                id: rest.trim_start_matches("volumes/").to_string(),
                plugin_id: record.volume.plugin_id,
                claimed: record.claims.into_iter().map(|c| c.alloc_id).collect(),
            })
        }
        "plugins" => {
            let provider: berth_state::catalog::PluginProvider = read(entry)?;
            (provider.kind == berth_model::csi::PluginKind::Node).then_some(Stored::NodePlugin {
                plugin_id: provider.plugin_id,
                node: provider.node,
                healthy: provider.healthy,
            })
        }
        "launches" => {
            let parent = rest.trim_start_matches("launches/").to_string();
            match String::from_utf8_lossy(&entry.value).trim().parse::<u64>() {
                Ok(at_ms) => Some(Stored::Launch(parent, at_ms)),
                Err(_) => {
                    tracing::warn!(key = %entry.key,
                        "a record in the cluster store is not a launch time; it is left out");
                    None
                }
            }
        }
        "evals" => match Evaluation::from_entry(entry) {
            Some(eval) => Some(Stored::Eval(eval)),
            None => {
                tracing::warn!(key = %entry.key,
                    "a record in the cluster store is not an evaluation; it is left out");
                None
            }
        },
        "blocked" => Some(Stored::Blocked(
            rest.trim_start_matches("blocked/").to_string(),
            read(entry)?,
        )),
        _ => None,
    }
}

impl Snapshot {
    /// Adds one record read.
    pub(crate) fn add(&mut self, stored: Stored) {
        match stored {
            Stored::Job(job, version) => self.jobs.push((job, version)),
            Stored::Node(record) => self.nodes.push(NodeView {
                record,
                status: "ready",
            }),
            Stored::Placement(placement) => self.placements.push(placement),
            Stored::Report(report) => self.reports.push(report),
            Stored::NodeSettings(id, settings) => self.node_settings.push((id, settings)),
            Stored::Volume {
                id,
                plugin_id,
                claimed,
            } => {
                self.csi.volume_plugins.insert(id, plugin_id);
                self.csi.claimed_allocs.extend(claimed);
            }
            Stored::NodePlugin {
                plugin_id,
                node,
                healthy,
            } => {
                let known = self
                    .csi
                    .node_plugins
                    .entry(plugin_id)
                    .or_default()
                    .entry(node)
                    .or_default();
                *known |= healthy;
            }
            Stored::Launch(parent, at_ms) => {
                self.last_launches.insert(parent, at_ms);
            }
            Stored::Eval(eval) => self.evals.push(eval),
            Stored::Blocked(job, entries) => {
                self.blocked.insert(job, entries);
            }
        }
    }

    /// Once every record is added: operator settings shown in each node's view, nodes
    /// by name, evaluations oldest first.
    pub(crate) fn finish(&mut self) {
        let settings: std::collections::BTreeMap<&str, &NodeSettings> = self
            .node_settings
            .iter()
            .map(|(id, s)| (id.as_str(), s))
            .collect();
        for node in &mut self.nodes {
            if let Some(settings) = settings.get(node.record.id.as_str()) {
                node.record.drain = settings.drain;
                if settings.ineligible || settings.drain {
                    node.record.eligibility = "ineligible".into();
                }
            }
        }
        self.nodes.sort_by(|a, b| a.record.name.cmp(&b.record.name));
        self.evals
            .sort_by_key(|e| (e.create_revision, e.id.clone()));
    }
}

impl Cluster {
    /// Reads jobs, nodes, placements, reports and node settings at one revision.
    pub fn snapshot(&self) -> Result<Snapshot, ClusterError> {
        self.read_snapshot(vec![String::new()])
    }

    /// What readers of one job need, read alone: the job, what of it could not be
    /// placed, every placement and every report (not every record of the cluster).
    pub fn job_snapshot(&self, id: &str) -> Result<Snapshot, ClusterError> {
        self.read_snapshot(vec![
            format!("jobs/{id}"),
            format!("blocked/{id}"),
            "allocs/".into(),
            "status/".into(),
        ])
    }

    /// The records under each of `parts` (below the prefix), as a snapshot.
    fn read_snapshot(&self, parts: Vec<String>) -> Result<Snapshot, ClusterError> {
        let store = self.store().clone();
        let prefix = format!("{}/", self.settings().prefix);
        let listed = prefix.clone();
        let (entries, revision) = self.store().block(async move {
            let mut all = Vec::new();
            let mut revision = 0;
            for part in parts {
                let (entries, at) = store.list(&format!("{listed}{part}")).await?;
                all.extend(entries);
                revision = revision.max(at);
            }
            Ok::<_, ClusterError>((all, revision))
        })?;
        let mut snapshot = Snapshot {
            revision,
            ..Snapshot::default()
        };
        for entry in &entries {
            if let Some(stored) = decode(&prefix, entry) {
                snapshot.add(stored);
            }
        }
        snapshot.finish();
        Ok(snapshot)
    }

    /// The placements on this node, as its agent runs them.
    pub fn own_placements(&self) -> Result<(Vec<Placement>, i64), ClusterError> {
        let prefix = format!("{}/", self.key(&["allocs", self.node_id()]));
        let store = self.store().clone();
        let (entries, revision) = self
            .store()
            .block(async move { store.list(&prefix).await })?;
        let root = format!("{}/", self.settings().prefix);
        let placements = entries
            .iter()
            // A placement refused (not what its key says, ids not well formed) is logged
            // and never run.
            .filter_map(|entry| match decode(&root, entry)? {
                Stored::Placement(placement) => Some(placement),
                _ => None,
            })
            .collect();
        Ok((placements, revision))
    }
}

/// Of a volume record, what placement reads.
#[derive(Deserialize)]
struct VolumeOfRecord {
    volume: PluginOfVolume,
    #[serde(default)]
    claims: Vec<ClaimOfRecord>,
}

#[derive(Deserialize)]
struct ClaimOfRecord {
    alloc_id: String,
}

#[derive(Deserialize)]
struct PluginOfVolume {
    plugin_id: String,
}

/// Whether a record read from etcd is what its key says and its ids are well formed:
/// an alloc id becomes a directory and a cgroup name on the node that runs it, so one
/// that is not a UUID (`/etc`, `../x`) is never used. Anyone who can write to etcd is
/// the operator (SECURITY.md), but a record that could steer the agent's paths is
/// refused all the same.
fn well_formed(rest: &str, record: &Checked<'_>) -> Result<(), Refused> {
    let job_name = |id: &str| check_job_id(id).map_err(|e| Refused(e.to_string()));
    let uuid = |what: &str, id: &str| {
        if super::is_uuid(id) {
            Ok(())
        } else {
            Err(Refused(format!("its {what} {id:?} is not a UUID")))
        }
    };
    let matches = |expected: String| {
        if rest == expected {
            Ok(())
        } else {
            Err(Refused(format!("its key does not name it ({expected:?})")))
        }
    };
    match record {
        Checked::Job(job) => {
            job_name(&job.id)?;
            // A child names its parent in its id; a job that is no child has no `/`.
            let parent = job.id.split_once('/').map(|(parent, _)| parent);
            if parent != job.child_of.as_ref().map(|c| c.parent.as_str()) {
                return Err(Refused(format!(
                    "its id {:?} and its parent {:?} disagree",
                    job.id,
                    job.child_of.as_ref().map(|c| c.parent.as_str())
                )));
            }
            matches(format!("jobs/{}", job.id))
        }
        Checked::Node(node) => {
            uuid("node id", &node.id)?;
            matches(format!("nodes/{}", node.id))
        }
        Checked::Placement(placement) => {
            uuid("alloc id", &placement.alloc_id)?;
            uuid("node id", &placement.node_id)?;
            job_name(&placement.job_id)?;
            matches(format!(
                "allocs/{}/{}",
                placement.node_id, placement.alloc_id
            ))
        }
        Checked::Report(report) => {
            uuid("alloc id", &report.alloc_id)?;
            job_name(&report.job_id)?;
            matches(format!("status/{}", report.alloc_id))
        }
    }
}

/// Why a record read from etcd is not used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(String);

/// A record [`well_formed`] checks.
enum Checked<'a> {
    Job(&'a ClusterJob),
    Node(&'a NodeRecord),
    Placement(&'a Placement),
    Report(&'a AllocReport),
}
