//! Whether a node can take an alloc of a group, and how well: what the group needs,
//! what rules a node out for good (eligibility, drivers, volumes, constraints), what it
//! has no room for now (resources, static ports, `distinct_hosts`), Nomad's bin-packing
//! score, and the reasons said as an evaluation and `job plan` say them.

use std::collections::{BTreeMap, BTreeSet};

use super::super::NodeView;
use super::super::state::CsiView;
use berth_jobspec::Job;

/// A group's needs on a node.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    drivers: BTreeSet<String>,
    host_volumes: Vec<String>,
    /// CSI volume ids (a `per_alloc` volume's ids vary by alloc: checked where it runs).
    csi_volumes: Vec<String>,
    pub cpu_mhz: u64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub static_ports: Vec<u16>,
}

/// What an alloc of `group` needs of a node (and what its placement records).
pub fn needs(group: &berth_jobspec::Group) -> Needs {
    Needs {
        drivers: group.tasks.iter().map(|t| t.driver.clone()).collect(),
        host_volumes: group
            .volumes
            .iter()
            .filter(|v| v.volume_type == berth_jobspec::VolumeType::Host)
            .map(|v| v.source.clone())
            .collect(),
        csi_volumes: group
            .volumes
            .iter()
            .filter(|v| v.volume_type == berth_jobspec::VolumeType::Csi && !v.per_alloc)
            .map(|v| v.source.clone())
            .collect(),
        cpu_mhz: group.tasks.iter().map(|t| u64::from(t.resources.cpu)).sum(),
        memory_mb: group
            .tasks
            .iter()
            .map(|t| u64::from(t.resources.memory_mb))
            .sum(),
        disk_mb: group.ephemeral_disk_mb,
        static_ports: group.ports.iter().filter_map(|p| p.number).collect(),
    }
}

/// What is taken on one node by the placements the plan keeps and makes.
#[derive(Debug, Clone, Default)]
pub(super) struct Usage {
    pub(super) cpu_mhz: u64,
    pub(super) memory_mb: u64,
    pub(super) disk_mb: u64,
    pub(super) ports: BTreeSet<u16>,
    /// Allocs per `(job, group)`, for the anti-affinity penalty.
    pub(super) per_group: BTreeMap<(String, String), u32>,
}

impl Usage {
    /// What `placement` holds on its node: its resources while it is not terminal, and
    /// its place in its group either way.
    pub(super) fn hold(&mut self, placement: &super::super::state::Placement, terminal: bool) {
        if !terminal {
            self.cpu_mhz += placement.cpu_mhz;
            self.memory_mb += placement.memory_mb;
            self.disk_mb += placement.disk_mb;
            self.ports.extend(placement.static_ports.iter().copied());
        }
        *self
            .per_group
            .entry((placement.job_id.clone(), placement.group.clone()))
            .or_default() += 1;
    }
}

/// Why a node can never take an alloc of `group` (one reason, the first found): what
/// does not change as allocs are placed (eligibility, drivers, host volumes,
/// constraints), so it is found once per group and node.
pub(super) fn unfit(
    node: &NodeView,
    needs: &Needs,
    csi: &CsiView,
    job: &Job,
    group: &berth_jobspec::Group,
) -> Option<String> {
    let record = &node.record;
    if record.eligibility != "eligible" || record.drain {
        return Some("node is ineligible or draining".into());
    }
    for driver in &needs.drivers {
        match record.drivers.get(driver) {
            None => return Some(format!("missing driver {driver:?}")),
            Some(false) => return Some(format!("driver {driver:?} unhealthy or turned off")),
            Some(true) => {}
        }
    }
    if let Some(volume) = needs
        .host_volumes
        .iter()
        .find(|v| !record.host_volumes.contains(v))
    {
        return Some(format!("missing host volume {volume:?}"));
    }
    for volume in &needs.csi_volumes {
        // In Nomad's words (`nomad job plan`).
        let Some(plugin) = csi.volume_plugins.get(volume) else {
            return Some(format!("missing CSI Volume {:?}", clipped(volume)));
        };
        match csi
            .node_plugins
            .get(plugin)
            .and_then(|nodes| nodes.get(&record.name))
        {
            None => {
                return Some(format!(
                    "CSI plugin {:?} is missing from client",
                    clipped(plugin)
                ));
            }
            Some(false) => {
                return Some(format!(
                    "CSI plugin {:?} is unhealthy on client",
                    clipped(plugin)
                ));
            }
            Some(true) => {}
        }
    }
    let attributes = berth_jobspec::constraint::with_drivers(
        &record.attributes,
        record.drivers.keys().map(String::as_str),
    );
    let unmet = berth_jobspec::constraint::unmet(job, None, &attributes)
        .into_iter()
        .chain(berth_jobspec::constraint::unmet(
            job,
            Some(group),
            &attributes,
        ))
        .next();
    unmet.map(|unmet| {
        let constraint = unmet.constraint;
        format!(
            "constraint {} {} {:?}",
            clipped(&constraint.attribute),
            clipped(&constraint.operator),
            clipped(&constraint.value)
        )
    })
}

/// At most 100 characters of a job author's text in a reason (the reasons are stored
/// in etcd and shown; a 10,000-character constraint value is not repeated).
pub(super) fn clipped(text: &str) -> String {
    match text.char_indices().nth(100) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// Why a node has no room now for one more alloc of a group: the reason (the key
/// Nomad's `DimensionExhausted` and `job plan` count nodes by), and for a resource, how
/// much of it the node had left.
pub(super) struct NoRoom {
    why: String,
    free: Option<u64>,
}

/// Why a node has no room now for one more alloc of a group (resources, ports, and
/// `distinct_hosts`, which depend on what is placed there).
pub(super) fn no_room(
    node: &NodeView,
    usage: &Usage,
    needs: &Needs,
    collisions: u32,
    distinct_hosts: bool,
) -> Option<NoRoom> {
    let record = &node.record;
    if distinct_hosts && collisions > 0 {
        return Some(NoRoom {
            why: "constraint distinct_hosts".into(),
            free: None,
        });
    }
    let available = record.available();
    let exhausted = |dimension: &str, total: u64, used: u64| NoRoom {
        why: format!("{dimension} exhausted"),
        free: Some(total.saturating_sub(used)),
    };
    if usage.cpu_mhz + needs.cpu_mhz > available.cpu_mhz {
        return Some(exhausted("cpu", available.cpu_mhz, usage.cpu_mhz));
    }
    if usage.memory_mb + needs.memory_mb > available.memory_mb {
        return Some(exhausted("memory", available.memory_mb, usage.memory_mb));
    }
    // A record of an older berth gave no disk size: disk is not counted there.
    if record.disk_mb > 0 && usage.disk_mb + needs.disk_mb > available.disk_mb {
        return Some(exhausted("disk", available.disk_mb, usage.disk_mb));
    }
    // Another placement's static port, or one the operator reserved on the node: Nomad's
    // "reserved port collision".
    if let Some(port) = needs
        .static_ports
        .iter()
        .find(|p| usage.ports.contains(p) || record.reserves_port(**p))
    {
        return Some(NoRoom {
            why: format!("port {port} in use"),
            free: None,
        });
    }
    None
}

/// The nodes each reason ruled out, and for an exhausted resource the most any of them
/// had left: what an evaluation and `job plan` say of a group that could not be placed.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) reasons: BTreeMap<String, usize>,
    free: BTreeMap<String, u64>,
}

impl Tally {
    pub(super) fn filtered(&mut self, why: &str) {
        *self.reasons.entry(why.to_string()).or_default() += 1;
    }

    pub(super) fn no_room(&mut self, room: NoRoom) {
        if let Some(free) = room.free {
            let most = self.free.entry(room.why.clone()).or_default();
            *most = (*most).max(free);
        }
        *self.reasons.entry(room.why).or_default() += 1;
    }

    /// As `job plan` says them: `why (n), ...`, and an exhausted resource as Nomad's
    /// "Resources exhausted", with what was left: `Resources exhausted: memory (412 MiB
    /// free)`.
    pub(super) fn said(&self) -> String {
        self.reasons
            .iter()
            .map(|(why, nodes)| {
                let dimension = why.strip_suffix(" exhausted");
                match (dimension, self.free.get(why)) {
                    (Some(dimension), Some(free)) => {
                        let unit = if dimension == "cpu" { "MHz" } else { "MiB" };
                        if *nodes == 1 {
                            format!("Resources exhausted: {dimension} ({free} {unit} free)")
                        } else {
                            format!(
                                "Resources exhausted: {dimension} on {nodes} nodes (at most \
                                 {free} {unit} free)"
                            )
                        }
                    }
                    _ => format!("{why} ({nodes})"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Nomad's bin-packing fit (higher: fuller after placing), between 0 and 1.
pub(super) fn binpack(node: &NodeView, usage: &Usage, needs: &Needs) -> f64 {
    let free = |total: u64, used: u64| {
        if total == 0 {
            0.0
        } else {
            1.0 - (used as f64 / total as f64).min(1.0)
        }
    };
    let available = node.record.available();
    let cpu = free(available.cpu_mhz, usage.cpu_mhz + needs.cpu_mhz);
    let memory = free(available.memory_mb, usage.memory_mb + needs.memory_mb);
    // Nomad: 20 - (10^free_cpu + 10^free_mem), normalised by 18.
    let score = 20.0 - (10f64.powf(cpu) + 10f64.powf(memory));
    (score / 18.0).clamp(0.0, 1.0)
}

/// Why nothing was evaluated: no node is ready, or none in the job's datacenters.
pub(super) fn no_node_ready(job: &Job) -> String {
    if job.datacenters.is_empty() {
        "no node is ready".into()
    } else {
        let named: Vec<String> = job
            .datacenters
            .iter()
            .map(|d| format!("{:?}", clipped(d)))
            .collect();
        format!("no node is ready in datacenters {}", named.join(", "))
    }
}
